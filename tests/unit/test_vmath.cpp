// Accuracy of the vectorized float32 kernels in backends/cpu/vmath.h against libm in double,
// rounded to float: every result within 2 ulp of the correctly rounded one, special values exact,
// over a stratified sample of all 2^32 bit patterns plus a dense sweep of the range each function
// works in. TESSERA_VMATH_EXHAUSTIVE=1 checks all 2^32 inputs of each function instead (minutes).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "backends/cpu/vmath.h"

namespace tessera {
namespace {

using ArrayFn = void (*)(const float*, float*, int64_t);
using RefFn = double (*)(double);

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kMin = std::numeric_limits<float>::min();          // smallest normal
constexpr float kDen = std::numeric_limits<float>::denorm_min();
constexpr float kMax = std::numeric_limits<float>::max();

// Distance in representable floats (-0 and 0 count as the same point).
int64_t ulp_distance(float a, float b) {
  auto key = [](float x) {
    int64_t i = std::bit_cast<int32_t>(x);
    return i < 0 ? int64_t(INT32_MIN) - i : i;
  };
  return std::llabs(key(a) - key(b));
}

// |y - exact| in ulps of the float format at the exact value (for reporting).
double ulp_error(float y, double exact) {
  double a = std::fabs(exact);
  int e = 0;
  std::frexp(a, &e);
  double ulp = a < 0x1p-126 ? 0x1p-149 : std::ldexp(1.0, e - 24);
  return std::fabs(double(y) - exact) / ulp;
}

struct Stats {
  int64_t checked = 0, failures = 0, max_dist = 0;
  double max_err = 0;
  float max_err_at = 0;
};

// Runs f over inputs (in blocks, as the backend does) and compares each result with ref.
void check(const char* name, ArrayFn f, RefFn ref, const std::vector<float>& in, Stats& s) {
  std::vector<float> out(in.size());
  f(in.data(), out.data(), int64_t(in.size()));
  for (size_t i = 0; i < in.size(); ++i) {
    float x = in[i], y = out[i];
    double exact = ref(double(x));
    float want = float(exact);
    ++s.checked;
    bool ok;
    if (std::isnan(want) || std::isnan(y)) {
      ok = std::isnan(want) && std::isnan(y);
    } else if (std::isinf(want) || std::isinf(y)) {
      ok = want == y;
    } else {
      int64_t d = ulp_distance(y, want);
      if (d > s.max_dist) s.max_dist = d;
      double e = ulp_error(y, exact);
      if (e > s.max_err) s.max_err = e, s.max_err_at = x;
      ok = d <= 2;
    }
    if (!ok && s.failures++ < 10)
      ADD_FAILURE() << name << "(" << std::hexfloat << x << ") = " << y << ", want " << want << " ("
                    << exact << ")";
  }
}

// Every `stride`-th bit pattern from `offset`, plus `dense` inputs in [lo, hi] evenly spaced in their
// bit patterns (so in every binade alike) and `dense` more evenly spaced in value.
std::vector<float> stratified(uint32_t stride, uint32_t offset, float lo, float hi, uint32_t dense) {
  std::vector<float> v;
  for (uint64_t b = offset; b < (uint64_t(1) << 32); b += stride) v.push_back(std::bit_cast<float>(uint32_t(b)));
  auto sweep = [&](float a, float b, uint32_t count) {  // a..b, for 0 <= a < b
    uint32_t ua = std::bit_cast<uint32_t>(a), ub = std::bit_cast<uint32_t>(b);
    uint64_t step = std::max<uint64_t>(1, (uint64_t(ub) - ua) / count);
    for (uint64_t u = ua; u <= ub; u += step) v.push_back(std::bit_cast<float>(uint32_t(u)));
  };
  auto negated_sweep = [&](float a, float b, uint32_t count) {  // -b..-a, for 0 <= a < b
    size_t from = v.size();
    sweep(a, b, count);
    for (size_t i = from; i < v.size(); ++i) v[i] = -v[i];
  };
  if (lo < 0 && hi > 0) {
    negated_sweep(0.0f, -lo, dense / 2);
    sweep(0.0f, hi, dense / 2);
  } else if (lo >= 0) {
    sweep(lo, hi, dense);
  } else {
    negated_sweep(-hi, -lo, dense);
  }
  for (uint32_t k = 0; k <= dense; ++k) v.push_back(float(lo + (double(hi) - lo) * k / dense));  // evenly in value
  return v;
}

Stats run_sample(const char* name, ArrayFn f, RefFn ref, float lo, float hi) {
  Stats s;
  check(name, f, ref, stratified(1021, 7, lo, hi, 1u << 21), s);
  std::printf("%-5s %lld inputs: max %.3f ulp (at %a), max %lld ulp from the rounded result\n", name,
              (long long)s.checked, s.max_err, s.max_err_at, (long long)s.max_dist);
  return s;
}

double ref_exp(double x) { return std::exp(x); }
double ref_log(double x) { return std::log(x); }
double ref_tanh(double x) { return std::tanh(x); }
double ref_erf(double x) { return std::erf(x); }

TEST(VMath, ExpAccuracy) { EXPECT_EQ(run_sample("exp", vmath::vexp, ref_exp, -104.0f, 89.0f).failures, 0); }
TEST(VMath, LogAccuracy) { EXPECT_EQ(run_sample("log", vmath::vlog, ref_log, kDen, kMax).failures, 0); }
TEST(VMath, TanhAccuracy) { EXPECT_EQ(run_sample("tanh", vmath::vtanh, ref_tanh, -10.0f, 10.0f).failures, 0); }
TEST(VMath, ErfAccuracy) { EXPECT_EQ(run_sample("erf", vmath::verf, ref_erf, -4.0f, 4.0f).failures, 0); }

// Elementwise, on a single-element array.
float one(ArrayFn f, float x) {
  float y;
  f(&x, &y, 1);
  return y;
}

// Same value, same sign (so -0 != 0), NaN == NaN.
#define EXPECT_SAME(got, want)                                                            \
  do {                                                                                    \
    float g_ = (got), w_ = (want);                                                        \
    if (std::isnan(w_)) EXPECT_TRUE(std::isnan(g_)) << #got << " = " << g_;               \
    else EXPECT_TRUE(g_ == w_ && std::signbit(g_) == std::signbit(w_)) << #got << " = " \
                                                                         << std::hexfloat << g_; \
  } while (0)
// Within 1 ulp of the double-precision value rounded to float.
#define EXPECT_CLOSE(got, exact) EXPECT_LE(ulp_distance((got), float(exact)), 1) << #got << " = " << std::hexfloat << (got)

TEST(VMath, SpecialValues) {
  using namespace vmath;
  EXPECT_SAME(one(vexp, kNaN), kNaN);
  EXPECT_SAME(one(vexp, -kNaN), kNaN);
  EXPECT_SAME(one(vexp, kInf), kInf);
  EXPECT_SAME(one(vexp, -kInf), 0.0f);
  EXPECT_SAME(one(vexp, 0.0f), 1.0f);
  EXPECT_SAME(one(vexp, -0.0f), 1.0f);
  EXPECT_CLOSE(one(vexp, 1.0f), std::exp(1.0));
  EXPECT_SAME(one(vexp, 89.0f), kInf);
  EXPECT_SAME(one(vexp, 1000.0f), kInf);
  EXPECT_SAME(one(vexp, kMax), kInf);
  EXPECT_CLOSE(one(vexp, 0x1.62e42ep+6f), std::exp(0x1.62e42ep+6));  // largest x with a finite result
  EXPECT_LT(one(vexp, 0x1.62e42ep+6f), kInf);
  EXPECT_SAME(one(vexp, 0x1.62e430p+6f), kInf);
  EXPECT_SAME(one(vexp, -0x1.9fe368p+6f), kDen);  // smallest x with a non-zero result
  EXPECT_SAME(one(vexp, -0x1.9fe36ap+6f), 0.0f);
  EXPECT_CLOSE(one(vexp, -0x1.5d589ep+6f), std::exp(-0x1.5d589ep+6));  // near FLT_MIN
  EXPECT_CLOSE(one(vexp, -0x1.9cp+6f), std::exp(-0x1.9cp+6));  // denormal results
  EXPECT_CLOSE(one(vexp, -0x1.8p+6f), std::exp(-0x1.8p+6));
  EXPECT_SAME(one(vexp, -1000.0f), 0.0f);
  EXPECT_SAME(one(vexp, -kMax), 0.0f);
  EXPECT_SAME(one(vexp, kDen), 1.0f);

  EXPECT_SAME(one(vlog, kNaN), kNaN);
  EXPECT_SAME(one(vlog, kInf), kInf);
  EXPECT_SAME(one(vlog, -kInf), kNaN);
  EXPECT_SAME(one(vlog, 0.0f), -kInf);
  EXPECT_SAME(one(vlog, -0.0f), -kInf);
  EXPECT_SAME(one(vlog, -1.0f), kNaN);
  EXPECT_SAME(one(vlog, -kDen), kNaN);
  EXPECT_SAME(one(vlog, 1.0f), 0.0f);
  EXPECT_CLOSE(one(vlog, kDen), std::log(double(kDen)));
  EXPECT_CLOSE(one(vlog, kMin), std::log(double(kMin)));
  EXPECT_CLOSE(one(vlog, kMax), std::log(double(kMax)));
  EXPECT_CLOSE(one(vlog, 2.0f), std::log(2.0));

  for (ArrayFn f : {vtanh, verf}) {
    EXPECT_SAME(one(f, kNaN), kNaN);
    EXPECT_SAME(one(f, -kNaN), kNaN);
    EXPECT_SAME(one(f, kInf), 1.0f);
    EXPECT_SAME(one(f, -kInf), -1.0f);
    EXPECT_SAME(one(f, kMax), 1.0f);
    EXPECT_SAME(one(f, -kMax), -1.0f);
    EXPECT_SAME(one(f, 50.0f), 1.0f);
    EXPECT_SAME(one(f, -50.0f), -1.0f);
    EXPECT_SAME(one(f, 10.0f), 1.0f);
    EXPECT_SAME(one(f, -10.0f), -1.0f);
    EXPECT_SAME(one(f, 0.0f), 0.0f);
    EXPECT_SAME(one(f, -0.0f), -0.0f);
  }
  EXPECT_SAME(one(vtanh, kDen), kDen);
  EXPECT_SAME(one(vtanh, -kMin), -kMin);
  EXPECT_SAME(one(vtanh, 0x1p-20f), 0x1p-20f);
  EXPECT_CLOSE(one(verf, 0x1p-20f), std::erf(0x1p-20));
  EXPECT_CLOSE(one(verf, -kMin), std::erf(-double(kMin)));
  EXPECT_CLOSE(one(verf, kDen), std::erf(double(kDen)));
  EXPECT_SAME(one(verf, 4.0f), 1.0f);
  EXPECT_SAME(one(verf, 3.92f), 1.0f);
}

// Lengths that are not a multiple of the block, and out == a.
TEST(VMath, ArraysAnyLengthAndInPlace) {
  using namespace vmath;
  for (ArrayFn f : {vexp, vlog, vtanh, verf}) {
    for (int64_t n : {0, 1, 7, 15, 16, 17, 31, 33, 100, 1024}) {
      std::vector<float> a(size_t(n) + 1), out(size_t(n) + 1, -7.0f);
      for (int64_t i = 0; i < n; ++i) a[size_t(i)] = 0.37f * float(i) - 3.0f;
      f(a.data(), out.data(), n);
      for (int64_t i = 0; i < n; ++i) EXPECT_SAME(out[size_t(i)], one(f, a[size_t(i)]));
      EXPECT_EQ(out[size_t(n)], -7.0f) << "wrote past the end, n = " << n;
      std::vector<float> b = a;
      f(b.data(), b.data(), n);
      for (int64_t i = 0; i < n; ++i) EXPECT_SAME(b[size_t(i)], out[size_t(i)]);
    }
  }
}

TEST(VMath, Exhaustive) {
  const char* env = std::getenv("TESSERA_VMATH_EXHAUSTIVE");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set TESSERA_VMATH_EXHAUSTIVE=1 to check all 2^32 inputs";
  struct { const char* name; ArrayFn f; RefFn ref; } fns[] = {
      {"exp", vmath::vexp, ref_exp}, {"log", vmath::vlog, ref_log},
      {"tanh", vmath::vtanh, ref_tanh}, {"erf", vmath::verf, ref_erf}};
  for (auto& fn : fns) {
    Stats s;
    std::vector<float> in(1 << 20);
    for (uint64_t base = 0; base < (uint64_t(1) << 32); base += in.size()) {
      for (size_t i = 0; i < in.size(); ++i) in[i] = std::bit_cast<float>(uint32_t(base + i));
      check(fn.name, fn.f, fn.ref, in, s);
    }
    std::printf("%-5s all 2^32 inputs: max %.4f ulp (at %a), max %lld ulp from the rounded result\n", fn.name,
                s.max_err, s.max_err_at, (long long)s.max_dist);
    EXPECT_EQ(s.failures, 0) << fn.name;
  }
}

}  // namespace
}  // namespace tessera
