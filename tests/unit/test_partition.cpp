// The partitioner (dist::shard + dist::sync_partitioned, docs/architecture.md "Sharding and the
// partitioner"): a training step traced on full shapes, some leaves annotated with their layout
// over a mesh, run as ONE per-rank graph on in-process ranks. Each test compares with the same
// step on one device (the unpartitioned graph) and counts the collectives the per-rank graph has.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "tessera/distributed.h"
#include "tessera/memory.h"
#include "tessera/nn.h"
#include "tessera/optim.h"
#include "tessera/scope.h"
#include "tessera/tessera.h"

namespace tessera {
namespace {

using dist::none;

Tensor param(const Shape& s, uint64_t seed) {
  manual_seed(seed);
  Tensor t = randn(s) * 0.3;
  sync();
  return t;
}

void expect_close(const Tensor& got, const std::vector<float>& want, const std::string& what, double tol = 1e-5) {
  std::vector<float> g = got.to_vector<float>();
  ASSERT_EQ(g.size(), want.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::fabs(double(g[i]) - want[i]) / std::max(1.0, std::fabs(double(want[i]))));
  EXPECT_LT(worst, tol) << what;
}

struct Mlp {
  Tensor x, t, w1, b1, w2, b2;
  Mlp(bool x_grad) {
    x = param({8, 16}, 1), t = param({8, 16}, 2);
    w1 = param({16, 32}, 3), b1 = param({32}, 4), w2 = param({32, 16}, 5), b2 = param({16}, 6);
    for (Tensor* p : {&w1, &b1, &w2, &b2}) p->requires_grad_();
    if (x_grad) x.requires_grad_();
  }
  Tensor loss() {
    Scope s("mlp");
    Tensor y = matmul(gelu(matmul(x, w1) + b1), w2) + b2;
    return mean((y - t) * (y - t));
  }
  std::vector<Tensor> grads() { return {w1.grad(), b1.grad(), w2.grad(), b2.grad()}; }
};

TEST(Partition, MegatronMlpOnTwoRanksGivesOneDevicesLossAndGradients) {
  for (bool x_grad : {false, true}) {
    // One device.
    Mlp ref(x_grad);
    Tensor l = ref.loss();
    l.backward();
    std::vector<Tensor> rg = ref.grads();
    if (x_grad) rg.push_back(ref.x.grad());
    sync();
    const int64_t full_peak = int64_t(last_memory_plan().peak_bytes);
    // Two ranks: W1 split by columns (with its bias), W2 by rows.
    dist::clear_shardings();
    dist::Mesh mesh({{"model", 2}});
    Mlp m(x_grad);
    dist::shard(m.w1, mesh, {none, "model"});
    dist::shard(m.b1, mesh, {"model"});
    dist::shard(m.w2, mesh, {"model", none});
    Tensor lp = m.loss();
    lp.backward();
    std::vector<Tensor> pg = m.grads();
    if (x_grad) pg.push_back(m.x.grad());
    dist::PartitionStats st = dist::sync_partitioned(mesh);
    EXPECT_EQ(st.ranks, 2);
    expect_close(lp, l.to_vector<float>(), "loss");
    for (size_t i = 0; i < rg.size(); ++i) expect_close(pg[i], rg[i].to_vector<float>(), "gradient " + std::to_string(i));
    // Megatron's f and g: one all-reduce after the row-split product in the forward, and one for
    // the input's gradient through the column-split product in the backward; nothing gathered.
    EXPECT_EQ(st.collectives["all_reduce"], x_grad ? 2 : 1) << "x_grad " << x_grad;
    EXPECT_EQ(st.collectives.count("all_gather"), 0u);
    // Each rank holds half of W1, b1 and W2 (float32).
    const int64_t split = (16 * 32 + 32 + 32 * 16) * 4;
    EXPECT_EQ(st.rank_input_bytes, st.input_bytes - split / 2);
    // And its planned peak (inputs, outputs, temporaries: the hidden layer's values and gradients
    // are halves).
    EXPECT_GT(st.rank_peak_bytes, 0);
    EXPECT_LT(st.rank_peak_bytes, full_peak) << "per-rank peak " << st.rank_peak_bytes << ", one device's " << full_peak;
    std::printf("x_grad %d: inputs %lld -> %lld bytes per rank, planned peak %lld -> %lld\n", int(x_grad), (long long)st.input_bytes,
                (long long)st.rank_input_bytes, (long long)full_peak, (long long)st.rank_peak_bytes);
  }
  dist::clear_shardings();
}

nn::GPTConfig small_gpt() { return nn::GPTConfig{.vocab = 24, .block = 8, .embd = 16, .heads = 2, .layers = 2}; }

std::pair<Tensor, Tensor> tokens(int64_t b) {
  manual_seed(77);
  Tensor x = randint(0, 24, {b, 8}), y = randint(0, 24, {b, 8});
  sync();
  return {x, y};
}

TEST(Partition, TensorParallelGptMatchesTheUnshardedModel) {
  dist::clear_shardings();
  auto [x, y] = tokens(4);
  manual_seed(5);
  nn::GPT ref(small_gpt());
  manual_seed(5);
  nn::GPT tp(small_gpt());
  dist::Mesh mesh({{"model", 2}});
  tp.shard_tensor_parallel(mesh);
  // Forward loss and every gradient.
  Tensor l = ref.loss(x, y);
  l.backward();
  sync();
  Tensor lp = tp.loss(x, y);
  lp.backward();
  dist::PartitionStats st = dist::sync_partitioned(mesh);
  expect_close(lp, l.to_vector<float>(), "loss");
  auto rp = ref.named_parameters(), pp = tp.named_parameters();
  ASSERT_EQ(rp.size(), pp.size());
  for (size_t i = 0; i < rp.size(); ++i) expect_close(pp[i].second.grad(), rp[i].second.grad().to_vector<float>(), rp[i].first);
  // Per layer: the attention's and the MLP's row-split projections (forward) and the gradients of
  // their column-split inputs (backward): 4 all-reduces, nothing gathered (the heads stay split).
  EXPECT_EQ(st.collectives["all_reduce"], 4 * 2);
  EXPECT_EQ(st.collectives.count("all_gather"), 0u);
  EXPECT_LT(st.rank_input_bytes, st.input_bytes);
  // A few AdamW steps (clipping included): the same losses.
  optim::AdamW oa(ref.parameters(), {.lr = 1e-2}), ob(tp.parameters(), {.lr = 1e-2});
  oa.zero_grad();
  ob.zero_grad();
  for (int s = 0; s < 3; ++s) {
    Tensor la = ref.loss(x, y);
    la.backward();
    optim::clip_grad_norm(ref.parameters(), 1.0);
    oa.step();
    oa.zero_grad();
    const double va = la.item();
    Tensor lb = tp.loss(x, y);
    lb.backward();
    optim::clip_grad_norm(tp.parameters(), 1.0);
    ob.step();
    ob.zero_grad();
    dist::sync_partitioned(mesh);
    EXPECT_NEAR(lb.item(), va, 1e-5 * std::fabs(va)) << "step " << s + 1;
  }
  // The parameters too, but the qkv biases: the key bias' gradient is zero in exact arithmetic
  // (softmax ignores a shift per query), and AdamW turns its rounding noise into steps of the
  // learning rate's size (0.8e-3 here), whichever way the sum was split.
  auto ra = ref.named_parameters(), pa = tp.named_parameters();
  for (size_t i = 0; i < ra.size(); ++i)
    if (ra[i].first.find("qkv.bias") == std::string::npos) expect_close(pa[i].second, ra[i].second.to_vector<float>(), ra[i].first, 1e-4);
  dist::clear_shardings();
}

TEST(Partition, BatchShardingIsDataParallelism) {
  dist::clear_shardings();
  auto [x, y] = tokens(4);
  manual_seed(5);
  nn::GPT ref(small_gpt());
  manual_seed(5);
  nn::GPT dp(small_gpt());
  Tensor l = ref.loss(x, y);
  l.backward();
  sync();
  dist::Mesh mesh({{"data", 2}});
  dist::shard(x, mesh, {"data", none});
  dist::shard(y, mesh, {"data", none});
  Tensor lp = dp.loss(x, y);
  lp.backward();
  dist::PartitionStats st = dist::sync_partitioned(mesh);
  expect_close(lp, l.to_vector<float>(), "loss");
  auto rp = ref.named_parameters(), pp = dp.named_parameters();
  for (size_t i = 0; i < rp.size(); ++i) expect_close(pp[i].second.grad(), rp[i].second.grad().to_vector<float>(), rp[i].first);
  // Gradients summed over the ranks' rows: all-reduces, nothing gathered; each rank reads half the batch.
  EXPECT_GT(st.collectives["all_reduce"], 0);
  EXPECT_EQ(st.collectives.count("all_gather"), 0u);
  EXPECT_EQ(st.rank_input_bytes, st.input_bytes - 2 * 4 * 8 * 8 / 2);
  dist::clear_shardings();
}

// A 2 x 2 mesh: the batch split over "data", the GPT's weights over "model" (collectives over one
// axis run over its sub-groups of 2 ranks). With dropout and batch == heads,
// the attention dropout's draw [B, H, T, T] is cut along B over "data" and along H over "model":
// two block-index leaves of the same extent that must not be confused.
void data_times_model(int64_t batch, double dropout) {
  SCOPED_TRACE("batch " + std::to_string(batch) + ", dropout " + std::to_string(dropout));
  dist::clear_shardings();
  dist::Mesh grid({{"data", 2}, {"model", 2}});
  auto [x, y] = tokens(batch);
  nn::GPTConfig cfg = small_gpt();
  cfg.dropout = dropout;
  manual_seed(5);
  nn::GPT ref(cfg);
  manual_seed(5);
  nn::GPT tp(cfg);
  manual_seed(9);
  Tensor l = ref.loss(x, y);
  l.backward();
  sync();
  tp.shard_tensor_parallel(grid, "model");
  dist::shard(x, grid, {"data", none});
  dist::shard(y, grid, {"data", none});
  manual_seed(9);
  Tensor lp = tp.loss(x, y);
  lp.backward();
  dist::PartitionStats st = dist::sync_partitioned(grid);
  EXPECT_EQ(st.ranks, 4);
  expect_close(lp, l.to_vector<float>(), "loss");
  auto rp = ref.named_parameters(), pp = tp.named_parameters();
  for (size_t i = 0; i < rp.size(); ++i) expect_close(pp[i].second.grad(), rp[i].second.grad().to_vector<float>(), rp[i].first);
  // All-reduces only, over sub-groups: the 8 of the 2-way tensor-parallel GPT over "model", and
  // the gradients' sums over "data" (no all-gather: the emulation gathered every rank's value).
  EXPECT_GT(st.collectives["all_reduce"], 8);
  EXPECT_EQ(st.collectives.count("all_gather"), 0u);
  EXPECT_LT(st.rank_input_bytes, st.input_bytes);
  // Every rank ran each of the per-rank graph's collectives once, and they moved bytes.
  int per_rank = 0;
  for (const auto& [kind, k] : st.collectives) per_rank += k;
  ASSERT_EQ(st.rank_comm_calls.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(st.rank_comm_calls[size_t(r)], per_rank) << "rank " << r;
    EXPECT_GT(st.rank_comm_bytes[size_t(r)], 0) << "rank " << r;
  }
  dist::clear_shardings();
}

TEST(Partition, DataTimesModelMeshMatchesOneDevice) {
  dist::Mesh grid({{"data", 2}, {"model", 2}});
  EXPECT_EQ(grid.ranks(), 4);
  EXPECT_EQ(grid.coords(3), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(grid.coords(1), (std::vector<int64_t>{0, 1}));
  data_times_model(4, 0.0);
  data_times_model(2, 0.1);
}

// Sub-groups: on a 2 x 2 mesh a reduction over a dimension split on "data" is an all-reduce
// over the 2 ranks that differ only in "data" (stride 2: {0, 2}, {1, 3}), one over "model" over
// the 2 ranks that differ only in "model" (stride 1: {0, 1}, {2, 3}); each rank sends its group's
// bytes only. By hand, under ring algorithms (2 (n - 1) / n of the buffer for an all-reduce of n
// ranks): a.sum(0) of a float32[4, 6] split {data, none} all-reduces float32[6] (24 bytes) over 2
// ranks: 24 bytes sent; b.sum(1) of a float32[4, 6] split {none, model} all-reduces float32[4] (16
// bytes): 16 bytes. 40 bytes and 2 calls per rank. (Before sub-groups each was an all-gather of
// [1, 6] / [1, 4] over the 4 ranks: 3 x 24 + 3 x 16 = 120 bytes per rank.)
TEST(Partition, SubGroupCollectivesMoveTheirGroupsBytesOnly) {
  dist::clear_shardings();
  Tensor a = param({4, 6}, 21), b = param({4, 6}, 22);
  const std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>();
  dist::Mesh grid({{"data", 2}, {"model", 2}});
  dist::shard(a, grid, {"data", none});
  dist::shard(b, grid, {none, "model"});
  Tensor sa = a.sum({0}), sb = b.sum({1});
  dist::PartitionStats st = dist::sync_partitioned(grid);
  std::vector<float> wa(6, 0.0f), wb(4, 0.0f);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 6; ++j) wa[size_t(j)] += av[size_t(i * 6 + j)], wb[size_t(i)] += bv[size_t(i * 6 + j)];
  expect_close(sa, wa, "a.sum(0)");
  expect_close(sb, wb, "b.sum(1)");
  EXPECT_EQ(st.collectives["all_reduce"], 2);
  EXPECT_EQ(st.collectives.count("all_gather"), 0u);
  ASSERT_EQ(st.rank_comm_bytes.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(st.rank_comm_calls[size_t(r)], 2) << "rank " << r;
    EXPECT_EQ(st.rank_comm_bytes[size_t(r)], 24 + 16) << "rank " << r;
  }
  dist::clear_shardings();
}

// The rules off the Megatron path, on a weight split in 3 groups over 2 ranks (blocks of one
// row): a random draw cut to the rank's rows (a gather of its block indices), a reduction over
// the split dim (all-reduce, sum and max), a reshape that mixes splitting and merging (the split
// gathered back in group order first), and a concat along the split dim.
TEST(Partition, GroupsCutsGathersAndReductionsMatchOneDevice) {
  dist::PartitionStats st;
  auto run = [&st](const dist::Mesh* mesh) {
    dist::clear_shardings();
    Tensor w = param({6, 4}, 11), v = param({6, 4}, 12);
    if (mesh) {
      dist::shard(w, *mesh, {dist::Split("model", 3), none});
      dist::shard(v, *mesh, {dist::Split("model", 3), none});
    }
    manual_seed(9);
    Tensor r = rand({6, 4}) * w;                          // a replicated draw meets a split value
    Tensor s = r.sum({0}) + std::get<0>(w.max(0));        // reductions over the split dim
    Tensor m = (w + v).reshape({2, 12}).sum({1});         // [6, 4] -> [2, 12]: gathered first
    Tensor c = cat({w, v}, 0).sum({1});                   // concat of group-split inputs along the split dim
    std::vector<Tensor> out{r, s, m, c};
    if (mesh) st = dist::sync_partitioned(*mesh);
    else sync();
    std::vector<std::vector<float>> vals;
    for (const Tensor& t : out) vals.push_back(t.to_vector<float>());
    return vals;
  };
  auto ref = run(nullptr);
  dist::Mesh mesh({{"model", 2}});
  auto got = run(&mesh);
  // sum and max over the split rows (and the concat's row sums stay split); one gather for the reshape.
  EXPECT_GE(st.collectives["all_reduce"], 2);
  EXPECT_EQ(st.collectives["all_gather"], 1);
  const char* names[] = {"draw * w", "reductions", "mixed reshape", "concat"};
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(got[i].size(), ref[i].size()) << names[i];
    for (size_t k = 0; k < ref[i].size(); ++k) EXPECT_NEAR(got[i][k], ref[i][k], 1e-5) << names[i] << "[" << k << "]";
  }
  dist::clear_shardings();
}

TEST(Partition, UnsupportedLayoutsAreClearErrors) {
  dist::clear_shardings();
  dist::Mesh mesh({{"model", 2}});
  Tensor a = param({8, 16}, 1), w = param({16, 32}, 2);
  dist::shard(a, mesh, {"model", none});  // rows of a and columns of w over one axis: no layout holds both
  dist::shard(w, mesh, {none, "model"});
  Tensor y;
  {
    Scope s("block0");
    Scope t("attn");
    y = matmul(a, w);
  }
  try {
    dist::sync_partitioned(mesh);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("[partition] matmul in 'block0.attn'"), std::string::npos) << m;
    EXPECT_NE(m.find("float32[8, 16] sharded {model, none}"), std::string::npos) << m;
    EXPECT_NE(m.find("meets float32[16, 32] sharded {none, model}"), std::string::npos) << m;
    EXPECT_NE(m.find("supported:"), std::string::npos) << m;
  }
  // Annotations are checked where they are made.
  EXPECT_THROW(dist::shard(w, mesh, {none, "data"}), Error);       // no such axis
  EXPECT_THROW(dist::shard(w, mesh, {"model", "model"}), Error);   // an axis twice
  EXPECT_THROW(dist::shard(param({3, 4}, 1), mesh, {"model", none}), Error);  // 3 rows over 2 ranks
  try {
    dist::shard(w, mesh, {"model"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("one entry per dimension"), std::string::npos) << e.what();
  }
  sync();
  dist::clear_shardings();
}

}  // namespace
}  // namespace tessera
