// Walks the primitive table: every primitive needs a forward case (CPU vs the float64
// reference) and, unless marked non-differentiable, a finite-difference check of its VJP rule.
// Non-differentiable primitives must give zero gradient. A planted wrong rule must be caught.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

#include "autodiff/autograd.h"
#include "tensor/tensor_impl.h"
#include "ir/build.h"
#include "ir/graph.h"
#include "reference/evaluator.h"
#include "test_util.h"

namespace tessera {
namespace {

using ir::NodePtr;
using ir::Op;
using testing::random_tensor;
constexpr DType F64 = DType::Float64;

// A primitive applied to fresh random float64 inputs; `diff` lists the inputs to differentiate.
struct Case {
  std::vector<Tensor> inputs;  // realized leaves (kept alive)
  std::vector<size_t> diff;
  NodePtr out;
};
using Builder = std::function<Case()>;

NodePtr N(const Tensor& t) { return detail::node_of(t); }
Tensor R(const Shape& s, uint32_t seed, double lo = -1, double hi = 1) { return random_tensor(s, F64, seed, lo, hi); }
Case one(Op op, Tensor x, ir::Attrs a = {}, const Shape* s = nullptr) {
  NodePtr n = ir::make(op, {N(x)}, a, s);
  return {{x}, {0}, n};
}
Case two(Op op, Tensor x, Tensor y) { return {{x, y}, {0, 1}, ir::make(op, {N(x), N(y)})}; }

std::map<Op, Builder> cases() {
  std::map<Op, Builder> c;
  Shape s{3, 4};
  c[Op::Leaf] = [] { Tensor x = R({5}, 1); return Case{{x}, {}, N(x)}; };
  c[Op::Full] = [] { Shape s{2, 3}; return Case{{}, {}, ir::build::full(2.5, s, F64, Device("cpu"))}; };
  c[Op::Iota] = [] { return Case{{}, {}, ir::build::iota({3, 4}, 1, Device("cpu"))}; };
  c[Op::Rng] = [] {
    Shape s{64};
    return Case{{}, {}, ir::make(Op::Rng, {}, ir::Attrs{{0, 1}, 0}, &s, F64, Device("cpu"))};
  };
  // float32 -> float64: the reference perturbs the float32 input in double, without rounding.
  c[Op::Cast] = [] {
    Tensor x = random_tensor({3, 4}, DType::Float32, 2);
    return Case{{x}, {0}, ir::build::cast(N(x), F64)};
  };
  for (Op op : {Op::Neg, Op::Exp, Op::Tanh, Op::Sin, Op::Cos, Op::Erf, Op::Abs, Op::Sign, Op::Floor, Op::Ceil, Op::Round})
    c[op] = [op, s] { return one(op, R(s, 3, -2, 2)); };
  for (Op op : {Op::Log, Op::Sqrt}) c[op] = [op, s] { return one(op, R(s, 4, 0.5, 2)); };
  for (Op op : {Op::Add, Op::Sub, Op::Mul, Op::Maximum, Op::Minimum})
    c[op] = [op, s] { return two(op, R(s, 5), R(s, 6)); };
  c[Op::Div] = [s] { return two(Op::Div, R(s, 7), R(s, 8, 0.5, 2)); };
  c[Op::Pow] = [s] { return two(Op::Pow, R(s, 9, 0.5, 2), R(s, 10)); };
  for (Op op : {Op::Eq, Op::Ne, Op::Lt, Op::Le, Op::Gt, Op::Ge})
    c[op] = [op, s] {
      Tensor x = R(s, 11), y = x * 1.0;  // some equal pairs
      Tensor z = where(R(s, 12) > 0.0, y, R(s, 13));
      return Case{{x, z}, {0, 1}, ir::make(op, {N(x), N(z)})};
    };
  c[Op::Where] = [s] {
    Tensor cnd = R(s, 14) > 0.0, a = R(s, 15), b = R(s, 16);
    return Case{{cnd, a, b}, {1, 2}, ir::make(Op::Where, {N(cnd), N(a), N(b)})};
  };
  c[Op::ReduceSum] = [] { return one(Op::ReduceSum, R({3, 4, 5}, 17), ir::Attrs{{0, 2}, 0}); };
  c[Op::ReduceMax] = [] { return one(Op::ReduceMax, R({3, 4, 5}, 18), ir::Attrs{{1}, 0}); };
  c[Op::Reshape] = [] { Shape t{6, 2}; return one(Op::Reshape, R({3, 4}, 19), {}, &t); };
  c[Op::Permute] = [] { return one(Op::Permute, R({2, 3, 4}, 20), ir::Attrs{{2, 0, 1}, 0}); };
  c[Op::Expand] = [] { Shape t{3, 4, 5}; return one(Op::Expand, R({3, 1, 5}, 21), {}, &t); };
  c[Op::Slice] = [] { return one(Op::Slice, R({7, 6}, 22), ir::Attrs{{1, 7, 2, 0, 5, 3}, 0}); };
  c[Op::Pad] = [] { return one(Op::Pad, R({3, 4}, 23), ir::Attrs{{1, 2, 1, 0, 1, 2}, 0.5}); };
  c[Op::Concat] = [] {
    Tensor a = R({2, 3}, 24), b = R({2, 5}, 25);
    return Case{{a, b}, {0, 1}, ir::make(Op::Concat, {N(a), N(b)}, ir::Attrs{{1}, 0})};
  };
  c[Op::Matmul] = [] { return two(Op::Matmul, R({2, 3, 4}, 26), R({2, 4, 5}, 27)); };
  c[Op::Gather] = [] {
    Tensor src = R({4, 5}, 28), idx = testing::random_int({3, 5}, 0, 3, DType::Int64, 29);
    return Case{{src, idx}, {0}, ir::build::gather(N(src), 0, N(idx))};
  };
  c[Op::ScatterAdd] = [] {
    Tensor base = R({4, 5}, 30), idx = testing::random_int({6, 5}, 0, 3, DType::Int64, 31), src = R({6, 5}, 32);
    return Case{{base, idx, src}, {0, 2}, ir::build::scatter_add(N(base), 0, N(idx), N(src))};
  };
  c[Op::DynamicUpdateSlice] = [] {
    Tensor base = R({5, 6}, 33), upd = R({2, 3}, 34);
    Tensor off = testing::make_tensor({4, 1}, {2}, DType::Int64);  // row 4 clamps to 3
    return Case{{base, upd, off}, {0, 1}, ir::build::dynamic_update_slice(N(base), N(upd), N(off))};
  };
  c[Op::Reverse] = [] { return one(Op::Reverse, R({3, 4, 2}, 35), ir::Attrs{{0, 2}, 0}); };
  // Every conv option at once: 2 groups, stride, padding (one side negative), both dilations.
  c[Op::Conv] = [] {
    Tensor x = R({2, 4, 7, 6}, 36), w = R({6, 2, 3, 2}, 37);
    ir::ConvAttrs a;
    a.groups = 2;
    a.axes = {{2, 1, 2, 2, 1}, {1, 2, -1, 1, 2}};
    return Case{{x, w}, {0, 1}, ir::build::conv(N(x), N(w), a)};
  };
  return c;
}

// Compares the VJP of c.out (cotangent w) against central differences of sum(out * w),
// evaluated with the float64 reference; returns the worst normalized error.
double vjp_error(const Case& c, std::string* detail) {
  Tensor w = random_tensor(c.out->shape, F64, 99);
  std::vector<NodePtr> boundary;
  for (auto& t : c.inputs) boundary.push_back(N(t));
  std::vector<NodePtr> grads = autodiff::vjp_region(c.out, boundary, N(w));
  ir::Graph g = ir::build_graph({c.out});
  std::vector<reference::Value> params;
  for (int p : g.params) {
    const ir::Node& n = *g.nodes[p];
    params.push_back({n.shape, n.dtype, reference::read_host(n.buffer->data, n.dtype, n.numel())});
  }
  std::vector<double> wv = w.to_vector<double>();
  auto loss = [&] {
    std::vector<double> out = reference::evaluate(g, 0, 0, params)[0].data;
    double s = 0;
    for (size_t i = 0; i < out.size(); ++i) s += out[i] * wv[i];
    return s;
  };
  double worst = 0;
  for (size_t k : c.diff) {
    std::vector<double> analytic =
        grads[k] ? detail::from_node(grads[k]).to_vector<double>() : std::vector<double>(size_t(c.inputs[k].numel()), 0.0);
    int p = g.index.find(boundary[k].get()) ? int(std::find(g.params.begin(), g.params.end(), g.index.at(boundary[k].get())) - g.params.begin()) : -1;
    if (p < 0) continue;
    std::vector<double> fd(analytic.size());
    for (size_t i = 0; i < fd.size(); ++i) {
      double keep = params[p].data[i], eps = 1e-6 * std::max(1.0, std::fabs(keep));
      params[p].data[i] = keep + eps;
      double up = loss();
      params[p].data[i] = keep - eps;
      double down = loss();
      params[p].data[i] = keep;
      fd[i] = (up - down) / (2 * eps);
    }
    double e = testing::normalized_error(analytic, fd);
    if (e > worst && detail) *detail = "input " + std::to_string(k) + ": got " + testing::values_str(analytic) + " want " + testing::values_str(fd);
    worst = std::max(worst, e);
  }
  return worst;
}

TEST(Primitives, EveryPrimitiveHasForwardAndGradientChecks) {
  auto all = cases();
  for (int i = 0; i < ir::kNumOps; ++i) {
    Op op = static_cast<Op>(i);
    if (ir::is_collective(op)) continue;  // over several ranks: tests/unit/test_collectives.cpp
    const ir::PrimitiveInfo& pi = ir::info(op);
    SCOPED_TRACE(pi.name);
    auto it = all.find(op);
    if (it == all.end()) {
      ADD_FAILURE() << "primitive '" << pi.name << "' has no test case";
      continue;
    }
    Case c = it->second();
    ASSERT_EQ(c.out->op, op == Op::Cast ? Op::Cast : op);
    // Forward: the CPU backend against the float64 reference (exact for integer results).
    Tensor out = detail::from_node(c.out);
    EXPECT_TRUE(testing::matches_reference(out, op == Op::Rng ? 1e-6 : -1));
    if (pi.differentiable) {
      EXPECT_NE(pi.vjp, nullptr) << pi.name << " is differentiable but has no VJP rule";
      std::string why;
      double e = vjp_error(c, &why);
      EXPECT_LE(e, 1e-6) << pi.name << " VJP disagrees with finite differences: " << why;
    } else {
      EXPECT_EQ(pi.vjp, nullptr);
    }
  }
}

TEST(Primitives, NonDifferentiableOpsGiveZeroGradient) {
  for (auto f : std::vector<std::function<Tensor(const Tensor&)>>{
           [](const Tensor& x) { return floor(x); }, [](const Tensor& x) { return ceil(x); },
           [](const Tensor& x) { return round(x); }, [](const Tensor& x) { return sign(x); },
           [](const Tensor& x) { return where(x > 0.0, ones_like(x), zeros_like(x)); }}) {
    Tensor x = random_tensor({6}, F64, 40, -3, 3).requires_grad_();
    Tensor y = (f(x) * 3.0).sum();
    if (!y.requires_grad()) continue;  // comparisons end the history, like PyTorch
    y.backward();
    ASSERT_TRUE(x.grad().defined());
    EXPECT_EQ(x.grad().to_vector<double>(), std::vector<double>(6, 0.0));
  }
  // A comparison's result needs no gradient: backward through it is a clear error.
  Tensor x = random_tensor({3}, F64, 41).requires_grad_();
  Tensor b = (x > 0.0).to(F64).sum();
  EXPECT_FALSE(b.requires_grad());
  EXPECT_THROW(b.backward(), Error);
}

// The test of the test: a wrong VJP rule for sin must be caught by the same check.
TEST(Primitives, PlantedWrongVjpIsCaught) {
  auto wrong = [](const ir::Node& n, const NodePtr&, const NodePtr& g) -> std::vector<NodePtr> {
    return {ir::build::mul(g, ir::build::unary(Op::Sin, n.inputs[0]))};  // should be cos
  };
  ir::VjpRule old = ir::replace_vjp_for_testing(Op::Sin, wrong);
  double e = vjp_error(cases()[Op::Sin](), nullptr);
  ir::replace_vjp_for_testing(Op::Sin, old);
  EXPECT_GT(e, 1e-2);
  EXPECT_LE(vjp_error(cases()[Op::Sin](), nullptr), 1e-6);
}

}  // namespace
}  // namespace tessera
