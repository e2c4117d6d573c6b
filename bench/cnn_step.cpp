// Training-step time of the Fashion-MNIST classifiers on the CPU: forward + cross entropy +
// backward + Adam (lr 1e-3), each step ending with loss.item(), which runs the step's graph.
// bench/cnn_step_torch.py is the same model in PyTorch; bench/cnn_vs_torch.sh runs both.
//
//   OMP_NUM_THREADS=2 bench_cnn_step [--model small|resnet] [--batch 64] [--steps N] [--warmup N]
//
// Batches are the first 4 x batch training images in order, cycled (the PyTorch side reads the
// same ones). The last line is machine-readable: RESULT tessera threads=... median_ms=...
// BENCH_PROFILE=1|lines|steps: the timed steps under a Profiler (bench/step_profile.h), as bench_gpt_step.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_common.h"
#include "step_profile.h"
#include "tessera/tessera.h"

using namespace tessera;
using clk = std::chrono::steady_clock;

int main(int argc, char** argv) {
  int64_t steps = 30, warmup = 3, batch = 64;
  std::string model_name = "small";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--steps") steps = std::atoll(argv[i + 1]);
    else if (a == "--warmup") warmup = std::atoll(argv[i + 1]);
    else if (a == "--batch") batch = std::atoll(argv[i + 1]);
    else if (a == "--model") model_name = argv[i + 1];
    else argc = 0;
  }
  if (argc % 2 == 0 || steps < 1 || warmup < 0 || batch < 1 || (model_name != "small" && model_name != "resnet")) {
    std::fprintf(stderr, "usage: %s [--model small|resnet] [--batch N] [--steps N] [--warmup N]   (threads: OMP_NUM_THREADS)\n", argv[0]);
    return 2;
  }
  const char* omp = std::getenv("OMP_NUM_THREADS");
  std::string threads = omp && *omp ? omp : "default";
  try {
    data::FashionMNIST train(data::FashionMNIST::Part::Train);
    std::vector<std::pair<Tensor, Tensor>> batches;
    for (int64_t b = 0; b < 4; ++b) {
      std::vector<int64_t> idx;
      for (int64_t i = 0; i < batch; ++i) idx.push_back(b * batch + i);
      batches.push_back(train.batch_at(idx));
    }
    manual_seed(0);
    std::shared_ptr<nn::Module> model;
    if (model_name == "small") model = std::make_shared<nn::SmallCNN>();
    else model = std::make_shared<nn::ResNet>();
    optim::Adam opt(model->parameters(), {.lr = 1e-3});
    std::vector<double> ms;
    double last_loss = 0, exec0 = 0;
    bench::StepProfile prof;
    for (int64_t step = 0; step < warmup + steps; ++step) {
      if (step == warmup) reset_peak_bytes(), exec0 = metrics().execute_ms, prof.start_if_asked();
      if (step >= warmup) prof.step_begins();
      auto t0 = clk::now();
      auto& [x, y] = batches[size_t(step % 4)];
      Tensor loss = cross_entropy((*model)(x), y);
      loss.backward();
      opt.step();
      opt.zero_grad();
      last_loss = loss.item();
      if (step >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(clk::now() - t0).count());
    }
    prof.report(steps);
    std::sort(ms.begin(), ms.end());
    Metrics m = metrics();
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    double med = ms[ms.size() / 2], exec = (m.execute_ms - exec0) / double(steps);
    double peak_mb = double(m.peak_bytes) / (1 << 20), rss_mb = double(ru.ru_maxrss) / 1024.0;
    std::printf("tessera %s step, batch %lld, Adam, OMP_NUM_THREADS=%s: median %.2f ms (min %.2f), in graph %.2f ms; "
                "peak %.1f MiB, max RSS %.1f MiB; load %.2f\n",
                model_name.c_str(), (long long)batch, threads.c_str(), med, ms.front(), exec, peak_mb, rss_mb, bench::load_average());
    std::printf("RESULT tessera threads=%s median_ms=%.3f peak_mb=%.1f maxrss_mb=%.1f exec_ms=%.3f last_loss=%.4f\n", threads.c_str(),
                med, peak_mb, rss_mb, exec, last_loss);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
