// The benchmark GPT step's float32 products, each in the layout the step runs it (forward X W^T,
// input gradients dY W, weight gradients dY^T X, attention's per-head products as 64 batches),
// through the project's kernel (backends/cpu/f32_gemm: its task grid, B packed, A in place)
// against OpenBLAS as the backend ran it before (blocks of 128 rows, and of 128 columns when M
// <= 128, one cblas_sgemm each inside our OpenMP pool), on 1 and on 2 threads, beside the FMA
// peak of a register-only loop measured in the same run. Median of repeated timings, GFLOP/s.
//
//   taskset -c 0,1 bench_f32_gemm [--reps N] [--threads 1] [--best] [--cold] [--only TEXT] [--epilogue]
//
// --epilogue: every product followed by C *= D (D a dense [M, N] per batch element: the GELU
// backward's multiply by its saved derivative), through f32_gemm's register epilogue
// (Problem::epi) for the own kernel, and as a pass over each block after its sgemm (what the
// backend's BLAS path runs, as a native loop) for OpenBLAS; --cold then evicts D too.
//
// --cold: each timing is one call after a 96 MiB pass over other memory has overwritten every
// cache level, as the step's products find their operands (made by other Steps, or, for weights,
// last touched a whole step earlier); by default a timing repeats the call on warm operands.
//
// The rule in f32_gemm::chosen and docs/architecture.md ("float32 products") come from this table.
#include <cblas.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/cpu/f32_gemm.h"
#include "bench_common.h"

namespace fg = tessera::backends::f32_gemm;
using clk = std::chrono::steady_clock;

namespace {

struct Product {
  const char* what;
  int64_t batch, M, N, K;
  bool ta, tb;       // A / B stored transposed
  int64_t per_step;  // times the step runs it
};

// The best of a few short runs; main keeps the best over the whole run (measured again after
// every product), since on a shared host any one measurement may have lost the core.
double peak_gflops(int threads) {
  const int64_t iters = 4'000'000;
  std::vector<double> best;
  volatile float sink = 0;
  for (int r = 0; r < 3; ++r) {
    auto t0 = clk::now();
#pragma omp parallel num_threads(threads)
    {
      const float v = bench::fma_loop(iters);
#pragma omp critical
      sink = sink + v;
    }
    best.push_back(std::chrono::duration<double>(clk::now() - t0).count());
  }
  return double(threads) * double(iters) * bench::kFmaChains * 32 / *std::min_element(best.begin(), best.end()) / 1e9;
}

bool epilogue = false;  // --epilogue: C *= D after each product

struct Operands {
  std::vector<float> a, b, c, d;
  std::vector<int64_t> ao, bo;
  fg::Problem p;
};

Operands make(const Product& s) {
  Operands o;
  const int64_t asz = s.M * s.K, bsz = s.K * s.N;
  o.a.assign(size_t(s.batch * asz), 0.5f), o.b.assign(size_t(s.batch * bsz), 0.25f), o.c.assign(size_t(s.batch * s.M * s.N), 0);
  for (size_t i = 0; i < o.a.size(); ++i) o.a[i] = float(i % 97) / 97.0f - 0.5f;
  for (size_t i = 0; i < o.b.size(); ++i) o.b[i] = float(i % 89) / 89.0f - 0.5f;
  for (int64_t e = 0; e < s.batch; ++e) o.ao.push_back(e * asz), o.bo.push_back(e * bsz);
  fg::Problem& p = o.p;
  p.batch = s.batch, p.M = s.M, p.N = s.N, p.K = s.K;
  p.a = o.a.data(), p.a_off = o.ao.data(), p.ars = s.ta ? 1 : s.K, p.acs = s.ta ? s.M : 1;
  p.b = o.b.data(), p.b_off = o.bo.data(), p.brs = s.tb ? 1 : s.N, p.bcs = s.tb ? s.K : 1;
  p.c = o.c.data();
  if (epilogue) {
    o.d.resize(o.c.size());
    for (size_t i = 0; i < o.d.size(); ++i) o.d[i] = float(i % 83) / 83.0f + 0.5f;
    p.epi = fg::Problem::Epi::Mul, p.x = o.d.data(), p.x_rs = s.N;
  }
  return o;
}

// OpenBLAS in the backend's former blocks (gemm.cpp, blas_product).
void blas_blocks(const Product& s, Operands& o) {
  const int64_t mb = (s.M + 127) / 128, nbk = s.M <= 128 ? (s.N + 127) / 128 : 1, per = mb * nbk;
  const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < s.batch * per; ++t) {
    const int64_t e = t / per, m0 = t % per / nbk * 128, m1 = std::min(s.M, m0 + 128);
    const int64_t n0 = nbk == 1 ? 0 : t % nbk * 128, n1 = nbk == 1 ? s.N : std::min(s.N, n0 + 128);
    const float* a = o.a.data() + o.ao[size_t(e)] + (s.ta ? m0 : m0 * lda);
    const float* b = o.b.data() + o.bo[size_t(e)] + (s.tb ? n0 * ldb : n0);
    cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, int(m1 - m0), int(n1 - n0),
                int(s.K), 1.0f, a, int(lda), b, int(ldb), 0.0f, o.c.data() + e * s.M * s.N + m0 * s.N + n0, int(s.N));
    if (o.d.empty()) continue;
    for (int64_t i = m0; i < m1; ++i) {
      float* c = o.c.data() + (e * s.M + i) * s.N;
      const float* d = o.d.data() + (e * s.M + i) * s.N;
      for (int64_t j = n0; j < n1; ++j) c[j] *= d[j];
    }
  }
}

bool best = false;  // --best: the fastest timing rather than the median (the host is shared)
bool cold = false;  // --cold: each timing one call after the caches were overwritten (as in the step)

// Overwrites every cache level (the L3 is 32 MiB here) on the threads that will run the product.
void evict_caches() {
  static std::vector<float> junk(size_t(24) << 20);  // 96 MiB
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < junk.size(); i += 16) junk[i] += 1.0f;
}

template <class F>
double median_ms(F&& f, int reps, double flops) {
  const int inner = cold ? 1 : std::max(1, int(2e8 / flops));  // about 1-2 ms per timing
  f();
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    if (cold) evict_caches();
    auto t0 = clk::now();
    for (int i = 0; i < inner; ++i) f();
    ms.push_back(std::chrono::duration<double, std::milli>(clk::now() - t0).count() / inner);
  }
  return best ? *std::min_element(ms.begin(), ms.end()) : bench::percentile(ms, 0.5);
}

}  // namespace

int main(int argc, char** argv) {
  std::string only;  // --only TEXT: the products whose name contains TEXT (the totals then cover those)
  int reps = 15, most = 2;  // --threads 1: only the one-thread columns (the others print 0)
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--reps") reps = std::atoi(argv[++i]);
    else if (std::string(argv[i]) == "--threads") most = std::clamp(std::atoi(argv[++i]), 1, 2);  // the table has 1 and 2
    else if (std::string(argv[i]) == "--only") only = argv[++i];
  for (int i = 1; i < argc; ++i)
    best = best || std::string(argv[i]) == "--best", cold = cold || std::string(argv[i]) == "--cold",
    epilogue = epilogue || std::string(argv[i]) == "--epilogue";
  if (!fg::available()) {
    std::printf("f32_gemm is not available here (no AVX-512F, or TESSERA_CPU_GEMM=blas)\n");
    return 0;
  }
  const int64_t R = 1024, E = 128, V = 114, T = 64, D = 32, BH = 64, L = 4;
  const std::vector<Product> shapes{
      {"qkv      X W^T", 1, R, 3 * E, E, false, true, L},      {"qkv      dY W", 1, R, E, 3 * E, false, false, L},
      {"qkv      dY^T X", 1, 3 * E, E, R, true, false, L},     {"proj     X W^T", 1, R, E, E, false, true, L},
      {"proj     dY W", 1, R, E, E, false, false, L},          {"proj     dY^T X", 1, E, E, R, true, false, L},
      {"fc       X W^T", 1, R, 4 * E, E, false, true, L},      {"fc       dY W", 1, R, E, 4 * E, false, false, L},
      {"fc       dY^T X", 1, 4 * E, E, R, true, false, L},     {"mlp.proj X W^T", 1, R, E, 4 * E, false, true, L},
      {"mlp.proj dY W", 1, R, 4 * E, E, false, false, L},      {"mlp.proj dY^T X", 1, E, 4 * E, R, true, false, L},
      {"head     X W^T", 1, R, V, E, false, true, 1},          {"head     dY W", 1, R, E, V, false, false, 1},
      {"head     dY^T X", 1, V, E, R, true, false, 1},         {"att  Q K^T", BH, T, T, D, false, true, L},
      {"att  P V", BH, T, D, T, false, false, L},              {"att  dP = dO V^T", BH, T, T, D, false, true, L},
      {"att  dV = P^T dO", BH, T, D, T, true, false, L},       {"att  dQ = dS K", BH, T, D, T, false, false, L},
      {"att  dK = dS^T Q", BH, T, D, T, true, false, L},
  };
  double peak1 = peak_gflops(1), peak2 = peak_gflops(2);
  std::printf("the benchmark GPT step's float32 products: own kernel (f32_gemm) vs OpenBLAS in the backend's blocks; %d timings "
              "each, %s%s; load %.1f\n",
              reps, best ? "best" : "median", cold ? ", one call after the caches were overwritten (--cold)" : "", bench::load_average());
  if (epilogue) std::printf("each product followed by C *= D (--epilogue)\n");
  std::printf("%-17s %4s %5s %5s %5s %2s%2s | %8s %8s | %8s %8s | rule (GFLOP/s)\n", "product", "x", "M", "N", "K", "ta", "tb",
              "1t own", "1t blas", "2t own", "2t blas");
  double tot[2][2] = {}, flops_total = 0;
  for (const Product& s : shapes) {
    if (!only.empty() && std::string(s.what).find(only) == std::string::npos) continue;
    Operands o = make(s);
    const double flops = 2.0 * double(s.batch * s.M * s.N * s.K);
    double g[2][2] = {};
    for (int th = 0; th < most; ++th) {
      omp_set_num_threads(th + 1);
      const double own = median_ms([&] { fg::gemm(o.p); }, reps, flops);
      const double blas = median_ms([&] { blas_blocks(s, o); }, reps, flops);
      g[th][0] = flops / own / 1e6, g[th][1] = flops / blas / 1e6;
      tot[th][0] += own * double(s.per_step), tot[th][1] += blas * double(s.per_step);
    }
    flops_total += flops * double(s.per_step);
    peak1 = std::max(peak1, peak_gflops(1)), peak2 = std::max(peak2, peak_gflops(2));
    std::printf("%-17s %4lld %5lld %5lld %5lld %2s%2s | %8.1f %8.1f | %8.1f %8.1f | %s\n", s.what, (long long)s.batch,
                (long long)s.M, (long long)s.N, (long long)s.K, s.ta ? "T" : "", s.tb ? "T" : "", g[0][0], g[0][1], g[1][0], g[1][1],
                fg::chosen(s.batch, s.M, s.N, s.K) ? "own" : "blas");
  }
  std::printf("FMA peak (register-only loop, the best over the run): %.1f GFLOP/s on 1 thread, %.1f on 2\n", peak1, peak2);
  for (int th = 0; th < most; ++th)
    std::printf("step's products (%.2f GFLOP), %d thread%s: own %.2f ms (%.1f GFLOP/s, %.0f%% of peak), OpenBLAS %.2f ms (%.1f GFLOP/s): "
                "%.2fx\n",
                flops_total / 1e9, th + 1, th ? "s" : "", tot[th][0], flops_total / tot[th][0] / 1e6,
                100 * flops_total / tot[th][0] / 1e6 / (th ? peak2 : peak1), tot[th][1], flops_total / tot[th][1] / 1e6,
                tot[th][0] / tot[th][1]);
  std::printf("RESULT f32_gemm own_ms_2t=%.3f blas_ms_2t=%.3f peak_2t=%.1f\n", tot[1][0], tot[1][1], peak2);
  return 0;
}
