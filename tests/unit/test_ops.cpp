// Every public op of tessera/tensor.h on the CPU backend, checked against the float64 reference
// (backend correctness) and, where the frontend decides semantics (broadcasting, promotion,
// slicing, reductions), against values and shapes derived on the host (frontend correctness).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <sstream>

#include "test_util.h"
#include "tessera/tessera.h"

namespace tessera {
namespace {

using testing::make_tensor;
using testing::matches_reference;
using testing::random_int;
using testing::random_positive;
using testing::random_tensor;
using testing::random_values;
using testing::tolerance;
using V = std::vector<double>;
const double kNaN = std::numeric_limits<double>::quiet_NaN();

constexpr DType kF32 = DType::Float32, kF64 = DType::Float64, kF16 = DType::Float16, kBF16 = DType::BFloat16,
                kI32 = DType::Int32, kI64 = DType::Int64, kBool = DType::Bool;

TensorOptions opts(DType t) {
  TensorOptions o;
  o.dtype = t;
  return o;
}

// NumPy broadcasting on the host: out[i] = f(a[ia], b[ib]).
V host_broadcast(const V& a, const Shape& sa, const V& b, const Shape& sb, Shape& out,
                 const std::function<double(double, double)>& f) {
  size_t r = std::max(sa.size(), sb.size());
  out.assign(r, 1);
  Shape pa(r, 1), pb(r, 1);
  for (size_t i = 0; i < sa.size(); ++i) pa[r - sa.size() + i] = sa[i];
  for (size_t i = 0; i < sb.size(); ++i) pb[r - sb.size() + i] = sb[i];
  for (size_t d = 0; d < r; ++d) out[d] = pa[d] == 1 ? pb[d] : pa[d];
  V res(size_t(numel(out)));
  std::vector<int64_t> idx(r);
  for (int64_t i = 0; i < numel(out); ++i) {
    int64_t rem = i;
    for (size_t d = r; d-- > 0;) idx[d] = rem % out[d], rem /= out[d];
    int64_t ia = 0, ib = 0;
    for (size_t d = 0; d < r; ++d) {
      ia = ia * pa[d] + (pa[d] == 1 ? 0 : idx[d]);
      ib = ib * pb[d] + (pb[d] == 1 ? 0 : idx[d]);
    }
    res[size_t(i)] = f(a[size_t(ia)], b[size_t(ib)]);
  }
  return res;
}

void expect_values(const Tensor& t, const V& want, double tol = 0) {
  V got = t.to_vector<double>();
  EXPECT_TRUE(testing::all_close(got, want, tol));
}

// ---------------------------------------------------------------- factories

TEST(Ops, FactoriesFillValues) {
  Tensor z = zeros({2, 3});
  Tensor o = ones({4}, opts(kI32));
  Tensor f = full({2, 2}, 2.5, opts(kF64));
  EXPECT_EQ(z.dtype(), kF32);
  EXPECT_EQ(z.shape(), (Shape{2, 3}));
  EXPECT_EQ(o.dtype(), kI32);
  EXPECT_EQ(f.dtype(), kF64);
  EXPECT_TRUE(matches_reference({z, o, f}));
  expect_values(z, V(6, 0));
  expect_values(o, V(4, 1));
  expect_values(f, V(4, 2.5));
  Tensor x = random_tensor({3, 2}, kF64);
  Tensor zl = zeros_like(x), ol = ones_like(x), fl = full_like(x, -1.5);
  EXPECT_EQ(zl.dtype(), kF64);
  EXPECT_EQ(fl.shape(), (Shape{3, 2}));
  expect_values(zl, V(6, 0));
  expect_values(ol, V(6, 1));
  expect_values(fl, V(6, -1.5));
  Tensor s = scalar_tensor(3.25);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.item(), 3.25);
  Tensor e = zeros({0, 3});
  EXPECT_EQ(e.numel(), 0);
  EXPECT_TRUE(e.to_vector<double>().empty());
}

TEST(Ops, Arange) {
  Tensor a = arange(5);
  EXPECT_EQ(a.dtype(), kI64);
  expect_values(a, {0, 1, 2, 3, 4});
  Tensor b = arange(2, 7, 2);
  EXPECT_EQ(b.dtype(), kI64);
  expect_values(b, {2, 4, 6});
  Tensor c = arange(0, 1, 0.25);
  EXPECT_EQ(c.dtype(), kF32);
  expect_values(c, {0, 0.25, 0.5, 0.75});
  Tensor d = arange(4, opts(kF64));
  EXPECT_EQ(d.dtype(), kF64);
  expect_values(d, {0, 1, 2, 3});
  EXPECT_EQ(arange(0).numel(), 0);
  EXPECT_TRUE(matches_reference({arange(6) * 2, arange(1, 2, 0.5)}));
}

TEST(Ops, FromVectorRoundTripsEveryDtype) {
  V v = {0, 1, -2, 3, 1.5, -0.25};
  for (DType t : {kF32, kF64, kF16, kBF16}) {
    Tensor x = make_tensor(v, {2, 3}, t);
    EXPECT_TRUE(x.is_realized());
    EXPECT_EQ(x.dtype(), t);
    expect_values(x, v);
  }
  V iv = {0, 1, -2, 3, 7, -100000};
  for (DType t : {kI32, kI64}) expect_values(make_tensor(iv, {6}, t), iv);
  expect_values(make_tensor({1, 0, 1}, {3}, kBool), {1, 0, 1});
  Tensor i32 = from_vector<int32_t>({1, 2, 3}, {3}, opts(kI32));
  EXPECT_EQ(i32.to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 3}));
  Tensor f32 = from_vector<float>({0.5f, -1.f}, {2});
  EXPECT_EQ(f32.to_vector<float>(), (std::vector<float>{0.5f, -1.f}));
  Tensor i64 = from_vector<int64_t>({int64_t(1) << 40}, {1}, opts(kI64));
  EXPECT_EQ(i64.to_vector<int64_t>().at(0), int64_t(1) << 40);
}

TEST(Ops, RandMatchesReferenceAndSeed) {
  manual_seed(42);
  Tensor u = rand({64, 16});
  Tensor n = randn({64, 16}, opts(kF64));
  EXPECT_EQ(u.dtype(), kF32);
  EXPECT_EQ(n.dtype(), kF64);
  EXPECT_TRUE(matches_reference({u, n}));
  V uv = u.to_vector<double>(), nv = n.to_vector<double>();
  double mean = 0, var = 0;
  for (double x : uv) {
    EXPECT_GE(x, 0.0);
    EXPECT_LT(x, 1.0);
  }
  for (double x : nv) mean += x;
  mean /= double(nv.size());
  for (double x : nv) var += (x - mean) * (x - mean);
  var /= double(nv.size());
  EXPECT_NEAR(mean, 0, 0.1);
  EXPECT_NEAR(var, 1, 0.15);
  // Same seed, same numbers; the next draw differs.
  manual_seed(42);
  Tensor u2 = rand({64, 16});
  Tensor u3 = rand({64, 16});
  EXPECT_TRUE(matches_reference({u2, u3}));
  EXPECT_EQ(u2.to_vector<double>(), uv);
  EXPECT_NE(u3.to_vector<double>(), uv);
  manual_seed(42);
  Tensor u4 = rand({64, 16});
  EXPECT_EQ(u4.to_vector<double>(), uv);
  Tensor u5 = rand({64, 16});  // a separate graph: the offset advanced
  EXPECT_NE(u5.to_vector<double>(), uv);
}

// ---------------------------------------------------------------- elementwise binary

struct BinCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  std::function<double(double, double)> host;
};

std::vector<BinCase> arithmetic_cases() {
  return {
      {"add", [](auto& a, auto& b) { return add(a, b); }, [](double x, double y) { return x + y; }},
      {"sub", [](auto& a, auto& b) { return sub(a, b); }, [](double x, double y) { return x - y; }},
      {"mul", [](auto& a, auto& b) { return mul(a, b); }, [](double x, double y) { return x * y; }},
      {"div", [](auto& a, auto& b) { return div(a, b); }, [](double x, double y) { return x / y; }},
      {"maximum", [](auto& a, auto& b) { return maximum(a, b); }, [](double x, double y) { return std::max(x, y); }},
      {"minimum", [](auto& a, auto& b) { return minimum(a, b); }, [](double x, double y) { return std::min(x, y); }},
      {"operator+", [](auto& a, auto& b) { return a + b; }, [](double x, double y) { return x + y; }},
      {"operator-", [](auto& a, auto& b) { return a - b; }, [](double x, double y) { return x - y; }},
      {"operator*", [](auto& a, auto& b) { return a * b; }, [](double x, double y) { return x * y; }},
      {"operator/", [](auto& a, auto& b) { return a / b; }, [](double x, double y) { return x / y; }},
  };
}

const std::vector<std::pair<Shape, Shape>> kBroadcastShapes = {
    {{3, 4}, {3, 4}}, {{3, 4}, {4}},       {{3, 1}, {1, 4}},     {{}, {2, 3}},
    {{2, 3}, {}},     {{2, 1, 4}, {3, 1}}, {{0, 3}, {1, 3}},     {{5, 1, 1}, {1, 1, 7}},
};

TEST(Ops, BinaryArithmeticBroadcasting) {
  for (DType t : {kF32, kF64}) {
    uint32_t seed = 1;
    for (auto& [sa, sb] : kBroadcastShapes) {
      V av = random_values(numel(sa), t, seed++, -2, 2);
      V bv = random_values(numel(sb), t, seed++, 0.5, 2);  // positive: safe to divide by
      Tensor a = make_tensor(av, sa, t), b = make_tensor(bv, sb, t);
      for (const BinCase& c : arithmetic_cases()) {
        SCOPED_TRACE(std::string(c.name) + " " + dtype_name(t) + " " + shape_str(sa) + " " + shape_str(sb));
        Tensor r = c.op(a, b);
        Shape want_shape;
        V want = host_broadcast(av, sa, bv, sb, want_shape, c.host);
        EXPECT_EQ(r.shape(), want_shape);
        EXPECT_EQ(r.dtype(), t);
        EXPECT_TRUE(matches_reference(r));
        expect_values(r, want, tolerance(t));
      }
    }
  }
}

TEST(Ops, BinaryIntegerExact) {
  for (DType t : {kI32, kI64}) {
    V av = random_values(12, t, 3, -50, 50), bv = random_values(4, t, 4, -50, 50);
    Tensor a = make_tensor(av, {3, 4}, t), b = make_tensor(bv, {4}, t);
    Shape s;
    for (auto& c : arithmetic_cases()) {
      if (std::string(c.name).find("div") != std::string::npos || std::string(c.name) == "operator/") continue;
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(t));
      Tensor r = c.op(a, b);
      EXPECT_EQ(r.dtype(), t);
      EXPECT_TRUE(matches_reference(r, 0));
      expect_values(r, host_broadcast(av, {3, 4}, bv, {4}, s, c.host));
    }
  }
}

TEST(Ops, TrueDivisionOfIntegersIsFloat32) {
  Tensor a = make_tensor({7, -7, 1, 0}, {4}, kI32);
  Tensor b = make_tensor({2, 2, 3, 5}, {4}, kI64);
  Tensor q = a / b;
  EXPECT_EQ(q.dtype(), kF32);
  EXPECT_TRUE(matches_reference(q));
  expect_values(q, {3.5, -3.5, double(1.0f / 3.0f), 0}, 1e-7);
  Tensor h = a / 2;
  EXPECT_EQ(h.dtype(), kF32);
  expect_values(h, {3.5, -3.5, 0.5, 0});
  Tensor r = 1 / make_tensor({2, 4}, {2}, kI64);
  EXPECT_EQ(r.dtype(), kF32);
  expect_values(r, {0.5, 0.25});
}

TEST(Ops, MaximumMinimumPropagateNaN) {
  Tensor a = make_tensor({1, kNaN, 3, kNaN}, {4});
  Tensor b = make_tensor({2, 0, kNaN, kNaN}, {4});
  Tensor mx = maximum(a, b), mn = minimum(a, b);
  EXPECT_TRUE(matches_reference({mx, mn}));
  V x = mx.to_vector<double>(), n = mn.to_vector<double>();
  EXPECT_EQ(x[0], 2);
  EXPECT_EQ(n[0], 1);
  for (int i = 1; i < 4; ++i) {
    EXPECT_TRUE(std::isnan(x[i])) << i;
    EXPECT_TRUE(std::isnan(n[i])) << i;
  }
}

TEST(Ops, Comparisons) {
  using Cmp = std::function<Tensor(const Tensor&, const Tensor&)>;
  std::vector<std::pair<Cmp, std::function<bool(double, double)>>> cases = {
      {[](auto& a, auto& b) { return eq(a, b); }, [](double x, double y) { return x == y; }},
      {[](auto& a, auto& b) { return ne(a, b); }, [](double x, double y) { return x != y; }},
      {[](auto& a, auto& b) { return lt(a, b); }, [](double x, double y) { return x < y; }},
      {[](auto& a, auto& b) { return le(a, b); }, [](double x, double y) { return x <= y; }},
      {[](auto& a, auto& b) { return gt(a, b); }, [](double x, double y) { return x > y; }},
      {[](auto& a, auto& b) { return ge(a, b); }, [](double x, double y) { return x >= y; }},
      {[](auto& a, auto& b) { return a == b; }, [](double x, double y) { return x == y; }},
      {[](auto& a, auto& b) { return a != b; }, [](double x, double y) { return x != y; }},
      {[](auto& a, auto& b) { return a < b; }, [](double x, double y) { return x < y; }},
      {[](auto& a, auto& b) { return a <= b; }, [](double x, double y) { return x <= y; }},
      {[](auto& a, auto& b) { return a > b; }, [](double x, double y) { return x > y; }},
      {[](auto& a, auto& b) { return a >= b; }, [](double x, double y) { return x >= y; }},
  };
  // Small integers so that ties occur; mixed dtypes promote before comparing.
  std::vector<std::pair<DType, DType>> dts = {{kI32, kI32}, {kF32, kF32}, {kI64, kF32}, {kF64, kI32}, {kBool, kBool}};
  uint32_t seed = 10;
  for (auto [ta, tb] : dts) {
    V av = random_values(12, ta == kBool ? kBool : kI32, seed++, -2, 2);
    V bv = random_values(4, tb == kBool ? kBool : kI32, seed++, -2, 2);
    Tensor a = make_tensor(av, {3, 4}, ta), b = make_tensor(bv, {4}, tb);
    int k = 0;
    for (auto& [op, host_op] : cases) {
      auto& host = host_op;  // a lambda cannot capture a structured binding in clang 14
      SCOPED_TRACE(std::string("comparison ") + std::to_string(k++) + " " + dtype_name(ta) + "/" + dtype_name(tb));
      Tensor r = op(a, b);
      EXPECT_EQ(r.dtype(), kBool);
      EXPECT_TRUE(matches_reference(r, 0));
      Shape s;
      expect_values(r, host_broadcast(av, {3, 4}, bv, {4}, s, [&](double x, double y) { return host(x, y) ? 1.0 : 0.0; }));
    }
  }
  // With C++ scalars (weak: an int tensor compared with 0.5 compares as float).
  Tensor xi = make_tensor({0, 1, 2}, {3}, kI32);
  Tensor lt_s = xi < 0.5, gt_s = xi > 1.0;
  EXPECT_EQ(lt_s.dtype(), kBool);
  expect_values(lt_s, {1, 0, 0});
  expect_values(gt_s, {0, 0, 1});
}

TEST(Ops, ScalarsAreWeaklyTyped) {
  Tensor i32 = make_tensor({1, 2, -3}, {3}, kI32);
  Tensor i64 = make_tensor({1, 2, -3}, {3}, kI64);
  Tensor f16 = make_tensor({1, 2, -3}, {3}, kF16);
  Tensor bf16 = make_tensor({1, 2, -3}, {3}, kBF16);
  Tensor f64 = make_tensor({1, 2, -3}, {3}, kF64);
  Tensor b = make_tensor({1, 0, 1}, {3}, kBool);
  struct Case { Tensor t; DType want; V values; };
  std::vector<Case> cases = {
      {i32 * 0.5, kF32, {0.5, 1, -1.5}},
      {i32 + 2, kI32, {3, 4, -1}},
      {i64 * 2, kI64, {2, 4, -6}},
      {2 - i32, kI32, {1, 0, 5}},
      {f16 * 2, kF16, {2, 4, -6}},
      {f16 + 0.5, kF16, {1.5, 2.5, -2.5}},
      {bf16 - 1, kBF16, {0, 1, -4}},
      {f64 * 0.1, kF64, {0.1, 0.2, -0.30000000000000004}},
      {0.5 * f64, kF64, {0.5, 1, -1.5}},
      {b + 1, kI64, {2, 1, 2}},
      {b * 1.5, kF32, {1.5, 0, 1.5}},
      {-f16, kF16, {-1, -2, 3}},
      {-i32, kI32, {-1, -2, 3}},
      {i64 - 0.5, kF32, {0.5, 1.5, -3.5}},
      {3 / f64, kF64, {3, 1.5, -1}},
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    SCOPED_TRACE("case " + std::to_string(k));
    EXPECT_EQ(cases[k].t.dtype(), cases[k].want) << dtype_name(cases[k].t.dtype());
    EXPECT_TRUE(matches_reference(cases[k].t));
    expect_values(cases[k].t, cases[k].values, 1e-15);
  }
}

TEST(Ops, TensorPromotion) {
  struct Case { DType a, b, want; };
  std::vector<Case> cases = {
      {kI32, kF32, kF32}, {kI32, kI64, kI64}, {kF16, kBF16, kF32}, {kBool, kI32, kI32},
      {kF16, kF32, kF32}, {kI64, kF16, kF16}, {kF32, kF64, kF64}, {kBool, kF16, kF16},
      {kBF16, kBF16, kBF16}, {kBool, kF64, kF64},
  };
  for (auto c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.a)) + " + " + dtype_name(c.b));
    V av = random_values(6, c.a == kBool ? kBool : kI32, 1, -4, 4);
    V bv = random_values(3, c.b == kBool ? kBool : kI32, 2, -4, 4);
    Tensor a = make_tensor(av, {2, 3}, c.a), b = make_tensor(bv, {3}, c.b);
    Tensor r = a + b, m = b * a;
    EXPECT_EQ(r.dtype(), c.want);
    EXPECT_EQ(m.dtype(), c.want);
    EXPECT_TRUE(matches_reference({r, m}));
    Shape s;
    expect_values(r, host_broadcast(av, {2, 3}, bv, {3}, s, [](double x, double y) { return x + y; }));
  }
}

TEST(Ops, HalfPrecisionElementwise) {
  for (DType t : {kF16, kBF16}) {
    SCOPED_TRACE(dtype_name(t));
    Tensor a = random_tensor({4, 33}, t, 5, -2, 2), b = random_tensor({33}, t, 6, 0.5, 2);
    Tensor p = random_positive({4, 33}, t, 7);
    std::vector<Tensor> outs = {a + b, a * b, a - b, a / b, maximum(a, b), a.exp(), p.log(), a.tanh(), -a,
                                (a * b).exp()};
    for (auto& o : outs) EXPECT_EQ(o.dtype(), t);
    EXPECT_TRUE(matches_reference(outs, t == kF16 ? 4e-3 : 3e-2));
  }
}

// ---------------------------------------------------------------- unary and casts

TEST(Ops, UnaryFloat) {
  for (DType t : {kF32, kF64}) {
    SCOPED_TRACE(dtype_name(t));
    Tensor x = random_tensor({5, 7}, t, 11, -3, 3);
    Tensor p = random_positive({5, 7}, t, 12, 0.01, 10);
    std::vector<Tensor> outs = {x.exp(), exp(x), p.log(), log(p), x.tanh(), tanh(x), -x};
    for (auto& o : outs) {
      EXPECT_EQ(o.dtype(), t);
      EXPECT_EQ(o.shape(), (Shape{5, 7}));
    }
    EXPECT_TRUE(matches_reference(outs));
  }
  // Hand values through the public API.
  Tensor v = make_tensor({0, 1, -1}, {3}, kF64);
  expect_values(v.exp(), {1, std::exp(1.0), std::exp(-1.0)}, 1e-15);
  expect_values(v.tanh(), {0, std::tanh(1.0), std::tanh(-1.0)}, 1e-15);
  expect_values(make_tensor({1, std::exp(2.0)}, {2}, kF64).log(), {0, 2}, 1e-15);
  V lg = make_tensor({0, -1}, {2}).log().to_vector<double>();
  EXPECT_EQ(lg[0], -INFINITY);
  EXPECT_TRUE(std::isnan(lg[1]));
  // Wide exp/tanh ranges saturate correctly.
  Tensor w = make_tensor({-100, -20, 20, 80}, {4});  // exp(100) overflows float32
  EXPECT_TRUE(matches_reference({w.exp(), w.tanh()}));
}

TEST(Ops, NegIntegers) {
  for (DType t : {kI32, kI64}) {
    Tensor x = random_int({3, 3}, -100, 100, t, 9);
    EXPECT_TRUE(matches_reference(-x, 0));
  }
}

TEST(Ops, CastsBetweenDtypes) {
  V v = {0, 1, -1, 2.5, -2.5, 0.7, -0.7, 100.25, -33.75, 1e-3, 65504, 3.14159265};
  std::vector<DType> all = {kBool, kI32, kI64, kF16, kBF16, kF32, kF64};
  for (DType from : all) {
    Tensor x = make_tensor(from == kBool ? V{1, 0, 1, 1, 0, 0, 1, 0, 0, 1, 1, 0} : v, {3, 4}, from);
    for (DType to : all) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + dtype_name(to));
      Tensor y = x.to(to);
      EXPECT_EQ(y.dtype(), to);
      EXPECT_EQ(y.shape(), (Shape{3, 4}));
      EXPECT_TRUE(matches_reference(y, 0));
    }
  }
  // Hand-derived: truncation toward zero, bool is != 0, float16 rounds to nearest even.
  Tensor f = make_tensor({2.7, -2.7, 0.5, -0.5, 0}, {5}, kF64);
  expect_values(f.to(kI32), {2, -2, 0, 0, 0});
  expect_values(f.to(kI64), {2, -2, 0, 0, 0});
  expect_values(f.to(kBool), {1, 1, 1, 1, 0});
  double u = std::ldexp(1.0, -11);
  expect_values(make_tensor({1 + u, 1 + 3 * u, 0.1}, {3}, kF64).to(kF16), {1, 1 + 4 * u, 0.0999755859375});
  expect_values(make_tensor({3.14159}, {1}, kF32).to(kBF16), {3.140625});
  // Casting a non-contiguous view.
  Tensor m = random_tensor({4, 6}, kF32, 3, -10, 10);
  EXPECT_TRUE(matches_reference({m.transpose(0, 1).to(kI32), m.slice(1, 1, 6, 2).to(kF16)}, 0));
}

// ---------------------------------------------------------------- reductions

// Host sum/max over `dims` (sorted, non-negative) of a row-major [shape] array; keeps dims as 1.
V host_reduce(const V& x, const Shape& s, const std::vector<int64_t>& dims, bool is_max, Shape& out) {
  out = s;
  for (int64_t d : dims) out[size_t(d)] = 1;
  V r(size_t(numel(out)), is_max ? -INFINITY : 0.0);
  std::vector<int64_t> idx(s.size());
  for (int64_t i = 0; i < numel(s); ++i) {
    int64_t rem = i;
    for (size_t d = s.size(); d-- > 0;) idx[d] = rem % s[d], rem /= s[d];
    int64_t o = 0;
    for (size_t d = 0; d < s.size(); ++d) o = o * out[d] + (out[d] == 1 ? 0 : idx[d]);
    r[size_t(o)] = is_max ? std::max(r[size_t(o)], x[size_t(i)]) : r[size_t(o)] + x[size_t(i)];
  }
  return r;
}

TEST(Ops, ReductionsOverSeveralDims) {
  Shape s{3, 4, 5};
  struct DimsCase { std::vector<int64_t> dims, sorted; };
  std::vector<DimsCase> dcs = {{{}, {0, 1, 2}}, {{0}, {0}}, {{1}, {1}}, {{-1}, {2}}, {{0, 2}, {0, 2}},
                               {{2, 0}, {0, 2}}, {{-2, -3}, {0, 1}}, {{0, 1, 2}, {0, 1, 2}}};
  for (DType t : {kF32, kF64, kI32, kI64}) {
    V xv = random_values(numel(s), t, 21, -10, 10);
    Tensor x = make_tensor(xv, s, t);
    for (auto& dc : dcs) {
      for (bool keep : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " dims " + shape_str(dc.dims) + (keep ? " keepdim" : ""));
        Tensor sm = x.sum(dc.dims, keep), mx = x.amax(dc.dims, keep);
        Shape ks;
        V want_sum = host_reduce(xv, s, dc.sorted, false, ks);
        V want_max = host_reduce(xv, s, dc.sorted, true, ks);
        Shape want_shape;
        for (size_t d = 0; d < s.size(); ++d) {
          bool red = std::find(dc.sorted.begin(), dc.sorted.end(), int64_t(d)) != dc.sorted.end();
          if (!red) want_shape.push_back(s[d]);
          else if (keep) want_shape.push_back(1);
        }
        EXPECT_EQ(sm.shape(), want_shape);
        EXPECT_EQ(mx.shape(), want_shape);
        EXPECT_EQ(mx.dtype(), t);
        EXPECT_TRUE(matches_reference({sm, mx}, is_integral(t) ? 0 : tolerance(t)));
        expect_values(sm, want_sum, is_integral(t) ? 0 : tolerance(t));
        expect_values(mx, want_max);
      }
    }
  }
}

TEST(Ops, SumOfIntegersAndBoolsIsInt64LikePyTorch) {
  Tensor i = make_tensor({1, 2, 3}, {3}, kI32);
  Tensor b = make_tensor({1, 0, 1, 1}, {4}, kBool);
  Tensor si = i.sum(), sb = b.sum();
  EXPECT_EQ(si.dtype(), kI64);
  EXPECT_EQ(sb.dtype(), kI64);
  EXPECT_EQ(si.item(), 6);
  EXPECT_EQ(sb.item(), 3);
}

TEST(Ops, LargeReductions) {
  Tensor x = random_tensor({4, 3000}, kF32, 31, -1, 1);
  Tensor s1 = x.sum({1}), sall = x.sum(), m = x.amax({1});
  EXPECT_TRUE(matches_reference({s1, sall}, tolerance(kF32, 3000)));
  EXPECT_TRUE(matches_reference(m, 0));
  // A reduction over the leading (strided) dimension.
  Tensor y = random_tensor({2000, 3}, kF32, 32, 0, 1);
  EXPECT_TRUE(matches_reference(y.sum({0}), tolerance(kF32, 2000)));
  Tensor z = random_tensor({2000, 3}, kF64, 33, -1, 1);
  EXPECT_TRUE(matches_reference({z.sum({0}), z.sum()}, 1e-12));
}

TEST(Ops, ReductionsHandDerived) {
  Tensor x = make_tensor({1, 2, 3, 4, 5, 6}, {2, 3});
  expect_values(x.sum(), {21});
  EXPECT_EQ(x.sum().dim(), 0);
  expect_values(x.sum({0}), {5, 7, 9});
  expect_values(x.sum({1}, true), {6, 15});
  EXPECT_EQ(x.sum({1}, true).shape(), (Shape{2, 1}));
  expect_values(x.amax({-1}), {3, 6});
  expect_values(x.max(), {6});
  EXPECT_EQ(x.max().item(), 6);
  // Sum over an empty dimension is zero; max over the non-empty one keeps the empty one.
  Tensor e = zeros({0, 4});
  Tensor se = e.sum({0});
  EXPECT_EQ(se.shape(), (Shape{4}));
  Tensor me = e.amax({1});
  EXPECT_EQ(me.shape(), (Shape{0}));
  EXPECT_TRUE(matches_reference({se, me, e.sum()}));
  expect_values(se, {0, 0, 0, 0});
  // NaN propagates through max.
  Tensor n = make_tensor({1, kNaN, 2, 3}, {2, 2});
  V nm = n.amax({1}).to_vector<double>();
  EXPECT_TRUE(std::isnan(nm[0]));
  EXPECT_EQ(nm[1], 3);
}

// ---------------------------------------------------------------- movement and views

TEST(Ops, ReshapePermuteTransposeExpand) {
  V xv = random_values(24, kF32, 41);
  Tensor x = make_tensor(xv, {2, 3, 4});
  Tensor r = x.reshape({4, -1});
  EXPECT_EQ(r.shape(), (Shape{4, 6}));
  expect_values(r, xv);
  Tensor p = x.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  Tensor t = x.transpose(0, -1);
  EXPECT_EQ(t.shape(), (Shape{4, 3, 2}));
  Tensor c = make_tensor({1, 2, 3}, {1, 3, 1});
  Tensor e = c.expand({2, -1, 4});
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  Tensor e2 = make_tensor({1, 2}, {2}).expand({3, 2});  // a new leading dimension
  EXPECT_EQ(e2.shape(), (Shape{3, 2}));
  expect_values(e2, {1, 2, 1, 2, 1, 2});
  EXPECT_TRUE(matches_reference({r, p, t, e, e2}, 0));
  // permute by hand: out[k][i][j] = x[i][j][k]
  V pv = p.to_vector<double>();
  for (int k = 0; k < 4; ++k)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) EXPECT_EQ(pv[size_t((k * 2 + i) * 3 + j)], xv[size_t((i * 3 + j) * 4 + k)]);
  expect_values(e, {1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3});
}

TEST(Ops, SliceClampsAndSteps) {
  Tensor x = arange(10);
  expect_values(x.slice(0, 2, 8, 3), {2, 5});
  expect_values(x.slice(0, -3, 10), {7, 8, 9});
  expect_values(x.slice(0, -3, -1), {7, 8});
  expect_values(x.slice(0, -100, 100, 4), {0, 4, 8});
  EXPECT_EQ(x.slice(0, 8, 2).numel(), 0);
  EXPECT_EQ(x.slice(0, 12, 20).numel(), 0);
  Tensor m = random_tensor({5, 6}, kF64, 42);
  Tensor s = m.slice(1, 1, 6, 2).slice(0, 0, 5, 2);
  EXPECT_EQ(s.shape(), (Shape{3, 3}));
  Tensor sl = m.slice(-1, -2, 6);
  EXPECT_EQ(sl.shape(), (Shape{5, 2}));
  EXPECT_TRUE(matches_reference({s, sl, m.slice(0, 4, 5)}, 0));
}

TEST(Ops, NonContiguousViewsFeedOtherOps) {
  Tensor a = random_tensor({6, 8}, kF32, 51), b = random_tensor({8, 6}, kF32, 52);
  Tensor c = random_tensor({2, 3, 4}, kF32, 53);
  Tensor pending = (a * 2 + 1);  // views of a pending value
  std::vector<Tensor> outs = {
      a.transpose(0, 1) + b,
      (pending.transpose(0, 1) * b).exp(),
      a.slice(0, 0, 6, 2).slice(1, 1, 8, 3) * 3.0,
      a.slice(1, 0, 8, 2).matmul(b.slice(0, 1, 8, 2)),
      a.transpose(0, 1).matmul(a),
      c.permute({2, 0, 1}).reshape({4, 6}) - b.slice(0, 0, 4).expand({4, 6}),
      make_tensor({1, 2, 3, 4}, {4, 1}).expand({4, 6}) * b.slice(0, 4, 8),
      c.permute({1, 2, 0}).sum({0, 2}),
      pending.slice(0, 1, 6, 2).amax({0}, true),
      c.transpose(1, 2).reshape({2, 12}).tanh(),
      c.permute({2, 1, 0}).slice(0, 1, 3).log(),  // NaN for negatives, compared by position
  };
  EXPECT_TRUE(matches_reference(outs));
}

TEST(Ops, ZeroSizeDimensions) {
  Tensor e = random_tensor({0, 3}, kF32), r = random_tensor({1, 3}, kF32, 2);
  std::vector<Tensor> outs = {
      e + r, e.exp(), e.sum({1}), e.sum({0}, true), e.reshape({3, 0}), e.transpose(0, 1),
      matmul(e, random_tensor({3, 2}, kF32, 3)),
      matmul(random_tensor({2, 0}, kF32, 4), random_tensor({0, 5}, kF32, 5)),
      cat({e, r}, 0), pad(e, {1, 1, 0, 0}, 7), e.to(kI32), e.slice(1, 0, 3, 2),
      where(e > 0.0, e, r),
  };
  EXPECT_EQ(outs[0].shape(), (Shape{0, 3}));
  EXPECT_EQ(outs[2].shape(), (Shape{0}));
  EXPECT_EQ(outs[3].shape(), (Shape{1, 3}));
  EXPECT_EQ(outs[7].shape(), (Shape{2, 5}));
  EXPECT_EQ(outs[8].shape(), (Shape{1, 3}));
  EXPECT_EQ(outs[9].shape(), (Shape{2, 3}));
  EXPECT_TRUE(matches_reference(outs));
  expect_values(outs[7], V(10, 0));
  expect_values(outs[9], V(6, 7));
}

// ---------------------------------------------------------------- matmul

TEST(Ops, MatmulHandDerived) {
  Tensor a = make_tensor({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = make_tensor({7, 8, 9, 10, 11, 12}, {3, 2});
  Tensor c = a.matmul(b);
  EXPECT_EQ(c.shape(), (Shape{2, 2}));
  expect_values(c, {58, 64, 139, 154});
  Tensor ai = make_tensor({1, 2, 3, 4}, {2, 2}, kI64);
  Tensor ci = matmul(ai, ai);
  EXPECT_EQ(ci.dtype(), kI64);
  expect_values(ci, {7, 10, 15, 22});
}

TEST(Ops, MatmulShapesAndBroadcastBatches) {
  struct Case { Shape a, b, out; };
  std::vector<Case> cases = {
      {{3, 4}, {4, 5}, {3, 5}},
      {{2, 3, 4}, {2, 4, 5}, {2, 3, 5}},
      {{4, 1, 3, 4}, {2, 4, 5}, {4, 2, 3, 5}},
      {{3, 4}, {2, 4, 5}, {2, 3, 5}},
      {{2, 1, 3, 4}, {1, 3, 4, 2}, {2, 3, 3, 2}},
      {{1, 17}, {17, 1}, {1, 1}},
      {{33, 65}, {65, 31}, {33, 31}},
      // deep and narrow: K split into equal chunks (2 row blocks of 150; then one of 9 rows)
      {{300, 5000}, {5000, 40}, {300, 40}},
      {{9, 6001}, {6001, 20}, {9, 20}},
  };
  uint32_t seed = 60;
  for (DType t : {kF32, kF64}) {
    for (auto& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + shape_str(c.a) + " x " + shape_str(c.b));
      Tensor a = random_tensor(c.a, t, seed++), b = random_tensor(c.b, t, seed++);
      Tensor r = matmul(a, b);
      EXPECT_EQ(r.shape(), c.out);
      EXPECT_EQ(r.dtype(), t);
      EXPECT_TRUE(matches_reference(r, tolerance(t)));
    }
  }
  // Long inner dimension, transposed operand, integer operands.
  Tensor a = random_tensor({8, 1500}, kF32, 70), b = random_tensor({8, 1500}, kF32, 71);
  EXPECT_TRUE(matches_reference(matmul(a, b.transpose(0, 1)), tolerance(kF32, 1500)));
  Tensor ia = random_int({2, 3, 5}, -9, 9, kI32, 72), ib = random_int({5, 4}, -9, 9, kI32, 73);
  EXPECT_TRUE(matches_reference(matmul(ia, ib), 0));
}

// ---------------------------------------------------------------- indexing, cat, pad, where

TEST(Ops, GatherAlongEachDim) {
  Tensor src = random_tensor({4, 5, 6}, kF32, 80);
  for (int64_t dim : {0, 1, 2, -1}) {
    int64_t d = dim < 0 ? dim + 3 : dim;
    for (DType it : {kI32, kI64}) {
      SCOPED_TRACE("dim " + std::to_string(dim) + " " + dtype_name(it));
      Shape is{3, 4, 5};  // smaller than src in the other dims too
      Tensor idx = random_int(is, 0, src.size(d) - 1, it, uint32_t(81 + d));
      Tensor g = gather(src, dim, idx);
      EXPECT_EQ(g.shape(), is);
      EXPECT_EQ(g.dtype(), kF32);
      EXPECT_TRUE(matches_reference(g, 0));
    }
  }
  // torch.gather([[1,2],[3,4]], 1, [[0,0],[1,0]]) = [[1,1],[4,3]]
  Tensor t = make_tensor({1, 2, 3, 4}, {2, 2});
  expect_values(gather(t, 1, make_tensor({0, 0, 1, 0}, {2, 2}, kI64)), {1, 1, 4, 3});
  // Gather from a non-contiguous view, with a pending index.
  Tensor base = random_tensor({6, 4}, kF64, 90);
  Tensor pidx = (random_int({4, 3}, 0, 2, kI64, 91) + 1);
  EXPECT_TRUE(matches_reference(gather(base.transpose(0, 1), 1, pidx), 0));
  // Integer sources.
  EXPECT_TRUE(matches_reference(gather(random_int({5, 3}, -5, 5, kI32, 92), 0, random_int({2, 3}, 0, 4, kI64, 93)), 0));
}

TEST(Ops, GatherOutOfRangeIsReportedAtSync) {
  Tensor src = random_tensor({5}, kF32);
  Tensor idx = make_tensor({0, 7}, {2}, kI64);
  bool thrown = false;
  {
    Tensor g = gather(src, 0, idx);
    try {
      g.to_vector<double>();
    } catch (const Error& e) {
      thrown = true;
      std::string msg = e.what();
      EXPECT_EQ(msg.rfind("[gather]", 0), 0u) << msg;
      EXPECT_NE(msg.find('7'), std::string::npos) << msg;
    }
  }
  EXPECT_TRUE(thrown);
  Tensor neg = make_tensor({-1}, {1}, kI64);
  EXPECT_THROW(
      {
        Tensor g = gather(src, 0, neg);
        sync();
      },
      Error);
}

TEST(Ops, Cat) {
  Tensor a = make_tensor({1, 2, 3, 4}, {2, 2}), b = make_tensor({5, 6}, {1, 2}), c = make_tensor({7, 8}, {2, 1});
  Tensor r0 = cat({a, b}, 0);
  EXPECT_EQ(r0.shape(), (Shape{3, 2}));
  expect_values(r0, {1, 2, 3, 4, 5, 6});
  Tensor r1 = cat({a, c}, -1);
  EXPECT_EQ(r1.shape(), (Shape{2, 3}));
  expect_values(r1, {1, 2, 7, 3, 4, 8});
  expect_values(cat({a}), {1, 2, 3, 4});
  Tensor x = random_tensor({2, 3, 4}, kF32, 100), y = random_tensor({2, 5, 4}, kF32, 101);
  Tensor z = random_tensor({4, 3, 2}, kF32, 102);
  std::vector<Tensor> outs = {
      cat({x, y, x}, 1),
      cat({x, z.permute({2, 1, 0})}, 0),           // a non-contiguous input
      cat({x.slice(2, 0, 4, 2), x.slice(2, 1, 2)}, 2),
      cat({x * 2, random_tensor({2, 0, 4}, kF32, 103)}, 1),
      cat({random_int({2, 2}, -3, 3, kI64, 104), random_int({1, 2}, -3, 3, kI64, 105)}, 0),
  };
  EXPECT_EQ(outs[0].shape(), (Shape{2, 11, 4}));
  EXPECT_EQ(outs[2].shape(), (Shape{2, 3, 3}));
  EXPECT_TRUE(matches_reference(outs, 0));
}

TEST(Ops, Pad) {
  Tensor x = make_tensor({1, 2, 3, 4}, {2, 2});
  Tensor p = pad(x, {1, 0, 0, 2}, -1);
  EXPECT_EQ(p.shape(), (Shape{3, 4}));
  expect_values(p, {-1, -1, -1, -1, 1, 2, -1, -1, 3, 4, -1, -1});
  expect_values(pad(make_tensor({5}, {1}), {2, 1}), {0, 0, 5, 0});
  Tensor y = random_tensor({3, 4, 5}, kF32, 110);
  std::vector<Tensor> outs = {
      pad(y, {0, 0, 1, 2, 3, 0}, 0.5),
      pad(y.transpose(0, 2), {1, 1, 1, 1, 1, 1}),
      pad(y * 2, {0, 0, 0, 0, 0, 0}),
      pad(random_int({2, 3}, -5, 5, kI32, 111), {1, 1, 0, 1}, 9),
  };
  EXPECT_TRUE(matches_reference(outs, 0));
  EXPECT_TRUE(matches_reference(pad(y, {2, 0, 0, 0, 0, 1}, 0).sum({0})));
}

TEST(Ops, Where) {
  Tensor c = make_tensor({1, 0, 1}, {3}, kBool);
  expect_values(where(c, make_tensor({1, 2, 3}, {3}), make_tensor({-1, -2, -3}, {3})), {1, -2, 3});
  Tensor a = random_tensor({4, 5}, kF32, 120), b = random_tensor({5}, kF32, 121);
  Tensor cond = a > 0.0;
  std::vector<Tensor> outs = {
      where(cond, a, b),                                 // broadcast b
      where(b > 0.0, a, b),                              // broadcast condition
      where(cond.transpose(0, 1), a.transpose(0, 1), scalar_tensor(0)),
      where(a < b, a, b),
      where(cond, random_int({4, 5}, -3, 3, kI32, 122), random_int({1}, -3, 3, kI32, 123)),
  };
  EXPECT_EQ(outs[1].shape(), (Shape{4, 5}));
  EXPECT_EQ(outs[4].dtype(), kI32);
  EXPECT_TRUE(matches_reference(outs, 0));
  Tensor mixed = where(cond, random_int({4, 5}, -3, 3, kI32, 124), b);
  EXPECT_EQ(mixed.dtype(), kF32);
  EXPECT_TRUE(matches_reference(mixed, 0));
}

// where() picks bits, whatever they are: NaN, infinities and signed zeros pass through, scalar
// constants on either side (the cpu backend keeps those as scalars) included.
TEST(Ops, WhereKeepsSpecialValuesBitExactly) {
  const double inf = std::numeric_limits<double>::infinity();
  V av = {kNaN, -0.0, inf, -inf, 1.5, 0.0, -2.0, 3.25, kNaN};
  V bv = {-0.0, kNaN, -inf, 0.0, -0.0, inf, 7.0, kNaN, 2.0};
  V cv = {1, 0, 1, 0, 1, 0, 1, 0, 0};
  for (DType t : {kF32, kF64}) {
    Tensor a = make_tensor(av, {9}, t), b = make_tensor(bv, {9}, t), c = make_tensor(cv, {9}, kBool);
    std::vector<Tensor> outs = {where(c, a, b), where(c, a, full_like(a, -0.0)), where(c, full_like(b, 2.5), b)};
    for (size_t k = 0; k < outs.size(); ++k) {
      V got = outs[k].to_vector<double>();
      for (size_t i = 0; i < 9; ++i) {
        double want = cv[i] ? (k == 2 ? 2.5 : av[i]) : (k == 1 ? -0.0 : bv[i]);
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got[i])) << k << " " << i;
        } else {
          EXPECT_EQ(got[i], want) << k << " " << i;
          EXPECT_EQ(std::signbit(got[i]), std::signbit(want)) << k << " " << i;
        }
      }
    }
  }
  Tensor ci = make_tensor(cv, {9}, kBool);
  expect_values(where(ci, make_tensor({1, 2, 3, 4, 5, 6, 7, 8, 9}, {9}, kI64), full({9}, -5.0, opts(kI64))),
                {1, -5, 3, -5, 5, -5, 7, -5, -5});
  expect_values(where(ci, ci, make_tensor({1, 1, 0, 0, 1, 1, 0, 0, 1}, {9}, kBool)), {1, 1, 1, 0, 1, 1, 1, 0, 1});
}

// Outputs of 8 MiB and more are written with non-temporal stores on the cpu backend; a length
// that is no multiple of the tile checks the tail, a second output the multi-output path.
TEST(Ops, LargeElementwiseOutputs) {
  const int64_t n = (int64_t(3) << 20) + 7;
  Tensor x = random_tensor({n}, kF32, 130), y = random_tensor({n}, kF32, 131);
  Tensor chain = maximum(abs(x * 1.5 + 0.25) - y, scalar_tensor(0.5)) * 2.0;
  EXPECT_TRUE(matches_reference(chain));  // one Step, one output: streamed
  EXPECT_TRUE(matches_reference(std::vector<Tensor>{x * y, x.to(kF64) * 3.0 + y}));
}

// Elementwise Steps whose last dim is short after a long one ([.., OH, kH, OW, kW], a pooling
// gradient's layout) run on the cpu in a permuted order and store with strides; masked loads
// (pads), iota, several outputs and narrow dtypes through that path.
TEST(Ops, InterleavedShortDimsMatchTheReference) {
  Tensor g = random_tensor({3, 5, 9, 1, 11, 1}, kF32, 140);
  Tensor taps = pad(g, {0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2}) + pad(g * 2.0, {0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1}) +
                pad(g * 3.0, {0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0});
  EXPECT_EQ(taps.shape(), (Shape{3, 5, 9, 2, 11, 3}));
  EXPECT_TRUE(matches_reference(taps));
  Tensor x = random_tensor({3, 5, 9, 2, 11, 3}, kF32, 141);
  Tensor tap = arange(0, 3, 1, opts(kI64)).reshape({1, 1, 1, 1, 1, 3}).to(kF32);
  EXPECT_TRUE(matches_reference(std::vector<Tensor>{x * tap + 1.0, (x > 0.25).to(kI32), (x * 3.0).to(kF16)}));
  EXPECT_TRUE(matches_reference(x.to(kBF16) * 2.0));
}

// Row Steps with rows of at least 32 keep values constant along a row once per row (row sums
// and maxima, broadcast statistics, what is computed from them) and evaluate what mixes them
// with per-position values row by row. Rows of 48 (21 to a tile, a partial last tile), of 64
// with a padded non-row dim, and every way a row constant meets a per-position value.
TEST(Ops, RowConstantsMatchTheReference) {
  // Each expression is its own graph, so its statistics are fused into one Row Step with it.
  std::vector<std::function<Tensor(const Tensor&)>> cases = {
      [](const Tensor& x) { return softmax(x, 2); },
      [](const Tensor& x) { return log_softmax(x, 2); },
      [](const Tensor& x) { return layer_norm(x, {x.shape()[2]}); },
      [](const Tensor& x) { return where(x > x.amax({2}, true) * 0.5, x, x.amax({2}, true)); },  // where's values
      [](const Tensor& x) { return where(x < mean(x, {2}, true), x.amax({2}, true), x); },
      [](const Tensor& x) { return where(x.amax({2}, true) > mean(x, {2}, true), x, x * -2.0); },  // condition
      [](const Tensor& x) { return (x.amax({2}, true) - x) / (x.sum({2}, true) + 3.0); },  // left and right
      [](const Tensor& x) { return (x > mean(x, {2}, true)).to(kF32).sum({2}); },  // one value per row
      [](const Tensor& x) { return x.amax({2}, true).expand(x.shape()) * 2.0 + 1.0; },  // at every position
      [](const Tensor& x) { return (x.amax({2}, true).expand(x.shape()) * 2.0).sum({2}); },  // sum of a constant row
      [](const Tensor& x) { return amax(x.sum({2}, true).expand(x.shape()) * x, {2}); },
      [](const Tensor& x) {
        Tensor xi = (x * 8.0).to(kI32);
        return (xi - xi.amax({2}, true)).sum({2});
      },
      [](const Tensor& x) { return softmax(x.to(kF16), 2); },
  };
  for (Shape s : {Shape{6, 7, 48}, Shape{3, 5, 64}}) {
    Tensor x = random_tensor(s, kF32, 150);
    if (s[2] == 64) x = pad(x.slice(1, 0, 4), {0, 0, 1, 0, 0, 0});  // a pad along a non-row dim
    for (size_t k = 0; k < cases.size(); ++k) EXPECT_TRUE(matches_reference(cases[k](x))) << "rows of " << s[2] << ", case " << k;
    // A per-row input (a stored statistic) read by a Row Step: loaded once per row.
    Tensor st = random_tensor({x.shape()[0], x.shape()[1], 1}, kF32, 151);
    Tensor y = (x - x.amax({2}, true)) * st + x.sum({2}, true) * st;  // (temporaries gone before the sync)
    EXPECT_TRUE(matches_reference(y)) << s[2];
  }
}

// ---------------------------------------------------------------- in place, reading, misc

TEST(Ops, InPlaceOps) {
  Tensor a = make_tensor({1, 2, 3}, {3});
  Tensor before = a * 1.0;  // traced before the mutation: keeps the old value
  a.add_(make_tensor({10, 20, 30}, {3}));
  expect_values(a, {11, 22, 33});
  a.add_(1);
  expect_values(a, {12, 23, 34});
  a.sub_(make_tensor({2}, {1}));  // broadcast
  expect_values(a, {10, 21, 32});
  a.mul_(make_tensor({1, 2, 0.5}, {3}));
  expect_values(a, {10, 42, 16});
  a.mul_(0.5);
  expect_values(a, {5, 21, 8});
  a.div_(make_tensor({5, 7, 2}, {3}));
  expect_values(a, {1, 3, 4});
  EXPECT_EQ(a.dtype(), kF32);
  expect_values(before, {1, 2, 3});
  Tensor d = zeros({2, 3}, opts(kF64));
  d.copy_(make_tensor({1, 2, 3}, {3}, kI32));
  EXPECT_EQ(d.dtype(), kF64);
  EXPECT_EQ(d.shape(), (Shape{2, 3}));
  expect_values(d, {1, 2, 3, 1, 2, 3});
  // A chain of in-place updates on a random tensor, checked against the reference.
  Tensor x = random_tensor({4, 4}, kF32, 130);
  Tensor y = random_tensor({4, 4}, kF32, 131);
  x.mul_(y);
  x.add_(2.5);
  x.sub_(y.transpose(0, 1));
  EXPECT_TRUE(matches_reference(x));
  Tensor n = make_tensor({1, 2}, {2}, kI64);
  n.add_(3);
  EXPECT_EQ(n.dtype(), kI64);
  expect_values(n, {4, 5});
}

TEST(Ops, ReadingAndHandles) {
  Tensor x = make_tensor({1.5, -2}, {2});
  Tensor y = x * 2;
  EXPECT_TRUE(x.is_realized());
  EXPECT_FALSE(y.is_realized());
  EXPECT_EQ(y.size(0), 2);
  EXPECT_EQ(y.size(-1), 2);
  EXPECT_EQ(y.device(), Device("cpu"));
  sync();
  EXPECT_TRUE(y.is_realized());
  expect_values(y, {3, -4});
  EXPECT_EQ(y.sum().item(), -1);
  EXPECT_THROW(y.item(), Error);  // two elements
  std::ostringstream os;
  os << y;
  EXPECT_FALSE(os.str().empty());
  EXPECT_FALSE(y.str().empty());
  EXPECT_NE(y.str().find('3'), std::string::npos) << y.str();
  Tensor undefined;
  EXPECT_FALSE(undefined.defined());
  EXPECT_THROW(undefined.exp(), Error);
  Tensor moved = y.to(Device("cpu"));
  expect_values(moved, {3, -4});
  EXPECT_NE(std::string(version()), "");
}

TEST(Ops, ShapeErrorsNameTheOp) {
  Tensor a = zeros({2, 3}), b = zeros({4, 5});
  try {
    matmul(a, b);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("matmul"), std::string::npos) << e.what();
  }
  EXPECT_THROW(a + zeros({3, 2}), Error);
  EXPECT_THROW(cat({a, b}, 0), Error);
  EXPECT_THROW(a.reshape({4, 2}), Error);
  EXPECT_THROW(a.sum({2}), Error);
  EXPECT_THROW(a.expand({3, 3}), Error);
}

TEST(Ops, Float64HighPrecisionChain) {
  Tensor a = random_tensor({16, 24}, kF64, 140), b = random_tensor({24, 8}, kF64, 141);
  Tensor c = random_positive({16, 8}, kF64, 142);
  Tensor out = ((matmul(a, b) + c.log()) * 0.5).tanh() - (a.sum({1}, true) / c).exp();
  EXPECT_EQ(out.dtype(), kF64);
  EXPECT_TRUE(matches_reference(out, 1e-12));
}

// A small softmax written with public ops, by hand.
TEST(Ops, SoftmaxByHand) {
  Tensor x = make_tensor({1, 2, 3, 1, 1, 1}, {2, 3});
  Tensor m = x.amax({1}, true);
  Tensor e = (x - m).exp();
  Tensor s = e / e.sum({1}, true);
  EXPECT_TRUE(matches_reference(s));
  double z = 1 + std::exp(1.0) + std::exp(2.0);
  expect_values(s, {1 / z, std::exp(1.0) / z, std::exp(2.0) / z, 1.0 / 3, 1.0 / 3, 1.0 / 3}, 1e-6);
}

}  // namespace
}  // namespace tessera
