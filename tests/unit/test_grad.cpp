// Reverse-mode autodiff: every composite and op of the public surface checked against central
// finite differences in float64 (testing::grad_check), plus the autodiff semantics of the tensor
// model (accumulation, item() before backward, no_grad, detach, explicit gradients, errors,
// non-differentiable ops, scopes of VJP nodes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "tensor/tensor_impl.h"
#include "ir/graph.h"
#include "ir/node.h"
#include "test_util.h"
#include "tessera/ops.h"
#include "tessera/scope.h"
#include "tessera/tessera.h"

namespace tessera {
namespace {

using testing::grad_check;
using testing::make_tensor;
using testing::random_away;
using testing::random_int;
using testing::random_tensor;
using V = std::vector<double>;
using Ts = std::vector<Tensor>;

constexpr DType kF64 = DType::Float64, kI64 = DType::Int64, kBool = DType::Bool;

Tensor R(const Shape& s, uint32_t seed, double lo = -1, double hi = 1) { return random_tensor(s, kF64, seed, lo, hi); }
Tensor P(const Shape& s, uint32_t seed, double lo = 0.5, double hi = 2) { return random_tensor(s, kF64, seed, lo, hi); }
Tensor I(const V& v, const Shape& s) { return make_tensor(v, s, kI64); }
TensorOptions f64() { return {kF64, Device("cpu")}; }

// Expects `stmt` to throw tessera::Error whose message starts with `prefix`.
#define EXPECT_ERROR_PREFIX(stmt, prefix)                                                          \
  do {                                                                                             \
    try {                                                                                          \
      stmt;                                                                                        \
      ADD_FAILURE() << "expected tessera::Error starting with " << (prefix) << " from: " #stmt;    \
    } catch (const tessera::Error& e) {                                                            \
      EXPECT_EQ(std::string(e.what()).rfind(prefix, 0), 0u) << "message: " << e.what();           \
    }                                                                                              \
  } while (0)

// ------------------------------------------------------------------ the checker itself

TEST(GradCheck, CatchesAWrongGradient) {
  // A planted wrong VJP (sin' = 1 instead of cos) must make the checker fail; restored after.
  auto f = [](const Ts& x) { return sin(x[0]) * x[1]; };
  Ts in = {R({5}, 1, -2, 2), R({5}, 2)};
  EXPECT_TRUE(grad_check(f, in));
  ir::VjpRule wrong = [](const ir::Node&, const ir::NodePtr&, const ir::NodePtr& g) { return std::vector<ir::NodePtr>{g}; };
  testing::GradCheckResult r;
  bool ok;
  {
    struct Restore {
      ir::VjpRule old;
      ~Restore() { ir::replace_vjp_for_testing(ir::Op::Sin, old); }
    } restore{ir::replace_vjp_for_testing(ir::Op::Sin, wrong)};
    ok = bool(grad_check(f, in, {}, &r));
  }
  EXPECT_FALSE(ok);
  EXPECT_GT(r.error[0], 1e-3);
  EXPECT_LE(r.error[1], 1e-6);  // the other input's gradient is unaffected
  EXPECT_TRUE(grad_check(f, in));
}

// ------------------------------------------------------------------ composites

TEST(Grad, Softmax) {
  EXPECT_TRUE(grad_check([](const Ts& x) { return softmax(x[0], -1); }, {R({3, 5}, 1, -2, 2)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return softmax(x[0], 0); }, {R({4, 3}, 2, -2, 2)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return softmax(x[0], 1); }, {R({2, 3, 2}, 3, -2, 2)}));
}

TEST(Grad, LogSoftmax) {
  EXPECT_TRUE(grad_check([](const Ts& x) { return log_softmax(x[0], -1); }, {R({3, 5}, 4, -2, 2)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return log_softmax(x[0], 0); }, {R({4, 2, 3}, 5, -2, 2)}));
}

TEST(Grad, GeluBothForms) {
  EXPECT_TRUE(grad_check([](const Ts& x) { return gelu(x[0]); }, {R({12}, 6, -3, 3)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return gelu(x[0], true); }, {R({12}, 7, -3, 3)}));
}

TEST(Grad, SiluSoftplusSigmoid) {
  EXPECT_TRUE(grad_check([](const Ts& x) { return silu(x[0]); }, {R({10}, 8, -4, 4)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return softplus(x[0]); }, {R({10}, 9, -4, 4)}));
  // beta = 2, threshold = 1: entries with 2x > 1 take the linear branch (slope 1).
  EXPECT_TRUE(grad_check([](const Ts& x) { return softplus(x[0], 2, 1); },
                         {random_away({12}, 10, -2, 2, {0.5})}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return sigmoid(x[0]); }, {R({10}, 11, -5, 5)}));
}

TEST(Grad, LayerNormWithWeightAndBias) {
  auto f = [](const Ts& x) { return layer_norm(x[0], {5}, x[1], x[2]); };
  EXPECT_TRUE(grad_check(f, {R({3, 5}, 12, -2, 2), R({5}, 13, 0.5, 1.5), R({5}, 14)}));
  // Over the last two dims, no affine parameters.
  auto g = [](const Ts& x) { return layer_norm(x[0], {2, 3}); };
  EXPECT_TRUE(grad_check(g, {R({2, 2, 3}, 15, -2, 2)}));
}

TEST(Grad, CrossEntropy) {
  auto f = [](const Ts& x) { return cross_entropy(x[0], x[1]); };
  EXPECT_TRUE(grad_check(f, {R({4, 5}, 16, -2, 2), I({0, 4, 2, 2}, {4})}));
}

TEST(Grad, MatmulBroadcastBatch) {
  auto f = [](const Ts& x) { return matmul(x[0], x[1]); };
  EXPECT_TRUE(grad_check(f, {R({2, 1, 3, 4}, 17), R({5, 4, 2}, 18)}));
  // Matrix-vector and vector-matrix.
  EXPECT_TRUE(grad_check(f, {R({3, 4}, 19), R({4}, 20)}));
  EXPECT_TRUE(grad_check(f, {R({4}, 21), R({2, 4, 3}, 22)}));
}

TEST(Grad, GatherAndScatterAdd) {
  Tensor idx = I({0, 3, 3, 1, 2, 0, 0, 0, 1, 2, 3, 3, 1, 1, 2}, {3, 5});
  EXPECT_TRUE(grad_check([](const Ts& x) { return gather(x[0], 1, x[1]); }, {R({3, 4}, 23), idx}));
  Tensor idx0 = I({2, 0, 1, 2, 2, 2, 0, 1}, {2, 4});
  EXPECT_TRUE(grad_check([](const Ts& x) { return gather(x[0], 0, x[1]); }, {R({3, 4}, 24), idx0}));
  // scatter_add: gradients with respect to the base and the source.
  auto f = [](const Ts& x) { return scatter_add(x[0], 0, x[1], x[2]); };
  EXPECT_TRUE(grad_check(f, {R({3, 4}, 25), idx0, R({2, 4}, 26)}));
  auto g = [](const Ts& x) { return scatter_add(x[0] * x[0], 1, x[1], x[2].exp()); };
  EXPECT_TRUE(grad_check(g, {R({3, 4}, 27), idx, R({3, 5}, 28)}));
}

TEST(Grad, SliceWithSteps) {
  auto f = [](const Ts& x) { return x[0].slice(0, 1, 7, 2).slice(1, 0, 9, 3); };
  EXPECT_TRUE(grad_check(f, {R({7, 9}, 29)}));
  auto g = [](const Ts& x) { return x[0].slice(1, -8, 100, 3) * x[0].slice(1, 0, 3); };
  EXPECT_TRUE(grad_check(g, {R({2, 9}, 30)}));
}

TEST(Grad, PadCatWhere) {
  EXPECT_TRUE(grad_check([](const Ts& x) { return pad(x[0], {1, 2, 0, 3}, 0.5); }, {R({2, 3}, 31)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return cat({x[0], x[1].exp(), x[0]}, 1); }, {R({2, 3}, 32), R({2, 1}, 33)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return cat({x[0], x[1]}, 0); }, {R({1, 3}, 34), R({2, 3}, 35)}));
  Tensor cond = make_tensor({1, 0, 0, 1, 1, 0}, {2, 3}, kBool);
  auto w = [](const Ts& x) { return where(x[2], x[0], x[1]); };
  EXPECT_TRUE(grad_check(w, {R({2, 3}, 36), R({3}, 37), cond}));
  // The condition computed from an input: gradient flows only through the selected branches.
  auto w2 = [](const Ts& x) { return where(x[0] > x[1], x[0] * x[1], x[0] - x[1]); };
  EXPECT_TRUE(grad_check(w2, {R({8}, 38), R({8}, 39)}));
}

TEST(Grad, MaxWithTiesGoesToTheFirstIndex) {
  Tensor x = make_tensor({1, 3, 3, 2, 5, 5, 5, 0}, {2, 4}, kF64);
  x.requires_grad_();
  Tensor m = x.amax({1});
  EXPECT_EQ(m.to_vector<double>(), (V{3, 5}));
  (m * make_tensor({2, 7}, {2}, kF64)).sum().backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (V{0, 2, 0, 0, 7, 0, 0, 0}));

  // keepdim, over dim 0 and over everything.
  Tensor y = make_tensor({4, 1, 4, 1, 0, 1}, {3, 2}, kF64);
  y.requires_grad_();
  y.amax({0}, true).sum().backward();
  EXPECT_EQ(y.grad().to_vector<double>(), (V{1, 1, 0, 0, 0, 0}));
  Tensor z = make_tensor({1, 5, 5, 0}, {2, 2}, kF64);
  z.requires_grad_();
  z.max().backward();
  EXPECT_EQ(z.grad().to_vector<double>(), (V{0, 1, 0, 0}));

  // amax and amin follow the same rule (DESIGN.md "Semantics").
  Tensor a = make_tensor({2, 7, 7, 7, -1, -1}, {2, 3}, kF64);
  a.requires_grad_();
  amax(a, {1}).sum().backward();
  EXPECT_EQ(a.grad().to_vector<double>(), (V{0, 1, 0, 1, 0, 0}));
  Tensor b = make_tensor({2, 7, 7, 7, -1, -1}, {2, 3}, kF64);
  b.requires_grad_();
  amin(b, {1}).sum().backward();
  EXPECT_EQ(b.grad().to_vector<double>(), (V{1, 0, 0, 0, 1, 0}));

  // Without ties, max is differentiable everywhere near the input.
  EXPECT_TRUE(grad_check([](const Ts& x) { return x[0].amax({0}); }, {R({4, 3}, 40)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return amin(x[0], {1}, true); }, {R({4, 3}, 41)}));
}

TEST(Grad, VarStdLogsumexpMean) {
  EXPECT_TRUE(grad_check([](const Ts& x) { return var(x[0], {1}); }, {R({3, 5}, 42)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return var(x[0], {0}, 0, true); }, {R({4, 3}, 43)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return std(x[0]); }, {R({3, 4}, 44)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return std(x[0], {-1}, 0); }, {R({3, 4}, 45)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return logsumexp(x[0], {1}); }, {R({3, 5}, 46, -3, 3)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return logsumexp(x[0], {0, 2}, true); }, {R({2, 3, 2}, 47, -3, 3)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return mean(x[0], {0}); }, {R({4, 3}, 48)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return mean(x[0]); }, {R({2, 3}, 49)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return x[0].sum({1}, true) * x[0]; }, {R({2, 3}, 50)}));
}

TEST(Grad, ClampAwayFromTheBounds) {
  EXPECT_TRUE(grad_check([](const Ts& x) { return clamp(x[0], -0.5, 0.5); }, {random_away({12}, 51, -1, 1, {-0.5, 0.5})}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return clamp(x[0], std::nullopt, 0.2); }, {random_away({8}, 52, -1, 1, {0.2})}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return clamp(x[0], -0.1, std::nullopt); }, {random_away({8}, 53, -1, 1, {-0.1})}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return relu(x[0]); }, {random_away({8}, 54, -1, 1, {0})}));
}

TEST(Grad, UnaryMath) {
  EXPECT_TRUE(grad_check([](const Ts& x) { return pow(x[0], x[1]); }, {P({6}, 55), R({6}, 56, -2, 2)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return pow(x[0], 3.0); }, {R({6}, 57)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return pow(x[0], 0.5); }, {P({6}, 58)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return pow(2.0, x[0]); }, {R({6}, 59)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return sqrt(x[0]); }, {P({6}, 60)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return rsqrt(x[0]); }, {P({6}, 61)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return reciprocal(x[0]); }, {P({6}, 62)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return square(x[0]); }, {R({6}, 63)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return sin(x[0]) * cos(x[0] * 2.0); }, {R({6}, 64, -3, 3)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return erf(x[0]); }, {R({6}, 65, -2, 2)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return abs(x[0]); }, {random_away({8}, 66, -1, 1, {0})}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return neg(x[0]) + (-x[0]) * 2.0; }, {R({6}, 67)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return x[0].tanh() + x[0].exp() + x[1].log(); }, {R({6}, 68), P({6}, 69)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return tanh(x[0]) * exp(x[0]) / log(x[1]); }, {R({6}, 70), P({6}, 71, 1.5, 3)}));
}

TEST(Grad, DivisionAndScalars) {
  EXPECT_TRUE(grad_check([](const Ts& x) { return x[0] / x[1]; }, {R({5}, 72), P({5}, 73)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return 2.0 / x[1] - x[0] / 3.0 + (1.0 - x[0]) * 0.5; }, {R({5}, 74), P({5}, 75)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return maximum(x[0], x[1]) + minimum(x[0], x[1]) * 2.0; }, {R({7}, 76), R({7}, 77)}));
}

TEST(Grad, BroadcastingSumsOverBroadcastDims) {
  auto f = [](const Ts& x) { return x[0] + x[1] * x[2]; };
  EXPECT_TRUE(grad_check(f, {R({3, 1, 4}, 78), R({5, 1}, 79), R({4}, 80)}));
  auto g = [](const Ts& x) { return x[0] / x[1] - x[2]; };
  EXPECT_TRUE(grad_check(g, {R({2, 3}, 81), P({1, 3}, 82), R({}, 83)}));
  // Analytic: d/db sum(a * b) with a [3,4], b [4] is the column sums of a.
  Tensor a = make_tensor({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {3, 4}, kF64);
  Tensor b = make_tensor({1, 1, 1, 1}, {4}, kF64);
  b.requires_grad_();
  (a * b).sum().backward();
  EXPECT_EQ(b.grad().to_vector<double>(), (V{15, 18, 21, 24}));
}

TEST(Grad, DynamicUpdateSlice) {
  auto f = [](const Ts& x) { return dynamic_update_slice(x[0] * x[0], x[1].exp(), x[2]); };
  EXPECT_TRUE(grad_check(f, {R({4, 5}, 84), R({2, 3}, 85), I({1, 2}, {2})}));
  // Offsets clamped so that the update fits ([3, 4] -> [2, 2]).
  EXPECT_TRUE(grad_check(f, {R({4, 5}, 86), R({2, 3}, 87), I({3, 4}, {2})}));
  // By hand: the base's gradient is zero where the update was written.
  Tensor base = make_tensor(V(6, 1), {6}, kF64), upd = make_tensor({5, 5}, {2}, kF64);
  base.requires_grad_();
  upd.requires_grad_();
  dynamic_update_slice(base, upd, I({1}, {1})).sum().backward();
  EXPECT_EQ(base.grad().to_vector<double>(), (V{1, 0, 0, 1, 1, 1}));
  EXPECT_EQ(upd.grad().to_vector<double>(), (V{1, 1}));
}

TEST(Grad, EmbeddingIndexSelectRepeat) {
  Tensor ids = I({0, 5, 5, 2, 1, 0, 5, 3}, {2, 4});
  EXPECT_TRUE(grad_check([](const Ts& x) { return embedding(x[0], x[1]); }, {R({6, 3}, 88), ids}));
  Tensor sel = I({4, 0, 4, 2}, {4});
  EXPECT_TRUE(grad_check([](const Ts& x) { return index_select(x[0], 0, x[1]); }, {R({5, 3}, 89), sel}));
  Tensor sel1 = I({2, 2, 0}, {3});
  EXPECT_TRUE(grad_check([](const Ts& x) { return index_select(x[0], 1, x[1]); }, {R({2, 3}, 90), sel1}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return repeat(x[0], {2, 1, 2}); }, {R({2, 3}, 91)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return repeat(x[0], {3, 2}); }, {R({2, 2}, 92)}));
}

TEST(Grad, StackSplitChunk) {
  EXPECT_TRUE(grad_check([](const Ts& x) { return stack({x[0], x[1], x[0] * x[1]}, 1); }, {R({2, 3}, 93), R({2, 3}, 94)}));
  auto s = [](const Ts& x) {
    auto p = split(x[0], 2, 1);  // [3,2], [3,2], [3,1]
    return cat({p[0] * p[1], p[2] * p[2]}, 1);
  };
  EXPECT_TRUE(grad_check(s, {R({3, 5}, 95)}));
  auto c = [](const Ts& x) {
    auto p = chunk(x[0], 3, 0);  // three [2, 2]
    return p[0] * p[1] + sin(p[2]);
  };
  EXPECT_TRUE(grad_check(c, {R({6, 2}, 96)}));
}

TEST(Grad, MovementOps) {
  auto f = [](const Ts& x) { return x[0].permute({2, 0, 1}).reshape({4, 6}).transpose(0, 1) * x[1].expand({6, 4}); };
  EXPECT_TRUE(grad_check(f, {R({2, 3, 4}, 97), R({6, 1}, 98)}));
  auto g = [](const Ts& x) {
    return flatten(unsqueeze(squeeze(narrow(x[0], 1, 1, 1), 1), 0)) * squeeze(x[1]).reshape({-1});
  };
  EXPECT_TRUE(grad_check(g, {R({3, 4}, 99), R({1, 3, 1}, 100)}));
  auto h = [](const Ts& x) { return x[0].expand({2, -1, 3}).sum({0}) * x[0]; };
  EXPECT_TRUE(grad_check(h, {R({4, 1}, 101)}));
}

TEST(Grad, MaskedFillTrilTriu) {
  Tensor mask = make_tensor({1, 0, 0, 1}, {4}, kBool);
  EXPECT_TRUE(grad_check([](const Ts& x) { return masked_fill(x[0], x[1], 2.0); }, {R({3, 4}, 102), mask}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return tril(x[0]) + triu(x[0], 1) * 2.0; }, {R({2, 3, 4}, 103)}));
  EXPECT_TRUE(grad_check([](const Ts& x) { return tril(x[0], -1) * triu(x[0], -1); }, {R({4, 3}, 104)}));
}

TEST(Grad, AttentionLikeComposite) {
  auto f = [](const Ts& x) {
    Tensor s = matmul(x[0], x[1].transpose(-2, -1)) / std::sqrt(4.0);
    Tensor m = eq(tril(ones({3, 3}, f64())), zeros({3, 3}, f64()));
    return matmul(softmax(masked_fill(s, m, -INFINITY), -1), x[2]);
  };
  EXPECT_TRUE(grad_check(f, {R({2, 3, 4}, 105), R({2, 3, 4}, 106), R({2, 3, 4}, 107)}));
}

TEST(Grad, CastToFloat64) {
  // to(dtype) between float64 and float64 is a no-op; through float32 and back the gradient is 1.
  Tensor x = R({4}, 108);
  x.requires_grad_();
  (x.to(DType::Float32).to(kF64) * 3.0).sum().backward();
  EXPECT_TRUE(testing::all_close(x.grad().to_vector<double>(), V(4, 3), 0));
}

// ------------------------------------------------------------------ autodiff semantics

TEST(Autograd, BackwardTwiceAccumulates) {
  Tensor x = make_tensor({1, 2, 3}, {3}, kF64);
  x.requires_grad_();
  (x * x).sum().backward();
  (x * x).sum().backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (V{4, 8, 12}));
  // The same root twice (history is kept beside the IR).
  Tensor y = make_tensor({1, 2, 3}, {3}, kF64);
  y.requires_grad_();
  Tensor loss = (y * 3.0).sum();
  loss.backward();
  loss.backward();
  EXPECT_EQ(y.grad().to_vector<double>(), (V{6, 6, 6}));
  // set_grad(undefined) clears.
  y.set_grad(Tensor());
  EXPECT_FALSE(y.grad().defined());
  loss.backward();
  EXPECT_EQ(y.grad().to_vector<double>(), (V{3, 3, 3}));
}

TEST(Autograd, BackwardAfterItemGivesTheSameGradients) {
  auto f = [](const Tensor& x) { return (sin(x) * x.exp()).sum(); };
  Tensor a = R({5}, 109), b = make_tensor(a.to_vector<double>(), {5}, kF64);
  a.requires_grad_();
  b.requires_grad_();
  Tensor la = f(a);
  double v = la.item();  // realizes the forward value first
  la.backward();
  Tensor lb = f(b);
  lb.backward();
  EXPECT_DOUBLE_EQ(v, lb.item());
  EXPECT_TRUE(testing::all_close(a.grad().to_vector<double>(), b.grad().to_vector<double>(), 1e-14));
  // And a value read in the middle of the forward pass.
  Tensor c = make_tensor(a.to_vector<double>(), {5}, kF64);
  c.requires_grad_();
  Tensor mid = sin(c);
  (void)mid.to_vector<double>();
  (mid * c.exp()).sum().backward();
  EXPECT_TRUE(testing::all_close(c.grad().to_vector<double>(), b.grad().to_vector<double>(), 1e-14));
}

TEST(Autograd, NoGradGuardRecordsNothing) {
  Tensor x = R({3}, 110);
  x.requires_grad_();
  EXPECT_TRUE(grad_enabled());
  Tensor y;
  {
    NoGradGuard g;
    EXPECT_FALSE(grad_enabled());
    y = softmax(x * 2.0, 0);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(y.is_leaf());
    {
      NoGradGuard nested;
      EXPECT_FALSE(grad_enabled());
    }
    EXPECT_FALSE(grad_enabled());
  }
  EXPECT_TRUE(grad_enabled());
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE((x * 2.0).requires_grad());
  EXPECT_FALSE((x * 2.0).is_leaf());
  EXPECT_TRUE(x.is_leaf());
}

TEST(Autograd, DetachStopsGradients) {
  Tensor x = make_tensor({1, 2, 3}, {3}, kF64);
  x.requires_grad_();
  Tensor d = x.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
  (x * d).sum().backward();  // d/dx = d only
  EXPECT_EQ(x.grad().to_vector<double>(), (V{1, 2, 3}));
  // Detaching a pending intermediate.
  Tensor y = make_tensor({1, 2, 3}, {3}, kF64);
  y.requires_grad_();
  Tensor e = (y * y).detach();
  EXPECT_EQ(e.to_vector<double>(), (V{1, 4, 9}));
  (e * y).sum().backward();
  EXPECT_EQ(y.grad().to_vector<double>(), (V{1, 4, 9}));
}

TEST(Autograd, ExplicitGradientForNonScalar) {
  Tensor x = make_tensor({1, 2, 3, 4}, {2, 2}, kF64);
  x.requires_grad_();
  Tensor y = x * x;
  y.backward(make_tensor({1, 10, 100, 1000}, {2, 2}, kF64));
  EXPECT_EQ(x.grad().to_vector<double>(), (V{2, 40, 600, 8000}));
}

TEST(Autograd, BackwardErrors) {
  Tensor x = R({2, 2}, 111);
  x.requires_grad_();
  Tensor y = x * 2.0;
  EXPECT_ERROR_PREFIX(y.backward(), "[backward]");                          // non-scalar, no gradient
  EXPECT_ERROR_PREFIX(y.backward(R({3}, 112)), "[backward]");               // wrong gradient shape
  Tensor n = R({2}, 113);
  EXPECT_ERROR_PREFIX((n * 2.0).sum().backward(), "[backward]");            // needs no grad
  EXPECT_ERROR_PREFIX(Tensor().backward(), "[backward]");
  Tensor i = random_int({2}, 0, 3);
  EXPECT_ERROR_PREFIX(i.requires_grad_(), "[requires_grad_]");             // integers
  EXPECT_ERROR_PREFIX(y.requires_grad_(), "[requires_grad_]");             // non-leaf
  // The error names the shape.
  try {
    y.backward();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 2]"), std::string::npos) << e.what();
  }
}

TEST(Autograd, NonDifferentiableOpsGiveZeroGradient) {
  Tensor x = make_tensor({-1.7, -0.5, 0.2, 1.5, 2.5, 3.1}, {6}, kF64);
  x.requires_grad_();
  Tensor y = make_tensor({0.3, 0.3, 0.3, 0.3, 0.3, 0.3}, {6}, kF64);
  Tensor nondiff = floor(x) + round(x) + sign(x) + ceil(x) +
                   where(x > y, ones({6}, f64()), zeros({6}, f64())) + where(le(x, y), x * 0.0 + 1.0, y);
  (nondiff + x * 3.0).sum().backward();
  // Only x * 3 and the x*0 branch contribute: 3 everywhere (x*0.0 adds 0).
  EXPECT_EQ(x.grad().to_vector<double>(), V(6, 3));
  // A loss made only of non-differentiable ops: zero gradient (defined or absent).
  Tensor z = make_tensor({-1.7, 0.2, 2.5}, {3}, kF64);
  z.requires_grad_();
  (floor(z) * round(z) + sign(z)).sum().backward();
  if (z.grad().defined()) {
    EXPECT_EQ(z.grad().to_vector<double>(), V(3, 0));
  }
}

TEST(Autograd, VjpNodesCarryTheForwardScope) {
  Tensor x = R({4}, 114);
  x.requires_grad_();
  Tensor loss;
  {
    Scope s{"blk"};
    loss = (x.exp() * x).sum();
  }
  loss.backward();
  Tensor g = x.grad();
  ASSERT_TRUE(g.defined());
  ir::Graph graph = ir::build_graph({detail::node_of(g)});
  bool found = false;
  std::string scopes;
  for (const auto& n : graph.nodes) {
    if (*n->scope == "blk.backward") found = true;
    scopes += "'" + *n->scope + "' ";
  }
  EXPECT_TRUE(found) << "scopes in the gradient graph: " << scopes;
  // Nested scopes join with '.'.
  Tensor w = R({4}, 115);
  w.requires_grad_();
  {
    Scope a{"blocks"};
    Scope b{"0"};
    loss = sin(w).sum();
  }
  loss.backward();
  graph = ir::build_graph({detail::node_of(w.grad())});
  found = false;
  for (const auto& n : graph.nodes) found = found || *n->scope == "blocks.0.backward";
  EXPECT_TRUE(found);
}

TEST(Autograd, ForwardBackwardInOneGraph) {
  // Nothing realized in between: the forward value and the gradient come from one sync.
  Tensor x = R({3}, 116);
  x.requires_grad_();
  Tensor y = (x * x).sum();
  y.backward();
  EXPECT_FALSE(y.is_realized());
  EXPECT_FALSE(x.grad().is_realized());
  sync();
  EXPECT_TRUE(y.is_realized());
  EXPECT_TRUE(x.grad().is_realized());
  V xv = x.to_vector<double>(), gv = x.grad().to_vector<double>();
  for (size_t i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(gv[i], 2 * xv[i]);
}

}  // namespace
}  // namespace tessera
