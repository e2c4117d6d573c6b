#include "backends/collective.h"

#include <algorithm>
#include <cstring>

#include "core/fail.h"
#include "core/hash.h"
#include "ir/collectives.h"

namespace tessera::backends {
namespace {

// A shape split around `axis`: outer (dims before), extent, inner (dims after).
struct Around {
  size_t outer = 1, extent = 1, inner = 1;
};
Around around(const Shape& s, int64_t axis) {
  Around a;
  for (size_t d = 0; d < s.size(); ++d) {
    if (int64_t(d) < axis) a.outer *= size_t(s[d]);
    else if (int64_t(d) == axis) a.extent = size_t(s[d]);
    else a.inner *= size_t(s[d]);
  }
  return a;
}

// src [outer, N * m, inner] -> dst [N][outer, m, inner] (to_blocks), or back.
void blocks(const char* src, char* dst, const Around& a, size_t N, size_t item, bool to_blocks) {
  const size_t m = a.extent / N, row = m * a.inner * item, block = a.outer * row;
  if (row == 0) return;  // a zero-size shard
  for (size_t r = 0; r < N; ++r)
    for (size_t o = 0; o < a.outer; ++o) {
      const size_t interleaved = (o * a.extent + r * m) * a.inner * item, blocked = r * block + o * row;
      if (to_blocks) std::memcpy(dst + blocked, src + interleaved, row);
      else std::memcpy(dst + interleaved, src + blocked, row);
    }
}

// The communicator a Step's collective runs on for this rank (a sub-group's for stride > 0),
// its traffic counted on the communicator the rank runs under.
Communicator& communicator_for(const kir::Step& st, const ir::CollectiveAttrs& c, Communicator* world, size_t bytes_in) {
  const char* op = ir::op_name(st.collective);
  const std::string scope = st.sources.empty() ? "" : st.sources[0].scope;
  if (!world)
    fail(op, "no communicator for a graph of " + std::to_string(c.ranks) +
                 " ranks: run it on in-process ranks (runtime::realize_spmd) or under mpirun with the MPI communicator set",
         scope);
  Communicator* comm = world;
  if (c.stride > 0) {  // a sub-group: the members' own communicator (made by the sequence check, or here at first use)
    const std::vector<int64_t> m = c.group_of(world->rank(), world->size(), op);  // refuses groups that do not tile it
    comm = &world->group(std::vector<int>(m.begin(), m.end()));
  } else if (world->size() != c.ranks) {
    fail(op, "the graph is for " + std::to_string(c.ranks) + " ranks but the current communicator (" + world->name() + ") has " +
                 std::to_string(world->size()), scope);
  }
  const int rank = comm->rank();
  {  // the traffic this rank sends (Communicator::Traffic), counted on the communicator it runs under
    const int64_t in_b = int64_t(bytes_in), n = int64_t(c.ranks);
    int64_t b = 0;
    switch (st.collective) {
      case ir::Op::AllReduce: b = 2 * (n - 1) * in_b / n; break;
      case ir::Op::AllGather: b = (n - 1) * in_b; break;
      case ir::Op::ReduceScatter: case ir::Op::AllToAll: b = (n - 1) * in_b / n; break;
      case ir::Op::Broadcast: b = rank == c.root ? in_b : 0; break;
      case ir::Op::Reduce: b = rank == c.root ? 0 : in_b; break;
      case ir::Op::CollectivePermute: b = c.destination_of(rank) >= 0 ? in_b : 0; break;
      default: break;
    }
    world->count_traffic(b);
  }
  return *comm;
}

}  // namespace

std::unique_ptr<PendingCollective> start_collective_on_host(const kir::Step& st, void* const* slots) {
  if (st.kind != kir::StepKind::Collective || st.collective != ir::Op::AllReduce) return nullptr;
  const ir::CollectiveAttrs c = ir::CollectiveAttrs::from(st.collective, ir::Attrs{st.collective_attrs, 0});
  Communicator* world = current_communicator();
  if (c.ranks == 1 || !world) return nullptr;  // a copy, or the blocking path's error
  const DType t = st.input_dtypes.empty() ? st.dtype : st.input_dtypes[0];
  const size_t item = itemsize(t), n_in = size_t(numel(st.maps.at(0).shape()));
  const char* in = static_cast<const char*>(slots[st.inputs[0]]) + st.maps[0].views[0].offset * int64_t(item);
  Communicator& comm = communicator_for(st, c, world, n_in * item);
  return comm.start_all_reduce(in, slots[st.output], n_in, t, c.kind);
}

void run_collective_on_host(const kir::Step& st, void* const* slots) {
  const ir::CollectiveAttrs c = ir::CollectiveAttrs::from(st.collective, ir::Attrs{st.collective_attrs, 0});
  const char* op = ir::op_name(st.collective);
  const std::string scope = st.sources.empty() ? "" : st.sources[0].scope;
  const DType t = st.input_dtypes.empty() ? st.dtype : st.input_dtypes[0];
  const Shape& in_shape = st.maps.at(0).shape();
  const size_t item = itemsize(t), n_in = size_t(numel(in_shape)), n_out = size_t(numel(st.shape));
  const char* in = static_cast<const char*>(slots[st.inputs[0]]) + st.maps[0].views[0].offset * int64_t(item);
  char* out = static_cast<char*>(slots[st.output]);
  Communicator* world = current_communicator();
  if (c.ranks == 1 && (c.stride > 0 || !world || world->size() == 1)) {  // one rank: every collective is a copy,
    if (st.collective == ir::Op::CollectivePermute && c.source_of(0) < 0) {  // but a permute from nobody: zeros
      if (n_out) std::memset(out, 0, n_out * item);
      return;
    }
    if (n_out && in != out) std::memmove(out, in, n_out * item);
    return;
  }
  Communicator* comm = &communicator_for(st, c, world, n_in * item);
  const size_t N = size_t(c.ranks);
  const int rank = comm->rank();
  switch (st.collective) {
    case ir::Op::AllReduce: comm->all_reduce(in, out, n_in, t, c.kind); break;
    case ir::Op::Broadcast: comm->broadcast(in, out, n_in, t, int(c.root)); break;
    case ir::Op::Reduce:
      comm->reduce(in, out, n_in, t, int(c.root));
      if (rank != c.root && n_out) std::memset(out, 0, n_out * item);
      break;
    case ir::Op::CollectivePermute: {
      const int to = int(c.destination_of(rank)), from = int(c.source_of(rank));
      comm->permute(in, out, n_in, t, to, from);
      if (from < 0 && n_out) std::memset(out, 0, n_out * item);
      break;
    }
    case ir::Op::AllGather: {
      std::vector<char> tmp(n_out * item);
      comm->all_gather(in, tmp.data(), n_in, t);
      blocks(tmp.data(), out, around(st.shape, c.axis), N, item, false);
      break;
    }
    case ir::Op::ReduceScatter: {
      std::vector<char> tmp(n_in * item);
      blocks(in, tmp.data(), around(in_shape, c.axis), N, item, true);
      comm->reduce_scatter(tmp.data(), out, n_out, t);
      break;
    }
    case ir::Op::AllToAll: {
      // Send block r (along the split axis) to rank r; received block s goes to position s
      // along the concat axis.
      std::vector<char> send(n_in * item), recv(n_in * item);
      blocks(in, send.data(), around(in_shape, c.axis), N, item, true);
      comm->all_to_all(send.data(), recv.data(), n_in / N, t);
      blocks(recv.data(), out, around(st.shape, c.concat_axis), N, item, false);
      break;
    }
    default: fail(op, "not a collective", scope);
  }
}

// ---- the collective-sequence check ----
namespace {

std::string describe(const kir::Step& st, const ir::CollectiveAttrs& c) {
  std::string s = ir::op_name(st.collective);
  switch (st.collective) {
    case ir::Op::AllReduce: s += std::string(" ") + ir::reduce_kind_name(c.kind); break;
    case ir::Op::AllGather:
    case ir::Op::ReduceScatter: s += "(axis " + std::to_string(c.axis) + ")"; break;
    case ir::Op::AllToAll: s += "(split axis " + std::to_string(c.axis) + ", concat axis " + std::to_string(c.concat_axis) + ")"; break;
    case ir::Op::Broadcast:
    case ir::Op::Reduce: s += "(root " + std::to_string(c.root) + ")"; break;
    case ir::Op::CollectivePermute: {
      s += "(";
      for (size_t k = 0; k < c.pairs.size(); ++k)
        s += (k ? ", " : "") + std::to_string(c.pairs[k].first) + "->" + std::to_string(c.pairs[k].second);
      s += ")";
      break;
    }
    default: break;
  }
  const DType t = st.input_dtypes.empty() ? st.dtype : st.input_dtypes[0];
  return s + " " + dtype_name(t) + shape_str(st.maps.at(0).shape()) + " for " + std::to_string(c.ranks) + " ranks" +
         (c.stride > 0 ? " at stride " + std::to_string(c.stride) : std::string());
}

// One line per collective in the exchanged text: "item\tscope\n" (tabs and newlines in either
// would break the lines: spaces instead).
std::string clean(std::string s) {
  for (char& ch : s)
    if (ch == '\t' || ch == '\n') ch = ' ';
  return s;
}
std::string to_text(const CollectiveSequence& q) {
  std::string t;
  for (size_t i = 0; i < q.items.size(); ++i) t += clean(q.items[i]) + "\t" + clean(q.scopes[i]) + "\n";
  return t;
}
CollectiveSequence from_text(const char* p, size_t n) {
  CollectiveSequence q;
  const std::string t(p, size_t(std::find(p, p + n, '\0') - p));
  size_t at = 0;
  while (at < t.size()) {
    size_t tab = t.find('\t', at), end = t.find('\n', at);
    if (end == std::string::npos) end = t.size();
    if (tab == std::string::npos || tab > end) tab = end;
    q.items.push_back(t.substr(at, tab - at));
    q.scopes.push_back(tab < end ? t.substr(tab + 1, end - tab - 1) : "");
    at = end + 1;
  }
  return q;
}

// The sequence's hash: each item's text, then a byte no text holds, so "ab","c" and "a","bc" differ.
uint64_t append_item(uint64_t h, const std::string& s) { return fnv1a("\xff", fnv1a(s, h)); }

}  // namespace

CollectiveSequence collective_sequence(const std::vector<kir::Step>& steps) {
  CollectiveSequence q;
  uint64_t h = kFnv1aOffset;
  for (const kir::Step& st : steps) {
    if (st.kind != kir::StepKind::Collective) continue;
    const ir::CollectiveAttrs c = ir::CollectiveAttrs::from(st.collective, ir::Attrs{st.collective_attrs, 0});
    q.items.push_back(describe(st, c));
    q.scopes.push_back(st.sources.empty() ? "" : st.sources[0].scope);
    q.group.push_back(c.ranks);
    q.stride.push_back(c.stride);
    h = append_item(h, q.items.back());
  }
  q.hash = q.items.empty() ? 0 : h;
  return q;
}

std::string compare_collective_sequences(const std::vector<const CollectiveSequence*>& ranks) {
  size_t longest = 0;
  for (const CollectiveSequence* q : ranks) longest = std::max(longest, q->items.size());
  for (size_t i = 0; i < longest; ++i) {
    const CollectiveSequence& first = *ranks[0];
    bool same = true;
    for (const CollectiveSequence* q : ranks)
      same &= (i < q->items.size()) == (i < first.items.size()) && (i >= first.items.size() || q->items[i] == first.items[i]);
    if (same) continue;
    std::string m = "the ranks compiled different collective sequences (every rank fails): collective " + std::to_string(i) + ": ";
    for (size_t r = 0; r < ranks.size(); ++r) {
      const CollectiveSequence& q = *ranks[r];
      m += (r ? "; rank " : "rank ") + std::to_string(r) + " ";
      if (i < q.items.size()) m += q.items[i] + (q.scopes[i].empty() ? "" : " (in scope '" + q.scopes[i] + "')");
      else m += "none (it compiled " + std::to_string(q.items.size()) + (q.items.size() == 1 ? " collective)" : " collectives)");
    }
    return m;
  }
  return "";
}

void check_collective_sequence(const CollectiveSequence& mine, Communicator& comm, Backend& be, int device) {
  const size_t N = size_t(comm.size());
  if (N < 2) return;
  // Buffers in the backend's memory (the communicator's), freed however this ends.
  struct Scratch {
    Backend& be;
    int device;
    size_t n;
    void* p;
    Scratch(Backend& b, int d, size_t bytes) : be(b), device(d), n(std::max<size_t>(bytes, 1)), p(b.allocate(d, n)) {}
    ~Scratch() { be.free(device, p, n); }
  };
  const std::string text = to_text(mine);
  // {marker, hash, count, text bytes}: the marker tells a header from the data of a rank that is
  // not at this check (one that launched a collective without it, having agreed on its sequence
  // before): the per-call check usually catches that first, unless its call is this one's shape.
  constexpr int64_t kMarker = 0x5453515345514348;  // "TSQSEQCH"
  const int64_t head[4] = {kMarker, int64_t(mine.hash), int64_t(mine.items.size()), int64_t(text.size())};
  std::vector<int64_t> heads(4 * N);
  {
    Scratch send(be, device, sizeof head), recv(be, device, heads.size() * 8);
    be.copy_in(send.p, head, sizeof head);
    comm.all_gather(send.p, recv.p, 4, DType::Int64);
    be.synchronize();
    be.copy_out(heads.data(), recv.p, heads.size() * 8);
  }
  for (size_t r = 0; r < N; ++r)
    if (heads[4 * r] != kMarker)
      fail("spmd", "rank " + std::to_string(r) + " is not at the collective-sequence check where this rank (" + std::to_string(comm.rank()) +
                       ") is: it launched a collective of a sequence it had agreed on before, this rank one it had not; the ranks "
                       "run different programs",
           "");
  bool same = true;
  size_t longest = 0;
  for (size_t r = 0; r < N; ++r) {
    same &= heads[4 * r + 1] == head[1] && heads[4 * r + 2] == head[2];
    longest = std::max(longest, size_t(std::max<int64_t>(heads[4 * r + 3], 0)));
  }
  std::string why;
  if (!same) {
    // Every rank saw the same heads, so every rank takes this branch: the texts, padded to the longest.
    std::vector<char> padded(longest, 0), all(N * longest, 0);
    std::memcpy(padded.data(), text.data(), text.size());
    if (longest) {
      Scratch send(be, device, longest), recv(be, device, all.size());
      be.copy_in(send.p, padded.data(), longest);
      comm.all_gather(send.p, recv.p, longest, DType::Bool);
      be.synchronize();
      be.copy_out(all.data(), recv.p, all.size());
    }
    std::vector<CollectiveSequence> seqs;
    for (size_t r = 0; r < N; ++r) seqs.push_back(from_text(all.data() + r * longest, longest));
    std::vector<const CollectiveSequence*> ptrs;
    for (const CollectiveSequence& q : seqs) ptrs.push_back(&q);
    why = compare_collective_sequences(ptrs);
    if (why.empty())  // equal texts under different hashes: not expected, but never a silent pass
      why = "the ranks compiled different collective sequences (every rank fails): their fingerprints differ";
  } else {
    // The same sequence on every rank: each collective must be for this communicator's group,
    // or for sub-groups that tile it.
    for (size_t i = 0; i < mine.items.size() && why.empty(); ++i) {
      const int64_t g = mine.group[i], s = i < mine.stride.size() ? mine.stride[i] : 0;
      if (s == 0 ? g != int64_t(N) : int64_t(N) % (g * s) != 0)
        why = "collective " + std::to_string(i) + " (" + mine.items[i] + ") is not for the communicator's group (" + comm.name() +
              ", " + std::to_string(N) + " ranks" + (s ? ": its sub-groups do not tile it" : "") + "; every rank fails)";
    }
  }
  if (!why.empty()) fail("spmd", why, "");
  // Every rank agrees: make this rank's sub-group communicators now, while the ranks are in step.
  // Made later, at a collective's first run, an MPI group's creation (which has no timeout)
  // would wait for ever on a member that failed in a Step before it. Every rank walks the same
  // sequence, so each group's members create it in the same order.
  for (size_t i = 0; i < mine.items.size() && i < mine.stride.size(); ++i)
    if (mine.stride[i] > 0) {
      ir::CollectiveAttrs a;
      a.ranks = mine.group[i], a.stride = mine.stride[i];
      const std::vector<int64_t> m = a.group_of(comm.rank(), int64_t(N), "spmd");
      comm.group(std::vector<int>(m.begin(), m.end()));
    }
}

}  // namespace tessera::backends
