// Cases of every primitive (suite.h gives the coverage rules). Each is traced through the public
// op that maps onto the primitive, so the frontend's broadcasting and views are part of it; the
// runner checks that the traced graph really contains the primitive.
#include <cmath>

#include "conformance/suite.h"
#include "tessera/autocast.h"
#include "tensor/tensor_impl.h"
#include "ir/build.h"

namespace tessera::conformance {
namespace {

using ir::Op;
using L = Layout;
constexpr DType F32 = DType::Float32, F64 = DType::Float64, F16 = DType::Float16, BF16 = DType::BFloat16,
                I32 = DType::Int32, I64 = DType::Int64, B = DType::Bool;

using Unary = std::function<Tensor(const Tensor&)>;
using Binary = std::function<Tensor(const Tensor&, const Tensor&)>;

// A random shape of `rank` odd-ish extents (1..13), fixed by the row's generator.
Shape odd_shape(Rng& r, int rank) {
  static const int64_t ext[] = {1, 2, 3, 5, 7, 9, 11, 13};
  Shape s(static_cast<size_t>(rank));
  for (auto& d : s) d = ext[std::uniform_int_distribution<int>(0, 7)(r)];
  return s;
}

Case one(std::string variant, Input in, Unary f, double tol = -1) {
  return {std::move(variant), {std::move(in)}, [f](const std::vector<Tensor>& x, const Context&) { return std::vector<Tensor>{f(x[0])}; }, tol};
}
Case two(std::string variant, Input a, Input b, Binary f, double tol = -1) {
  return {std::move(variant), {std::move(a), std::move(b)},
          [f](const std::vector<Tensor>& x, const Context&) { return std::vector<Tensor>{f(x[0], x[1])}; }, tol};
}
Input fixed(const Shape& s, DType t, std::vector<double> v, L l = L::Contiguous) {
  Input in = input(s, t, nullptr, l);
  in.fixed = std::move(v);
  return in;
}

Gen ints_for(DType t, Gen floats) { return is_floating(t) ? floats : t == B ? integers(0, 1) : integers(-9, 9); }

// ---- elementwise unary ----
struct UnarySpec {
  std::vector<DType> dtypes;
  Gen gen;
  bool exact;  // the op is exact in every dtype (abs, neg, floor ...)
  bool specials;
};

std::vector<Case> unary_cases(Op op, const UnarySpec& u, Rng& r) {
  Unary f;  // through the public ops, so autodiff records them
  switch (op) {
    case Op::Neg: f = [](const Tensor& x) { return -x; }; break;
    case Op::Exp: f = [](const Tensor& x) { return exp(x); }; break;
    case Op::Log: f = [](const Tensor& x) { return log(x); }; break;
    case Op::Tanh: f = [](const Tensor& x) { return tanh(x); }; break;
    case Op::Abs: f = [](const Tensor& x) { return abs(x); }; break;
    case Op::Sign: f = [](const Tensor& x) { return sign(x); }; break;
    case Op::Sqrt: f = [](const Tensor& x) { return sqrt(x); }; break;
    case Op::Sin: f = [](const Tensor& x) { return sin(x); }; break;
    case Op::Cos: f = [](const Tensor& x) { return cos(x); }; break;
    case Op::Erf: f = [](const Tensor& x) { return erf(x); }; break;
    case Op::Floor: f = [](const Tensor& x) { return floor(x); }; break;
    case Op::Ceil: f = [](const Tensor& x) { return ceil(x); }; break;
    case Op::Round: f = [](const Tensor& x) { return round(x); }; break;
    default: break;
  }
  double tol = u.exact ? 0 : -1;
  std::vector<Case> c;
  for (DType t : u.dtypes) {
    Shape s = odd_shape(r, 3);
    c.push_back(one(variant_name(t, s), input(s, t, ints_for(t, u.gen)), f, tol));
  }
  for (L l : {L::Permuted, L::Strided, L::Expanded}) {
    Shape s = odd_shape(r, 3);
    c.push_back(one(variant_name(F32, s, layout_name(l)), input(s, F32, u.gen, l), f, tol));
  }
  c.push_back(one(variant_name(F32, {3, 0, 5}), input({3, 0, 5}, F32, u.gen), f, tol));
  c.push_back(one(variant_name(F32, {}), input({}, F32, u.gen), f, tol));
  c.push_back(one(variant_name(F32, {3, 5, 307}), input({3, 5, 307}, F32, u.gen), f, tol));
  if (u.specials)
    for (DType t : {F32, F64}) c.push_back(one(variant_name(t, {4, 3, 3}, "nan/inf"), input({4, 3, 3}, t, with_specials(u.gen)), f, tol));
  if (ir::info(op).differentiable) {
    c.push_back(one(variant_name(F32, {4, 5, 3}, "strided grad"), input({4, 5, 3}, F32, u.gen, L::Strided, true), f));
    c.push_back(one(variant_name(F32, {3, 7, 2}, "grad"), input({3, 7, 2}, F32, u.gen, L::Contiguous, true), f));
  }
  return c;
}

// ---- elementwise binary and compare ----
struct BinarySpec {
  std::vector<DType> dtypes;
  Gen ga, gb;
  bool exact;
};

std::vector<Case> binary_cases(Op op, const BinarySpec& b, Rng& r) {
  Binary f;
  switch (op) {
    case Op::Add: f = [](const Tensor& x, const Tensor& y) { return x + y; }; break;
    case Op::Sub: f = [](const Tensor& x, const Tensor& y) { return x - y; }; break;
    case Op::Mul: f = [](const Tensor& x, const Tensor& y) { return x * y; }; break;
    case Op::Div: f = [](const Tensor& x, const Tensor& y) { return x / y; }; break;
    case Op::Maximum: f = [](const Tensor& x, const Tensor& y) { return maximum(x, y); }; break;
    case Op::Minimum: f = [](const Tensor& x, const Tensor& y) { return minimum(x, y); }; break;
    case Op::Pow: f = [](const Tensor& x, const Tensor& y) { return pow(x, y); }; break;
    case Op::Eq: f = [](const Tensor& x, const Tensor& y) { return eq(x, y); }; break;
    case Op::Ne: f = [](const Tensor& x, const Tensor& y) { return ne(x, y); }; break;
    case Op::Lt: f = [](const Tensor& x, const Tensor& y) { return lt(x, y); }; break;
    case Op::Le: f = [](const Tensor& x, const Tensor& y) { return le(x, y); }; break;
    case Op::Gt: f = [](const Tensor& x, const Tensor& y) { return gt(x, y); }; break;
    default: f = [](const Tensor& x, const Tensor& y) { return ge(x, y); }; break;
  }
  double tol = b.exact ? 0 : -1;
  std::vector<Case> c;
  for (DType t : b.dtypes) {
    Shape s = odd_shape(r, 3);
    c.push_back(two(variant_name(t, s), input(s, t, ints_for(t, b.ga)), input(s, t, ints_for(t, b.gb)), f, tol));
  }
  Shape s = odd_shape(r, 3);
  s[1] = 4;
  c.push_back(two(variant_name(F32, s, "op [1,4,1]"), input(s, F32, b.ga), input({1, 4, 1}, F32, b.gb), f, tol));
  c.push_back(two("f32[5,1,3] op [4,1] (both broadcast)", input({5, 1, 3}, F32, b.ga), input({4, 1}, F32, b.gb), f, tol));
  s = odd_shape(r, 3);
  c.push_back(two(variant_name(F32, s, "permuted op strided"), input(s, F32, b.ga, L::Permuted), input(s, F32, b.gb, L::Strided), f, tol));
  s = odd_shape(r, 3);
  c.push_back(two(variant_name(F32, s, "expanded op contiguous"), input(s, F32, b.ga, L::Expanded), input(s, F32, b.gb), f, tol));
  c.push_back(two("f32[2,0,3] op [1,3]", input({2, 0, 3}, F32, b.ga), input({1, 3}, F32, b.gb), f, tol));
  c.push_back(two("f32[] op [7]", input({}, F32, b.ga), input({7}, F32, b.gb), f, tol));
  c.push_back(two(variant_name(F32, {2, 5, 520}), input({2, 5, 520}, F32, b.ga), input({2, 5, 520}, F32, b.gb), f, tol));
  for (DType t : {F32, F64})
    c.push_back(two(variant_name(t, {6, 7, 2}, "nan/inf"), input({6, 7, 2}, t, with_specials(b.ga)), input({6, 7, 2}, t, with_specials(b.gb)), f, tol));
  if (ir::info(op).differentiable) {
    c.push_back(two("f32[3,4,5] op [1,4,1] grad", input({3, 4, 5}, F32, b.ga, L::Strided, true),
                    input({1, 4, 1}, F32, b.gb, L::Contiguous, true), f));
    c.push_back(two("f32[4,6,2] grad", input({4, 6, 2}, F32, b.ga, L::Contiguous, true), input({4, 6, 2}, F32, b.gb, L::Contiguous, true), f));
  }
  return c;
}

std::vector<Case> where_cases(Rng& r) {
  auto f = [](const std::vector<Tensor>& x, const Context&) { return std::vector<Tensor>{where(x[0], x[1], x[2])}; };
  Gen g = uniform(-3, 3);
  std::vector<Case> c;
  for (DType t : {F32, F64, F16, BF16, I32, I64, B}) {
    Shape s = odd_shape(r, 3);
    c.push_back({variant_name(t, s), {input(s, B, integers(0, 1)), input(s, t, ints_for(t, g)), input(s, t, ints_for(t, g))}, f, 0});
  }
  c.push_back({"f32 cond[5,1,3], a[4,1], b[]", {input({5, 1, 3}, B, integers(0, 1)), input({4, 1}, F32, g), input({}, F32, g)}, f, 0});
  Shape s = odd_shape(r, 3);
  c.push_back({variant_name(F32, s, "strided cond, permuted a, expanded b"),
               {input(s, B, integers(0, 1), L::Strided), input(s, F32, g, L::Permuted), input(s, F32, g, L::Expanded)}, f, 0});
  c.push_back({"f32[0,4]", {input({0, 4}, B, integers(0, 1)), input({0, 4}, F32, g), input({0, 4}, F32, g)}, f, 0});
  c.push_back({"f32[4,7] nan/inf", {input({4, 7}, B, integers(0, 1)), input({4, 7}, F32, with_specials(g)), input({4, 7}, F32, with_specials(g))}, f, 0});
  c.push_back({"f32[3,5] broadcast grad", {input({3, 5}, B, integers(0, 1)), input({3, 1}, F32, g, L::Contiguous, true), input({3, 5}, F32, g, L::Strided, true)}, f});
  c.push_back({"f32[4,4] grad", {input({4, 4}, B, integers(0, 1)), input({4, 4}, F32, g, L::Contiguous, true), input({4, 4}, F32, g, L::Contiguous, true)}, f});
  return c;
}

// Values that exercise float16's range: subnormals, overflow to inf, rounding.
Gen half_range() {
  return [](Rng& r) {
    static const double v[] = {1e-6, -3e-7, 7e4, -1e5, 65504, 2049, 0.1, 1.0 / 3};
    int k = std::uniform_int_distribution<int>(0, 11)(r);
    return k < 8 ? v[k] : std::uniform_real_distribution<double>(-100, 100)(r);
  };
}

std::vector<Case> cast_cases(Rng& r) {
  struct P {
    DType from, to;
    Gen g;
  };
  std::vector<P> pairs = {
      {F32, F64, uniform(-5, 5)},   {F64, F32, uniform(-5, 5)},       {F32, F16, half_range()},
      {F32, BF16, uniform(-300, 300)}, {F16, F32, uniform(-100, 100)},  {BF16, F32, uniform(-100, 100)},
      {F16, BF16, uniform(-100, 100)}, {F32, I32, off_grid(-1000, 1000)}, {F64, I64, off_grid(-1e6, 1e6)},
      {I32, F32, integers(-100000, 100000)}, {I64, F64, integers(-1000000, 1000000)}, {I32, I64, integers(-1000, 1000)},
      {I64, I32, integers(-100000, 100000)}, {B, F32, integers(0, 1)}, {F32, B, integers(-1, 1)},
      {I64, B, integers(-2, 2)},      {B, I64, integers(0, 1)},         {F16, I32, off_grid(-100, 100)},
  };
  std::vector<Case> c;
  for (auto& p : pairs) {
    Shape s = odd_shape(r, 2);
    DType to = p.to;
    c.push_back(one(std::string(dtype_short(p.from)) + "->" + dtype_short(to) + shape_str(s), input(s, p.from, p.g),
                    [to](const Tensor& x) { return x.to(to); }, 0));
  }
  auto to = [](DType t) { return [t](const Tensor& x) { return x.to(t); }; };
  Shape s = odd_shape(r, 3);
  c.push_back(one("f32->f16" + shape_str(s) + " permuted", input(s, F32, half_range(), L::Permuted), to(F16), 0));
  c.push_back(one("f32->i32" + shape_str(s) + " strided", input(s, F32, off_grid(-50, 50), L::Strided), to(I32), 0));
  c.push_back(one("f64->f32" + shape_str(s) + " expanded", input(s, F64, uniform(-2, 2), L::Expanded), to(F32), 0));
  c.push_back(one("f32->bool[5,6] nan/inf", input({5, 6}, F32, with_specials(integers(-1, 1))), to(B), 0));
  c.push_back(one("f32->f64[0,3]", input({0, 3}, F32, uniform(-1, 1)), to(F64), 0));
  c.push_back(one("f32->f64[4,5] strided grad", input({4, 5}, F32, uniform(-2, 2), L::Strided, true), to(F64)));
  c.push_back(one("f64->f32[3,6] grad", input({3, 6}, F64, uniform(-2, 2), L::Contiguous, true), to(F32)));
  return c;
}

// ---- reductions ----
std::vector<Case> reduce_cases(bool is_max, Rng& r) {
  auto red = [is_max](std::vector<int64_t> dims, bool keep) {
    return [is_max, dims, keep](const Tensor& x) { return is_max ? x.amax(dims, keep) : x.sum(dims, keep); };
  };
  double tol = is_max ? 0 : -1;
  Gen g = uniform(-2, 2);
  std::vector<Case> c;
  std::vector<DType> dts = {F32, F64, F16, BF16, I32, I64};
  if (is_max) dts.push_back(B);
  for (DType t : dts) {
    Shape s = odd_shape(r, 3);
    c.push_back(one(variant_name(t, s, "dim 2"), input(s, t, ints_for(t, g)), red({2}, false), tol));
  }
  Shape s = odd_shape(r, 3);
  c.push_back(one(variant_name(F32, s, "dim 0"), input(s, F32, g), red({0}, false), tol));
  c.push_back(one(variant_name(F32, s, "dim 1 keepdim"), input(s, F32, g), red({1}, true), tol));
  c.push_back(one(variant_name(F32, s, "dims 0,2"), input(s, F32, g), red({0, 2}, false), tol));
  c.push_back(one(variant_name(F32, s, "all"), input(s, F32, g), red({}, false), tol));
  s = odd_shape(r, 3);
  c.push_back(one(variant_name(F32, s, "permuted dim 2"), input(s, F32, g, L::Permuted), red({2}, false), tol));
  c.push_back(one(variant_name(F32, s, "strided dims 0,2"), input(s, F32, g, L::Strided), red({0, 2}, false), tol));
  c.push_back(one(variant_name(F32, s, "expanded dim 0"), input(s, F32, g, L::Expanded), red({0}, false), tol));
  c.push_back(one("f32[0,5] dim 1", input({0, 5}, F32, g), red({1}, false), tol));
  if (!is_max) c.push_back(one("f32[3,0,4] dim 1 (empty sum)", input({3, 0, 4}, F32, g), red({1}, false), tol));
  c.push_back(one("f32[3,3001] dim 1", input({3, 3001}, F32, g), red({1}, false), tol));
  c.push_back(one("f32[3001,3] dim 0", input({3001, 3}, F32, g), red({0}, false), tol));
  for (DType t : {F32, F64}) c.push_back(one(variant_name(t, {5, 8}, "nan/inf dim 1"), input({5, 8}, t, with_specials(g)), red({1}, false), tol));
  c.push_back(one("f32[4,6,5] strided dim 1 grad", input({4, 6, 5}, F32, g, L::Strided, true), red({1}, false)));
  c.push_back(one("f32[3,4,5] dims 0,2 grad", input({3, 4, 5}, F32, g, L::Contiguous, true), red({0, 2}, true)));
  if (is_max) c.push_back(one("f32[4,6,5] ties dim 1 grad", input({4, 6, 5}, F32, integers(-2, 2), L::Strided, true), red({1}, false)));
  return c;
}

// ---- movement ----
std::vector<Case> reshape_cases() {
  auto to = [](Shape s) { return [s](const Tensor& x) { return x.reshape(s); }; };
  Gen g = uniform(-2, 2);
  std::vector<Case> c;
  for (DType t : {F32, F64, F16, I64, B}) c.push_back(one(variant_name(t, {3, 4, 5}, "-> [5,12]"), input({3, 4, 5}, t, ints_for(t, g), L::Strided), to({5, 12}), 0));
  c.push_back(one("f32[3,4,5] permuted -> [12,5]", input({3, 4, 5}, F32, g, L::Permuted), to({12, 5}), 0));
  c.push_back(one("f32[6,35] permuted -> [2,3,5,7]", input({6, 35}, F32, g, L::Permuted), to({2, 3, 5, 7}), 0));
  c.push_back(one("f32[3,4,5] expanded -> [60]", input({3, 4, 5}, F32, g, L::Expanded), to({60}), 0));
  c.push_back(one("f32[0,3] -> [3,0]", input({0, 3}, F32, g, L::Strided), to({3, 0}), 0));
  c.push_back(one("f32[1,1] strided -> []", input({1, 1}, F32, g, L::Strided), to({}), 0));
  c.push_back(one("f32[70,90] strided -> [90,70]", input({70, 90}, F32, g, L::Strided), to({90, 70}), 0));
  c.push_back(one("f32[4,6] permuted -> [3,8] grad", input({4, 6}, F32, g, L::Permuted, true), to({3, 8})));
  c.push_back(one("f32[2,3,4] strided -> [6,4] grad", input({2, 3, 4}, F32, g, L::Strided, true), to({6, 4})));
  return c;
}

std::vector<Case> permute_cases(Rng& r) {
  auto perm = [](std::vector<int64_t> p) { return [p](const Tensor& x) { return x.permute(p); }; };
  Gen g = uniform(-2, 2);
  std::vector<Case> c;
  for (DType t : {F32, F64, F16, BF16, I32, I64, B}) {
    Shape s = odd_shape(r, 3);
    c.push_back(one(variant_name(t, s, "(2,0,1)"), input(s, t, ints_for(t, g)), perm({2, 0, 1}), 0));
  }
  c.push_back(one("f32[5,7] (1,0)", input({5, 7}, F32, g), perm({1, 0}), 0));
  c.push_back(one("f32[2,3,4,5] (3,1,0,2)", input({2, 3, 4, 5}, F32, g), perm({3, 1, 0, 2}), 0));
  Shape s = odd_shape(r, 3);
  c.push_back(one(variant_name(F32, s, "strided (1,2,0)"), input(s, F32, g, L::Strided), perm({1, 2, 0}), 0));
  c.push_back(one(variant_name(F32, s, "expanded (2,1,0)"), input(s, F32, g, L::Expanded), perm({2, 1, 0}), 0));
  c.push_back(one("f32[3,0,2] (2,0,1)", input({3, 0, 2}, F32, g), perm({2, 0, 1}), 0));
  c.push_back(one("f32[67,71] (1,0)", input({67, 71}, F32, g), perm({1, 0}), 0));
  c.push_back(one("f32[3,4,5] strided (2,0,1) grad", input({3, 4, 5}, F32, g, L::Strided, true), perm({2, 0, 1})));
  c.push_back(one("f32[3,5] (1,0) grad", input({3, 5}, F32, g, L::Contiguous, true), perm({1, 0})));
  return c;
}

std::vector<Case> expand_cases() {
  auto to = [](Shape s) { return [s](const Tensor& x) { return x.expand(s); }; };
  Gen g = uniform(-2, 2);
  std::vector<Case> c;
  for (DType t : {F32, F64, F16, I32, I64, B}) c.push_back(one(variant_name(t, {3, 1, 5}, "-> [3,4,5]"), input({3, 1, 5}, t, ints_for(t, g)), to({3, 4, 5}), 0));
  c.push_back(one("f32[1] -> [7]", input({1}, F32, g), to({7}), 0));
  c.push_back(one("f32[1,1] -> [6,9]", input({1, 1}, F32, g), to({6, 9}), 0));
  c.push_back(one("f32[5,1] permuted -> [5,6]", input({5, 1}, F32, g, L::Permuted), to({5, 6}), 0));
  c.push_back(one("f32[3,1,4] strided -> [3,5,4]", input({3, 1, 4}, F32, g, L::Strided), to({3, 5, 4}), 0));
  c.push_back(one("f32[4,1] -> [4,0]", input({4, 1}, F32, g), to({4, 0}), 0));
  c.push_back(one("f32[1,3000] -> [3,3000]", input({1, 3000}, F32, g), to({3, 3000}), 0));
  c.push_back(one("f32[3,1,4] strided -> [3,5,4] grad", input({3, 1, 4}, F32, g, L::Strided, true), to({3, 5, 4})));
  c.push_back(one("f32[1,5] -> [4,5] grad", input({1, 5}, F32, g, L::Contiguous, true), to({4, 5})));
  return c;
}

std::vector<Case> slice_cases() {
  auto sl = [](int64_t d, int64_t a, int64_t b, int64_t st) { return [=](const Tensor& x) { return x.slice(d, a, b, st); }; };
  Gen g = uniform(-2, 2);
  std::vector<Case> c;
  for (DType t : {F32, F64, F16, I32, I64, B}) c.push_back(one(variant_name(t, {9, 7}, "dim 0 [1:8:2]"), input({9, 7}, t, ints_for(t, g)), sl(0, 1, 8, 2), 0));
  c.push_back(one("f32[5,11] dim 1 [2:11:3]", input({5, 11}, F32, g), sl(1, 2, 11, 3), 0));
  c.push_back(one("f32[5,6,7] dim 1 [1:4]", input({5, 6, 7}, F32, g), sl(1, 1, 4, 1), 0));
  c.push_back(one("f32[4,9] dim 1 [3:3] (empty)", input({4, 9}, F32, g), sl(1, 3, 3, 1), 0));
  c.push_back(one("f32[6,8] permuted dim 0 [1:6:2]", input({6, 8}, F32, g, L::Permuted), sl(0, 1, 6, 2), 0));
  c.push_back(one("f32[7,9] strided dim 1 [1:9:4]", input({7, 9}, F32, g, L::Strided), sl(1, 1, 9, 4), 0));
  c.push_back(one("f32[5,1,6] expanded dim 2 [1:5]", input({5, 1, 6}, F32, g, L::Expanded), sl(2, 1, 5, 1), 0));
  c.push_back(one("f32[3,9000] dim 1 [7:8999:5]", input({3, 9000}, F32, g), sl(1, 7, 8999, 5), 0));
  c.push_back(one("f32[7,6] dim 0 [1:7:3] grad", input({7, 6}, F32, g, L::Strided, true), sl(0, 1, 7, 3)));
  c.push_back(one("f32[5,8] dim 1 [1:8:2] grad", input({5, 8}, F32, g, L::Contiguous, true), sl(1, 1, 8, 2)));
  return c;
}

std::vector<Case> pad_cases() {
  auto pd = [](std::vector<int64_t> p, double v) { return [p, v](const Tensor& x) { return pad(x, p, v); }; };
  // lo/hi/interior per dim, straight through the primitive (the frontend has no interior pad)
  auto interior = [](std::vector<int64_t> p, double v) {
    return [p, v](const Tensor& x) { return detail::from_node(ir::build::pad(detail::node_of(x), p, v)); };
  };
  Gen g = uniform(-2, 2);
  std::vector<Case> c;
  for (DType t : {F32, F64, F16, I32, I64, B}) c.push_back(one(variant_name(t, {3, 4}, "{1,2,0,1} value 1"), input({3, 4}, t, ints_for(t, g)), pd({1, 2, 0, 1}, 1), 0));
  c.push_back(one("f32[3,4] interior {1,0,2, 2,1,1} value -1.5", input({3, 4}, F32, g), interior({1, 0, 2, 2, 1, 1}, -1.5), 0));
  c.push_back(one("f32[2,3,4] permuted {0,0, 2,2, 1,0}", input({2, 3, 4}, F32, g, L::Permuted), pd({0, 0, 2, 2, 1, 0}, 0), 0));
  c.push_back(one("f32[5,6] strided interior {0,1,1, 1,0,2}", input({5, 6}, F32, g, L::Strided), interior({0, 1, 1, 1, 0, 2}, 0.5), 0));
  c.push_back(one("f32[3,5] expanded {2,0, 0,3} value nan", input({3, 5}, F32, g, L::Expanded), pd({2, 0, 0, 3}, NAN), 0));
  c.push_back(one("f32[0,3] {1,1, 0,0} value 2", input({0, 3}, F32, g), pd({1, 1, 0, 0}, 2), 0));
  c.push_back(one("f32[2,3000] {0,0, 5,7}", input({2, 3000}, F32, g), pd({0, 0, 5, 7}, 0), 0));
  c.push_back(one("f32[4,5] strided {1,2, 2,0} grad", input({4, 5}, F32, g, L::Strided, true), pd({1, 2, 2, 0}, 0.5)));
  c.push_back(one("f32[3,3] {0,1, 1,1} grad", input({3, 3}, F32, g, L::Contiguous, true), pd({0, 1, 1, 1}, 0)));
  return c;
}

std::vector<Case> concat_cases() {
  auto cat_fn = [](int64_t d) {
    return [d](const std::vector<Tensor>& x, const Context&) { return std::vector<Tensor>{cat(x, d)}; };
  };
  Gen g = uniform(-2, 2);
  std::vector<Case> c;
  for (DType t : {F32, F64, F16, I32, I64, B})
    c.push_back({variant_name(t, {3, 4}, "+ [2,4] dim 0"), {input({3, 4}, t, ints_for(t, g)), input({2, 4}, t, ints_for(t, g))}, cat_fn(0), 0});
  c.push_back({"f32[3,2] + [3,5] + [3,1] dim 1", {input({3, 2}, F32, g), input({3, 5}, F32, g), input({3, 1}, F32, g)}, cat_fn(1), 0});
  c.push_back({"f32[2,3,4] permuted + [2,2,4] strided dim 1", {input({2, 3, 4}, F32, g, L::Permuted), input({2, 2, 4}, F32, g, L::Strided)}, cat_fn(1), 0});
  c.push_back({"f32[3,4] expanded + [0,4] + [1,4] dim 0", {input({3, 4}, F32, g, L::Expanded), input({0, 4}, F32, g), input({1, 4}, F32, g)}, cat_fn(0), 0});
  c.push_back({"f32[2,3000] + [2,1100] dim 1", {input({2, 3000}, F32, g), input({2, 1100}, F32, g)}, cat_fn(1), 0});
  c.push_back({"f32[3,2] strided + [3,4] dim 1 grad", {input({3, 2}, F32, g, L::Strided, true), input({3, 4}, F32, g, L::Contiguous, true)}, cat_fn(1)});
  c.push_back({"f32[2,3] + [4,3] dim 0 grad", {input({2, 3}, F32, g, L::Contiguous, true), input({4, 3}, F32, g, L::Contiguous, true)}, cat_fn(0)});
  return c;
}

// ---- contraction ----
std::vector<Case> matmul_cases(Rng& r) {
  Binary mm = [](const Tensor& a, const Tensor& b) { return matmul(a, b); };
  auto mmc = [&](std::string v, Input a, Input b, double tol = 2e-5) { return two(std::move(v), std::move(a), std::move(b), mm, tol); };
  Gen g = uniform(-1, 1);
  // a^T stored: the operand is a transposed view
  auto transposed = [](const Shape& s, DType t, Gen g, bool grad = false) {
    Input in = input({s[1], s[0]}, t, std::move(g), L::Contiguous, grad);
    in.view = [](const Tensor& x) { return x.transpose(0, 1); };
    return in;
  };
  std::vector<Case> c;
  for (DType t : {F32, F64, I32, I64}) {
    Shape a = odd_shape(r, 2), b = {a[1], odd_shape(r, 1)[0]};
    c.push_back(mmc(variant_name(t, a, "x " + shape_str(b)), input(a, t, ints_for(t, g)), input(b, t, ints_for(t, g)), is_floating(t) ? 2e-5 : 0));
  }
  c.push_back(mmc("f32[2,3,4] x [2,4,5] batched", input({2, 3, 4}, F32, g), input({2, 4, 5}, F32, g)));
  c.push_back(mmc("f32[2,3,4] x [4,5] broadcast", input({2, 3, 4}, F32, g), input({4, 5}, F32, g)));
  c.push_back(mmc("f32[7,5]^T x [7,3] (transposed a)", transposed({5, 7}, F32, g), input({7, 3}, F32, g)));
  c.push_back(mmc("f32[6,5] x [5,4] strided b", input({6, 5}, F32, g), input({5, 4}, F32, g, L::Strided)));
  c.push_back(mmc("f32[4,6] permuted x [6,1] (matrix-vector)", input({4, 6}, F32, g, L::Permuted), input({6, 1}, F32, g)));
  c.push_back(mmc("f32[3,0] x [0,4] (K = 0)", input({3, 0}, F32, g), input({0, 4}, F32, g)));
  c.push_back(mmc("f32[0,5] x [5,2] (M = 0)", input({0, 5}, F32, g), input({5, 2}, F32, g)));
  c.push_back(mmc("f32[65,130] x [130,70]", input({65, 130}, F32, g), input({130, 70}, F32, g)));
  c.push_back(mmc("f32[3,4] x [4,5] nan/inf", input({3, 4}, F32, with_specials(g)), input({4, 5}, F32, g)));
  c.push_back(mmc("f32[5,3]^T x [5,4] strided grad", transposed({3, 5}, F32, g, true), input({5, 4}, F32, g, L::Strided, true), -1));
  c.push_back(mmc("f64[2,3,4] x [4,2] broadcast grad", input({2, 3, 4}, F64, g, L::Contiguous, true), input({4, 2}, F64, g, L::Contiguous, true), -1));
  // 16-bit operands: a float32 product, rounded back outside autocast; under autocast (float32
  // operands cast to bfloat16/float16, the float32 product returned) in edge tiles and odd K.
  for (DType t : {BF16, F16}) {
    Shape a = odd_shape(r, 2), b = {a[1], odd_shape(r, 1)[0]};
    c.push_back(mmc(variant_name(t, a, "x " + shape_str(b)), input(a, t, g), input(b, t, g), -1));
  }
  auto autocast = [](DType t) {
    return [t](const Tensor& a, const Tensor& b) {
      Autocast ac{t};
      return matmul(a, b);
    };
  };
  c.push_back(two("f32[13,129] x [129,67] bf16 autocast", input({13, 129}, F32, g), input({129, 67}, F32, g), autocast(BF16), 2e-5));
  c.push_back(two("f32[2,3,7] x [2,7,5] f16 autocast batched", input({2, 3, 7}, F32, g), input({2, 7, 5}, F32, g), autocast(F16), 2e-5));
  c.push_back(two("f32[5,3]^T x [5,4] strided bf16 autocast grad", transposed({3, 5}, F32, g, true), input({5, 4}, F32, g, L::Strided, true),
                  autocast(BF16), -1));
  return c;
}

// ---- indexing ----
std::vector<Case> gather_cases() {
  auto ga = [](int64_t d) { return [d](const Tensor& a, const Tensor& i) { return gather(a, d, i); }; };
  Gen g = uniform(-2, 2);
  std::vector<Case> c;
  for (DType t : {F32, F64, F16, I32, I64, B})
    c.push_back(two(variant_name(t, {5, 4}, "dim 0 index [3,4]"), input({5, 4}, t, ints_for(t, g)), input({3, 4}, I64, integers(0, 4)), ga(0), 0));
  c.push_back(two("f32[3,6,4] dim 1 index i32[2,5,3]", input({3, 6, 4}, F32, g), input({2, 5, 3}, I32, integers(0, 5)), ga(1), 0));
  c.push_back(two("f32[4,7] strided dim 1 index [4,9]", input({4, 7}, F32, g, L::Strided), input({4, 9}, I64, integers(0, 6)), ga(1), 0));
  c.push_back(two("f32[5,6] dim 0 permuted index [6,5]", input({5, 6}, F32, g), input({6, 5}, I64, integers(0, 4), L::Permuted), ga(0), 0));
  c.push_back(two("f32[4,5] dim 1 index [0,5]", input({4, 5}, F32, g), input({0, 5}, I64, integers(0, 4)), ga(1), 0));
  c.push_back(two("f32[3000,2] dim 0 index [5000,2]", input({3000, 2}, F32, g), input({5000, 2}, I64, integers(0, 2999)), ga(0), 0));
  c.push_back(two("f32[4,5] strided dim 0 index [6,5] grad", input({4, 5}, F32, g, L::Strided, true), input({6, 5}, I64, integers(0, 3)), ga(0)));
  c.push_back(two("f32[3,6] dim 1 index [3,8] grad", input({3, 6}, F32, g, L::Contiguous, true), input({3, 8}, I64, integers(0, 5)), ga(1)));
  return c;
}

std::vector<Case> scatter_add_cases() {
  auto sa = [](int64_t d) {
    return [d](const std::vector<Tensor>& x, const Context&) { return std::vector<Tensor>{scatter_add(x[0], d, x[1], x[2])}; };
  };
  Gen g = uniform(-2, 2);
  std::vector<Case> c;
  for (DType t : {F32, F64, I32, I64})
    c.push_back({variant_name(t, {4, 5}, "dim 0 index [6,5]"), {input({4, 5}, t, ints_for(t, g)), input({6, 5}, I64, integers(0, 3)), input({6, 5}, t, ints_for(t, g))}, sa(0)});
  c.push_back({"f32[3,7] dim 1 index i32[2,9] (duplicates)", {input({3, 7}, F32, g), input({2, 9}, I32, integers(0, 6)), input({2, 9}, F32, g)}, sa(1)});
  c.push_back({"f32[5,4] strided base, permuted src", {input({5, 4}, F32, g, L::Strided), input({3, 4}, I64, integers(0, 4)), input({3, 4}, F32, g, L::Permuted)}, sa(0)});
  c.push_back({"f32[4,5] dim 0 index [0,5]", {input({4, 5}, F32, g), input({0, 5}, I64, integers(0, 3)), input({0, 5}, F32, g)}, sa(0)});
  c.push_back({"f32[40,3] dim 0 index [5000,3]", {input({40, 3}, F32, g), input({5000, 3}, I64, integers(0, 39)), input({5000, 3}, F32, g)}, sa(0), 1e-4});
  c.push_back({"f32[4,5] dim 0 grad", {input({4, 5}, F32, g, L::Strided, true), input({6, 5}, I64, integers(0, 3)), input({6, 5}, F32, g, L::Contiguous, true)}, sa(0)});
  c.push_back({"f32[3,4] dim 1 grad", {input({3, 4}, F32, g, L::Contiguous, true), input({3, 6}, I64, integers(0, 3)), input({3, 6}, F32, g, L::Contiguous, true)}, sa(1)});
  return c;
}

std::vector<Case> dus_cases() {
  auto dus = [](const std::vector<Tensor>& x, const Context&) { return std::vector<Tensor>{dynamic_update_slice(x[0], x[1], x[2])}; };
  Gen g = uniform(-2, 2);
  std::vector<Case> c;
  for (DType t : {F32, F64, F16, I32, I64, B})
    c.push_back({variant_name(t, {5, 6}, "update [2,3] at (1,2)"), {input({5, 6}, t, ints_for(t, g)), input({2, 3}, t, ints_for(t, g)), fixed({2}, I64, {1, 2})}, dus, 0});
  c.push_back({"f32[5,6] update [2,3] at (4,9) clamped", {input({5, 6}, F32, g), input({2, 3}, F32, g), fixed({2}, I64, {4, 9})}, dus, 0});
  c.push_back({"f32[4,5] update [2,2] at (-3,1) clamped", {input({4, 5}, F32, g), input({2, 2}, F32, g), fixed({2}, I64, {-3, 1})}, dus, 0});
  c.push_back({"f32[3,4,5] permuted base, strided update", {input({3, 4, 5}, F32, g, L::Permuted), input({2, 2, 3}, F32, g, L::Strided), fixed({3}, I64, {1, 1, 2})}, dus, 0});
  c.push_back({"f32[4,5] update [0,2]", {input({4, 5}, F32, g), input({0, 2}, F32, g), fixed({2}, I64, {1, 1})}, dus, 0});
  c.push_back({"f32[4,5] update [4,5] (whole)", {input({4, 5}, F32, g), input({4, 5}, F32, g, L::Expanded), fixed({2}, I64, {0, 0})}, dus, 0});
  c.push_back({"f32[2,5000] update [1,3000]", {input({2, 5000}, F32, g), input({1, 3000}, F32, g), fixed({2}, I64, {1, 1999})}, dus, 0});
  c.push_back({"f32[5,6] update [2,3] grad", {input({5, 6}, F32, g, L::Strided, true), input({2, 3}, F32, g, L::Contiguous, true), fixed({2}, I64, {2, 1})}, dus});
  c.push_back({"f32[4,4] update [3,2] clamped grad", {input({4, 4}, F32, g, L::Contiguous, true), input({3, 2}, F32, g, L::Contiguous, true), fixed({2}, I64, {3, 3})}, dus});
  return c;
}

std::vector<Case> reverse_cases(Rng& r) {
  auto fl = [](std::vector<int64_t> d) { return [d](const Tensor& x) { return flip(x, d); }; };
  Gen g = uniform(-2, 2);
  std::vector<Case> c;
  for (DType t : {F32, F64, F16, I32, I64, B}) {
    Shape s = odd_shape(r, 3);
    c.push_back(one(variant_name(t, s, "dims 0,2"), input(s, t, ints_for(t, g)), fl({0, 2}), 0));
  }
  Shape s = odd_shape(r, 3);
  c.push_back(one(variant_name(F32, s, "permuted dim 1"), input(s, F32, g, L::Permuted), fl({1}), 0));
  c.push_back(one(variant_name(F32, s, "strided dims 0,1,2"), input(s, F32, g, L::Strided), fl({0, 1, 2}), 0));
  c.push_back(one(variant_name(F32, s, "expanded dim 2"), input(s, F32, g, L::Expanded), fl({2}), 0));
  c.push_back(one("f32[3,0,4] dim 2", input({3, 0, 4}, F32, g), fl({2}), 0));
  c.push_back(one("f32[3,5,307] dim 2", input({3, 5, 307}, F32, g), fl({2}), 0));
  c.push_back(one("f32[4,5,3] strided dim 1 grad", input({4, 5, 3}, F32, g, L::Strided, true), fl({1})));
  c.push_back(one("f32[3,4,2] dims 0,2 grad", input({3, 4, 2}, F32, g, L::Permuted, true), fl({0, 2})));
  return c;
}

// The general convolution through conv_general: 1-3 spatial dims, strides, padding (negative
// crops), lhs dilation (transposed convolutions), kernel dilation, groups.
std::vector<Case> conv_cases() {
  using O = ConvGeneralOptions;
  auto cv = [](O o) { return [o](const Tensor& x, const Tensor& w) { return conv_general(x, w, o); }; };
  auto cc = [&](std::string v, Input x, Input w, O o) { return two(std::move(v), std::move(x), std::move(w), cv(o), 2e-5); };
  Gen g = uniform(-1, 1);
  std::vector<Case> c;
  c.push_back(cc("f32 x[2,3,9] w[4,3,3]", input({2, 3, 9}, F32, g), input({4, 3, 3}, F32, g), {}));
  c.push_back(cc("f64 x[2,3,7,6] w[5,3,3,2] stride 2 pad 1", input({2, 3, 7, 6}, F64, g), input({5, 3, 3, 2}, F64, g), {{2}, {1}, {1}, {}, {}, 1}));
  c.push_back(cc("f32 x[1,4,6,7] w[6,2,3,3] groups 2 dilation 2", input({1, 4, 6, 7}, F32, g), input({6, 2, 3, 3}, F32, g), {{}, {2}, {1}, {}, {2}, 2}));
  c.push_back(cc("f32 x[2,2,4,5] w[3,2,3,3] lhs dilation 2 (transposed)", input({2, 2, 4, 5}, F32, g), input({3, 2, 3, 3}, F32, g), {{}, {2}, {2}, {2}, {}, 1}));
  c.push_back(cc("f32 x[1,2,8,8] w[2,2,2,2] crop -1", input({1, 2, 8, 8}, F32, g), input({2, 2, 2, 2}, F32, g), {{}, {-1}, {0}, {}, {}, 1}));
  c.push_back(cc("f32 x[1,2,4,4,5] w[3,2,2,3,2] (3-d)", input({1, 2, 4, 4, 5}, F32, g), input({3, 2, 2, 3, 2}, F32, g), {}));
  c.push_back(two("f32 x[2,3,7,6] w[4,3,3,3] pad 1 bf16 autocast grad", input({2, 3, 7, 6}, F32, g, L::Contiguous, true),
                  input({4, 3, 3, 3}, F32, g, L::Contiguous, true),
                  [](const Tensor& x, const Tensor& w) {
                    Autocast ac{BF16};
                    return conv_general(x, w, {{}, {1}, {1}, {}, {}, 1});
                  },
                  -1));
  c.push_back(cc("f32 x[3,3,5,6] permuted, w strided", input({3, 3, 5, 6}, F32, g, L::Permuted), input({4, 3, 3, 3}, F32, g, L::Strided), {{1, 2}, {1}, {0}, {}, {}, 1}));
  c.push_back(cc("f32 x[0,2,5] w[3,2,2] (empty batch)", input({0, 2, 5}, F32, g), input({3, 2, 2}, F32, g), {}));
  c.push_back(cc("f32 x[2,8,20,20] w[8,8,3,3]", input({2, 8, 20, 20}, F32, g), input({8, 8, 3, 3}, F32, g), {{}, {1}, {1}, {}, {}, 1}));
  Case gr = cc("f32 x[2,4,6,5] w[4,2,3,2] stride 2 groups 2 grad", input({2, 4, 6, 5}, F32, g, L::Strided, true),
               input({4, 2, 3, 2}, F32, g, L::Contiguous, true), {{2}, {1}, {0}, {}, {}, 2});
  gr.tol = -1;
  c.push_back(gr);
  Case gt = cc("f32 x[1,3,4,4] w[2,3,2,2] lhs dilation 2, dilation 2 grad", input({1, 3, 4, 4}, F32, g, L::Contiguous, true),
               input({2, 3, 2, 2}, F32, g, L::Permuted, true), {{}, {1}, {1}, {2}, {2}, 1});
  gt.tol = -1;
  c.push_back(gt);
  return c;
}

// ---- sources ----
std::vector<Case> leaf_cases() {
  // Graph inputs of every dtype at odd byte counts, read by a Step (a copy of a slice).
  std::vector<Case> c;
  for (DType t : {F32, F64, F16, BF16, I32, I64, B})
    for (int64_t n : {2, 1027}) c.push_back(one(variant_name(t, {n}, "[1:]"), input({n}, t, ints_for(t, uniform(-5, 5))), [](const Tensor& x) { return x.slice(0, 1, x.size(0)); }, 0));
  c.push_back(one("f32[3,5] read twice", input({3, 5}, F32, uniform(-1, 1)), [](const Tensor& x) { return x.slice(1, 1, 5) + x.slice(1, 0, 4); }));
  return c;
}

Fn outputs(std::function<Tensor(const Context&)> f) {
  return [f](const std::vector<Tensor>&, const Context& ctx) { return std::vector<Tensor>{f(ctx)}; };
}

std::vector<Case> full_cases() {
  std::vector<Case> c;
  for (DType t : {F32, F64, F16, BF16, I32, I64, B}) {
    double v = t == B ? 1 : is_floating(t) ? -2.5 : 7;
    c.push_back({variant_name(t, {3, 5}, "value " + std::to_string(v)), {}, outputs([t, v](const Context& x) { return full({3, 5}, v, x.opts(t)); }), 0});
  }
  for (double v : {-0.0, double(INFINITY), double(NAN)})
    for (DType t : {F32, F64})
      c.push_back({variant_name(t, {4}, "value " + std::to_string(v)), {}, outputs([t, v](const Context& x) { return full({4}, v, x.opts(t)); }), 0});
  c.push_back({"f32[0,4]", {}, outputs([](const Context& x) { return full({0, 4}, 1, x.opts(F32)); }), 0});
  c.push_back({"f32[]", {}, outputs([](const Context& x) { return full({}, 3, x.opts(F32)); }), 0});
  c.push_back({"f32[5000]", {}, outputs([](const Context& x) { return full({5000}, 0.25, x.opts(F32)); }), 0});
  return c;
}

std::vector<Case> iota_cases() {
  auto iota = [](Shape s, int64_t axis, DType t) {
    return outputs([s, axis, t](const Context& x) {
      return detail::from_node(ir::make(Op::Iota, {}, ir::Attrs{{axis}, 0}, &s, t, x.device));
    });
  };
  std::vector<Case> c;
  for (DType t : {I64, I32, F32, F64, F16}) c.push_back({variant_name(t, {3, 4, 5}, "axis 2"), {}, iota({3, 4, 5}, 2, t), 0});
  c.push_back({"i64[3,4,5] axis 0", {}, iota({3, 4, 5}, 0, I64), 0});
  c.push_back({"i64[3,4,5] axis 1", {}, iota({3, 4, 5}, 1, I64), 0});
  c.push_back({"i64[0,3] axis 1", {}, iota({0, 3}, 1, I64), 0});
  c.push_back({"f32[6000] axis 0", {}, iota({6000}, 0, F32), 0});
  c.push_back({"arange(1, 20, 3) f32", {}, outputs([](const Context& x) { return arange(1, 20, 3, x.opts(F32)); }), 0});
  c.push_back({"arange(7) i64", {}, outputs([](const Context& x) { return arange(7, x.opts(I64)); }), 0});
  return c;
}

std::vector<Case> rng_cases() {
  std::vector<Case> c;
  for (DType t : {F32, F64, F16, BF16}) {
    c.push_back({variant_name(t, {5, 7}, "uniform"), {}, outputs([t](const Context& x) { return rand({5, 7}, x.opts(t)); })});
    c.push_back({variant_name(t, {5, 7}, "normal"), {}, outputs([t](const Context& x) { return randn({5, 7}, x.opts(t)); })});
  }
  c.push_back({"f32[0,3] uniform", {}, outputs([](const Context& x) { return rand({0, 3}, x.opts(F32)); })});
  c.push_back({"f32[5001] normal", {}, outputs([](const Context& x) { return randn({5001}, x.opts(F32)); })});
  c.push_back({"f32[64] uniform + f32[64] normal (two draws)", {}, [](const std::vector<Tensor>&, const Context& x) {
                 return std::vector<Tensor>{rand({64}, x.opts(F32)), randn({64}, x.opts(F32))};
               }});
  return c;
}

}  // namespace

std::vector<Case> primitive_cases(Op op) {
  Rng r(uint32_t(op) * 7919u + 17);  // shapes differ per primitive, fixed per build
  std::vector<Case> c;
  const std::vector<DType> floats = {F32, F64, F16, BF16}, all_num = {F32, F64, F16, BF16, I32, I64};
  switch (op) {
    case Op::Leaf: c = leaf_cases(); break;
    case Op::Full: c = full_cases(); break;
    case Op::Iota: c = iota_cases(); break;
    case Op::Rng: c = rng_cases(); break;
    case Op::Cast: c = cast_cases(r); break;
    case Op::Neg: case Op::Abs: c = unary_cases(op, {all_num, uniform(-3, 3), true, true}, r); break;
    case Op::Sign: c = unary_cases(op, {all_num, integers(-2, 2), true, true}, r); break;
    case Op::Floor: case Op::Ceil: c = unary_cases(op, {all_num, off_grid(-5, 5), true, true}, r); break;
    case Op::Round: {
      c = unary_cases(op, {all_num, off_grid(-5, 5), true, true}, r);
      c.push_back(one("f32[8] halves (to even)", fixed({8}, F32, {-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 1e7 + 0.5}),
                      [](const Tensor& x) { return round(x); }, 0));
      break;
    }
    case Op::Exp: c = unary_cases(op, {floats, uniform(-4, 4), false, true}, r); break;
    case Op::Log: case Op::Sqrt: c = unary_cases(op, {floats, uniform(0.05, 5), false, true}, r); break;
    case Op::Tanh: case Op::Erf: c = unary_cases(op, {floats, uniform(-3, 3), false, true}, r); break;
    case Op::Sin: case Op::Cos: c = unary_cases(op, {floats, uniform(-4, 4), false, true}, r); break;
    case Op::Add: case Op::Sub: case Op::Mul: c = binary_cases(op, {all_num, uniform(-3, 3), uniform(-3, 3), false}, r); break;
    case Op::Maximum: case Op::Minimum: {
      std::vector<DType> d = all_num;
      d.push_back(B);
      c = binary_cases(op, {d, integers(-3, 3), uniform(-3, 3), true}, r);
      break;
    }
    case Op::Div: c = binary_cases(op, {floats, uniform(-3, 3), away_from_zero(-3, 3), false}, r); break;
    case Op::Pow: {
      c = binary_cases(op, {floats, uniform(0.2, 3), uniform(-2, 2), false}, r);
      c.push_back(one("f32[4,5] ^ 2.5 grad", input({4, 5}, F32, uniform(0.2, 3), L::Strided, true), [](const Tensor& x) { return pow(x, 2.5); }));
      c.push_back(one("2 ^ f64[3,4] grad", input({3, 4}, F32, uniform(-2, 2), L::Contiguous, true), [](const Tensor& x) { return pow(2.0, x); }));
      break;
    }
    case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge: {
      std::vector<DType> d = all_num;
      d.push_back(B);
      c = binary_cases(op, {d, integers(-2, 2), integers(-2, 2), true}, r);
      break;
    }
    case Op::Where: c = where_cases(r); break;
    case Op::ReduceSum: c = reduce_cases(false, r); break;
    case Op::ReduceMax: c = reduce_cases(true, r); break;
    case Op::Reshape: c = reshape_cases(); break;
    case Op::Permute: c = permute_cases(r); break;
    case Op::Expand: c = expand_cases(); break;
    case Op::Slice: c = slice_cases(); break;
    case Op::Pad: c = pad_cases(); break;
    case Op::Concat: c = concat_cases(); break;
    case Op::Matmul: c = matmul_cases(r); break;
    case Op::Gather: c = gather_cases(); break;
    case Op::ScatterAdd: c = scatter_add_cases(); break;
    case Op::DynamicUpdateSlice: c = dus_cases(); break;
    case Op::Reverse: c = reverse_cases(r); break;
    case Op::Conv: c = conv_cases(); break;
    case Op::AllReduce: case Op::AllGather: case Op::ReduceScatter: case Op::AllToAll: case Op::Broadcast:
    case Op::Reduce: case Op::CollectivePermute:
      c = collective_cases(op);
      break;
    case Op::Count_: break;
  }
  for (Case& k : c) k.primitive = op;
  return c;
}

}  // namespace tessera::conformance
