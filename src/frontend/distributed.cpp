// Collectives on tensors and the two ways ranks run (include/tessera/distributed.h).
#include "tessera/distributed.h"

#include "autodiff/autograd.h"
#include "core/fail.h"
#include "ir/collectives.h"
#include "runtime/realize.h"
#include "tensor/tensor_impl.h"

namespace tessera::dist {
namespace {

Tensor T(ir::NodePtr n, const Tensor& input) {
  Tensor t = detail::from_node(std::move(n));
  autodiff::record(t, {&input});
  return t;
}
void check(const Tensor& x, int64_t ranks, const char* op) {
  if (!x.defined()) fail(op, "called on an undefined tensor");
  if (ranks < 1) fail(op, "needs at least one rank, got " + std::to_string(ranks));
}
int64_t dim_of(const Tensor& x, int64_t d, const char* op) {
  const int64_t n = x.dim();
  if (d < -n || d >= n) fail(op, "dimension " + std::to_string(d) + " out of range for " + shape_str(x.shape()));
  return d < 0 ? d + n : d;
}

}  // namespace

Tensor all_reduce(const Tensor& x, int64_t ranks, Reduce op) {
  check(x, ranks, "all_reduce");
  ir::ReduceKind k = op == Reduce::Sum ? ir::ReduceKind::Sum : op == Reduce::Mean ? ir::ReduceKind::Mean : ir::ReduceKind::Max;
  return T(ir::build::all_reduce(detail::node_of(x), ranks, k), x);
}
Tensor all_gather(const Tensor& x, int64_t ranks, int64_t dim) {
  check(x, ranks, "all_gather");
  return T(ir::build::all_gather(detail::node_of(x), ranks, dim_of(x, dim, "all_gather")), x);
}
Tensor reduce_scatter(const Tensor& x, int64_t ranks, int64_t dim) {
  check(x, ranks, "reduce_scatter");
  return T(ir::build::reduce_scatter(detail::node_of(x), ranks, dim_of(x, dim, "reduce_scatter")), x);
}

std::pair<int, int> init_mpi() { return runtime::init_mpi_group(); }
int rank() { return runtime::process_group().first; }
int world_size() { return runtime::process_group().second; }

std::vector<std::vector<Tensor>> sync_ranks(int ranks, const std::vector<std::vector<std::pair<Tensor, Tensor>>>& inputs,
                                            int64_t batch_rows, const std::vector<Tensor>& outputs) {
  return detail::sync_spmd(ranks, inputs, batch_rows, outputs);
}

}  // namespace tessera::dist
