// Inference latency of an imported ONNX model on one device (bench/onnx_vs_ort.sh runs it beside
// onnxruntime): the model's one input from a .npy file whose first dimension is the batch; each
// timed run is split into its host part (tracing the graph: Model::run returns pending tensors)
// and the rest (sync(): the compile-cache lookup, the dispatch and the kernels).
//   bench_onnx_infer MODEL.onnx INPUT.npy [--runs N] [--warmup N] [--device D]
// prints one line: RESULT tessera batch=B threads=T runs=N median_ms=.. trace_ms=.. exec_ms=.. min_ms=..
// (T: OMP_NUM_THREADS, which the cpu backend's kernels use; "-" when unset: every core)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <tessera/io.h>
#include <tessera/onnx.h>
#include <tessera/tessera.h>

#include "bench_common.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL.onnx INPUT.npy [--runs N] [--warmup N] [--device D]\n", argv[0]);
    return 2;
  }
  int runs = 20, warmup = 3;
  std::string device = "cpu";
  for (int i = 3; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--runs") runs = std::atoi(argv[i + 1]);
    else if (flag == "--warmup") warmup = std::atoi(argv[i + 1]);
    else if (flag == "--device") device = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (runs < 1 || warmup < 1) {
    std::fprintf(stderr, "--runs and --warmup must be at least 1\n");
    return 2;
  }
  try {
    using clock = std::chrono::steady_clock;
    auto ms = [](clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
    tessera::Device dev(device);
    auto model = tessera::onnx::load(argv[1], {dev});
    model->eval();
    tessera::NoGradGuard no_grad;
    tessera::Tensor x = tessera::io::load_npy(argv[2], dev);
    tessera::sync();
    std::vector<double> total, trace, exec;
    for (int i = 0; i < warmup + runs; ++i) {
      auto t0 = clock::now();
      std::vector<tessera::Tensor> y = model->run({x});
      auto t1 = clock::now();
      tessera::sync();
      auto t2 = clock::now();
      if (i < warmup) continue;
      total.push_back(ms(t2 - t0));
      trace.push_back(ms(t1 - t0));
      exec.push_back(ms(t2 - t1));
    }
    const char* threads = std::getenv("OMP_NUM_THREADS");
    std::printf("RESULT tessera batch=%lld threads=%s runs=%d median_ms=%.4f trace_ms=%.4f exec_ms=%.4f min_ms=%.4f load=%.2f\n",
                (long long)x.size(0), threads && *threads ? threads : "-", runs, bench::percentile(total, 0.5), bench::percentile(trace, 0.5),
                bench::percentile(exec, 0.5), bench::percentile(total, 0), bench::load_average());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_onnx_infer: %s\n", e.what());
    return 1;
  }
  return 0;
}
