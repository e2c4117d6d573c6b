// Cases of the collective primitives: SPMD cases (Case::ranks) run on in-process ranks and
// checked rank by rank against reference::evaluate_ranks, forward and gradient (each rank's own
// random cotangent; the gradient is that of the sum of every rank's loss, ir/collectives.cpp).
// Each collective: float32 and float64 with gradients, an integer dtype where it applies, a
// non-contiguous input, 2 and 3 ranks, and a zero-size shard.
#include "autodiff/autograd.h"
#include "conformance/suite.h"
#include "ir/collectives.h"
#include "tensor/tensor_impl.h"

namespace tessera::conformance {
namespace {

using ir::Op;
using ir::ReduceKind;
using L = Layout;
constexpr DType F32 = DType::Float32, F64 = DType::Float64, I32 = DType::Int32, I64 = DType::Int64;

// Applies a collective to a tensor the way a frontend op would: new IR, recorded for autodiff.
Tensor apply(const Tensor& x, const std::function<ir::NodePtr(const ir::NodePtr&)>& f) {
  Tensor y = detail::from_node(f(detail::node_of(x)));
  autodiff::record(y, {&x});
  return y;
}

Case spmd(std::string variant, int ranks, Input in, std::function<ir::NodePtr(const ir::NodePtr&)> f) {
  Case c{std::move(variant), {std::move(in)},
         [f](const std::vector<Tensor>& x, const Context&) { return std::vector<Tensor>{apply(x[0], f)}; }};
  c.ranks = ranks;
  return c;
}

std::string nm(DType t, const Shape& s, int ranks, const std::string& what = "") {
  return variant_name(t, s, what) + " x" + std::to_string(ranks) + " ranks";
}

}  // namespace

std::vector<Case> collective_cases(Op op) {
  namespace b = ir::build;
  std::vector<Case> c;
  const Gen u = uniform(-2, 2);
  auto add = [&](DType t, const Shape& s, int n, L l, bool grad, std::function<ir::NodePtr(const ir::NodePtr&)> f,
                 const std::string& what = "") {
    c.push_back(spmd(nm(t, s, n, what + (l != L::Contiguous ? std::string(" ") + layout_name(l) : "") + (grad ? " grad" : "")), n,
                     input(s, t, is_floating(t) ? u : integers(-9, 9), l, grad), std::move(f)));
  };
  switch (op) {
    case Op::AllReduce:
      for (ReduceKind k : {ReduceKind::Sum, ReduceKind::Mean, ReduceKind::Max}) {
        auto f = [k](int n) { return [k, n](const ir::NodePtr& x) { return b::all_reduce(x, n, k); }; };
        const std::string kn = ir::reduce_kind_name(k);
        add(F32, {3, 5}, 2, L::Permuted, true, f(2), kn);
        add(F64, {7}, 3, L::Contiguous, true, f(3), kn);
        if (k != ReduceKind::Mean) add(I32, {4, 3}, 3, L::Contiguous, false, f(3), kn);
      }
      add(F32, {0, 3}, 2, L::Contiguous, false, [](const ir::NodePtr& x) { return b::all_reduce(x, 2, ReduceKind::Sum); }, "empty");
      break;
    case Op::AllGather:
      add(F32, {3, 2, 5}, 2, L::Strided, true, [](const ir::NodePtr& x) { return b::all_gather(x, 2, 1); }, "axis 1");
      add(F64, {2, 3}, 3, L::Contiguous, true, [](const ir::NodePtr& x) { return b::all_gather(x, 3, 0); }, "axis 0");
      add(I64, {4, 3}, 2, L::Contiguous, false, [](const ir::NodePtr& x) { return b::all_gather(x, 2, 1); }, "axis 1");
      add(F32, {0, 3}, 2, L::Contiguous, false, [](const ir::NodePtr& x) { return b::all_gather(x, 2, 0); }, "zero-size shard");
      break;
    case Op::ReduceScatter:
      add(F32, {4, 6}, 2, L::Permuted, true, [](const ir::NodePtr& x) { return b::reduce_scatter(x, 2, 1); }, "axis 1");
      add(F64, {6, 5}, 3, L::Contiguous, true, [](const ir::NodePtr& x) { return b::reduce_scatter(x, 3, 0); }, "axis 0");
      add(I32, {3, 6}, 3, L::Contiguous, false, [](const ir::NodePtr& x) { return b::reduce_scatter(x, 3, 1); }, "axis 1");
      break;
    case Op::AllToAll:
      add(F32, {4, 3}, 2, L::Permuted, true, [](const ir::NodePtr& x) { return b::all_to_all(x, 2, 0, 1); }, "0 -> 1");
      add(F64, {2, 6, 3}, 3, L::Contiguous, true, [](const ir::NodePtr& x) { return b::all_to_all(x, 3, 1, 2); }, "1 -> 2");
      add(F64, {3, 6}, 3, L::Contiguous, true, [](const ir::NodePtr& x) { return b::all_to_all(x, 3, 1, 1); }, "1 -> 1");
      add(I64, {6, 2}, 2, L::Contiguous, false, [](const ir::NodePtr& x) { return b::all_to_all(x, 2, 0, 0); }, "0 -> 0");
      break;
    case Op::Broadcast:
      add(F32, {3, 5}, 2, L::Strided, true, [](const ir::NodePtr& x) { return b::broadcast(x, 2, 1); }, "root 1");
      add(F64, {7}, 3, L::Contiguous, true, [](const ir::NodePtr& x) { return b::broadcast(x, 3, 2); }, "root 2");
      add(I32, {5}, 3, L::Contiguous, false, [](const ir::NodePtr& x) { return b::broadcast(x, 3, 0); }, "root 0");
      break;
    case Op::Reduce:
      add(F32, {3, 5}, 2, L::Permuted, true, [](const ir::NodePtr& x) { return b::reduce_to_root(x, 2, 0); }, "root 0");
      add(F64, {7}, 3, L::Contiguous, true, [](const ir::NodePtr& x) { return b::reduce_to_root(x, 3, 2); }, "root 2");
      add(I64, {5}, 3, L::Contiguous, false, [](const ir::NodePtr& x) { return b::reduce_to_root(x, 3, 1); }, "root 1");
      break;
    case Op::CollectivePermute:
      add(F32, {3, 5}, 2, L::Strided, true, [](const ir::NodePtr& x) { return b::collective_permute(x, 2, {{0, 1}, {1, 0}}); }, "swap");
      add(F64, {2, 3}, 3, L::Contiguous, true,
          [](const ir::NodePtr& x) { return b::collective_permute(x, 3, {{0, 1}, {1, 2}, {2, 0}}); }, "ring");
      add(F64, {4}, 3, L::Contiguous, true, [](const ir::NodePtr& x) { return b::collective_permute(x, 3, {{2, 0}}); }, "one pair");
      add(I32, {4}, 2, L::Contiguous, false, [](const ir::NodePtr& x) { return b::collective_permute(x, 2, {{0, 1}}); }, "one pair");
      break;
    default: break;
  }
  return c;
}

}  // namespace tessera::conformance
