// The fused attention Step (StepKind::Attention; compiler/passes/attention.cpp finds the pattern,
// backends/cpu/attention.cpp runs it): the traced pattern softmax(where(causal, -inf, Q K^T *
// scale)) V becomes one Step on the cpu, whose values match the unfused Steps
// (TESSERA_DISABLE_PASSES=attention) and a float64 reference computed here, bit-identically for
// 1, 2 and 3 threads, with no T x T buffer in the plan; a target that does not declare the Step,
// and a graph that reads the probabilities, get the decomposition.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <set>

#include "backends/backend.h"
#include "compiler/passes/fuse.h"
#include "compiler/pipeline.h"
#include "core/half.h"
#include "ir/graph.h"
#include "runtime/compile_options.h"
#include "tensor/tensor_impl.h"
#include "test_util.h"
#include "tessera/profiler.h"
#include "tessera/tessera.h"

namespace tessera {
namespace {

using testing::normalized_error;
using testing::random_tensor;

struct Shape4 {
  int64_t b, h, tq, tk, d, dv;
  bool causal;
  int64_t offset = 0;  // causal: key j masked for query i where j - i > offset
};

// The pattern as nn::CausalSelfAttention traces it.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Shape4& s) {
  Tensor att = matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(s.d)));
  if (s.causal) {
    TensorOptions i64{DType::Int64, q.device()};
    Tensor qpos = arange(0, double(s.tq), 1, i64).reshape({s.tq, 1}) + double(s.offset);
    Tensor kpos = arange(0, double(s.tk), 1, i64).reshape({1, s.tk});
    att = masked_fill(att, kpos > qpos, -INFINITY);
  }
  return matmul(softmax(att, -1), v);
}

// The float64 reference, by the definition.
std::vector<double> reference(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v, const Shape4& s) {
  const int64_t B = s.b * s.h;
  std::vector<double> out(size_t(B * s.tq * s.dv)), p(size_t(s.tk));
  const double scale = 1.0 / std::sqrt(double(s.d));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < s.tq; ++i) {
      double m = -INFINITY;
      for (int64_t j = 0; j < s.tk; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < s.d; ++c) dot += q[size_t((b * s.tq + i) * s.d + c)] * k[size_t((b * s.tk + j) * s.d + c)];
        p[size_t(j)] = s.causal && j - i > s.offset ? -INFINITY : dot * scale;
        m = std::max(m, p[size_t(j)]);
      }
      double sum = 0;
      for (int64_t j = 0; j < s.tk; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - m));
      for (int64_t c = 0; c < s.dv; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < s.tk; ++j) acc += p[size_t(j)] * v[size_t((b * s.tk + j) * s.dv + c)];
        out[size_t((b * s.tq + i) * s.dv + c)] = acc / sum;
      }
    }
  return out;
}

// The Steps of y's compiled plan for the cpu's target (or another).
compiler::Plan plan_of(const std::vector<Tensor>& ys, kir::Target target, const std::string& disabled = "") {
  std::vector<ir::NodePtr> nodes;
  for (const Tensor& y : ys) nodes.push_back(detail::node_of(y));
  ir::Graph g = ir::build_graph(nodes);
  compiler::Options o;
  o.target = target;
  if (!disabled.empty()) o.disabled.insert(disabled);
  return compiler::compile_graph(g, {}, o);
}
compiler::Plan plan_of(const Tensor& y, kir::Target target, const std::string& disabled = "") {
  return plan_of(std::vector<Tensor>{y}, target, disabled);
}
kir::Target cpu_target() { return backends::backend_for(Device("cpu")).properties(0); }
int attention_steps(const compiler::Plan& p) {
  int n = 0;
  for (const kir::Step& st : p.steps) n += st.kind == kir::StepKind::Attention;
  return n;
}
// Temporaries holding a [.., Tq, Tk] value (the scores or probabilities).
int square_slots(const compiler::Plan& p, int64_t tq, int64_t tk) {
  int n = 0;
  for (const kir::Slot& sl : p.slots)
    n += sl.kind == kir::SlotKind::Temp && sl.shape.size() >= 2 && sl.shape[sl.shape.size() - 2] == tq && sl.shape.back() == tk && sl.dtype != DType::Bool;
  return n;
}

// One GPT step's loss and every parameter's gradient (pending), with the passes `off` disabled.
std::vector<Tensor> gpt_loss_and_grads(nn::GPT& gpt, const Tensor& ids, const Tensor& targets, optim::SGD& opt, const std::string& off) {
  runtime::set_disabled_passes(off);
  opt.zero_grad();
  Tensor loss = gpt.loss(ids, targets);
  loss.backward();
  std::vector<Tensor> outs{loss};
  for (Tensor& p : gpt.parameters()) outs.push_back(p.grad());
  return outs;
}
std::vector<double> all_values(const std::vector<Tensor>& outs) {
  std::vector<double> all;
  for (const Tensor& t : outs) {
    auto v = t.to_vector<double>();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

struct Attention : ::testing::Test {
  int threads = omp_get_max_threads();
  void TearDown() override {
    runtime::set_disabled_passes("");
    omp_set_num_threads(threads);
  }
};

TEST_F(Attention, FusedForwardMatchesTheUnfusedStepsAndTheFloat64Reference) {
  const std::vector<Shape4> shapes = {
      {2, 3, 67, 67, 32, 32, true},      // T not a multiple of the 64-row task or 4-row group
      {1, 2, 64, 64, 64, 64, true},      // head dim 64
      {2, 2, 70, 70, 32, 32, false},     // no mask
      {3, 5, 65, 65, 64, 64, true},      // batch x heads (15) > threads
      {1, 2, 150, 150, 32, 40, true},    // several 64-key tiles, the last partial; dv 40 (a 16-column tail)
      {2, 1, 20, 90, 32, 16, false},     // Tq != Tk, Dv != D
      {1, 2, 20, 90, 32, 32, true, 70},  // a cache-style offset: query i at position i + 70
  };
  uint32_t seed = 1;
  for (const Shape4& s : shapes) {
    SCOPED_TRACE(::testing::Message() << "[" << s.b << "," << s.h << "] Tq " << s.tq << " Tk " << s.tk << " d " << s.d << "/" << s.dv
                                      << (s.causal ? " causal" : ""));
    Tensor q = random_tensor({s.b, s.h, s.tq, s.d}, DType::Float32, seed++, -2, 2);
    Tensor k = random_tensor({s.b, s.h, s.tk, s.d}, DType::Float32, seed++, -2, 2);
    Tensor v = random_tensor({s.b, s.h, s.tk, s.dv}, DType::Float32, seed++, -2, 2);
    const compiler::Plan fused = plan_of(attention(q, k, v, s), cpu_target());
    EXPECT_EQ(attention_steps(fused), 1);
    EXPECT_EQ(square_slots(fused, s.tq, s.tk), 0) << fused.str();
    EXPECT_EQ(fused.steps.size(), 1u) << fused.str();  // the mask's positions are absorbed too
    runtime::set_disabled_passes("");
    auto got = attention(q, k, v, s).to_vector<double>();
    runtime::set_disabled_passes("attention");
    auto unfused = attention(q, k, v, s).to_vector<double>();
    runtime::set_disabled_passes("");
    auto want = reference(q.to_vector<double>(), k.to_vector<double>(), v.to_vector<double>(), s);
    EXPECT_LE(normalized_error(got, want), 2e-6);
    EXPECT_LE(normalized_error(unfused, want), 2e-6);
    EXPECT_LE(normalized_error(got, unfused), 2e-6);
    EXPECT_NE(got, unfused);  // really another computation (the unfused path is the decomposition)
  }
}

TEST_F(Attention, Float64IsFusedToo) {
  Shape4 s{2, 2, 70, 70, 32, 32, true};
  Tensor q = random_tensor({2, 2, 70, 32}, DType::Float64, 11, -2, 2), k = random_tensor({2, 2, 70, 32}, DType::Float64, 12, -2, 2);
  Tensor v = random_tensor({2, 2, 70, 32}, DType::Float64, 13, -2, 2);
  EXPECT_EQ(attention_steps(plan_of(attention(q, k, v, s), cpu_target())), 1);
  auto want = reference(q.to_vector<double>(), k.to_vector<double>(), v.to_vector<double>(), s);
  EXPECT_LE(normalized_error(attention(q, k, v, s).to_vector<double>(), want), 1e-13);
}

TEST_F(Attention, BitIdenticalFor1To3Threads) {
  Shape4 s{3, 4, 70, 70, 32, 32, true};
  Tensor q = random_tensor({3, 4, 70, 32}, DType::Float32, 21, -2, 2), k = random_tensor({3, 4, 70, 32}, DType::Float32, 22, -2, 2);
  Tensor v = random_tensor({3, 4, 70, 32}, DType::Float32, 23, -2, 2);
  std::vector<std::vector<float>> r;
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    r.push_back(attention(q, k, v, s).to_vector<float>());
  }
  EXPECT_EQ(r[0], r[1]);
  EXPECT_EQ(r[0], r[2]);
}

TEST_F(Attention, TheGptsAttentionIsOneStepInEvaluation) {
  nn::GPTConfig c;
  c.vocab = 50, c.block = 72, c.embd = 64, c.heads = 2, c.layers = 2, c.dropout = 0.1;
  auto gpt = std::make_shared<nn::GPT>(c);
  gpt->eval();  // dropout is the identity: the probabilities only feed the product with V
  Tensor ids = testing::random_int({3, 72}, 0, 49);
  EXPECT_EQ(c.heads, 2);
  Tensor logits;
  {
    NoGradGuard ng;
    logits = gpt->forward(ids);
  }
  const compiler::Plan p = plan_of(logits, cpu_target());
  EXPECT_EQ(attention_steps(p), 2);  // one per layer
  EXPECT_EQ(square_slots(p, 72, 72), 0) << p.str();
  for (const kir::Step& st : p.steps)
    if (st.kind == kir::StepKind::Attention) {
      EXPECT_TRUE(st.attention->causal);
      EXPECT_EQ(st.attention->causal_offset, 0);
      EXPECT_EQ(st.attention->batch, 6);
      EXPECT_EQ(st.sources.front().op, "attention");
      EXPECT_NE(st.sources.front().scope.find("attn"), std::string::npos);
    }
  std::vector<double> got;
  {
    Profiler prof;  // the Step kind and its op name show in the profile
    got = logits.to_vector<double>();
    prof.stop();
    EXPECT_NE(prof.table_text().find("attention"), std::string::npos) << prof.table_text();
  }
  EXPECT_STREQ(kir::step_kind_name(kir::StepKind::Attention), "attention");
  runtime::set_disabled_passes("attention");
  Tensor again;
  {
    NoGradGuard ng;
    again = gpt->forward(ids);
  }
  EXPECT_LE(normalized_error(got, again.to_vector<double>()), 2e-6);
}

TEST_F(Attention, NotFusedWhereTheProbabilitiesAreReadOrTheTargetLacksTheStep) {
  Shape4 s{1, 2, 64, 64, 32, 32, true};
  Tensor q = random_tensor({1, 2, 64, 32}, DType::Float32, 31), k = random_tensor({1, 2, 64, 32}, DType::Float32, 32);
  Tensor v = random_tensor({1, 2, 64, 32}, DType::Float32, 33);
  Tensor y = attention(q, k, v, s);
  EXPECT_EQ(attention_steps(plan_of(y, cpu_target())), 1);  // the pattern itself is fused
  kir::Target plain = cpu_target();
  plain.attention = false;  // another backend's target: the decomposition
  EXPECT_EQ(attention_steps(plan_of(y, plain)), 0);
  EXPECT_EQ(attention_steps(plan_of(y, cpu_target(), "attention")), 0);  // switched off by name
  // Fewer keys than the measured rule's 64: decomposed.
  Tensor q48 = random_tensor({1, 2, 48, 32}, DType::Float32, 35);
  EXPECT_EQ(attention_steps(plan_of(attention(q48, q48, q48, {1, 2, 48, 48, 32, 32, true}), cpu_target())), 0);
  // A user reading the probabilities: nothing is fused.
  Tensor p = softmax(matmul(q, k.transpose(-2, -1)), -1);
  EXPECT_EQ(attention_steps(plan_of(matmul(p, v), cpu_target())), 1);
  Tensor both = matmul(p, v) + p.sum({3}, true);
  EXPECT_EQ(attention_steps(plan_of(both, cpu_target())), 0);
  // Training under the measured rule's keys (kAttentionMinKeysWithBackward, 64: the backward
  // reads the probabilities, and the backward Step is not fused under it): nothing fused.
  const int64_t tg = compiler::kAttentionMinKeysWithBackward - 16;
  Tensor qg = random_tensor({1, 2, tg, 32}, DType::Float32, 34), kg = random_tensor({1, 2, tg, 32}, DType::Float32, 36),
         vg = random_tensor({1, 2, tg, 32}, DType::Float32, 37);
  for (Tensor* x : {&qg, &kg, &vg}) x->requires_grad_(true);
  Tensor loss = attention(qg, kg, vg, {1, 2, tg, tg, 32, 32, true}).sum();
  loss.backward();
  EXPECT_EQ(attention_steps(plan_of({loss, qg.grad(), kg.grad(), vg.grad()}, cpu_target())), 0);
  // An anti-causal mask (queries see later keys) is not the causal pattern: decomposed.
  Tensor att = matmul(q, k.transpose(-2, -1));
  TensorOptions i64{DType::Int64, q.device()};
  Tensor pos = arange(0, 64, 1, i64);
  att = masked_fill(att, pos.reshape({1, 64}) < pos.reshape({64, 1}), -INFINITY);
  EXPECT_EQ(attention_steps(plan_of(matmul(softmax(att, -1), v), cpu_target())), 0);
}

// Training: the backward of the same attention fuses too (one backward Step writing dQ, dK, dV
// from the forward's log-sum-exp); gradients against the decomposition's and float64's.
TEST_F(Attention, TheBackwardIsOneStepWithTheDecompositionsGradients) {
  const std::vector<Shape4> shapes = {{2, 3, 130, 130, 32, 32, true}, {1, 1, 128, 128, 64, 64, false},
                                      {1, 2, 20, 150, 32, 16, true, 130},
                                      // odd query counts and a last key tile of 3 or 32 keys; the
                                      // 8-row blocks' remainders; head dims past the 32-column
                                      // blocks (48 = 32 + 16, 40 = 32 + 8 columns done plainly)
                                      {1, 2, 37, 160, 32, 32, true, 123}, {1, 2, 131, 131, 64, 64, true},
                                      {1, 3, 129, 129, 48, 40, false}, {1, 1, 133, 133, 32, 32, true, 5}};
  uint32_t seed = 51;
  for (const Shape4& s : shapes) {
    SCOPED_TRACE(::testing::Message() << "Tq " << s.tq << " Tk " << s.tk << " d " << s.d << "/" << s.dv);
    auto grads = [&](DType t, const std::string& off, bool check_plan) {
      runtime::set_disabled_passes(off);
      Tensor q = random_tensor({s.b, s.h, s.tq, s.d}, t, seed, -2, 2), k = random_tensor({s.b, s.h, s.tk, s.d}, t, seed + 1, -2, 2);
      Tensor v = random_tensor({s.b, s.h, s.tk, s.dv}, t, seed + 2, -2, 2), w = random_tensor({s.b, s.h, s.tq, s.dv}, t, seed + 3, -2, 2);
      for (Tensor* x : {&q, &k, &v}) x->requires_grad_(true);
      Tensor loss = (attention(q, k, v, s) * w).sum();
      loss.backward();
      if (check_plan) {
        const compiler::Plan p = plan_of({loss, q.grad(), k.grad(), v.grad()}, cpu_target());
        int backward = 0;
        for (const kir::Step& st : p.steps) backward += st.kind == kir::StepKind::Attention && st.attention->backward;
        EXPECT_EQ(attention_steps(p), 2) << p.str();
        EXPECT_EQ(backward, 1);
        EXPECT_EQ(square_slots(p, s.tq, s.tk), 0) << p.str();
      }
      std::vector<std::vector<double>> r;
      for (Tensor* x : {&q, &k, &v}) r.push_back(x->grad().to_vector<double>());
      return r;
    };
    auto fused = grads(DType::Float32, "", true), decomposed = grads(DType::Float32, "attention", false),
         want = grads(DType::Float64, "attention", false);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_LE(normalized_error(fused[i], want[i]), 1e-5) << "gradient " << i;
      EXPECT_LE(normalized_error(decomposed[i], want[i]), 1e-5) << "gradient " << i;
    }
    seed += 4;
  }
}

// A GPT training step over 128 positions: forward and backward fused in every layer, the
// parameters' gradients those of the decomposition.
TEST_F(Attention, AGptTrainingStepOver128PositionsFusesBothWays) {
  nn::GPTConfig c;
  c.vocab = 40, c.block = 128, c.embd = 64, c.heads = 2, c.layers = 2;
  manual_seed(3);
  auto gpt = std::make_shared<nn::GPT>(c);
  Tensor ids = testing::random_int({2, 128}, 0, 39), targets = testing::random_int({2, 128}, 0, 39, DType::Int64, 2);
  optim::SGD opt(gpt->parameters(), {.lr = 0.0});  // only to clear the gradients
  auto step = [&](const std::string& off, bool check_plan) {
    std::vector<Tensor> outs = gpt_loss_and_grads(*gpt, ids, targets, opt, off);
    if (check_plan) {
      const compiler::Plan p = plan_of(outs, cpu_target());
      int backward = 0;
      for (const kir::Step& st : p.steps) {
        backward += st.kind == kir::StepKind::Attention && st.attention->backward;
        // each layer's qkv gradient written by its backward Step (Step::out_maps), not assembled
        if (st.kind == kir::StepKind::Attention && st.attention->backward) {
          EXPECT_EQ(st.out_maps.size(), 3u) << st.str();
        }
        EXPECT_FALSE(st.kind == kir::StepKind::Elementwise && st.shape == (Shape{2, 128, 192})) << st.str();
      }
      EXPECT_EQ(attention_steps(p), 4);
      EXPECT_EQ(backward, 2);
      EXPECT_EQ(square_slots(p, 128, 128), 0);
    }
    return all_values(outs);
  };
  auto fused = step("", true), decomposed = step("attention", false);
  EXPECT_LE(normalized_error(fused, decomposed), 1e-5);
}

// The decomposition of a training step (the cpu fuses from 64 keys, so the plan is checked with
// the attention pass off; fused, no part is copied either); its batched products read Q, K^T and
// V as strided views of the qkv product, whose bias add is that product's epilogue: no Step
// copies a head-split Q, K^T or V (before, three elementwise Steps per layer added the bias into
// a [B, H, T, D] or transposed [B, H, D, T] copy). In the backward, dQ and dV are written in the
// [B, T, H, D] layout their permute reads (Step::out_strides), and so is the forward's P V, so
// no Copy Step moves them there (before, three per layer); a target without Target::gemm_out_strides keeps those copies. Values
// against the unfused Steps.
TEST_F(Attention, AGptTrainingStepAt64PositionsReadsQkvAsViewsOfTheBiasedProduct) {
  nn::GPTConfig c;
  c.vocab = 40, c.block = 64, c.embd = 64, c.heads = 2, c.layers = 2;
  manual_seed(5);
  auto gpt = std::make_shared<nn::GPT>(c);
  Tensor ids = testing::random_int({3, 64}, 0, 39), targets = testing::random_int({3, 64}, 0, 39, DType::Int64, 2);
  optim::SGD opt(gpt->parameters(), {.lr = 0.0});  // only to clear the gradients
  auto step = [&](const std::string& off, bool check_plan) {
    std::vector<Tensor> outs = gpt_loss_and_grads(*gpt, ids, targets, opt, off);
    if (check_plan) {
      // Fused (from 64 keys with the backward): no copy of a part and no assembled qkv gradient
      // either (TheFusedBackwardWritesTheQkvGradientInPlace); the rest is the decomposition's plan.
      const compiler::Plan f = plan_of(outs, cpu_target());
      EXPECT_EQ(attention_steps(f), compiler::kAttentionMinKeysWithBackward <= 64 ? 4 : 0);
      for (const kir::Step& st : f.steps) {
        EXPECT_FALSE(st.kind == kir::StepKind::Copy && st.shape == (Shape{3, 64, 2, 32})) << st.str();
        EXPECT_FALSE(st.shape == (Shape{3, 64, 192}) && st.kind != kir::StepKind::Gemm) << st.str();
      }
      const compiler::Plan p = plan_of(outs, cpu_target(), "attention");
      EXPECT_EQ(attention_steps(p), 0);
      int biased_qkv = 0;
      for (const kir::Step& st : p.steps) {
        const bool heads = st.shape == Shape{3, 2, 64, 32} || st.shape == Shape{3, 2, 32, 64};
        EXPECT_FALSE(heads && st.kind != kir::StepKind::Gemm) << "a head-split copy: " << st.str();
        bool qkv_add = false, qkv_product = false;
        for (const kir::Source& src : st.sources) {
          const bool qkv = src.scope.size() > 9 && src.scope.substr(src.scope.size() - 9) == ".attn.qkv";
          qkv_add |= qkv && src.op == "add";
          qkv_product |= qkv && src.op == "matmul";
        }
        EXPECT_FALSE(qkv_add && st.kind != kir::StepKind::Gemm) << "the qkv bias outside its product: " << st.str();
        biased_qkv += qkv_add && qkv_product && st.kind == kir::StepKind::Gemm && !st.program.empty();
      }
      EXPECT_EQ(biased_qkv, 2);  // one per layer: the product with its bias as the epilogue
      int strided = 0, moved = 0;
      for (const kir::Step& st : p.steps) {
        strided += st.kind == kir::StepKind::Gemm && !st.out_strides.empty();
        moved += st.kind == kir::StepKind::Copy && st.shape == Shape{3, 64, 2, 32};
      }
      // Per layer: dQ, dK and dV (written into the qkv gradient, TheQkvGradientIsWrittenInPlace...)
      // and the forward's P V (read as [B, T, H, D] too).
      EXPECT_EQ(strided, 8);
      EXPECT_EQ(moved, 0) << p.str();
      for (const kir::Step& st : p.steps)  // the qkv gradient is not assembled by a Step
        EXPECT_FALSE(st.shape == (Shape{3, 64, 192}) && st.kind != kir::StepKind::Gemm) << st.str();
      kir::Target plain = cpu_target();
      plain.gemm_out_strides = false;  // another backend's target: dense products, the copies back
      int copies = 0;
      for (const kir::Step& st : plan_of(outs, plain, "attention").steps) {
        EXPECT_TRUE(st.out_strides.empty());
        copies += st.kind == kir::StepKind::Copy && st.shape == Shape{3, 64, 2, 32};
      }
      EXPECT_EQ(copies, 6);
    }
    return all_values(outs);
  };
  auto fused = step("", true), unfused = step("fuse", false);
  EXPECT_LE(normalized_error(fused, unfused), 1e-5);
}

// The same pattern written out (a qkv product plus bias, split into heads), in float32 with the
// views against float64 unfused: the output and the gradients of x, the weight and the bias.
TEST_F(Attention, TheHeadSplitQkvAsViewsMatchesFloat64) {
  const int64_t B = 2, T = 64, C = 64, H = 2, D = C / H;
  auto run = [&](DType t) {
    Tensor x = random_tensor({B, T, C}, t, 61), w = random_tensor({C, 3 * C}, t, 62, -0.3, 0.3);
    Tensor b = random_tensor({3 * C}, t, 63), r = random_tensor({B, T, C}, t, 64);
    for (Tensor* p : {&x, &w, &b}) p->requires_grad_(true);
    Tensor qkv = matmul(x, w) + b;
    auto split = [&](int64_t i) { return narrow(qkv, 2, i * C, C).reshape({B, T, H, D}).transpose(1, 2); };
    Tensor y = attention(split(0), split(1), split(2), {B, H, T, T, D, D, true}).transpose(1, 2).reshape({B, T, C});
    Tensor loss = (y * r).sum();
    loss.backward();
    if (t == DType::Float32) {
      int copies = 0;
      for (const kir::Step& st : plan_of({y, x.grad(), w.grad(), b.grad()}, cpu_target()).steps)
        copies += st.kind != kir::StepKind::Gemm && st.kind != kir::StepKind::Attention &&  // (fused from 64 keys)
                  (st.shape == Shape{B, H, T, D} || st.shape == Shape{B, H, D, T} || st.shape == Shape{B, T, H, D});
      EXPECT_EQ(copies, 0);
    }
    std::vector<double> all = y.to_vector<double>();
    for (Tensor* p : {&x, &w, &b}) {
      auto g = p->grad().to_vector<double>();
      all.insert(all.end(), g.begin(), g.end());
    }
    return all;
  };
  const std::vector<double> got = run(DType::Float32);
  runtime::set_disabled_passes("fuse");  // the reference: float64, unfused (dense products, no views)
  EXPECT_LE(normalized_error(got, run(DType::Float64)), 1e-5);
}

// An attention block's outputs for TheQkvGradient... below: y and the gradients of x, the qkv
// weight and its bias (B 2, T 64, C 64, 2 heads; the plan checks of the products' placement
// turn the attention pass off, as the cpu fuses from 64 keys).
constexpr int64_t kB = 2, kT = 64, kC = 64, kH = 2, kD = kC / kH;
std::vector<Tensor> qkv_block(DType t, int64_t T = kT) {
  Tensor x = random_tensor({kB, T, kC}, t, 71), w = random_tensor({kC, 3 * kC}, t, 72, -0.3, 0.3);
  Tensor b = random_tensor({3 * kC}, t, 73), r = random_tensor({kB, T, kC}, t, 74);
  for (Tensor* p : {&x, &w, &b}) p->requires_grad_(true);
  Tensor qkv = matmul(x, w) + b;
  auto split = [&](int64_t i) { return narrow(qkv, 2, i * kC, kC).reshape({kB, T, kH, kD}).transpose(1, 2); };
  Tensor y = attention(split(0), split(1), split(2), {kB, kH, T, T, kD, kD, true}).transpose(1, 2).reshape({kB, T, kC});
  Tensor loss = (y * r).sum();
  loss.backward();
  return {y, x.grad(), w.grad(), b.grad()};
}

// The plan checks of TheQkvGradient... below. rounded (bfloat16 autocast): the qkv backward's
// products read the assembled buffer rounding it as they pack (the cast Step folded), and the bias
// sum reads it too, rounding it in its program; no Step rounds or adds.
bool has_source(const kir::Step& st, const std::string& op) {
  return std::any_of(st.sources.begin(), st.sources.end(), [&](const kir::Source& s) { return s.op == op; });
}
void expect_qkv_gradient_in_place(const std::vector<Tensor>& outs, bool rounded) {
  const Shape dqkv_shape{kB, kT, 3 * kC};
  // The decomposition's products (at 64 keys the cpu fuses the attention: TheFusedBackward...)
  const compiler::Plan p = plan_of(outs, cpu_target(), "attention");
  std::vector<int64_t> offsets;
  std::set<int> slots;
  for (const kir::Step& st : p.steps)
    if (st.kind == kir::StepKind::Gemm && !st.out_strides.empty() && p.slots[size_t(st.output)].shape == dqkv_shape) {
      offsets.push_back(st.out_offset);
      slots.insert(st.output);
      EXPECT_EQ(st.shape, (Shape{kB, kH, kT, kD})) << st.str();  // dK too, not dK^T [B, H, D, T]
    }
  std::sort(offsets.begin(), offsets.end());
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, kC, 2 * kC})) << p.str();
  EXPECT_EQ(slots.size(), 1u) << p.str();
  const int dqkv = slots.empty() ? -1 : *slots.begin();
  int readers = 0, products = 0, bias_sums = 0;
  for (const kir::Step& st : p.steps) {
    EXPECT_FALSE(st.kind != kir::StepKind::Gemm && numel(st.shape) == numel(dqkv_shape) && has_source(st, "add"))
        << "the qkv gradient assembled: " << st.str();
    if (!std::count(st.inputs.begin(), st.inputs.end(), dqkv)) continue;
    ++readers;
    if (st.kind == kir::StepKind::Gemm) {  // the weight's and the input's gradients
      ++products;
      const int k = int(std::find(st.inputs.begin(), st.inputs.end(), dqkv) - st.inputs.begin());
      EXPECT_EQ((st.rounded >> k) & 1, rounded ? 1 : 0) << st.str();
    }
    // The bias gradient: one reduction over the assembled buffer.
    bias_sums += (st.kind == kir::StepKind::Reduce || st.kind == kir::StepKind::Row) && numel(st.shape) == 3 * kC;
  }
  EXPECT_EQ(products, 2) << p.str();
  EXPECT_EQ(bias_sums, 1) << p.str();
  EXPECT_EQ(readers, 3) << p.str();
  kir::Target plain = cpu_target(), no_offset = cpu_target();
  plain.gemm_out_strides = false;  // another backend's target: the pads added by a Step
  no_offset.gemm_out_offset = false;  // strided outputs without offsets (a plugin before interface 14)
  for (const compiler::Plan& q : {plan_of(outs, plain), plan_of(outs, no_offset), plan_of(outs, cpu_target(), "place")}) {  // and with the pass off
    int adds = 0;
    for (const kir::Step& st : q.steps) {
      EXPECT_EQ(st.out_offset, 0);
      adds += st.kind == kir::StepKind::Elementwise && numel(st.shape) == numel(dqkv_shape) && has_source(st, "add");
    }
    EXPECT_EQ(adds, 1) << q.str();
  }
}

// The qkv product's gradient is the sum of the zero pads that are the gradients of its slices Q,
// K and V; on the cpu it is their concatenation, which the attention backward's products write
// straight into (compiler/passes/place.cpp): dQ, dK and dV each into its columns of one
// [B, T, 3C] buffer (Step::out_offset 0, C, 2C; dK computed as dS^T Q instead of Q^T dS, which
// was read transposed), so no Step adds the pads or copies a part, and the bias gradient is one
// reduction over that buffer. A target without Target::gemm_out_strides keeps the add, and so
// does the cpu with the pass off. Values against float64 and against the plan without the pass.
TEST_F(Attention, TheQkvGradientIsWrittenInPlaceByTheBackwardProducts) {
  std::vector<Tensor> outs = qkv_block(DType::Float32);
  expect_qkv_gradient_in_place(outs, false);
  const std::vector<double> got = all_values(outs);
  runtime::set_disabled_passes("place");
  EXPECT_LE(normalized_error(got, all_values(qkv_block(DType::Float32))), 1e-6);
  runtime::set_disabled_passes("fuse");  // the reference: float64, unfused (dense products, the pads added)
  EXPECT_LE(normalized_error(got, all_values(qkv_block(DType::Float64))), 1e-5);
}

// Under bfloat16 autocast each gradient product is rounded to bfloat16 and back (its VJP), the
// casts between the products and the pads: taken out of the pads, the products write the buffer
// the same way, the rounding is in the bias gradient's reduction's program and the cast to
// bfloat16 the qkv backward's products read is folded into them. Values against the plan without
// the pass (the same bits) and float64.
TEST_F(Attention, TheQkvGradientIsWrittenInPlaceUnderBfloat16Autocast) {
  auto run = [] {
    Autocast ac{DType::BFloat16};
    return qkv_block(DType::Float32);
  };
  std::vector<Tensor> outs = run();
  expect_qkv_gradient_in_place(outs, true);
  const std::vector<double> got = all_values(outs);
  runtime::set_disabled_passes("place");
  const double unplaced = normalized_error(got, all_values(run()));
  runtime::set_disabled_passes("fuse");
  const double f64 = normalized_error(got, all_values(qkv_block(DType::Float64)));
  EXPECT_LE(unplaced, 1e-6);
  EXPECT_LE(f64, 2e-2);
  std::cout << "bfloat16: against the plan without the pass " << unplaced << ", against float64 " << f64 << "\n";
}

// The lowering's half of "place" takes any concatenation of products read whole: two batched
// products concatenated along their columns are written into one slot, no Copy Step; one
// product concatenated with itself is copied (one Step cannot write two places). Values
// against the unfused Steps.
TEST_F(Attention, AConcatenationOfProductsIsWrittenByThem) {
  Tensor a = random_tensor({2, 3, 8, 5}, DType::Float32, 81), b = random_tensor({2, 3, 5, 4}, DType::Float32, 82);
  Tensor c = random_tensor({2, 3, 5, 6}, DType::Float32, 83);
  // (Each doubled: a concatenation that is a graph output is copied into the output's buffer.)
  Tensor two = cat({matmul(a, b), matmul(a, c)}, 3) * 2.0, twice = cat({matmul(a, b), matmul(a, b)}, 2) * 2.0;
  auto plan = [&](const Tensor& y, int* copies) {
    std::vector<int64_t> offsets;
    *copies = 0;
    for (const kir::Step& st : plan_of(y, cpu_target()).steps) {
      *copies += st.kind == kir::StepKind::Copy;
      if (st.kind == kir::StepKind::Gemm && !st.out_strides.empty()) offsets.push_back(st.out_offset);
    }
    std::sort(offsets.begin(), offsets.end());
    return offsets;
  };
  int copies = 0;
  EXPECT_EQ(plan(two, &copies), (std::vector<int64_t>{0, 4}));  // [2, 3, 8, 10]: the second from column 4
  EXPECT_EQ(copies, 0);
  EXPECT_EQ(plan(twice, &copies), (std::vector<int64_t>{}));
  EXPECT_EQ(copies, 1);
  const std::vector<double> got = all_values({two, twice});
  runtime::set_disabled_passes("fuse");
  EXPECT_LE(normalized_error(got, all_values({two, twice})), 1e-6);
}

// Where forward and backward fuse (from kAttentionMinKeysWithBackward keys), the fused backward
// Step writes dQ, dK^T and dV through Step::out_maps straight into their columns of the qkv
// gradient [B, T, 3C] (Target::attention_out_maps; the place pass makes the sum of pads their
// concatenation): one slot, which no other Step writes, and no Step adds the pads or copies a
// part into [B, T, H, D]; the forward writes its output in that layout too (no Copy). Values: the same bits as the fused Steps with "place" off (dense
// gradients, the pads added), for 1, 2 and 3 threads, and within 1e-5 of the decomposition and
// of float64. A target without the flag gets dense gradients and the add. Under the rule the
// decomposition, whose products write the buffer (TheQkvGradientIsWrittenInPlaceByTheBackwardProducts).
TEST_F(Attention, TheFusedBackwardWritesTheQkvGradientInPlace) {
  for (int64_t T : {128, 130, 64, 48, 37, 32}) {
    SCOPED_TRACE(::testing::Message() << "T " << T);
    const bool fused = T >= compiler::kAttentionMinKeysWithBackward;
    const Shape dqkv{kB, T, 3 * kC};
    std::vector<Tensor> outs = qkv_block(DType::Float32, T);
    const compiler::Plan p = plan_of(outs, cpu_target());
    int backward = 0;
    for (const kir::Step& st : p.steps) {
      if (st.kind == kir::StepKind::Attention && !st.attention->backward) {  // O written as [B, T, H, D]
        EXPECT_EQ(st.out_maps.size(), 1u) << st.str();
        EXPECT_EQ(p.slots[size_t(st.output)].shape, (Shape{kB, T, kH, kD})) << st.str();
      }
      if (st.kind != kir::StepKind::Attention || !st.attention->backward) continue;
      ++backward;
      ASSERT_EQ(st.out_maps.size(), 3u) << st.str();
      EXPECT_EQ(p.slots[size_t(st.output)].shape, dqkv) << st.str();
      EXPECT_EQ(st.more_outputs, (std::vector<int>{st.output, st.output})) << st.str();
      for (const kir::Step& other : p.steps)  // the slot's one writer
        for (int o : other.outputs()) EXPECT_TRUE(&other == &st || o != st.output) << other.str();
    }
    EXPECT_EQ(attention_steps(p), fused ? 2 : 0) << p.str();
    EXPECT_EQ(backward, fused ? 1 : 0);
    for (const kir::Step& st : p.steps) {
      EXPECT_FALSE(st.kind != kir::StepKind::Gemm && st.kind != kir::StepKind::Attention && numel(st.shape) == numel(dqkv) &&
                   (has_source(st, "add") || st.kind == kir::StepKind::Copy))
          << "the qkv gradient assembled: " << st.str();
      EXPECT_FALSE(st.kind == kir::StepKind::Copy && st.shape == (Shape{kB, T, kH, kD})) << "a part copied: " << st.str();
    }
    if (fused) {
      kir::Target plain = cpu_target();
      plain.attention_out_maps = false;  // a backend before interface 15: dense gradients, the add
      int adds = 0;
      for (const kir::Step& st : plan_of(outs, plain).steps) {
        EXPECT_TRUE(st.out_maps.empty()) << st.str();
        adds += st.kind == kir::StepKind::Elementwise && numel(st.shape) == numel(dqkv) && has_source(st, "add");
      }
      EXPECT_EQ(adds, 1);
    }
    const std::vector<double> got = all_values(outs);
    for (int t : {1, 2, 3}) {
      omp_set_num_threads(t);
      EXPECT_EQ(all_values(qkv_block(DType::Float32, T)), got) << t << " threads";
    }
    omp_set_num_threads(threads);
    runtime::set_disabled_passes("place");  // the same fused Steps, the gradients dense and added
    EXPECT_EQ(all_values(qkv_block(DType::Float32, T)), got);
    runtime::set_disabled_passes("attention");
    EXPECT_LE(normalized_error(got, all_values(qkv_block(DType::Float32, T))), 1e-5);
    runtime::set_disabled_passes("fuse");
    EXPECT_LE(normalized_error(got, all_values(qkv_block(DType::Float64, T))), 1e-5);
    runtime::set_disabled_passes("");
  }
}

TEST_F(Attention, TheBackwardIsBitIdenticalFor1To3Threads) {
  for (const Shape4& s : {Shape4{2, 3, 130, 130, 32, 32, true}, Shape4{3, 1, 131, 131, 64, 64, true}}) {
    std::vector<std::vector<float>> r;
    for (int t : {1, 2, 3}) {
      omp_set_num_threads(t);
      Tensor q = random_tensor({s.b, s.h, s.tq, s.d}, DType::Float32, 61, -2, 2), k = random_tensor({s.b, s.h, s.tk, s.d}, DType::Float32, 62, -2, 2);
      Tensor v = random_tensor({s.b, s.h, s.tk, s.dv}, DType::Float32, 63, -2, 2);
      for (Tensor* x : {&q, &k, &v}) x->requires_grad_(true);
      Tensor loss = (attention(q, k, v, s) * v.detach()).sum();
      loss.backward();
      std::vector<float> all;
      for (Tensor* x : {&q, &k, &v}) {
        auto g = x->grad().to_vector<float>();
        all.insert(all.end(), g.begin(), g.end());
      }
      r.push_back(all);
    }
    EXPECT_EQ(r[0], r[1]) << "d " << s.d;
    EXPECT_EQ(r[0], r[2]) << "d " << s.d;
  }
}

// Without AVX-512 (TESSERA_CPU_ATTENTION=avx2: the forms other CPUs run) the same values.
TEST_F(Attention, TheAvx2FormsMatchTheReferenceToo) {
  Shape4 s{2, 3, 83, 83, 32, 48, true};
  Tensor q = random_tensor({2, 3, 83, 32}, DType::Float32, 41, -2, 2), k = random_tensor({2, 3, 83, 32}, DType::Float32, 42, -2, 2);
  Tensor v = random_tensor({2, 3, 83, 48}, DType::Float32, 43, -2, 2);
  setenv("TESSERA_CPU_ATTENTION", "avx2", 1);
  auto got = attention(q, k, v, s).to_vector<double>();
  // and the backward's AVX forms: against float64 gradients
  Shape4 s2{1, 2, 140, 140, 32, 48, true};
  auto grads = [&](DType t) {
    Tensor q2 = random_tensor({1, 2, 140, 32}, t, 44, -2, 2), k2 = random_tensor({1, 2, 140, 32}, t, 45, -2, 2);
    Tensor v2 = random_tensor({1, 2, 140, 48}, t, 46, -2, 2);
    for (Tensor* x : {&q2, &k2, &v2}) x->requires_grad_(true);
    Tensor loss = attention(q2, k2, v2, s2).sum();
    loss.backward();
    std::vector<double> all;
    for (Tensor* x : {&q2, &k2, &v2}) {
      auto g = x->grad().to_vector<double>();
      all.insert(all.end(), g.begin(), g.end());
    }
    return all;
  };
  auto g32 = grads(DType::Float32);
  unsetenv("TESSERA_CPU_ATTENTION");
  unsetenv("TESSERA_CPU_ATTENTION");
  runtime::set_disabled_passes("attention");
  auto g64 = grads(DType::Float64);
  runtime::set_disabled_passes("");
  EXPECT_LE(normalized_error(g32, g64), 1e-5);
  EXPECT_EQ(attention_steps(plan_of(attention(q, k, v, s), cpu_target())), 1);
  auto want = reference(q.to_vector<double>(), k.to_vector<double>(), v.to_vector<double>(), s);
  EXPECT_LE(normalized_error(got, want), 2e-6);
  auto fast = attention(q + 0.0, k, v, s).to_vector<double>();  // another graph: compiled with AVX-512 where there is one
  EXPECT_LE(normalized_error(fast, want), 2e-6);
}

// ---- bfloat16 autocast ----

// The float64 reference of autocast's roundings: Q, K, V and the output's cotangent W rounded
// to bfloat16; the scores and the softmax exact; the normalised P rounded for P V and P^T dY;
// dP = dY V^T rounded; di = rowsum(P dP) with P exact; dS = P (dP - di) scale rounded; the
// gradients (each a product's result, which the product's VJP rounds) rounded last.
double bf(double x) { return double(half::bf16_to_float(half::float_to_bf16(float(x)))); }
std::vector<std::vector<double>> bf16_reference(std::vector<double> q, std::vector<double> k, std::vector<double> v, std::vector<double> w,
                                                const Shape4& s) {
  for (auto* x : {&q, &k, &v, &w})
    for (double& e : *x) e = bf(e);
  const int64_t B = s.b * s.h, D = s.d, Dv = s.dv;
  const double scale = 1.0 / std::sqrt(double(s.d));
  std::vector<double> y(size_t(B * s.tq * Dv)), dq(size_t(B * s.tq * D)), dk(size_t(B * s.tk * D)), dv(size_t(B * s.tk * Dv));
  std::vector<double> p(size_t(s.tk)), dp(size_t(s.tk));
  auto dot = [](const double* a, const double* b, int64_t n) {
    double r = 0;
    for (int64_t c = 0; c < n; ++c) r += a[c] * b[c];
    return r;
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < s.tq; ++i) {
      const double* qi = &q[size_t((b * s.tq + i) * D)];
      const double* wi = &w[size_t((b * s.tq + i) * Dv)];
      double m = -INFINITY, sum = 0, di = 0;
      for (int64_t j = 0; j < s.tk; ++j) {
        p[size_t(j)] = s.causal && j - i > s.offset ? -INFINITY : dot(qi, &k[size_t((b * s.tk + j) * D)], D) * scale;
        m = std::max(m, p[size_t(j)]);
      }
      for (int64_t j = 0; j < s.tk; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - m));
      for (int64_t j = 0; j < s.tk; ++j) {
        p[size_t(j)] /= sum;
        dp[size_t(j)] = bf(dot(wi, &v[size_t((b * s.tk + j) * Dv)], Dv));
        di += p[size_t(j)] * dp[size_t(j)];
      }
      for (int64_t j = 0; j < s.tk; ++j) {
        const double pr = bf(p[size_t(j)]), ds = bf(p[size_t(j)] * (dp[size_t(j)] - di) * scale);
        for (int64_t c = 0; c < Dv; ++c) {
          y[size_t((b * s.tq + i) * Dv + c)] += pr * v[size_t((b * s.tk + j) * Dv + c)];
          dv[size_t((b * s.tk + j) * Dv + c)] += pr * wi[c];
        }
        for (int64_t c = 0; c < D; ++c) {
          dq[size_t((b * s.tq + i) * D + c)] += ds * k[size_t((b * s.tk + j) * D + c)];
          dk[size_t((b * s.tk + j) * D + c)] += ds * qi[c];
        }
      }
    }
  for (auto* x : {&dq, &dk, &dv})
    for (double& e : *x) e = bf(e);
  return {y, dq, dk, dv};
}

// Gradients are rounded to bfloat16 last (their products' VJPs), so a value that the float32 and
// float64 computations place on either side of a rounding boundary differs by a bfloat16 step
// (2^-8 relative): got agrees with want when at most `share` of the elements differ, none by more
// than two steps of the largest.
::testing::AssertionResult bf16_agree(const std::vector<double>& got, const std::vector<double>& want, double share = 0.02) {
  size_t differ = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) differ += got[i] != want[i];
  const double e = normalized_error(got, want);
  if (got.size() == want.size() && double(differ) <= share * double(got.size()) && e <= 8e-3) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << differ << " of " << got.size() << " elements differ, normalised error " << e;
}

// y and the gradients of sum(y * w) for q, k, v under bfloat16 autocast, then the values of q,
// k, v and w, with the passes `off` disabled; the plan's attention Steps counted into `fused`
// when given. With `half`, q, k and v are bfloat16 tensors that the model widens to float32
// (autocast's cast back to bfloat16 then simplifies away: the Steps read the bfloat16 tensors).
std::vector<std::vector<double>> autocast_attention(const Shape4& s, uint32_t seed, const std::string& off, bool half = false,
                                                    int* fused = nullptr) {
  runtime::set_disabled_passes(off);
  Autocast ac{DType::BFloat16};
  const DType t = half ? DType::BFloat16 : DType::Float32;
  Tensor q = random_tensor({s.b, s.h, s.tq, s.d}, t, seed, -2, 2), k = random_tensor({s.b, s.h, s.tk, s.d}, t, seed + 1, -2, 2);
  Tensor v = random_tensor({s.b, s.h, s.tk, s.dv}, t, seed + 2, -2, 2);
  Tensor w = random_tensor({s.b, s.h, s.tq, s.dv}, DType::Float32, seed + 3, -2, 2);
  for (Tensor* x : {&q, &k, &v}) x->requires_grad_(true);
  Tensor y = half ? attention(q.to(DType::Float32), k.to(DType::Float32), v.to(DType::Float32), s) : attention(q, k, v, s);
  Tensor loss = (y * w).sum();
  loss.backward();
  if (fused) {
    const compiler::Plan p = plan_of({y, q.grad(), k.grad(), v.grad()}, cpu_target());
    *fused = 0;
    for (const kir::Step& st : p.steps)
      if (st.kind == kir::StepKind::Attention) *fused += st.attention->bf16 ? 1 : 100;  // a float32 one would be wrong here
    EXPECT_EQ(square_slots(p, s.tq, s.tk), 0) << p.str();
  }
  std::vector<std::vector<double>> r{y.to_vector<double>()};
  for (Tensor* x : {&q, &k, &v}) r.push_back(x->grad().to_vector<double>());
  for (Tensor* x : {&q, &k, &v, &w}) r.push_back(x->to_vector<double>());
  return r;
}

// Under bfloat16 autocast the products read operands rounded to bfloat16 (casts) and return
// float32; the softmax between them is float32. The cpu fuses that form too: one forward and one
// backward Step, whose output and gradients match the float64 reference of the same roundings and
// autocast's decomposition (TESSERA_DISABLE_PASSES=attention): the output (float32, not rounded)
// within 1e-5 normalised of both (measured 0.8-3e-7: float32's summation orders; the exact float64
// attention without the roundings is 3-5e-3 away, printed); the gradients, rounded to bfloat16
// last, bf16_agree (measured: 0-2 elements differing by one step per gradient and shape).
TEST_F(Attention, Bfloat16AutocastIsFusedWithItsRoundings) {
  const std::vector<Shape4> shapes = {{2, 2, 64, 64, 32, 32, true}, {1, 2, 48, 112, 32, 32, true, 64}, {1, 2, 37, 101, 32, 16, true, 64},
                                      {1, 2, 128, 128, 64, 64, true}, {1, 1, 130, 130, 48, 40, false}};
  uint32_t seed = 91;
  for (const Shape4& s : shapes) {
    SCOPED_TRACE(::testing::Message() << "Tq " << s.tq << " Tk " << s.tk << " d " << s.d << "/" << s.dv);
    int fused = 0;
    auto got = autocast_attention(s, seed, "", false, &fused);
    EXPECT_EQ(fused, 2);
    auto decomposed = autocast_attention(s, seed, "attention");
    const std::vector<double> &q = got[4], &k = got[5], &v = got[6];
    auto want = bf16_reference(q, k, v, got[7], s);
    EXPECT_LE(normalized_error(got[0], want[0]), 1e-5);
    EXPECT_LE(normalized_error(got[0], decomposed[0]), 1e-5);
    EXPECT_LE(normalized_error(decomposed[0], want[0]), 1e-5);
    std::cout << "Tq " << s.tq << " output: against the rounded float64 reference " << normalized_error(got[0], want[0]) << ", the decomposition "
              << normalized_error(got[0], decomposed[0]) << ", the exact float64 attention " << normalized_error(got[0], reference(q, k, v, s)) << "\n";
    for (size_t i = 1; i < 4; ++i) {
      EXPECT_TRUE(bf16_agree(got[i], want[i])) << "gradient " << i << " against the reference";
      EXPECT_TRUE(bf16_agree(got[i], decomposed[i])) << "gradient " << i << " against the decomposition";
      EXPECT_TRUE(bf16_agree(decomposed[i], want[i])) << "the decomposition's gradient " << i << " against the reference";
    }
    // bfloat16 tensors as the operands (no casts, Steps read them as bfloat16)
    auto halves = autocast_attention(s, seed, "", true, &fused);
    EXPECT_EQ(fused, 2);
    auto want_h = bf16_reference(halves[4], halves[5], halves[6], halves[7], s);
    EXPECT_LE(normalized_error(halves[0], want_h[0]), 1e-5) << "bfloat16 operands";
    for (size_t i = 1; i < 4; ++i) EXPECT_TRUE(bf16_agree(halves[i], want_h[i])) << "bfloat16 operands, gradient " << i;
    seed += 4;
  }
}

// Past 64 key tiles (4096 keys) the bfloat16 forward takes each row's maximum over every tile:
// the keys past 4096 score 120 and the others at most 8, so a maximum over the first 4096 alone
// overflows exp (inf sums, NaN outputs).
TEST_F(Attention, Bfloat16ForwardTakesTheMaximumOverAllKeysPast4096) {
  const Shape4 s{1, 1, 8, 4160, 16, 16, false};
  std::vector<double> kv = random_tensor({s.b, s.h, s.tk, s.d}, DType::Float32, 301, -2, 2).to_vector<double>();
  for (size_t i = size_t(4096 * s.d); i < kv.size(); ++i) kv[i] = 30;
  Tensor q = full({s.b, s.h, s.tq, s.d}, 1.0), k = testing::make_tensor(kv, {s.b, s.h, s.tk, s.d});
  Tensor v = random_tensor({s.b, s.h, s.tk, s.dv}, DType::Float32, 302, -2, 2);
  Tensor y;
  {
    Autocast ac{DType::BFloat16};
    y = attention(q, k, v, s);
  }
  int fused = 0;
  for (const kir::Step& st : plan_of({y}, cpu_target()).steps) fused += st.kind == kir::StepKind::Attention && st.attention->bf16;
  EXPECT_EQ(fused, 1);
  const std::vector<double> w(size_t(s.b * s.h * s.tq * s.dv), 1.0);
  const auto want = bf16_reference(q.to_vector<double>(), kv, v.to_vector<double>(), w, s);
  EXPECT_LE(normalized_error(y.to_vector<double>(), want[0]), 1e-5);
}

TEST_F(Attention, Bfloat16AutocastIsBitIdenticalFor1To3Threads) {
  // (the last shape's work is 16x past the kernels' threshold for running in parallel)
  for (const Shape4& s : {Shape4{2, 2, 64, 64, 32, 32, true}, Shape4{1, 3, 131, 131, 64, 64, true}, Shape4{1, 2, 37, 101, 32, 16, true, 64},
                          Shape4{2, 4, 128, 128, 64, 64, true}}) {
    std::vector<std::vector<std::vector<double>>> r;
    for (int t : {1, 2, 3}) {
      omp_set_num_threads(t);
      r.push_back(autocast_attention(s, 7, ""));
    }
    EXPECT_EQ(r[0], r[1]) << "Tq " << s.tq;
    EXPECT_EQ(r[0], r[2]) << "Tq " << s.tq;
  }
}

// The GPT's training step under bfloat16 autocast (T = 64): the attention fuses both ways in
// every layer (before, autocast kept the decomposition), its Q, K^T and V read as views of the
// biased qkv product (no Step copies them), its gradients written into the qkv gradient; fewer
// Steps; loss and gradients within bfloat16 rounding of the decomposition.
TEST_F(Attention, AGptTrainingStepUnderBfloat16AutocastFusesBothWays) {
  nn::GPTConfig c;
  c.vocab = 40, c.block = 64, c.embd = 64, c.heads = 2, c.layers = 2;
  manual_seed(9);
  auto gpt = std::make_shared<nn::GPT>(c);
  Tensor ids = testing::random_int({2, 64}, 0, 39), targets = testing::random_int({2, 64}, 0, 39, DType::Int64, 2);
  optim::SGD opt(gpt->parameters(), {.lr = 0.0});
  auto step = [&](const std::string& off, size_t* steps) {
    Autocast ac{DType::BFloat16};
    std::vector<Tensor> outs = gpt_loss_and_grads(*gpt, ids, targets, opt, off);
    const compiler::Plan p = plan_of(outs, cpu_target(), off);
    *steps = p.steps.size();
    if (off.empty()) {
      int forward = 0, backward = 0;
      for (const kir::Step& st : p.steps) {
        if (st.kind == kir::StepKind::Attention) {
          EXPECT_TRUE(st.attention->bf16) << st.str();
          (st.attention->backward ? backward : forward)++;
          if (st.attention->backward) EXPECT_EQ(st.out_maps.size(), 3u) << st.str();
        }
        // no head-split copy of Q, K^T, V or dY ([B, H, T, D] or [B, H, D, T])
        EXPECT_FALSE(st.kind == kir::StepKind::Elementwise && st.shape.size() == 4) << st.str();
      }
      EXPECT_EQ(forward, 2);
      EXPECT_EQ(backward, 2);
      for (const kir::Slot& sl : p.slots)  // no [B, H, T, T] scores or probabilities
        EXPECT_FALSE(sl.shape.size() == 4 && sl.shape[2] == 64 && sl.shape[3] == 64) << p.str();
    }
    return all_values(outs);
  };
  size_t fused_steps = 0, decomposed_steps = 0;
  auto fused = step("", &fused_steps), decomposed = step("attention", &decomposed_steps);
  EXPECT_LT(fused_steps, decomposed_steps);
  EXPECT_LE(normalized_error(fused, decomposed), 2e-3);
  std::cout << "Steps " << fused_steps << " fused, " << decomposed_steps << " decomposed; values " << normalized_error(fused, decomposed) << "\n";
}

}  // namespace
}  // namespace tessera
