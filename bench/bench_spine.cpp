// The spine's numbers: matmul through tessera::Tensor vs the same OpenBLAS called directly,
// tracing cost per node, and realize overhead of a cache-hit graph of 1,000 small ops.
//   bench_spine [--reps N]   (N >= 5; default 7)
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <tessera/tessera.h>
#include "bench_common.h"
#include "ir/node.h"  // live_node_count: the nodes a trace leaves alive

namespace ts = tessera;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

using bench::load_average;

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

// The direct BLAS baseline runs with every core (OpenBLAS's own default), whatever thread count
// the library keeps OpenBLAS at for its own calls; that setting is restored after each call.
int g_blas_threads = 1;

// (a) matmul GFLOP/s, tessera vs cblas_sgemm, runs interleaved so both see the same machine state.
void bench_matmul(int64_t n, int reps) {
  std::vector<float> ha = random_floats(n * n, 1), hb = random_floats(n * n, 2), hc(n * n);
  ts::Tensor a = ts::from_vector<float>(ha, {n, n});
  ts::Tensor b = ts::from_vector<float>(hb, {n, n});
  ts::sync();

  auto sgemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, ha.data(), n, hb.data(), n,
                0.f, hc.data(), n);
  };
  // Milliseconds of the call alone. OpenBLAS's OpenMP build also sets this thread's OpenMP team
  // size in openblas_set_num_threads, so that is restored too.
  auto run_blas = [&]() -> double {
    const int lib_threads = openblas_get_num_threads(), omp_threads = omp_get_max_threads();
    openblas_set_num_threads(g_blas_threads);
    auto t0 = Clock::now();
    sgemm();
    const double ms = ms_since(t0);
    openblas_set_num_threads(lib_threads);
    omp_set_num_threads(omp_threads);
    return ms;
  };
  ts::Tensor c = a.matmul(b);  // warm-up: compiles, and the allocator sees the size once
  ts::sync();
  run_blas();

  const ts::Metrics m0 = ts::metrics();
  std::vector<double> t_ts, t_blas, t_exec;
  for (int r = 0; r < reps; ++r) {
    t_blas.push_back(run_blas());
    const double e0 = ts::metrics().execute_ms;
    auto t0 = Clock::now();
    c = a.matmul(b);
    ts::sync();
    t_ts.push_back(ms_since(t0));
    t_exec.push_back(ts::metrics().execute_ms - e0);
  }
  const ts::Metrics m1 = ts::metrics();

  std::vector<float> got = c.to_vector<float>();
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(double(got[i]) - hc[i]));
    max_ref = std::max(max_ref, std::fabs(double(hc[i])));
  }
  const double flop = 2.0 * n * n * n;
  const double g_ts = flop / (median(t_ts) * 1e6), g_blas = flop / (median(t_blas) * 1e6);
  std::printf("matmul %4lld^3 f32   %9.2f ms %9.1f GFLOP/s   %9.2f ms %9.1f GFLOP/s   %6.1f%%"
              "   (executing %.2f ms; rel diff %.1e, compiles %lld)\n",
              (long long)n, median(t_ts), g_ts, median(t_blas), g_blas, 100.0 * g_ts / g_blas,
              median(t_exec), max_ref > 0 ? max_diff / max_ref : max_diff,
              (long long)(m1.graphs_compiled - m0.graphs_compiled));
}

// A chain of `ops` small elementwise ops on y (alternating * 1.0001 and + 0.5).
ts::Tensor chain(ts::Tensor y, int ops) {
  for (int i = 0; i < ops; i += 2) {
    y = y * 1.0001;
    if (i + 1 < ops) y = y + 0.5;
  }
  return y;
}

// (b) tracing cost: build the chain without syncing, then drop it.
void bench_trace(int ops, int reps) {
  ts::Tensor x = ts::from_vector<float>(std::vector<float>(16, 1.f), {16});
  ts::sync();
  std::vector<double> t;
  int64_t nodes = 0;
  for (int r = 0; r < reps + 1; ++r) {
    const int64_t n0 = ts::ir::live_node_count();
    auto t0 = Clock::now();
    ts::Tensor y = chain(x, ops);
    const double ms = ms_since(t0);
    nodes = ts::ir::live_node_count() - n0;
    if (r > 0) t.push_back(ms);  // the first run warms caches and the intern table
  }
  const double us = median(t) * 1e3;
  std::printf("trace %d ops on [16] (no sync)      %9.1f us total   %6.3f us/op   "
              "(%lld live IR nodes, %.3f us/node)\n",
              ops, us, us / ops, (long long)nodes, nodes > 0 ? us / nodes : 0.0);
}

// (c) realize overhead of a cache-hit graph: trace + hash + lookup + launch, and sync alone.
void bench_realize(int ops, int reps) {
  ts::Tensor x = ts::from_vector<float>(std::vector<float>(16, 1.f), {16});
  ts::sync();
  auto t0 = Clock::now();
  ts::Tensor y = chain(x, ops);
  ts::sync();  // first run: compiles
  const double first_ms = ms_since(t0);

  const ts::Metrics m0 = ts::metrics();
  std::vector<double> total, sync_only, exec;
  for (int r = 0; r < reps; ++r) {
    const double e0 = ts::metrics().execute_ms;
    t0 = Clock::now();
    y = chain(x, ops);
    auto t1 = Clock::now();
    ts::sync();
    const double s = ms_since(t1);
    total.push_back(ms_since(t0));
    sync_only.push_back(s);
    exec.push_back(ts::metrics().execute_ms - e0);
  }
  const ts::Metrics m1 = ts::metrics();
  std::printf("realize %d ops, cache hit            %9.3f ms total (trace+sync)   %9.3f ms sync"
              "   %9.3f ms executing   (first run %.1f ms; compiles %lld, hits %lld)\n",
              ops, median(total), median(sync_only), median(exec), first_ms,
              (long long)(m1.graphs_compiled - m0.graphs_compiled),
              (long long)(m1.cache_hits - m0.cache_hits));
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 7;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--reps N]  (N >= 5)\n", argv[0]);
      return 2;
    }
  }
  if (reps < 5) {
    std::fprintf(stderr, "bench_spine: --reps must be at least 5 (got %d)\n", reps);
    return 2;
  }
  try {
    g_blas_threads = omp_get_max_threads();
    std::printf("tessera %s, %s; OpenBLAS %s, direct calls on %d threads; OPENBLAS_CORETYPE=%s OPENBLAS_L2_SIZE=%s; "
                "medians of %d runs; load average %.2f\n\n",
                ts::version(), ts::Device::best().str().c_str(), openblas_get_config(),
                g_blas_threads, env_or("OPENBLAS_CORETYPE", "(unset)"),
                env_or("OPENBLAS_L2_SIZE", "(unset)"), reps, load_average());
    std::printf("%-20s   %-28s   %-28s   %s\n", "", "tessera::Tensor", "cblas_sgemm", "ratio");
    bench_matmul(512, std::max(reps, 15));
    bench_matmul(2048, reps);
    std::printf("\n");
    bench_trace(1000, reps);
    bench_realize(1000, reps);
    std::printf("\n%s\n", ts::metrics().report().c_str());
    return 0;
  } catch (const ts::Error& e) {
    std::fprintf(stderr, "bench_spine: %s\n", e.what());
    return 1;
  }
}
