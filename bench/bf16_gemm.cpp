// The benchmark GPT step's matrix products in float32 (as the cpu backend runs them: f32_gemm or OpenBLAS) and
// with bfloat16 operands (autocast's products: vdpbf16ps through backends/cpu/bf16_gemm, float32
// accumulation and results), each shape on realized operands, the product alone (no operand
// rounding, which autocast's cast Steps do), median and best of repeated syncs, and GFLOP/s.
//
//   OMP_NUM_THREADS=2 taskset -c 0,1 bench_bf16_gemm [--reps N]
//
// Shapes and operand layouts: those of the step (a transposed operand is a transposed view).
// Tokens R = 16 x 64, width E = 128, vocabulary V = 114, 4 heads of 32 over 64 positions
// (64 batched products); per layer the forward products, their input gradients (dX = dY W) and
// weight gradients (dW = dY^T X); the step has 4 layers plus the head.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/cpu/bf16_gemm.h"
#include "bench_common.h"
#include "ir/node.h"
#include "tensor/tensor_impl.h"
#include "tessera/metrics.h"
#include "tessera/tensor.h"

using namespace tessera;
using clk = std::chrono::steady_clock;

namespace {
struct Shape4 {
  const char* what;
  int64_t batch, m, n, k, per_step;  // per_step: how many times the step runs it
  bool at = false, bt = false;        // A (B) stored transposed, a view of [K, M] ([N, K]) as in the step
};

Tensor product(const Tensor& a, const Tensor& b) {
  return detail::from_node(ir::make(ir::Op::Matmul, {detail::node_of(a), detail::node_of(b)}));
}

// Median and best milliseconds of one product per sync.
std::pair<double, double> time_product(const Shape4& s, DType t, int reps) {
  Shape as = s.at ? Shape{s.k, s.m} : Shape{s.m, s.k}, bs = s.bt ? Shape{s.n, s.k} : Shape{s.k, s.n};
  if (s.batch > 1) as.insert(as.begin(), s.batch), bs.insert(bs.begin(), s.batch);
  Tensor a = randn(as, {DType::Float32, Device("cpu")}).to(t), b = randn(bs, {DType::Float32, Device("cpu")}).to(t);
  tessera::sync();
  if (s.at) a = a.transpose(-2, -1);
  if (s.bt) b = b.transpose(-2, -1);
  tessera::sync();
  std::vector<double> ms;
  for (int r = 0; r < reps + 2; ++r) {
    auto t0 = clk::now();
    Tensor c = product(a, b);
    tessera::sync();
    double dt = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
    if (r >= 2) ms.push_back(dt);
  }
  return {bench::percentile(ms, 0.5), *std::min_element(ms.begin(), ms.end())};
}
}  // namespace

int main(int argc, char** argv) {
  int reps = 30;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--reps") reps = std::atoi(argv[++i]);
  const int64_t R = 1024, E = 128, V = 114, T = 64, D = 32, BH = 64, L = 4;
  // The operands' layouts are the step's (TESSERA_DUMP=fused): weights' gradients read dY
  // transposed (A by columns), input gradients W transposed (B by columns); in attention, P^T dO
  // and dS^T Q read A by columns, Q K^T and dS K B by columns (the attention labels are our
  // reading of the step's batched products; their shapes and layouts are the step's).
  std::vector<Shape4> shapes{
      {"qkv      X W", 1, R, 3 * E, E, L},            {"qkv     dY W^T", 1, R, E, 3 * E, L, false, true},
      {"qkv     X^T dY", 1, E, 3 * E, R, L, true},     {"proj     X W", 1, R, E, E, L},
      {"proj    dY W^T", 1, R, E, E, L, false, true},  {"proj    X^T dY", 1, E, E, R, L, true},
      {"fc       X W", 1, R, 4 * E, E, L},            {"fc      dY W^T", 1, R, E, 4 * E, L, false, true},
      {"fc      X^T dY", 1, E, 4 * E, R, L, true},     {"mlp.proj X W", 1, R, E, 4 * E, L},
      {"mlp.proj dY W^T", 1, R, 4 * E, E, L, false, true}, {"mlp.proj X^T dY", 1, 4 * E, E, R, L, true},
      {"head     X W", 1, R, V, E, 1},                {"head    dY W^T", 1, R, E, V, 1, false, true},
      {"head    X^T dY", 1, E, V, R, 1, true},
      {"att  Q K^T", BH, T, T, D, L, false, true},    {"att  P V", BH, T, D, T, L},
      {"att  dO V^T", BH, T, T, D, L},                {"att  P^T dO", BH, T, D, T, L, true},
      {"att  dS K", BH, T, D, T, L, false, true},     {"att  dS^T Q", BH, D, T, T, L, true},
  };
  const char* omp = std::getenv("OMP_NUM_THREADS");
  std::printf("the benchmark GPT step's products, OMP_NUM_THREADS=%s, %d syncs each (median; best), vdpbf16ps %s, load %.1f\n",
              omp ? omp : "default", reps, backends::bf16_gemm::available() ? "on" : "off (float32 + BLAS)", bench::load_average());
  std::printf("%-18s %5s %5s %5s %4s | %9s %8s | %9s %8s | %6s\n", "product", "M", "N", "K", "x", "f32 ms", "GFLOP/s", "bf16 ms",
              "GFLOP/s", "ratio");
  double f32_total = 0, bf16_total = 0, flops_total = 0;
  for (const Shape4& s : shapes) {
    const double flops = 2.0 * double(s.batch * s.m * s.n * s.k);
    auto [f, fb] = time_product(s, DType::Float32, reps);
    auto [h, hb] = time_product(s, DType::BFloat16, reps);
    std::printf("%-18s %5lld %5lld %5lld %4lld | %5.3f;%4.3f %8.1f | %5.3f;%4.3f %8.1f | %6.2f\n", s.what, (long long)s.m,
                (long long)s.n, (long long)s.k, (long long)(s.batch * s.per_step), f, fb, flops / f / 1e6, h, hb, flops / h / 1e6,
                h / f);
    f32_total += f * double(s.per_step), bf16_total += h * double(s.per_step), flops_total += flops * double(s.per_step);
  }
  std::printf("step's products: %.2f GFLOP, float32 %.2f ms (%.1f GFLOP/s), bfloat16 %.2f ms (%.1f GFLOP/s): %.2fx\n",
              flops_total / 1e9, f32_total, flops_total / f32_total / 1e6, bf16_total, flops_total / bf16_total / 1e6,
              bf16_total / f32_total);
  std::printf("RESULT bf16_gemm f32_ms=%.3f bf16_ms=%.3f ratio=%.3f bf16_flops_counted=%lld\n", f32_total, bf16_total,
              bf16_total / f32_total, (long long)metrics().bf16_flops);
  return 0;
}
