// Profiler overhead on the benchmark GPT's training step (vocab 114, block 64, embd 128, 4 heads,
// 4 layers, batch 16, AdamW): the same model in one process, alternating rounds with the profiler
// recording and not (ABBA order, so drift and warm-up hit both sides alike), each round timing
// `--steps` training steps. Per round the overhead is median(on) / median(off) - 1, in wall time
// and in the process's CPU time (less sensitive to other processes on a shared machine); the
// result is the median over rounds with the quartiles and extremes as the spread.
//
//   OMP_NUM_THREADS=1 bench_profiler_overhead [--rounds N] [--steps N]
//   OMP_NUM_THREADS=1 valgrind --tool=callgrind --toggle-collect='*measured_steps*'
//       bench_profiler_overhead --only on|off [--steps N] [--warmup N]      (one command line)
// The second form runs only `--steps` steps with the profiler on or off inside measured_steps(),
// so callgrind's instruction counts of the two runs compare the step itself, free of noise.
//
// The last line is machine-readable: RESULT profiler_overhead ...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "bench_common.h"
#include "tessera/metrics.h"
#include "tessera/nn.h"
#include "tessera/ops.h"
#include "tessera/optim.h"
#include "tessera/profiler.h"
#include "tessera/tensor.h"

using namespace tessera;

namespace {

double cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}
double wall_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The steps callgrind counts (--toggle-collect); not inlined so its name stays in the binary.
template <class F>
[[gnu::noinline]] void measured_steps(bool profiled, int steps, F& train_step) {
  Profiler prof(false);
  if (profiled) prof.start();
  for (int s = 0; s < steps; ++s) train_step();
  prof.stop();
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 16, steps = 4, warmup = 3;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "--rounds" || a == "--steps" || a == "--warmup") && i + 1 < argc) {
      (a == "--rounds" ? rounds : a == "--steps" ? steps : warmup) = std::atoi(argv[++i]);
    } else if (a == "--only" && i + 1 < argc && (std::string(argv[i + 1]) == "on" || std::string(argv[i + 1]) == "off")) {
      only = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--rounds N] [--steps N] [--warmup N] [--only on|off]   (threads: OMP_NUM_THREADS)\n", argv[0]);
      return 2;
    }
  }
  if (rounds < 2 || steps < 1 || warmup < 1) {
    std::fprintf(stderr, "--rounds must be at least 2, --steps and --warmup positive\n");
    return 2;
  }
  using namespace bench;
  manual_seed(0);
  nn::GPT model({.vocab = kVocab, .block = kBlock, .embd = kEmbd, .heads = kHeads, .layers = kLayers, .dropout = 0.0,
                 .bias = true, .tied_head = false});
  model.train();
  optim::AdamW opt(model.parameters(), {.lr = 3e-3, .weight_decay = 0.1});
  auto batches = make_batches();
  TensorOptions ids{DType::Int64, Device("cpu")};
  int64_t step_no = 0;
  // One training step as the CLI runs it: trace forward, backward and the update, then item().
  auto train_step = [&] {
    auto& [x, y] = batches[size_t(step_no++ % kBatches)];
    Tensor xi = from_vector(x, {kBatch, kBlock}, ids), yi = from_vector(y, {kBatch, kBlock}, ids);
    Tensor loss = model.loss(xi, yi);
    loss.backward();
    opt.step();
    opt.zero_grad();
    return loss.item();
  };
  for (int i = 0; i < warmup; ++i) train_step();  // compile and warm the allocator
  if (!only.empty()) {
    measured_steps(only == "on", steps, train_step);
    std::printf("RESULT profiler_overhead_only mode=%s steps=%d\n", only.c_str(), steps);
    return 0;
  }

  // Times `steps` steps, with or without a profiler recording; returns the median step times.
  auto run = [&](bool profiled, double* wall_med, double* cpu_med) {
    std::vector<double> w, c;
    Profiler prof(false);
    if (profiled) prof.start();
    for (int s = 0; s < steps; ++s) {
      double w0 = wall_s(), c0 = cpu_s();
      train_step();
      w.push_back(wall_s() - w0);
      c.push_back(cpu_s() - c0);
    }
    prof.stop();
    *wall_med = bench::percentile(w, 0.5);
    *cpu_med = bench::percentile(c, 0.5);
  };
  std::vector<double> wall_ratio, cpu_ratio, wall_on, wall_off;
  const int64_t launched0 = metrics().steps_launched, steps0 = step_no;
  for (int r = 0; r < rounds; ++r) {
    double won = 0, con = 0, woff = 0, coff = 0;
    if (r % 2 == 0) {
      run(true, &won, &con);
      run(false, &woff, &coff);
    } else {
      run(false, &woff, &coff);
      run(true, &won, &con);
    }
    wall_ratio.push_back(won / woff - 1);
    cpu_ratio.push_back(con / coff - 1);
    wall_on.push_back(won);
    wall_off.push_back(woff);
    std::printf("round %2d: on %7.2f ms, off %7.2f ms (wall %+6.2f%%, cpu %+6.2f%%)\n", r, 1e3 * won, 1e3 * woff,
                100 * wall_ratio.back(), 100 * cpu_ratio.back());
  }
  const double steps_per_gpt_step = double(metrics().steps_launched - launched0) / double(step_no - steps0);
  // The recording cost per Step, robust to other processes (fastest of many repetitions): a chain
  // of 64 tiny GEMM Steps (they cannot fuse) run with and without a profiler.
  double per_step_ns = 0;
  {
    Tensor a = randn({4, 4}, TensorOptions{DType::Float32, Device("cpu")});
    tessera::sync();
    auto chain = [&] {
      Tensor x = a;
      for (int i = 0; i < 64; ++i) x = matmul(x, a) * 0.5;
      return x.sum();
    };
    auto fastest = [&](bool profiled) {
      double best = 1e9;
      for (int r = 0; r < 40; ++r) {
        Tensor t = chain();
        Profiler prof(false);
        if (profiled) prof.start();
        double w0 = wall_s();
        t.item();
        best = std::min(best, wall_s() - w0);
      }
      return best;
    };
    fastest(false);  // compile
    double off = fastest(false), on = fastest(true), off2 = fastest(false);
    per_step_ns = 1e9 * (on - std::min(off, off2)) / 65;  // 64 GEMM Steps + the sum
  }
  auto pct = [](const std::vector<double>& v, double q) { return 100 * bench::percentile(v, q); };
  const char* omp = std::getenv("OMP_NUM_THREADS");
  std::printf("profiler overhead over %d rounds of %d steps (threads %s, load %.2f): wall median %+.2f%% "
              "(quartiles %+.2f%% .. %+.2f%%, range %+.2f%% .. %+.2f%%); cpu median %+.2f%% (quartiles %+.2f%% .. %+.2f%%)\n",
              rounds, steps, omp && *omp ? omp : "default", load_average(), pct(wall_ratio, 0.5), pct(wall_ratio, 0.25),
              pct(wall_ratio, 0.75), pct(wall_ratio, 0), pct(wall_ratio, 1), pct(cpu_ratio, 0.5), pct(cpu_ratio, 0.25),
              pct(cpu_ratio, 0.75));
  const double derived = 100 * per_step_ns * 1e-9 * steps_per_gpt_step / bench::percentile(wall_off, 0.5);
  std::printf("recording costs %.0f ns per Step (fastest of 40 runs of a 65-Step chain); the GPT step launches ~%.0f Steps: "
              "%.3f%% of its %.1f ms\n",
              per_step_ns, steps_per_gpt_step, derived, 1e3 * bench::percentile(wall_off, 0.5));
  std::printf("RESULT profiler_overhead wall_median_pct=%.3f wall_q1_pct=%.3f wall_q3_pct=%.3f cpu_median_pct=%.3f "
              "step_on_ms=%.3f step_off_ms=%.3f per_step_ns=%.1f derived_pct=%.4f\n",
              pct(wall_ratio, 0.5), pct(wall_ratio, 0.25), pct(wall_ratio, 0.75), pct(cpu_ratio, 0.5),
              1e3 * bench::percentile(wall_on, 0.5), 1e3 * bench::percentile(wall_off, 0.5), per_step_ns, derived);
  return 0;
}
