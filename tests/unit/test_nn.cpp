// nn modules and losses against hand values and finite differences (issue 4, "How it is
// checked": unit tests for each module and loss). Also: parameter paths and counts, tied
// weights, state_dict round trips and strict errors, train/eval, default initializations and
// module scopes in the traced IR.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "tensor/tensor_impl.h"
#include "ir/graph.h"
#include "tessera/nn.h"
#include "tessera/tessera.h"
#include "test_util.h"

namespace tessera {
namespace {

using testing::all_close;
using testing::grad_check;
using testing::make_tensor;
using testing::random_values;
using V = std::vector<double>;

constexpr DType kF32 = DType::Float32;
constexpr DType kF64 = DType::Float64;

// Overwrites a module's parameter in place (keeps its identity).
void set_values(Tensor t, const V& v) {
  NoGradGuard ng;
  t.copy_(make_tensor(v, t.shape(), t.dtype()));
  sync();
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

Tensor ints(const std::vector<int64_t>& v, const Shape& s) { return from_vector<int64_t>(v, s, {DType::Int64, Device("cpu")}); }

nn::GPTConfig small_config() {
  nn::GPTConfig c;
  c.vocab = 23;
  c.block = 8;
  c.embd = 16;
  c.heads = 2;
  c.layers = 2;
  return c;
}

// ---------------------------------------------------------------------------------------------
// Layers against hand values

TEST(NnLinear, HandValues) {
  nn::Linear lin(3, 2);
  set_values(lin.weight, {1, 2, 3, -1, 0.5, 0});
  set_values(lin.bias, {0.25, -2});
  Tensor x = make_tensor({1, 0, -1, 2, 1, 0.5}, {2, 3});
  Tensor y = lin(x);
  EXPECT_EQ(y.shape(), (Shape{2, 2}));
  // row 0: [1*1+2*0+3*-1 + .25, -1*1+.5*0+0 - 2] = [-1.75, -3]
  // row 1: [2+2+1.5 + .25, -2+.5 - 2] = [5.75, -3.5]
  EXPECT_TRUE(all_close(y.to_vector<double>(), {-1.75, -3, 5.75, -3.5}, 1e-6));

  // Batched leading dims, and no bias.
  nn::Linear nb(2, 1, false);
  EXPECT_FALSE(nb.bias.defined());
  EXPECT_EQ(nb.named_parameters().size(), 1u);
  set_values(nb.weight, {2, -3});
  Tensor z = nb(make_tensor({1, 1, 2, 0, 0, 1}, {3, 1, 2}));
  EXPECT_EQ(z.shape(), (Shape{3, 1, 1}));
  EXPECT_TRUE(all_close(z.to_vector<double>(), {-1, 4, -3}, 1e-6));
}

TEST(NnLinear, GradientsMatchFiniteDifferences) {
  // The same computation as Linear::forward (x W^T + b) checked in float64 through grad_check.
  nn::Linear lin(4, 3);
  auto f = [](const std::vector<Tensor>& in) { return matmul(in[0], in[1].transpose(0, 1)) + in[2]; };
  EXPECT_TRUE(grad_check(f, {testing::random_tensor({2, 4}, kF64, 11), lin.weight.to(kF64), lin.bias.to(kF64)}));
  // And the module's own gradients against hand formulas: dW = g^T x, db = sum g.
  Tensor x = testing::random_tensor({5, 4}, kF32, 12);
  Tensor gy = testing::random_tensor({5, 3}, kF32, 13);
  (lin(x) * gy).sum().backward();
  V xv = x.to_vector<double>(), gv = gy.to_vector<double>();
  V dw(12, 0), db(3, 0);
  for (int n = 0; n < 5; ++n)
    for (int o = 0; o < 3; ++o) {
      db[o] += gv[n * 3 + o];
      for (int i = 0; i < 4; ++i) dw[o * 4 + i] += gv[n * 3 + o] * xv[n * 4 + i];
    }
  EXPECT_TRUE(all_close(lin.weight.grad().to_vector<double>(), dw, 1e-5));
  EXPECT_TRUE(all_close(lin.bias.grad().to_vector<double>(), db, 1e-5));
}

TEST(NnLinear, WrongFeatureCountNamesOpAndShapes) {
  nn::Linear lin(4, 3);
  std::string msg = error_of([&] { lin(zeros({2, 5})); });
  ASSERT_FALSE(msg.empty()) << "Linear(4, 3) accepted a [2, 5] input";
  EXPECT_EQ(msg.rfind("[linear]", 0), 0u) << msg;
  EXPECT_TRUE(contains(msg, "[2, 5]")) << msg;
  EXPECT_TRUE(contains(msg, "[3, 4]")) << msg;  // the weight's shape
  EXPECT_THROW(lin(Tensor()), Error);
  EXPECT_THROW(nn::Linear(0, 3), Error);
}

TEST(NnEmbedding, LooksUpRowsAndAccumulatesGradients) {
  nn::Embedding emb(4, 2);
  set_values(emb.weight, {0, 1, 10, 11, 20, 21, 30, 31});
  Tensor idx = from_vector<int64_t>({3, 0, 3, 1}, {2, 2}, {DType::Int64, Device("cpu")});
  Tensor y = emb(idx);
  EXPECT_EQ(y.shape(), (Shape{2, 2, 2}));
  EXPECT_TRUE(all_close(y.to_vector<double>(), {30, 31, 0, 1, 30, 31, 10, 11}, 0));
  Tensor g = make_tensor({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2});
  (y * g).sum().backward();
  // Row 3 is used twice: its gradient is the sum; row 2 is unused.
  EXPECT_TRUE(all_close(emb.weight.grad().to_vector<double>(), {3, 4, 7, 8, 0, 0, 1 + 5, 2 + 6}, 1e-7));
  EXPECT_THROW(nn::Embedding(0, 2), Error);
}

TEST(NnLayerNorm, HandValuesAndAffine) {
  nn::LayerNorm ln(Shape{4});
  EXPECT_TRUE(all_close(ln.weight.to_vector<double>(), {1, 1, 1, 1}, 0));
  EXPECT_TRUE(all_close(ln.bias.to_vector<double>(), {0, 0, 0, 0}, 0));
  Tensor x = make_tensor({1, 2, 3, 4, -2, 0, 0, 2}, {2, 4});
  auto expect = [](const V& row, const V& w, const V& b) {
    double m = 0, v = 0;
    for (double r : row) m += r / 4;
    for (double r : row) v += (r - m) * (r - m) / 4;  // biased variance, like PyTorch
    V o;
    for (size_t i = 0; i < 4; ++i) o.push_back((row[i] - m) / std::sqrt(v + 1e-5) * w[i] + b[i]);
    return o;
  };
  V ones{1, 1, 1, 1}, zero{0, 0, 0, 0};
  V want = expect({1, 2, 3, 4}, ones, zero), want2 = expect({-2, 0, 0, 2}, ones, zero);
  want.insert(want.end(), want2.begin(), want2.end());
  EXPECT_TRUE(all_close(ln(x).to_vector<double>(), want, 1e-5));

  V w{2, -1, 0.5, 1}, b{0.1, 0.2, 0.3, -0.4};
  set_values(ln.weight, w);
  set_values(ln.bias, b);
  want = expect({1, 2, 3, 4}, w, b);
  want2 = expect({-2, 0, 0, 2}, w, b);
  want.insert(want.end(), want2.begin(), want2.end());
  EXPECT_TRUE(all_close(ln(x).to_vector<double>(), want, 1e-5));

  nn::LayerNorm plain(Shape{4}, 1e-5, false);
  EXPECT_FALSE(plain.weight.defined());
  EXPECT_EQ(plain.num_parameters(), 0);
}

TEST(NnLayerNorm, GradientsMatchFiniteDifferences) {
  auto f = [](const std::vector<Tensor>& in) { return layer_norm(in[0], Shape{5}, in[1], in[2], 1e-5); };
  EXPECT_TRUE(grad_check(f, {testing::random_tensor({3, 5}, kF64, 21), testing::random_tensor({5}, kF64, 22, 0.5, 1.5),
                             testing::random_tensor({5}, kF64, 23)}));
}

TEST(NnActivations, HandValues) {
  V xs{-3, -1, -0.5, 0, 0.5, 1, 2.5};
  Tensor x = make_tensor(xs, {7});
  V relu_v, gelu_v, gelu_t, silu_v;
  for (double v : xs) {
    relu_v.push_back(v > 0 ? v : 0);
    gelu_v.push_back(0.5 * v * (1 + std::erf(v / std::sqrt(2.0))));
    gelu_t.push_back(0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))));
    silu_v.push_back(v / (1 + std::exp(-v)));
  }
  EXPECT_TRUE(all_close(nn::ReLU()(x).to_vector<double>(), relu_v, 0));
  EXPECT_TRUE(all_close(nn::GELU()(x).to_vector<double>(), gelu_v, 1e-6));
  EXPECT_TRUE(all_close(nn::GELU(true)(x).to_vector<double>(), gelu_t, 1e-6));
  EXPECT_TRUE(all_close(nn::SiLU()(x).to_vector<double>(), silu_v, 1e-6));
  // Exact and tanh GELU differ (by ~1e-3 near |x| = 2.5): the flag is honoured.
  EXPECT_GT(testing::normalized_error(gelu_t, gelu_v), 1e-5);
}

TEST(NnActivations, GradientsMatchFiniteDifferences) {
  Tensor x = testing::random_away({9}, 31, -3, 3, {0});
  EXPECT_TRUE(grad_check([](const std::vector<Tensor>& in) { return nn::GELU()(in[0]); }, {x}));
  EXPECT_TRUE(grad_check([](const std::vector<Tensor>& in) { return nn::GELU(true)(in[0]); }, {x}));
  EXPECT_TRUE(grad_check([](const std::vector<Tensor>& in) { return nn::SiLU()(in[0]); }, {x}));
  EXPECT_TRUE(grad_check([](const std::vector<Tensor>& in) { return nn::ReLU()(in[0]); }, {x}));
}

// ---------------------------------------------------------------------------------------------
// Containers

TEST(NnSequential, RunsChildrenInOrderWithNumberedNames) {
  auto l1 = std::make_shared<nn::Linear>(2, 2);
  auto l2 = std::make_shared<nn::Linear>(2, 1);
  set_values(l1->weight, {1, -1, 2, 1});
  set_values(l1->bias, {0, -5});
  set_values(l2->weight, {3, 1});
  set_values(l2->bias, {0.5});
  nn::Sequential seq;
  seq.add(l1).add(std::make_shared<nn::ReLU>()).add(l2);
  EXPECT_EQ(seq.size(), 3u);
  Tensor y = seq(make_tensor({1, 2, 4, 1}, {2, 2}));
  // x0 = [1, 2]: l1 -> [-1, -1] -> relu [0, 0] -> 0.5;  x1 = [4, 1]: l1 -> [3, 4] -> relu -> 9 + 4 + .5
  EXPECT_TRUE(all_close(y.to_vector<double>(), {0.5, 13.5}, 1e-6));
  std::vector<std::string> names;
  for (auto& [n, t] : seq.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_EQ(seq.num_parameters(), 4 + 2 + 2 + 1);
  auto mods = seq.named_modules();
  ASSERT_EQ(mods.size(), 3u);
  EXPECT_EQ(mods[1].first, "1");
  EXPECT_EQ(mods[1].second->type_name(), "ReLU");
}

TEST(NnModuleList, IndexesAndNamesChildren) {
  nn::ModuleList list;
  list.add(std::make_shared<nn::Linear>(3, 3)).add(std::make_shared<nn::LayerNorm>(Shape{3}));
  EXPECT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0]->type_name(), "Linear");
  EXPECT_EQ(list[1]->type_name(), "LayerNorm");
  EXPECT_THROW(list[2], Error);
  std::vector<std::string> names;
  for (auto& [n, t] : list.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias"}));
  // A ModuleList does not run.
  EXPECT_THROW(list(zeros({3})), Error);
}

// ---------------------------------------------------------------------------------------------
// Parameters, counting, state dicts

int64_t gpt_params_by_formula(const nn::GPTConfig& c) {
  int64_t E = c.embd, V = c.vocab, B = c.block, bias = c.bias ? 1 : 0;
  int64_t block = 2 * E                      // ln1
                  + 3 * E * E + bias * 3 * E  // attn.qkv
                  + E * E + bias * E          // attn.proj
                  + 2 * E                     // ln2
                  + 4 * E * E + bias * 4 * E  // mlp.fc
                  + 4 * E * E + bias * E;     // mlp.proj
  return V * E + B * E + c.layers * block + 2 * E + (c.tied_head ? 0 : V * E);
}

TEST(NnGPTParameters, PathsAndCounts) {
  nn::GPTConfig c = small_config();
  nn::GPT gpt(c);
  auto named = gpt.named_parameters();
  std::map<std::string, Shape> shapes;
  for (auto& [n, t] : named) shapes[n] = t.shape();
  EXPECT_EQ(shapes.size(), named.size()) << "duplicate parameter paths";
  EXPECT_EQ(shapes["blocks.0.attn.qkv.weight"], (Shape{3 * c.embd, c.embd}));
  EXPECT_EQ(shapes["blocks.0.attn.qkv.bias"], (Shape{3 * c.embd}));
  EXPECT_EQ(shapes["blocks.1.attn.proj.weight"], (Shape{c.embd, c.embd}));
  EXPECT_EQ(shapes["blocks.1.mlp.fc.weight"], (Shape{4 * c.embd, c.embd}));
  EXPECT_EQ(shapes["blocks.1.mlp.proj.weight"], (Shape{c.embd, 4 * c.embd}));
  EXPECT_EQ(shapes["blocks.1.ln2.bias"], (Shape{c.embd}));
  EXPECT_EQ(shapes["wte.weight"], (Shape{c.vocab, c.embd}));
  EXPECT_EQ(shapes["wpe.weight"], (Shape{c.block, c.embd}));
  EXPECT_EQ(shapes["ln_f.weight"], (Shape{c.embd}));
  EXPECT_EQ(shapes["head.weight"], (Shape{c.vocab, c.embd}));
  EXPECT_FALSE(shapes.count("head.bias"));
  EXPECT_EQ(named.front().first, "wte.weight");  // depth first, in registration order
  EXPECT_EQ(named.back().first, "head.weight");
  // 2 embeddings + per block (2 + 2 + 2 + 2 + 2 + 2) + 2 + head
  EXPECT_EQ(named.size(), size_t(2 + 12 * c.layers + 2 + 1));
  EXPECT_EQ(gpt.num_parameters(), gpt_params_by_formula(c));
  for (auto& [n, t] : named) EXPECT_TRUE(t.requires_grad()) << n;
  EXPECT_EQ(gpt.parameters().size(), named.size());
  EXPECT_TRUE(gpt.named_buffers().empty());

  nn::GPTConfig nb = c;
  nb.bias = false;
  nn::GPT gpt_nb(nb);
  EXPECT_EQ(gpt_nb.num_parameters(), gpt_params_by_formula(nb));
  EXPECT_EQ(gpt_nb.state_dict().count("blocks.0.attn.qkv.bias"), 0u);
}

TEST(NnGPTParameters, TiedHeadListsSharedWeightOnce) {
  nn::GPTConfig c = small_config();
  c.tied_head = true;
  nn::GPT gpt(c);
  auto named = gpt.named_parameters();
  int wte_like = 0;
  for (auto& [n, t] : named) {
    EXPECT_NE(n.rfind("head", 0), 0u) << "tied model lists " << n;
    if (t.is_same(gpt.wte->weight)) ++wte_like;
  }
  EXPECT_EQ(wte_like, 1);
  EXPECT_EQ(gpt.num_parameters(), gpt_params_by_formula(c));
  nn::GPTConfig u = small_config();
  EXPECT_EQ(gpt_params_by_formula(u) - gpt.num_parameters(), c.vocab * c.embd);

  // The head really is the embedding: logits = ln_f(h) @ wte^T, and its gradient reaches wte
  // from both uses.
  Tensor idx = testing::random_int({2, 5}, 0, c.vocab - 1, DType::Int64, 3);
  Tensor logits = gpt(idx);
  EXPECT_EQ(logits.shape(), (Shape{2, 5, c.vocab}));
  gpt.loss(idx, testing::random_int({2, 5}, 0, c.vocab - 1, DType::Int64, 4)).backward();
  Tensor g = gpt.wte->weight.grad();
  ASSERT_TRUE(g.defined());
  // Rows of tokens never used as inputs still get a gradient through the head.
  V gv = g.to_vector<double>();
  std::set<int64_t> used;
  for (int64_t t : idx.to_vector<int64_t>()) used.insert(t);
  int64_t unused = -1;
  for (int64_t t = 0; t < c.vocab; ++t)
    if (!used.count(t)) unused = t;
  ASSERT_GE(unused, 0);
  double row = 0;
  for (int64_t j = 0; j < c.embd; ++j) row += std::abs(gv[unused * c.embd + j]);
  EXPECT_GT(row, 0);
}

TEST(NnStateDict, RoundTripCopiesValues) {
  nn::GPT a(small_config()), b(small_config());
  auto sa = a.state_dict();
  ASSERT_EQ(sa.size(), a.named_parameters().size());
  // Different random initializations to start with.
  EXPECT_GT(testing::normalized_error(b.wte->weight.to_vector<double>(), a.wte->weight.to_vector<double>()), 0.1);
  auto b_qkv = b.state_dict().at("blocks.1.attn.qkv.weight");
  b.load_state_dict(sa);
  for (auto& [n, t] : b.state_dict()) EXPECT_EQ(t.to_vector<float>(), sa.at(n).to_vector<float>()) << n;
  // In place: the handles held before loading see the new values, and still need gradients.
  EXPECT_TRUE(b_qkv.is_same(b.blocks->operator[](1)->state_dict().at("attn.qkv.weight")));
  EXPECT_EQ(b_qkv.to_vector<float>(), sa.at("blocks.1.attn.qkv.weight").to_vector<float>());
  EXPECT_TRUE(b_qkv.requires_grad());
  Tensor idx = testing::random_int({2, 8}, 0, 22, DType::Int64, 5);
  EXPECT_EQ(a(idx).to_vector<float>(), b(idx).to_vector<float>());
  // A loaded copy is independent of the source: changing a does not change b.
  set_values(a.ln_f->weight, V(16, 3.0));
  EXPECT_TRUE(all_close(b.ln_f->weight.to_vector<double>(), V(16, 1.0), 0));
}

TEST(NnStateDict, StrictErrors) {
  nn::GPT a(small_config());
  auto sd = a.state_dict();

  auto missing = sd;
  missing.erase("blocks.0.ln1.bias");
  std::string msg = error_of([&] { a.load_state_dict(missing); });
  EXPECT_TRUE(contains(msg, "missing")) << msg;
  EXPECT_TRUE(contains(msg, "blocks.0.ln1.bias")) << msg;
  EXPECT_NO_THROW(a.load_state_dict(missing, /*strict=*/false));

  auto unexpected = sd;
  unexpected["blocks.9.attn.qkv.weight"] = zeros({2});
  msg = error_of([&] { a.load_state_dict(unexpected); });
  EXPECT_TRUE(contains(msg, "unexpected")) << msg;
  EXPECT_TRUE(contains(msg, "blocks.9.attn.qkv.weight")) << msg;
  EXPECT_NO_THROW(a.load_state_dict(unexpected, false));

  // A shape mismatch is an error even when not strict, and names the entry and both shapes.
  auto bad = sd;
  bad["wpe.weight"] = zeros({4, 16});
  for (bool strict : {true, false}) {
    msg = error_of([&] { a.load_state_dict(bad, strict); });
    EXPECT_TRUE(contains(msg, "wpe.weight")) << msg;
    EXPECT_TRUE(contains(msg, "[8, 16]")) << msg;
    EXPECT_TRUE(contains(msg, "[4, 16]")) << msg;
  }
  auto wrong_dtype = sd;
  wrong_dtype["ln_f.bias"] = zeros({16}, {kF64, Device("cpu")});
  EXPECT_THROW(a.load_state_dict(wrong_dtype), Error);
}

// ---------------------------------------------------------------------------------------------
// train / eval, dropout

TEST(NnDropout, IdentityInEvalScaledMaskInTrain) {
  const double p = 0.3;
  nn::Dropout d(p);
  EXPECT_TRUE(d.is_training());
  V xs = random_values(4000, kF32, 41, 0.5, 2);
  Tensor x = make_tensor(xs, {40, 100});
  V y = d(x).to_vector<double>();
  int zeros_n = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (y[i] == 0) {
      ++zeros_n;
      continue;
    }
    ASSERT_NEAR(y[i], xs[i] / (1 - p), 1e-6 * std::abs(xs[i])) << "element " << i;
  }
  double frac = double(zeros_n) / double(xs.size());
  EXPECT_NEAR(frac, p, 0.04);
  // A fresh mask per execution.
  V y2 = d(x).to_vector<double>();
  EXPECT_NE(y, y2);
  // The gradient is the same scaled mask.
  Tensor xg = make_tensor(xs, {40, 100});
  xg.requires_grad_();
  Tensor out = d(xg);
  out.sum().backward();
  V ov = out.to_vector<double>(), gv = xg.grad().to_vector<double>();
  for (size_t i = 0; i < xs.size(); ++i) ASSERT_NEAR(gv[i], ov[i] == 0 ? 0 : 1 / (1 - p), 1e-6) << i;

  d.eval();
  EXPECT_FALSE(d.is_training());
  EXPECT_EQ(d(x).to_vector<double>(), x.to_vector<double>());
  d.train();
  EXPECT_TRUE(d.is_training());
  nn::Dropout zero(0.0);
  EXPECT_EQ(zero(x).to_vector<double>(), x.to_vector<double>());
  EXPECT_THROW(nn::Dropout(1.0), Error);
  EXPECT_THROW(nn::Dropout(-0.1), Error);
}

TEST(NnDropout, TrainEvalPropagatesToDescendants) {
  nn::GPTConfig c = small_config();
  c.dropout = 0.5;
  nn::GPT gpt(c);
  gpt.eval();
  for (auto& [n, m] : gpt.named_modules()) EXPECT_FALSE(m->is_training()) << n;
  Tensor idx = testing::random_int({2, 8}, 0, c.vocab - 1, DType::Int64, 6);
  // Eval: deterministic.
  EXPECT_EQ(gpt(idx).to_vector<float>(), gpt(idx).to_vector<float>());
  gpt.train();
  for (auto& [n, m] : gpt.named_modules()) EXPECT_TRUE(m->is_training()) << n;
  EXPECT_NE(gpt(idx).to_vector<float>(), gpt(idx).to_vector<float>());
}

// ---------------------------------------------------------------------------------------------
// Default initializations (PyTorch's)

TEST(NnInit, LinearUniformWithinFanInBound) {
  nn::Linear lin(64, 300);
  double bound = 1 / std::sqrt(64.0);
  for (const Tensor& t : {lin.weight, lin.bias}) {
    V v = t.to_vector<double>();
    double lo = *std::min_element(v.begin(), v.end()), hi = *std::max_element(v.begin(), v.end());
    EXPECT_GE(lo, -bound);
    EXPECT_LE(hi, bound);
    if (v.size() > 1000) {
      // Fills the range: uniform, variance bound^2 / 3.
      EXPECT_LT(lo, -0.95 * bound);
      EXPECT_GT(hi, 0.95 * bound);
      double m = 0, var = 0;
      for (double x : v) m += x / double(v.size());
      for (double x : v) var += (x - m) * (x - m) / double(v.size());
      EXPECT_NEAR(m, 0, 0.01 * bound * 3);
      EXPECT_NEAR(var, bound * bound / 3, 0.05 * bound * bound / 3);
    }
  }
}

TEST(NnInit, EmbeddingStandardNormal) {
  nn::Embedding emb(500, 64);
  V v = emb.weight.to_vector<double>();
  double m = 0, var = 0, n = double(v.size());
  for (double x : v) m += x / n;
  for (double x : v) var += (x - m) * (x - m) / n;
  EXPECT_NEAR(m, 0, 0.02);     // sd of the mean: 1/sqrt(32000) = 0.0056
  EXPECT_NEAR(var, 1, 0.04);   // sd of the variance: sqrt(2/32000) = 0.008
  int beyond3 = 0;
  for (double x : v) beyond3 += std::abs(x) > 3;
  EXPECT_GT(beyond3, 0);  // a normal, not a bounded distribution
  EXPECT_LT(beyond3, 200);  // 0.27% of 32000 = 86 expected
}

// ---------------------------------------------------------------------------------------------
// Module scopes in the traced IR

std::set<std::string> scopes_of(const Tensor& t, std::map<std::string, std::set<std::string>>* ops = nullptr) {
  ir::Graph g = ir::build_graph({detail::node_of(t)});
  std::set<std::string> r;
  for (auto& n : g.nodes) {
    r.insert(*n->scope);
    if (ops) (*ops)[*n->scope].insert(ir::op_name(n->op));
  }
  return r;
}

TEST(NnScopes, GPTForwardNodesCarryModulePaths) {
  nn::GPT gpt(small_config());
  Tensor idx = testing::random_int({1, 8}, 0, 22, DType::Int64, 7);
  Tensor logits = gpt(idx);
  ASSERT_FALSE(logits.is_realized());
  std::map<std::string, std::set<std::string>> ops;
  std::set<std::string> s = scopes_of(logits, &ops);
  auto show = [&] {
    std::string all;
    for (auto& x : s) all += "'" + x + "' ";
    return all;
  };
  std::string missing;
  for (const char* want : {"GPT.wte", "GPT.wpe", "GPT.blocks.0.ln1", "GPT.blocks.1.attn.qkv", "GPT.blocks.1.attn.proj",
                           "GPT.blocks.1.attn", "GPT.blocks.0.mlp.fc", "GPT.blocks.0.mlp.proj", "GPT.blocks.1.ln2",
                           "GPT.ln_f", "GPT.head"})
    if (!s.count(want)) missing += std::string(missing.empty() ? "" : ", ") + want;
  EXPECT_TRUE(missing.empty()) << "no node in scopes " << missing << "; the graph's scopes: " << show();
  // The projections' matmuls sit in their modules' scopes (checked by suffix, so that this holds
  // apart from the exact-path checks above).
  auto has_op_in = [&](const std::string& suffix, const char* op) {
    for (auto& [sc, names] : ops)
      if (sc.size() >= suffix.size() && sc.compare(sc.size() - suffix.size(), suffix.size(), suffix) == 0 && names.count(op))
        return true;
    return false;
  };
  EXPECT_TRUE(has_op_in("blocks.1.attn.qkv", "matmul"));
  EXPECT_TRUE(has_op_in("mlp.fc", "matmul"));
  EXPECT_TRUE(has_op_in("head", "matmul"));
  EXPECT_TRUE(has_op_in("wte", "gather"));
  // Each module appears once in the path, whichever entry point ran it.
  std::string doubled;
  for (auto& x : s) {
    if (!x.empty() && x.rfind("GPT", 0) != 0) ADD_FAILURE() << "stray scope '" << x << "'";
    if (contains(x, "GPT.GPT") || contains(x, "blocks.1.blocks.1") || contains(x, "blocks.0.blocks.0") ||
        contains(x, "attn.attn"))
      doubled += " '" + x + "'";
  }
  EXPECT_TRUE(doubled.empty()) << "scopes with a module's name twice:" << doubled;
  {
    std::set<std::string> direct = scopes_of(gpt.forward(idx));
    EXPECT_TRUE(direct.count("GPT.blocks.1.attn.qkv")) << "calling forward() directly; e.g. "
                                                       << (direct.size() > 5 ? *std::next(direct.begin(), 5) : "");
  }
  // Scopes do not leak out of the module.
  EXPECT_EQ(current_scope(), "");

  // A custom scope around the call nests.
  {
    Scope outer("train");
    Tensor l2 = gpt(idx);
    EXPECT_TRUE(scopes_of(l2).count("train.GPT.blocks.0.attn.qkv"));
  }
  // The VJP nodes take the forward node's scope plus ".backward".
  Tensor idx2 = testing::random_int({1, 8}, 0, 22, DType::Int64, 8);
  gpt.loss(idx2, idx).backward();
  Tensor g = gpt.blocks->operator[](1)->state_dict().at("attn.qkv.weight").grad();
  ASSERT_TRUE(g.defined());
  std::set<std::string> gs = scopes_of(g);
  bool found = false;
  for (auto& x : gs) found |= contains(x, "blocks.1.attn.qkv") && contains(x, ".backward");
  EXPECT_TRUE(found) << "no backward node in a *blocks.1.attn.qkv*.backward scope";
  EXPECT_TRUE(gs.count("GPT.blocks.1.attn.qkv.backward")) << "the VJP of the qkv matmul is not in scope "
                                                            "'GPT.blocks.1.attn.qkv.backward'";
}

// ---------------------------------------------------------------------------------------------
// Losses

// PyTorch's cross_entropy (mean over non-ignored targets, label smoothing) in float64.
double ce_by_hand(const V& logits, const std::vector<int64_t>& target, int64_t C, int64_t ignore, double eps) {
  double total = 0;
  int kept = 0;
  for (size_t n = 0; n < target.size(); ++n) {
    if (target[n] == ignore) continue;
    ++kept;
    double m = -INFINITY;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, logits[n * C + c]);
    double z = 0;
    for (int64_t c = 0; c < C; ++c) z += std::exp(logits[n * C + c] - m);
    double lse = m + std::log(z), sum_logp = 0;
    for (int64_t c = 0; c < C; ++c) sum_logp += logits[n * C + c] - lse;
    double nll = lse - logits[n * C + target[n]];
    total += (1 - eps) * nll + eps * (-sum_logp / double(C));
  }
  return total / kept;
}

TEST(NnLosses, CrossEntropyHandValues) {
  // Two rows by hand: logits [0, ln 3] target 1 -> -ln(3/4); [2, 2] target 0 -> ln 2.
  Tensor lg = make_tensor({0, std::log(3.0), 2, 2}, {2, 2});
  Tensor tg = from_vector<int64_t>({1, 0}, {2}, {DType::Int64, Device("cpu")});
  double want = (-std::log(0.75) + std::log(2.0)) / 2;
  EXPECT_NEAR(nn::cross_entropy(lg, tg).item(), want, 1e-6);

  const int64_t N = 7, C = 5;
  V logits = random_values(N * C, kF32, 51, -3, 3);
  std::vector<int64_t> target{0, 4, -100, 2, 2, 3, -100};
  Tensor L = make_tensor(logits, {N, C});
  Tensor T = from_vector<int64_t>(target, {N}, {DType::Int64, Device("cpu")});
  for (double eps : {0.0, 0.1, 0.4, 1.0}) {
    EXPECT_NEAR(nn::cross_entropy(L, T, {.label_smoothing = eps}).item(), ce_by_hand(logits, target, C, -100, eps), 2e-6) << "eps " << eps;
  }
  // ignore_index may be a valid class id: those targets drop out.
  std::vector<int64_t> t2{0, 4, 1, 2, 2, 3, 1};
  Tensor T2 = from_vector<int64_t>(t2, {N}, {DType::Int64, Device("cpu")});
  EXPECT_NEAR(nn::cross_entropy(L, T2, {.ignore_index = 2, .label_smoothing = 0.2}).item(), ce_by_hand(logits, t2, C, 2, 0.2), 2e-6);
}

TEST(NnLosses, CrossEntropyGradientsMatchFiniteDifferences) {
  Tensor T = from_vector<int64_t>({1, -100, 0, 3, 3, -100}, {6}, {DType::Int64, Device("cpu")});
  Tensor L = testing::random_tensor({6, 4}, kF64, 52, -2, 2);
  for (double eps : {0.0, 0.25}) {
    auto f = [eps](const std::vector<Tensor>& in) { return nn::cross_entropy(in[0], in[1], {.label_smoothing = eps}); };
    testing::GradCheckOptions o;
    o.differentiate = {true, false};
    testing::GradCheckResult r;
    EXPECT_TRUE(grad_check(f, {L, T}, o, &r)) << "eps " << eps;
    // Ignored rows get exactly zero gradient.
    for (int c = 0; c < 4; ++c) {
      EXPECT_EQ(r.analytic[0][1 * 4 + c], 0.0);
      EXPECT_EQ(r.analytic[0][5 * 4 + c], 0.0);
    }
  }
  // And against the closed form: d/dlogit = (softmax - ((1-e) onehot + e/C)) / kept.
  double eps = 0.25;
  Tensor Lg = testing::random_tensor({6, 4}, kF64, 53, -2, 2);
  Lg.requires_grad_();
  nn::cross_entropy(Lg, T, {.label_smoothing = eps}).backward();
  V lv = Lg.to_vector<double>(), gv = Lg.grad().to_vector<double>(), want(24, 0);
  std::vector<int64_t> tv = T.to_vector<int64_t>();
  for (int n = 0; n < 6; ++n) {
    if (tv[n] == -100) continue;
    double z = 0;
    for (int c = 0; c < 4; ++c) z += std::exp(lv[n * 4 + c]);
    for (int c = 0; c < 4; ++c)
      want[n * 4 + c] = (std::exp(lv[n * 4 + c]) / z - ((1 - eps) * (c == tv[n]) + eps / 4)) / 4.0;  // 4 kept rows
  }
  EXPECT_TRUE(all_close(gv, want, 1e-10));
}

// The target's logit is picked by a mask (no gather, which failed at run time on an index out of
// range): a kept target outside [0, C) makes its row's loss NaN, never a finite wrong value; an
// ignored one (-100, or ignore_index itself) is 0 as before.
TEST(NnLosses, TargetsOutsideTheClassesGiveNaNNotAWrongLoss) {
  Tensor L = testing::random_tensor({4, 3}, kF32, 54, -2, 2);
  Tensor T = from_vector<int64_t>({1, 3, -100, -1}, {4}, {DType::Int64, Device("cpu")});
  V rows = nn::cross_entropy(L, T, {.reduction = Reduction::None}).to_vector<double>();
  EXPECT_TRUE(std::isfinite(rows[0]) && rows[0] > 0);
  EXPECT_TRUE(std::isnan(rows[1]));
  EXPECT_EQ(rows[2], 0.0);
  EXPECT_TRUE(std::isnan(rows[3]));
  EXPECT_TRUE(std::isnan(nn::cross_entropy(L, T).item()));
  EXPECT_TRUE(std::isnan(nn::nll_loss(log_softmax(L, 1), T).item()));
  // The gradient too: NaN at the bad rows (so no update is finite and wrong), 0 at the ignored
  // one, finite at the good one; under a mean, NaN everywhere.
  for (Reduction r : {Reduction::Sum, Reduction::Mean}) {
    Tensor X = L.detach().requires_grad_();
    nn::cross_entropy(X, T, {.reduction = r}).backward();
    V g = X.grad().to_vector<double>();
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t c = 0; c < 3; ++c) {
        const double v = g[size_t(3 * i + c)];
        if (r == Reduction::Mean || i == 1 || i == 3) EXPECT_TRUE(std::isnan(v)) << i << "," << c;
        else if (i == 2) EXPECT_EQ(v, 0.0) << c;
        else EXPECT_TRUE(std::isfinite(v)) << c;
      }
  }
  Tensor ok = from_vector<int64_t>({1, 2, -100, 0}, {4}, {DType::Int64, Device("cpu")});
  EXPECT_TRUE(std::isfinite(nn::cross_entropy(L, ok).item()));
  EXPECT_TRUE(std::isfinite(nn::nll_loss(log_softmax(L, 1), ok).item()));
}

TEST(NnLosses, NllLoss) {
  Tensor lp = make_tensor({-0.5, -1, -2, -0.1, -3, -0.7}, {3, 2});
  Tensor t = from_vector<int64_t>({1, 0, 1}, {3}, {DType::Int64, Device("cpu")});
  EXPECT_NEAR(nn::nll_loss(lp, t).item(), (1 + 2 + 0.7) / 3, 1e-6);
  Tensor ti = from_vector<int64_t>({1, -100, 1}, {3}, {DType::Int64, Device("cpu")});
  EXPECT_NEAR(nn::nll_loss(lp, ti).item(), (1 + 0.7) / 2, 1e-6);
  Tensor t7 = from_vector<int64_t>({7, 0, 7}, {3}, {DType::Int64, Device("cpu")});
  EXPECT_NEAR(nn::nll_loss(lp, t7, {.ignore_index = 7}).item(), 2, 1e-6);  // an out-of-range ignored id is never read
  testing::GradCheckOptions o;
  o.differentiate = {true, false};
  EXPECT_TRUE(grad_check([](const std::vector<Tensor>& in) { return nn::nll_loss(in[0], in[1]); },
                         {testing::random_tensor({3, 2}, kF64, 54, -3, -0.1), ti}, o));
  // Bad inputs.
  EXPECT_THROW(nn::nll_loss(lp, make_tensor({1, 0, 1}, {3})), Error);              // float targets
  EXPECT_THROW(nn::nll_loss(lp, ints({1, 0}, {2})), Error);        // wrong count
  EXPECT_THROW(nn::nll_loss(lp.reshape({6}), t), Error);                           // not [N, C]
}

TEST(NnLosses, MseLoss) {
  Tensor a = make_tensor({1, 2, 3, 4}, {2, 2}), b = make_tensor({0, 2, 5, 3}, {2, 2});
  EXPECT_NEAR(nn::mse_loss(a, b).item(), (1 + 0 + 4 + 1) / 4.0, 1e-7);
  EXPECT_TRUE(grad_check([](const std::vector<Tensor>& in) { return nn::mse_loss(in[0], in[1]); },
                         {testing::random_tensor({3, 4}, kF64, 55), testing::random_tensor({3, 4}, kF64, 56)}));
  std::string msg = error_of([&] { nn::mse_loss(a, zeros({4})); });
  EXPECT_EQ(msg.rfind("[mse_loss]", 0), 0u) << msg;
  EXPECT_TRUE(contains(msg, "[2, 2]") && contains(msg, "[4]")) << msg;
}

TEST(NnLosses, BadInputsAreErrors) {
  Tensor t = ints({0, 1}, {2});
  std::string msg = error_of([&] { nn::cross_entropy(zeros({2, 3, 4}), t); });
  EXPECT_EQ(msg.rfind("[cross_entropy]", 0), 0u) << msg;
  EXPECT_TRUE(contains(msg, "[2, 3, 4]")) << msg;
  EXPECT_THROW(nn::cross_entropy(zeros({2, 3}), t, {.label_smoothing = 1.5}), Error);
  EXPECT_THROW(nn::cross_entropy(zeros({2, 3}), t, {.label_smoothing = -0.1}), Error);
  EXPECT_THROW(nn::cross_entropy(Tensor(), t), Error);
}

}  // namespace
}  // namespace tessera
