// tessera::Replay (include/tessera/replay.h): a recorded trace rebuilt on new arguments gives what
// tracing would (values against the host; the same compiled graph), and traces it cannot replay
// exactly are refused: random draws, a value computed mid-trace, gradients being recorded, one
// tensor passed as two arguments.
#include <gtest/gtest.h>

#include <cmath>

#include "tessera/metrics.h"
#include "tessera/ops.h"
#include "tessera/replay.h"
#include "tessera/tensor.h"

using namespace tessera;

namespace {
// out0 = exp(a * w) + b (broadcast over rows), out1 = a itself.
std::vector<Tensor> trace(const Tensor& a, const Tensor& w, const Tensor& b) { return {(a * w).exp() + b, a}; }
}  // namespace

TEST(Replay, RebuildsTheTraceOnNewArgumentsAndHitsTheCompileCache) {
  NoGradGuard no_grad;
  Tensor a = from_vector<float>({0.5f, -1.0f, 2.0f, 0.25f, 1.5f, -0.5f}, {2, 3});
  Tensor w = from_vector<float>({1.0f, 2.0f, -1.0f}, {3});
  Tensor b = from_vector<float>({0.1f, 0.2f, 0.3f}, {3});
  uint64_t e = Replay::epoch();
  std::vector<Tensor> traced = trace(a, w, b);
  auto r = Replay::record({a, w, b}, traced, e);
  ASSERT_TRUE(r);
  EXPECT_GE(r->nodes(), 5u);  // mul, exp, add and the broadcasts of w and b
  traced[0].to_vector<float>();
  // New values of every argument, one of them pending (an in-place update not yet run).
  Tensor a2 = from_vector<float>({1.0f, 0.0f, -2.0f, 0.5f, 0.75f, 3.0f}, {2, 3});
  w.mul_(3.0);
  Tensor b2 = from_vector<float>({-1.0f, 0.0f, 1.0f}, {3});
  int64_t compiled = metrics().graphs_compiled;
  std::vector<Tensor> out = r->run({a2, w, b2});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[1].is_same(a2));  // an output that was an argument is that argument's handle
  std::vector<float> got = out[0].to_vector<float>(), av = a2.to_vector<float>(), wv{3.0f, 6.0f, -3.0f}, bv{-1.0f, 0.0f, 1.0f};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(got[size_t(i)], std::exp(double(av[size_t(i)]) * wv[size_t(i % 3)]) + bv[size_t(i % 3)], 1e-4) << i;
  // The in-place update of w is its own graph; the replayed output's graph is the traced one.
  EXPECT_LE(metrics().graphs_compiled - compiled, 1);
  compiled = metrics().graphs_compiled;
  r->run({a, w, b})[0].to_vector<float>();
  EXPECT_EQ(metrics().graphs_compiled, compiled);
  // Arguments of another shape: not replayed.
  EXPECT_TRUE(r->run({zeros({3, 3}), w, b}).empty());
  EXPECT_TRUE(r->run({a, w}).empty());
}

TEST(Replay, RefusesDrawsValuesComputedMidTraceAndRecordedGradients) {
  Tensor a = from_vector<float>({1.0f, 2.0f}, {2});
  {
    NoGradGuard no_grad;
    uint64_t e = Replay::epoch();
    Tensor y = a + randn({2});
    EXPECT_FALSE(Replay::record({a}, {y}, e));  // a replay would draw the same numbers again
    e = Replay::epoch();
    double s = (a * 2.0).sum().item();  // realized mid-trace: the trace may depend on it
    Tensor z = a * s;
    EXPECT_FALSE(Replay::record({a}, {z}, e));
  }
  {
    NoGradGuard no_grad;
    uint64_t e = Replay::epoch();
    // One tensor as two arguments: a replay on two different ones could not tell the uses apart.
    EXPECT_FALSE(Replay::record({a, a}, {a * 2.0 + a}, e));
  }
  Tensor p = from_vector<float>({3.0f, 4.0f}, {2});
  p.requires_grad_();
  uint64_t e = Replay::epoch();
  EXPECT_FALSE(Replay::record({a, p}, {a * p}, e));  // grad mode on, p requires grad
  std::shared_ptr<const Replay> r;
  {
    NoGradGuard no_grad;
    e = Replay::epoch();
    r = Replay::record({a, p}, {a * p}, e);
  }
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->run({a, p}).empty());  // grad mode is on again: trace, so backward works
  NoGradGuard no_grad;
  EXPECT_EQ(r->run({a, p})[0].to_vector<float>(), (std::vector<float>{3.0f, 8.0f}));
}
