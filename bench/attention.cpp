// The fused attention Step against its decomposition on single attention calls: [B, H, T, T]
// causal self-attention, float32, per shape the median time of a forward with the pass on and
// with TESSERA_DISABLE_PASSES=attention's setting (runtime::set_disabled_passes), alternated
// call by call in one process. Threads: OMP_NUM_THREADS.
//   bench_attention [--reps N] [--backward] [--shape B,H,T,d]
//   (--backward: forward and backward of sum(y * w); --shape: that shape alone, repeatable)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_common.h"
#include "runtime/compile_options.h"
#include "tessera/tessera.h"

using namespace tessera;
using clk = std::chrono::steady_clock;

namespace {

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t T = q.shape()[2], D = q.shape()[3];
  Tensor att = matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(D)));
  TensorOptions i64{DType::Int64, q.device()};
  Tensor pos = arange(0, double(T), 1, i64);
  att = masked_fill(att, pos.reshape({1, T}) > pos.reshape({T, 1}), -INFINITY);
  return matmul(softmax(att, -1), v);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 15;
  bool train = false;
  struct S {
    int64_t b, h, t, d;
  };
  std::vector<S> only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--backward") {
      train = true;
    } else if (a == "--shape" && i + 1 < argc) {
      long long b = 0, h = 0, t = 0, d = 0;
      if (std::sscanf(argv[++i], "%lld,%lld,%lld,%lld", &b, &h, &t, &d) != 4 || b < 1 || h < 1 || t < 1 || d < 1) {
        std::fprintf(stderr, "bench_attention: --shape wants B,H,T,d (positive integers), got '%s'\n", argv[i]);
        return 2;
      }
      only.push_back({b, h, t, d});
    } else {
      std::fprintf(stderr, "usage: %s [--reps N] [--backward] [--shape B,H,T,d]...   (threads: OMP_NUM_THREADS)\n", argv[0]);
      return 2;
    }
  }
  std::vector<S> shapes = {{64, 4, 16, 32}, {32, 4, 32, 32}, {32, 4, 32, 64}, {16, 4, 48, 32}, {16, 4, 64, 32}, {8, 4, 128, 32}, {4, 4, 256, 32}, {2, 4, 512, 32}, {1, 4, 1024, 32},
                                 {16, 4, 64, 64}, {4, 4, 256, 64}, {1, 4, 1024, 64}};
  if (!only.empty()) shapes = only;
  const char* omp = std::getenv("OMP_NUM_THREADS");
  std::printf("fused attention Step%s vs decomposition, causal, float32, OMP_NUM_THREADS=%s, medians of %d\n", train ? "s (forward and backward)" : "",
              omp ? omp : "default", reps);
  std::printf("%-22s %10s %10s %8s\n", "[B, H, T, d]", "fused ms", "decomp ms", "ratio");
  for (const S& s : shapes) {
    Tensor q = randn({s.b, s.h, s.t, s.d}), k = randn({s.b, s.h, s.t, s.d}), v = randn({s.b, s.h, s.t, s.d}), w = randn({s.b, s.h, s.t, s.d});
    if (train)
      for (Tensor* x : {&q, &k, &v}) x->requires_grad_(true);
    tessera::sync();
    std::vector<double> t[2];
    for (int r = 0; r < reps + 2; ++r)
      for (int side : {0, 1}) {
        runtime::set_disabled_passes(side ? "attention" : "");
        auto t0 = clk::now();
        if (train) {  // forward and backward in one graph: the gradients of sum(y * w)
          Tensor loss = (attention(q, k, v) * w).sum();
          loss.backward();
          tessera::sync();
        } else {
          Tensor y = attention(q, k, v);
          tessera::sync();
        }
        double ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
        if (r >= 2) t[side].push_back(ms);  // two warm-up rounds: compiles
      }
    const double f = bench::percentile(t[0], 0.5), d = bench::percentile(t[1], 0.5);
    char name[64];
    std::snprintf(name, sizeof name, "[%lld, %lld, %lld, %lld]", (long long)s.b, (long long)s.h, (long long)s.t, (long long)s.d);
    std::printf("%-22s %10.3f %10.3f %8.3f\n", name, f, d, f / d);
    std::printf("RESULT attention%s b=%lld h=%lld t=%lld d=%lld fused_ms=%.4f decomposed_ms=%.4f\n", train ? "_backward" : "", (long long)s.b,
                (long long)s.h, (long long)s.t, (long long)s.d, f, d);
  }
  runtime::set_disabled_passes("");
  return 0;
}
