// ns per element of libm (std::exp/log/tanh/erf on float, one scalar call each) against the
// vectorized kernels of src/backends/cpu/vmath.h, on n = 1024 float arrays that stay in L1 (the
// CPU backend's tile size). Each figure is the median of 31 runs of 100 passes over the array,
// timed in thread CPU time so that other processes on a busy machine do not count.
// Standalone, not part of the CMake build:
//
//   g++ -O2 -march=native -mno-avx512f -std=c++20 -Isrc bench/vmath_bench.cpp -o /tmp/vmath_bench
//   /tmp/vmath_bench
//
// (-mno-avx512f as the project's own flags on GCC < 13; drop it to try AVX-512.)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>
#include <vector>

#include "backends/cpu/vmath.h"

namespace {

constexpr int64_t kN = 1024;
constexpr int kPasses = 100;
constexpr int kRuns = 31;

using ArrayFn = void (*)(const float*, float*, int64_t);

[[gnu::noinline]] void libm_exp(const float* a, float* o, int64_t n) { for (int64_t i = 0; i < n; ++i) o[i] = std::exp(a[i]); }
[[gnu::noinline]] void libm_log(const float* a, float* o, int64_t n) { for (int64_t i = 0; i < n; ++i) o[i] = std::log(a[i]); }
[[gnu::noinline]] void libm_tanh(const float* a, float* o, int64_t n) { for (int64_t i = 0; i < n; ++i) o[i] = std::tanh(a[i]); }
[[gnu::noinline]] void libm_erf(const float* a, float* o, int64_t n) { for (int64_t i = 0; i < n; ++i) o[i] = std::erf(a[i]); }
[[gnu::noinline]] void v_exp(const float* a, float* o, int64_t n) { tessera::vmath::vexp(a, o, n); }
[[gnu::noinline]] void v_log(const float* a, float* o, int64_t n) { tessera::vmath::vlog(a, o, n); }
[[gnu::noinline]] void v_tanh(const float* a, float* o, int64_t n) { tessera::vmath::vtanh(a, o, n); }
[[gnu::noinline]] void v_erf(const float* a, float* o, int64_t n) { tessera::vmath::verf(a, o, n); }

double thread_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e9 + double(ts.tv_nsec);
}

double ns_per_element(ArrayFn f, const std::vector<float>& in, std::vector<float>& out) {
  std::vector<double> t;
  f(in.data(), out.data(), kN);  // warm up
  for (int r = 0; r < kRuns; ++r) {
    double t0 = thread_ns();
    for (int p = 0; p < kPasses; ++p) {
      f(in.data(), out.data(), kN);
      asm volatile("" ::: "memory");  // keep every pass
    }
    t.push_back((thread_ns() - t0) / (double(kPasses) * kN));
  }
  std::nth_element(t.begin(), t.begin() + kRuns / 2, t.end());
  return t[kRuns / 2];
}

}  // namespace

int main() {
  struct Case {
    const char* name;
    float lo, hi;  // inputs uniform in [lo, hi): the range each sees in training
    ArrayFn libm, mine;
  } cases[] = {
      {"exp  [-20, 5)", -20.0f, 5.0f, libm_exp, v_exp},  // softmax: x - max <= 0
      {"log  (0, 10)", 1e-6f, 10.0f, libm_log, v_log},
      {"tanh [-5, 5)", -5.0f, 5.0f, libm_tanh, v_tanh},
      {"erf  [-4, 4)", -4.0f, 4.0f, libm_erf, v_erf},  // GELU: erf(x / sqrt 2)
  };
  std::mt19937 rng(1);
  std::vector<float> in(kN), out(kN);
  std::printf("%-16s %12s %12s %9s\n", "function", "libm ns/el", "vmath ns/el", "speedup");
  for (const Case& c : cases) {
    std::uniform_real_distribution<float> d(c.lo, c.hi);
    for (float& v : in) v = d(rng);
    double tl = ns_per_element(c.libm, in, out);
    double tv = ns_per_element(c.mine, in, out);
    std::printf("%-16s %12.3f %12.3f %8.1fx\n", c.name, tl, tv, tl / tv);
  }
  return 0;
}
