// Fusion: how many Steps common patterns become, and that fused results equal unfused ones.
#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "backends/backend.h"
#include "compiler/lower.h"
#include "compiler/pipeline.h"
#include "ir/graph.h"
#include "kernel_ir/step.h"
#include "runtime/compile_options.h"
#include "runtime/realize.h"
#include "tensor/tensor_impl.h"
#include "tessera/tessera.h"
#include "test_util.h"

using namespace tessera;
using namespace tessera::testing;

namespace {

// Steps launched and values of f()'s result (f's inputs are realized before counting).
struct Run {
  int64_t steps;
  std::vector<double> values;
};
template <class F>
Run run(F&& f) {
  int64_t before = metrics().steps_launched;
  Tensor y = f();
  auto v = y.to_vector<double>();  // realizes y's graph alone
  int64_t steps = metrics().steps_launched - before;
  return {steps, v};
}

// Runs f with every pass on and with every pass off; results must agree.
template <class F>
int64_t fused_steps(F&& f) {
  runtime::set_disabled_passes("all");
  Run off = run(f);
  runtime::set_disabled_passes("");
  Run on = run(f);
  EXPECT_LE(normalized_error(on.values, off.values), 1e-6);
  EXPECT_LT(on.steps, off.steps);
  return on.steps;
}

struct PassesOn : ::testing::Test {
  void TearDown() override { runtime::set_disabled_passes(""); }
};

// A float64 model's loss with element i of its tensor t moved by h (t comes back after).
template <class Model>
double loss_moved(Model& d, Tensor& t, int64_t i, double h) {
  std::vector<double> v = t.to_vector<double>();
  v[size_t(i)] += h;
  Tensor saved = t;
  t = from_vector(v, t.shape(), {DType::Float64});
  const double l = d.loss().item();
  t = saved;
  return l;
}

// A float32 graph's outputs (Model(DType::Float32).run()) are the same bits on 1, 2 and 3 threads.
template <class Model>
void expect_same_bits_on_1_2_3_threads() {
  std::vector<std::vector<double>> by_threads;
  const int saved = omp_get_max_threads();
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    Model e(DType::Float32);
    std::vector<double> all;
    for (const Tensor& y : e.run()) {
      const std::vector<double> v = y.to_vector<double>();
      all.insert(all.end(), v.begin(), v.end());
    }
    by_threads.push_back(all);
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(by_threads[0], by_threads[1]);
  EXPECT_EQ(by_threads[0], by_threads[2]);
}

TEST_F(PassesOn, BiasGeluDropoutAfterMatmulIsOneGemmStep) {
  Tensor x = random_tensor({64, 32}, DType::Float32, 1), w = random_tensor({48, 32}, DType::Float32, 2);
  Tensor b = random_tensor({48}, DType::Float32, 3);
  nn::Dropout drop(0.25);
  drop.train();
  EXPECT_EQ(fused_steps([&] {
              manual_seed(7);
              return drop.forward(gelu(matmul(x, w.transpose(0, 1)) + b));
            }),
            1);
}

TEST_F(PassesOn, SoftmaxIsOneRowStep) {
  Tensor x = random_tensor({64, 100}, DType::Float32, 4, -4, 4);
  EXPECT_EQ(fused_steps([&] { return softmax(x, -1); }), 1);
  EXPECT_EQ(fused_steps([&] { return softmax(x.reshape({8, 8, 100}), 2); }), 1);
}

TEST_F(PassesOn, LayerNormForwardIsOneRowStep) {
  Tensor x = random_tensor({32, 128}, DType::Float32, 5, -3, 3);
  Tensor w = random_tensor({128}, DType::Float32, 6), b = random_tensor({128}, DType::Float32, 7);
  EXPECT_EQ(fused_steps([&] { return layer_norm(x, {128}, w, b); }), 1);
}

TEST_F(PassesOn, FusedRowStepsMatchTheFloat64Reference) {
  Tensor x = random_tensor({16, 33}, DType::Float32, 8, -4, 4);
  EXPECT_TRUE(matches_reference(softmax(x, -1)));
  EXPECT_TRUE(matches_reference(log_softmax(x, 1)));
  EXPECT_TRUE(matches_reference(layer_norm(x, {33})));
  EXPECT_TRUE(matches_reference(softmax(x, 0)));  // not a trailing axis: a Reduce Step
}

// A row statistic read again later (here by a second output; in training, by the backward pass)
// is stored by the Row Step that normalizes with it, not by a Row Step of its own.
TEST_F(PassesOn, ARowStatisticReadTwiceIsStoredByTheRowStepThatRecomputesIt) {
  for (Shape s : {Shape{32, 128}, Shape{6, 5, 40}}) {
    // (float16: the deviation is read back rounded, as stored)
    Tensor x = random_tensor(s, s[0] == 6 ? DType::Float16 : DType::Float32, 9, -3, 3);
    auto outputs = [&] {
      Tensor sd = sqrt(var(x, {-1}, 0, true) + 1e-5), e = exp(x - x.amax({-1}, true));
      return std::vector<Tensor>{(x - mean(x, {-1}, true)) / sd, sd * 2.0, e / e.sum({-1}, true), log(e.sum({-1}, true))};
    };
    std::vector<std::vector<double>> values[2];
    auto steps = [&](const char* disabled) {
      runtime::set_disabled_passes(disabled);
      int64_t before = metrics().steps_launched;
      std::vector<Tensor> ys = outputs();
      tessera::sync();
      for (const Tensor& y : ys) values[*disabled != 0].push_back(y.to_vector<double>());
      return metrics().steps_launched - before;
    };
    // The row statistics read by several nodes (the layer norm's mean and standard deviation,
    // softmax's sum) are stored once per row by Steps of their own, which the merges join into
    // the Row Steps computing them: four Steps, one per output.
    const int64_t unmerged = steps("merge"), merged = steps("");
    EXPECT_EQ(merged, 4);
    EXPECT_GE(unmerged - merged, 1);
    EXPECT_EQ(values[0], values[1]) << "merged and unmerged differ";
    runtime::set_disabled_passes("");
    EXPECT_TRUE(matches_reference(outputs()));
  }
}

// A layer norm in training, as the GPT's residual stream has it: its input a sum of ten tensors
// (so the deviation is too heavy to recompute in each of its readers), its output read
// by a product, its gradient by a product too. The forward is one Row Step (mean, variance,
// normalization and affine in one pass over each row, storing the row statistics), the
// backward's input gradient one Row Step (its two row sums, the normalized input recomputed
// from the stored statistics), the weight and bias gradients a Reduce Step each; nothing else
// runs over the layer norm's positions. Values against the float64 reference and finite
// differences, bit-identical for 1, 2 and 3 threads.
struct LayerNormTraining {
  static constexpr int64_t B = 4, T = 16, C = 64;
  Tensor parts[5], biases[5], w, b, W, r;
  int addends;
  explicit LayerNormTraining(DType t, int n = 5) : addends(n) {
    for (int k = 0; k < 5; ++k)
      parts[k] = random_tensor({B, T, C}, t, 40 + uint32_t(k), -2, 2), biases[k] = random_tensor({C}, t, 50 + uint32_t(k));
    w = random_tensor({C}, t, 46, 0.5, 1.5), b = random_tensor({C}, t, 47);
    W = random_tensor({C, 32}, t, 48, -0.3, 0.3), r = random_tensor({B, T, 32}, t, 49);
    for (Tensor* p : {&parts[0], &w, &b}) p->requires_grad_(true);
  }
  // The residual stream: five products' outputs with their biases.
  Tensor input() const {
    Tensor x = parts[0] + biases[0];
    for (int k = 1; k < addends; ++k) x = x + (parts[k] + biases[k]);
    return x;
  }
  Tensor loss() const { return (matmul(layer_norm(input(), {C}, w, b), W) * r).sum(); }
  // The loss and the gradients of the first addend, the weight and the bias.
  std::vector<Tensor> run() {
    Tensor l = loss();
    l.backward();
    return {l, parts[0].grad(), w.grad(), b.grad()};
  }
};

compiler::Plan plan_of(const std::vector<Tensor>& ys) {
  std::vector<ir::NodePtr> nodes;
  for (const Tensor& y : ys) nodes.push_back(detail::node_of(y));
  compiler::Options o;
  o.target = backends::backend_for(Device("cpu")).properties(0);
  return compiler::compile_graph(ir::build_graph(nodes), {}, o);
}

TEST_F(PassesOn, LayerNormTrainingIsOneRowStepEachWayAndOneColumnReduction) {
  using L = LayerNormTraining;
  // Five addends: their sum is stored once (an elementwise Step, the one other Step over the
  // positions; its readers each load one buffer, not ten). Either way the forward stores the
  // statistics and the backward reads them (the deviation over a stored input is light, but each
  // Step reading it would run its row sum again).
  for (int n : {5, 1}) {
    L f32(DType::Float32, n);
    const compiler::Plan p = plan_of(f32.run());
    int rows = 0, reduces = 0, others = 0;
    for (const kir::Step& st : p.steps) {
      const bool over_ln = numel(st.kind == kir::StepKind::Row || st.kind == kir::StepKind::Reduce ? st.domain : st.shape) ==
                           L::B * L::T * L::C;
      if (!over_ln || st.kind == kir::StepKind::Gemm) continue;
      if (st.kind == kir::StepKind::Row && st.row == L::C) ++rows;
      else if (st.kind == kir::StepKind::Reduce && st.shape == Shape{1, 1, L::C}) ++reduces;
      else ++others;
    }
    EXPECT_EQ(rows, 2) << n << " addends\n" << p.str();
    // The weight and bias gradients: one Reduce Step with two outputs on the cpu (multi_reduce).
    EXPECT_EQ(reduces, 1) << n << " addends\n" << p.str();
    EXPECT_EQ(others, n > 1 ? 1 : 0) << n << " addends\n" << p.str();
  }

  // Values: against the float64 reference of the same graph, and the gradients against central
  // differences of the float64 loss.
  L a(DType::Float32);
  EXPECT_TRUE(matches_reference(a.run()));
  L d(DType::Float64);
  const std::vector<Tensor> grads = d.run();
  auto loss_at = [&](Tensor& t, int64_t i, double h) { return loss_moved(d, t, i, h); };
  const std::vector<std::pair<int, std::vector<int64_t>>> probes = {{0, {0, 77, 1000, 4095}}, {1, {0, 13, 63}}, {2, {5, 40}}};
  Tensor* params[] = {&d.parts[0], &d.w, &d.b};
  for (const auto& [k, at] : probes) {
    const std::vector<double> g = grads[size_t(k) + 1].to_vector<double>();
    for (int64_t i : at) {
      const double h = 1e-5, fd = (loss_at(*params[k], i, h) - loss_at(*params[k], i, -h)) / (2 * h);
      EXPECT_NEAR(g[size_t(i)], fd, 1e-6 * std::max(1.0, std::fabs(fd))) << "parameter " << k << " element " << i;
    }
  }

  expect_same_bits_on_1_2_3_threads<L>();
}

// The GPT's residual stream: x_{k+1} = x_k + (layer_norm_k(x_k) W_k + c_k), each x_k read by its
// layer norm (the forward's Row Step, the backward's, the weight gradient's Reduce) and by the
// next add, the last one by a final layer norm and a later add. Left pending, x_k is a sum of up
// to 2k + 1 addends that each of those Steps re-reads input by input; it is stored once instead,
// by the product whose output it adds (the add is that GEMM's epilogue): no elementwise Step
// over the positions, and no Step other than a product reads more than three [B, T, C] buffers
// (the backward's Row Step: the product's gradient, x_k and the gradient of x_{k+1}), which
// loads the forward's row mean rather than summing x_k's rows again. Values
// against the float64 reference and finite differences, bit-identical for 1, 2 and 3 threads.
struct ResidualStream {
  static constexpr int64_t B = 4, T = 16, C = 64;
  static constexpr int K = 4;
  Tensor x0, w[K + 1], b[K + 1], W[K], c[K], Wout, r, z, r2;
  explicit ResidualStream(DType t) {
    x0 = random_tensor({B, T, C}, t, 70, -2, 2).requires_grad_(true);
    for (int k = 0; k <= K; ++k) {
      w[k] = random_tensor({C}, t, 71 + uint32_t(k), 0.5, 1.5).requires_grad_(true);
      b[k] = random_tensor({C}, t, 76 + uint32_t(k)).requires_grad_(true);
    }
    for (int k = 0; k < K; ++k) {
      W[k] = random_tensor({C, C}, t, 81 + uint32_t(k), -0.3, 0.3).requires_grad_(true);
      c[k] = random_tensor({C}, t, 85 + uint32_t(k)).requires_grad_(true);
    }
    Wout = random_tensor({C, 16}, t, 89, -0.3, 0.3), r = random_tensor({B, T, 16}, t, 90);
    z = random_tensor({B, T, C}, t, 91), r2 = random_tensor({B, T, C}, t, 92);
  }
  Tensor loss() const {
    Tensor x = x0;
    for (int k = 0; k < K; ++k) x = x + (matmul(layer_norm(x, {C}, w[k], b[k]), W[k]) + c[k]);
    return (matmul(layer_norm(x, {C}, w[K], b[K]), Wout) * r).sum() + ((x + z) * r2).sum();
  }
  // The loss and the gradients of x0, the first layer norm's weight, the second product's weight,
  // the first product's bias and the last layer norm's bias.
  std::vector<Tensor> run() {
    Tensor l = loss();
    l.backward();
    return {l, x0.grad(), w[0].grad(), W[1].grad(), c[0].grad(), b[K].grad()};
  }
};

TEST_F(PassesOn, TheResidualStreamIsStoredOnceByTheProductsAddingToIt) {
  using R = ResidualStream;
  {
    R f32(DType::Float32);
    const compiler::Plan p = plan_of(f32.run());
    const int64_t n = R::B * R::T * R::C;
    int elementwise = 0, epilogues = 0, widest = 0;
    for (const kir::Step& st : p.steps) {
      const bool over = numel(st.kind == kir::StepKind::Row || st.kind == kir::StepKind::Reduce ? st.domain : st.shape) == n;
      if (!over) continue;
      if (st.kind == kir::StepKind::Gemm) {
        epilogues += !st.program.empty();
        continue;
      }
      elementwise += st.kind == kir::StepKind::Elementwise;
      // Two row sums each way: the backward reads the forward's mean, not its own.
      const int64_t sums = std::count_if(st.program.begin(), st.program.end(), [](const kir::Instr& in) { return in.code == kir::Code::RowSum; });
      EXPECT_LE(sums, 2) << st.str();
      int full = 0;
      for (size_t i = 0; i < st.inputs.size(); ++i)
        full += numel(p.slots[size_t(st.inputs[i])].shape) == n &&
                std::find(st.inputs.begin(), st.inputs.begin() + int64_t(i), st.inputs[i]) == st.inputs.begin() + int64_t(i);
      widest = std::max(widest, full);
    }
    EXPECT_EQ(elementwise, 0) << p.str();
    EXPECT_EQ(epilogues, R::K) << "each residual add in its product's epilogue\n" << p.str();
    EXPECT_LE(widest, 3) << "a Step re-reads the residual stream's addends\n" << p.str();
  }

  R a(DType::Float32);
  EXPECT_TRUE(matches_reference(a.run()));
  R d(DType::Float64);
  const std::vector<Tensor> grads = d.run();
  auto loss_at = [&](Tensor& t, int64_t i, double h) { return loss_moved(d, t, i, h); };
  Tensor* params[] = {&d.x0, &d.w[0], &d.W[1], &d.c[0], &d.b[R::K]};
  const std::vector<std::vector<int64_t>> probes = {{0, 777, 4095}, {3, 60}, {0, 1000, 4095}, {9}, {33}};
  for (size_t k = 0; k < probes.size(); ++k) {
    const std::vector<double> g = grads[k + 1].to_vector<double>();
    for (int64_t i : probes[k]) {
      const double h = 1e-5, fd = (loss_at(*params[k], i, h) - loss_at(*params[k], i, -h)) / (2 * h);
      EXPECT_NEAR(g[size_t(i)], fd, 1e-6 * std::max(1.0, std::fabs(fd))) << "parameter " << k << " element " << i;
    }
  }

  expect_same_bits_on_1_2_3_threads<R>();
}

// AdamW's update of many parameters: one Step per shape (a multi-tensor update), not two per
// parameter; the values equal the unmerged update's and a float64 AdamW computed here. Nine
// parameters of two shapes; the second step is counted (the first creates the moments).
TEST_F(PassesOn, AdamWUpdatesEveryParameterOfAShapeInOneStep) {
  const std::vector<Shape> shapes{{64}, {64}, {16, 8}, {64}, {16, 8}, {64}, {64}, {16, 8}, {64}};
  const double lr = 1e-2, wd = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  auto run_adamw = [&](const char* disabled, int64_t* steps) {
    runtime::set_disabled_passes(disabled);
    std::vector<Tensor> ps;
    for (size_t i = 0; i < shapes.size(); ++i) ps.push_back(random_tensor(shapes[i], DType::Float32, 20 + uint32_t(i)).requires_grad_());
    optim::AdamW opt(ps, {.lr = lr, .weight_decay = wd});
    for (int step = 0; step < 2; ++step) {
      for (size_t i = 0; i < ps.size(); ++i) ps[i].set_grad(random_tensor(shapes[i], DType::Float32, 40 + uint32_t(10 * step + i)));
      int64_t before = metrics().steps_launched;
      opt.step();
      tessera::sync();
      *steps = metrics().steps_launched - before;
    }
    std::vector<std::vector<double>> r;
    for (const Tensor& p : ps) r.push_back(p.to_vector<double>());
    return r;
  };
  int64_t on = 0, off = 0;
  // (The group pass, on for the cpu, then makes the two one Step of parts: test_group_updates.)
  auto merged = run_adamw("group", &on), unmerged = run_adamw("merge,group", &off);
  EXPECT_EQ(on, 2) << "one update Step per shape";
  EXPECT_GE(off, int64_t(shapes.size()));
  // The float64 AdamW (PyTorch's formulation) from the same initial values and gradients.
  for (size_t i = 0; i < shapes.size(); ++i) {
    int64_t n = numel(shapes[i]);
    std::vector<double> p = random_values(n, DType::Float32, 20 + uint32_t(i)), m(size_t(n), 0), v(size_t(n), 0);
    for (int step = 1; step <= 2; ++step) {
      std::vector<double> g = random_values(n, DType::Float32, 40 + uint32_t(10 * (step - 1) + i));
      double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
      for (size_t k = 0; k < size_t(n); ++k) {
        p[k] *= 1 - lr * wd;
        m[k] = b1 * m[k] + (1 - b1) * g[k];
        v[k] = b2 * v[k] + (1 - b2) * g[k] * g[k];
        p[k] -= lr / bc1 * m[k] / (std::sqrt(v[k]) / std::sqrt(bc2) + eps);
      }
    }
    EXPECT_EQ(merged[i], unmerged[i]) << "parameter " << i << ": merged and unmerged updates differ";
    EXPECT_TRUE(all_close(merged[i], p, 1e-6)) << "parameter " << i;
  }
}

// Cross-entropy in training over 3-D logits [B, T, V] (a GPT head's: a product's output, classes
// along the last dim, read as [B, V, T] as PyTorch takes them), with ignored targets, label
// smoothing and each reduction: the loss picks each row's target logit by a mask (no gather) and
// its gradient is elementwise (no scatter into zeros), so the logits are read by ONE Row Step,
// which computes each row's max and sum of exponentials once and writes the per-row terms the
// loss sums and the logits' gradient; forward-only (eval), one Row Step too. Values against
// PyTorch's formula in float64 by hand, the float64 reference of the same graph and central
// differences; bit-identical for 1, 2 and 3 threads.
struct CrossEntropyTraining {
  static constexpr int64_t B = 3, T = 10, H = 16, V = 37;
  Tensor h, W, target, r;
  Reduction red;
  double eps;
  CrossEntropyTraining(DType t, Reduction rd = Reduction::Mean, double e = 0.1) : red(rd), eps(e) {
    h = random_tensor({B, T, H}, t, 60, -1, 1), W = random_tensor({H, V}, t, 61, -1, 1);
    std::vector<int64_t> tv;
    for (int64_t i = 0; i < B * T; ++i) tv.push_back(i % 7 == 3 ? -100 : (i * 11) % V);  // rows 3, 10, 17, 24 ignored
    target = from_vector<int64_t>(tv, {B, T}, {DType::Int64, Device("cpu")});
    r = random_tensor({B, T}, t, 62);
    W.requires_grad_(true);
  }
  Tensor logits() const { return matmul(h, W); }
  Tensor loss() const {
    Tensor l = cross_entropy(logits().permute({0, 2, 1}), target, {.reduction = red, .label_smoothing = eps});
    return red == Reduction::None ? (l * r).sum() : l;  // None: the per-target losses [B, T], weighted
  }
  std::vector<Tensor> run() {
    Tensor l = loss();
    l.backward();
    return {l, W.grad()};
  }
};

// PyTorch's per-target loss in float64 ((1 - e) nll + e * mean over classes of -log p; 0 where
// ignored), and its gradient with respect to the logits.
std::vector<double> ce_rows(const std::vector<double>& z, const std::vector<int64_t>& t, int64_t V, double e,
                            std::vector<double>* dz = nullptr) {
  std::vector<double> out;
  if (dz) dz->assign(z.size(), 0);
  for (size_t n = 0; n < t.size(); ++n) {
    if (t[n] == -100) {
      out.push_back(0);
      continue;
    }
    const double* x = &z[n * size_t(V)];
    double m = -INFINITY, s = 0, sum = 0;
    for (int64_t c = 0; c < V; ++c) m = std::max(m, x[c]);
    for (int64_t c = 0; c < V; ++c) s += std::exp(x[c] - m), sum += x[c];
    const double lse = m + std::log(s);
    out.push_back((1 - e) * (lse - x[t[n]]) + e * (lse - sum / double(V)));
    if (dz)
      for (int64_t c = 0; c < V; ++c) (*dz)[n * size_t(V) + size_t(c)] = std::exp(x[c] - lse) - (1 - e) * (c == t[n]) - e / double(V);
  }
  return out;
}

TEST_F(PassesOn, CrossEntropyReadsTheLogitsInOneRowStepEachWay) {
  using CE = CrossEntropyTraining;
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None})
    for (double eps : {0.0, 0.1}) {
      const std::string what = "reduction " + std::to_string(int(red)) + " smoothing " + std::to_string(eps);
      for (bool train : {true, false}) {
        CE m(DType::Float32, red, eps);
        const compiler::Plan p = plan_of(train ? m.run() : std::vector<Tensor>{m.loss()});
        int rows = 0, others = 0, addressed = 0;
        for (const kir::Step& st : p.steps) {
          addressed += st.kind == kir::StepKind::Gather || st.kind == kir::StepKind::ScatterAdd;
          const bool over_logits = numel(st.kind == kir::StepKind::Row || st.kind == kir::StepKind::Reduce ? st.domain : st.shape) ==
                                   CE::B * CE::T * CE::V;
          if (!over_logits || st.kind == kir::StepKind::Gemm) continue;
          (st.kind == kir::StepKind::Row && st.row == CE::V ? rows : others)++;
        }
        EXPECT_EQ(rows, 1) << what << (train ? " training\n" : " eval\n") << p.str();
        EXPECT_EQ(others, 0) << what << (train ? " training\n" : " eval\n") << p.str();
        EXPECT_EQ(addressed, 0) << what << "\n" << p.str();
      }
      // Values: PyTorch's formula by hand, the float64 reference, central differences.
      CE a(DType::Float32, red, eps);
      const std::vector<Tensor> got = a.run();
      EXPECT_TRUE(matches_reference(got)) << what;
      CE d(DType::Float64, red, eps);
      const std::vector<double> z = d.logits().reshape({-1, CE::V}).to_vector<double>(), w = d.r.to_vector<double>();
      const std::vector<int64_t> t = d.target.to_vector<int64_t>();
      std::vector<double> dz;
      const std::vector<double> rows = ce_rows(z, t, CE::V, eps, &dz);
      double kept = 0, want = 0;
      for (size_t n = 0; n < t.size(); ++n) {
        kept += t[n] != -100;
        const double scale = red == Reduction::None ? w[n] : 1;
        want += rows[n] * scale;
        for (int64_t c = 0; c < CE::V; ++c) dz[n * CE::V + size_t(c)] *= t[n] == -100 ? 0 : scale;
      }
      const double norm = red == Reduction::Mean ? kept : 1;
      EXPECT_NEAR(got[0].item(), want / norm, 1e-5 * std::max(1.0, std::fabs(want / norm))) << what;
      const std::vector<Tensor> gd = d.run();
      EXPECT_NEAR(gd[0].item(), want / norm, 1e-12 * std::max(1.0, std::fabs(want / norm))) << what;
      // dL/dW = h^T dz / norm
      const std::vector<double> hv = d.h.reshape({-1, CE::H}).to_vector<double>(), gw = gd[1].to_vector<double>();
      for (int64_t i : {int64_t(0), int64_t(5), int64_t(100), 16 * CE::V - 1}) {
        const int64_t k = i / CE::V, c = i % CE::V;
        double g = 0;
        for (size_t n = 0; n < t.size(); ++n) g += hv[n * CE::H + size_t(k)] * dz[n * CE::V + size_t(c)];
        EXPECT_NEAR(gw[size_t(i)], g / norm, 1e-12) << what << " element " << i;
        const double step = 1e-5, fd = (loss_moved(d, d.W, i, step) - loss_moved(d, d.W, i, -step)) / (2 * step);
        EXPECT_NEAR(gw[size_t(i)], fd, 1e-7 * std::max(1.0, std::fabs(fd))) << what << " element " << i;
      }
    }
  expect_same_bits_on_1_2_3_threads<CE>();
}

// A per-row value (a sum over [N, C] without keepdim, which the Row Step stores as [N, 1]) read by
// an elementwise Step over [N] beside the sum itself: merge_rows joins that Step into the row
// pass, reading each row's values along the row. Values by hand.
TEST_F(PassesOn, ARowValueWithoutItsRowAxisReadElementwiseJoinsTheRowPass) {
  const int64_t N = 6, C = 9;
  Tensor x = random_tensor({N, C}, DType::Float32, 61, -2, 2), w = random_tensor({N}, DType::Float32, 62);
  Tensor s = exp(x).sum({1});
  Tensor y = log(s) * w;
  const compiler::Plan p = plan_of({s, y});
  int rows = 0, elementwise = 0;
  for (const kir::Step& st : p.steps) {
    rows += st.kind == kir::StepKind::Row && st.row == C;
    elementwise += st.kind == kir::StepKind::Elementwise;
  }
  EXPECT_EQ(rows, 1) << p.str();
  EXPECT_EQ(elementwise, 0) << p.str();
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>(), sv = s.to_vector<double>(), yv = y.to_vector<double>();
  for (int64_t n = 0; n < N; ++n) {
    double want = 0;
    for (int64_t c = 0; c < C; ++c) want += std::exp(xv[size_t(n * C + c)]);
    EXPECT_NEAR(sv[size_t(n)], want, 1e-5 * want) << n;
    EXPECT_NEAR(yv[size_t(n)], std::log(want) * wv[size_t(n)], 1e-5) << n;
  }
}

// The GPT's own loss path (nn::GPT::loss, scope "loss": cross entropy over [B*T, V] from the
// head): in the training graph 5 Steps carry the loss's nodes, one of them a Row Step over the
// logits (the only loss Step over them), and no Gather, ScatterAdd or Copy; main had 9 (two Row
// passes over the logits, a gather, a copy of zeros and a scatter_add).
TEST_F(PassesOn, TheGptLossAndItsGradientReadTheLogitsOnce) {
  const int64_t Bn = 4, T = 16, V = 37;
  nn::GPTConfig c;
  c.vocab = V, c.block = T, c.embd = 32, c.heads = 4, c.layers = 1;
  nn::GPT gpt(c);
  std::vector<int64_t> iv, tv;
  for (int64_t i = 0; i < Bn * T; ++i) iv.push_back((i * 7) % V), tv.push_back((i * 5 + 3) % V);
  Tensor idx = from_vector<int64_t>(iv, {Bn, T}, {DType::Int64, Device("cpu")});
  Tensor tgt = from_vector<int64_t>(tv, {Bn, T}, {DType::Int64, Device("cpu")});
  Tensor loss = gpt.loss(idx, tgt);
  loss.backward();
  std::vector<Tensor> outs{loss};
  for (Tensor& p : gpt.parameters()) outs.push_back(p.grad());
  const compiler::Plan p = plan_of(outs);
  int loss_steps = 0, over_logits = 0;
  for (const kir::Step& st : p.steps) {
    bool in_loss = false;
    for (const kir::Source& s : st.sources) in_loss |= s.scope.rfind("loss", 0) == 0;
    if (!in_loss) continue;
    ++loss_steps;
    EXPECT_TRUE(st.kind != kir::StepKind::Gather && st.kind != kir::StepKind::ScatterAdd && st.kind != kir::StepKind::Copy)
        << p.str();
    const bool logits = numel(st.kind == kir::StepKind::Row ? st.domain : st.shape) == Bn * T * V;
    over_logits += logits;
    if (logits) {
      EXPECT_TRUE(st.kind == kir::StepKind::Row && st.row == V) << p.str();
    }
  }
  EXPECT_EQ(over_logits, 1) << p.str();
  EXPECT_EQ(loss_steps, 5) << p.str();
  EXPECT_TRUE(matches_reference(outs));
}

// clip_grad_norm sums the squares of all gradients of one shape in one reduction: with the
// shapes of the test above, 7 Steps (2 reductions, the norm, per shape the clip coefficient and
// the scaled gradients); one reduction per parameter would be 9 reductions.
TEST_F(PassesOn, ClipGradNormReducesOncePerShape) {
  const std::vector<Shape> shapes{{64}, {64}, {16, 8}, {64}, {16, 8}, {64}, {64}, {16, 8}, {64}};
  std::vector<Tensor> ps;
  double want = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ps.push_back(random_tensor(shapes[i], DType::Float32, 20 + uint32_t(i)).requires_grad_());
    ps.back().set_grad(random_tensor(shapes[i], DType::Float32, 40 + uint32_t(i)));
    for (double g : random_values(numel(shapes[i]), DType::Float32, 40 + uint32_t(i))) want += g * g;
  }
  int64_t before = metrics().steps_launched;
  Tensor norm = optim::clip_grad_norm(ps, 0.5);
  double got = norm.item();
  int64_t steps = metrics().steps_launched - before;
  EXPECT_NEAR(got, std::sqrt(want), 1e-6 * std::sqrt(want));
  EXPECT_EQ(steps, 7) << "one reduction per shape";
  // The clipped gradients: g * 0.5 / (norm + 1e-6).
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::vector<double> g = random_values(numel(shapes[i]), DType::Float32, 40 + uint32_t(i));
    for (double& x : g) x *= 0.5 / (std::sqrt(want) + 1e-6);
    EXPECT_TRUE(all_close(ps[i].grad().to_vector<double>(), g, 1e-6)) << "parameter " << i;
  }
}

// GELU's derivative is computed in the forward beside its value (one Step, sharing erf) and saved
// (autodiff::record_custom, ir/saved.h); the backward's product dY W2 multiplies by it in its
// epilogue: erf is evaluated once in the whole step, and the epilogue reads the saved slot. With
// the "saved" switch off the derivative fuses into the epilogue (erf a second time). x is
// [4, 6, 16] as in a GPT block: GELU's value Step runs over the [24, 40] the next product reads,
// its derivative over [4, 6, 40], and the two merge into one Step (one erf) only where the merge
// pass joins siblings of different shapes reading the same elements. Both give the gradients of
// the float64 reference: GELU'(h) = Phi(h) + h phi(h), by hand below.
TEST_F(PassesOn, GeluSavesItsDerivativeForTheBackwardEpilogue) {
  const int64_t n = 24, k = 16, m = 40, o = 8;
  std::vector<double> xv = random_values(n * k, DType::Float32, 61, -2, 2), w1v = random_values(m * k, DType::Float32, 62),
                      b1v = random_values(m, DType::Float32, 63), w2v = random_values(o * m, DType::Float32, 64),
                      rv = random_values(n * o, DType::Float32, 65);
  // The reference: dW1 = (r W2 * GELU'(x W1^T + b1))^T x, in float64.
  std::vector<double> want(size_t(m * k), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double h = b1v[size_t(j)], dy = 0;
      for (int64_t c = 0; c < k; ++c) h += xv[size_t(i * k + c)] * w1v[size_t(j * k + c)];
      for (int64_t c = 0; c < o; ++c) dy += rv[size_t(i * o + c)] * w2v[size_t(c * m + j)];
      const double d = 0.5 * (1 + std::erf(h / std::sqrt(2.0))) + h * std::exp(-h * h / 2) / std::sqrt(2 * M_PI);
      for (int64_t c = 0; c < k; ++c) want[size_t(j * k + c)] += dy * d * xv[size_t(i * k + c)];
    }
  auto erfs = [](const kir::Step& st) {
    return std::count_if(st.program.begin(), st.program.end(), [](const kir::Instr& in) { return in.code == kir::Code::Erf; });
  };
  for (const char* off : {"", "saved"}) {
    runtime::set_disabled_passes(off);
    Tensor x = from_vector(std::vector<float>(xv.begin(), xv.end()), {4, n / 4, k});  // as a GPT block's
    Tensor w1 = from_vector(std::vector<float>(w1v.begin(), w1v.end()), {m, k}).requires_grad_();
    Tensor b1 = from_vector(std::vector<float>(b1v.begin(), b1v.end()), {m}).requires_grad_();
    Tensor w2 = from_vector(std::vector<float>(w2v.begin(), w2v.end()), {o, m}).requires_grad_();
    Tensor r = from_vector(std::vector<float>(rv.begin(), rv.end()), {4, n / 4, o});
    Tensor loss = (matmul(gelu(matmul(x, w1.transpose(0, 1)) + b1), w2.transpose(0, 1)) * r).sum();
    loss.backward();
    EXPECT_TRUE(all_close(w1.grad().to_vector<double>(), want, 1e-5)) << "disabled: " << off;
    const compiler::Plan& plan = *runtime::last_executed_plan();
    // The backward's product dY W2 with GELU's derivative in its epilogue: the last Gemm Step
    // of n * m elements with a program (the forward's, x W1^T + b1, comes first).
    int bwd = -1;
    for (size_t s = 0; s < plan.steps.size(); ++s)
      if (plan.steps[s].kind == kir::StepKind::Gemm && !plan.steps[s].program.empty() && numel(plan.steps[s].shape) == n * m) bwd = int(s);
    ASSERT_GE(bwd, 0) << plan.str();
    int64_t total = 0;
    std::vector<int> computed_with_erf;  // the slots written by the other Steps evaluating erf
    for (size_t s = 0; s < plan.steps.size(); ++s) {
      total += erfs(plan.steps[s]);
      if (int(s) != bwd && erfs(plan.steps[s]))
        for (int out : plan.steps[s].outputs()) computed_with_erf.push_back(out);
    }
    const kir::Step& epilogue = plan.steps[size_t(bwd)];
    const int64_t epilogue_erfs = erfs(epilogue);
    bool reads_saved = false;
    for (int in : epilogue.inputs) reads_saved |= std::count(computed_with_erf.begin(), computed_with_erf.end(), in) > 0;
    if (std::string(off).empty()) {
      EXPECT_EQ(total, 1) << plan.str();
      EXPECT_EQ(epilogue_erfs, 0) << plan.str();
      EXPECT_TRUE(reads_saved) << plan.str();
    } else {
      EXPECT_EQ(total, 2) << plan.str();
      EXPECT_EQ(epilogue_erfs, 1) << plan.str();
    }
  }
}

// The benchmark GPT (bench/gpt_step.cpp): a whole training step — forward, cross entropy,
// backward and the AdamW update — as one graph of at most 300 Steps.
TEST_F(PassesOn, GptTrainingStepLaunchesAtMost300Steps) {
  runtime::set_disabled_passes("");
  manual_seed(0);
  nn::GPTConfig cfg{.vocab = 114, .block = 64, .embd = 128, .heads = 4, .layers = 4, .dropout = 0.0, .bias = true,
                    .tied_head = false};
  nn::GPT model(cfg);
  model.train();
  optim::AdamW opt(model.parameters(), {.lr = 3e-3, .weight_decay = 0.1});
  Tensor x = random_int({16, 64}, 0, 113, DType::Int64, 1), y = random_int({16, 64}, 0, 113, DType::Int64, 2);
  int64_t steps = 0;
  for (int i = 0; i < 3; ++i) {
    int64_t before = metrics().steps_launched;
    Tensor loss = model.loss(x, y);
    loss.backward();
    opt.step();
    opt.zero_grad();
    loss.item();
    steps = metrics().steps_launched - before;
  }
  std::printf("GPT training step: %lld Steps\n", (long long)steps);
  EXPECT_LE(steps, 300);
}

}  // namespace

namespace {

// The compile cache on a real training loop: warmup + cosine changes the learning rate every
// step (a runtime scalar, not a constant in the graph), so 20 steps compile at most 2 graphs
// (the first step creates AdamW's moments); a new batch size compiles exactly one more, and
// the metrics say which input changed.
TEST_F(PassesOn, GptLoopCompilesTwiceThenOnceMorePerBatchSize) {
  runtime::set_disabled_passes("");
  manual_seed(3);
  nn::GPTConfig cfg{.vocab = 37, .block = 16, .embd = 32, .heads = 2, .layers = 2, .dropout = 0.1, .bias = true,
                    .tied_head = false};
  nn::GPT model(cfg);
  model.train();
  optim::AdamW opt(model.parameters(), {.lr = 1e-3, .weight_decay = 0.1});
  optim::WarmupCosine sched{.lr = 1e-3, .min_lr = 1e-4, .warmup = 5, .total = 20};
  auto step = [&](int64_t i, int64_t batch) {
    Tensor x = random_int({batch, 16}, 0, 36, DType::Int64, uint32_t(100 + i));
    Tensor y = random_int({batch, 16}, 0, 36, DType::Int64, uint32_t(200 + i));
    opt.set_lr(sched(i));
    Tensor loss = model.loss(x, y);
    loss.backward();
    optim::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    return loss.item();
  };
  int64_t before = metrics().graphs_compiled;
  std::vector<double> lrs;
  for (int64_t i = 0; i < 20; ++i) {
    EXPECT_TRUE(std::isfinite(step(i, 8)));
    lrs.push_back(opt.lr());
  }
  int64_t compiled = metrics().graphs_compiled - before;
  std::printf("GPT loop, 20 steps with warmup+cosine: %lld graphs compiled\n", (long long)compiled);
  EXPECT_LE(compiled, 2);
  EXPECT_NE(lrs[2], lrs[12]);  // the schedule really moved

  before = metrics().graphs_compiled;
  step(20, 4);
  EXPECT_EQ(metrics().graphs_compiled - before, 1);
  std::string why = metrics().compile_reasons.back();
  EXPECT_NE(why.find("int64[8, 16] to int64[4, 16]"), std::string::npos) << why;
  before = metrics().graphs_compiled;
  step(21, 4);
  EXPECT_EQ(metrics().graphs_compiled - before, 0);
}

}  // namespace
