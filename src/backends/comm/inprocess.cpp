// The in-process communicator: N ranks as threads of one process. A rank's k-th collective is
// its post to the group's k-th meeting (signature, buffers); the last rank to post checks the
// signatures, moves every rank's data and marks the meeting done; a rank waits for its meeting
// on a condition variable. A blocking call posts and waits at once; start_all_reduce posts and
// returns, so a rank may run ahead of the others by several collectives: the data moves while
// a rank's Steps run, which is safe because a posting rank leaves the buffers alone until its
// wait (the runtime's rule: the Steps touching them come after it). A rank that waits past the
// timeout, or a rank that failed (abort_inprocess_group), breaks the group: every waiting and
// later call throws.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>

#include "backends/comm/reduce.h"
#include "core/fail.h"

namespace tessera::backends {
namespace {

using comm::Signature;

struct Call {
  Signature sig;
  const void* send = nullptr;
  void* recv = nullptr;
  int send_to = -1, recv_from = -1, root = 0;
  ir::ReduceKind kind = ir::ReduceKind::Sum;
};

// One collective of the group: every rank's call, posted as each rank gets to it.
struct Meeting {
  explicit Meeting(int n) : calls(size_t(n)), posted(size_t(n), false) {}
  std::vector<Call> calls;
  std::vector<bool> posted;
  int arrived = 0, collected = 0;  // ranks that posted; ranks that took the result (then it is erased)
  bool done = false;
  std::string failed;  // the error every rank throws ("" when it worked)
};

struct Group {
  explicit Group(int n) : n(n), next(size_t(n), 0) {}
  const int n;
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, Meeting> meetings;  // by sequence number, while some rank has not taken the result
  std::vector<uint64_t> next;  // per rank, the sequence number of its next collective
  std::string broken;  // why the group is broken ("" while it works)
  // Sub-groups by member list (Communicator::group): broken with this group.
  std::map<std::vector<int>, std::shared_ptr<Group>> children;
};

// Breaks g and its sub-groups: every rank waiting in or later calling one of them throws.
void break_group(Group& g, const std::string& why) {
  std::vector<std::shared_ptr<Group>> kids;
  {
    std::lock_guard<std::mutex> lock(g.mu);
    if (g.broken.empty()) g.broken = why;
    for (auto& [m, k] : g.children) kids.push_back(k);
    g.cv.notify_all();
  }
  for (auto& k : kids) break_group(*k, why);
}

class InProcess final : public Communicator {
 public:
  InProcess(std::shared_ptr<Group> g, int rank) : g_(std::move(g)), rank_(rank) {}
  std::string name() const override { return "inprocess"; }
  int rank() const override { return rank_; }
  int size() const override { return g_->n; }
  Group& shared_group() { return *g_; }  // not Communicator::group(members), a sub-group

  void all_reduce(const void* s, void* r, size_t n, DType t, ir::ReduceKind k) override {
    Call c{{int64_t(ir::Op::AllReduce), int64_t(n), int64_t(t), int64_t(k)}, s, r};
    c.kind = k;
    meet(c);
  }
  // Posted; the last rank to post moves the data (possibly this one, now), the handle waits.
  std::unique_ptr<PendingCollective> start_all_reduce(const void* s, void* r, size_t n, DType t, ir::ReduceKind k) override {
    Call c{{int64_t(ir::Op::AllReduce), int64_t(n), int64_t(t), int64_t(k)}, s, r};
    c.kind = k;
    struct Pending final : PendingCollective {
      InProcess* self;
      uint64_t seq;
      bool finished = false;
      Pending(InProcess* c, uint64_t q) : self(c), seq(q) {}
      // `finished` is set before a call that may throw: the result is taken once.
      bool test() override {
        if (finished) return true;
        try {
          return finished = self->done(seq, "all_reduce");
        } catch (...) {
          finished = true;
          throw;
        }
      }
      void wait() override {
        if (finished) return;
        finished = true;
        self->wait(seq, "all_reduce");
      }
      ~Pending() override {
        try {
          wait();
        } catch (...) {  // a destroyed handle: its error was (or will be) thrown elsewhere
        }
      }
    };
    return std::make_unique<Pending>(this, post(c));
  }
  void all_gather(const void* s, void* r, size_t n, DType t) override { meet({{int64_t(ir::Op::AllGather), int64_t(n), int64_t(t), 0}, s, r}); }
  void reduce_scatter(const void* s, void* r, size_t n, DType t) override {
    meet({{int64_t(ir::Op::ReduceScatter), int64_t(n), int64_t(t), 0}, s, r});
  }
  void all_to_all(const void* s, void* r, size_t n, DType t) override { meet({{int64_t(ir::Op::AllToAll), int64_t(n), int64_t(t), 0}, s, r}); }
  void broadcast(const void* s, void* r, size_t n, DType t, int root) override {
    Call c{{int64_t(ir::Op::Broadcast), int64_t(n), int64_t(t), root}, s, r};
    c.root = root;
    meet(c);
  }
  void reduce(const void* s, void* r, size_t n, DType t, int root) override {
    Call c{{int64_t(ir::Op::Reduce), int64_t(n), int64_t(t), root}, s, r};
    c.root = root;
    meet(c);
  }
  void permute(const void* s, void* r, size_t n, DType t, int to, int from) override {
    Call c{{int64_t(ir::Op::CollectivePermute), int64_t(n), int64_t(t), int64_t(to + 1) * 65536 + (from + 1)}, s, r};
    c.send_to = to, c.recv_from = from;
    meet(c);
  }

 protected:
  std::shared_ptr<Communicator> make_group(const std::vector<int>& members) override {
    std::shared_ptr<Group> child;
    {
      std::lock_guard<std::mutex> lock(g_->mu);
      auto& slot = g_->children[members];
      if (!slot) {
        slot = std::make_shared<Group>(int(members.size()));
        slot->broken = g_->broken;
      }
      child = slot;
    }
    const int pos = int(std::find(members.begin(), members.end(), rank_) - members.begin());
    return std::make_shared<InProcess>(std::move(child), pos);
  }

 private:
  std::shared_ptr<Group> g_;
  int rank_;

  std::string who() const { return " (in-process communicator, rank " + std::to_string(rank_) + " of " + std::to_string(g_->n) + ")"; }

  // Posts c as this rank's next collective; the last rank to post moves the data. Returns its
  // sequence number.
  uint64_t post(const Call& c) {
    Group& g = *g_;
    std::lock_guard<std::mutex> lock(g.mu);
    if (!g.broken.empty()) fail(ir::op_name(ir::Op(c.sig.op)), "the group is broken: " + g.broken + who(), "");
    const uint64_t seq = g.next[size_t(rank_)]++;
    Meeting& m = g.meetings.try_emplace(seq, g.n).first->second;
    m.calls[size_t(rank_)] = c;
    m.posted[size_t(rank_)] = true;
    if (++m.arrived == g.n) {
      m.failed = check(m);
      if (m.failed.empty()) {
        try {
          move_data(m);
        } catch (const std::exception& e) {
          m.failed = e.what();
        }
      }
      m.done = true;
      g.cv.notify_all();
    }
    return seq;
  }
  // Whether meeting seq is done (without waiting); throws its error, or the group's if it broke
  // first. Not done while another rank holds the lock (the last to post moves every rank's data
  // under it): a rank testing between its Steps goes on instead of waiting for that copy.
  bool done(uint64_t seq, const std::string& op) {
    Group& g = *g_;
    std::unique_lock<std::mutex> lock(g.mu, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    Meeting& m = g.meetings.at(seq);
    if (!m.done && !g.broken.empty()) fail(op, "the group is broken: " + g.broken + who(), "");
    if (!m.done) return false;
    collect(seq, m, op);  // may erase m
    return true;
  }
  // Waits (at most the timeout) for meeting seq; throws its error.
  void wait(uint64_t seq, const std::string& op) {
    Group& g = *g_;
    std::unique_lock<std::mutex> lock(g.mu);
    Meeting& m = g.meetings.at(seq);
    auto deadline = std::chrono::steady_clock::now() + timeout();
    bool woke = g.cv.wait_until(lock, deadline, [&] { return m.done || !g.broken.empty(); });
    if (!woke) {
      std::string missing;
      for (int r = 0; r < g.n; ++r)
        if (!m.posted[size_t(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      g.broken = op + " on rank " + std::to_string(rank_) + " timed out after " +
                 std::to_string(double(timeout().count()) / 1000) + " s waiting for rank(s) " + missing;
      g.cv.notify_all();
      fail(op, "timed out after " + std::to_string(double(timeout().count()) / 1000) + " s waiting for rank(s) " + missing +
                   " (lost or stuck; TESSERA_COLLECTIVE_TIMEOUT_S sets the limit)" + who(), "");
    }
    if (!m.done) fail(op, "the group is broken: " + g.broken + who(), "");
    collect(seq, m, op);
  }
  // Under the lock, meeting seq done: this rank takes its result (the last one erases it).
  void collect(uint64_t seq, Meeting& m, const std::string& op) {
    const std::string failed = m.failed;
    if (++m.collected == g_->n) g_->meetings.erase(seq);
    if (!failed.empty()) fail(op, failed + who(), "");
  }
  void meet(const Call& c) { wait(post(c), ir::op_name(ir::Op(c.sig.op))); }

  // Under the lock, all ranks posted: the mismatch every rank reports, or "".
  std::string check(const Meeting& g) const {
    const int n = g_->n;
    bool same = true;
    for (const Call& c : g.calls) same = same && comm::same_call(c.sig, g.calls[0].sig);
    if (same && g.calls[0].sig.op == int64_t(ir::Op::CollectivePermute))
      for (int r = 0; r < n; ++r) {
        const Call& c = g.calls[size_t(r)];
        if (c.send_to >= n || c.recv_from >= n || (c.send_to >= 0 && g.calls[size_t(c.send_to)].recv_from != r) ||
            (c.recv_from >= 0 && g.calls[size_t(c.recv_from)].send_to != r))
          same = false;
      }
    if (same) return "";
    std::string sides;
    for (int r = 0; r < n; ++r) sides += "; rank " + std::to_string(r) + ": " + g.calls[size_t(r)].sig.str();
    return "the ranks disagree about this collective (every rank fails)" + sides;
  }

  void move_data(const Meeting& m) const {
    struct {
      int n;
      const std::vector<Call>& calls;
    } g{g_->n, m.calls};
    const Call& c0 = g.calls[0];
    const DType t = DType(c0.sig.dtype);
    const size_t n = size_t(c0.sig.count), item = itemsize(t), bytes = n * item;
    const auto in = [&](int r) { return static_cast<const char*>(g.calls[size_t(r)].send); };
    const auto out = [&](int r) { return static_cast<char*>(g.calls[size_t(r)].recv); };
    std::vector<std::vector<char>> results(size_t(g.n));  // written after every read (in place)
    switch (ir::Op(c0.sig.op)) {
      case ir::Op::AllReduce: case ir::Op::Reduce: {
        std::vector<char> acc(in(0), in(0) + bytes);
        const ir::ReduceKind k = ir::Op(c0.sig.op) == ir::Op::Reduce ? ir::ReduceKind::Sum : c0.kind;
        for (int r = 1; r < g.n; ++r) comm::accumulate(acc.data(), in(r), n, t, k);
        if (k == ir::ReduceKind::Mean) comm::divide(acc.data(), n, t, g.n);
        for (int r = 0; r < g.n; ++r)
          if (ir::Op(c0.sig.op) == ir::Op::AllReduce || r == c0.root) results[size_t(r)] = acc;
        break;
      }
      case ir::Op::AllGather: {
        std::vector<char> all(bytes * size_t(g.n));
        if (bytes)  // a zero-size shard: nothing to copy (and no buffer to copy into)
          for (int r = 0; r < g.n; ++r) std::memcpy(all.data() + size_t(r) * bytes, in(r), bytes);
        for (auto& v : results) v = all;
        break;
      }
      case ir::Op::ReduceScatter:
        for (int r = 0; r < g.n; ++r) {
          std::vector<char> acc(in(0) + size_t(r) * bytes, in(0) + size_t(r + 1) * bytes);
          for (int s = 1; s < g.n; ++s) comm::accumulate(acc.data(), in(s) + size_t(r) * bytes, n, t, ir::ReduceKind::Sum);
          results[size_t(r)] = std::move(acc);
        }
        break;
      case ir::Op::AllToAll:
        for (int r = 0; r < g.n; ++r) {
          results[size_t(r)].resize(bytes * size_t(g.n));
          for (int s = 0; s < g.n && bytes; ++s) std::memcpy(results[size_t(r)].data() + size_t(s) * bytes, in(s) + size_t(r) * bytes, bytes);
        }
        break;
      case ir::Op::Broadcast:
        for (auto& v : results) v.assign(in(c0.root), in(c0.root) + bytes);
        break;
      case ir::Op::CollectivePermute:
        for (int r = 0; r < g.n; ++r)
          if (int s = g.calls[size_t(r)].recv_from; s >= 0) results[size_t(r)].assign(in(s), in(s) + bytes);
        break;
      default: fail("inprocess", "unknown collective");
    }
    for (int r = 0; r < g.n; ++r)
      if (!results[size_t(r)].empty()) std::memcpy(out(r), results[size_t(r)].data(), results[size_t(r)].size());
  }
};

}  // namespace

std::vector<std::shared_ptr<Communicator>> make_inprocess_group(int n) {
  if (n < 1) fail("inprocess", "a group needs at least one rank, got " + std::to_string(n), "");
  auto g = std::make_shared<Group>(n);
  std::vector<std::shared_ptr<Communicator>> v;
  for (int r = 0; r < n; ++r) v.push_back(std::make_shared<InProcess>(g, r));
  return v;
}

void abort_inprocess_group(Communicator& member, const std::string& why) {
  auto* ip = dynamic_cast<InProcess*>(&member);
  if (!ip) return;
  break_group(ip->shared_group(), why);
}

}  // namespace tessera::backends
