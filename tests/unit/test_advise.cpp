// The advisor: the cost model on hand-computed cases (a pure GEMM, a pure bandwidth Step, tile
// padding and the TPU's float32 passes, a ring all-reduce), Gemm Steps' M, N, K from the
// compiled plan, the host's predicted peak against the allocator's high-water mark (within 2%),
// the largest-batch search, the device table and JSON devices, and monotonicity over generated
// models (more memory never turns "fits" into "does not fit"; faster on both roofs is never
// predicted slower). The memory budget's rewrites: one graph, remat, then micro-batches, their
// searches, and the advisor's micro-batch count and slice footprint against the runtime's.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "backends/backend.h"
#include "core/fail.h"
#include "runtime/compile_options.h"
#include "tensor/tensor_impl.h"
#include "tessera/advise.h"
#include "tessera/metrics.h"
#include "tessera/optim.h"
#include "tessera/tessera.h"
#include "test_util.h"

namespace tessera {
namespace {

using namespace advise;

// A device with round numbers: 1 TFLOP/s vector, 8 TFLOP/s matrix, 100 GB/s, 1 us per Step.
DeviceSpec round_device() {
  DeviceSpec d;
  d.name = "round";
  d.cls = "gpu-tc";
  d.fp32_flops = 1e12;
  d.bf16_flops = 8e12;
  d.mem_bw = 1e11;
  d.mem_bytes = d.usable_bytes = 1e9;
  d.link_bw = 1e10;
  d.link_latency_s = 1e-5;
  d.matrix_eff = 0.5, d.vector_eff = 0.5, d.bw_eff = 0.5, d.link_eff = 1;
  d.launch_s = 1e-6;
  d.tile_mn = 128, d.tile_k = 128;
  d.power_w = 100;
  return d;
}

StepCost gemm(int64_t m, int64_t n, int64_t k, double bytes = 0) {
  StepCost s;
  s.gemm = true;
  s.m = m, s.n = n, s.k = k;
  s.flops = 2.0 * double(m) * double(n) * double(k);
  s.bytes = bytes;
  return s;
}

TEST(CostModel, PureGemmIsComputeBoundAtTheVectorRateInFloat32) {
  DeviceSpec d = round_device();
  StepCost s = gemm(1024, 1024, 1024, 12.0 * 1024 * 1024);  // 12 MiB: 0.25 ms at 50 GB/s
  Bottleneck why;
  double t = step_seconds(d, s, &why);
  // 2 * 1024^3 flops at 0.5 * 1e12 = 4.294967 ms, + 1 us; no padding off the matrix unit.
  EXPECT_NEAR(t, 2.0 * 1073741824.0 / 0.5e12 + 1e-6, 1e-12);
  EXPECT_EQ(why, Bottleneck::Compute);
  // A product of bfloat16 operands (autocast's) on the matrix unit: 8x the rate, 1024 is a
  // multiple of the 128 tile.
  s.dtype = DType::BFloat16;
  double tb = step_seconds(d, s, &why);
  EXPECT_NEAR(tb, 2.0 * 1073741824.0 / 4e12 + 1e-6, 1e-12);
  EXPECT_EQ(why, Bottleneck::Compute);
  // A host with a calibrated bfloat16 GEMM line (no matrix unit) runs it on that line.
  DeviceSpec h = round_device();
  h.bf16_flops = 0, h.vector_eff = 1;
  h.gemm_flops = 1e11, h.gemm_half_flops = 1e6, h.gemm_bf16_flops = 2e11, h.gemm_bf16_half_flops = 3e6;
  const double f = 2.0 * 1073741824.0;
  EXPECT_NEAR(step_seconds(h, s), f / (2e11 * f / (f + 3e6)) + 1e-6, 1e-12);
  s.dtype = DType::Float32;
  EXPECT_NEAR(step_seconds(h, s), f / (1e11 * f / (f + 1e6)) + 1e-6, 1e-12);
}

TEST(CostModel, PureBandwidthStepIsMemoryBound) {
  DeviceSpec d = round_device();
  StepCost s;
  s.flops = 1e6;  // 2 us at 0.5 TFLOP/s
  s.bytes = 1e9;  // 20 ms at 50 GB/s
  Bottleneck why;
  EXPECT_NEAR(step_seconds(d, s, &why), 0.02 + 1e-6, 1e-12);
  EXPECT_EQ(why, Bottleneck::Memory);
  // The bytes are the target plan's (its buffers' own dtypes): the model does not halve them.
  s.dtype = DType::BFloat16;
  EXPECT_NEAR(step_seconds(d, s, &why), 0.02 + 1e-6, 1e-12);
  // A tiny Step is launch-bound.
  StepCost tiny;
  tiny.flops = 10, tiny.bytes = 40;
  step_seconds(d, tiny, &why);
  EXPECT_EQ(why, Bottleneck::Launch);
}

TEST(CostModel, MatrixDimensionsArePaddedToTheTile) {
  EXPECT_EQ(pad_to(130, 128), 256);
  EXPECT_EQ(pad_to(128, 128), 128);
  EXPECT_EQ(pad_to(1, 128), 128);
  EXPECT_EQ(pad_to(7, 1), 7);
  DeviceSpec d = round_device();
  StepCost s = gemm(130, 128, 100);
  s.dtype = DType::BFloat16;
  // Padded to 256 x 128 x 128 at 0.5 * 8e12.
  EXPECT_NEAR(step_seconds(d, s), 2.0 * 256 * 128 * 128 / 4e12 + 1e-6, 1e-15);
  // A TPU runs float32 matmuls on its MXU in 6 bf16 passes (also padded).
  d.cls = "tpu";
  d.fp32_matmul_passes = 6;
  s.dtype = DType::Float32;
  EXPECT_NEAR(step_seconds(d, s), 6 * 2.0 * 256 * 128 * 128 / 4e12 + 1e-6, 1e-15);
}

TEST(CostModel, RingAllReduceIsAlphaBeta) {
  DeviceSpec d = round_device();
  // 4 replicas: 2(n-1) = 6 hops of 10 us, and 2(n-1)/n = 1.5 times 1 GB at 10 GB/s.
  EXPECT_NEAR(allreduce_seconds(d, 1e9, 4), 6e-5 + 0.15, 1e-12);
  EXPECT_EQ(allreduce_seconds(d, 1e9, 1), 0.0);
  // In a prediction it is added once per step and named the bottleneck when it dominates.
  Workload w;
  w.steps = {gemm(64, 64, 64)};
  w.tokens = 64;
  w.grad_bytes = 1e9;
  Prediction p = predict(d, w, {.data_parallel = 4});
  EXPECT_NEAR(p.comm_s, 6e-5 + 0.15, 1e-12);
  EXPECT_NEAR(p.step_s, p.comm_s + step_seconds(d, w.steps[0]), 1e-12);
  EXPECT_EQ(p.bottleneck, Bottleneck::Communication);
  EXPECT_NEAR(p.tokens_per_s, 4 * 64 / p.step_s, 1e-6);
  EXPECT_NEAR(p.tokens_per_joule, p.tokens_per_s / 400, 1e-9);
}

// Scaling efficiency: one replica's step (no all-reduce) over the data-parallel step; ZeRO-1 moves
// the same bytes and takes (R-1)/R of the optimizer state off each replica's footprint.
TEST(CostModel, ScalingEfficiencyAndZeroOneMemory) {
  DeviceSpec d = round_device();
  Workload w;
  w.steps = {gemm(64, 64, 64)};
  w.tokens = 64;
  w.grad_bytes = 1e9;
  w.state_bytes = 2e9;        // AdamW: two moments per weight
  w.plan.param_bytes = 3000000000;  // weights + moments (the plan's parameters)
  const double one = step_seconds(d, w.steps[0]);
  Prediction single = predict(d, w, {});
  EXPECT_EQ(single.replicas, 1);
  EXPECT_DOUBLE_EQ(single.scaling, 1.0);
  Prediction p = predict(d, w, {.data_parallel = 4});
  EXPECT_EQ(p.replicas, 4);
  EXPECT_NEAR(p.scaling, one / (one + 6e-5 + 0.15), 1e-12);
  EXPECT_NEAR(p.tokens_per_s, 4 * p.scaling * single.tokens_per_s, 1e-6);
  EXPECT_DOUBLE_EQ(p.peak_bytes, 3e9);
  Prediction z = predict(d, w, {.data_parallel = 4, .zero1 = true});
  EXPECT_DOUBLE_EQ(z.peak_bytes, 3e9 - 2e9 * 3 / 4);
  EXPECT_DOUBLE_EQ(z.comm_s, p.comm_s);
  EXPECT_DOUBLE_EQ(predict(d, w, {.zero1 = true}).peak_bytes, 3e9) << "one replica holds all of the state";
}

// Tensor parallel by hand: 4 devices as 2 data-parallel replicas x 2, a GPT of 2 blocks whose
// all-reduced activation is B x T x C = 8 x 128 x 256 float32 = 1 MiB.
TEST(CostModel, TensorParallelPricesMegatronsAllReducesByHand) {
  DeviceSpec d = round_device();
  Workload w;
  StepCost split = gemm(512, 512, 512), whole = gemm(64, 64, 64);
  split.split_fraction = 1;
  w.steps = {split, whole};
  w.tokens = 8 * 128;
  w.grad_bytes = 1e9;
  w.state_bytes = 2e9;
  w.plan.param_bytes = 3000000000;
  w.tp_blocks = 2;
  w.tp_heads = 4;
  w.tp_activation_bytes = 8.0 * 128 * 256 * 4;  // 1048576 bytes
  w.tp_split_param_bytes = 6e8;
  Prediction p = predict(d, w, {.data_parallel = 4, .tensor_parallel = 2});
  EXPECT_EQ(p.replicas, 4);
  EXPECT_EQ(p.tensor_parallel, 2);
  EXPECT_DOUBLE_EQ(p.tp_allreduce_bytes, 1048576);
  // One all-reduce over the 2 devices: 2(2-1) = 2 hops of 10 us, 2(2-1)/2 = 1 x 1 MiB at 10 GB/s;
  // 4 per block (2 forward, 2 backward), 2 blocks.
  const double one_allreduce = 2e-5 + 1048576 / 1e10;
  EXPECT_NEAR(p.tp_comm_s, 8 * one_allreduce, 1e-15);
  EXPECT_NEAR(p.tp_comm_s, 9.988608e-4, 1e-12);
  // The gradients over the 2 data-parallel replicas: 1e9 less half of the split 6e8 = 7e8 bytes.
  EXPECT_NEAR(p.dp_comm_s, 2e-5 + 7e8 / 1e10, 1e-12);
  EXPECT_NEAR(p.comm_s, p.tp_comm_s + p.dp_comm_s, 1e-15);
  // The split GEMM at half its flops (2 x 512^3 / 2, float32: the vector rate 1 TFLOP/s x 0.5), the other whole.
  StepCost half = split;
  half.flops /= 2;
  const double compute = step_seconds(d, half) + step_seconds(d, whole);
  EXPECT_NEAR(step_seconds(d, half), 512.0 * 512 * 512 / 5e11 + 1e-6, 1e-15);
  EXPECT_NEAR(p.step_s, compute + p.comm_s, 1e-12);
  // Scaling: one device's whole step over M times this one; tokens/s: 2 replicas' tokens.
  const double one_device = step_seconds(d, split) + step_seconds(d, whole);
  EXPECT_NEAR(p.scaling, one_device / (2 * p.step_s), 1e-12);
  EXPECT_NEAR(p.tokens_per_s, 2 * 8 * 128 / p.step_s, 1e-6);
  // Memory: the split matrices' weights and two moments halve: 3e9 - 3 x 6e8 / 2.
  EXPECT_DOUBLE_EQ(p.peak_bytes, 3e9 - 9e8);
  // ZeRO-1 on top shards the state left (2e9 - 6e8) over the 2 data-parallel replicas.
  EXPECT_DOUBLE_EQ(predict(d, w, {.data_parallel = 4, .zero1 = true, .tensor_parallel = 2}).peak_bytes, 3e9 - 9e8 - 1.4e9 / 2);
  // Tensor parallel 1 is the data-parallel prediction.
  Prediction dp = predict(d, w, {.data_parallel = 4});
  EXPECT_DOUBLE_EQ(dp.tp_comm_s, 0);
  EXPECT_NEAR(dp.scaling, one_device / dp.step_s, 1e-12);
  EXPECT_NEAR(dp.comm_s, 6e-5 + 0.15, 1e-12);
  // Refusals: a split that does not divide the devices or the heads; a workload that is not a GPT's.
  std::string e = testing::error_message([&] { predict(d, w, {.data_parallel = 4, .tensor_parallel = 3}); });
  EXPECT_NE(e.find("--tensor-parallel 3 does not divide the 4 devices of 4 x 'round'"), std::string::npos) << e;
  e = testing::error_message([&] { predict(d, w, {.data_parallel = 8, .tensor_parallel = 8}); });
  EXPECT_NE(e.find("--tensor-parallel 8 does not divide the model's 4 heads"), std::string::npos) << e;
  w.tp_blocks = 0;
  e = testing::error_message([&] { predict(d, w, {.data_parallel = 2, .tensor_parallel = 2}); });
  EXPECT_NE(e.find("tensor parallelism is priced for a GPT's step only"), std::string::npos) << e;
}

TEST(Workload, GemmStepsCarryMNKFromTheCompiledPlan) {
  Tensor a = testing::random_tensor({2, 3, 5}, DType::Float32, 1), b = testing::random_tensor({2, 5, 7}, DType::Float32, 2);
  sync();
  int64_t launched = metrics().steps_launched;
  Tensor c = matmul(a, b);
  Workload w = workload_of({c});
  EXPECT_EQ(metrics().steps_launched, launched) << "compile only";
  int gemms = 0;
  for (auto& s : w.steps)
    if (s.gemm) {
      ++gemms;
      EXPECT_EQ(s.m, 3);
      EXPECT_EQ(s.n, 7);
      EXPECT_EQ(s.k, 5);
      EXPECT_EQ(s.batch, 2);
      EXPECT_DOUBLE_EQ(s.elements, 2.0 * 3 * 7);  // its output's elements (the host's per-output term)
      EXPECT_DOUBLE_EQ(s.flops, 2.0 * 2 * 3 * 5 * 7);
    }
  EXPECT_EQ(gemms, 1);
  EXPECT_GT(w.plan.peak_bytes, 0u);
}

// A Step's transcendental flops (exp, tanh, ...) and a Gemm's epilogue flops, from its sources:
// tanh(a @ b + bias) is one Gemm Step whose epilogue adds the bias and takes the tanh (one flop
// per output element each); exp(x) * x + x one Elementwise Step with 1 of its 3 flops per element
// transcendental.
TEST(Workload, StepsCarryTheirTranscendentalAndEpilogueFlops) {
  Tensor a = testing::random_tensor({8, 5}, DType::Float32, 1), b = testing::random_tensor({5, 6}, DType::Float32, 2);
  Tensor bias = testing::random_tensor({6}, DType::Float32, 3), x = testing::random_tensor({100}, DType::Float32, 4);
  sync();
  Workload w = workload_of({tanh(matmul(a, b) + bias)});
  double gemm_flops = 0, epilogue = 0, trans = 0;
  for (auto& s : w.steps) {
    EXPECT_FALSE(s.kind.empty());
    if (s.gemm) gemm_flops += s.flops, epilogue += s.epilogue_flops;
    trans += s.transcendental_flops;
  }
  EXPECT_DOUBLE_EQ(gemm_flops, 2.0 * 8 * 5 * 6 + 2.0 * 8 * 6) << "the bias and tanh fused as the Gemm's epilogue";
  EXPECT_DOUBLE_EQ(epilogue, 2.0 * 8 * 6);
  EXPECT_DOUBLE_EQ(trans, 8.0 * 6);
  Workload e = workload_of({exp(x) * x + x});
  ASSERT_EQ(e.steps.size(), 1u);
  EXPECT_EQ(e.steps[0].kind, "elementwise");
  EXPECT_DOUBLE_EQ(e.steps[0].flops, 300);
  EXPECT_DOUBLE_EQ(e.steps[0].transcendental_flops, 100);
  EXPECT_DOUBLE_EQ(e.steps[0].epilogue_flops, 0);
}

// The calibrated host's terms by hand: transcendental flops at their own rate and the rest at the
// arithmetic rate; a Gemm's epilogue at those rates besides its product on the GEMM line; the
// bandwidth by the Step's bytes from the cache curve, mem_bw beyond it, reduce_bw for a Reduce.
TEST(CostModel, CalibratedHostPricesVectorFlopsByKindAndBytesBySize) {
  DeviceSpec h = round_device();
  h.bf16_flops = 0, h.vector_eff = 1, h.bw_eff = 1, h.launch_s = 1e-6;
  h.fp32_flops = 1e10, h.transcendental_flops = 1e9;
  h.gemm_flops = 1e11, h.gemm_half_flops = 0;
  h.mem_bw = 1e10;
  h.cache_bw = {{1e6, 1e11}, {1e7, 5e10}};
  h.reduce_bw = 2e10;
  StepCost s;
  s.kind = "elementwise";
  s.flops = 3e6, s.transcendental_flops = 1e6, s.bytes = 1e3;
  Bottleneck why;
  EXPECT_NEAR(step_seconds(h, s, &why), 2e6 / 1e10 + 1e6 / 1e9 + 1e-6, 1e-12);  // 0.2 ms + 1 ms
  EXPECT_EQ(why, Bottleneck::Compute);
  s.flops = 1e3, s.transcendental_flops = 0;
  s.bytes = 5e5;  // within the first cache entry: 100 GB/s
  EXPECT_NEAR(step_seconds(h, s, &why), 5e5 / 1e11 + 1e-6, 1e-12);
  EXPECT_EQ(why, Bottleneck::Memory);
  s.bytes = 5e6;  // the second: 50 GB/s
  EXPECT_NEAR(step_seconds(h, s), 5e6 / 5e10 + 1e-6, 1e-12);
  s.bytes = 5e7;  // beyond the curve: mem_bw
  EXPECT_NEAR(step_seconds(h, s), 5e7 / 1e10 + 1e-6, 1e-12);
  s.kind = "reduce", s.bytes = 5e5;  // a column sum: reduce_bw whatever its size
  EXPECT_NEAR(step_seconds(h, s), 5e5 / 2e10 + 1e-6, 1e-12);
  // A Gemm: 2e9 product flops on the line (20 ms), its epilogue of 1e6 flops, half of them tanh,
  // at the vector rates besides (0.05 + 0.5 ms).
  StepCost g = gemm(1000, 1000, 1000);
  g.kind = "gemm";
  g.flops += 1e6, g.epilogue_flops = 1e6, g.transcendental_flops = 5e5;
  EXPECT_NEAR(step_seconds(h, g), 2e9 / 1e11 + 5e5 / 1e10 + 5e5 / 1e9 + 1e-6, 1e-12);
  // Elsewhere (no transcendental rate) the epilogue is priced with the product, as before.
  h.transcendental_flops = 0;
  EXPECT_NEAR(step_seconds(h, g), (2e9 + 1e6) / 1e11 + 1e-6, 1e-12);
}

// The host's GEMM line by hand: groups of three products timed as t = f / peak + outputs * out_s
// + 3 * c are fitted back exactly (three groups, three unknowns); the intercept is per product,
// not per group (a group's time beyond its flops is three products' overheads).
TEST(CostModel, HostGemmLineIsFittedPerProductWithItsOutputTerm) {
  const double peak = 2e11, out_s = 5e-11, c = 4e-6;
  auto group = [&](double T, double C, double N) {
    GemmSample g;
    g.flops = 6 * T * C * N;
    g.outputs = T * N + T * C + C * N;
    g.products = 3;
    g.seconds = g.flops / peak + g.outputs * out_s + 3 * c;
    return g;
  };
  // Group 1: 6 * 256 * 128 * 128 = 25,165,824 flops (125.83 us), 81,920 outputs (4.096 us), 12 us.
  const GemmSample g1 = group(256, 128, 128);
  EXPECT_DOUBLE_EQ(g1.flops, 25165824.0);
  EXPECT_DOUBLE_EQ(g1.outputs, 81920.0);
  EXPECT_NEAR(g1.seconds, 125.82912e-6 + 4.096e-6 + 12e-6, 1e-15);
  GemmLine l = gemm_line({g1, group(1024, 128, 512), group(2048, 512, 512)});
  EXPECT_NEAR(l.peak_flops / peak, 1.0, 1e-9);
  EXPECT_NEAR(l.out_s / out_s, 1.0, 1e-6);
  EXPECT_NEAR(l.half_flops, c * peak, 1e-3);  // 800,000 flops: one product's 4 us, not the group's 12
  // One product of the first group's forward shape (256 x 128 x 128) on this line:
  // 8,388,608 flops / 2e11 = 41.94304 us, + 32,768 outputs * 5e-11 = 1.6384 us, + 4 us, + launch.
  DeviceSpec h = round_device();
  h.bf16_flops = 0, h.vector_eff = 1, h.fp32_flops = 1e10, h.transcendental_flops = 1e9, h.launch_s = 1e-6;
  h.gemm_flops = l.peak_flops, h.gemm_half_flops = l.half_flops, h.gemm_out_s = l.out_s;
  StepCost s = gemm(256, 128, 128);
  s.elements = 256 * 128;
  EXPECT_NEAR(step_seconds(h, s), 41.94304e-6 + 1.6384e-6 + 4e-6 + 1e-6, 1e-10);
  // Two groups (what the calibration times): the line through them without the output term,
  // its intercept per product. Times f / peak + 3c: group 1 137.83 us, group 2 (6 * 2048 * 512 *
  // 512 = 3,221,225,472 flops) 16,106.13 us + 12 us: peak 2e11 and 800,000 flops per product.
  auto plain = [&](double T, double C, double N) {
    GemmSample g = group(T, C, N);
    g.seconds = g.flops / peak + 3 * c;
    return g;
  };
  l = gemm_line({plain(256, 128, 128), plain(2048, 512, 512)});
  EXPECT_NEAR(l.peak_flops / peak, 1.0, 1e-9);
  EXPECT_DOUBLE_EQ(l.out_s, 0);
  EXPECT_NEAR(l.half_flops, c * peak, 1e-3);
  // Timings with no output term fit out_s = 0 (a negative fitted term is dropped, not kept).
  auto flat = [&](double T, double C, double N, double extra) {
    GemmSample g = group(T, C, N);
    g.seconds = g.flops / peak + 3 * c + extra;
    return g;
  };
  l = gemm_line({flat(256, 128, 128, 0), flat(1024, 128, 512, -2e-6), flat(2048, 512, 512, 0)});
  EXPECT_GE(l.out_s, 0);
  EXPECT_GT(l.peak_flops, 0);
  EXPECT_GE(l.half_flops, 0);
}

// A Row Step on the calibrated host by hand: its flops and its bytes at their rates, added (a row
// loop passes over the row more than once), plus row_element_s per output element and row_s.
TEST(CostModel, HostRowStepPaysItsPassesPerElementAndPerStep) {
  DeviceSpec h = round_device();
  h.bf16_flops = 0, h.vector_eff = 1, h.bw_eff = 1, h.launch_s = 1e-6;
  h.fp32_flops = 1e10, h.transcendental_flops = 1e9, h.mem_bw = 1e10, h.cache_bw = {{1e7, 1e11}};
  h.row_element_s = 3e-10, h.row_s = 1e-5;
  StepCost s;
  s.kind = "row";
  s.flops = 2e6, s.transcendental_flops = 1e5, s.bytes = 5e6, s.elements = 131072;
  // 1.9e6 / 1e10 = 190 us, + 1e5 / 1e9 = 100 us, + 5e6 / 1e11 = 50 us, + 131072 * 0.3 ns = 39.3216 us,
  // + 10 us, + 1 us.
  EXPECT_NEAR(step_seconds(h, s), 190e-6 + 100e-6 + 50e-6 + 39.3216e-6 + 10e-6 + 1e-6, 1e-12);
  // Another kind with the same figures: the larger of flops and bytes only.
  s.kind = "elementwise";
  EXPECT_NEAR(step_seconds(h, s), 290e-6 + 1e-6, 1e-12);
  // The row line through two layer norms' residuals: 16,384 elements 15 us, 131,072 elements 40 us:
  // 25 us / 114,688 elements = 217.98 ps per element, 15 us - 16,384 * that = 11.4286 us.
  auto [el, c] = row_line({16384, 15e-6}, {131072, 40e-6});
  EXPECT_NEAR(el, 25e-6 / 114688, 1e-18);
  EXPECT_NEAR(c, 15e-6 - 16384 * 25e-6 / 114688, 1e-12);
  // A negative intercept: through the origin; a negative slope: the mean per Step.
  std::tie(el, c) = row_line({1000, 1e-6}, {2000, 3e-6});
  EXPECT_DOUBLE_EQ(c, 0);
  EXPECT_NEAR(el, (1000 * 1e-6 + 2000 * 3e-6) / (1000.0 * 1000 + 2000.0 * 2000), 1e-18);
  std::tie(el, c) = row_line({1000, 4e-6}, {2000, 2e-6});
  EXPECT_DOUBLE_EQ(el, 0);
  EXPECT_NEAR(c, 3e-6, 1e-18);
}

nn::GPTConfig tiny_gpt(int64_t layers = 1, int64_t embd = 32, int64_t block = 16, int64_t vocab = 28) {
  return {.vocab = vocab, .block = block, .embd = embd, .heads = 2, .layers = layers, .dropout = 0.0, .bias = true, .tied_head = false};
}

// The host's fused attention Step by hand: its products' flops over the causal range at the
// calibrated rate, plus a term per (query, key) pair, plus its bytes at the curve's rate, added;
// the backward at its own terms; without the terms (another device) priced as any Step, by the
// decomposition's flops.
TEST(CostModel, HostAttentionStepIsPricedPerFlopAndPairOfItsCausalRange) {
  DeviceSpec h = round_device();
  h.bf16_flops = 0, h.vector_eff = 1, h.bw_eff = 1, h.launch_s = 1e-6;
  h.fp32_flops = 1e10, h.transcendental_flops = 1e9;
  h.mem_bw = 1e10;
  h.cache_bw = {{1e6, 1e11}};
  h.attention_flops = 2e10, h.attention_pair_s = 1e-9;
  h.attention_bwd_flops = 1e10, h.attention_bwd_pair_s = 3e-9;
  StepCost a;
  a.kind = "attention";
  a.flops = 9e8, a.transcendental_flops = 1e7;  // the decomposition's, which the host does not price
  a.bytes = 5e5;
  a.attention_pairs = 1e6, a.attention_flops = 1.28e8;  // 128 flops per pair (head dimension 32)
  Bottleneck why;
  EXPECT_NEAR(step_seconds(h, a, &why), 1.28e8 / 2e10 + 1e6 * 1e-9 + 5e5 / 1e11 + 1e-6, 1e-12);  // 6.4 + 1 + 0.005 ms
  EXPECT_EQ(why, Bottleneck::Compute);
  a.attention_backward = true, a.attention_flops = 3.2e8, a.bytes = 2e6;  // beyond the curve: mem_bw
  EXPECT_NEAR(step_seconds(h, a), 3.2e8 / 1e10 + 1e6 * 3e-9 + 2e6 / 1e10 + 1e-6, 1e-12);
  DeviceSpec t4 = find_device(builtin_devices(), "t4");  // no attention terms: the decomposition's flops
  StepCost plain = a;
  plain.attention_pairs = 0, plain.attention_flops = 0, plain.attention_backward = false;
  plain.kind = "elementwise";
  EXPECT_DOUBLE_EQ(step_seconds(t4, a), step_seconds(t4, plain));
}

// The host's time outside Steps: tracing and preparing the graph again (a cache hit, as every
// step after the first), measured on the cpu's own plan only and added where add_trace_time says.
TEST(GptWorkloads, HostStepAddsTracingAndPreparingTheGraph) {
  GptWorkloads w(tiny_gpt());
  const int64_t compiled = metrics().graphs_compiled;
  const Workload& cpu = w.at(3);
  EXPECT_EQ(metrics().graphs_compiled, compiled + 1) << "the second preparation is a cache hit";
  EXPECT_GT(cpu.trace_s, 0);
  EXPECT_GT(cpu.prepare_s, 0);
  DeviceSpec d = round_device();
  EXPECT_EQ(w.at(3, d, DType::Float32).prepare_s, 0) << "only the cpu's own plan";
  d.add_trace_time = true;
  EXPECT_DOUBLE_EQ(predict(d, cpu, {}).trace_s, cpu.trace_s + cpu.prepare_s);
  d.add_trace_time = false;
  EXPECT_DOUBLE_EQ(predict(d, cpu, {}).trace_s, 0);
}

// The GPT's tensor-parallel figures: the activation all-reduced, the split matrices' bytes (qkv
// and fc with their biases, both projections' weights) by hand, and the blocks' Steps marked.
TEST(GptWorkloads, TensorParallelFiguresOfTheGpt) {
  GptWorkloads g(tiny_gpt());  // embd 32, block 16, 1 layer, 2 heads
  const Workload& w = g.at(3);
  EXPECT_EQ(w.tp_blocks, 1);
  EXPECT_EQ(w.tp_heads, 2);
  EXPECT_DOUBLE_EQ(w.tp_activation_bytes, 3.0 * 16 * 32 * 4);
  // qkv 32 x 96 + 96, attn proj 32 x 32, fc 32 x 128 + 128, mlp proj 128 x 32: float32.
  EXPECT_DOUBLE_EQ(w.tp_split_param_bytes, (32.0 * 96 + 96 + 32 * 32 + 32 * 128 + 128 + 128 * 32) * 4);
  double split = 0, all = 0;
  int gemms_split = 0;
  for (const StepCost& s : w.steps) {
    EXPECT_GE(s.split_fraction, 0);
    EXPECT_LE(s.split_fraction, 1);
    split += s.flops * s.split_fraction;
    all += s.flops;
    if (s.gemm && s.split_fraction == 1) ++gemms_split;
  }
  // Forward and backward of qkv, the two attention products, proj, fc and proj: at least 7 x 2.
  EXPECT_GE(gemms_split, 14);
  EXPECT_GT(split, 0.5 * all) << "the blocks' products are most of the step's flops";
  EXPECT_LT(split, all) << "the head, embeddings and update are not split";
}

TEST(GptWorkloads, CompilesWithoutRunningAndRestoresTheModel) {
  GptWorkloads g(tiny_gpt());
  int64_t launched = metrics().steps_launched;
  const Workload& w = g.at(3);
  EXPECT_EQ(metrics().steps_launched, launched) << "tracing a batch size must not run anything";
  EXPECT_TRUE(detail::pending_impls().empty()) << "the model and optimizer state are put back as they were";
  EXPECT_EQ(w.batch, 3);
  EXPECT_DOUBLE_EQ(w.tokens, 3.0 * 16);
  EXPECT_GT(w.steps.size(), 20u);
  EXPECT_GT(w.grad_bytes, 0);
  // Params, both AdamW moments: the plan holds at least three copies of the weights.
  EXPECT_GE(double(w.plan.param_bytes), 3 * w.grad_bytes);
  // A second batch size traces the same restored model: same parameters, more activations.
  const Workload& w2 = g.at(6);
  EXPECT_EQ(w2.plan.param_bytes - w.plan.param_bytes, 2 * 3 * 16 * sizeof(int64_t)) << "only the token batches grow";
  EXPECT_GT(w2.plan.peak_bytes, w.plan.peak_bytes);
}

// Each device's workload is compiled for its own properties: a GPU's arena aligns temporaries to
// 256 bytes, a TPU's buffers are tiled (8 x 128); bfloat16 is the step traced under Autocast (the
// products' operands bfloat16, float32 master weights, moments and gradients); the host's plan is
// the cpu's. The flops do not depend on the layout (the GPU's and the TPU's plans); the cpu's
// products write the qkv gradient in place (Target::gemm_out_strides), which saves the add of its
// three pads, so the host's plan computes fewer.
TEST(GptWorkloads, EachDeviceGetsItsOwnPlan) {
  GptWorkloads g(tiny_gpt());
  std::vector<DeviceSpec> t = builtin_devices();
  DeviceSpec t4 = find_device(t, "t4"), tpu = find_device(t, "tpu-v3-core"), h100 = find_device(t, "h100");
  const Workload& host = g.at(4);
  const Workload& gpu = g.at(4, t4, DType::Float32);
  const Workload& tp = g.at(4, tpu, DType::Float32);
  const Workload& half = g.at(4, t4, DType::BFloat16);
  EXPECT_EQ(&g.at(4, h100, DType::Float32), &gpu) << "devices with equal properties share one plan";
  int temps = 0;
  for (const PlannedBuffer& b : gpu.plan.buffers)
    if (b.kind == "temp") {
      EXPECT_EQ(b.offset % 256, 0u) << b.op;
      ++temps;
    }
  EXPECT_GT(temps, 10);
  // The same GPU at the host's 64-byte alignment: the same Steps and live bytes, a smaller arena.
  // (The host's own plan differs in its Steps: the cpu writes gradients in place, merges Reduces.)
  DeviceSpec t4_64 = t4;
  t4_64.name = "t4-align64";
  t4_64.alignment = 64;
  const Workload& narrow = g.at(4, t4_64, DType::Float32);
  EXPECT_NE(&narrow, &gpu);
  EXPECT_GT(gpu.plan.arena_bytes, narrow.plan.arena_bytes);
  EXPECT_EQ(gpu.plan.peak_bytes, narrow.plan.peak_bytes) << "alignment pads the arena, not the live bytes";
  // embd 32, 2 heads of 16, block 16: tiles pad every minor dimension to 128 columns.
  EXPECT_GT(tp.plan.param_bytes, 2 * host.plan.param_bytes);
  EXPECT_GT(tp.footprint_bytes(), 2 * host.footprint_bytes());
  EXPECT_GT(tp.grad_bytes, host.grad_bytes) << "the all-reduced gradients are the tiled buffers";
  int bf16_buffers = 0, bf16_products = 0, f32_products = 0;
  for (const PlannedBuffer& b : half.plan.buffers) bf16_buffers += b.dtype == DType::BFloat16;
  for (const StepCost& c : half.steps) c.gemm && c.dtype == DType::BFloat16 ? ++bf16_products : c.gemm ? ++f32_products : 0;
  EXPECT_GT(bf16_buffers, 0) << "the products' bfloat16 operands";
  EXPECT_GT(bf16_products, 10);
  EXPECT_EQ(f32_products, 0) << "every product of the step runs in bfloat16";
  EXPECT_EQ(half.plan.param_bytes, gpu.plan.param_bytes) << "float32 master weights and moments";
  EXPECT_DOUBLE_EQ(half.grad_bytes, gpu.grad_bytes) << "float32 gradients";
  EXPECT_NE(&g.at(4, t4, DType::BFloat16), &gpu) << "the dtype is part of the memo's key";
  double fh = 0, ft = 0, fg = 0, bg = 0, bt = 0;
  for (auto& s : host.steps) fh += s.flops;
  for (auto& s : gpu.steps) fg += s.flops, bg += s.bytes;
  for (auto& s : tp.steps) ft += s.flops, bt += s.bytes;
  EXPECT_DOUBLE_EQ(ft, fg);
  EXPECT_LT(fh, fg) << "the cpu adds no pads";
  EXPECT_GT(bt, bg) << "tiled buffers move more bytes";
  // A device that does not compute the step's dtypes is refused with its name, and the model is
  // put back (the next compile still works).
  DeviceSpec odd = t4;
  odd.name = "no-bf16";
  odd.dtypes = {DType::Bool, DType::Int64, DType::Float32};
  std::string msg = testing::error_message([&] { g.at(4, odd, DType::BFloat16); });
  EXPECT_NE(msg.find("does not compile for device 'no-bf16'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bfloat16 is not computed"), std::string::npos) << msg;
  EXPECT_TRUE(detail::pending_impls().empty());
  EXPECT_EQ(g.at(5).batch, 5);
}

// A device whose plan is the cpu's own (DeviceSpec::backend "cpu", as the host's): the step the
// runtime runs there, attention over 64 keys fused into one Step each way (pairs and flops of the
// causal range by hand), the same Workload as the cpu's; a device without it (a T4, or the same
// figures posed) gets the decomposition: the four score and probability products per layer and
// no attention Step.
TEST(GptWorkloads, TheHostPricesTheCpusOwnPlanWithItsFusedAttention) {
  GptWorkloads g(tiny_gpt(2, 32, 64));  // 2 layers, 2 heads of 16, 64 positions
  DeviceSpec host = round_device();
  host.name = "host-like";
  host.backend = "cpu";
  const Workload& h = g.at(4, host, DType::Float32);
  EXPECT_EQ(&h, &g.at(4)) << "the cpu's own plan";
  EXPECT_GT(h.prepare_s, 0) << "the host's graph preparation";
  const double pairs = 4.0 * 2 * 64 * 65 / 2;  // batch x heads x the causal triangle
  int fwd = 0, bwd = 0, gemms = 0;
  for (const StepCost& s : h.steps) {
    gemms += s.gemm;
    if (s.kind != "attention") continue;
    EXPECT_DOUBLE_EQ(s.attention_pairs, pairs);
    EXPECT_DOUBLE_EQ(s.attention_flops, pairs * (s.attention_backward ? 6 * 16 + 4 * 16 : 2 * (16 + 16)));
    ++(s.attention_backward ? bwd : fwd);
  }
  EXPECT_EQ(fwd, 2);
  EXPECT_EQ(bwd, 2);
  DeviceSpec posed = host;  // the same figures without the cpu's plan
  posed.backend.clear();
  for (const DeviceSpec& d : {find_device(builtin_devices(), "t4"), posed}) {
    const Workload& w = g.at(4, d, DType::Float32);
    int attention = 0, products = 0;
    for (const StepCost& s : w.steps) attention += s.kind == "attention", products += s.gemm;
    EXPECT_EQ(attention, 0) << d.name;
    EXPECT_EQ(products, gemms + 2 * 6) << d.name << ": Q K^T, P V and their four gradients per layer";
    EXPECT_GT(w.footprint_bytes(), 1.1 * h.footprint_bytes()) << d.name << ": the scores and probabilities in memory";
  }
  // Under bfloat16 too: the cpu's products round their operands as they pack them (autocast's
  // cast Steps folded into them), which the portable plan runs as Steps of their own.
  EXPECT_LT(g.at(4, host, DType::BFloat16).steps.size(), g.at(4, posed, DType::BFloat16).steps.size());
  DeviceSpec odd = host;
  odd.backend = "cuda";
  std::string msg = testing::error_message([&] { g.at(4, odd, DType::Float32); });
  EXPECT_NE(msg.find("backend 'cuda' is not one the advisor plans for"), std::string::npos) << msg;
  EXPECT_TRUE(detail::pending_impls().empty());
}

// The host's predicted footprint with attention fused (64 positions) is the runtime's own planned
// figure (the plan of the step it ran: parameters and what the run allocates) and within 2% of
// the allocator's high-water mark; the decomposition's (the portable plan) is far above both.
TEST(HostMemory, TheFusedPlansPeakIsTheRuntimes) {
  const nn::GPTConfig cfg = tiny_gpt(2, 32, 64);
  DeviceSpec host = round_device();
  host.backend = "cpu";
  host.alignment = 64;
  GptWorkloads g(cfg);
  const double predicted = g.at(4, host, DType::Float32).footprint_bytes();
  DeviceSpec posed = host;
  posed.backend.clear();
  const double portable = g.at(4, posed, DType::Float32).footprint_bytes();
  Measured m = measure_gpt_on_host(cfg, 4, 1, 2);
  const MemoryPlan ran = last_memory_plan();
  std::printf("[advise] fused attention: predicted %.0f B, the runtime planned %.0f B, high-water %.0f B; decomposition %.0f B\n",
              predicted, double(ran.param_bytes + ran.run_bytes()), m.high_water_bytes, portable);
  EXPECT_DOUBLE_EQ(predicted, double(ran.param_bytes + ran.run_bytes()));
  EXPECT_NEAR(predicted / m.high_water_bytes, 1.0, 0.02);
  EXPECT_GT(portable, 1.1 * m.high_water_bytes);
}

TEST(HostMemory, PredictedPeakMatchesTheAllocatorHighWaterWithin2Percent) {
  for (int64_t batch : {2, 8}) {
    nn::GPTConfig cfg = tiny_gpt(2, 32, 16);
    GptWorkloads g(cfg);
    double predicted = g.at(batch).footprint_bytes();
    Measured m = measure_gpt_on_host(cfg, batch, 2, 2);
    std::printf("[advise] batch %lld: predicted peak %.0f B, allocator high-water %.0f B, ratio %.4f\n", (long long)batch,
                predicted, m.high_water_bytes, predicted / m.high_water_bytes);
    EXPECT_NEAR(predicted / m.high_water_bytes, 1.0, 0.02);
  }
}

TEST(GptWorkloads, MaxBatchIsTheLargestThatFits) {
  GptWorkloads g(tiny_gpt());
  DeviceSpec d = find_device(builtin_devices(), "t4");
  d.usable_bytes = g.at(5, d, DType::Float32).footprint_bytes() + 1;
  int64_t b = g.max_batch(d, DType::Float32);
  EXPECT_GE(b, 5);
  EXPECT_LE(g.at(b, d, DType::Float32).footprint_bytes(), d.usable_bytes);
  EXPECT_GT(g.at(b + 1, d, DType::Float32).footprint_bytes(), d.usable_bytes);
  // bfloat16 (autocast) holds its own plan: the largest batch that fits it, found the same way.
  const int64_t bb = g.max_batch(d, DType::BFloat16);
  EXPECT_GE(bb, 1);
  EXPECT_LE(g.at(bb, d, DType::BFloat16).footprint_bytes(), d.usable_bytes);
  EXPECT_GT(g.at(bb + 1, d, DType::BFloat16).footprint_bytes(), d.usable_bytes);
  DeviceSpec small = d;
  small.usable_bytes = g.at(1, d, DType::Float32).footprint_bytes() - 1;
  EXPECT_EQ(g.max_batch(small, DType::Float32), 0) << "nothing fits";
  DeviceSpec huge = d;
  huge.usable_bytes = 1e12;
  EXPECT_LE(g.max_batch(huge, DType::Float32, 64), 64) << "the search stops at its limit";
}

// The advisor's ladder below is one graph, remat, then micro-batches: batch unstacking inside the
// step (the "unstack" budget pass, which the advisor does not price apart yet) is off in these.

// The memory budget's rewrites as the runtime applies them under a budget of the device's usable
// memory: one graph while it fits, then one graph rematerialized, then the fewest micro-batches.
// The model has activations well above its parameters (block 64), so rematerialization reaches
// 0.9 of the plain footprint but not what a one-row slice needs.
TEST(GptWorkloads, FitTakesOneGraphThenRematThenTheFewestMicroBatches) {
  testing::PassesOff no_unstack("unstack");
  const nn::GPTConfig cfg = tiny_gpt(1, 32, 64);
  GptWorkloads g(cfg);
  DeviceSpec d = find_device(builtin_devices(), "t4");
  const DType f32 = DType::Float32;
  const double plain = g.at(8, d, f32).footprint_bytes();
  int64_t nparams = 0;  // by the model, not the advisor: a slice holds beside it the gradients and both moments
  {
    nn::GPT m(cfg);
    for (const Tensor& p : m.parameters()) nparams += p.numel();
  }
  const Workload& one_row = g.slice(1, d, f32);
  EXPECT_DOUBLE_EQ(one_row.beside_bytes, 3.0 * 4.0 * double(nparams));
  EXPECT_EQ(one_row.grad_bytes, 0) << "the update all-reduces the gradients, once";
  EXPECT_TRUE(detail::pending_impls().empty()) << "the model is put back after a slice";

  d.usable_bytes = plain;
  Fit f = g.fit(8, d, f32);
  EXPECT_TRUE(f.fits);
  EXPECT_EQ(f.micro_batches, 1);
  EXPECT_EQ(f.recomputed_steps, 0);
  EXPECT_DOUBLE_EQ(f.slowdown(), 1.0);

  d.usable_bytes = 0.9 * plain;
  f = g.fit(8, d, f32);
  EXPECT_TRUE(f.fits);
  EXPECT_EQ(f.micro_batches, 1);
  EXPECT_GT(f.recomputed_steps, 0);
  EXPECT_LE(f.peak_bytes, d.usable_bytes);
  EXPECT_GT(f.slowdown(), 1.0) << "recomputed Steps cost time";
  EXPECT_EQ(f.recomputed_steps, g.rematerialized(8, d, f32).plan.recomputed_steps);

  // Room for a one-row slice only: 8 micro-batches, priced as 7 slices plus the whole step at one row.
  d.usable_bytes = one_row.footprint_bytes();
  ASSERT_GT(g.slice(2, d, f32).footprint_bytes(), d.usable_bytes);
  EXPECT_TRUE(g.rematerialized(8, d, f32).over_budget);
  f = g.fit(8, d, f32);
  EXPECT_TRUE(f.fits);
  EXPECT_EQ(f.micro_batches, 8);
  EXPECT_DOUBLE_EQ(f.peak_bytes, one_row.footprint_bytes());
  EXPECT_DOUBLE_EQ(f.step_s, 7 * predict(d, one_row, {}).step_s + predict(d, g.at(1, d, f32), {}).step_s);
  EXPECT_GT(f.slowdown(), 1.0);
  EXPECT_EQ(g.max_slice_rows(d, f32), 1);

  d.usable_bytes = one_row.footprint_bytes() - 1;
  EXPECT_FALSE(g.fit(8, d, f32).fits);
  EXPECT_EQ(g.max_slice_rows(d, f32), 0);
}

// The advisor's micro-batch count against the runtime's: on the cpu (a device posing with the
// cpu's 64-byte alignment), a budget between the advisor's 2-row and 4-row slices of batch 8 is
// 4 micro-batches in both, and the allocator's high-water mark over the slices stays under it.
TEST(GptWorkloads, MicroBatchesAreWhatTheRuntimePicks) {
  // The device's plan is the cpu's own (DeviceSpec::backend, as the host's), so the advisor prices
  // the plan the runtime runs, this block-64 model's attention fused both ways (no T x T buffers).
  testing::PassesOff no_unstack("unstack");
  const nn::GPTConfig cfg = tiny_gpt(1, 32, 64);
  DeviceSpec cpu = find_device(builtin_devices(), "t4");
  cpu.backend = "cpu";
  double two_rows = 0, four_rows = 0;
  int64_t advised = 0;
  {
    GptWorkloads g(cfg);
    two_rows = g.slice(2, cpu, DType::Float32).footprint_bytes();
    four_rows = g.slice(4, cpu, DType::Float32).footprint_bytes();
    cpu.usable_bytes = (two_rows + four_rows) / 2;
    advised = g.fit(8, cpu, DType::Float32).micro_batches;
  }
  EXPECT_EQ(advised, 4);
  nn::GPT model(cfg);
  model.train();
  optim::AdamW opt(model.parameters(), {.lr = 3e-3, .weight_decay = 0.1});
  std::vector<int64_t> ids(size_t(8 * cfg.block), 1);
  TensorOptions o{DType::Int64, Device("cpu")};
  Tensor x = from_vector(ids, {8, cfg.block}, o), y = from_vector(ids, {8, cfg.block}, o);
  auto loss_fn = [&](const std::vector<Tensor>& b) { return model.loss(b[0], b[1]); };
  optim::accumulate_gradients(model.parameters(), {x, y}, loss_fn, 1);  // the moments exist from here on
  opt.step();
  opt.zero_grad();
  sync();
  int64_t nparams = 0;
  for (const Tensor& p : model.parameters()) nparams += p.numel();
  // What is live besides the model's weights and moments (this process's other tensors) is beside
  // the advisor's device too.
  const int64_t others = metrics().live_bytes - 3 * 4 * nparams;
  const size_t budget = size_t(double(others) + cpu.usable_bytes);
  reset_peak_bytes();
  MemoryBudgetScope in_force(MemoryBudget{budget, 0});
  optim::AccumulateResult r = optim::accumulate_gradients(model.parameters(), {x, y}, loss_fn, 0);
  EXPECT_EQ(r.micro_batches, advised);
  EXPECT_NEAR(double(r.planned_bytes - size_t(others)) / two_rows, 1.0, 0.02) << "the runtime's estimate of a 2-row slice";
  EXPECT_LE(metrics().peak_bytes, int64_t(budget));
  std::printf("[advise] slices of 2 rows %.0f B, of 4 rows %.0f B; budget %zu B (%lld B beside); the runtime planned %zu B, "
              "high-water %lld B\n", two_rows, four_rows, budget, (long long)others, r.planned_bytes, (long long)metrics().peak_bytes);
}

// The largest batch with rematerialization: at least the plain one; one more fits neither way.
TEST(GptWorkloads, MaxBatchWithRematIsTheLargestTheCompilerFits) {
  GptWorkloads g(tiny_gpt(1, 32, 64));
  DeviceSpec d = find_device(builtin_devices(), "t4");
  const DType f32 = DType::Float32;
  d.usable_bytes = g.at(6, d, f32).footprint_bytes();
  const int64_t plain = g.max_batch(d, f32), remat = g.max_batch_remat(d, f32);
  EXPECT_EQ(plain, 6);
  EXPECT_GT(remat, plain) << "rematerialization takes activations off the peak";
  const Workload& w = g.rematerialized(remat, d, f32);
  EXPECT_FALSE(w.over_budget);
  EXPECT_LE(w.footprint_bytes(), d.usable_bytes);
  const Workload& over = g.rematerialized(remat + 1, d, f32);
  EXPECT_TRUE(over.over_budget || over.footprint_bytes() > d.usable_bytes);
  const int64_t rows = g.max_slice_rows(d, f32);
  EXPECT_GE(rows, 1);
  EXPECT_LE(g.slice(rows, d, f32).footprint_bytes(), d.usable_bytes);
  EXPECT_GT(g.slice(rows + 1, d, f32).footprint_bytes(), d.usable_bytes);
}

TEST(Devices, TableHasEveryDeviceWithPositiveFigures) {
  std::vector<DeviceSpec> t = builtin_devices();
  std::set<std::string> names;
  for (auto& d : t) {
    names.insert(d.name);
    EXPECT_GT(d.fp32_flops, 0) << d.name;
    EXPECT_GT(d.mem_bytes, 0) << d.name;
    EXPECT_GT(d.usable_bytes, 0) << d.name;
    EXPECT_LE(d.usable_bytes, d.mem_bytes) << d.name;
    EXPECT_GT(d.mem_bw, 0) << d.name;
    EXPECT_GT(d.link_bw, 0) << d.name;
    EXPECT_GT(d.power_w, 0) << d.name;
    EXPECT_FALSE(d.source.empty()) << d.name;
  }
  for (const char* n : {"t4", "t4x2", "p100", "v100-16", "v100-32", "a100-40", "a100-80", "h100", "h200", "tpu-v3-core", "tpu-v3-8",
                        "tpu-v4-chip", "tpu-v4-8"})
    EXPECT_TRUE(names.count(n)) << n;
  DeviceSpec v3 = find_device(t, "tpu-v3-core");
  EXPECT_DOUBLE_EQ(v3.mem_bytes, 16.0 * 1073741824.0);
  EXPECT_DOUBLE_EQ(v3.usable_bytes, 14.5e9);
  EXPECT_EQ(find_device(t, "tpu-v3-8").replicas, 8);
  // Kaggle's T4 pair: the T4's figures, two replicas over PCIe through host memory.
  DeviceSpec t4 = find_device(t, "t4"), pair = find_device(t, "t4x2");
  EXPECT_EQ(pair.replicas, 2);
  EXPECT_DOUBLE_EQ(pair.bf16_flops, t4.bf16_flops);
  EXPECT_DOUBLE_EQ(pair.usable_bytes, t4.usable_bytes);
  EXPECT_LT(pair.link_eff, t4.link_eff);
  for (auto& d : t) EXPECT_FALSE(d.link.empty()) << d.name << ": every table device names its interconnect";
  EXPECT_THROW(find_device(t, "abacus"), Error);
}

namespace {
// GPUs as the cuda backend describes them (its info line), for the advisor's "cuda:N" devices.
class FakeGpus : public tessera::backends::Backend {
 public:
  std::string name() const override { return "cuda"; }
  int device_count() const override { return 4; }
  tessera::DeviceInfo info(int i) const override {
    const char* lines[] = {"NVIDIA H200, compute capability 9.0, 132 SMs, 139.8 GiB, driver CUDA 13.0, NVRTC 13.0, cuBLASLt",
                           "Tesla T4, compute capability 7.5, 40 SMs, 14.6 GiB, driver CUDA 13.0, NVRTC 13.0, cuBLASLt",
                           "NVIDIA A100-SXM4-80GB, compute capability 8.0, 108 SMs, 79.2 GiB, driver CUDA 13.0, NVRTC 13.0",
                           "NVIDIA GeForce GTX 1080, compute capability 6.1, 20 SMs, 7.9 GiB, driver CUDA 13.0, NVRTC 13.0"};
    return {Device("cuda", i), lines[i], i < 3, i < 3};
  }
  void* allocate(int, size_t) override { tessera::fail("fake", "no memory", ""); }
  void free(int, void*, size_t) override {}
  void copy_in(void*, const void*, size_t) override {}
  void copy_out(void*, const void*, size_t) override {}
  std::unique_ptr<tessera::backends::Kernel> compile(const tessera::kir::Step&) override { tessera::fail("fake", "no", ""); }
  void launch(const tessera::backends::Kernel&, const tessera::kir::Step&, const tessera::backends::LaunchArgs&) override {}
};
}  // namespace

// The advisor's "cuda:N": the table's spec of the GPU present, with the memory it reports.
TEST(Devices, ThePresentGpuIsModelledFromTheTable) {
  try {
    tessera::backends::backend_for(Device("cuda"));
    GTEST_SKIP() << "a real GPU is here (scripts/gpu-check runs the advisor on it)";
  } catch (const Error&) {
  }
  tessera::backends::register_backend(std::make_shared<FakeGpus>());
  auto t = builtin_devices();
  DeviceSpec h200 = find_device(t, "cuda");
  EXPECT_EQ(h200.name, "cuda:0");
  EXPECT_EQ(h200.description, "NVIDIA H200 at cuda:0, modelled as h200");
  EXPECT_DOUBLE_EQ(h200.bf16_flops, find_device(t, "h200").bf16_flops);
  EXPECT_DOUBLE_EQ(h200.usable_bytes, 139.8 * 1073741824.0 - 0.6e9);
  EXPECT_EQ(find_device(t, "cuda:1").description, "Tesla T4 at cuda:1, modelled as t4");
  EXPECT_EQ(find_device(t, "cuda:2").description, "NVIDIA A100-SXM4-80GB at cuda:2, modelled as a100-80");  // nearest memory
  try {
    find_device(t, "cuda:3");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[advise] the GPU at cuda:3 (NVIDIA GeForce GTX 1080) is not in the device table; describe it with "
                           "--device-file");
  }
}

TEST(Devices, JsonFileAddsDevices) {
  std::filesystem::path p = std::filesystem::temp_directory_path() / "tessera_advise_devices.json";
  {
    std::ofstream f(p);
    f << R"([{"name": "mygpu", "fp32_tflops": 10, "bf16_tflops": 80, "mem_gb": 24, "mem_bw_gbs": 500, "power_w": 150,
             "link_bw_gbs": 25}])";
  }
  std::vector<DeviceSpec> v = load_devices_json(p.string());
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].name, "mygpu");
  EXPECT_DOUBLE_EQ(v[0].fp32_flops, 10e12);
  EXPECT_DOUBLE_EQ(v[0].bf16_flops, 80e12);
  EXPECT_DOUBLE_EQ(v[0].mem_bytes, 24e9);
  EXPECT_DOUBLE_EQ(v[0].usable_bytes, 24e9);
  EXPECT_DOUBLE_EQ(v[0].mem_bw, 500e9);
  EXPECT_EQ(v[0].alignment, 256u) << "a GPU class device takes CUDA's alignment";
  EXPECT_TRUE(v[0].dtypes.empty());
  // What changes the plan: alignment, tiling and dtypes; a TPU class device takes the TPU's.
  {
    std::ofstream f(p);
    f << R"([{"name": "mytpu", "cls": "tpu", "fp32_tflops": 4, "bf16_tflops": 64, "mem_gb": 16, "mem_bw_gbs": 400},
             {"name": "odd", "fp32_tflops": 1, "mem_gb": 1, "mem_bw_gbs": 10, "alignment": 1024,
              "layout_tile": [4, 64], "dtypes": ["bool", "int64", "float32"]}])";
  }
  v = load_devices_json(p.string());
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].layout_tile_rows, 8);
  EXPECT_EQ(v[0].layout_tile_cols, 128);
  EXPECT_FALSE(v[0].dtypes.empty());
  EXPECT_EQ(v[1].alignment, 1024u);
  EXPECT_EQ(v[1].layout_tile_rows, 4);
  EXPECT_EQ(v[1].layout_tile_cols, 64);
  EXPECT_EQ(v[1].dtypes, (std::vector<DType>{DType::Bool, DType::Int64, DType::Float32}));
  for (const char* bad : {R"([{"name": "b", "fp32_tflops": 1, "mem_gb": 1, "mem_bw_gbs": 1, "dtypes": ["float8"]}])",
                          R"([{"name": "b", "fp32_tflops": 1, "mem_gb": 1, "mem_bw_gbs": 1, "alignment": 96}])",
                          R"([{"name": "b", "fp32_tflops": 1, "mem_gb": 1, "mem_bw_gbs": 1, "layout_tile": [8]}])"}) {
    {
      std::ofstream f(p);
      f << bad;
    }
    EXPECT_NE(testing::error_message([&] { load_devices_json(p.string()); }).rfind("[advise] device 'b'", 0), std::string::npos) << bad;
  }
  {
    std::ofstream f(p);
    f << R"([{"name": "broken", "mem_gb": 24}])";
  }
  EXPECT_THROW(load_devices_json(p.string()), Error);
  {
    std::ofstream f(p);
    f << "not json";
  }
  EXPECT_THROW(load_devices_json(p.string()), Error);
  std::filesystem::remove(p);
}

TEST(Devices, HostIsCalibratedAndCached) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "tessera_advise_cache";
  std::filesystem::remove_all(dir);
  const char* old = std::getenv("XDG_CACHE_HOME");
  std::string saved = old ? old : "";
  setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  DeviceSpec h = host_device();
  // Plausible, not fast: a sanitized build on a loaded 2-core machine measured 7e7 flop/s.
  EXPECT_GT(h.fp32_flops, 1e7);
  EXPECT_GT(h.mem_bw, 1e8);
  EXPECT_GT(h.launch_s, 0);
  EXPECT_LT(h.launch_s, 1e-2);
  bool cached = false;
  for (auto& e : std::filesystem::directory_iterator(dir / "tessera")) cached = cached || e.path().extension() == ".json";
  EXPECT_TRUE(cached);
  DeviceSpec again = host_device();  // from the cache: the same figures
  EXPECT_DOUBLE_EQ(again.fp32_flops, h.fp32_flops);
  EXPECT_DOUBLE_EQ(again.mem_bw, h.mem_bw);
  // The per-kind terms: measured, ordered, and cached too.
  EXPECT_GT(h.transcendental_flops, 1e6);
  EXPECT_GT(h.reduce_bw, 1e8);
  ASSERT_FALSE(h.cache_bw.empty());
  for (size_t i = 1; i < h.cache_bw.size(); ++i) EXPECT_GT(h.cache_bw[i].first, h.cache_bw[i - 1].first);
  EXPECT_DOUBLE_EQ(again.transcendental_flops, h.transcendental_flops);
  EXPECT_DOUBLE_EQ(again.reduce_bw, h.reduce_bw);
  // The row loops' terms and the GEMM line's output term are cached too; the line is fitted on two
  // shapes, so it has no output term, whatever the timings.
  EXPECT_EQ(h.gemm_out_s, 0);
  EXPECT_DOUBLE_EQ(again.row_element_s, h.row_element_s);
  EXPECT_DOUBLE_EQ(again.row_s, h.row_s);
  EXPECT_DOUBLE_EQ(again.gemm_out_s, h.gemm_out_s);
  EXPECT_DOUBLE_EQ(again.gemm_half_flops, h.gemm_half_flops);
  EXPECT_EQ(again.cache_bw, h.cache_bw);
  // The fused attention kernels' terms (the cpu fuses the calibration's pattern both ways).
  EXPECT_GT(h.attention_flops, 1e6);
  EXPECT_GT(h.attention_bwd_flops, 1e6);
  EXPECT_GE(h.attention_pair_s, 0);
  EXPECT_GE(h.attention_bwd_pair_s, 0);
  EXPECT_DOUBLE_EQ(again.attention_flops, h.attention_flops);
  EXPECT_DOUBLE_EQ(again.attention_pair_s, h.attention_pair_s);
  EXPECT_DOUBLE_EQ(again.attention_bwd_flops, h.attention_bwd_flops);
  EXPECT_DOUBLE_EQ(again.attention_bwd_pair_s, h.attention_bwd_pair_s);
  EXPECT_EQ(h.backend, "cpu");
  if (old) setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  else unsetenv("XDG_CACHE_HOME");
  std::filesystem::remove_all(dir);
}

// ---- monotonicity over generated models ------------------------------------------------------
TEST(Monotonic, MoreMemoryNeverUnfitsAndFasterRoofsNeverPredictSlower) {
  std::mt19937_64 rng(42);
  std::vector<DeviceSpec> table = builtin_devices();
  int checked = 0;
  for (int model = 0; model < 6; ++model) {
    auto pick = [&](std::vector<int64_t> v) { return v[rng() % v.size()]; };
    nn::GPTConfig cfg = tiny_gpt(pick({1, 2}), pick({16, 32, 48}), pick({8, 16, 32}), pick({20, 60}));
    GptWorkloads g(cfg);
    const int64_t batch = pick({1, 2, 4});
    for (DType dt : {DType::Float32, DType::BFloat16}) {
      for (const DeviceSpec& base : table) {
        const Workload& w = g.at(batch, base, dt);  // the device's own plan
        std::uniform_real_distribution<double> up(1.0, 4.0);
        Options o{.data_parallel = int(rng() % 3) + 1};
        Prediction p = predict(base, w, o);
        // More memory: fits stays fits.
        DeviceSpec big = base;
        big.usable_bytes *= up(rng);
        big.mem_bytes *= up(rng);
        Prediction pb = predict(big, w, o);
        if (p.fits) {
          EXPECT_TRUE(pb.fits) << base.name;
        }
        // A capacity just at the peak fits; just below does not.
        DeviceSpec edge = base;
        edge.usable_bytes = p.peak_bytes;
        EXPECT_TRUE(predict(edge, w, o).fits);
        edge.usable_bytes = p.peak_bytes - 1;
        EXPECT_FALSE(predict(edge, w, o).fits);
        // Faster on both roofs (and not slower anywhere else): never predicted slower.
        DeviceSpec fast = base;
        double fc = up(rng), fm = up(rng);
        fast.fp32_flops *= fc;
        fast.bf16_flops *= fc;
        fast.vec16_flops *= fc;
        fast.mem_bw *= fm;
        if (rng() % 2) fast.link_bw *= up(rng);
        Prediction pf = predict(fast, w, o);
        EXPECT_LE(pf.step_s, p.step_s * (1 + 1e-12)) << base.name;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

}  // namespace
}  // namespace tessera
