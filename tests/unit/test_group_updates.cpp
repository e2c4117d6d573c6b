// The "group" pass (compiler/passes/group_updates.cpp) and the cpu backend's Steps of parts
// (kir::Step::parts): an optimizer's in-place updates of every parameter run as one Step, one
// task grid, with the bits the separate Steps give, on any number of threads and under a memory
// budget (whose rematerialization, after the pass, renames the slots the parts read); Steps that
// depend on one another, and targets that do not declare Target::elementwise_parts, keep them apart.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <functional>
#include <optional>
#include <random>
#include <set>

#include "backends/backend.h"
#include "backends/cpu/native_loops.h"
#include "compiler/pipeline.h"
#include "ir/graph.h"
#include "runtime/compile_options.h"
#include "runtime/realize.h"
#include "tensor/tensor_impl.h"
#include "tessera/memory.h"
#include "tessera/metrics.h"
#include "tessera/nn.h"
#include "tessera/optim.h"
#include "tessera/tessera.h"
#include "test_util.h"

using namespace tessera;
using namespace tessera::testing;

namespace {

struct GroupOn : ::testing::Test {
  void TearDown() override { runtime::set_disabled_passes(""); }
};

// Parameters of several shapes (one over kParallelMin positions, so the grid runs on threads).
const std::vector<Shape> kShapes = {{5}, {3, 4}, {300, 300}, {7, 2, 3}, {130}};

struct Updates {
  std::vector<std::vector<double>> params;  // after the last step
  int64_t launched_per_step = 0;            // Steps launched by the last step's update
  uint64_t grid = 0;                        // parts that ran in their Step's task grid
};

// `steps` AdamW steps (optim::adam_update, decoupled decay) from fixed parameters and gradients
// (the gradients change per step), each realized by itself.
Updates adamw_steps(int steps, const optim::AdamOptions& o) {
  std::vector<Tensor> p, m, v;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    p.push_back(random_tensor(kShapes[i], DType::Float32, uint32_t(10 + i)));
    m.push_back(zeros(kShapes[i]));
    v.push_back(zeros(kShapes[i]));
  }
  Updates r;
  const uint64_t grid0 = backends::cpu::parts_in_grid();
  for (int s = 1; s <= steps; ++s) {
    std::vector<Tensor> g;
    for (size_t i = 0; i < kShapes.size(); ++i) g.push_back(random_tensor(kShapes[i], DType::Float32, uint32_t(100 * s + i)));
    tessera::sync();
    const int64_t before = metrics().steps_launched;
    optim::adam_update(p, g, m, v, s, o, true);
    tessera::sync();
    r.launched_per_step = metrics().steps_launched - before;
  }
  r.grid = backends::cpu::parts_in_grid() - grid0;
  for (const Tensor& t : p) r.params.push_back(t.to_vector<double>());
  return r;
}

// torch.optim.AdamW's rule in float64 over the same float32 inputs.
std::vector<std::vector<double>> adamw_reference(int steps, const optim::AdamOptions& o) {
  std::vector<std::vector<double>> p, m, v;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    p.push_back(random_tensor(kShapes[i], DType::Float32, uint32_t(10 + i)).to_vector<double>());
    m.emplace_back(p.back().size(), 0.0), v.emplace_back(p.back().size(), 0.0);
  }
  for (int s = 1; s <= steps; ++s)
    for (size_t i = 0; i < kShapes.size(); ++i) {
      const std::vector<double> g = random_tensor(kShapes[i], DType::Float32, uint32_t(100 * s + i)).to_vector<double>();
      const double bc1 = 1 - std::pow(o.beta1, s), bc2 = 1 - std::pow(o.beta2, s);
      for (size_t k = 0; k < g.size(); ++k) {
        p[i][k] *= 1 - o.lr * o.weight_decay;
        m[i][k] = o.beta1 * m[i][k] + (1 - o.beta1) * g[k];
        v[i][k] = o.beta2 * v[i][k] + (1 - o.beta2) * g[k] * g[k];
        p[i][k] -= o.lr / bc1 * m[i][k] / (std::sqrt(v[i][k]) / std::sqrt(bc2) + o.eps);
      }
    }
  return p;
}

const optim::AdamOptions kAdamW{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};

TEST_F(GroupOn, AdamWOverFiveShapesIsOneStepWithTheSeparateStepsBits) {
  const Updates on = adamw_steps(3, kAdamW);
  Updates off;
  {
    PassesOff no_group("group");
    off = adamw_steps(3, kAdamW);
  }
  EXPECT_EQ(on.launched_per_step, 1) << "every parameter's update in one Step";
  EXPECT_GE(off.launched_per_step, int64_t(kShapes.size())) << "one per shape without the pass";
  EXPECT_EQ(on.grid, 3 * uint64_t(off.launched_per_step)) << "each step's parts (the Steps without the pass) all in its task grid";
  EXPECT_EQ(off.grid, 0u);
  EXPECT_EQ(on.params, off.params) << "the same bits as the separate Steps";
  const auto want = adamw_reference(3, kAdamW);
  for (size_t i = 0; i < kShapes.size(); ++i) EXPECT_TRUE(all_close(on.params[i], want[i], 1e-5)) << "parameter " << i;
}

TEST_F(GroupOn, AdamWIsTheSameBitsOn123Threads) {
  const int saved = omp_get_max_threads();
  std::vector<std::vector<std::vector<double>>> by_threads;
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    Updates r = adamw_steps(2, kAdamW);
    EXPECT_EQ(r.launched_per_step, 1) << t << " threads";
    by_threads.push_back(r.params);
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(by_threads[0], by_threads[1]);
  EXPECT_EQ(by_threads[0], by_threads[2]);
}

// SGD with momentum: the buffers' and the parameters' updates, every shape in one Step too.
TEST_F(GroupOn, SGDMomentumUpdatesAreOneStep) {
  auto run = [] {
    std::vector<Tensor> p, g;
    for (size_t i = 0; i < kShapes.size(); ++i) {
      p.push_back(random_tensor(kShapes[i], DType::Float32, uint32_t(20 + i)));
      g.push_back(random_tensor(kShapes[i], DType::Float32, uint32_t(30 + i)));
    }
    std::vector<Tensor> bufs(kShapes.size());
    int64_t launched = 0;
    for (int s = 0; s < 2; ++s) {
      tessera::sync();
      const int64_t before = metrics().steps_launched;
      bufs = optim::sgd_update(p, g, bufs, {.lr = 0.1, .momentum = 0.9});
      tessera::sync();
      launched = metrics().steps_launched - before;
    }
    std::vector<std::vector<double>> out;
    for (const Tensor& t : p) out.push_back(t.to_vector<double>());
    return std::pair{out, launched};
  };
  const auto on = run();
  runtime::set_disabled_passes("group");
  const auto off = run();
  EXPECT_EQ(on.second, 1);
  EXPECT_GE(off.second, int64_t(kShapes.size()));
  EXPECT_EQ(on.first, off.first);
  // By hand: p0 - 0.1 g, then the buffer 1.9 g: p0 - 0.29 g.
  for (size_t i = 0; i < kShapes.size(); ++i) {
    const auto p0 = random_tensor(kShapes[i], DType::Float32, uint32_t(20 + i)).to_vector<double>();
    const auto g = random_tensor(kShapes[i], DType::Float32, uint32_t(30 + i)).to_vector<double>();
    std::vector<double> want(p0.size());
    for (size_t k = 0; k < want.size(); ++k) want[k] = p0[k] - 0.29 * g[k];
    EXPECT_TRUE(all_close(on.first[i], want, 1e-6)) << "parameter " << i;
  }
}

// The benchmark GPT's shape of training step (forward, backward, clipping, AdamW) in small: the
// updates are one Step of parts, and training gives the same bits without the pass.
TEST_F(GroupOn, GPTTrainingStepRunsItsUpdatesAsOneStep) {
  auto train = [](int steps) {
    nn::GPTConfig c;
    c.vocab = 19, c.block = 12, c.embd = 24, c.heads = 2, c.layers = 2;
    manual_seed(3);
    nn::GPT model(c);
    optim::AdamW opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0.1});
    std::mt19937 rng(7);
    std::vector<double> losses;
    int64_t launched = 0;
    const uint64_t grid0 = backends::cpu::parts_in_grid();
    for (int s = 0; s < steps; ++s) {
      std::vector<int64_t> x(size_t(4 * c.block)), y(x.size());
      for (size_t i = 0; i < x.size(); ++i) x[i] = int64_t(rng() % uint32_t(c.vocab)), y[i] = (x[i] + 1) % c.vocab;
      const int64_t before = metrics().steps_launched;
      opt.zero_grad();
      Tensor loss = model.loss(from_vector(x, {4, c.block}, {DType::Int64, Device("cpu")}),
                               from_vector(y, {4, c.block}, {DType::Int64, Device("cpu")}));
      loss.backward();
      optim::clip_grad_norm(model.parameters(), 1.0);
      opt.step();
      tessera::sync();
      launched = metrics().steps_launched - before;
      losses.push_back(loss.item());
    }
    std::vector<double> all = losses;
    for (const Tensor& p : model.parameters()) {
      const auto v = p.to_vector<double>();
      all.insert(all.end(), v.begin(), v.end());
    }
    return std::tuple{all, launched, backends::cpu::parts_in_grid() - grid0};
  };
  const auto [on, launched_on, grid_on] = train(3);
  runtime::set_disabled_passes("group");
  const auto [off, launched_off, grid_off] = train(3);
  EXPECT_EQ(on, off) << "the same losses and parameters, bit for bit";
  EXPECT_EQ(grid_on, 3 * uint64_t(launched_off - launched_on + 1)) << "one Step of parts per training step, all in its grid";
  EXPECT_EQ(grid_off, 0u);
  // 2 x (LN weight + bias) + wte + wpe + per block qkv, proj, fc, out (weights and biases) + ln_f:
  // several shapes, each shape's updates one Step without the pass.
  EXPECT_GE(launched_off - launched_on, 4) << launched_on << " Steps with the pass, " << launched_off << " without";
}

// ---- the budget passes after the pass ----

// Inputs of the parts of the plan's Steps of parts that a recomputed copy (remat) writes.
int parts_reading_copies(const compiler::Plan& plan) {
  std::set<int> copies;
  for (const kir::Step& st : plan.steps)
    if (!st.sources.empty() && st.sources[0].op.rfind("recompute:", 0) == 0) copies.insert(st.output);
  int n = 0;
  for (const kir::Step& st : plan.steps)
    for (const kir::Step& part : st.parts)
      for (int x : part.inputs) n += int(copies.count(x));
  return n;
}

int steps_with_parts(const compiler::Plan& p) {
  int n = 0;
  for (const kir::Step& st : p.steps) n += !st.parts.empty();
  return n;
}

// Under a memory budget, rematerialization (compiler/passes/remat.cpp) runs after "group" and
// renames the temporary it recomputes in every later Step that reads it. The Step of parts'
// kernel loads its parts' inputs, so the parts must be renamed too (kir::Step::rename_reads):
// renaming only the joined Step's inputs left a part reading the dropped temporary, whose arena
// bytes had been given to another buffer.
//
// AdamW steps on two parameters of different shapes (so the merge pass leaves their updates two
// Steps and "group" joins them) whose gradients are products, as a weight's gradient is, computed
// in the same graph: temporaries read first by a statistic s = sum(g1) + sum(g2) and last by the
// update. A large temporary computed from s, big = exp(X * s / 4096), read by a reduction and a
// product, makes the peak after the gradients and before the update: the gradients are live
// across it without being read there. No elementwise candidate is left, so remat recomputes the
// larger gradient's product (a GEMM) right before the update, which reads the copy in a part.
// (A small MLP's training step, tried first, gives remat no candidate at any budget.)
struct BudgetedAdamW {
  std::vector<std::vector<double>> params;  // after the last step
  std::vector<double> outputs;              // each step's statistic and the big temporary's reductions
  int recomputed = 0;                       // Steps the last step's plan recomputed
  int parts_reading_copies = 0;             // inputs of the parts of its Step of parts that a recomputed copy writes
  int steps_with_parts = 0;
};

const std::vector<Shape> kBudgetShapes = {{64, 64}, {50, 60}};

// Step s's gradients: products, as a weight's gradient is (x^T dy), of fixed random factors.
std::vector<Tensor> budget_gradients(int s) {
  std::vector<Tensor> g;
  for (size_t i = 0; i < kBudgetShapes.size(); ++i) {
    const Shape& sh = kBudgetShapes[i];
    g.push_back(matmul(random_tensor({sh[0], 16}, DType::Float32, uint32_t(500 + 10 * s + i)),
                       random_tensor({16, sh[1]}, DType::Float32, uint32_t(600 + 10 * s + i))));
  }
  return g;
}

BudgetedAdamW adamw_with_gradients_across_a_peak(int steps, bool budgeted) {
  std::vector<Tensor> p, m, v;
  for (size_t i = 0; i < kBudgetShapes.size(); ++i) {
    p.push_back(random_tensor(kBudgetShapes[i], DType::Float32, uint32_t(40 + i)));
    m.push_back(zeros(kBudgetShapes[i]));
    v.push_back(zeros(kBudgetShapes[i]));
  }
  Tensor W = random_tensor({2048, 8}, DType::Float32, 77);
  BudgetedAdamW r;
  for (int s = 1; s <= steps; ++s) {
    Tensor X = random_tensor({64, 2048}, DType::Float32, uint32_t(700 + s));
    tessera::sync();
    Tensor stat, r1, r2;
    {  // the gradients and the big temporary dropped here: temporaries of the graph, not outputs
      const std::vector<Tensor> g = budget_gradients(s);
      stat = g[0].sum() + g[1].sum();
      Tensor big = exp(X * (stat / 4096.0));
      r1 = big.sum({1}), r2 = matmul(big, W);
      optim::adam_update(p, g, m, v, s, kAdamW, true);
    }
    const MemoryPlan natural = pending_memory_plan();
    std::optional<MemoryBudgetScope> budget;
    if (budgeted) budget.emplace(MemoryBudget{natural.step_bytes - 1, 0});
    tessera::sync();
    r.recomputed = last_memory_plan().recomputed_steps;
    for (const Tensor& t : {stat, r1, r2})
      for (double x : t.to_vector<double>()) r.outputs.push_back(x);
    const auto plan = runtime::last_executed_plan();
    r.parts_reading_copies = parts_reading_copies(*plan);
    r.steps_with_parts = steps_with_parts(*plan);
  }
  for (const Tensor& t : p) r.params.push_back(t.to_vector<double>());
  return r;
}

TEST_F(GroupOn, RematerializationRenamesTheSlotsTheUpdatePartsRead) {
  PassesOff no_unstack("unstack");  // rematerialization alone meets the budget
  const BudgetedAdamW plain = adamw_with_gradients_across_a_peak(3, false);
  const BudgetedAdamW on = adamw_with_gradients_across_a_peak(3, true);
  BudgetedAdamW off;
  {
    PassesOff no_group("unstack,group");
    off = adamw_with_gradients_across_a_peak(3, true);
  }
  EXPECT_EQ(plain.recomputed, 0);
  EXPECT_EQ(plain.steps_with_parts, 1);
  EXPECT_GE(on.recomputed, 1) << "the budget is met by recomputing a gradient";
  EXPECT_EQ(on.steps_with_parts, 1) << "the updates are one Step of parts";
  EXPECT_GE(on.parts_reading_copies, 1) << "a part of the update Step reads a recomputed temporary";
  EXPECT_GE(off.recomputed, 1);
  EXPECT_EQ(off.steps_with_parts, 0);
  EXPECT_EQ(on.params, off.params) << "the same bits as the separate Steps";
  EXPECT_EQ(on.params, plain.params) << "the same bits as without the budget";
  EXPECT_EQ(on.outputs, plain.outputs);
  // torch.optim.AdamW's rule in float64 over the same gradients.
  std::vector<std::vector<double>> want, mm, vv;
  for (size_t i = 0; i < kBudgetShapes.size(); ++i) {
    want.push_back(random_tensor(kBudgetShapes[i], DType::Float32, uint32_t(40 + i)).to_vector<double>());
    mm.emplace_back(want.back().size(), 0.0), vv.emplace_back(want.back().size(), 0.0);
  }
  const optim::AdamOptions& o = kAdamW;
  for (int s = 1; s <= 3; ++s) {
    const std::vector<Tensor> gs = budget_gradients(s);
    for (size_t i = 0; i < kBudgetShapes.size(); ++i) {
      const std::vector<double> g = gs[i].to_vector<double>();
      const double bc1 = 1 - std::pow(o.beta1, s), bc2 = 1 - std::pow(o.beta2, s);
      for (size_t k = 0; k < g.size(); ++k) {
        want[i][k] *= 1 - o.lr * o.weight_decay;
        mm[i][k] = o.beta1 * mm[i][k] + (1 - o.beta1) * g[k];
        vv[i][k] = o.beta2 * vv[i][k] + (1 - o.beta2) * g[k] * g[k];
        want[i][k] -= o.lr / bc1 * mm[i][k] / (std::sqrt(vv[i][k]) / std::sqrt(bc2) + o.eps);
      }
    }
  }
  for (size_t i = 0; i < kBudgetShapes.size(); ++i) EXPECT_TRUE(all_close(on.params[i], want[i], 1e-5)) << "parameter " << i;
}

// ---- the pass on plans ----

// The plan of ys = f(params), output k written into the buffer of params[k] (donation), for the
// cpu's target with or without Target::elementwise_parts.
compiler::Plan plan_of_updates(const std::vector<Tensor>& params, const std::vector<Tensor>& ys, bool parts) {
  std::vector<ir::NodePtr> nodes;
  for (const Tensor& y : ys) nodes.push_back(detail::node_of(y));
  ir::Graph g = ir::build_graph(nodes);
  std::vector<int> donate(ys.size(), -1);
  for (size_t k = 0; k < ys.size(); ++k)
    for (size_t i = 0; i < g.params.size(); ++i)
      if (g.nodes[size_t(g.params[i])] == detail::node_of(params[k])) donate[k] = int(i);
  compiler::Options o;
  o.target = backends::backend_for(Device("cpu")).properties(0);
  o.target.elementwise_parts = parts;
  return compiler::compile_graph(g, donate, o);
}

TEST(GroupPlan, IndependentUpdatesJoinOnlyForATargetThatRunsParts) {
  Tensor a = random_tensor({5}), b = random_tensor({3, 4}), c = random_tensor({70});
  const std::vector<Tensor> params{a, b, c}, ys{a * 0.5 - 1, b * 2 + 3, exp(c)};
  const compiler::Plan with = plan_of_updates(params, ys, true);
  ASSERT_EQ(with.steps.size(), 1u) << with.str();
  const kir::Step& st = with.steps[0];
  ASSERT_EQ(st.parts.size(), 3u) << with.str();
  EXPECT_EQ(st.shape, Shape{5 + 12 + 70});
  EXPECT_EQ(st.outputs().size(), 3u);
  double flops = 0;
  for (const kir::Step& p : st.parts) flops += p.cost.flops;
  EXPECT_EQ(st.cost.flops, flops);
  const compiler::Plan without = plan_of_updates(params, ys, false);
  EXPECT_EQ(without.steps.size(), 3u) << without.str();
  EXPECT_EQ(steps_with_parts(without), 0) << "a target without Target::elementwise_parts gets separate Steps";
}

// b's update reads a's new value (broadcast along b's rows, so the merge pass leaves them two
// Steps): the second depends on the first, and they stay two Steps, with the values by hand.
TEST_F(GroupOn, AnUpdateReadingAnotherOnesResultIsNotJoined) {
  Tensor a = random_tensor({4}), b = random_tensor({3, 4});
  const compiler::Plan p = plan_of_updates({a, b}, {a - 1, b - (a - 1)}, true);
  EXPECT_EQ(steps_with_parts(p), 0) << p.str();
  EXPECT_EQ(p.steps.size(), 2u) << p.str();

  const std::vector<double> a0 = a.to_vector<double>(), b0 = b.to_vector<double>();
  a.sub_(1);
  b.sub_(a);
  tessera::sync();
  const std::vector<double> a1 = a.to_vector<double>(), b1 = b.to_vector<double>();
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(a1[k], double(float(a0[k] - 1)));
  for (size_t k = 0; k < 12; ++k) EXPECT_EQ(b1[k], double(float(b0[k] - double(float(a0[k % 4] - 1)))));
}

}  // namespace
