// The memory budget (issue 24): parsing "200MB" / "0.5"; a budget the plan meets runs and the
// allocator's measured high-water mark stays under it; a budget it cannot meet fails before
// anything runs (no Step launched, the tensors still pending) naming the smallest figure reached
// and the buffers at its peak with their module paths. Rematerialization on the benchmark GPT
// (same losses and gradients, copies marked), micro-batches (the GPT at 1/2 and 1/4, dropout, the
// small CNN, batch norm refused, an unreachable budget refused), and a property test over the
// compiler's random graphs. The memory limit (out of memory as an error, issue 27).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "compiler/lower.h"
#include "conformance/random_graph.h"
#include "ir/graph.h"
#include "runtime/allocator.h"
#include "runtime/compile_options.h"
#include "runtime/realize.h"
#include "tensor/tensor_impl.h"
#include "tessera/autocast.h"
#include "tessera/memory.h"
#include "tessera/metrics.h"
#include "tessera/nn.h"
#include "tessera/optim.h"
#include "tessera/profiler.h"
#include "tessera/tessera.h"
#include "test_util.h"
#include "../../bench/bench_common.h"

namespace tessera {
namespace {

using testing::error_message;
using testing::PassesOff;


TEST(MemoryBudget, ParsesBytesAndFractions) {
  EXPECT_EQ(MemoryBudget::parse("200MB").bytes, size_t(200'000'000));
  EXPECT_EQ(MemoryBudget::parse("1.5GiB").bytes, size_t(1.5 * 1073741824.0));
  EXPECT_EQ(MemoryBudget::parse("4096").bytes, size_t(4096));
  EXPECT_EQ(MemoryBudget::parse("64KiB").bytes, size_t(65536));
  EXPECT_DOUBLE_EQ(MemoryBudget::parse("0.5").fraction, 0.5);
  EXPECT_EQ(MemoryBudget::parse("0.5").bytes, size_t(0));
  EXPECT_TRUE(MemoryBudget::parse("none").none());
  EXPECT_TRUE(MemoryBudget::parse("").none());
  for (const char* bad : {"lots", "200XB", "-1", "0", "MB"})
    EXPECT_NE(error_message([&] { MemoryBudget::parse(bad); }).find("[memory] cannot read the memory budget"), std::string::npos)
        << bad;
}

// A small MLP's training step traced as one graph (forward, backward, AdamW update).
struct MlpStep {
  std::shared_ptr<nn::Sequential> model;
  optim::AdamW opt;
  Tensor x, y;
  explicit MlpStep(int64_t batch)
      : model(make_model()), opt(model->parameters(), {.lr = 1e-2}),
        x(testing::random_tensor({batch, 64}, DType::Float32, 3)), y(testing::random_tensor({batch, 8}, DType::Float32, 4)) {
    sync();
  }
  static std::shared_ptr<nn::Sequential> make_model() {
    manual_seed(7);
    auto m = std::make_shared<nn::Sequential>();
    m->add(std::make_shared<nn::Linear>(64, 256)).add(std::make_shared<nn::GELU>()).add(std::make_shared<nn::Linear>(256, 8));
    return m;
  }
  Tensor trace() {
    Tensor loss = mse_loss((*model)(x), y);
    loss.backward();
    opt.step();
    opt.zero_grad();
    return loss;
  }
};

// Bytes as the allocator allocates them (rounded up to its 256 B), and a plan's buffers of one kind so.
size_t allocated(size_t bytes) { return runtime::allocated_size(bytes); }
size_t allocated_bytes(const MemoryPlan& p, const std::string& kind) {
  size_t b = 0;
  for (const PlannedBuffer& x : p.buffers)
    if (x.kind == kind) b += allocated(x.bytes);
  return b;
}

TEST(MemoryBudget, AMetBudgetRunsUnderItAndAnUnreachableOneFailsBeforeRunning) {
  MlpStep s(512);
  Tensor loss = s.trace();
  MemoryPlan natural = pending_memory_plan();
  ASSERT_GT(natural.step_bytes, size_t(0));
  // Parameters, outputs and the arena as the allocator allocates them (each rounded up to 256 B).
  const size_t params = allocated_bytes(natural, "param");
  EXPECT_EQ(natural.step_bytes, params + allocated_bytes(natural, "output") + allocated(natural.arena_bytes));
  EXPECT_LT(natural.step_bytes - (natural.param_bytes + natural.output_bytes + natural.arena_bytes), 256 * natural.buffers.size());
  EXPECT_EQ(natural.budget_bytes, size_t(0));
  {
    // Too small (under the parameters and outputs, which stay whatever the rewrites): the error
    // comes at compile time, before any Step runs.
    MemoryBudgetScope budget({(natural.param_bytes + natural.output_bytes) / 2, 0});
    int64_t launched = metrics().steps_launched;
    std::string e = error_message([] { sync(); });
    EXPECT_NE(e.find("[memory] the budget of"), std::string::npos) << e;
    EXPECT_NE(e.find("cannot be met: the smallest step this compiler reaches needs"), std::string::npos) << e;
    EXPECT_NE(e.find("largest buffers live there:"), std::string::npos) << e;
    EXPECT_NE(e.find(" in "), std::string::npos) << e;  // module paths
    EXPECT_EQ(metrics().steps_launched, launched);
    EXPECT_FALSE(loss.is_realized());
    // The same through plan_memory(), which compiles without running.
    EXPECT_NE(error_message([&] { plan_memory({loss}); }).find("cannot be met"), std::string::npos);
  }
  // Exactly the natural figure, as bytes and as the fraction 1: met, and the step runs under it.
  for (MemoryBudget b : {MemoryBudget{natural.step_bytes, 0}, MemoryBudget{0, 1.0}}) {
    MemoryBudgetScope budget(b);
    MemoryPlan p = pending_memory_plan();
    EXPECT_EQ(p.budget_bytes, natural.step_bytes) << b.str();
    EXPECT_EQ(p.natural_step_bytes, natural.step_bytes);
    EXPECT_LE(p.step_bytes, p.budget_bytes);
    EXPECT_NE(p.report().find("budget "), std::string::npos);
  }
  MemoryBudgetScope budget({natural.step_bytes, 0});
  int64_t live_before = metrics().live_bytes;
  reset_peak_bytes();
  loss.item();
  // Everything live before the step that the graph does not read counts beside the budget.
  int64_t outside = live_before - int64_t(params);
  EXPECT_LE(metrics().peak_bytes - outside, int64_t(natural.step_bytes));
  EXPECT_TRUE(memory_budget().bytes == natural.step_bytes);
}

// In-place accumulation (compiler/passes/accumulate.cpp) on each of the cpu's product paths:
// y = P + Q for two products, where one product's epilogue adds the other (a temporary dying
// there). Under a budget one byte short of the natural figure the cheapest plan that meets it
// writes the first product into the output buffer and accumulates the second into it
// (Step::accumulate: nothing in the arena for it, nothing recomputed or sliced); the values
// match a float64 reference computed here, as the unbudgeted run's do. The cases reach every path
// of cpu/gemm.cpp: the BLAS in float32 and float64, split-K (K > 2048 over few tasks), batched
// products, integers, K = 0, bfloat16 (vdpbf16ps) and float16 under Autocast, a convolution's
// window products (one input channel: the lanes form; 16: the window tile) and a kernel gradient
// (the window kernel's split-K); and an elementwise add writing over its dying operand.
TEST(MemoryBudget, AProductAccumulatesIntoItsOutputOnEveryCpuPath) {
  struct Case {
    const char* what;
    Shape a, b;
    DType t = DType::Float32;
    std::optional<DType> autocast;
    bool conv = false;
  };
  const std::vector<Case> cases = {
      {"float32", {48, 40}, {40, 24}},
      {"float64", {48, 40}, {40, 24}, DType::Float64},
      {"split-K", {8, 4200}, {4200, 6}},
      {"batched", {3, 20, 16}, {3, 16, 12}},
      {"int64", {12, 9}, {9, 7}, DType::Int64},
      {"K = 0", {6, 0}, {0, 5}},
      {"bfloat16", {40, 64}, {64, 36}, DType::Float32, DType::BFloat16},
      {"float16", {40, 64}, {64, 36}, DType::Float32, DType::Float16},
      {"conv, lanes", {2, 1, 12, 12}, {8, 1, 3, 3}, DType::Float32, std::nullopt, true},
      {"conv, window", {2, 16, 10, 10}, {24, 16, 3, 3}, DType::Float32, std::nullopt, true},
  };
  for (const Case& c : cases) {
    const bool integer = c.t == DType::Int64;
    auto input = [&](const Shape& s, uint32_t seed) {
      return integer ? testing::random_int(s, -3, 3, c.t, seed) : testing::random_tensor(s, c.t, seed);
    };
    Tensor a = input(c.a, 1), b = input(c.b, 2), d = input(c.a, 3), e = input(c.b, 4);
    auto trace = [&] {
      std::optional<Autocast> ac;
      if (c.autocast) ac.emplace(*c.autocast);
      return c.conv ? conv2d(a, b) + conv2d(d, e) : matmul(a, b) + matmul(d, e);
    };
    // The reference: the four operands as the products see them (rounded to 16 bits under
    // autocast), multiplied in float64.
    auto seen = [&](const Tensor& t) { return (c.autocast ? t.to(*c.autocast) : t).to_vector<double>(); };
    const std::vector<double> va = seen(a), vb = seen(b), vd = seen(d), ve = seen(e);
    std::vector<double> want;
    if (c.conv) {  // valid 3x3 convolution, stride 1
      const int64_t B = c.a[0], F = c.a[1], H = c.a[2], W = c.a[3], O = c.b[0], oh = H - 2, ow = W - 2;
      want.assign(size_t(B * O * oh * ow), 0.0);
      for (int64_t n = 0; n < B; ++n)
        for (int64_t o = 0; o < O; ++o)
          for (int64_t i = 0; i < oh; ++i)
            for (int64_t j = 0; j < ow; ++j) {
              double sum = 0;
              for (int64_t f = 0; f < F; ++f)
                for (int64_t u = 0; u < 3; ++u)
                  for (int64_t v = 0; v < 3; ++v) {
                    const size_t x = size_t(((n * F + f) * H + i + u) * W + j + v), w = size_t(((o * F + f) * 3 + u) * 3 + v);
                    sum += va[x] * vb[w] + vd[x] * ve[w];
                  }
              want[size_t(((n * O + o) * oh + i) * ow + j)] = sum;
            }
    } else {
      const size_t r = c.a.size();
      const int64_t nb = r == 3 ? c.a[0] : 1, M = c.a[r - 2], K = c.a[r - 1], N = c.b[r - 1];
      want.assign(size_t(nb * M * N), 0.0);
      for (int64_t q = 0; q < nb; ++q)
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            double sum = 0;
            for (int64_t k = 0; k < K; ++k) {
              const size_t x = size_t((q * M + i) * K + k), w = size_t((q * K + k) * N + j);
              sum += va[x] * vb[w] + vd[x] * ve[w];
            }
            want[size_t((q * M + i) * N + j)] = sum;
          }
    }
    Tensor plain = trace();
    const MemoryPlan natural = pending_memory_plan();
    EXPECT_EQ(natural.accumulated_in_place, 0) << c.what;
    EXPECT_TRUE(testing::all_close(plain.to_vector<double>(), want, 1e-6)) << c.what;
    Tensor y = trace();
    MemoryBudgetScope budget({natural.step_bytes - 1, 0});
    const MemoryPlan p = pending_memory_plan();
    EXPECT_EQ(p.accumulated_in_place, 1) << c.what << "\n" << p.report();
    EXPECT_EQ(p.unstacked_slices, 0) << c.what;
    EXPECT_EQ(p.recomputed_steps, 0) << c.what;
    EXPECT_LT(p.arena_bytes, natural.arena_bytes) << c.what;
    EXPECT_NE(p.report().find("accumulated in place: 1 Steps"), std::string::npos) << p.report();
    const std::vector<double> got = y.to_vector<double>();
    if (integer) EXPECT_EQ(got, want) << c.what;
    else EXPECT_TRUE(testing::all_close(got, want, 1e-6)) << c.what;
  }
  // An elementwise add of two column sums (Reduce Steps' temporaries) writes over one of them.
  {
    Tensor r1 = testing::random_tensor({96, 40}, DType::Float32, 9), r2 = testing::random_tensor({96, 40}, DType::Float32, 10);
    const std::vector<double> v1 = r1.to_vector<double>(), v2 = r2.to_vector<double>();
    std::vector<double> want(40, 0.0);
    for (size_t i = 0; i < v1.size(); ++i) want[i % 40] += v1[i] + v2[i];
    Tensor plain = r1.sum({0}) + r2.sum({0});
    const MemoryPlan natural = pending_memory_plan();
    EXPECT_TRUE(testing::all_close(plain.to_vector<double>(), want, 1e-6));
    Tensor y = r1.sum({0}) + r2.sum({0});
    MemoryBudgetScope budget({natural.step_bytes - 1, 0});
    const MemoryPlan p = pending_memory_plan();
    EXPECT_EQ(p.accumulated_in_place, 1) << p.report();
    EXPECT_TRUE(testing::all_close(y.to_vector<double>(), want, 1e-6)) << "elementwise";
  }
  // A kernel gradient (deep: K = batch x positions, in split-K chunks of the window kernel): the
  // gradient of a kernel used by two convolutions is the sum of two window products.
  Tensor x1 = testing::random_tensor({4, 8, 20, 20}, DType::Float32, 5), x2 = testing::random_tensor({4, 8, 20, 20}, DType::Float32, 6);
  Tensor g = testing::random_tensor({4, 16, 18, 18}, DType::Float32, 7);
  const std::vector<double> v1 = x1.to_vector<double>(), v2 = x2.to_vector<double>(), vg = g.to_vector<double>();
  std::vector<double> want(16 * 8 * 9, 0.0);
  for (int64_t o = 0; o < 16; ++o)
    for (int64_t f = 0; f < 8; ++f)
      for (int64_t u = 0; u < 3; ++u)
        for (int64_t v = 0; v < 3; ++v) {
          double sum = 0;
          for (int64_t n = 0; n < 4; ++n)
            for (int64_t i = 0; i < 18; ++i)
              for (int64_t j = 0; j < 18; ++j) {
                const size_t x = size_t(((n * 8 + f) * 20 + i + u) * 20 + j + v);
                sum += vg[size_t(((n * 16 + o) * 18 + i) * 18 + j)] * (v1[x] + v2[x]);
              }
          want[size_t(((o * 8 + f) * 3 + u) * 3 + v)] = sum;
        }
  for (bool budgeted : {false, true}) {
    Tensor w = testing::random_tensor({16, 8, 3, 3}, DType::Float32, 8).requires_grad_();
    ((conv2d(x1, w) + conv2d(x2, w)) * g).sum().backward();
    const MemoryPlan natural = pending_memory_plan();
    std::optional<MemoryBudgetScope> budget;
    if (budgeted) budget.emplace(MemoryBudget{natural.step_bytes - 1, 0});
    const MemoryPlan p = pending_memory_plan();
    EXPECT_EQ(p.accumulated_in_place, budgeted ? 1 : 0) << p.report();
    EXPECT_TRUE(testing::all_close(w.grad().to_vector<double>(), want, 1e-6)) << "kernel gradient, budgeted " << budgeted;
  }
}

// The memory limit (issue 27: out of memory is an error): a step whose new buffers would cross it
// is refused before anything runs, naming its peak and buffers and pointing to the budget; a
// single allocation over it fails the same way; nothing is poisoned: with room again the same
// pending step runs to the values of a run that never met the limit.
TEST(MemoryLimit, AStepOverTheLimitIsRefusedBeforeRunningThenRunsWhenItFits) {
  struct Reset {
    ~Reset() { set_memory_limit(0); }
  } reset;
  MlpStep s(512);
  Tensor loss = s.trace();
  const MemoryPlan plan = pending_memory_plan();
  const size_t live = runtime::live_bytes_on(Device("cpu"));
  set_memory_limit(live + plan.run_bytes() / 2);
  EXPECT_EQ(memory_limit(), live + plan.run_bytes() / 2);
  const int64_t launched = metrics().steps_launched;
  std::string e = error_message([] { sync(); });
  for (const char* part : {"[memory] out of memory on cpu:0: this graph needs", "over the memory limit of", "(set_memory_limit)",
                           "largest buffers live there:", " in ", "--memory-budget"})
    EXPECT_NE(e.find(part), std::string::npos) << part << "\n" << e;
  EXPECT_EQ(metrics().steps_launched, launched);
  EXPECT_FALSE(loss.is_realized());
  std::vector<float> big(plan.run_bytes() / sizeof(float));
  e = error_message([&] { from_vector(big, {int64_t(big.size())}); });
  EXPECT_NE(e.find("[memory] out of memory on cpu:0: allocating"), std::string::npos) << e;
  EXPECT_NE(e.find("would cross the memory limit"), std::string::npos) << e;

  set_memory_limit(live + plan.run_bytes() + 64 * 256);  // room for the step (each buffer rounded up to 256 B)
  const double limited = loss.item();
  const std::vector<float> w = s.model->parameters()[0].to_vector<float>();
  set_memory_limit(0);
  MlpStep fresh(512);
  EXPECT_EQ(fresh.trace().item(), limited);
  EXPECT_EQ(fresh.model->parameters()[0].to_vector<float>(), w);
}

TEST(MemoryBudget, TheScopeRestoresThePreviousBudget) {
  EXPECT_TRUE(memory_budget().none());
  {
    MemoryBudgetScope a(MemoryBudget::parse("0.5"));
    EXPECT_DOUBLE_EQ(memory_budget().fraction, 0.5);
    {
      MemoryBudgetScope b(MemoryBudget::parse("1MB"));
      EXPECT_EQ(memory_budget().bytes, size_t(1'000'000));
      EXPECT_EQ(memory_budget().fraction, 0.0);
    }
    EXPECT_DOUBLE_EQ(memory_budget().fraction, 0.5);
  }
  EXPECT_TRUE(memory_budget().none());
}

}  // namespace
}  // namespace tessera

// ---------------------------------------------------------------------------------------------
// Micro-batches (optim::accumulate_gradients): the whole-step case of batch unstacking.
namespace tessera {
namespace {

TEST(BatchSlice, ARandomSliceDrawsTheWholeTensorsRows) {
  manual_seed(5);
  RngState rs = rng_state();
  Tensor whole = rand({6, 3, 4});
  std::vector<double> want = whole.to_vector<double>();
  for (int64_t start : {0, 2, 4}) {
    set_rng_state(rs);
    BatchSliceScope in_slice(start, 2);
    Tensor part = rand({2, 3, 4});
    EXPECT_TRUE(testing::matches_reference(part, 0));  // the float64 reference draws the same rows
    std::vector<double> got = part.to_vector<double>();
    EXPECT_EQ(got, std::vector<double>(want.begin() + start * 12, want.begin() + (start + 2) * 12)) << start;
  }
}

// The benchmark GPT (bench/bench_common.h; or `cfg`) at batch 32 (or `batch`): each step's loss,
// and the gradients of the first step, with `micro` micro-batches (1: one graph) under `budget`.
// peaks: the allocator's high-water mark over each step, beside the budget in bytes each step met.
struct GptRun {
  std::vector<double> losses;
  std::vector<std::vector<double>> grads;
  std::vector<std::pair<int64_t, size_t>> peaks;  // (measured, budget)
  int64_t micro = 1;
  int recomputed = 0;  // Steps the last one-graph step recomputed
  MemoryPlan natural;  // one graph: the first step's plan
};
constexpr nn::GPTConfig kBenchGpt{.vocab = bench::kVocab, .block = bench::kBlock, .embd = bench::kEmbd, .heads = bench::kHeads,
                                   .layers = bench::kLayers};
GptRun train_gpt(int steps, double dropout, MemoryBudget budget, int64_t micro, nn::GPTConfig cfg = kBenchGpt, int64_t batch = 32) {
  manual_seed(0);
  cfg.dropout = dropout;
  nn::GPT model(cfg);
  model.train();
  optim::AdamW opt(model.parameters(), {.lr = 3e-3, .weight_decay = 0.1});
  auto batches = bench::make_batches(batch, cfg.block, cfg.vocab);
  GptRun r;
  for (int step = 0; step < steps; ++step) {
    auto& [xs, ys] = batches[size_t(step) % batches.size()];
    TensorOptions o{DType::Int64, Device("cpu")};
    Tensor x = from_vector<int64_t>(xs, {batch, cfg.block}, o), y = from_vector<int64_t>(ys, {batch, cfg.block}, o);
    sync();
    reset_peak_bytes();
    MemoryBudgetScope in_force(budget);
    auto loss_fn = [&](const std::vector<Tensor>& b) { return model.loss(b[0], b[1]); };
    if (micro == 1) {
      int64_t live_before = metrics().live_bytes;
      Tensor loss = loss_fn({x, y});
      loss.backward();
      std::vector<Tensor> grads;  // step 0: the gradients as further outputs of the step's one graph
      if (step == 0)
        for (const Tensor& p : model.parameters()) grads.push_back(p.grad());
      opt.step();
      opt.zero_grad();
      r.losses.push_back(loss.item());
      for (const Tensor& g : grads) r.grads.push_back(g.to_vector<double>());
      MemoryPlan p = last_memory_plan();
      if (p.budget_bytes)  // what was live before and the graph does not read counts beside the budget
        r.peaks.push_back({metrics().peak_bytes - (live_before - int64_t(p.param_bytes)), p.budget_bytes});
      r.recomputed = p.recomputed_steps;
      if (step == 0) r.natural = p;
      if (p.recomputed_steps) {  // each copy is marked in its sources, as dumps and the profiler show it
        int marked = 0;
        for (const kir::Step& st : runtime::last_executed_plan()->steps)
          marked += !st.sources.empty() && st.sources[0].op.rfind("recompute:", 0) == 0;
        EXPECT_EQ(marked, p.recomputed_steps);
      }
      if (step == 0) {
        EXPECT_GE(metrics().recomputed_steps, p.recomputed_steps);
      }
      continue;
    }
    optim::AccumulateResult a = optim::accumulate_gradients(model.parameters(), {x, y}, loss_fn, micro);
    if (step == 0)
      for (const Tensor& p : model.parameters()) r.grads.push_back(p.grad().to_vector<double>());
    MemoryBudgetScope update(MemoryBudget{a.budget_bytes, 0});
    opt.step();
    opt.zero_grad();
    sync();
    r.losses.push_back(a.loss);
    r.micro = a.micro_batches;
    r.peaks.push_back({metrics().peak_bytes, a.budget_bytes});
  }
  return r;
}

double worst_grad_error(const GptRun& a, const GptRun& b) {
  double worst = 0;
  for (size_t i = 0; i < a.grads.size(); ++i) worst = std::max(worst, testing::normalized_error(a.grads[i], b.grads[i]));
  return worst;
}

TEST(MicroBatches, AutoUnderHalfAndAQuarterOfThePeakGivesTheSameLossesAndGradients) {
  using testing::steps_or_few;
  GptRun base = train_gpt(steps_or_few(20), 0.0, {}, 1);
  auto first = [](std::vector<double> v, size_t n) { return std::vector<double>(v.begin(), v.begin() + std::ptrdiff_t(n)); };
  {
    // Rematerialization alone (one graph, unstacking off) meets 3/4 of the peak, not 0.4 (it has met
    // 1/2 since the residual stream is stored once).
    PassesOff no_unstack("unstack");
    const int n = steps_or_few(10);
    GptRun r = train_gpt(n, 0.0, {0, 0.75}, 1);
    EXPECT_GT(r.recomputed, 0);
    EXPECT_LE(testing::normalized_error(r.losses, first(base.losses, size_t(n))), 1e-5);
    EXPECT_LE(worst_grad_error(r, base), 1e-5);
    ASSERT_EQ(r.peaks.size(), size_t(n));
    for (auto& [measured, budget] : r.peaks) EXPECT_LE(measured, int64_t(budget)) << "remat";
    std::string e = testing::error_message([] { train_gpt(1, 0.0, {0, 0.4}, 1); });
    EXPECT_NE(e.find("cannot be met: the smallest step this compiler reaches needs"), std::string::npos) << e;
    EXPECT_NE(e.find("after recomputing"), std::string::npos) << e;
  }
  {
    // With unstacking the one graph meets 1/2: the step runs in slices of the batch.
    const int n = steps_or_few(3);
    GptRun r = train_gpt(n, 0.0, {0, 0.5}, 1);
    EXPECT_GT(r.natural.unstacked_slices, 1) << r.natural.report();
    EXPECT_LE(testing::normalized_error(r.losses, first(base.losses, size_t(n))), 1e-5);
    EXPECT_LE(worst_grad_error(r, base), 1e-5);
    ASSERT_EQ(r.peaks.size(), size_t(n));
    for (auto& [measured, budget] : r.peaks) EXPECT_LE(measured, int64_t(budget)) << "unstack";
    std::printf("[benchmark GPT, one graph under 1/2] %s\n", r.natural.unstacked.c_str());
  }
  for (double fraction : {0.5, 0.25}) {
    const int steps = steps_or_few(fraction == 0.5 ? 20 : 10);  // the quarter's first 10 (CI time)
    GptRun r = train_gpt(steps, 0.0, {0, fraction}, 0);
    EXPECT_GT(r.micro, 1) << fraction;
    EXPECT_LE(testing::normalized_error(r.losses, first(base.losses, size_t(steps))), 1e-5) << fraction;
    EXPECT_LE(worst_grad_error(r, base), 1e-5) << fraction;
    // The allocator's high-water mark over every step (slices and update) stays under the budget.
    for (auto& [measured, budget] : r.peaks) EXPECT_LE(measured, int64_t(budget)) << fraction << " with " << r.micro << " micro-batches";
  }
}

// The small CNN at batch 256 (random images): losses of `steps` Adam steps with `micro` micro-batches.
std::pair<std::vector<double>, int64_t> train_cnn(int steps, MemoryBudget budget, int64_t micro) {
  manual_seed(3);
  nn::SmallCNN model;
  optim::Adam opt(model.parameters(), {.lr = 1e-3});
  Tensor x = testing::random_tensor({256, 1, 28, 28}, DType::Float32, 9);
  Tensor y = testing::random_int({256}, 0, 9, DType::Int64, 10);
  sync();
  std::vector<double> losses;
  int64_t k = 1;
  for (int step = 0; step < steps; ++step) {
    MemoryBudgetScope in_force(budget);
    auto loss_fn = [&](const std::vector<Tensor>& b) { return cross_entropy(model(b[0]), b[1]); };
    optim::AccumulateResult a = optim::accumulate_gradients(model.parameters(), {x, y}, loss_fn, micro);
    MemoryBudgetScope update(MemoryBudget{a.budget_bytes, 0});
    opt.step();
    opt.zero_grad();
    sync();
    losses.push_back(a.loss);
    k = a.micro_batches;
  }
  return {losses, k};
}

TEST(MicroBatches, TheSmallCnnAtBatch256UnderHalfAndAQuarterGivesTheSameLosses) {
  const int n = testing::steps_or_few(5, 2);
  auto [base, one] = train_cnn(n, {}, 1);
  EXPECT_EQ(one, 1);
  for (double fraction : {0.5, 0.25}) {
    auto [losses, k] = train_cnn(n, {0, fraction}, 0);
    EXPECT_GT(k, 1) << fraction;
    EXPECT_LE(testing::normalized_error(losses, base), 1e-5) << fraction;
  }
}

TEST(MicroBatches, DropoutMasksMatchTheUnslicedStep) {
  GptRun base = train_gpt(testing::steps_or_few(10), 0.1, {}, 1);
  GptRun r = train_gpt(testing::steps_or_few(10), 0.1, {0, 0.5}, 0);
  EXPECT_GT(r.micro, 1);
  EXPECT_LE(testing::normalized_error(r.losses, base.losses), 1e-5);
  EXPECT_LE(worst_grad_error(r, base), 1e-5);
}

// The seed's case: a model whose peak is a vocabulary-sized tensor (the language-model head's
// logits and their gradient; the full size, a 12,608-token vocabulary at batch 32 and block 256,
// is in bench/memory_budget.sh): a budget of 1/8 of its natural figure is met by unstacking the
// batch alone, with the unbudgeted losses and gradients and the allocator's high-water mark under it.
TEST(MicroBatches, AVocabularySizedPeakMeetsAnEighthOfItByUnstacking) {
  const nn::GPTConfig head{.vocab = 1576, .block = 32, .embd = 8, .heads = 2, .layers = 1};
  const int steps = testing::steps_or_few(4);
  GptRun base = train_gpt(steps, 0.0, {}, 1, head, 32);
  ASSERT_FALSE(base.natural.live_at_peak.empty());
  const PlannedBuffer& largest = base.natural.live_at_peak.front();
  EXPECT_EQ(largest.shape, (Shape{32 * 32, 1576})) << "the peak is the logits' size: " << base.natural.report();
  const size_t eighth = base.natural.step_bytes / 8;  // of the one-graph step: parameters, moments, inputs, activations
  GptRun r = train_gpt(steps, 0.0, {eighth, 0}, 0, head, 32);
  EXPECT_GT(r.micro, 1);
  EXPECT_EQ(r.recomputed, 0) << "unstacking alone";
  EXPECT_LE(testing::normalized_error(r.losses, base.losses), 1e-5);
  EXPECT_LE(worst_grad_error(r, base), 1e-5);
  ASSERT_EQ(r.peaks.size(), size_t(steps));
  for (auto& [measured, budget] : r.peaks) EXPECT_LE(measured, int64_t(eighth)) << r.micro << " micro-batches";
  std::printf("[vocabulary peak] natural %zu B, budget %zu B, %lld micro-batches, high-water %lld B\n", base.natural.step_bytes,
              r.peaks[0].second, (long long)r.micro, (long long)r.peaks[0].first);
}

// Batch unstacking inside one step (the "unstack" pass), rematerialization and micro-batches off.
// A logits tower (the seed's case, small): loss = cross_entropy(dropout(x W), y) over [64, 500]
// logits, its gradients dx and dW (a sum over the rows). Values of the loss and both gradients,
// and the plan, under `budget` (or none), with dropout p.
struct Tower {
  std::vector<std::vector<double>> values;
  MemoryPlan plan;
  int64_t high_water = 0;
};
Tower logits_tower(double p, MemoryBudget budget) {
  manual_seed(11);
  Tensor x = testing::random_tensor({64, 16}, DType::Float32, 1).requires_grad_();
  Tensor w = testing::random_tensor({16, 500}, DType::Float32, 2).requires_grad_();
  Tensor y = testing::random_int({64}, 0, 499, DType::Int64, 3);
  nn::Dropout drop(p);
  drop.train();
  sync();
  const int64_t live_before = metrics().live_bytes;
  reset_peak_bytes();
  MemoryBudgetScope in_force(budget);
  Tensor loss = cross_entropy(p > 0 ? drop(matmul(x, w)) : matmul(x, w), y);
  loss.backward();
  Tower t;
  Tensor gx = x.grad(), gw = w.grad();
  sync();
  t.plan = last_memory_plan();
  t.high_water = metrics().peak_bytes - (live_before - int64_t(t.plan.param_bytes));
  t.values = {loss.to_vector<double>(), gx.to_vector<double>(), gw.to_vector<double>()};
  return t;
}

TEST(Unstack, ALogitsTowerRunsInSlicesWithTheUnbudgetedValues) {
  PassesOff off("remat");
  for (double p : {0.0, 0.1}) {  // dropout draws the unsliced masks in each slice
    Tower base = logits_tower(p, {});
    EXPECT_EQ(base.plan.unstacked_slices, 0);
    Tower t = logits_tower(p, {0, 0.4});
    EXPECT_GT(t.plan.unstacked_slices, 1) << t.plan.report();
    EXPECT_NE(t.plan.report().find("unstacked: "), std::string::npos) << t.plan.report();
    const std::string page = memory_viewer_html(t.plan);  // the viewer: before and after, what was sliced
    EXPECT_NE(page.find("before the budget passes"), std::string::npos);
    EXPECT_NE(page.find("unstacked: matmul f32[64, 500] along axis 0 into "), std::string::npos);
    EXPECT_LE(t.plan.step_bytes, t.plan.budget_bytes);
    EXPECT_LE(t.high_water, int64_t(t.plan.budget_bytes)) << "the allocator's high-water mark";
    for (size_t k = 0; k < base.values.size(); ++k)
      EXPECT_LE(testing::normalized_error(t.values[k], base.values[k]), 1e-5) << "p " << p << " value " << k;
    std::printf("[unstack tower] p %.1f: natural %zu B, budget %zu B, step %zu B, high-water %lld B; %s\n", p, base.plan.step_bytes,
                t.plan.budget_bytes, t.plan.step_bytes, (long long)t.high_water, t.plan.unstacked.c_str());
  }
  // Switched off, with nothing else to meet the budget: the [memory] error before running.
  PassesOff none("remat,unstack");
  std::string e = error_message([] { logits_tower(0.0, {0, 0.4}); });
  EXPECT_NE(e.find("cannot be met"), std::string::npos) << e;
}

// The seed's case in one graph: the vocabulary-peak model meets 1/8 of its one-graph step bytes
// by unstacking alone (no micro-batches, nothing recomputed), with the unbudgeted losses and
// gradients and the allocator's high-water mark under the budget every step.
TEST(Unstack, AVocabularySizedPeakMeetsAnEighthOfItInOneStep) {
  PassesOff off("remat");
  const nn::GPTConfig head{.vocab = 1576, .block = 32, .embd = 8, .heads = 2, .layers = 1};
  const int steps = testing::steps_or_few(4);
  GptRun base = train_gpt(steps, 0.0, {}, 1, head, 32);
  const size_t eighth = base.natural.step_bytes / 8;
  const int64_t unstacked_before = metrics().unstacked_graphs;
  GptRun r = train_gpt(steps, 0.0, {eighth, 0}, 1, head, 32);
  EXPECT_EQ(r.recomputed, 0);
  EXPECT_GT(r.natural.unstacked_slices, 1);
  EXPECT_GT(metrics().unstacked_graphs, unstacked_before);
  EXPECT_LE(testing::normalized_error(r.losses, base.losses), 1e-5);
  EXPECT_LE(worst_grad_error(r, base), 1e-5);
  ASSERT_EQ(r.peaks.size(), size_t(steps));
  for (auto& [measured, budget] : r.peaks) EXPECT_LE(measured, int64_t(eighth)) << r.natural.report();
  std::printf("[vocabulary peak, one step] natural %zu B, budget %zu B, step %zu B, high-water %lld B; %s\n", base.natural.step_bytes,
              eighth, r.natural.step_bytes, (long long)r.peaks[0].first, r.natural.unstacked.c_str());
}

TEST(MicroBatches, BatchNormAndAnUnreachableBudgetAreRefusedBeforeRunning) {
  manual_seed(1);
  auto bn = std::make_shared<nn::BatchNorm2d>(4);
  Tensor x = testing::random_tensor({8, 4, 3, 3}, DType::Float32, 2);
  sync();
  auto loss_fn = [&](const std::vector<Tensor>& b) { return (*bn)(b[0]).square().mean(); };
  std::string e = testing::error_message([&] { optim::accumulate_gradients(bn->parameters(), {x}, loss_fn, 2); });
  EXPECT_NE(e.find("[batch_norm] training mode normalizes with statistics over the whole batch"), std::string::npos) << e;

  MlpStep s(64);
  int64_t launched = metrics().steps_launched;
  std::vector<double> w = s.model->parameters()[0].to_vector<double>();
  MemoryBudgetScope tiny(MemoryBudget::parse("1KiB"));
  e = testing::error_message([&] {
    optim::accumulate_gradients(s.model->parameters(), {s.x, s.y}, [&](const std::vector<Tensor>& b) { return mse_loss((*s.model)(b[0]), b[1]); });
  });
  EXPECT_NE(e.find("[memory] the budget of 0.00 MiB cannot be met by micro-batches: the smallest, 64 of them, needs"), std::string::npos) << e;
  EXPECT_NE(e.find("largest buffers live there: param"), std::string::npos) << e;
  EXPECT_EQ(metrics().steps_launched, launched);
  EXPECT_FALSE(s.model->parameters()[0].grad().defined());
  EXPECT_EQ(s.model->parameters()[0].to_vector<double>(), w);
}

}  // namespace
}  // namespace tessera

// ---------------------------------------------------------------------------------------------
// Property: the compiler's random graphs under random budgets between their natural figure and a
// lower bound (the parameters the plan reads and the outputs' bytes, which stay live whatever the
// rewrites) either meet the budget with the unbudgeted values, or fail with the
// [memory] error before running (their outputs still pending). The share met is printed: without
// batch unstacking these small graphs, whose parameters and outputs dominate, rarely shrink.
namespace tessera {
namespace {

// The outputs' bytes as allocated (distinct computed nodes: each needs its own buffer for the
// whole run).
size_t output_bytes(const std::vector<ir::NodePtr>& outs) {
  std::set<const ir::Node*> seen;
  size_t b = 0;
  for (const ir::NodePtr& n : outs)
    if (n->op != ir::Op::Leaf && seen.insert(n.get()).second) b += allocated(size_t(numel(n->shape)) * itemsize(n->dtype));
  return b;
}

TEST(MemoryBudgetProperty, RandomGraphsMeetARandomBudgetWithTheSameValuesOrFailBeforeRunning) {
  constexpr int kGraphs = 300;
  std::mt19937 rng(24);
  int met = 0, refused = 0, shrunk = 0;
  for (int i = 0; i < kGraphs; ++i) {
    std::vector<ir::NodePtr> nodes = conformance::random_graph(i, Device("cpu"));
    auto tensors = [&] {
      std::vector<Tensor> ts;
      for (auto& n : nodes) ts.push_back(detail::from_node(n));
      return ts;
    };
    std::vector<Tensor> plain = tensors();
    const MemoryPlan p = plan_memory(plain);
    // What must stay live whatever the rewrites: the parameters the plan reads and the outputs.
    const size_t natural = p.step_bytes, lower = allocated_bytes(p, "param") + output_bytes(nodes);
    ASSERT_LE(lower, natural) << "graph " << i;
    std::vector<std::vector<double>> want;
    for (Tensor& t : plain) want.push_back(t.to_vector<double>());
    const size_t budget = lower + size_t(std::uniform_real_distribution<double>(0, 1)(rng) * double(natural - lower));
    MemoryBudgetScope in_force({std::max<size_t>(budget, 1), 0});
    std::vector<Tensor> budgeted = tensors();
    const int64_t launched = metrics().steps_launched;
    std::string e = testing::error_message([] { sync(); });
    if (e != "(no error)") {
      EXPECT_NE(e.find("[memory] the budget of"), std::string::npos) << "graph " << i << ": " << e;
      EXPECT_EQ(metrics().steps_launched, launched) << "graph " << i;
      for (size_t k = 0; k < budgeted.size(); ++k)  // an output that is an input is only rebound
        if (nodes[k]->op != ir::Op::Leaf) {
          EXPECT_FALSE(budgeted[k].is_realized()) << "graph " << i;
        }
      ++refused;
      continue;
    }
    ++met;
    shrunk += last_memory_plan().step_bytes < natural;
    EXPECT_LE(last_memory_plan().step_bytes, budget) << "graph " << i;
    for (size_t k = 0; k < budgeted.size(); ++k)
      EXPECT_LE(testing::normalized_error(budgeted[k].to_vector<double>(), want[k]), 1e-6) << "graph " << i << " output " << k;
  }
  std::printf("random graphs: %d met their budget (%d below their natural figure), %d refused before running\n", met, shrunk, refused);
  EXPECT_EQ(met + refused, kGraphs);
}

}  // namespace
}  // namespace tessera

// ---------------------------------------------------------------------------------------------
// Property over training graphs (conformance::random_training_graph: small MLPs with their
// backward pass, batch 32-256, where activations make most of the natural figure): under a random
// budget between the natural figure and a lower bound the test computes from the graph alone
// (the parameters the plan reads and the outputs, as allocated, plus the smallest slice of the largest computed value: its bytes
// over its longest extent), and under half the natural figure, each case either meets the budget,
// with the unbudgeted values and the allocator's high-water mark under it, or fails with the
// [memory] error before running. The share meeting half is printed and held to a floor.
namespace tessera {
namespace {

struct BudgetedRun {
  std::string error;
  std::vector<std::vector<double>> values;
  MemoryPlan plan;
  int64_t high_water = 0;
};
// Graph i traced afresh (its dropout draws the same numbers each time: the generator is reseeded).
std::vector<ir::NodePtr> training_graph(int i) {
  manual_seed(uint64_t(i));
  return conformance::random_training_graph(i, Device("cpu"));
}
BudgetedRun run_under(int i, size_t budget, size_t allocated_params) {
  BudgetedRun r;
  std::vector<Tensor> ts;
  for (const ir::NodePtr& n : training_graph(i)) ts.push_back(detail::from_node(n));
  const int64_t live_before = metrics().live_bytes, launched = metrics().steps_launched;  // the inputs included
  reset_peak_bytes();
  MemoryBudgetScope in_force({budget, 0});
  r.error = testing::error_message([] { sync(); });
  if (r.error != "(no error)") {
    EXPECT_NE(r.error.find("[memory] the budget of"), std::string::npos) << r.error;
    EXPECT_EQ(metrics().steps_launched, launched) << "refused before running";
    for (const Tensor& t : ts) EXPECT_FALSE(t.is_realized());
    return r;
  }
  r.plan = last_memory_plan();
  r.high_water = metrics().peak_bytes - (live_before - int64_t(allocated_params));
  for (Tensor& t : ts) r.values.push_back(t.to_vector<double>());
  return r;
}

TEST(MemoryBudgetProperty, RandomTrainingGraphsMeetABudgetWithTheSameValuesOrFailBeforeRunning) {
  constexpr int kGraphs = 40;
  std::mt19937 rng(2406);
  int eligible = 0, met_half = 0, met_random = 0, unstacked = 0;
  for (int i = 0; i < kGraphs; ++i) {
    std::vector<ir::NodePtr> nodes = training_graph(i);
    size_t natural = 0, allocated_params = 0, slice = 0;
    std::vector<std::vector<double>> want;
    {
      std::vector<Tensor> plain;
      for (const ir::NodePtr& n : nodes) plain.push_back(detail::from_node(n));
      const MemoryPlan p = plan_memory(plain);
      natural = p.step_bytes, allocated_params = allocated_bytes(p, "param");
      for (Tensor& t : plain) want.push_back(t.to_vector<double>());
    }
    for (const ir::NodePtr& n : ir::build_graph(nodes).nodes) {
      if (n->op == ir::Op::Leaf || n->shape.empty()) continue;
      const size_t b = size_t(n->numel()) * itemsize(n->dtype);
      slice = std::max(slice, b / size_t(*std::max_element(n->shape.begin(), n->shape.end())));
    }
    const size_t lower = allocated_params + output_bytes(nodes) + slice;
    ASSERT_LT(lower, natural) << "graph " << i;
    const size_t random = lower + size_t(std::uniform_real_distribution<double>(0, 1)(rng) * double(natural - lower));
    for (const size_t budget : {random, natural / 2}) {
      if (budget < lower) continue;  // below what must stay live: not a case
      BudgetedRun r = run_under(i, budget, allocated_params);
      eligible += budget != random;
      if (!r.error.empty() && r.error != "(no error)") continue;
      (budget == random ? met_random : met_half)++;
      unstacked += r.plan.unstacked_slices > 1;
      EXPECT_LE(r.plan.step_bytes, budget) << "graph " << i;
      EXPECT_LE(r.high_water, int64_t(budget)) << "graph " << i << ": the allocator's high-water mark\n" << r.plan.report();
      for (size_t k = 0; k < want.size(); ++k)  // slicing changes summation order, nothing else
        EXPECT_LE(testing::normalized_error(r.values[k], want[k]), 1e-5) << "graph " << i << " output " << k << "\n" << r.plan.report();
    }
  }
  std::printf("random training graphs: %d of %d met a random budget; at half the natural figure %d of %d whose lower bound is under "
              "it met it (%d plans unstacked)\n", met_random, kGraphs, met_half, eligible, unstacked);
  EXPECT_GE(eligible, kGraphs * 9 / 10) << "the generator makes graphs whose activations dominate";
  // The issue asks 80% (33 of 36 today; 28 before the weight gradients accumulated in their
  // output buffers: docs/architecture.md, "Memory budget").
  EXPECT_GE(met_half * 10, eligible * 8) << met_half << " of " << eligible;
}

}  // namespace
}  // namespace tessera
