// Loop-vectorizable float32 math over arrays: vexp, vlog, vtanh, verf.
//
// libm's expf/logf/tanhf/erff are scalar calls that GCC cannot vectorize, and they dominate
// elementwise time (softmax: exp, GELU: erf, ...). Each function here is a plain loop over an
// inline, branch-free kernel (range reduction, a polynomial, selects for special values, exponent
// built with integer bit operations), which GCC 12 vectorizes at -O2 and -O3 for AVX2 (also for
// plain x86-64 SSE2 and for AVX-512).
//
// Accuracy, against libm in double over all 2^32 inputs (tests/unit/test_vmath.cpp, with
// TESSERA_VMATH_EXHAUSTIVE=1), x86-64 with FMA: max error exp 1.009 ulp, log 0.852, tanh 0.971,
// erf 1.017; every result within 1 ulp of the correctly rounded float; special values exact
// (NaN in -> NaN; exp: +inf, 0 on overflow/underflow; log: log(+-0) = -inf, log(x < 0) = NaN,
// log(inf) = inf; tanh, erf: +-1 for large |x|, -0 kept). Denormal inputs and results are
// computed, not flushed (unless the caller runs with FTZ/DAZ set). Without FMA hardware (dense
// check of the working ranges) max errors are 1.32 ulp (erf), 1.14 (tanh), 0.97 (exp), 0.87 (log);
// -ffp-contract makes no difference (each step that must be exact is exact either way).
//
// Polynomials: coefficients are weighted minimax fits (Remez exchange in 40-digit arithmetic) of
// the function named beside each, rounded to float. The arrays may alias exactly (out == a) but
// must not partially overlap.
//
// No vsin/vcos: nothing in training sends sin/cos through the backend (the GPT has learned
// positions), and exact float sin/cos for large arguments needs a multi-word reduction by pi/2.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace tessera::vmath {
namespace detail {

#define TESSERA_VMATH_INLINE [[gnu::always_inline]] inline

// a * b + c, fused where the target has FMA (a single instruction); else two roundings.
TESSERA_VMATH_INLINE float fma_(float a, float b, float c) {
#if defined(__FMA__) || defined(__aarch64__)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}
TESSERA_VMATH_INLINE uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }
TESSERA_VMATH_INLINE float from_bits(uint32_t u) { return std::bit_cast<float>(u); }
// c ? a : b without control flow: a branch-free form stays vectorizable where GCC, honouring
// -ftrapping-math, would not if-convert arithmetic that feeds only one side of a ?: select.
TESSERA_VMATH_INLINE float select(bool c, float a, float b) {
  return from_bits(bits(b) ^ ((bits(a) ^ bits(b)) & (0u - uint32_t(c))));
}
TESSERA_VMATH_INLINE float abs_(float x) { return from_bits(bits(x) & 0x7fffffffu); }
// |r| with the sign bit of x (r must be non-negative).
TESSERA_VMATH_INLINE float with_sign_of(float r, float x) { return from_bits(bits(r) | (bits(x) & 0x80000000u)); }

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kShift = 0x1.8p23f;       // x + kShift rounds x to an integer, held in the low bits
constexpr float kLog2e = 0x1.715476p0f;
constexpr float kLn2Hi = 0x1.62e4p-1f;     // 16 significant bits: k * kLn2Hi is exact for |k| < 2^8
constexpr float kLn2Lo = 0x1.7f7d1cp-20f;  // ln 2 - kLn2Hi

// e^r - 1 - r ~= r^2 * P(r) on |r| <= ln2/2; relative error of 1 + r + r^2 P(r) vs e^r: 2^-28.3.
// (The coefficients, highest degree first, are shared with the native loops' exp: jit_x86.cpp.)
constexpr float kExpP[5] = {0x1.6a20ecp-10f, 0x1.1239eep-7f, 0x1.5558f6p-5f, 0x1.555492p-3f, 0x1.fffffcp-2f};
TESSERA_VMATH_INLINE float expm1_poly(float r) {
  float p = kExpP[0];
  p = fma_(p, r, kExpP[1]);
  p = fma_(p, r, kExpP[2]);
  p = fma_(p, r, kExpP[3]);
  p = fma_(p, r, kExpP[4]);
  return fma_(r * r, p, r);
}

// x = k ln2 + r with |r| <= ln2/2 (k returned as the bits offset of t). Exact for |x| < 2^7:
// the first step is exact, the second rounds once, far below the result's half ulp.
TESSERA_VMATH_INLINE float exp_reduce(float x, uint32_t& k) {
  float t = fma_(x, kLog2e, kShift);
  float kf = t - kShift;
  k = bits(t) - bits(kShift);
  float r = fma_(kf, -kLn2Hi, x);
  return fma_(kf, -kLn2Lo, r);
}

// e^x for x in [-87, 88] (results normal); no special values. Used inside tanh and erf.
TESSERA_VMATH_INLINE float exp_normal(float x) {
  uint32_t k;
  float y = expm1_poly(exp_reduce(x, k));
  float s = from_bits((k + 127u) << 23);  // 2^k
  return fma_(y, s, s);
}

TESSERA_VMATH_INLINE float exp1(float x) {
  // Clamp (NaN passes through): below -104 the result rounds to 0, above 89 to +inf.
  x = select(x < -104.0f, -104.0f, x);
  x = select(x > 89.0f, 89.0f, x);
  uint32_t k;
  float y = expm1_poly(exp_reduce(x, k));
  // 2^k as 2^k1 * 2^k2, both normal for k in [-150, 128]: the first product is exact, the
  // second rounds once (to a denormal, or to +inf on overflow).
  uint32_t k1 = uint32_t(int32_t(k) >> 1), k2 = k - k1;
  float s1 = from_bits((k1 + 127u) << 23), s2 = from_bits((k2 + 127u) << 23);
  return fma_(y, s1, s1) * s2;
}

// log(1 + f) - f + f^2/2 ~= f^3 * P(f) on f in [sqrt(1/2) - 1, sqrt(2) - 1]; rel. error 2^-30.3.
TESSERA_VMATH_INLINE float log1p_tail(float f) {
  float p = 0x1.1457a2p-4f;
  p = fma_(p, f, -0x1.de404ap-4f);
  p = fma_(p, f, 0x1.e6f2acp-4f);
  p = fma_(p, f, -0x1.fc218cp-4f);
  p = fma_(p, f, 0x1.23373cp-3f);
  p = fma_(p, f, -0x1.555c4ep-3f);
  p = fma_(p, f, 0x1.99a4b8p-3f);
  p = fma_(p, f, -0x1.000006p-2f);
  p = fma_(p, f, 0x1.555548p-2f);
  return (f * f) * fma_(f, p, -0.5f);  // f^2 (f P(f) - 1/2)
}

TESSERA_VMATH_INLINE float log1(float x) {
  bool tiny = x < 0x1p-126f;                 // denormal (or zero, or negative)
  float xs = select(tiny, x * 0x1p23f, x);
  // x = 2^e * m with m in [sqrt(1/2), sqrt(2)): subtracting the bits of sqrt(1/2) carries into
  // the exponent field exactly when the mantissa is below sqrt(2)'s.
  constexpr uint32_t kSqrtHalf = 0x3f3504f3u;
  uint32_t u = bits(xs) - kSqrtHalf;
  float e = float(int32_t(u) >> 23) - select(tiny, 23.0f, 0.0f);
  float f = from_bits((u & 0x007fffffu) + kSqrtHalf) - 1.0f;  // exact
  // log x = e ln2_hi + f + (tail + e ln2_lo), the first sum kept exactly as s + err (Fast2Sum:
  // |e ln2_hi| >= ln2 > |f| unless e == 0, and e ln2_hi is exact).
  float a = e * kLn2Hi;
  float s = a + f;
  float err = f - (s - a);
  float r = s + (fma_(e, kLn2Lo, log1p_tail(f)) + err);
  r = select(x < 0.0f, kNaN, r);
  r = select(x == 0.0f, -kInf, r);
  return select(x < kInf, r, x);  // +inf stays +inf, NaN stays NaN
}

// |x| < 1: tanh(x) = x + x^3 P(x^2), P fitted to (tanh(x) - x) / x^3 (relative error of tanh 2^-30.4).
constexpr float kTanhSmall = 1.0f;
TESSERA_VMATH_INLINE float tanh1(float x) {
  float ax = abs_(x);
  float z = ax * ax;
  float p = 0x1.f939b8p-14f;
  p = fma_(p, z, -0x1.b8037ap-11f);
  p = fma_(p, z, 0x1.93a64ap-9f);
  p = fma_(p, z, -0x1.19cd48p-7f);
  p = fma_(p, z, 0x1.64fe1cp-6f);
  p = fma_(p, z, -0x1.b9ff76p-5f);
  p = fma_(p, z, 0x1.111086p-3f);
  p = fma_(p, z, -0x1.555554p-2f);
  float small = fma_(ax, z * p, ax);
  // |x| >= 1: 1 - 2 / (e^2|x| + 1), where 2 / (e^2|x| + 1) <= 0.24 keeps its error small in the
  // result. tanh rounds to 1 from |x| = 9.011 on; clamping at 10 keeps e^2|x| finite.
  float v = select(ax > 10.0f, 20.0f, ax + ax);
  float large = 1.0f - 2.0f / (exp_normal(v) + 1.0f);
  return with_sign_of(select(ax < kTanhSmall, small, large), x);
}

// |x| < 1: erf(x) = x + x Q(x^2), Q fitted to (erf(x) - x) / x (relative error of erf 2^-29.6).
// |x| >= 1: erf(x) = 1 - e^(-x^2 + H(x)), H fitted to log(erfc(x)) + x^2, a slowly varying
// function, as a polynomial in x - 2.5 on [1, 4] (absolute error of erf 2^-27, weighted by erfc).
constexpr float kErfSmall = 1.0f;
constexpr float kErfQ[7] = {0x1.496a32p-14f, -0x1.a3f7p-11f, 0x1.5405b2p-8f, -0x1.b7f90ep-6f,
                            0x1.ce2cf8p-4f,  -0x1.81273ep-2f, 0x1.06eba8p-3f};
constexpr float kErfH[8] = {-0x1.06c5b8p-16f, 0x1.5ca406p-14f, -0x1.afcca8p-12f, 0x1.1b1098p-9f,
                            -0x1.6413eap-7f,  0x1.cba22ep-5f,  -0x1.6924a2p-2f,  -0x1.8e8b72p+0f};
TESSERA_VMATH_INLINE float erf1(float x) {
  float ax = abs_(x);
  float z = ax * ax;
  float q = kErfQ[0];
  q = fma_(q, z, kErfQ[1]);
  q = fma_(q, z, kErfQ[2]);
  q = fma_(q, z, kErfQ[3]);
  q = fma_(q, z, kErfQ[4]);
  q = fma_(q, z, kErfQ[5]);
  q = fma_(q, z, kErfQ[6]);
  float small = fma_(ax, q, ax);
  // erf rounds to 1 from |x| = 3.9192 on; clamp at 4 (NaN passes through).
  float xl = select(ax > 4.0f, 4.0f, ax);
  float u = xl - 2.5f;
  float h = kErfH[0];
  h = fma_(h, u, kErfH[1]);
  h = fma_(h, u, kErfH[2]);
  h = fma_(h, u, kErfH[3]);
  h = fma_(h, u, kErfH[4]);
  h = fma_(h, u, kErfH[5]);
  h = fma_(h, u, kErfH[6]);
  h = fma_(h, u, kErfH[7]);
  float large = 1.0f - exp_normal(fma_(-xl, xl, h));
  return with_sign_of(select(ax < kErfSmall, small, large), x);
}

// out[i] = F(a[i]), in blocks of 16 written through a local array: the inner loop has a fixed
// trip count and no aliasing to check, so GCC vectorizes it even under -O2's cost model, and
// out == a is fine (each block is read before it is written).
template <float (*F)(float)>
TESSERA_VMATH_INLINE void apply(const float* a, float* out, int64_t n) {
  constexpr int64_t B = 16;
  int64_t i = 0;
  for (; i + B <= n; i += B) {
    float y[B];
    for (int64_t j = 0; j < B; ++j) y[j] = F(a[i + j]);
    std::memcpy(out + i, y, sizeof y);
  }
  if (i < n) {
    float x[B] = {}, y[B];
    std::memcpy(x, a + i, size_t(n - i) * sizeof(float));
    for (int64_t j = 0; j < B; ++j) y[j] = F(x[j]);
    std::memcpy(out + i, y, size_t(n - i) * sizeof(float));
  }
}

#undef TESSERA_VMATH_INLINE
}  // namespace detail

inline void vexp(const float* a, float* out, int64_t n) { detail::apply<detail::exp1>(a, out, n); }
inline void vlog(const float* a, float* out, int64_t n) { detail::apply<detail::log1>(a, out, n); }
inline void vtanh(const float* a, float* out, int64_t n) { detail::apply<detail::tanh1>(a, out, n); }
inline void verf(const float* a, float* out, int64_t n) { detail::apply<detail::erf1>(a, out, n); }

}  // namespace tessera::vmath
