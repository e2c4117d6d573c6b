// What one Step costs beyond its own work, on a captured (replayed) graph: chains of N Steps of
// one kind at a few sizes, replayed as a tessera::StepCapture (no tracing), each Step its own
// (the fuse and merge passes off, so N elementwise ops are N Steps). Per case: the replay's wall time per
// Step (median and minimum over the reps). At a size below the CPU backend's parallel threshold
// (kParallelMin, 65,536 elements) a Step runs on the calling thread only, so its time is the
// runtime's launch loop and the kernel's dispatch; at 65,536 elements and over, each Step is one
// OpenMP parallel region (fork/join, the workers' wake-up under OMP_WAIT_POLICY=passive).
// Compare runs at OMP_NUM_THREADS=1 and 2 (and the wait policies) for what the threads cost.
//
//   OMP_NUM_THREADS=2 bench_step_overhead [--steps N] [--reps N] [--only NAME]
//
// One line per case: RESULT step_overhead case=NAME steps=N threads=T us_per_step=MEDIAN min_us=MIN
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <tessera/tessera.h>

#include "bench_common.h"
#include "runtime/compile_options.h"

namespace ts = tessera;
using Clock = std::chrono::steady_clock;

namespace {

struct Case {
  std::string name;
  ts::Shape x, w;  // the chain's value and the tensor each Step combines it with
  bool matmul;
};

double run_case(const Case& c, int steps, int reps, double* min_us) {
  ts::Tensor x = ts::randn(c.x), w = c.matmul ? ts::randn(c.w) * (1.0 / 16) : ts::rand(c.w) * 0.01 + 0.995;
  ts::sync();
  ts::StepCapture step([&](const std::vector<ts::Tensor>& in) {
    ts::Tensor y = in[0];
    for (int i = 0; i < steps; ++i) y = c.matmul ? ts::matmul(y, w) : y * w;
    return std::vector<ts::Tensor>{y};
  });
  for (int i = 0; i < 5; ++i) step({x});  // traces, then replays (the outputs come back realized)
  if (!step.last_replayed()) {
    std::fprintf(stderr, "bench_step_overhead: %s did not replay: %s\n", c.name.c_str(), step.last_reason().c_str());
    std::exit(1);
  }
  const int64_t launched = ts::metrics().steps_launched;
  step({x});
  if (ts::metrics().steps_launched - launched != steps) {
    std::fprintf(stderr, "bench_step_overhead: %s ran %lld Steps, not %d\n", c.name.c_str(),
                 (long long)(ts::metrics().steps_launched - launched), steps);
    std::exit(1);
  }
  std::vector<double> us;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    step({x});
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / steps);
  }
  *min_us = *std::min_element(us.begin(), us.end());
  return bench::percentile(us, 0.5);
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 256, reps = 200;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "--steps" || a == "--reps") && i + 1 < argc) {
      (a == "--steps" ? steps : reps) = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--steps N] [--reps N] [--only NAME]   (threads: OMP_NUM_THREADS)\n", argv[0]);
      return 2;
    }
  }
  const std::vector<Case> cases = {
      {"mul_16", {16}, {16}, false},              // one thread: the launch path alone
      {"mul_4k", {4096}, {4096}, false},          // one thread, a little work
      {"mul_64k", {65536}, {65536}, false},       // the smallest parallel Step: one region
      {"mul_256k", {262144}, {262144}, false},
      {"matmul_64", {64, 64}, {64, 64}, true},    // a small product
      {"matmul_1024x128", {1024, 128}, {128, 128}, true},  // the GPT's attn.proj shape
  };
  try {
    ts::runtime::set_disabled_passes("fuse,merge");  // each op its own Step
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    std::printf("threads %d, OMP_WAIT_POLICY=%s, load average %.2f, %d Steps per graph, %d replays\n", omp_get_max_threads(),
                policy ? policy : "(unset)", bench::load_average(), steps, reps);
    for (const Case& c : cases) {
      if (!only.empty() && c.name != only) continue;
      double mn = 0, med = run_case(c, c.matmul && c.x[0] > 64 ? std::max(1, steps / 8) : steps, reps, &mn);
      std::printf("RESULT step_overhead case=%s steps=%d threads=%d us_per_step=%.3f min_us=%.3f\n", c.name.c_str(),
                  c.matmul && c.x[0] > 64 ? std::max(1, steps / 8) : steps, omp_get_max_threads(), med, mn);
    }
  } catch (const ts::Error& e) {
    std::fprintf(stderr, "bench_step_overhead: %s\n", e.what());
    return 1;
  }
  return 0;
}
