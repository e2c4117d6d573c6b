// The public API's libtorch shape (tensor.h states the rule): every method is its free
// function with libtorch's defaults; +=, -=, *=, /= are in-place ops; x.index({...}) and
// index_put_ follow Python's indexing, checked against expected values derived by hand from
// index arithmetic; item<T>; max/min(dim) with values and indices; the losses' options.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "test_util.h"
#include "tessera/ops.h"
#include "tessera/tessera.h"

namespace tessera {
namespace {

using indexing::Ellipsis;
using indexing::None;
using indexing::Slice;
using testing::grad_check;
using testing::make_tensor;
using testing::random_tensor;
using V = std::vector<double>;

constexpr DType kF32 = DType::Float32, kF64 = DType::Float64, kI64 = DType::Int64;

Tensor ints(const std::vector<int64_t>& v, const Shape& s) { return from_vector<int64_t>(v, s, {kI64, Device("cpu")}); }

// Expects a tessera::Error whose message starts with `prefix` and contains each of `parts`.
void expect_error(const std::function<void()>& fn, const std::string& prefix, const std::vector<std::string>& parts = {}) {
  std::string m = testing::error_message([&] {
    fn();
    sync();
  });
  EXPECT_EQ(m.rfind(prefix, 0), 0u) << "message: " << m;
  for (const auto& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "missing '" << p << "' in: " << m;
}

// The values of an output of shape `s` whose element at multi-index o is src[at(o)].
V expected(const Shape& s, const V& src, const std::function<int64_t(const std::vector<int64_t>&)>& at) {
  V out;
  std::vector<int64_t> o(s.size(), 0);
  for (int64_t n = 0; n < numel(s); ++n) {
    out.push_back(src[size_t(at(o))]);
    for (int64_t d = int64_t(s.size()) - 1; d >= 0 && ++o[size_t(d)] == s[size_t(d)]; --d) o[size_t(d)] = 0;
  }
  return out;
}

// ------------------------------------------------------------------ methods

TEST(Api, MethodsAreTheirFreeFunctions) {
  Tensor x = random_tensor({3, 4}, kF32, 1, -2, 2), p = testing::random_positive({3, 4}, kF32, 2);
  Tensor m = make_tensor({1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1, 0}, {3, 4}, DType::Bool), e = random_tensor({3, 4}, kF32, 3);
  Tensor idx = ints({2, 0}, {2});
  struct Pair {
    const char* name;
    Tensor method, free;
  };
  const std::vector<Pair> pairs = {
      {"neg", x.neg(), neg(x)}, {"unary -", -x, neg(x)}, {"abs", x.abs(), abs(x)}, {"sign", x.sign(), sign(x)},
      {"sqrt", p.sqrt(), sqrt(p)}, {"rsqrt", p.rsqrt(), rsqrt(p)}, {"square", x.square(), square(x)},
      {"reciprocal", p.reciprocal(), reciprocal(p)}, {"exp", x.exp(), exp(x)}, {"log", p.log(), log(p)},
      {"sin", x.sin(), sin(x)}, {"cos", x.cos(), cos(x)}, {"tanh", x.tanh(), tanh(x)}, {"sigmoid", x.sigmoid(), sigmoid(x)},
      {"relu", x.relu(), relu(x)}, {"floor", x.floor(), floor(x)}, {"ceil", x.ceil(), ceil(x)}, {"round", x.round(), round(x)},
      {"pow t", p.pow(e), pow(p, e)}, {"pow s", p.pow(1.5), pow(p, 1.5)}, {"clamp", x.clamp(-1, 1), clamp(x, -1, 1)},
      {"masked_fill", x.masked_fill(m, 7), masked_fill(x, m, 7)}, {"sum", x.sum({1}, true), sum(x, {1}, true)},
      {"mean", x.mean({0}), mean(x, {0})}, {"amax", x.amax({1}), amax(x, {1})}, {"amin", x.amin({0}, true), amin(x, {0}, true)},
      {"max", x.max(), max(x)}, {"min", x.min(), min(x)}, {"argmax", x.argmax(1), argmax(x, 1)}, {"argmin", x.argmin(), argmin(x)},
      {"logsumexp", x.logsumexp({1}), logsumexp(x, {1})}, {"softmax", x.softmax(1), softmax(x, 1)},
      {"log_softmax", x.log_softmax(0), log_softmax(x, 0)}, {"reshape", x.reshape({2, 6}), reshape(x, {2, 6})},
      {"view", x.view({4, -1}), reshape(x, {4, 3})}, {"flatten", x.flatten(), flatten(x)},
      {"squeeze", x.reshape({3, 1, 4}).squeeze(), squeeze(x.reshape({3, 1, 4}))},
      {"squeeze d", x.reshape({3, 1, 4}).squeeze(1), squeeze(x.reshape({3, 1, 4}), 1)},
      {"unsqueeze", x.unsqueeze(-1), unsqueeze(x, -1)}, {"permute", x.permute({1, 0}), permute(x, {1, 0})},
      {"transpose", x.transpose(0, 1), transpose(x, 0, 1)}, {"expand", x.reshape({3, 1, 4}).expand({3, 2, 4}), expand(x.reshape({3, 1, 4}), {3, 2, 4})},
      {"repeat", x.repeat({2, 1}), repeat(x, {2, 1})}, {"slice", x.slice(1, 1, 4, 2), slice(x, 1, 1, 4, 2)},
      {"narrow", x.narrow(0, 1, 2), narrow(x, 0, 1, 2)}, {"gather", x.gather(1, ints({0, 3, 1}, {3, 1})), gather(x, 1, ints({0, 3, 1}, {3, 1}))},
      {"index_select", x.index_select(1, idx), index_select(x, 1, idx)}, {"matmul", x.matmul(e.transpose(0, 1)), matmul(x, e.transpose(0, 1))},
      {"index", x.index({Slice(), 1}), index(x, {Slice(), 1})}, {"contiguous", x.contiguous(), x},
  };
  for (const Pair& pr : pairs) {
    SCOPED_TRACE(pr.name);
    ASSERT_EQ(pr.method.shape(), pr.free.shape());
    EXPECT_EQ(pr.method.dtype(), pr.free.dtype());
    EXPECT_EQ(pr.method.to_vector<double>(), pr.free.to_vector<double>());
  }
  auto [mv, mi] = x.max(1);
  auto [fv, fi] = max(x, 1);
  EXPECT_EQ(mv.to_vector<double>(), fv.to_vector<double>());
  EXPECT_EQ(mi.to_vector<int64_t>(), fi.to_vector<int64_t>());
}

// libtorch's defaults, by hand values.
TEST(Api, MethodDefaultsAreLibtorchs) {
  Tensor x = make_tensor({1, -2, 3, 4, 5, -6}, {2, 3});
  EXPECT_EQ(x.sum().item(), 5);           // all dims
  EXPECT_NEAR(x.mean().item(), 5.0 / 6, 1e-7);
  EXPECT_EQ(x.sum().shape(), Shape{});    // keepdim = false
  EXPECT_EQ(x.flatten().shape(), Shape{6});  // start 0, end -1
  EXPECT_EQ(x.argmax().item<int64_t>(), 4);  // over the flattened tensor
  EXPECT_EQ(x.clamp(0).to_vector<double>(), (V{1, 0, 3, 4, 5, 0}));  // max absent
  EXPECT_EQ(x.clamp(std::nullopt, 2).to_vector<double>(), (V{1, -2, 2, 2, 2, -6}));
  EXPECT_EQ(x.reshape({1, 2, 1, 3}).squeeze().shape(), (Shape{2, 3}));
  EXPECT_EQ(x.view({-1}).shape(), Shape{6});
  EXPECT_EQ(x.transpose(0, 1).to_vector<double>(), (V{1, 4, -2, 5, 3, -6}));
  EXPECT_TRUE(x.contiguous().is_same(x));  // a no-op
}

// ------------------------------------------------------------------ in-place operators

TEST(Api, CompoundAssignmentIsInPlace) {
  Tensor a = make_tensor({1, 2, 3}, {3});
  Tensor alias = a;  // another handle on the same tensor sees every update
  Tensor& r = (a += make_tensor({10, 20, 30}, {3}));
  EXPECT_EQ(&r, &a);
  EXPECT_EQ(a.to_vector<double>(), (V{11, 22, 33}));
  a -= 1;
  EXPECT_EQ(a.to_vector<double>(), (V{10, 21, 32}));
  a *= 2;
  a /= make_tensor({2, 2, 4}, {3});
  EXPECT_EQ(a.to_vector<double>(), (V{10, 21, 16}));
  a /= 2;
  a -= make_tensor({1}, {1});  // broadcast
  a *= make_tensor({2, 2, 2}, {3});
  a += 0.5;
  EXPECT_EQ(alias.to_vector<double>(), (V{8.5, 19.5, 14.5}));
  EXPECT_EQ(a.dtype(), kF32);

  Tensor m = zeros({2, 3});
  m += make_tensor({1, 2, 3}, {3});
  EXPECT_EQ(m.to_vector<double>(), (V{1, 2, 3, 1, 2, 3}));
  Tensor i = ints({1, 2}, {2});
  i *= 3;  // stays int64
  EXPECT_EQ(i.dtype(), kI64);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{3, 6}));
}

TEST(Api, FillAndZero) {
  Tensor a = make_tensor({1, 2, 3}, {3});
  Tensor alias = a;
  a.fill_(2.5);
  EXPECT_EQ(alias.to_vector<double>(), (V{2.5, 2.5, 2.5}));
  a.zero_();
  EXPECT_EQ(alias.to_vector<double>(), (V{0, 0, 0}));
  Tensor i = ints({1, 2}, {2});
  i.fill_(-7.9);  // truncated like PyTorch's cast
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{-7, -7}));
  Tensor v = a.slice(0, 0, 2);
  expect_error([&] { v.zero_(); }, "[fill_]", {"view"});
}

TEST(Api, CompoundAssignmentErrors) {
  Tensor a = zeros({2, 3});
  Tensor v = a.transpose(0, 1);
  expect_error([&] { v += 1; }, "[add_]", {"view"});
  expect_error([&] { a += zeros({4}); }, "[add]", {"[2, 3]", "[4]"});
  expect_error([&] { a *= zeros({3, 2, 3}); }, "[mul_]", {"[3, 2, 3]"});  // the result would grow
  Tensor i = ints({1, 2}, {2});
  expect_error([&] { i /= 2; }, "[div_]", {"float32", "int64"});  // true division gives floats
  Tensor p = zeros({2});
  p.requires_grad_();
  expect_error([&] { p -= 1; }, "[sub_]", {"leaf"});
  {
    NoGradGuard ng;
    p -= 1;  // an optimizer's update
  }
  EXPECT_EQ(p.to_vector<double>(), (V{-1, -1}));
  EXPECT_TRUE(p.is_leaf());
}

TEST(Api, CompoundAssignmentRecordsHistory) {
  Tensor x = make_tensor({1, 2, 3}, {3}, kF64);
  x.requires_grad_();
  Tensor y = x * 3.0;
  y += x * x;  // y = 3x + x^2
  y *= 2.0;    // y = 6x + 2x^2
  y.sum().backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (V{10, 14, 18}));  // 6 + 4x
}

// ------------------------------------------------------------------ indexing

TEST(Api, IndexReadsLikePython) {
  V src(60);
  for (size_t k = 0; k < src.size(); ++k) src[k] = double(k);
  Tensor x = make_tensor(src, {3, 4, 5});  // element (i, j, k) holds 20 i + 5 j + k
  using O = std::vector<int64_t>;
  struct Case {
    const char* python;
    Tensor got;
    Shape shape;
    std::function<int64_t(const O&)> at;
  };
  const std::vector<Case> cases = {
      {"x[:, 0]", x.index({Slice(), 0}), {3, 5}, [](const O& o) { return 20 * o[0] + o[1]; }},
      {"x[1:, ::2, 3]", x.index({Slice(1, None), Slice(None, None, 2), 3}), {2, 2}, [](const O& o) { return 20 * (o[0] + 1) + 10 * o[1] + 3; }},
      {"x[-1]", x.index({-1}), {4, 5}, [](const O& o) { return 40 + 5 * o[0] + o[1]; }},
      {"x[..., 1]", x.index({Ellipsis, 1}), {3, 4}, [](const O& o) { return 20 * o[0] + 5 * o[1] + 1; }},
      {"x[0, ..., -2:]", x.index({0, Ellipsis, Slice(-2, None)}), {4, 2}, [](const O& o) { return 5 * o[0] + 3 + o[1]; }},
      {"x[None, 0, None]", x.index({None, 0, None}), {1, 1, 4, 5}, [](const O& o) { return 5 * o[2] + o[3]; }},
      {"x[::2, None, 1:3]", x.index({Slice(None, None, 2), None, Slice(1, 3)}), {2, 1, 2, 5},
       [](const O& o) { return 40 * o[0] + 5 * (o[2] + 1) + o[3]; }},
      {"x[1:-1, -3:10, 4:0]", x.index({Slice(1, -1), Slice(-3, 10), Slice(4, 0)}), {1, 3, 0}, [](const O&) { return 0; }},
      {"x[2, 3, 4]", x.index({2, 3, 4}), {}, [](const O&) { return 59; }},
      {"x[...]", x.index({Ellipsis}), {3, 4, 5}, [](const O& o) { return 20 * o[0] + 5 * o[1] + o[2]; }},
      {"x[:, [2, -1, 0]]", x.index({Slice(), ints({2, -1, 0}, {3})}), {3, 3, 5},
       [](const O& o) { return 20 * o[0] + 5 * std::vector<int64_t>{2, 3, 0}[size_t(o[1])] + o[2]; }},
      {"x[[[0, 2], [1, 1]], 1:, 4]", x.index({ints({0, 2, 1, 1}, {2, 2}), Slice(1, None), 4}), {2, 2, 3},
       [](const O& o) { return 20 * std::vector<int64_t>{0, 2, 1, 1}[size_t(2 * o[0] + o[1])] + 5 * (o[2] + 1) + 4; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.python);
    ASSERT_EQ(c.got.shape(), c.shape) << shape_str(c.got.shape());
    EXPECT_EQ(c.got.to_vector<double>(), expected(c.shape, src, c.at));
  }
  // A result of slices is a view: writing through it is refused like any view's.
  Tensor row = x.index({0});
  expect_error([&] { row += 1; }, "[add_]", {"view"});
}

TEST(Api, IndexErrorsNameTheOpAndShapes) {
  Tensor x = zeros({3, 4});
  expect_error([&] { x.index({3}); }, "[index]", {"out of bounds", "dim 0", "[3, 4]", "{3}"});
  expect_error([&] { x.index({0, -5}); }, "[index]", {"out of bounds", "dim 1"});
  expect_error([&] { x.index({0, 0, 0}); }, "[index]", {"too many", "[3, 4]"});
  expect_error([&] { x.index({Ellipsis, 0, Ellipsis}); }, "[index]", {"Ellipsis"});
  expect_error([&] { x.index({Slice(None, None, 0)}); }, "[index]", {"step", "Slice(None, None, 0)"});
  expect_error([&] { x.index({x > 0.0}); }, "[index]", {"bool"});
  expect_error([&] { x.index({x}); }, "[index]", {"integers", "float32[3, 4]"});
  expect_error([&] { x.index({ints({0}, {1}), ints({1}, {1})}); }, "[index]", {"one tensor index"});
  expect_error([] { Tensor().index({0}); }, "[index]", {"undefined"});
}

TEST(Api, IndexGradients) {
  testing::GradCheckOptions o;
  EXPECT_TRUE(grad_check([](const std::vector<Tensor>& in) { return in[0].index({Slice(1, None), Slice(None, None, 2), None}); },
                         {random_tensor({4, 5}, kF64, 7)}));
  // A repeated tensor index accumulates its gradient.
  Tensor idx = ints({1, 1, 0}, {3});
  EXPECT_TRUE(grad_check([idx](const std::vector<Tensor>& in) { return in[0].index({Ellipsis, idx}); }, {random_tensor({2, 3}, kF64, 8)}));
}

TEST(Api, IndexPutWritesWhereIndexReads) {
  Tensor x = zeros({3, 4});
  x.index_put_({0}, 5);
  x.index_put_({Slice(), Slice(1, None, 2)}, make_tensor({1, 2}, {2}));  // broadcast over rows
  x.index_put_({Ellipsis, 0}, make_tensor({7, 8, 9}, {3}));
  x.index_put_({None, -1, Slice(2, None)}, make_tensor({-1, -2}, {1, 2}));
  EXPECT_EQ(x.to_vector<double>(), (V{7, 1, 5, 2, 8, 1, 0, 2, 9, 1, -1, -2}));
  x.index_put_({Slice(4, None)}, 3);  // an empty region: nothing changes
  EXPECT_EQ(x.to_vector<double>()[0], 7);

  // Against a hand loop: rows 1 and 3, columns 0 and 3 of a random matrix.
  Tensor a = random_tensor({4, 6}, kF32, 9), v = random_tensor({2, 2}, kF32, 10);
  V av = a.to_vector<double>(), vv = v.to_vector<double>(), want = av;
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 2; ++c) want[size_t((1 + 2 * r) * 6 + 3 * c)] = vv[size_t(2 * r + c)];
  Tensor b = index_put(a, {Slice(1, None, 2), Slice(None, 5, 3)}, v);  // functional: a unchanged
  EXPECT_EQ(b.to_vector<double>(), want);
  EXPECT_EQ(a.to_vector<double>(), av);

  Tensor i = ints({1, 2, 3}, {3});
  i.index_put_({1}, 7.9);  // cast to the tensor's dtype, as PyTorch does
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{1, 7, 3}));
  EXPECT_EQ(i.dtype(), kI64);
}

TEST(Api, IndexPutErrorsAndGradients) {
  Tensor x = zeros({3, 4});
  expect_error([&] { x.index_put_({0}, zeros({3})); }, "[index_put]", {"[3]", "[4]"});
  expect_error([&] { x.index_put_({ints({0}, {1})}, 1); }, "[index_put]", {"tensor indices"});
  expect_error([&] { x.index_put_({0, 4}, 1); }, "[index_put]", {"out of bounds"});
  Tensor v = x.index({0});
  expect_error([&] { v.index_put_({0}, 1); }, "[index_put_]", {"view"});
  Tensor p = zeros({2});
  p.requires_grad_();
  expect_error([&] { p.index_put_({0}, 1); }, "[index_put_]", {"leaf"});

  // d/dx is 1 outside the written region and 0 inside; d/dvalue sums over the broadcast.
  EXPECT_TRUE(grad_check([](const std::vector<Tensor>& in) { return index_put(in[0], {Slice(1, None, 2), Slice(None, 5, 3)}, in[1]); },
                         {random_tensor({4, 6}, kF64, 11), random_tensor({2}, kF64, 12)}));
}

// ------------------------------------------------------------------ item<T>, max/min(dim)

TEST(Api, ItemOfType) {
  const int64_t big = (int64_t(1) << 53) + 1;  // not a double
  Tensor b = ints({big}, {});
  EXPECT_EQ(b.item<int64_t>(), big);
  EXPECT_NE(int64_t(b.item()), big);  // item() stays double, as before
  EXPECT_EQ(make_tensor({0.1}, {1}).item<float>(), 0.1f);
  EXPECT_EQ(make_tensor({-7}, {1, 1}, DType::Int32).item<int32_t>(), -7);
  EXPECT_EQ(make_tensor({200}, {}, DType::Int32).item<uint8_t>(), 200);
  EXPECT_TRUE(make_tensor({0.5}, {}).item<bool>());
  EXPECT_FALSE(zeros({}).item<bool>());
  expect_error([] { zeros({2}).item<float>(); }, "[item]", {"[2]"});
}

TEST(Api, MaxMinAlongADimGiveValuesAndIndices) {
  Tensor x = make_tensor({1, 5, 5, 7, 2, 7}, {2, 3});
  auto [v, i] = x.max(1);  // ties: the first
  EXPECT_EQ(v.to_vector<double>(), (V{5, 7}));
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(i.dtype(), kI64);
  auto [mv, mi] = min(x, 0, true);
  EXPECT_EQ(mv.shape(), (Shape{1, 3}));
  EXPECT_EQ(mv.to_vector<double>(), (V{1, 2, 5}));
  EXPECT_EQ(mi.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 0}));
  auto [nv, ni] = x.min(-1);
  EXPECT_EQ(nv.to_vector<double>(), (V{1, 2}));
  EXPECT_EQ(ni.to_vector<int64_t>(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(x.max().item(), 7);
  EXPECT_EQ(x.min().item(), 1);
  expect_error([&] { x.max(2); }, "[max]", {"[2, 3]"});
  expect_error([] { zeros({2, 0}).min(1); }, "[min]", {"empty", "[2, 0]"});

  // The values' gradient goes to the element the index names.
  Tensor y = make_tensor({1, 5, 5, 7, 2, 7}, {2, 3}, kF64);
  y.requires_grad_();
  std::get<0>(y.max(1)).sum().backward();
  EXPECT_EQ(y.grad().to_vector<double>(), (V{0, 1, 0, 1, 0, 0}));
}

// ------------------------------------------------------------------ losses

// -log softmax(row)[t] in float64.
double nll_of_row(const V& logits, int64_t row, int64_t C, int64_t t) {
  double m = -INFINITY, z = 0;
  for (int64_t c = 0; c < C; ++c) m = std::max(m, logits[size_t(row * C + c)]);
  for (int64_t c = 0; c < C; ++c) z += std::exp(logits[size_t(row * C + c)] - m);
  return m + std::log(z) - logits[size_t(row * C + t)];
}

TEST(Api, CrossEntropyReductions) {
  const int64_t N = 5, C = 4;
  V lv = testing::random_values(N * C, kF32, 13, -3, 3);
  std::vector<int64_t> tv{3, -100, 0, 2, 3};
  Tensor L = make_tensor(lv, {N, C}), T = ints(tv, {N});
  V per(N, 0);
  double total = 0;
  for (int64_t n = 0; n < N; ++n)
    if (tv[size_t(n)] != -100) total += per[size_t(n)] = nll_of_row(lv, n, C, tv[size_t(n)]);
  EXPECT_TRUE(testing::all_close(cross_entropy(L, T, {.reduction = Reduction::None}).to_vector<double>(), per, 1e-6));
  EXPECT_NEAR(cross_entropy(L, T, {.reduction = Reduction::Sum}).item(), total, 1e-5);
  EXPECT_NEAR(cross_entropy(L, T).item(), total / 4, 1e-6);  // the mean over the 4 kept targets
  EXPECT_NEAR(nll_loss(log_softmax(L, 1), T, {.reduction = Reduction::Sum}).item(), total, 1e-5);
  EXPECT_TRUE(testing::all_close(nll_loss(log_softmax(L, 1), T, {.reduction = Reduction::None}).to_vector<double>(), per, 1e-6));

  // Classes along dim 1 of [N, C, d]: the loss at (n, k) is row (n, :, k)'s.
  Tensor L3 = random_tensor({2, 3, 4}, kF32, 14, -2, 2), T3 = ints({0, 2, 1, 1, 2, 2, 0, 1}, {2, 4});
  V l3 = L3.to_vector<double>(), want3;
  std::vector<int64_t> t3 = T3.to_vector<int64_t>();
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t k = 0; k < 4; ++k) {
      V row;
      for (int64_t c = 0; c < 3; ++c) row.push_back(l3[size_t(n * 12 + c * 4 + k)]);
      want3.push_back(nll_of_row(row, 0, 3, t3[size_t(n * 4 + k)]));
    }
  Tensor none3 = cross_entropy(L3, T3, {.reduction = Reduction::None});
  EXPECT_EQ(none3.shape(), (Shape{2, 4}));
  EXPECT_TRUE(testing::all_close(none3.to_vector<double>(), want3, 1e-6));
  // One unbatched row [C] with a scalar target.
  EXPECT_NEAR(cross_entropy(L.index({0}), ints({3}, {})).item(), per[0], 1e-6);
  expect_error([&] { cross_entropy(L3, ints({0, 1}, {2})); }, "[cross_entropy]", {"[2, 3, 4]", "[2]"});

  EXPECT_NEAR(mse_loss(make_tensor({1, 2}, {2}), make_tensor({0, 4}, {2}), Reduction::Sum).item(), 5, 0);
  EXPECT_EQ(mse_loss(make_tensor({1, 2}, {2}), make_tensor({0, 4}, {2}), Reduction::None).to_vector<double>(), (V{1, 4}));
}

// The defaults give exactly what ops.h's former cross_entropy gave (the GPT's loss): the same
// bits for the loss and the gradient.
TEST(Api, CrossEntropyDefaultsKeepTheFormerResults) {
  Tensor L = random_tensor({64, 37}, kF32, 15, -4, 4), T = testing::random_int({64}, 0, 36);
  Tensor a = L.detach(), b = L.detach();
  a.requires_grad_();
  b.requires_grad_();
  Tensor now = cross_entropy(a, T);
  Tensor before = -mean(gather(log_softmax(b, 1), 1, T.reshape({-1, 1})));
  now.backward();
  before.backward();
  EXPECT_EQ(now.item<float>(), before.item<float>());
  EXPECT_EQ(a.grad().to_vector<float>(), b.grad().to_vector<float>());
}

// host_data: the realized value's own memory (no copy), kept alive by the share it hands out
// and never donated while shared, so an in-place op on the tensor leaves it as it was.
TEST(Api, HostDataIsTheBufferAndOutlivesInPlaceOps) {
  Tensor t = from_vector<float>({1, 2, 3}, {3}) * 2.0;  // pending until host_data realizes it
  std::shared_ptr<void> keep;
  const float* p = static_cast<const float*>(t.host_data(&keep));
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(t.is_realized());
  EXPECT_EQ(std::vector<float>(p, p + 3), (std::vector<float>{2, 4, 6}));
  EXPECT_EQ(t.host_data(nullptr), p);  // the same buffer again: no copy was made
  t.add_(1.0);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{3, 5, 7}));
  EXPECT_EQ(std::vector<float>(p, p + 3), (std::vector<float>{2, 4, 6}));  // the shared buffer is untouched
  Tensor b = from_vector<uint8_t>({1, 0}, {2}, {DType::Bool, Device("cpu")});
  const uint8_t* q = static_cast<const uint8_t*>(b.host_data(&keep));
  EXPECT_EQ(q[0], 1);
  EXPECT_EQ(q[1], 0);
}

}  // namespace
}  // namespace tessera
