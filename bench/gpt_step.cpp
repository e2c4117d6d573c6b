// Training-step time of the benchmark GPT (vocab 114, block 64, embd 128, 4 heads, 4 layers,
// batch 16, AdamW, no dropout) on the CPU: forward + cross entropy + backward + AdamW update,
// each step ending with loss.item(), which runs the step's graph. bench/gpt_step_torch.py is the
// same model in PyTorch; bench/gpt_vs_torch.sh runs both side by side.
//
//   OMP_NUM_THREADS=2 bench_gpt_step [--steps N] [--warmup N] [--device cpu|opencl|cuda|...]
//                                    [--preset gpt2-small|vocab-peak] [--batch N] [--dropout P] [--losses]
//                                    [--dtype float32|bfloat16|float16] [--memory-budget 200MB|0.5] [--micro-batches N|auto]
//                                    [--eval] [--capture]
//
// --eval: the step is the evaluation loss only (forward + cross entropy under NoGradGuard, the
// model in eval mode; no backward, no update), where nothing reads the attention probabilities
// and the cpu runs each layer's attention as one fused Step (TESSERA_DISABLE_PASSES=attention:
// the decomposition).
//
// --capture: the training step runs as a tessera::StepCapture (tessera/capture.h): traced until
// two consecutive traces agree, then replayed (the compiled graph run on the current parameters,
// moments and batch without tracing forward, autodiff and AdamW). The RESULT line's captured=
// counts the timed steps replayed. --micro-batches runs without it (the accumulation reads values
// mid-step); --dtype float16 traces every step (its GradScaler reads a value back), and the last
// reason is printed.
//
// --dtype bfloat16 / float16: the forward pass and loss under tessera::Autocast (the products in
// that dtype with float32 accumulation, everything else and the AdamW state in float32); float16
// with dynamic loss scaling (optim::GradScaler, one more host sync per step).
// --preset gpt2-small: vocab 50257, block 1024, embd 768, 12 heads, 12 layers, tied head, batch 8
// (bench/gpt2_torch.py is its PyTorch peer; scripts/gpu-check runs both). --preset vocab-peak:
// vocab 12608, block 256, embd 32, 2 heads, 1 layer, batch 32, whose peak is the language-model
// head's logits and their gradient (issue 24's seed case). --losses prints every
// step's loss ("LOSS step value", warm-up steps included) for comparing devices step by step.
//
// --memory-budget: the step is compiled under that budget (tessera::MemoryBudgetScope: met by
// rematerialization, or an error); with --micro-batches (auto: the fewest that fit the budget) the
// forward and backward run over slices of the batch (optim::accumulate_gradients) and the update
// as one more graph. bench/memory_budget.sh compares budgets.
//
// BENCH_PROFILE=1 (=lines: without the table): the timed steps under a Profiler, its table and
// machine-readable PROFILE lines per timed step (each Step kind's time, mean and median, flops and
// bytes; the host regions; the matmuls' flops alone), which bench/gpt_floor.sh reads.
// BENCH_PROFILE=steps: the lines, and one more per Step of the plan (its kind, median time over the
// timed steps, flops, GFLOP/s, output shape and name): which products lose time inside the step.
//
// The token batches come from splitmix64 (seed 1234, 4 batches cycled), the same as the PyTorch
// side draws. The last line is machine-readable: RESULT tessera threads=... median_ms=...
// (host_ms: the median over the timed steps of each step's time outside running its compiled
// graph, i.e. tracing, autodiff, the graph's key and lookup, and item()'s copy)
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <map>
#include <memory>

#include <optional>

#include "bench_common.h"
#include "step_profile.h"
#include "tessera/autocast.h"
#include "tessera/capture.h"
#include "tessera/memory.h"
#include "tessera/metrics.h"
#include "tessera/nn.h"
#include "tessera/optim.h"
#include "tessera/profiler.h"
#include "tessera/tensor.h"

using namespace tessera;
using clk = std::chrono::steady_clock;

namespace {

using namespace bench;

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 30, warmup = 3, batch = kBatch;
  double dropout = 0.0;
  bool losses = false, eval_only = false, capture = false;
  std::string device = "cpu", dtype = "float32";
  MemoryBudget budget;
  int64_t micro = 1;
  nn::GPTConfig cfg{.vocab = kVocab, .block = kBlock, .embd = kEmbd, .heads = kHeads, .layers = kLayers,
                    .dropout = 0.0, .bias = true, .tied_head = false};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    bool more = i + 1 < argc;
    if (a == "--device" && more) {
      device = argv[++i];
    } else if ((a == "--steps" || a == "--warmup" || a == "--batch") && more) {
      int64_t v = std::atoll(argv[++i]);
      (a == "--steps" ? steps : a == "--warmup" ? warmup : batch) = v;
    } else if (a == "--dropout" && more) {
      dropout = std::atof(argv[++i]);
    } else if (a == "--preset" && more && std::string(argv[i + 1]) == "gpt2-small") {
      ++i;
      cfg = {.vocab = 50257, .block = 1024, .embd = 768, .heads = 12, .layers = 12, .dropout = 0.0, .bias = true, .tied_head = true};
      batch = 8;
    } else if (a == "--preset" && more && std::string(argv[i + 1]) == "vocab-peak") {
      ++i;
      cfg = {.vocab = 12608, .block = 256, .embd = 32, .heads = 2, .layers = 1, .dropout = 0.0, .bias = true, .tied_head = false};
      batch = 32;
    } else if (a == "--dtype" && more && (std::string(argv[i + 1]) == "float32" || std::string(argv[i + 1]) == "bfloat16" ||
                                          std::string(argv[i + 1]) == "float16")) {
      dtype = argv[++i];
    } else if (a == "--memory-budget" && more) {
      budget = MemoryBudget::parse(argv[++i]);
    } else if (a == "--micro-batches" && more) {
      std::string v = argv[++i];
      micro = v == "auto" ? 0 : std::atoll(v.c_str());
    } else if (a == "--losses") {
      losses = true;
    } else if (a == "--eval") {
      eval_only = true;
    } else if (a == "--capture") {
      capture = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--steps N] [--warmup N] [--device NAME] [--preset gpt2-small|vocab-peak] [--batch N] [--dropout P] "
                   "[--losses] [--dtype float32|bfloat16|float16] [--memory-budget BYTES|FRACTION] [--micro-batches N|auto] [--eval] [--capture]   (threads: OMP_NUM_THREADS)\n",
                   argv[0]);
      return 2;
    }
  }
  if (eval_only && (micro != 1 || dtype == "float16")) {
    std::fprintf(stderr, "--eval takes neither --micro-batches nor --dtype float16 (loss scaling is for training)\n");
    return 2;
  }
  if (steps < 1 || warmup < 0 || batch < 1 || dropout < 0 || dropout >= 1) {
    std::fprintf(stderr, "--steps and --batch must be positive, --warmup not negative, --dropout in [0, 1)\n");
    return 2;
  }
  cfg.dropout = dropout;
  const char* omp = std::getenv("OMP_NUM_THREADS");
  std::string threads = omp && *omp ? omp : "default";

  manual_seed(0);
  nn::GPT model(cfg);
  model.to(Device(device));
  model.train(!eval_only);
  optim::AdamW opt(model.parameters(), {.lr = 3e-3, .weight_decay = 0.1});
  auto batches = make_batches(batch, cfg.block, cfg.vocab);
  TensorOptions ids{DType::Int64, Device(device)};

  std::vector<double> ms;
  std::vector<double> host;  // each timed step's time outside running its compiled graph(s)
  double first_loss = 0, last_loss = 0;
  int64_t graphs_after_warmup = 0;
  int64_t bf16_flops_after_warmup = 0;
  std::optional<optim::GradScaler> scaler;
  if (dtype == "float16") scaler.emplace();
  int64_t micro_used = 1;
  double first_ms = 0;               // the first step: tracing, compiling (device code too) and running
  DeviceMetrics dev_after_warmup;    // the device kind's counters when the timed steps start
  double execute_ms_after_warmup = 0;
  StepProfile prof;  // BENCH_PROFILE (bench/step_profile.h)
  std::unique_ptr<StepCapture> captured;  // --capture: the training step
  int64_t replayed_timed = 0;
  for (int64_t step = 0; step < warmup + steps; ++step) {
    if (step == warmup) {
      prof.start_if_asked();
      reset_peak_bytes();
      graphs_after_warmup = metrics().graphs_compiled;
      dev_after_warmup = metrics().devices[Device(device).kind];
      execute_ms_after_warmup = metrics().execute_ms;
      bf16_flops_after_warmup = metrics().bf16_flops;
    }
    prof.step_begins();
    const double exec_before = metrics().execute_ms;           // read outside the timed region
    auto& [hx, hy] = batches[size_t(step % kBatches)];
    auto t0 = clk::now();
    Tensor x = from_vector(hx, {batch, cfg.block}, ids);
    Tensor y = from_vector(hy, {batch, cfg.block}, ids);
    MemoryBudgetScope in_force(budget);
    auto loss_fn = [&](const std::vector<Tensor>& b) {
      std::optional<Autocast> ac;
      if (dtype != "float32") ac.emplace(dtype == "float16" ? DType::Float16 : DType::BFloat16);
      Tensor loss = model.loss(b[0], b[1]);
      return scaler ? scaler->scale(loss) : loss;
    };
    const double scale = scaler ? scaler->get_scale() : 1.0;
    auto update = [&] {
      if (scaler) {
        scaler->step(opt);
        scaler->update();
      } else {
        opt.step();
      }
      opt.zero_grad();
    };
    double l = 0;
    if (eval_only) {
      NoGradGuard no_grad;
      l = loss_fn({x, y}).item();  // runs the forward's graph
    } else if (micro == 1 && capture) {
      if (!captured)
        captured = std::make_unique<StepCapture>([&](const std::vector<Tensor>& b) {
          Tensor loss = loss_fn(b);
          loss.backward();
          update();
          return std::vector<Tensor>{loss};
        });
      l = (*captured)({x, y})[0].item() / scale;  // replayed: the recorded graph on this batch and the current state
      if (step >= warmup) replayed_timed += captured->last_replayed();
    } else if (micro == 1) {
      Tensor loss = loss_fn({x, y});
      loss.backward();
      update();
      l = loss.item() / scale;  // runs the step's graph: forward, backward and update together
    } else {
      auto r = optim::accumulate_gradients(model.parameters(), {x, y}, loss_fn, micro);
      MemoryBudgetScope update_budget(MemoryBudget{r.budget_bytes, 0});
      update();
      tessera::sync();
      l = r.loss / scale;
      micro_used = r.micro_batches;
    }
    double dt = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
    if (step >= warmup) host.push_back(dt - (metrics().execute_ms - exec_before));
    if (!std::isfinite(l)) {
      std::fprintf(stderr, "loss became %g at step %lld\n", l, (long long)step);
      return 1;
    }
    if (losses) std::printf("LOSS %lld %.9g\n", (long long)step, l);
    if (step == 0) first_loss = l, first_ms = dt;
    last_loss = l;
    if (step >= warmup) ms.push_back(dt);
  }

  prof.report(steps);
  Metrics m = metrics();
  const int unstacked = micro == 1 ? last_memory_plan().unstacked_slices : 0;  // batch unstacking inside the step
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  double maxrss_mb = double(ru.ru_maxrss) / 1024.0;  // Linux reports kilobytes
  double peak_mb = double(m.peak_bytes) / (1024.0 * 1024.0);
  double med = percentile(ms, 0.5), p10 = percentile(ms, 0.1), p90 = percentile(ms, 0.9);
  std::printf("tessera GPT %s on %s (vocab %lld, block %lld, embd %lld, %lld heads, %lld layers, batch %lld, dropout %g, "
              "AdamW, %s), OMP_NUM_THREADS=%s\n",
              eval_only ? "evaluation (forward + loss)" : "step", device.c_str(), (long long)cfg.vocab, (long long)cfg.block, (long long)cfg.embd, (long long)cfg.heads,
              (long long)cfg.layers, (long long)batch, dropout, dtype == "float32" ? "float32" : (dtype + " autocast").c_str(), threads.c_str());
  std::printf("  parameters %lld, %lld warm-up + %lld timed steps\n", (long long)model.num_parameters(), (long long)warmup,
              (long long)steps);
  std::printf("  step ms: median %.2f  p10 %.2f  p90 %.2f  min %.2f\n", med, p10, p90, *std::min_element(ms.begin(), ms.end()));
  double exec_per_step = (m.execute_ms - execute_ms_after_warmup) / double(steps);
  const double host_med = percentile(host, 0.5);
  std::printf("  of which running the compiled graph %.2f ms/step (mean); the rest (median %.3f ms/step) is tracing the\n"
              "  model, autodiff and the optimizer, building the graph's key and looking it up, and item()'s copy\n",
              exec_per_step, host_med);
  std::printf("  loss: first %.4f  last %.4f\n", first_loss, last_loss);
  if (captured)
    std::printf("  captured step: %lld of %lld timed steps replayed (%lld traced in all)%s%s\n", (long long)replayed_timed,
                (long long)steps, (long long)captured->traces(), captured->last_replayed() ? "" : "; last call traced: ",
                captured->last_replayed() ? "" : captured->last_reason().c_str());
  const double bf16_gflop = double(m.bf16_flops - bf16_flops_after_warmup) / double(steps) / 1e9;
  std::printf("  bf16 dot-product flops per timed step: %.3f GFLOP\n", bf16_gflop);
  std::printf("  peak bytes (timed steps) %.1f MiB, process max RSS %.1f MiB\n", peak_mb, maxrss_mb);
  std::printf("  graphs compiled %lld (%lld during timed steps), cache hits %lld, host syncs %lld\n",
              (long long)m.graphs_compiled, (long long)(m.graphs_compiled - graphs_after_warmup), (long long)m.cache_hits,
              (long long)m.host_syncs);
  const DeviceMetrics d = m.devices[Device(device).kind], &d0 = dev_after_warmup;
  std::printf("  on %s per timed step: %.1f Steps launched, %.1f whole-executable runs; first step %.0f ms (compiles, "
              "device code included: %.0f ms compiling in all), %lld Steps compiled, %lld of them library calls\n",
              device.c_str(), double(d.steps_launched - d0.steps_launched) / double(steps),
              double(d.executables_run - d0.executables_run) / double(steps), first_ms, m.compile_ms, (long long)d.kernels_compiled,
              (long long)d.library_calls_compiled);
  if (!budget.none())
    std::printf("  memory budget %s: %lld micro-batches, %lld Steps recomputed, %d slices in the step%s%s\n", budget.str().c_str(),
                (long long)micro_used, (long long)m.recomputed_steps, unstacked, unstacked ? ": " : "",
                unstacked ? last_memory_plan().unstacked.c_str() : "");
  std::printf("RESULT tessera device=%s threads=%s median_ms=%.3f p10=%.3f p90=%.3f peak_mb=%.1f maxrss_mb=%.1f graphs=%lld "
              "exec_ms=%.3f last_loss=%.4f tokens_per_s=%.0f first_step_ms=%.0f compile_ms=%.1f dtype=%s bf16_gflop=%.3f "
              "micro_batches=%lld recomputed=%lld unstacked=%d mode=%s host_ms=%.3f captured=%lld\n",
              device.c_str(), threads.c_str(), med, p10, p90, peak_mb, maxrss_mb, (long long)m.graphs_compiled, exec_per_step, last_loss,
              double(batch * cfg.block) / (med / 1000.0), first_ms, m.compile_ms, dtype.c_str(), bf16_gflop, (long long)micro_used,
              (long long)m.recomputed_steps, unstacked, eval_only ? "eval" : "train", host_med,
              (long long)(captured ? replayed_timed : -1));
  return 0;
}
