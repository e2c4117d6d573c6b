// The MPI communicator (OpenMPI, one process per rank under mpirun): MPI_COMM_WORLD duplicated.
// Every collective is a nonblocking MPI call polled with MPI_Test until done or past the timeout
// (a tight loop while data moves: OpenMPI progresses a transfer only inside MPI calls; see wait());
// (an MPI call cannot be cancelled: past the timeout the rank prints the error and calls MPI_Abort,
// and mpirun stops the other ranks). Before each collective the ranks exchange their call's signature (one small
// MPI_Iallgather), so a rank that disagrees makes every rank throw instead of hanging or
// mixing buffers. 16-bit floats are reduced through float32 on the host. start_all_reduce posts
// the MPI_Iallreduce after that exchange and returns: the runtime tests it between Steps and waits
// for it where a Step needs it (runtime/overlap.h).
#include "backends/communicator.h"
#include "core/fail.h"

#ifndef TESSERA_HAVE_MPI
namespace tessera::backends {
bool mpi_built() { return false; }
std::shared_ptr<Communicator> make_mpi_communicator() {
  fail("mpi", "this libtessera was built without MPI (install libopenmpi-dev and reconfigure: CMake's FindMPI)", "");
}
}  // namespace tessera::backends
#else
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include <sched.h>

#include "backends/comm/reduce.h"
#include "core/half.h"

namespace tessera::backends {
namespace {

using comm::Signature;

// TESSERA_MPI_WAIT_SPLIT=K, a diagnostic (docs/architecture.md "Parallelism"): an MPI_Barrier
// before each all_reduce, timed apart from it, splits a rank's time in all-reduces into waiting for
// the other ranks (the barrier), the signature exchange and the transfer itself; counted from the
// (K+1)-th all_reduce of the process on (the first K: the warm-up steps'), printed by each rank at
// exit. The barrier costs a synchronization per all_reduce: not for timing the step itself. The
// transfer is the time the rank spent completing it: in the blocking form all of it; for a started
// all_reduce (the runtime's overlap) its test() calls between Steps (MPI_Test moving the data on:
// the rank's own copying, printed apart) and its wait() (what the Steps run meanwhile did not hide).
struct WaitSplit {
  long skip = -1;  // -1: off
  int rank = 0;
  long calls = 0, counted = 0;
  double wait_s = 0, agree_s = 0, transfer_s = 0, progress_s = 0, bytes = 0;
  WaitSplit() {
    if (const char* e = std::getenv("TESSERA_MPI_WAIT_SPLIT")) skip = std::max(0L, std::atol(e));
  }
  ~WaitSplit() {
    if (counted)
      std::fprintf(stderr, "[mpi] rank %d, all_reduces %ld-%ld: waiting for the other ranks %.1f ms, signature exchange %.1f ms, transfer %.1f ms "
                   "(%.1f MB), of it in tests between Steps %.1f ms\n",
                   rank, skip + 1, calls, wait_s * 1e3, agree_s * 1e3, (transfer_s + progress_s) * 1e3, bytes / 1e6, progress_s * 1e3);
  }
};
WaitSplit g_split;
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

class Mpi final : public Communicator {
 public:
  Mpi() {
    int init = 0;
    MPI_Initialized(&init);
    if (!init) {
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        fail("mpi", "MPI_Init_thread failed", "");
      std::atexit([] {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_Finalize();
      });
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  explicit Mpi(MPI_Comm c) : comm_(c) {  // a sub-group's (make_group)
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  std::string name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(const void* s, void* r, size_t n, DType t, ir::ReduceKind k) override { start_reduce(s, r, n, t, k)->wait(); }
  // Posted after the signature exchange (so the ranks' calls are compared before any data
  // moves; the exchange waits for the other ranks to get here); the transfer then moves in the
  // handle's test() and wait() calls (no progress thread). Max keeps the blocking form: its NaN
  // flags are a second collective, which a completion noticed at different points on different
  // ranks would post out of order.
  std::unique_ptr<PendingCollective> start_all_reduce(const void* s, void* r, size_t n, DType t, ir::ReduceKind k) override {
    if (k == ir::ReduceKind::Max && is_floating(t)) return Communicator::start_all_reduce(s, r, n, t, k);
    return start_reduce(s, r, n, t, k);
  }
  void all_gather(const void* s, void* r, size_t n, DType t) override {
    agree({int64_t(ir::Op::AllGather), int64_t(n), int64_t(t), 0});
    const int b = bytes(n, t);
    MPI_Request q;
    check(MPI_Iallgather(s, b, MPI_BYTE, r, b, MPI_BYTE, comm_, &q), "all_gather");
    wait(q, "all_gather");
  }
  void reduce_scatter(const void* s, void* r, size_t n, DType t) override {
    agree({int64_t(ir::Op::ReduceScatter), int64_t(n), int64_t(t), 0});
    if (is_half(t)) {  // through float32: widen, reduce, narrow
      std::vector<float> w = widen(s, n * size_t(size_), t), out(n);
      MPI_Request q;
      check(MPI_Ireduce_scatter_block(w.data(), out.data(), int(n), MPI_FLOAT, MPI_SUM, comm_, &q), "reduce_scatter");
      wait(q, "reduce_scatter");
      narrow(out, r, t);
      return;
    }
    MPI_Request q;
    check(MPI_Ireduce_scatter_block(s, r, int(n), type(t), op(t, ir::ReduceKind::Sum), comm_, &q), "reduce_scatter");
    wait(q, "reduce_scatter");
  }
  void all_to_all(const void* s, void* r, size_t n, DType t) override {
    agree({int64_t(ir::Op::AllToAll), int64_t(n), int64_t(t), 0});
    const int b = bytes(n, t);
    MPI_Request q;
    check(MPI_Ialltoall(s, b, MPI_BYTE, r, b, MPI_BYTE, comm_, &q), "all_to_all");
    wait(q, "all_to_all");
  }
  void broadcast(const void* s, void* r, size_t n, DType t, int root) override {
    agree({int64_t(ir::Op::Broadcast), int64_t(n), int64_t(t), root});
    if (rank_ == root && s != r && n) std::memcpy(r, s, n * itemsize(t));
    MPI_Request q;
    check(MPI_Ibcast(r, bytes(n, t), MPI_BYTE, root, comm_, &q), "broadcast");
    wait(q, "broadcast");
  }
  void reduce(const void* s, void* r, size_t n, DType t, int root) override {
    start_reduce(s, r, n, t, ir::ReduceKind::Sum, root)->wait();
  }
  void permute(const void* s, void* r, size_t n, DType t, int to, int from) override {
    agree({int64_t(ir::Op::CollectivePermute), int64_t(n), int64_t(t), int64_t(to + 1) * 65536 + (from + 1)});
    const int b = bytes(n, t);
    std::vector<char> staged;
    if (s == r && to >= 0 && from >= 0) {  // in place: send a copy
      staged.assign(static_cast<const char*>(s), static_cast<const char*>(s) + b);
      s = staged.data();
    }
    MPI_Request q[2];
    int k = 0;
    if (from >= 0) check(MPI_Irecv(r, b, MPI_BYTE, from, 7, comm_, &q[k++]), "collective_permute");
    if (to >= 0) check(MPI_Isend(s, b, MPI_BYTE, to, 7, comm_, &q[k++]), "collective_permute");
    for (int i = 0; i < k; ++i) wait(q[i], "collective_permute");
  }

 protected:
  // MPI_Comm_create_group: collective over the members only (ranks of other groups create
  // theirs meanwhile, or not at all), in member order. It blocks without a timeout; the members
  // get here together because each has passed the sequence check of the same collectives.
  std::shared_ptr<Communicator> make_group(const std::vector<int>& members) override {
    MPI_Group all, sub;
    check(MPI_Comm_group(comm_, &all), "mpi");
    check(MPI_Group_incl(all, int(members.size()), members.data(), &sub), "mpi");
    MPI_Comm c = MPI_COMM_NULL;
    const int rc = MPI_Comm_create_group(comm_, sub, 0x7e55, &c);
    MPI_Group_free(&sub);
    MPI_Group_free(&all);
    check(rc, "mpi");
    return std::make_shared<Mpi>(c);
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;

  static bool is_half(DType t) { return t == DType::Float16 || t == DType::BFloat16; }
  static int bytes(size_t n, DType t) {
    size_t b = n * itemsize(t);
    if (b >= size_t(1) << 31) fail("mpi", "a collective of more than 2 GiB (" + std::to_string(b) + " bytes)", "");
    return int(b);
  }
  static MPI_Datatype type(DType t) {
    switch (t) {
      case DType::Bool: return MPI_UNSIGNED_CHAR;
      case DType::Int32: return MPI_INT32_T;
      case DType::Int64: return MPI_INT64_T;
      case DType::Float32: return MPI_FLOAT;
      case DType::Float64: return MPI_DOUBLE;
      default: return MPI_FLOAT;  // 16-bit floats go through float32
    }
  }
  static MPI_Op op(DType t, ir::ReduceKind k) {
    if (t == DType::Bool) return MPI_LOR;  // a bool's sum and max are both "any"
    return k == ir::ReduceKind::Max ? MPI_MAX : MPI_SUM;
  }
  static std::vector<float> widen(const void* p, size_t n, DType t) {
    std::vector<float> w(n);
    const uint16_t* h = static_cast<const uint16_t*>(p);
    for (size_t i = 0; i < n; ++i) w[i] = t == DType::Float16 ? half::f16_to_float(h[i]) : half::bf16_to_float(h[i]);
    return w;
  }
  static void narrow(const std::vector<float>& w, void* p, DType t) {
    uint16_t* h = static_cast<uint16_t*>(p);
    for (size_t i = 0; i < w.size(); ++i) h[i] = t == DType::Float16 ? half::float_to_f16(w[i]) : half::float_to_bf16(w[i]);
  }

  // A posted MPI_Iallreduce / MPI_Ireduce and what completing it takes (the NaN flags of a max,
  // 16-bit results narrowed, a mean's division): the same operations in the same order whether
  // it is waited for at once (the blocking calls) or later (start_all_reduce).
  struct Reduction final : PendingCollective {
    Mpi* self;
    const char* what;
    void* r;
    size_t n;
    DType t;
    ir::ReduceKind k;
    int root;
    bool timed = false, finished = false;
    std::vector<uint8_t> nan_local;  // read before an in-place reduction overwrites s
    std::vector<float> w, wout;
    MPI_Request q = MPI_REQUEST_NULL;
    Reduction(Mpi* c, const char* wh, void* rv, size_t cnt, DType ty, ir::ReduceKind kd, int rt)
        : self(c), what(wh), r(rv), n(cnt), t(ty), k(kd), root(rt) {}
    bool test() override {
      if (finished) return true;
      const auto t0 = std::chrono::steady_clock::now();
      int done = 0;
      self->check(MPI_Test(&q, &done, MPI_STATUS_IGNORE), what);
      if (done) finish();
      if (timed) g_split.progress_s += seconds_since(t0);
      return done != 0;
    }
    void wait() override {
      if (finished) return;
      const auto t0 = std::chrono::steady_clock::now();
      self->wait(q, what);
      finish();
      if (timed) g_split.transfer_s += seconds_since(t0);
    }
    void finish() {
      finished = true;
      const bool half = is_half(t);
      if (!nan_local.empty() || (k == ir::ReduceKind::Max && is_floating(t) && n == 0))
        self->nan_flags(nan_local, r, n, t, half ? wout.data() : nullptr, root);
      if (half && (root < 0 || self->rank_ == root)) narrow(wout, r, t);
      if (k == ir::ReduceKind::Mean) comm::divide(r, n, t, self->size_);
    }
    // A handle destroyed pending: the call cannot be cancelled and writes the caller's buffers,
    // so it is completed (past the timeout wait() ends the job).
    ~Reduction() override {
      try {
        wait();
      } catch (...) {
      }
    }
  };

  // all_reduce (and reduce, root >= 0) posted: signatures compared first. MPI_MAX does not
  // propagate NaN: a max is a sum of NaN flags too (in finish()).
  std::unique_ptr<Reduction> start_reduce(const void* s, void* r, size_t n, DType t, ir::ReduceKind k, int root = -1) {
    const char* what = root < 0 ? "all_reduce" : "reduce";
    const bool timed = root < 0 && g_split.skip >= 0 && ++g_split.calls > g_split.skip;
    auto t0 = std::chrono::steady_clock::now();
    if (timed) {
      check(MPI_Barrier(comm_), "all_reduce");  // no timeout: a diagnostic
      g_split.rank = rank_, g_split.counted++, g_split.wait_s += seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
    }
    if (root < 0) agree({int64_t(ir::Op::AllReduce), int64_t(n), int64_t(t), int64_t(k)});
    else agree({int64_t(ir::Op::Reduce), int64_t(n), int64_t(t), root});
    if (timed) g_split.agree_s += seconds_since(t0), g_split.bytes += double(n * itemsize(t));
    auto op_ = std::make_unique<Reduction>(this, what, r, n, t, k, root);
    Reduction& x = *op_;
    const bool half = is_half(t);
    if (k == ir::ReduceKind::Max && is_floating(t)) x.nan_local = nan_mask(s, n, t);
    const void* send = s;
    void* recv = r;
    if (half) {
      x.w = widen(s, n, t);
      x.wout.resize(n);
      send = x.w.data(), recv = x.wout.data();
    } else if (s == r) {
      send = MPI_IN_PLACE;
      if (root >= 0 && rank_ != root) send = s;  // MPI_IN_PLACE is for the root only
    }
    const MPI_Datatype dt = type(t);
    const MPI_Op o = op(t, k);
    x.finished = true;  // until posted: a failed post must not finish (write r) when the handle dies
    if (root < 0) check(MPI_Iallreduce(send, recv, int(n), dt, o, comm_, &x.q), what);
    else check(MPI_Ireduce(send, recv, int(n), dt, o, root, comm_, &x.q), what);
    x.finished = false;
    x.timed = timed;
    return op_;
  }
  // Where any rank's value is NaN the max is NaN (as the reference and the in-process one say).
  static std::vector<uint8_t> nan_mask(const void* s, size_t n, DType t) {
    std::vector<uint8_t> f(n);
    for (size_t i = 0; i < n; ++i) {
      double v = t == DType::Float32 ? double(static_cast<const float*>(s)[i])
                 : t == DType::Float64 ? static_cast<const double*>(s)[i]
                 : t == DType::Float16 ? double(half::f16_to_float(static_cast<const uint16_t*>(s)[i]))
                                       : double(half::bf16_to_float(static_cast<const uint16_t*>(s)[i]));
      f[i] = v != v;
    }
    return f;
  }
  void nan_flags(std::vector<uint8_t>& f, void* r, size_t n, DType t, float* wide, int root) {
    std::vector<uint8_t> all(n);
    MPI_Request q;
    check(MPI_Iallreduce(f.data(), all.data(), int(n), MPI_UNSIGNED_CHAR, MPI_LOR, comm_, &q), "all_reduce");
    wait(q, "all_reduce");
    if (root >= 0 && rank_ != root) return;
    for (size_t i = 0; i < n; ++i) {
      if (!all[i]) continue;
      if (wide) wide[i] = std::numeric_limits<float>::quiet_NaN();
      else if (t == DType::Float32) static_cast<float*>(r)[i] = std::numeric_limits<float>::quiet_NaN();
      else static_cast<double*>(r)[i] = std::numeric_limits<double>::quiet_NaN();
    }
  }

  void check(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fail(what, "MPI error: " + std::string(msg, size_t(len)) + who(), "");
  }
  std::string who() const { return " (mpi communicator, rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ")"; }

  // Polls q with MPI_Test until done or past the timeout. OpenMPI has no progress thread here:
  // a transfer moves only while its ranks call into MPI, so the first 2 ms are a tight loop of
  // tests (sleeping 50 us between tests once 1000 had failed made the shared-memory all-reduces
  // of the GPT's gradient buckets 4-10x slower; yielding the core between tests past 100 us, 3x:
  // docs/architecture.md "Parallelism", measured). Past 2 ms: in the signature exchange
  // (`arriving`, agree: where a rank waits for the others to reach the collective) it sleeps
  // 50 us between tests (1 ms past a second), so a rank far ahead of another that checkpoints or
  // evaluates does not burn its core; in a transfer (every rank has arrived) it yields the core
  // between tests, for ranks oversubscribing the cores.
  void wait(MPI_Request& q, const char* what, bool arriving = false) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now(), deadline = start + timeout();
    for (int tests = 1;; tests += tests < 64) {  // counts to 64, no further
      int done = 0;
      check(MPI_Test(&q, &done, MPI_STATUS_IGNORE), what);
      if (done) return;
      if (tests < 64) continue;  // the first ~30 us: a tight loop, no clock reads
      const auto now = clock::now();
      if (now > deadline) {
        // The pending call cannot be cancelled and still writes into the caller's buffers, so no
        // error may return to the caller: the message, then the whole job ends (mpirun stops the
        // other ranks).
        std::fprintf(stderr, "[%s] timed out after %g s waiting for the other ranks (one is lost or stuck; "
                     "TESSERA_COLLECTIVE_TIMEOUT_S sets the limit)%s: aborting the job\n",
                     what, double(timeout().count()) / 1000, who().c_str());
        std::fflush(stderr);
        MPI_Abort(comm_, 1);
        std::_Exit(1);  // MPI_Abort does not return
      }
      const auto waited = now - start;
      if (waited < std::chrono::milliseconds(2)) continue;
      if (arriving) {
        std::this_thread::sleep_for(std::chrono::microseconds(waited > std::chrono::seconds(1) ? 1000 : 50));
      } else {
        sched_yield();
      }
    }
  }

  // Every rank's signature: a mismatch fails on every rank with every rank's side.
  void agree(const Signature& mine) {
    std::vector<Signature> all(static_cast<size_t>(size_));
    MPI_Request q;
    check(MPI_Iallgather(&mine, int(sizeof mine), MPI_BYTE, all.data(), int(sizeof mine), MPI_BYTE, comm_, &q), "mpi");
    wait(q, ir::op_name(ir::Op(mine.op)), true);
    bool same = true;
    for (const Signature& s : all) same = same && comm::same_call(s, all[0]);
    if (same && mine.op == int64_t(ir::Op::CollectivePermute))
      for (int r = 0; r < size_; ++r) {
        int to = int(all[size_t(r)].extra / 65536) - 1, from = int(all[size_t(r)].extra % 65536) - 1;
        if (to >= size_ || from >= size_ || (to >= 0 && int(all[size_t(to)].extra % 65536) - 1 != r) ||
            (from >= 0 && int(all[size_t(from)].extra / 65536) - 1 != r))
          same = false;
      }
    if (same) return;
    std::string sides;
    for (int r = 0; r < size_; ++r) sides += "; rank " + std::to_string(r) + ": " + all[size_t(r)].str();
    fail(ir::op_name(ir::Op(mine.op)), "the ranks disagree about this collective (every rank fails)" + sides + who(), "");
  }
};

}  // namespace

bool mpi_built() { return true; }
std::shared_ptr<Communicator> make_mpi_communicator() { return std::make_shared<Mpi>(); }

}  // namespace tessera::backends
#endif
