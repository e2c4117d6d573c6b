// The tensor model end to end: compile cache, host syncs, donation, RNG, errors, null device.
#include <gtest/gtest.h>

#include "test_util.h"

#include "tensor/tensor_impl.h"
#include "tessera/tessera.h"

namespace ts = tessera;
using ts::DType;

namespace {
int64_t compiled() { return ts::metrics().graphs_compiled; }
int64_t hits() { return ts::metrics().cache_hits; }
std::string message_of(const std::function<void()>& f) { return tessera::testing::error_message(f); }
}  // namespace

TEST(Cache, RepeatingLoopCompilesOnce) {
  auto x = ts::from_vector<float>({1, -2, 0.5f, 3}, {4});
  int64_t c0 = compiled(), h0 = hits();
  for (int i = 0; i < 20; ++i) {
    x = x * 2 + 1;
    ts::sync();
  }
  EXPECT_EQ(compiled() - c0, 1);
  EXPECT_EQ(hits() - h0, 19);
  std::vector<float> want = {1, -2, 0.5f, 3};
  for (int i = 0; i < 20; ++i)
    for (auto& w : want) w = w * 2 + 1;
  EXPECT_EQ(x.to_vector<float>(), want);
}

TEST(Cache, DifferentOpOrConstantGetsItsOwnGraph) {
  auto x = ts::from_vector<float>({1, 2, 3}, {3});
  int64_t c0 = compiled();
  auto a = x * 2 + 1;
  ts::sync();
  auto b = x * 3 - 1;
  ts::sync();
  EXPECT_EQ(compiled() - c0, 2);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{3, 5, 7}));
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{2, 5, 8}));
  // The same structure on other data hits the cache.
  auto y = ts::from_vector<float>({10, 20, 30}, {3});
  int64_t c1 = compiled();
  auto d = y * 3 - 1;
  EXPECT_EQ(d.to_vector<float>(), (std::vector<float>{29, 59, 89}));
  EXPECT_EQ(compiled(), c1);
}

TEST(Cache, ChangingAShapeRecompiles) {
  auto x = ts::from_vector<float>({1, 2, 3}, {3});
  (x + 1).to_vector<float>();
  int64_t c0 = compiled();
  (x + 1).to_vector<float>();
  EXPECT_EQ(compiled(), c0);
  auto z = ts::from_vector<float>({1, 2, 3, 4}, {4});
  (z + 1).to_vector<float>();
  EXPECT_EQ(compiled(), c0 + 1);
  // The metrics say why: the input's shape changed.
  std::string why = ts::metrics().compile_reasons.back();
  EXPECT_NE(why.find("input 0 changed from float32[3] to float32[4]"), std::string::npos) << why;
  EXPECT_NE(ts::metrics().report().find("why graphs were compiled"), std::string::npos);
}

TEST(Sync, ReadingCountsOneHostSyncAndComputesEverythingOnce) {
  auto x = ts::from_vector<float>({1, 2, 3}, {3});
  auto a = x.exp(), b = (x * x).sum();
  int64_t s0 = ts::metrics().host_syncs, st0 = ts::metrics().steps_launched;
  EXPECT_FALSE(a.is_realized());
  double v = b.item();  // realizes a too: one graph
  EXPECT_EQ(v, 14);
  EXPECT_TRUE(a.is_realized());
  EXPECT_EQ(ts::metrics().host_syncs - s0, 1);
  int64_t st1 = ts::metrics().steps_launched;
  a.to_vector<float>();  // nothing left to compute
  EXPECT_EQ(ts::metrics().steps_launched, st1);
  EXPECT_GT(st1, st0);
  EXPECT_EQ(ts::metrics().host_syncs - s0, 2);
  EXPECT_NE(a.str().find("dtype=float32"), std::string::npos);
}

TEST(Sync, DeadPendingTensorsAreNotComputed) {
  auto x = ts::from_vector<float>({1, 2}, {2});
  int64_t st0 = ts::metrics().steps_launched;
  { auto unused = (x + 5).exp().sum(); }
  ts::sync();
  EXPECT_EQ(ts::metrics().steps_launched, st0);
}

TEST(InPlace, RebindsOnlyThisTensor) {
  auto x = ts::from_vector<float>({1, 2, 3}, {3});
  auto y = x * 1;  // a different tensor computed from x's current value
  auto alias = x;  // the same tensor (handles share it, like PyTorch)
  x.add_(10);
  x.mul_(2);
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{22, 24, 26}));
  EXPECT_EQ(alias.to_vector<float>(), (std::vector<float>{22, 24, 26}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  auto i = ts::from_vector<int64_t>({1, 2}, {2}, {DType::Int64});
  EXPECT_THROW(i.add_(0.5), ts::Error);  // float result cannot go back into int64
  auto v = x.reshape({3, 1});
  EXPECT_THROW(v.add_(1), ts::Error);  // in-place on a view is refused for now
  x.copy_(ts::full({1}, 7));
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{7, 7, 7}));
}

TEST(InPlace, DonationKeepsTheBufferAndThePeak) {
  const int64_t n = 16 << 20;  // 16 Mi floats = 64 MiB
  auto x = ts::zeros({n});
  ts::sync();
  void* addr = ts::detail::impl_of(x)->buffer->data;
  for (int i = 0; i < 3; ++i) {
    ts::reset_peak_bytes();
    int64_t start = ts::metrics().peak_bytes;
    x.add_(1);
    ts::sync();
    EXPECT_LE(ts::metrics().peak_bytes - start, 4096) << "iteration " << i;
    EXPECT_EQ(ts::detail::impl_of(x)->buffer->data, addr);
  }
  auto v = x.slice(0, n - 2, n).to_vector<float>();
  EXPECT_EQ(v, (std::vector<float>{3, 3}));
}

TEST(InPlace, NoDonationWhileAnotherTensorReadsTheOldValue) {
  auto x = ts::from_vector<float>({1, 2, 3, 4}, {4});
  ts::sync();
  void* addr = ts::detail::impl_of(x)->buffer->data;
  auto keep = x;          // same impl: no extra owner of the buffer
  auto other = x * 1.0;   // reads x's old value in the same graph
  auto view = x.transpose(0, 0);
  x.add_(1);
  ts::sync();
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{2, 3, 4, 5}));
  EXPECT_EQ(other.to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(view.to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
  (void)addr;
  // A realized tensor still holding the old buffer prevents donation.
  auto y = ts::from_vector<float>({5, 6}, {2});
  auto y2 = ts::detail::from_buffer(ts::detail::impl_of(y)->buffer, y.shape(), y.dtype());
  y.mul_(2.0);
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{10, 12}));
  EXPECT_EQ(y2.to_vector<float>(), (std::vector<float>{5, 6}));
}

// A tensor's numbers depend on its place in trace order, not on how syncs grouped the draws:
// three draws synced together equal the same draws synced one by one (a dead draw included).
TEST(Random, NumbersDoNotDependOnHowSyncsGroupDraws) {
  auto draw = [](bool sync_each) {
    ts::manual_seed(7);
    std::vector<ts::Tensor> kept;
    for (int k = 0; k < 4; ++k) {
      ts::Tensor t = k == 2 ? ts::randn({5, 3}) : ts::rand({64});
      if (k != 1) kept.push_back(t);  // draw 1 dies unrealized
      if (sync_each) ts::sync();
    }
    ts::sync();
    std::vector<std::vector<float>> v;
    for (auto& t : kept) v.push_back(t.to_vector<float>());
    return v;
  };
  auto together = draw(false), apart = draw(true);
  EXPECT_EQ(together, apart);
  EXPECT_NE(together[0], together[2]);
}

TEST(Random, OffsetAdvancesWithoutRecompiling) {
  ts::manual_seed(42);
  auto a = ts::rand({1000});
  ts::sync();
  int64_t c0 = compiled();
  auto b = ts::rand({1000});
  ts::sync();
  EXPECT_EQ(compiled(), c0);  // same graph, new offset at run time
  auto va = a.to_vector<float>(), vb = b.to_vector<float>();
  EXPECT_NE(va, vb);
  double mean = 0;
  for (float v : va) {
    EXPECT_GE(v, 0.f);
    EXPECT_LT(v, 1.f);
    mean += v / 1000;
  }
  EXPECT_NEAR(mean, 0.5, 0.05);
  ts::manual_seed(42);
  auto c = ts::rand({1000});
  EXPECT_EQ(c.to_vector<float>(), va);  // same seed, same numbers
}

TEST(Random, TwoDrawsInOneGraphDiffer) {
  ts::manual_seed(7);
  auto m1 = ts::rand({64}) > 0.5, m2 = ts::rand({64}) > 0.5;  // two dropout-like masks
  auto same = (m1 == m2).to(DType::Int64).sum();
  EXPECT_LT(same.item(), 64);
  auto n = ts::randn({20000});
  auto mean = n.sum().item() / 20000, var = (n * n).sum().item() / 20000;
  EXPECT_NEAR(mean, 0, 0.03);
  EXPECT_NEAR(var, 1, 0.05);
}

TEST(Errors, BadInputIsAClearError) {
  auto a = ts::zeros({2, 3}), b = ts::zeros({4, 5});
  std::string m = message_of([&] { (void)a.matmul(b); });
  EXPECT_EQ(m.rfind("[matmul] shapes [2, 3] and [4, 5]", 0), 0u) << m;
  m = message_of([&] { (void)(a + b); });
  EXPECT_EQ(m.rfind("[add] shapes [2, 3] and [4, 5] cannot be broadcast", 0), 0u) << m;
  m = message_of([&] { (void)a.sum({2}); });
  EXPECT_EQ(m.rfind("[sum] dimension 2 out of range", 0), 0u) << m;
  m = message_of([&] { (void)a.reshape({4, 2}); });
  EXPECT_EQ(m.rfind("[reshape] cannot reshape float32[2, 3] to [4, 2]", 0), 0u) << m;
  m = message_of([&] { (void)ts::where(a, a, a); });
  EXPECT_EQ(m.rfind("[where] condition must be bool", 0), 0u) << m;
  m = message_of([&] { (void)ts::gather(a, 1, a); });
  EXPECT_EQ(m.rfind("[gather] index must be int32 or int64", 0), 0u) << m;
  m = message_of([&] { (void)(a > 0).sum().to(DType::Bool).exp().item(); });
  EXPECT_EQ(m, "(no error)");  // exp of bool promotes to float32, like PyTorch
  m = message_of([&] { (void)-(a > 0); });
  EXPECT_EQ(m.rfind("[neg] not defined for bool", 0), 0u) << m;
  m = message_of([&] { (void)ts::cat({a, b}, 0); });
  EXPECT_EQ(m.rfind("[cat] tensors must agree except along dimension 0", 0), 0u) << m;
  m = message_of([&] { (void)a.item(); });
  EXPECT_EQ(m.rfind("[item] needs a one-element tensor", 0), 0u) << m;
  m = message_of([&] { (void)ts::from_vector<float>({1, 2}, {3}); });
  EXPECT_EQ(m.rfind("[from_vector] 2 values do not fill shape [3]", 0), 0u) << m;
  {
    ts::Scope s("blocks.0.attn");
    m = message_of([&] { (void)a.matmul(b); });
    EXPECT_NE(m.find("(in scope 'blocks.0.attn')"), std::string::npos) << m;
  }
}

TEST(Errors, OutOfRangeGatherIsReportedAtSyncWithScope) {
  auto src = ts::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  auto idx = ts::from_vector<int64_t>({0, 3}, {2, 1}, {DType::Int64});
  std::string m;
  {
    ts::Scope s("embed");
    auto g = ts::gather(src, 1, idx);  // traced fine: values are not known yet
    m = message_of([&] { ts::sync(); });
  }
  EXPECT_EQ(m.rfind("[gather] index 3 out of range [0, 3) along dimension 1", 0), 0u) << m;
  EXPECT_NE(m.find("(in scope 'embed')"), std::string::npos) << m;
  // The runtime stays usable.
  EXPECT_EQ((src + 1).sum().item(), 27);
}

TEST(Errors, CrossDeviceAndNullDevice) {
  auto c = ts::zeros({3});
  ts::sync();  // nothing pending on cpu below
  auto n = ts::zeros({3}, {DType::Float32, ts::Device("null")});
  std::string m = message_of([&] { (void)(c + n); });
  EXPECT_EQ(m.rfind("[add] tensors on different devices: cpu:0 and null:0", 0), 0u) << m;
  // The null device compiles the graph and refuses to run it.
  int64_t c0 = compiled();
  auto y = (n * 2).exp().sum();
  m = message_of([&] { (void)y.item(); });
  EXPECT_EQ(compiled(), c0 + 1);
  EXPECT_NE(m.find("device 'null:0' compiles graphs but cannot run them"), std::string::npos) << m;
  m = message_of([&] { (void)ts::from_vector<float>({1}, {1}, {DType::Float32, ts::Device("null")}); });
  EXPECT_NE(m.find("holds no memory"), std::string::npos) << m;
}
