// This machine's arithmetic and memory limits, the yardsticks bench/gpt_floor.sh measures the
// GPT step against (issue 28):
//   - the float32 FMA peak: a register-only loop of independent AVX-512 FMAs (no loads or stores,
//     more accumulators than the FMA latency times the pipes), on 1..N threads at once;
//   - the bfloat16 dot-product peak: the same loop of vdpbf16ps (2 multiply-adds per 32-bit
//     lane), where the CPU has AVX512-BF16;
//   - the triad bandwidth (STREAM's a[i] = b[i] + s * c[i], float32, three 128 MiB arrays, far
//     beyond L2 and L3; 12 bytes per element counted, the write-allocate read not counted, as
//     STREAM does), on 1..N threads.
// Each figure is the best of --reps short repetitions (a peak: interference from other processes
// only lowers a repetition). Threads are std::threads, one per core in the affinity mask (pinned).
// On a loaded machine the wall-clock rate of N threads is what they got; the arithmetic peaks are
// also given per CPU-second (each thread's flops over its own CPU time, summed over the threads
// running at once: what the cores retire while they run, which other processes' time slices do
// not lower; two threads on SMT siblings of one core would show half per thread). Bandwidth is
// shared by the cores, so the triad is given by the wall clock only.
//
//   bench_machine_limits [--threads "1 2"] [--reps 20] [--mib 128]
//
// Machine-readable lines: LIMIT fma_f32 threads=T gflops=G cpu_gflops=C; LIMIT dot_bf16 (same);
// LIMIT triad threads=T gbs=G (flops: 2 per multiply-add; GB/s: 1e9 bytes per second).
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <ctime>
#include <vector>

#include "bench_common.h"

using clk = std::chrono::steady_clock;

namespace {

constexpr int kAcc = bench::kFmaChains;  // independent accumulators, as bench::fma_loop
constexpr int64_t kIters = 1 << 22;       // loop trips per repetition (16 instructions each; ~20 ms)

__attribute__((target("avx512f,avx512bf16"), noinline)) float dot_bf16_loop(int64_t iters, float seed) {
  __m512 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_set1_ps(seed + float(i));
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);  // 1.0, ~6e-8
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  for (int i = 1; i < kAcc; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  float lanes[16];
  _mm512_storeu_ps(lanes, acc[0]);
  float s = 0;
  for (float v : lanes) s += v;
  return s;
}

std::vector<int> cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) out.push_back(c);
  if (out.empty()) out.push_back(0);
  return out;
}

void pin(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// Runs body(thread index) on `n` pinned threads released together; returns the wall seconds from
// the release to the last one's end, and each thread's CPU seconds in `cpu_s`.
template <class F>
double on_threads(int n, const std::vector<int>& cpu, F body, std::vector<double>* cpu_s = nullptr) {
  if (cpu_s) cpu_s->assign(size_t(n), 0.0);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < n; ++t)
    ts.emplace_back([&, t] {
      pin(cpu[size_t(t) % cpu.size()]);
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      const double c0 = thread_cpu_s();
      body(t);
      if (cpu_s) (*cpu_s)[size_t(t)] = thread_cpu_s() - c0;
    });
  while (ready.load() < n) {
  }
  auto t0 = clk::now();
  go.store(true, std::memory_order_release);
  for (auto& t : ts) t.join();
  return std::chrono::duration<double>(clk::now() - t0).count();
}

volatile float g_sink;

}  // namespace

int main(int argc, char** argv) {
  std::string thread_list = "1 2";
  int reps = 20;
  int64_t mib = 128;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) thread_list = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--mib" && i + 1 < argc) mib = std::atoll(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--threads \"1 2\"] [--reps N] [--mib ARRAY_MIB]\n", argv[0]);
      return 2;
    }
  }
  std::vector<int> threads;
  {
    std::istringstream in(thread_list);
    for (int t; in >> t;) threads.push_back(t);
  }
  if (threads.empty() || reps < 1 || mib < 1 || std::any_of(threads.begin(), threads.end(), [](int t) { return t < 1; })) {
    std::fprintf(stderr, "--threads: positive counts; --reps, --mib: positive\n");
    return 2;
  }
  const std::vector<int> cpu = cores();
  __builtin_cpu_init();
  const bool has_f32 = __builtin_cpu_supports("avx512f");
  const bool has_bf16 = has_f32 && __builtin_cpu_supports("avx512bf16");
  std::printf("machine limits: %zu cores in the affinity mask; best of %d repetitions\n", cpu.size(), reps);

  for (int kind = 0; kind < 2; ++kind) {
    const bool bf16 = kind == 1;
    if (!(bf16 ? has_bf16 : has_f32)) {
      std::printf("  %s: not supported by this CPU\n", bf16 ? "vdpbf16ps (AVX512-BF16)" : "AVX-512 FMA");
      continue;
    }
    // flops per loop trip per thread: kAcc instructions x 16 lanes x (1 or 2 multiply-adds) x 2
    const double flops_per_trip = double(kAcc) * 16 * (bf16 ? 2 : 1) * 2;
    const double per_thread = flops_per_trip * double(kIters) / 1e9;  // GFLOP each thread runs
    for (int n : threads) {
      double best = 0, best_cpu = 0;
      std::vector<double> cs;
      for (int r = 0; r < reps; ++r) {
        double s = on_threads(
            n, cpu, [&](int t) { g_sink = bf16 ? dot_bf16_loop(kIters, float(t)) : bench::fma_loop(kIters, float(t)); }, &cs);
        best = std::max(best, per_thread * n / s);
        double sum = 0;  // each thread's rate per second it was on a core, summed
        for (double c : cs) sum += per_thread / c;
        best_cpu = std::max(best_cpu, sum);
      }
      std::printf("  %-29s %d thread(s): %7.1f GFLOP/s by the wall clock, %7.1f per CPU-second summed over threads\n",
                  bf16 ? "bf16 dot products (vdpbf16ps)" : "float32 FMA (register-only)", n, best, best_cpu);
      std::printf("LIMIT %s threads=%d gflops=%.1f cpu_gflops=%.1f\n", bf16 ? "dot_bf16" : "fma_f32", n, best, best_cpu);
    }
  }

  const int64_t n_el = mib * 1024 * 1024 / int64_t(sizeof(float));
  std::vector<float> a(size_t(n_el), 0.f), b(size_t(n_el), 1.f), c(size_t(n_el), 2.f);  // touched: pages mapped
  for (int n : threads) {
    double best = 0;
    for (int r = 0; r < reps; ++r) {
      double s = on_threads(n, cpu, [&](int t) {
        const int64_t lo = n_el * t / n, hi = n_el * (t + 1) / n;
        float* __restrict pa = a.data();
        const float* __restrict pb = b.data();
        const float* __restrict pc = c.data();
        const float k = 3.f;
        for (int64_t i = lo; i < hi; ++i) pa[i] = pb[i] + k * pc[i];
      });
      best = std::max(best, 3.0 * double(sizeof(float)) * double(n_el) / s / 1e9);
    }
    g_sink = a[size_t(n_el / 2)];
    std::printf("  %-28s %d thread(s): %7.1f GB/s (3 x %lld MiB arrays)\n", "triad a = b + s*c", n, best, (long long)mib);
    std::printf("LIMIT triad threads=%d gbs=%.2f\n", n, best);
  }
  return 0;
}
