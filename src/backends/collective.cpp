#include "backends/collective.h"

#include <cstring>

#include "core/fail.h"
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

}  // namespace

void run_collective_on_host(const kir::Step& st, void* const* slots) {
  const ir::CollectiveAttrs c = ir::CollectiveAttrs::from(st.collective, ir::Attrs{st.collective_attrs, 0});
  const char* op = ir::op_name(st.collective);
  const std::string scope = st.sources.empty() ? "" : st.sources[0].scope;
  const DType t = st.input_dtypes.empty() ? st.dtype : st.input_dtypes[0];
  const Shape& in_shape = st.maps.at(0).shape();
  const size_t item = itemsize(t), n_in = size_t(numel(in_shape)), n_out = size_t(numel(st.shape));
  const char* in = static_cast<const char*>(slots[st.inputs[0]]) + st.maps[0].views[0].offset * int64_t(item);
  char* out = static_cast<char*>(slots[st.output]);
  Communicator* comm = current_communicator();
  if (c.ranks == 1 && (!comm || comm->size() == 1)) {  // one rank: every collective is a copy,
    if (st.collective == ir::Op::CollectivePermute && c.source_of(0) < 0) {  // but a permute from nobody: zeros
      if (n_out) std::memset(out, 0, n_out * item);
      return;
    }
    if (n_out && in != out) std::memmove(out, in, n_out * item);
    return;
  }
  if (!comm)
    fail(op, "no communicator for a graph of " + std::to_string(c.ranks) +
                 " ranks: run it on in-process ranks (runtime::realize_spmd) or under mpirun with the MPI communicator set",
         scope);
  if (comm->size() != c.ranks)
    fail(op, "the graph is for " + std::to_string(c.ranks) + " ranks but the current communicator (" + comm->name() + ") has " +
                 std::to_string(comm->size()), scope);
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

}  // namespace tessera::backends
