// The op surface of tessera/ops.h, forward only: every function against the float64 reference
// (broadcasting, non-contiguous inputs, zero-size dims), hand-derived values where the frontend
// decides semantics (ties, rounding, estimators, sizes), and bad input for every op family.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <string>

#include "test_util.h"
#include "tessera/ops.h"
#include "tessera/tessera.h"

namespace tessera {
namespace {

using testing::make_tensor;
using testing::matches_reference;
using testing::random_int;
using testing::random_positive;
using testing::random_tensor;
using V = std::vector<double>;

constexpr DType kF32 = DType::Float32, kF64 = DType::Float64, kI32 = DType::Int32, kI64 = DType::Int64,
                kBool = DType::Bool;

TensorOptions opts(DType t) { return {t, Device("cpu")}; }
Tensor F(const Shape& s, uint32_t seed, double lo = -1, double hi = 1) { return random_tensor(s, kF32, seed, lo, hi); }
Tensor D(const Shape& s, uint32_t seed, double lo = -1, double hi = 1) { return random_tensor(s, kF64, seed, lo, hi); }
Tensor I(const V& v, const Shape& s) { return make_tensor(v, s, kI64); }
Tensor B(const V& v, const Shape& s) { return make_tensor(v, s, kBool); }
// A non-contiguous [r, c] float32 view: the transpose of a random [c, r].
Tensor NC(int64_t r, int64_t c, uint32_t seed, double lo = -1, double hi = 1) { return F({c, r}, seed, lo, hi).transpose(0, 1); }

void expect_values(const Tensor& t, const V& want, double tol = 0) {
  EXPECT_TRUE(testing::all_close(t.to_vector<double>(), want, tol));
}
void expect_shape(const Tensor& t, const Shape& s, DType dt) {
  EXPECT_EQ(t.shape(), s) << shape_str(t.shape());
  EXPECT_EQ(t.dtype(), dt) << dtype_name(t.dtype());
}

// Expects a tessera::Error whose message starts with `prefix` and contains each of `parts`.
void expect_error(const std::function<void()>& fn, const std::string& prefix, const std::vector<std::string>& parts = {}) {
  try {
    fn();
    sync();  // errors of checked-at-run-time ops surface here
    ADD_FAILURE() << "expected tessera::Error starting with " << prefix;
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(m.rfind(prefix, 0), 0u) << "message: " << m;
    for (const auto& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "missing '" << p << "' in: " << m;
  }
}

// ------------------------------------------------------------------ factories

TEST(Surface, Linspace) {
  Tensor l = linspace(0, 1, 5);
  expect_shape(l, {5}, kF32);
  expect_values(l, {0, 0.25, 0.5, 0.75, 1});
  Tensor d = linspace(-3, 7, 11, opts(kF64));
  V dv = d.to_vector<double>();
  EXPECT_EQ(dv.front(), -3);
  EXPECT_EQ(dv.back(), 7);  // the end point is exact
  for (int i = 0; i < 11; ++i) EXPECT_NEAR(dv[size_t(i)], -3 + i, 1e-12);
  Tensor thirds = linspace(0, 1, 4, opts(kF64));
  EXPECT_EQ(thirds.to_vector<double>().back(), 1.0);
  expect_values(linspace(2, 5, 1), {2});
  expect_shape(linspace(2, 5, 0), {0}, kF32);
  expect_values(linspace(1, -1, 3), {1, 0, -1});
  EXPECT_TRUE(matches_reference(linspace(-1, 1, 7)));
}

TEST(Surface, Eye) {
  expect_values(eye(3), {1, 0, 0, 0, 1, 0, 0, 0, 1});
  Tensor r = eye(2, 4, opts(kI32));
  expect_shape(r, {2, 4}, kI32);
  expect_values(r, {1, 0, 0, 0, 0, 1, 0, 0});
  expect_values(eye(3, 2), {1, 0, 0, 1, 0, 0});
  expect_shape(eye(0), {0, 0}, kF32);
  EXPECT_TRUE(matches_reference(eye(4, 3, opts(kF64))));
}

TEST(Surface, RandintRandLike) {
  manual_seed(7);
  Tensor r = randint(-3, 4, {2000});
  expect_shape(r, {2000}, kI64);
  V v = r.to_vector<double>();
  std::set<double> seen(v.begin(), v.end());
  EXPECT_EQ(*seen.begin(), -3);
  EXPECT_EQ(*seen.rbegin(), 3);  // high is exclusive
  EXPECT_EQ(seen.size(), 7u);
  for (double x : v) EXPECT_EQ(x, std::floor(x));
  Tensor r32 = randint(0, 2, {10}, opts(kI32));
  expect_shape(r32, {10}, kI32);
  (void)r32.to_vector<double>();  // realized before reseeding (a pending draw would share the next graph)
  // A floating dtype gives integer values (like torch.randint(..., dtype=float32)).
  Tensor rf = randint(-2, 2, {50}, opts(kF32));
  expect_shape(rf, {50}, kF32);
  for (double x : rf.to_vector<double>()) {
    EXPECT_EQ(x, std::floor(x));
    EXPECT_GE(x, -2);
    EXPECT_LT(x, 2);
  }
  // Same seed, same numbers.
  manual_seed(7);
  EXPECT_EQ(randint(-3, 4, {2000}).to_vector<double>(), v);

  Tensor t = zeros({300, 10}, opts(kF64));
  Tensor u = rand_like(t), n = randn_like(t);
  expect_shape(u, {300, 10}, kF64);
  expect_shape(n, {300, 10}, kF64);
  V uv = u.to_vector<double>(), nv = n.to_vector<double>();
  double us = 0, ns = 0, ns2 = 0;
  for (double x : uv) {
    EXPECT_GE(x, 0);
    EXPECT_LT(x, 1);
    us += x;
  }
  for (double x : nv) ns += x, ns2 += x * x;
  EXPECT_NEAR(us / 3000, 0.5, 0.03);
  EXPECT_NEAR(ns / 3000, 0, 0.06);
  EXPECT_NEAR(ns2 / 3000, 1, 0.08);
  EXPECT_NE(uv, rand_like(t).to_vector<double>());  // the generator advances
}

// ------------------------------------------------------------------ elementwise math

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> host;
  double lo, hi;
};

double gelu_erf(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
double sigmoid_h(double x) { return 1 / (1 + std::exp(-x)); }
double softplus_h(double x, double beta, double th) { return beta * x > th ? x : std::log1p(std::exp(beta * x)) / beta; }

const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> cases = {
      {"neg", [](const Tensor& a) { return neg(a); }, [](double x) { return -x; }, -2, 2},
      {"abs", [](const Tensor& a) { return abs(a); }, [](double x) { return std::abs(x); }, -2, 2},
      {"sign", [](const Tensor& a) { return sign(a); }, [](double x) { return double((x > 0) - (x < 0)); }, -2, 2},
      {"sqrt", [](const Tensor& a) { return sqrt(a); }, [](double x) { return std::sqrt(x); }, 0.1, 4},
      {"rsqrt", [](const Tensor& a) { return rsqrt(a); }, [](double x) { return 1 / std::sqrt(x); }, 0.1, 4},
      {"reciprocal", [](const Tensor& a) { return reciprocal(a); }, [](double x) { return 1 / x; }, 0.5, 4},
      {"square", [](const Tensor& a) { return square(a); }, [](double x) { return x * x; }, -3, 3},
      {"sin", [](const Tensor& a) { return sin(a); }, [](double x) { return std::sin(x); }, -4, 4},
      {"cos", [](const Tensor& a) { return cos(a); }, [](double x) { return std::cos(x); }, -4, 4},
      {"erf", [](const Tensor& a) { return erf(a); }, [](double x) { return std::erf(x); }, -3, 3},
      {"floor", [](const Tensor& a) { return floor(a); }, [](double x) { return std::floor(x); }, -3, 3},
      {"ceil", [](const Tensor& a) { return ceil(a); }, [](double x) { return std::ceil(x); }, -3, 3},
      {"round", [](const Tensor& a) { return round(a); }, [](double x) { return std::nearbyint(x); }, -3, 3},
      {"sigmoid", [](const Tensor& a) { return sigmoid(a); }, sigmoid_h, -6, 6},
      {"relu", [](const Tensor& a) { return relu(a); }, [](double x) { return x > 0 ? x : 0; }, -2, 2},
      {"gelu", [](const Tensor& a) { return gelu(a); }, gelu_erf, -4, 4},
      {"gelu_tanh", [](const Tensor& a) { return gelu(a, true); }, gelu_tanh, -4, 4},
      {"silu", [](const Tensor& a) { return silu(a); }, [](double x) { return x * sigmoid_h(x); }, -5, 5},
      {"softplus", [](const Tensor& a) { return softplus(a); }, [](double x) { return softplus_h(x, 1, 20); }, -5, 5},
      {"softplus_b2_t3", [](const Tensor& a) { return softplus(a, 2, 3); }, [](double x) { return softplus_h(x, 2, 3); }, -3, 3},
      {"exp", [](const Tensor& a) { return exp(a); }, [](double x) { return std::exp(x); }, -3, 3},
      {"log", [](const Tensor& a) { return log(a); }, [](double x) { return std::log(x); }, 0.1, 5},
      {"tanh", [](const Tensor& a) { return tanh(a); }, [](double x) { return std::tanh(x); }, -3, 3},
      {"clamp", [](const Tensor& a) { return clamp(a, -0.5, 0.25); }, [](double x) { return std::min(std::max(x, -0.5), 0.25); }, -1, 1},
      {"pow3", [](const Tensor& a) { return pow(a, 3.0); }, [](double x) { return x * x * x; }, -2, 2},
      {"exp2", [](const Tensor& a) { return pow(2.0, a); }, [](double x) { return std::pow(2.0, x); }, -2, 2},
  };
  return cases;
}

TEST(Surface, UnaryMatchReferenceAndHost) {
  uint32_t seed = 100;
  for (const auto& c : unary_cases()) {
    SCOPED_TRACE(c.name);
    // float64: against plain host math.
    Tensor d = random_tensor({37}, kF64, ++seed, c.lo, c.hi);
    Tensor yd = c.op(d);
    expect_shape(yd, {37}, kF64);
    V dv = d.to_vector<double>(), want;
    for (double x : dv) want.push_back(c.host(x));
    expect_values(yd, want, 1e-12);
    // float32, contiguous and non-contiguous, against the reference.
    Tensor f = F({3, 5}, ++seed, c.lo, c.hi);
    Tensor nc = NC(4, 3, ++seed, c.lo, c.hi);
    Tensor y = c.op(f), ync = c.op(nc);
    expect_shape(y, {3, 5}, kF32);
    expect_shape(ync, {4, 3}, kF32);
    EXPECT_TRUE(matches_reference({y, ync}));
    // Zero-size.
    Tensor z = c.op(zeros({0, 3}));
    expect_shape(z, {0, 3}, kF32);
    EXPECT_TRUE(matches_reference(z));
  }
}

TEST(Surface, UnaryHandValues) {
  // round: half to even, sign preserved.
  expect_values(round(make_tensor({2.5, -0.5, 0.5, 1.5, -2.5, 3.5, -1.7}, {7})), {2, -0.0, 0, 2, -2, 4, -2});
  V r = round(make_tensor({-0.5}, {1}, kF64)).to_vector<double>();
  EXPECT_TRUE(std::signbit(r[0])) << "round(-0.5) must be -0";
  expect_values(floor(make_tensor({-1.5, 1.5, 2}, {3})), {-2, 1, 2});
  expect_values(ceil(make_tensor({-1.5, 1.5, 2}, {3})), {-1, 2, 2});
  expect_values(sign(make_tensor({-3, 0, 2}, {3})), {-1, 0, 1});
  expect_values(relu(make_tensor({-1, 0, 2}, {3})), {0, 0, 2});
  expect_values(pow(make_tensor({2, 3}, {2}), make_tensor({3, 2}, {2})), {8, 9});
  expect_values(pow(make_tensor({4, 9}, {2}), 0.5), {2, 3});
  expect_values(sigmoid(make_tensor({0}, {1})), {0.5});
  expect_values(gelu(make_tensor({0}, {1})), {0});
  // Extreme inputs stay finite.
  V big = sigmoid(make_tensor({-1000, 1000}, {2})).to_vector<double>();
  expect_values(sigmoid(make_tensor({-1000, 1000}, {2})), {0, 1});
  V sp = softplus(make_tensor({-1000, 1000}, {2}, kF64)).to_vector<double>();
  EXPECT_EQ(sp[0], 0);
  EXPECT_EQ(sp[1], 1000);
  // Integers: neg/abs/sign keep the dtype; fractional results promote to float32.
  Tensor i = make_tensor({-3, 0, 4}, {3}, kI32);
  expect_shape(abs(i), {3}, kI32);
  expect_values(abs(i), {3, 0, 4});
  expect_shape(neg(i), {3}, kI32);
  expect_shape(sign(i), {3}, kI32);
  expect_shape(sqrt(abs(i)), {3}, kF32);
  expect_values(sqrt(abs(i)), {std::sqrt(3.0f), 0, 2}, 1e-7);
  expect_shape(sigmoid(i), {3}, kF32);
  expect_shape(sin(make_tensor({1, 2}, {2}, kI64)), {2}, kF32);
}

TEST(Surface, PowBroadcasting) {
  Tensor a = random_positive({3, 1}, kF32, 1), b = F({4}, 2, -2, 2);
  Tensor p = pow(a, b);
  expect_shape(p, {3, 4}, kF32);
  EXPECT_TRUE(matches_reference(p));
  EXPECT_TRUE(matches_reference({pow(a, 2.0), pow(3.0, b), pow(D({2, 3}, 3, 0.5, 2), D({3}, 4))}));
  // A float64 exponent with a float32 base: tensor promotion.
  expect_shape(pow(a, D({4}, 5)), {3, 4}, kF64);
}

TEST(Surface, Clamp) {
  Tensor x = make_tensor({-3, -1, 0, 1, 3}, {5});
  expect_values(clamp(x, -1.5, 2), {-1.5, -1, 0, 1, 2});
  expect_values(clamp(x, std::nullopt, 0.5), {-3, -1, 0, 0.5, 0.5});
  expect_values(clamp(x, 0.5, std::nullopt), {0.5, 0.5, 0.5, 1, 3});
  // lo > hi: every element becomes hi (PyTorch: min(max(x, lo), hi)).
  expect_values(clamp(x, 2, 1), {1, 1, 1, 1, 1});
  // Integers clamp to integers.
  Tensor xi = make_tensor({-3, 0, 5}, {3}, kI64);
  expect_shape(clamp(xi, -1, 2), {3}, kI64);
  expect_values(clamp(xi, -1, 2), {-1, 0, 2});
  EXPECT_TRUE(matches_reference({clamp(NC(3, 4, 6), -0.3, 0.4), clamp(zeros({0}), 0, 1)}));
  // NaN propagates like PyTorch.
  V n = clamp(make_tensor({NAN}, {1}), 0, 1).to_vector<double>();
  EXPECT_TRUE(std::isnan(n[0]));
}

// ------------------------------------------------------------------ logical

TEST(Surface, Logical) {
  Tensor a = B({1, 1, 0, 0}, {4}), b = B({1, 0, 1, 0}, {4});
  expect_shape(logical_and(a, b), {4}, kBool);
  expect_values(logical_and(a, b), {1, 0, 0, 0});
  expect_values(logical_or(a, b), {1, 1, 1, 0});
  expect_values(logical_xor(a, b), {0, 1, 1, 0});
  expect_values(logical_not(a), {0, 0, 1, 1});
  // Other dtypes compare with zero.
  Tensor f = make_tensor({0, 2.5, -1, 0}, {4});
  Tensor i = make_tensor({3, 0, 0, 0}, {4}, kI32);
  expect_shape(logical_and(f, i), {4}, kBool);
  expect_values(logical_and(f, i), {0, 0, 0, 0});
  expect_values(logical_or(f, i), {1, 1, 1, 0});
  expect_values(logical_not(f), {1, 0, 0, 1});
  // Broadcasting.
  Tensor c = B({1, 0, 1}, {3, 1});
  Tensor o = logical_xor(c, a);
  expect_shape(o, {3, 4}, kBool);
  EXPECT_TRUE(matches_reference({o, logical_and(F({2, 3}, 7), F({3}, 8) > 0.0), logical_not(zeros({0, 2}))}));
}

// ------------------------------------------------------------------ reductions

TEST(Surface, ReductionsMatchReference) {
  Tensor x = F({3, 4, 5}, 10, -2, 2);
  Tensor nc = F({5, 4, 3}, 11).permute({2, 1, 0});
  EXPECT_TRUE(matches_reference({sum(x), sum(x, {1}), sum(x, {0, 2}, true), sum(nc, {-1}), mean(x), mean(x, {-2}),
                                 mean(nc, {0, 1}, true)}));
  EXPECT_TRUE(matches_reference({amax(x), amax(x, {2}), amin(x, {0}, true), amax(nc, {-1, 0}), amin(nc)}));
  EXPECT_TRUE(matches_reference({argmax(x), argmax(x, 1), argmin(x, -1, true), argmax(nc, 0), argmin(nc)}));
  EXPECT_TRUE(matches_reference({var(x), var(x, {1}), var(x, {0, 2}, 0, true), std(x, {-1}), std(nc, {0}, 0)}));
  EXPECT_TRUE(matches_reference({logsumexp(x, {1}), logsumexp(x, {0, 2}, true), logsumexp(nc, {-1})}));
  Tensor d = D({6, 7}, 12);
  EXPECT_TRUE(matches_reference({var(d, {1}), std(d), logsumexp(d, {0}), mean(d, {1}), amax(d, {0})}));
  // Shapes and dtypes.
  expect_shape(sum(x, {1}), {3, 5}, kF32);
  expect_shape(mean(x, {0, 2}, true), {1, 4, 1}, kF32);
  expect_shape(argmax(x, 1), {3, 5}, kI64);
  expect_shape(argmax(x), {}, kI64);
  expect_shape(argmin(x, 2, true), {3, 4, 1}, kI64);
  expect_shape(var(x, {2}), {3, 4}, kF32);
  expect_shape(logsumexp(x, {0, 1}), {5}, kF32);
  expect_shape(sum(make_tensor({1, 2}, {2}, kI32)), {}, kI64);
}

TEST(Surface, ReductionHandValues) {
  Tensor t = make_tensor({1, 3, 3, 2, 0, 0, -1, 0}, {2, 4});
  // Ties pick the first index.
  expect_values(argmax(t, 1), {1, 0});
  expect_values(argmin(t, 1), {0, 2});
  expect_values(argmax(t), {1});
  expect_values(argmin(t), {6});
  expect_values(argmax(make_tensor({5, 5, 5}, {3})), {0});
  expect_values(argmax(t, 0, true), {0, 0, 0, 0});
  expect_values(amax(t, {1}), {3, 0});
  expect_values(amin(t, {0}), {0, 0, -1, 0});
  // var unbiased by hand: [1, 2, 3, 4] has mean 2.5, squared deviations 5, so 5/3 and 5/4.
  Tensor v = make_tensor({1, 2, 3, 4}, {4}, kF64);
  expect_values(var(v), {5.0 / 3}, 1e-15);
  expect_values(var(v, {}, 0), {1.25}, 1e-15);
  expect_values(std(v), {std::sqrt(5.0 / 3)}, 1e-15);
  expect_values(std(v, {0}, 0), {std::sqrt(1.25)}, 1e-15);
  expect_values(var(make_tensor({1, 2, 3, 4, 6, 8}, {2, 3}, kF64), {1}), {1, 4}, 1e-15);
  // One element with correction 1: 0/0 = NaN like PyTorch.
  V one = var(make_tensor({3}, {1}, kF64)).to_vector<double>();
  EXPECT_TRUE(std::isnan(one[0]));
  // logsumexp is stable for large inputs.
  expect_values(logsumexp(make_tensor({1000, 1000}, {2}, kF64), {0}), {1000 + std::log(2.0)}, 1e-15);
  expect_values(logsumexp(make_tensor({-1000, -1000}, {2}, kF64), {0}), {-1000 + std::log(2.0)}, 1e-15);
  expect_values(mean(make_tensor({1, 2, 3, 4, 5, 6}, {2, 3}), {0}), {2.5, 3.5, 4.5});
  expect_values(sum(make_tensor({1, 2, 3, 4, 5, 6}, {2, 3}), {-1}, true), {6, 15});
}

TEST(Surface, ReductionsOverZeroSizeDims) {
  Tensor z = zeros({0, 3});
  expect_shape(sum(z, {0}), {3}, kF32);
  expect_values(sum(z, {0}), {0, 0, 0});
  expect_shape(sum(z, {1}), {0}, kF32);
  V m = mean(z, {0}).to_vector<double>();  // 0 / 0
  ASSERT_EQ(m.size(), 3u);
  EXPECT_TRUE(std::isnan(m[0]));
  expect_shape(amax(z, {1}), {0}, kF32);
  expect_shape(logsumexp(z, {1}), {0}, kF32);
  expect_values(logsumexp(z, {0}), {-INFINITY, -INFINITY, -INFINITY});
  EXPECT_TRUE(matches_reference({sum(z, {0}), sum(z, {1}), mean(z, {1})}));
}

// ------------------------------------------------------------------ views

TEST(Surface, NarrowSqueezeUnsqueezeFlatten) {
  Tensor x = make_tensor({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4});
  Tensor n = narrow(x, 1, 1, 2);
  expect_shape(n, {3, 2}, kF32);
  expect_values(n, {1, 2, 5, 6, 9, 10});
  expect_values(narrow(x, -2, 2, 1), {8, 9, 10, 11});
  expect_shape(narrow(x, 0, 3, 0), {0, 4}, kF32);
  expect_values(narrow(x, 0, -2, 1), {4, 5, 6, 7});  // negative start counts from the end
  Tensor s = zeros({1, 3, 1, 2});
  expect_shape(squeeze(s), {3, 2}, kF32);
  expect_shape(squeeze(s, 2), {1, 3, 2}, kF32);
  expect_shape(squeeze(s, -4), {3, 1, 2}, kF32);
  expect_shape(squeeze(s, 1), {1, 3, 1, 2}, kF32);  // a non-1 extent: a no-op, like PyTorch
  expect_shape(squeeze(zeros({1})), {}, kF32);
  expect_shape(unsqueeze(x, 0), {1, 3, 4}, kF32);
  expect_shape(unsqueeze(x, 2), {3, 4, 1}, kF32);
  expect_shape(unsqueeze(x, -1), {3, 4, 1}, kF32);
  expect_shape(unsqueeze(x, -3), {1, 3, 4}, kF32);
  expect_shape(flatten(zeros({2, 3, 4, 5})), {120}, kF32);
  expect_shape(flatten(zeros({2, 3, 4, 5}), 1), {2, 60}, kF32);
  expect_shape(flatten(zeros({2, 3, 4, 5}), 1, 2), {2, 12, 5}, kF32);
  expect_shape(flatten(zeros({2, 3, 4, 5}), -2, -1), {2, 3, 20}, kF32);
  expect_shape(flatten(scalar_tensor(2)), {1}, kF32);
  Tensor nc = NC(3, 4, 13);
  EXPECT_TRUE(matches_reference({narrow(nc, 0, 1, 2), flatten(nc), unsqueeze(nc, 1), squeeze(unsqueeze(nc, 0))}));
  expect_values(flatten(x.transpose(0, 1)), {0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
}

TEST(Surface, SplitChunkSizes) {
  Tensor x = make_tensor({0, 1, 2, 3, 4, 5, 6}, {7});
  auto s = split(x, 3);
  ASSERT_EQ(s.size(), 3u);
  expect_values(s[0], {0, 1, 2});
  expect_values(s[1], {3, 4, 5});
  expect_values(s[2], {6});
  EXPECT_EQ(split(x, 7).size(), 1u);
  EXPECT_EQ(split(x, 10).size(), 1u);
  EXPECT_EQ(split(x, 1).size(), 7u);
  auto c = chunk(x, 3);  // ceil(7/3) = 3 per chunk: 3, 3, 1
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[2].shape(), (Shape{1}));
  // torch.chunk(arange(6), 4) gives three chunks of 2.
  auto c6 = chunk(make_tensor({0, 1, 2, 3, 4, 5}, {6}), 4);
  ASSERT_EQ(c6.size(), 3u);
  for (auto& t : c6) EXPECT_EQ(t.shape(), (Shape{2}));
  auto c5 = chunk(make_tensor({0, 1, 2, 3, 4}, {5}), 4);  // 2, 2, 1
  ASSERT_EQ(c5.size(), 3u);
  expect_values(c5[2], {4});
  // Along a later dim, of a non-contiguous tensor.
  Tensor m = NC(3, 5, 14);
  auto ms = split(m, 2, 1);
  ASSERT_EQ(ms.size(), 3u);
  EXPECT_EQ(ms[2].shape(), (Shape{3, 1}));
  EXPECT_TRUE(matches_reference(ms));
  auto mc = chunk(m, 2, -1);
  ASSERT_EQ(mc.size(), 2u);
  EXPECT_EQ(mc[0].shape(), (Shape{3, 3}));
  EXPECT_EQ(mc[1].shape(), (Shape{3, 2}));
  EXPECT_TRUE(matches_reference(mc));
}

TEST(Surface, StackRepeat) {
  Tensor a = make_tensor({1, 2, 3}, {3}), b = make_tensor({4, 5, 6}, {3});
  Tensor s0 = stack({a, b}), s1 = stack({a, b}, 1), sn = stack({a, b}, -1);
  expect_shape(s0, {2, 3}, kF32);
  expect_values(s0, {1, 2, 3, 4, 5, 6});
  expect_shape(s1, {3, 2}, kF32);
  expect_values(s1, {1, 4, 2, 5, 3, 6});
  expect_values(sn, {1, 4, 2, 5, 3, 6});
  expect_shape(stack({a}), {1, 3}, kF32);
  EXPECT_TRUE(matches_reference({stack({NC(2, 3, 15), F({2, 3}, 16), F({2, 3}, 17)}, 2)}));
  // Mixed dtypes promote like cat.
  expect_shape(stack({a, make_tensor({1, 2, 3}, {3}, kF64)}), {2, 3}, kF64);

  Tensor r = repeat(make_tensor({1, 2, 3, 4}, {2, 2}), {2, 3});
  expect_shape(r, {4, 6}, kF32);
  expect_values(r, {1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4, 1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4});
  // More repeats than dims prepend dims (torch.Tensor.repeat).
  Tensor r3 = repeat(make_tensor({1, 2}, {2}), {2, 1, 2});
  expect_shape(r3, {2, 1, 4}, kF32);
  expect_values(r3, {1, 2, 1, 2, 1, 2, 1, 2});
  expect_shape(repeat(a, {0}), {0}, kF32);
  EXPECT_TRUE(matches_reference({repeat(NC(2, 3, 18), {2, 2}), repeat(random_int({3}, 0, 9), {2})}));
}

// ------------------------------------------------------------------ selection and indexing

TEST(Surface, MaskedFillTrilTriu) {
  Tensor x = make_tensor({1, 2, 3, 4, 5, 6}, {2, 3});
  expect_values(masked_fill(x, B({1, 0, 1}, {3}), -7), {-7, 2, -7, -7, 5, -7});
  expect_values(masked_fill(x, B({0, 1}, {2, 1}), 0.5), {1, 2, 3, 0.5, 0.5, 0.5});
  V inf = masked_fill(x, B({1, 0, 0}, {3}), -INFINITY).to_vector<double>();
  EXPECT_EQ(inf[0], -INFINITY);
  expect_shape(masked_fill(make_tensor({1, 2}, {2}, kI64), B({1, 0}, {2}), 3), {2}, kI64);
  EXPECT_TRUE(matches_reference({masked_fill(NC(3, 4, 19), F({4}, 20) > 0.0, 9)}));

  Tensor m = make_tensor({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {3, 4});
  expect_values(tril(m), {1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0});
  expect_values(tril(m, 1), {1, 2, 0, 0, 5, 6, 7, 0, 9, 10, 11, 12});
  expect_values(tril(m, -1), {0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0});
  expect_values(triu(m), {1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12});
  expect_values(triu(m, 1), {0, 2, 3, 4, 0, 0, 7, 8, 0, 0, 0, 12});
  expect_values(triu(m, -1), {1, 2, 3, 4, 5, 6, 7, 8, 0, 10, 11, 12});
  // Batched: the last two dims.
  Tensor bt = tril(ones({2, 2, 2}));
  expect_values(bt, {1, 0, 1, 1, 1, 0, 1, 1});
  EXPECT_TRUE(matches_reference({tril(F({2, 3, 4}, 21), 1), triu(NC(4, 3, 22)), triu(random_int({3, 3}, 0, 5))}));
}

TEST(Surface, IndexSelectEmbedding) {
  Tensor x = make_tensor({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4});
  Tensor r = index_select(x, 0, I({2, 0, 2}, {3}));
  expect_shape(r, {3, 4}, kF32);
  expect_values(r, {8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11});
  expect_values(index_select(x, 1, make_tensor({3, 1}, {2}, kI32)), {3, 1, 7, 5, 11, 9});
  expect_values(index_select(x, -1, I({0}, {1})), {0, 4, 8});
  expect_shape(index_select(x, 0, I({}, {0})), {0, 4}, kF32);
  EXPECT_TRUE(matches_reference({index_select(NC(4, 5, 23), 1, random_int({6}, 0, 4)),
                                 index_select(random_int({5, 2}, -9, 9), 0, random_int({3}, 0, 4))}));

  Tensor w = make_tensor({0, 1, 10, 11, 20, 21}, {3, 2});
  Tensor e = embedding(w, I({2, 0, 2, 1}, {2, 2}));
  expect_shape(e, {2, 2, 2}, kF32);
  expect_values(e, {20, 21, 0, 1, 20, 21, 10, 11});
  expect_shape(embedding(w, I({1}, {})), {2}, kF32);
  EXPECT_TRUE(matches_reference({embedding(F({10, 4}, 24), random_int({3, 5}, 0, 9)),
                                 embedding(D({6, 3}, 25), random_int({7}, 0, 5, kI32))}));
}

TEST(Surface, ScatterAddDynamicUpdateSlice) {
  Tensor base = zeros({3, 2});
  Tensor idx = I({0, 1, 2, 1, 0, 0}, {3, 2});
  Tensor src = make_tensor({1, 2, 3, 4, 5, 6}, {3, 2});
  // dim 0: out[idx[i][j]][j] += src[i][j]
  expect_values(scatter_add(base, 0, idx, src), {1 + 5, 6, 0, 2 + 4, 3, 0});
  // dim 1 on a [2, 3] base with a [2, 2] index.
  Tensor b1 = ones({2, 3});
  expect_values(scatter_add(b1, 1, I({2, 2, 0, 1}, {2, 2}), make_tensor({1, 2, 3, 4}, {2, 2})), {1, 1, 4, 4, 5, 1});
  EXPECT_TRUE(matches_reference({scatter_add(F({4, 5}, 26), 1, random_int({4, 3}, 0, 4), F({4, 3}, 27)),
                                 scatter_add(D({3, 3}, 28), 0, random_int({5, 3}, 0, 2), D({5, 3}, 29))}));

  Tensor a = make_tensor({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4});
  Tensor u = make_tensor({-1, -2, -3, -4}, {2, 2});
  expect_values(dynamic_update_slice(a, u, I({1, 1}, {2})), {0, 1, 2, 3, 4, -1, -2, 7, 8, -3, -4, 11});
  // Offsets are clamped so the update fits: [5, -3] -> [1, 0].
  expect_values(dynamic_update_slice(a, u, I({5, -3}, {2})), {0, 1, 2, 3, -1, -2, 6, 7, -3, -4, 10, 11});
  expect_shape(dynamic_update_slice(a, u, I({0, 0}, {2})), {3, 4}, kF32);
  EXPECT_TRUE(matches_reference({dynamic_update_slice(F({5, 6}, 30), F({2, 3}, 31), I({2, 4}, {2})),
                                 dynamic_update_slice(NC(4, 4, 32), F({4, 1}, 33), I({0, 3}, {2}))}));
}

// ------------------------------------------------------------------ composites

TEST(Surface, SoftmaxLogSoftmax) {
  Tensor x = F({3, 5}, 34, -3, 3);
  EXPECT_TRUE(matches_reference({softmax(x, 1), softmax(x, 0), softmax(NC(4, 3, 35), -1), log_softmax(x, -1),
                                 log_softmax(x, 0), softmax(D({2, 3, 4}, 36), 1)}));
  // Stable for large inputs; rows sum to 1.
  Tensor big = make_tensor({1000, 1001, 1002, -1000, -1001, -1002}, {2, 3}, kF64);
  double e0 = 1 / (1 + std::exp(1.0) + std::exp(2.0));
  expect_values(softmax(big, 1), {e0, e0 * std::exp(1.0), e0 * std::exp(2.0), e0 * std::exp(2.0), e0 * std::exp(1.0), e0},
                1e-15);
  expect_values(log_softmax(big, 1), {std::log(e0), std::log(e0) + 1, std::log(e0) + 2, std::log(e0) + 2,
                                      std::log(e0) + 1, std::log(e0)},
                1e-14);
  expect_values(sum(softmax(F({4, 7}, 37, -5, 5), -1), {-1}), V(4, 1), 1e-6);
  // A row that is entirely -inf except one entry.
  expect_values(softmax(make_tensor({-INFINITY, 0, -INFINITY}, {3}), 0), {0, 1, 0});
  expect_shape(softmax(zeros({0, 4}), 1), {0, 4}, kF32);
  expect_shape(softmax(make_tensor({1, 2}, {2}, kI64).to(kF32), 0), {2}, kF32);
}

TEST(Surface, LayerNorm) {
  Tensor x = F({4, 6}, 38, -2, 2);
  Tensor w = F({6}, 39), b = F({6}, 40);
  EXPECT_TRUE(matches_reference({layer_norm(x, {6}), layer_norm(x, {6}, w, b), layer_norm(F({2, 3, 4}, 41), {3, 4}),
                                 layer_norm(NC(3, 5, 42), {5}, F({5}, 43)), layer_norm(D({2, 5}, 44), {5}, Tensor(), D({5}, 45))}));
  // By hand: [1, 2, 3] has mean 2 and biased variance 2/3.
  double sd = std::sqrt(2.0 / 3 + 1e-5);
  expect_values(layer_norm(make_tensor({1, 2, 3}, {1, 3}, kF64), {3}), {-1 / sd, 0, 1 / sd}, 1e-15);
  expect_values(layer_norm(make_tensor({1, 2, 3}, {3}, kF64), {3}, make_tensor({2, 2, 2}, {3}, kF64),
                           make_tensor({1, 0, -1}, {3}, kF64), 0),
                {1 - 2 * std::sqrt(1.5), 0, -1 + 2 * std::sqrt(1.5)}, 1e-14);
  expect_shape(layer_norm(x, {6}), {4, 6}, kF32);
}

TEST(Surface, CrossEntropy) {
  Tensor logits = F({5, 4}, 46, -3, 3);
  Tensor tgt = random_int({5}, 0, 3);
  Tensor ce = cross_entropy(logits, tgt);
  expect_shape(ce, {}, kF32);
  EXPECT_TRUE(matches_reference({ce, cross_entropy(D({3, 7}, 47), random_int({3}, 0, 6, kI32))}));
  // By hand: uniform logits give log(C); a confident correct row gives ~0.
  expect_values(cross_entropy(zeros({2, 4}, opts(kF64)), I({1, 3}, {2})), {std::log(4.0)}, 1e-15);
  Tensor l = make_tensor({1, 2, 3, 0, 0, 5}, {2, 3}, kF64);
  double r0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 1;
  double r1 = std::log(2 + std::exp(5.0)) - 5;
  expect_values(cross_entropy(l, I({0, 2}, {2})), {(r0 + r1) / 2}, 1e-15);
  // Large logits stay finite.
  expect_values(cross_entropy(make_tensor({1000, 0}, {1, 2}, kF64), I({0}, {1})), {0}, 1e-15);
}

TEST(Surface, ToDtype) {
  Tensor x = make_tensor({-1.7, 0.5, 2.9}, {3});
  expect_shape(x.to(kI32), {3}, kI32);
  expect_values(x.to(kI32), {-1, 0, 2});  // truncation toward zero
  expect_values(x.to(kBool), {1, 1, 1});
  expect_shape(x.to(kF64), {3}, kF64);
  EXPECT_TRUE(matches_reference({x.to(kI64), x.to(kF64), NC(2, 3, 48).to(kF64), make_tensor({0, 3}, {2}, kI32).to(kBool)}));
}

// ------------------------------------------------------------------ bad input, per family

TEST(Surface, ErrorsFactories) {
  expect_error([] { linspace(0, 1, -1); }, "[linspace]");
  expect_error([] { eye(-1); }, "[eye]");
  expect_error([] { randint(3, 3, {2}); }, "[randint]");
  expect_error([] { randint(5, 1, {2}); }, "[randint]");
}

TEST(Surface, ErrorsElementwise) {
  Tensor a = zeros({2, 3}), b = zeros({4});
  expect_error([&] { pow(a, b); }, "[pow]", {"[2, 3]", "[4]"});
  expect_error([&] { logical_and(a, b); }, "[logical_and]", {"[2, 3]", "[4]"});
  expect_error([&] { logical_or(a, b); }, "[logical_or]", {"[2, 3]", "[4]"});
  expect_error([&] { logical_xor(a, b); }, "[logical_xor]", {"[2, 3]", "[4]"});
  expect_error([&] { clamp(a, std::nullopt, std::nullopt); }, "[clamp]");
  expect_error([] { sqrt(Tensor()); }, "[sqrt]");
  expect_error([] { gelu(Tensor()); }, "[gelu]");
  expect_error([&] { where(zeros({2, 3}, opts(kBool)), a, b); }, "[where]", {"[2, 3]", "[4]"});
}

TEST(Surface, ErrorsReductions) {
  Tensor x = zeros({2, 3});
  expect_error([&] { sum(x, {2}); }, "[sum]", {"[2, 3]"});
  expect_error([&] { mean(x, {-3}); }, "[mean]", {"[2, 3]"});
  expect_error([&] { amax(x, {5}); }, "[amax]", {"[2, 3]"});
  expect_error([&] { amin(x, {0, 0}); }, "[amin]", {"[2, 3]"});
  expect_error([&] { argmax(x, 2); }, "[argmax]", {"[2, 3]"});
  expect_error([&] { argmin(x, -3); }, "[argmin]", {"[2, 3]"});
  expect_error([&] { var(x, {3}); }, "[var]", {"[2, 3]"});
  expect_error([&] { std(x, {3}); }, "[std]", {"[2, 3]"});
  expect_error([&] { logsumexp(x, {2}); }, "[logsumexp]", {"[2, 3]"});
  expect_error([] { amax(zeros({0, 3}), {0}); }, "[amax]", {"[0, 3]"});
  expect_error([] { argmax(zeros({0})); }, "[argmax]", {"[0]"});
}

TEST(Surface, ErrorsViews) {
  Tensor x = zeros({2, 3});
  expect_error([&] { narrow(x, 1, 2, 2); }, "[narrow]", {"[2, 3]"});
  expect_error([&] { narrow(x, 2, 0, 1); }, "[narrow]", {"[2, 3]"});
  expect_error([&] { narrow(x, 0, 0, -1); }, "[narrow]", {"[2, 3]"});
  expect_error([&] { squeeze(x, 2); }, "[squeeze]", {"[2, 3]"});
  expect_error([&] { unsqueeze(x, 3); }, "[unsqueeze]", {"[2, 3]"});
  expect_error([&] { unsqueeze(x, -4); }, "[unsqueeze]", {"[2, 3]"});
  expect_error([&] { flatten(zeros({2, 3, 4}), 2, 1); }, "[flatten]", {"[2, 3, 4]"});
  expect_error([&] { flatten(x, 0, 2); }, "[flatten]", {"[2, 3]"});
  expect_error([&] { split(x, 0, 1); }, "[split]", {"[2, 3]"});
  expect_error([&] { split(x, 1, 2); }, "[split]", {"[2, 3]"});
  expect_error([&] { chunk(x, 0); }, "[chunk]", {"[2, 3]"});
  expect_error([&] { chunk(x, 2, -3); }, "[chunk]", {"[2, 3]"});
  expect_error([&] { stack({x, zeros({3, 2})}); }, "[stack]", {"[2, 3]", "[3, 2]"});
  expect_error([&] { stack({}); }, "[stack]");
  expect_error([&] { stack({x, x}, 3); }, "[stack]", {"[2, 3]"});
  expect_error([&] { repeat(x, {2}); }, "[repeat]", {"[2, 3]"});
  expect_error([&] { repeat(x, {2, -1}); }, "[repeat]", {"[2, 3]"});
}

TEST(Surface, ErrorsIndexing) {
  Tensor x = zeros({3, 4});
  expect_error([&] { masked_fill(x, zeros({3, 4}), 1); }, "[masked_fill]", {"float32"});
  expect_error([&] { masked_fill(x, zeros({5}, opts(kBool)), 1); }, "[masked_fill]", {"[3, 4]", "[5]"});
  expect_error([] { tril(zeros({4})); }, "[tril]", {"[4]"});
  expect_error([] { triu(zeros({4})); }, "[triu]", {"[4]"});
  expect_error([&] { index_select(x, 0, I({0, 1, 2, 0}, {2, 2})); }, "[index_select]", {"[2, 2]"});
  expect_error([&] { index_select(x, 0, zeros({2})); }, "[index_select]", {"float32"});
  expect_error([&] { index_select(x, 2, I({0}, {1})); }, "[index_select]", {"[3, 4]"});
  expect_error([&] { embedding(zeros({5}), I({0}, {1})); }, "[embedding]", {"[5]"});
  expect_error([&] { embedding(x, zeros({2})); }, "[embedding]", {"float32"});
  expect_error([&] { scatter_add(x, 0, I({0, 1}, {2}), zeros({3})); }, "[scatter_add]", {"[2]", "[3, 4]"});
  expect_error([&] { scatter_add(x, 0, I({0, 1}, {1, 2}), zeros({2, 1})); }, "[scatter_add]", {"[1, 2]", "[2, 1]"});
  expect_error([&] { scatter_add(x, 2, I({0}, {1, 1}), zeros({1, 1})); }, "[scatter_add]", {"[3, 4]"});
  expect_error([&] { scatter_add(x, 0, zeros({1, 1}), zeros({1, 1})); }, "[scatter_add]", {"float32"});
  expect_error([&] { dynamic_update_slice(x, zeros({4, 1}), I({0, 0}, {2})); }, "[dynamic_update_slice]", {"[3, 4]", "[4, 1]"});
  expect_error([&] { dynamic_update_slice(x, zeros({1, 1}), I({0}, {1})); }, "[dynamic_update_slice]", {"[1]"});
  expect_error([&] { dynamic_update_slice(x, zeros({1, 1}), zeros({2})); }, "[dynamic_update_slice]", {"float32"});
  expect_error([&] { dynamic_update_slice(x, zeros({1}), I({0, 0}, {2})); }, "[dynamic_update_slice]", {"[3, 4]", "[1]"});
}

TEST(Surface, ErrorsComposites) {
  Tensor x = zeros({2, 3});
  expect_error([&] { softmax(x, 2); }, "[softmax]", {"[2, 3]"});
  expect_error([&] { softmax(x, -3); }, "[softmax]", {"[2, 3]"});
  expect_error([&] { log_softmax(x, 5); }, "[log_softmax]", {"[2, 3]"});
  expect_error([&] { layer_norm(x, {4}); }, "[layer_norm]", {"[2, 3]", "[4]"});
  expect_error([&] { layer_norm(x, {2, 3, 1}); }, "[layer_norm]", {"[2, 3]"});
  expect_error([&] { layer_norm(x, {3}, zeros({4})); }, "[layer_norm]", {"[4]"});
  expect_error([&] { layer_norm(x, {3}, Tensor(), zeros({2, 3})); }, "[layer_norm]", {"[2, 3]"});
  expect_error([&] { cross_entropy(x, zeros({2})); }, "[cross_entropy]", {"float32"});
  expect_error([&] { cross_entropy(x, I({0, 1, 2}, {3})); }, "[cross_entropy]", {"int64[3]"});
  expect_error([&] { cross_entropy(zeros({6}), I({0}, {1})); }, "[cross_entropy]", {"[6]"});
  expect_error([&] { cross_entropy(x, I({0, 1}, {2, 1})); }, "[cross_entropy]", {"[2, 1]"});
}

TEST(Surface, ErrorsNameTheScope) {
  Scope s{"blk"};
  try {
    softmax(zeros({2, 3}), 4);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(m.rfind("[softmax]", 0), 0u) << m;
    EXPECT_NE(m.find("blk"), std::string::npos) << m;
  }
}

// cumsum by hand along each dim, integers as int64, and its gradient (the reversed running sum
// of the cotangent: d/dx_i of sum_j w_j * cumsum_j = sum_{j >= i} w_j).
TEST(Surface, Cumsum) {
  Tensor x = make_tensor({1, 2, 3, 4, 5, 6}, {2, 3}, kF32);
  EXPECT_EQ(cumsum(x, 1).to_vector<float>(), (std::vector<float>{1, 3, 6, 4, 9, 15}));
  EXPECT_EQ(cumsum(x, 0).to_vector<float>(), (std::vector<float>{1, 2, 3, 5, 7, 9}));
  Tensor i = cumsum(make_tensor({1, 0, 1, 1}, {4}, kBool), -1);
  EXPECT_EQ(i.dtype(), kI64);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 2, 3}));
  Tensor w = x.detach().requires_grad_();
  (cumsum(w, 1) * make_tensor({1, 10, 100, 1, 1, 1}, {2, 3}, kF32)).sum().backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{111, 110, 100, 3, 2, 1}));
  EXPECT_THROW(cumsum(x, 2), Error);
}

// topk against a hand-sorted row; ties take the lower index first; the gradient reaches only
// the elements picked.
TEST(Surface, Topk) {
  Tensor x = make_tensor({3, 1, 4, 1, 5, 9, 2, 6}, {2, 4}, kF32);
  auto [v, i] = topk(x, 2, 1);
  EXPECT_EQ(v.to_vector<float>(), (std::vector<float>{4, 3, 9, 6}));
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{2, 0, 1, 3}));
  auto [vs, is] = topk(x, 3, 1, /*largest=*/false);
  EXPECT_EQ(vs.to_vector<float>(), (std::vector<float>{1, 1, 3, 2, 5, 6}));
  EXPECT_EQ(is.to_vector<int64_t>(), (std::vector<int64_t>{1, 3, 0, 2, 0, 3}));
  auto [vi, ii] = topk(make_tensor({5, 7, 7, 1}, {4}, kI64), 2, 0);
  EXPECT_EQ(vi.dtype(), kI64);
  EXPECT_EQ(vi.to_vector<int64_t>(), (std::vector<int64_t>{7, 7}));
  EXPECT_EQ(ii.to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));
  Tensor w = x.detach().requires_grad_();
  std::get<0>(topk(w, 2, 1)).sum().backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{1, 0, 1, 0, 0, 1, 0, 1}));
  EXPECT_THROW(topk(x, 5, 1), Error);
  EXPECT_THROW(topk(x, 1, 2), Error);
}

// multinomial: frequencies with replacement match the weights (20000 draws: 4 sigma is under
// 0.013 for p <= 0.5); without replacement a row's draws are distinct and never a zero weight.
TEST(Surface, Multinomial) {
  manual_seed(7);
  Tensor p = make_tensor({1, 2, 5, 2, 0, 0}, {2, 3}, kF32);  // rows 0.125/0.25/0.625, 1/0/0
  Tensor s = multinomial(p, 20000, /*replacement=*/true);
  ASSERT_EQ(s.shape(), (Shape{2, 20000}));
  EXPECT_EQ(s.dtype(), kI64);
  std::vector<int64_t> v = s.to_vector<int64_t>();
  int64_t count[2][3] = {};
  for (size_t k = 0; k < v.size(); ++k) count[k / 20000][v[k]] += 1;
  EXPECT_NEAR(count[0][0] / 20000.0, 0.125, 0.013);
  EXPECT_NEAR(count[0][1] / 20000.0, 0.25, 0.013);
  EXPECT_NEAR(count[0][2] / 20000.0, 0.625, 0.013);
  EXPECT_EQ(count[1][0], 20000);
  Tensor q = make_tensor({0.1, 0, 0.5, 0.2, 0.2}, {5}, kF32);
  for (int r = 0; r < 20; ++r) {
    std::vector<int64_t> d = multinomial(q, 4).to_vector<int64_t>();
    std::set<int64_t> seen(d.begin(), d.end());
    EXPECT_EQ(seen.size(), 4u);
    EXPECT_EQ(seen.count(1), 0u);
  }
  EXPECT_THROW(multinomial(q, 6), Error);
  EXPECT_THROW(multinomial(make_tensor({1, 2}, {2}, kI64), 1), Error);
}

// clone is a new tensor with the same history; set_grad_enabled switches recording.
TEST(Surface, CloneAndGradMode) {
  Tensor x = make_tensor({1, 2}, {2}, kF32).requires_grad_();
  Tensor c = x.clone();
  EXPECT_FALSE(c.is_same(x));
  (c * 3.0).sum().backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{3, 3}));
  Tensor y = x * 2.0, z = y.clone();
  z.add_(1.0);
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{2, 4}));
  set_grad_enabled(false);
  EXPECT_FALSE((x * 2.0).requires_grad());
  set_grad_enabled(true);
  EXPECT_TRUE((x * 2.0).requires_grad());
}

}  // namespace
}  // namespace tessera
