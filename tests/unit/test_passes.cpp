// The IR passes (simplify, cse, dce; src/compiler/passes): each rule by hand, checking the
// optimized graph's ops and that values are bit-identical with passes on and off; cse across
// scopes; dce; compile options passed explicitly (two option sets in one process, even on two
// threads at once, give their own plans); and the passes' time on a GPT training-step graph
// (printed, not asserted).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "compiler/passes/passes.h"
#include "compiler/pipeline.h"
#include "core/scope_impl.h"
#include "tensor/tensor_impl.h"
#include "ir/graph.h"
#include "runtime/compile_options.h"
#include "test_util.h"
#include "tessera/tessera.h"

namespace tessera {
namespace {

using ir::NodePtr;
using ir::Op;
using detail::node_of;
using testing::random_tensor;
constexpr DType kF32 = DType::Float32, kF64 = DType::Float64, kF16 = DType::Float16, kI32 = DType::Int32,
                kI64 = DType::Int64, kBool = DType::Bool;
const double kNaN = std::numeric_limits<double>::quiet_NaN();

TensorOptions opts(DType t) {
  TensorOptions o;
  o.dtype = t;
  return o;
}

// The passes in pipeline order, as compile_graph runs them.
ir::Graph optimize(const ir::Graph& g) { return compiler::dce(compiler::cse(compiler::simplify(g))); }
ir::Graph graph_of(const std::vector<Tensor>& outs) {
  std::vector<NodePtr> nodes;
  for (auto& t : outs) nodes.push_back(node_of(t));
  return ir::build_graph(nodes);
}
ir::Graph optimized(const std::vector<Tensor>& outs) {
  ir::Graph h = optimize(graph_of(outs));
  ir::verify(h);
  return h;
}
int count(const ir::Graph& g, Op op) {
  int c = 0;
  for (auto& n : g.nodes) c += n->op == op;
  return c;
}
// Nodes other than leaves and constants.
int compute_nodes(const ir::Graph& g) {
  int c = 0;
  for (auto& n : g.nodes) c += n->op != Op::Leaf && n->op != Op::Full;
  return c;
}

// The nodes' values with the given passes disabled (fresh pending tensors over the same nodes).
// (The generator is reseeded so random nodes draw the same numbers in both runs.)
std::vector<std::vector<double>> run(const std::vector<NodePtr>& nodes, const std::string& disabled) {
  runtime::set_disabled_passes(disabled);
  manual_seed(77);
  std::vector<Tensor> ts;
  for (auto& n : nodes) ts.push_back(detail::from_node(n));
  sync();
  std::vector<std::vector<double>> r;
  for (auto& t : ts) r.push_back(t.to_vector<double>());
  runtime::set_disabled_passes("");
  return r;
}

// Same bits (NaN matches NaN; -0 does not match +0).
bool same_bits(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, 8) == 0;
}

::testing::AssertionResult same_on_and_off(const std::vector<NodePtr>& nodes) {
  auto on = run(nodes, ""), off = run(nodes, "all");
  for (size_t k = 0; k < nodes.size(); ++k) {
    if (on[k].size() != off[k].size()) return ::testing::AssertionFailure() << "output " << k << ": size differs";
    for (size_t i = 0; i < on[k].size(); ++i)
      if (!same_bits(on[k][i], off[k][i]))
        return ::testing::AssertionFailure() << "output " << k << " element " << i << ": passes on " << on[k][i]
                                             << ", off " << off[k][i] << "\n"
                                             << ir::to_text(ir::build_graph(nodes));
  }
  return ::testing::AssertionSuccess();
}
::testing::AssertionResult same_on_and_off(const std::vector<Tensor>& outs) {
  std::vector<NodePtr> nodes;
  for (auto& t : outs) nodes.push_back(node_of(t));
  return same_on_and_off(nodes);
}

// Values with sign-sensitive elements: -0, +0, NaN, infinities, negatives.
Tensor specials(DType t = kF32) {
  double inf = std::numeric_limits<double>::infinity();
  return testing::make_tensor({-0.0, 0.0, kNaN, inf, -inf, -1.5, 2.25, 3}, {2, 4}, t);
}

// ---------------------------------------------------------------- identities

TEST(Passes, MulByOneAndDivByOneAreDropped) {
  for (DType t : {kF32, kF64, kF16, kI32}) {
    Tensor x = t == kI32 ? testing::random_int({2, 4}, -5, 5, kI32) : specials(t);
    Tensor a = x * 1, b = 1 * x, c = t == kI32 ? x : x / 1.0;
    ir::Graph h = optimized({a, b, c});
    EXPECT_EQ(compute_nodes(h), 0) << dtype_name(t) << "\n" << ir::to_text(h);
    EXPECT_EQ(h.outputs[0], h.params[0]);
    EXPECT_TRUE(same_on_and_off({a, b, c})) << dtype_name(t);
  }
}

TEST(Passes, AddAndSubtractZero) {
  Tensor x = specials();
  // x - 0 is x for every x (-0 - 0 = -0); x + (-0) too.
  Tensor a = x - 0.0, b = x + (-0.0), c = (-0.0) + x;
  ir::Graph h = optimized({a, b, c});
  EXPECT_EQ(compute_nodes(h), 0) << ir::to_text(h);
  EXPECT_TRUE(same_on_and_off({a, b, c}));
  // x + (+0) turns -0 into +0: kept for a float tensor that may hold -0 ...
  Tensor d = x + 0.0;
  EXPECT_EQ(count(optimized({d}), Op::Add), 1);
  // ... and dropped where x cannot: integers, exp, casts from integers, sums of those.
  Tensor i = testing::random_int({2, 4}, -5, 5, kI64);
  Tensor e = i + 0, f = x.exp() + 0.0, g = i.to(kF32) + 0.0, k = (x.exp() + 0.0) + 0.0;
  ir::Graph h2 = optimized({e, f, g, k});
  EXPECT_EQ(count(h2, Op::Add), 0) << ir::to_text(h2);
  EXPECT_TRUE(same_on_and_off({d, e, f, g, k}));
  // The zero may come as a full of the whole shape rather than an expanded scalar.
  NodePtr xn = node_of(x);
  NodePtr z = ir::make(Op::Full, {}, ir::Attrs{{}, 0.0}, &xn->shape, kF32);
  NodePtr s = ir::make(Op::Sub, {xn, z});
  EXPECT_EQ(optimize(ir::build_graph({s})).nodes.size(), 1u);
}

TEST(Passes, DoubleNegationIsDropped) {
  Tensor x = specials();
  Tensor y = -(-x);
  Tensor z = neg(neg(neg(x)));
  ir::Graph h = optimized({y, z});
  EXPECT_EQ(count(h, Op::Neg), 1) << ir::to_text(h);
  EXPECT_EQ(h.outputs[0], h.params[0]);
  EXPECT_TRUE(same_on_and_off({y, z}));
}

TEST(Passes, SameOperandsAndConstantConditions) {
  Tensor x = specials(), y = random_tensor({2, 4}, kF32, 3);
  Tensor c = x < y;
  Tensor m = maximum(x, x), n = minimum(x, x), w = where(c, x, x);
  Tensor t = where(full({2, 4}, 1, opts(kBool)), x, y), f = where(zeros({2, 4}, opts(kBool)), x, y);
  ir::Graph h = optimized({m, n, w, t, f});
  EXPECT_EQ(compute_nodes(h), 0) << ir::to_text(h);
  EXPECT_EQ(h.outputs[4], h.params[1]);
  EXPECT_TRUE(same_on_and_off({m, n, w, t, f}));
}

TEST(Passes, CastsToTheSameDtypeAndExactRoundTripsAreDropped) {
  Tensor x = specials(), h16 = specials(kF16), i = testing::random_int({2, 4}, -9, 9, kI32);
  NodePtr same = ir::make(Op::Cast, {node_of(x)}, {}, nullptr, kF32);
  Tensor a = detail::from_node(same);
  Tensor b = x.to(kF64).to(kF32), c = h16.to(kF32).to(kF16), d = i.to(kI64).to(kI32), e = i.to(kF64).to(kI32);
  ir::Graph h = optimized({a, b, c, d, e});
  EXPECT_EQ(compute_nodes(h), 0) << ir::to_text(h);
  // Narrowing first is not exact: kept.
  Tensor f = x.to(kF16).to(kF32), g = x.to(kI32).to(kF32), k = i.to(kF32).to(kI32);
  EXPECT_EQ(count(optimized({f, g, k}), Op::Cast), 6);
  EXPECT_TRUE(same_on_and_off({a, b, c, d, e, f, g}));
}

TEST(Passes, ReductionsOverUnitAxes) {
  Tensor x = random_tensor({3, 1, 4}, kF32, 5).exp();  // cannot hold -0
  Tensor s = x.sum({1}, true), m = x.amax({1}, true);
  Tensor sx = specials().reshape({2, 1, 4}).sum({1}, true);  // -0 summed from +0 is +0: kept
  ir::Graph h = optimized({s, m, sx});
  EXPECT_EQ(count(h, Op::ReduceSum), 1) << ir::to_text(h);
  EXPECT_EQ(count(h, Op::ReduceMax), 0) << ir::to_text(h);
  EXPECT_TRUE(same_on_and_off({s, m, sx}));
  // A sum over an empty axis is zeros.
  Tensor e = zeros({2, 0, 3}).sum({1}, true);
  Tensor le = testing::make_tensor({}, {2, 0, 3}).sum({1}, true) * 1;
  ir::Graph he = optimized({le});
  EXPECT_EQ(compute_nodes(he), 0) << ir::to_text(he);
  EXPECT_TRUE(same_on_and_off({e, le}));
}

// ---------------------------------------------------------------- movement

TEST(Passes, MovementChainsCollapse) {
  Tensor x = random_tensor({2, 3, 4}, kF32, 7);
  Tensor r = x.reshape({6, 4}).reshape({4, 6}).reshape({24});
  Tensor p = x.permute({1, 2, 0}).permute({2, 0, 1});  // identity
  Tensor q = x.permute({1, 2, 0}).permute({1, 0, 2});  // one permute
  Tensor e = x.reshape({2, 1, 3, 4}).expand({2, 5, 3, 4});
  Tensor s = x.slice(2, 1, 4).slice(2, 1, 3).slice(1, 0, 3, 2).slice(1, 1, 2);
  Tensor s2 = x.slice(2, 0, 4, 2).slice(2, 1, 2);
  NodePtr xn = node_of(x);
  Tensor id_reshape = detail::from_node(ir::make(Op::Reshape, {xn}, {}, &xn->shape));
  Tensor id_perm = detail::from_node(ir::make(Op::Permute, {xn}, ir::Attrs{{0, 1, 2}, 0}));
  Tensor id_expand = detail::from_node(ir::make(Op::Expand, {xn}, {}, &xn->shape));
  Tensor id_slice = detail::from_node(ir::make(Op::Slice, {xn}, ir::Attrs{{0, 2, 1, 0, 3, 1, 0, 4, 1}, 0}));
  Tensor id_pad = detail::from_node(ir::make(Op::Pad, {xn}, ir::Attrs{std::vector<int64_t>(9, 0), 0}));
  Tensor id_cat = cat({x}, 1);
  Shape s4{2, 1, 3, 1, 4}, s42{2, 5, 3, 1, 4}, s5{2, 5, 3, 6, 4};
  NodePtr e1 = ir::make(Op::Expand, {ir::make(Op::Reshape, {xn}, {}, &s4)}, {}, &s42);
  Tensor ee2 = detail::from_node(ir::make(Op::Expand, {e1}, {}, &s5));  // expand(expand) from extent 1
  std::vector<Tensor> outs = {r, p, q, e, s, s2, id_reshape, id_perm, id_expand, id_slice, id_pad, id_cat, ee2};
  ir::Graph g = graph_of(outs), h = optimized(outs);
  EXPECT_EQ(count(h, Op::Reshape), 3) << ir::to_text(h);  // r, e's and ee2's
  EXPECT_EQ(count(h, Op::Permute), 1) << ir::to_text(h);
  EXPECT_EQ(count(h, Op::Expand), 2) << ir::to_text(h);   // e, ee2 (one each)
  EXPECT_EQ(count(h, Op::Slice), 2) << ir::to_text(h);    // s, s2 (one each)
  EXPECT_EQ(count(h, Op::Pad) + count(h, Op::Concat), 0) << ir::to_text(h);
  for (int k : {1, 6, 7, 8, 9, 10, 11}) EXPECT_EQ(h.outputs[size_t(k)], h.params[0]) << k;
  EXPECT_LT(h.nodes.size(), g.nodes.size());
  EXPECT_TRUE(same_on_and_off(outs));
}

// (a @ b)^T read only through the transpose becomes b^T @ a^T (a Linear's weight gradient comes
// out in the weight's layout); a product read elsewhere too is left alone (no second product),
// and so are batched products.
TEST(Passes, TransposedProductSwapsItsOperands) {
  Tensor a = random_tensor({5, 4}, kF32, 1), b = random_tensor({4, 6}, kF32, 2);
  Tensor t = matmul(a, b).transpose(0, 1);
  ir::Graph h = optimized({t});
  EXPECT_EQ(count(h, Op::Matmul), 1) << ir::to_text(h);
  ASSERT_EQ(h.nodes[size_t(h.outputs[0])]->op, Op::Matmul) << ir::to_text(h);
  EXPECT_EQ(h.nodes[size_t(h.outputs[0])]->inputs[0]->shape, (Shape{6, 4}));
  Tensor u = matmul(b.transpose(0, 1), a.transpose(0, 1)).transpose(0, 1);  // (b^T a^T)^T: a @ b
  ir::Graph hu = optimized({u});
  EXPECT_EQ(count(hu, Op::Permute), 0) << ir::to_text(hu);
  EXPECT_EQ(count(hu, Op::Matmul), 1) << ir::to_text(hu);
  Tensor p = matmul(a, b), q = p.transpose(0, 1), r = p * 2;
  ir::Graph h2 = optimized({q, r});
  EXPECT_EQ(count(h2, Op::Matmul), 1) << ir::to_text(h2);
  EXPECT_EQ(h2.nodes[size_t(h2.outputs[0])]->op, Op::Permute) << ir::to_text(h2);
  Tensor bt = matmul(random_tensor({3, 5, 4}, kF32, 3), random_tensor({3, 4, 6}, kF32, 4)).transpose(1, 2);
  ir::Graph h3 = optimized({bt});
  EXPECT_EQ(h3.nodes[size_t(h3.outputs[0])]->op, Op::Permute) << ir::to_text(h3);
  // The same dot products: equal to float32 rounding, checked against the unrewritten graph.
  for (const Tensor& x : {t, u}) {
    auto on = run({node_of(x)}, ""), off = run({node_of(x)}, "all");
    ASSERT_EQ(on[0].size(), off[0].size());
    for (size_t i = 0; i < on[0].size(); ++i) EXPECT_NEAR(on[0][i], off[0][i], 1e-5 * (1 + std::abs(off[0][i]))) << i;
  }
}

TEST(Passes, EmptySliceOfSliceStaysInRange) {
  Tensor x = random_tensor({5, 2}, kF32, 8);
  Tensor s = x.slice(0, 0, 5, 2).slice(0, 3, 3);  // empty, past the inner slice's end
  ir::Graph h = optimized({s});
  EXPECT_EQ(count(h, Op::Slice), 1);
  EXPECT_EQ(s.shape(), (Shape{0, 2}));
  EXPECT_TRUE(same_on_and_off({s}));
}

// ---------------------------------------------------------------- constants

TEST(Passes, MovementOfConstantsIsAConstant) {
  Tensor a = full({3, 1}, 2.5).expand({3, 4}).permute({1, 0}).reshape({2, 6}).slice(1, 1, 5, 2);
  Tensor b = pad(full({2, 2}, 7), {1, 1, 0, 2}, 7);
  Tensor c = cat({full({2, 2}, -1), full({1, 2}, -1)}, 0);
  Tensor d = full({2, 3}, 4).amax({1}, true);
  ir::Graph h = optimized({a, b, c, d});
  EXPECT_EQ(compute_nodes(h), 0) << ir::to_text(h);
  EXPECT_EQ(h.nodes[size_t(h.outputs[0])]->shape, (Shape{2, 2}));
  // Pad with another value and concat of different values stay.
  Tensor e = pad(full({2, 2}, 7), {1, 1, 0, 0}, 0), f = cat({full({1}, 1), full({1}, 2)});
  ir::Graph h2 = optimized({e, f});
  EXPECT_EQ(count(h2, Op::Pad) + count(h2, Op::Concat), 2) << ir::to_text(h2);
  EXPECT_TRUE(same_on_and_off({a, b, c, d, e, f}));
}

TEST(Passes, ElementwiseConstantsFoldAsTheBackendRounds) {
  std::vector<Tensor> outs = {
      full({2}, 0.1) + full({2}, 0.2),                            // float32 sum, not 0.3
      full({2}, 1.0, opts(kF64)) / full({2}, 3.0, opts(kF64)),
      full({2}, 1000, opts(kF16)) * full({2}, 1000, opts(kF16)),  // float16 overflow: inf
      full({2}, 0.1, opts(kF16)) + full({2}, 0.2, opts(kF16)),
      full({2}, 1e-30) * full({2}, 1e-30),                        // float32 underflow: 0
      sqrt(abs(full({2}, -4))), sqrt(full({2}, -1)),            // 2, NaN
      neg(full({2}, 0.0)), sign(full({2}, -0.0)), round(full({2}, 2.5)), floor(full({2}, -1.5)), ceil(full({2}, 1.2)),
      maximum(full({2}, kNaN), full({2}, 1)), minimum(full({2}, -0.0), full({2}, 0.0)),
      full({2}, 3, opts(kI32)) * full({2}, -7, opts(kI32)) - full({2}, 5, opts(kI32)),
      lt(full({2}, 1), full({2}, 2)), eq(full({2}, kNaN), full({2}, kNaN)),
      full({2}, 2.7).to(kI32), full({2}, -2.7).to(kI64), full({2}, 0.5).to(kBool), full({2}, 7, opts(kI64)).to(kF16),
      full({2}, 1 + 1e-12, opts(kF64)).to(kF32),
  };
  ir::Graph h = optimized(outs);
  EXPECT_EQ(compute_nodes(h), 0) << ir::to_text(h);
  EXPECT_TRUE(same_on_and_off(outs));
  EXPECT_EQ(outs[0].to_vector<float>()[0], 0.1f + 0.2f);
  EXPECT_TRUE(std::isinf(outs[2].to_vector<double>()[0]));
  EXPECT_EQ(outs[14].to_vector<double>()[0], -26);
}

TEST(Passes, UnsafeFoldsAreNotDone) {
  Tensor x = specials();
  std::vector<Tensor> outs = {
      x * 0.0,                                                                  // NaN * 0, inf * 0
      full({2}, 1).exp(), full({2}, 2).log(), pow(full({2}, 2), 0.5),            // libm: left to the backend
      full({2}, 2147483647, opts(kI32)) + full({2}, 1, opts(kI32)),             // int32 overflow
      full({2}, 1e10).to(kI32), full({2}, kNaN).to(kI64),                       // not a value of the dtype
      full({2}, 9007199254740992.0, opts(kI64)) + full({2}, 1, opts(kI64)),      // beyond 2^53: a Full can't hold it
      (x + 1.0) - 1.0, (x * 3.0) / 3.0,                                         // no reassociation
  };
  ir::Graph h = optimized(outs);
  EXPECT_EQ(count(h, Op::Mul), 2) << ir::to_text(h);
  EXPECT_EQ(count(h, Op::Exp) + count(h, Op::Log) + count(h, Op::Pow), 3);
  EXPECT_EQ(count(h, Op::Add), 3);
  EXPECT_EQ(count(h, Op::Cast), 2);
  EXPECT_EQ(count(h, Op::Sub) + count(h, Op::Div), 2);
  // Overflowing integers and out-of-range casts are undefined behaviour on the CPU: dropped
  // before anything runs (a sync computes every live pending tensor).
  for (int k : {4, 5, 6, 7}) outs[size_t(k)] = Tensor();
  h = ir::Graph{};
  std::vector<Tensor> checked(outs.begin(), outs.begin() + 4);
  checked.push_back(outs[8]);
  checked.push_back(outs[9]);
  EXPECT_TRUE(same_on_and_off(checked));
}

TEST(Passes, LeavesAreNeverCreatedAndOutputsKeepTheirOrder) {
  Tensor x = random_tensor({3}, kF32, 9), y = random_tensor({3}, kF32, 10);
  std::vector<Tensor> outs = {y * 1, x * 1, x, (x * 1) + y, full({3}, 2) * full({3}, 3), y * 1};
  ir::Graph g = graph_of(outs), h = optimized(outs);
  ASSERT_EQ(h.outputs.size(), outs.size());
  for (int p : h.params) EXPECT_TRUE(g.index.find(h.nodes[size_t(p)].get()));  // original leaves
  EXPECT_EQ(h.outputs[0], h.outputs[5]);
  EXPECT_EQ(h.outputs[1], h.outputs[2]);
  EXPECT_TRUE(same_on_and_off(outs));
  // Through the runtime: an output that becomes a parameter, written in place.
  Tensor z = random_tensor({3}, kF32, 11);
  std::vector<float> before = z.to_vector<float>();
  z.mul_(1.0);
  EXPECT_EQ(z.to_vector<float>(), before);
}

// ---------------------------------------------------------------- cse

TEST(Passes, CseMergesNodesEqualButForScope) {
  Tensor x = random_tensor({4, 3}, kF32, 12);
  Tensor a, b, c;
  {
    Scope s("enc");
    a = (x * 2.0 + 1.0).tanh();
  }
  {
    Scope s("dec");
    b = (x * 2.0 + 1.0).tanh();
    c = (x * 2.0 + 1.0).exp();
  }
  ir::Graph g = graph_of({a, b, c});
  ir::Graph h = compiler::cse(g);
  ir::verify(h);
  EXPECT_EQ(count(g, Op::Tanh), 2);
  EXPECT_EQ(count(h, Op::Tanh), 1) << ir::to_text(h);
  EXPECT_EQ(count(h, Op::Mul), 1);
  EXPECT_EQ(count(h, Op::Add), 1);
  EXPECT_EQ(h.outputs[0], h.outputs[1]);
  for (auto& n : h.nodes) {  // the first one's scope
    if (n->op == Op::Mul || n->op == Op::Add || n->op == Op::Tanh) {
      EXPECT_EQ(*n->scope, "enc");
    }
    if (n->op == Op::Exp) {
      EXPECT_EQ(*n->scope, "dec");
    }
  }
  EXPECT_TRUE(same_on_and_off({a, b, c}));
}

TEST(Passes, CseAcrossModuleScopes) {
  // One module called in two scopes computes the same product twice.
  nn::Linear lin(3, 2, false);
  Tensor x = random_tensor({5, 3}, kF32, 13);
  Tensor y1, y2;
  {
    Scope s("first");
    y1 = lin(x);
  }
  {
    Scope s("second");
    y2 = lin(x);
  }
  ir::Graph g = graph_of({y1, y2}), h = optimized({y1, y2});
  EXPECT_EQ(count(g, Op::Matmul), 2);
  EXPECT_EQ(count(h, Op::Matmul), 1) << ir::to_text(h);
  EXPECT_TRUE(same_on_and_off({y1, y2}));
}

TEST(Passes, CseNeverMergesLeavesOrDifferentDraws) {
  Tensor x = testing::make_tensor({1, 2, 3}, {3}), y = testing::make_tensor({1, 2, 3}, {3});
  Tensor a, b;
  {
    ScopeAs s("one");
    a = x + rand({3});
  }
  {
    ScopeAs s("two");
    b = y + rand({3});
  }
  ir::Graph h = optimized({a, b});
  EXPECT_EQ(h.params.size(), 2u);
  EXPECT_EQ(count(h, Op::Rng), 2);
  EXPECT_EQ(count(h, Op::Add), 2);
  // The same draw in two scopes is the same numbers: one node.
  NodePtr r1, r2;
  Shape s3{3};
  {
    ScopeAs s("one");
    r1 = ir::make(Op::Rng, {}, ir::Attrs{{7, 0}, 0}, &s3, kF32);
  }
  {
    ScopeAs s("two");
    r2 = ir::make(Op::Rng, {}, ir::Attrs{{7, 0}, 0}, &s3, kF32);
  }
  EXPECT_NE(r1, r2);
  EXPECT_EQ(count(compiler::cse(ir::build_graph({r1, r2})), Op::Rng), 1);
  sync();
}

// ---------------------------------------------------------------- dce

TEST(Passes, DceDropsWhatNoOutputReads) {
  Tensor x = random_tensor({4}, kF32, 14);
  Tensor a = x.exp(), b = (x * 3.0).tanh();
  ir::Graph g = graph_of({a, b});
  ir::Graph same = compiler::dce(g);
  EXPECT_EQ(same.key, g.key);  // nothing dead: unchanged
  g.outputs = {g.outputs[0]};  // b and its inputs are now dead
  ir::Graph h = compiler::dce(g);
  ir::verify(h);
  EXPECT_EQ(h.nodes.size(), 2u) << ir::to_text(h);
  EXPECT_EQ(count(h, Op::Tanh), 0);
  EXPECT_EQ(h.outputs.size(), 1u);
  sync();
}

TEST(Passes, DisabledPassesLeaveTheGraphAlone) {
  Tensor x = random_tensor({4}, kF32, 15);
  Tensor y = (x * 1.0).reshape({2, 2}).reshape({4});
  runtime::set_disabled_passes("simplify,cse");
  EXPECT_FALSE(runtime::compile_options().enabled("simplify"));
  EXPECT_TRUE(runtime::compile_options().enabled("dce"));
  runtime::set_disabled_passes("");
  EXPECT_TRUE(same_on_and_off({y}));
  std::string msg = testing::error_message([] { runtime::set_disabled_passes("cse,fusion"); });
  EXPECT_NE(msg.find("unknown pass 'fusion'"), std::string::npos) << msg;
  EXPECT_TRUE(runtime::compile_options().enabled("cse")) << "a refused list changes nothing";
}

// The compiler reads only the options it is given: compiles of one graph with different options
// give their own plans, again and again and on two threads at once, and leave the runtime's
// settings alone.
TEST(Passes, CompilesWithDifferentOptionsGiveTheirOwnPlans) {
  Tensor x = random_tensor({16, 24}, kF32, 18), w = random_tensor({24, 24}, kF32, 19);
  Tensor y = softmax(matmul(x, w).tanh() * 2.0 + 1.0, -1);
  ir::Graph g = ir::build_graph({detail::node_of(y)});
  const std::vector<int> none(g.outputs.size(), -1);
  const std::string settings = runtime::compile_options().key();

  compiler::Options fused, unfused, guarded;
  unfused.disabled = {"fuse", "memplan"};
  guarded.arena_guard = 128;
  guarded.target.alignment = 256;
  const compiler::Plan pa = compiler::compile_graph(g, none, fused), pb = compiler::compile_graph(g, none, unfused),
                       pc = compiler::compile_graph(g, none, guarded);
  const std::string a = pa.str(), b = pb.str(), c = pc.str();
  EXPECT_LT(pa.steps.size(), pb.steps.size()) << "fusion off: more Steps";
  EXPECT_EQ(pa.arena_guard, 0u);
  EXPECT_EQ(pc.arena_guard, 256u) << "128 guard bytes rounded up to the target's alignment";
  EXPECT_EQ(pc.steps.size(), pa.steps.size());
  EXPECT_GT(pc.arena_bytes, pa.arena_bytes);
  for (const kir::Slot& sl : pc.slots)
    if (sl.kind == kir::SlotKind::Temp) {
      EXPECT_EQ(sl.offset % 256, 0u);
    }
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(compiler::compile_graph(g, none, fused).str(), a) << "nothing carried over between compiles";

  std::string on_thread[2];
  std::thread t0([&] {
    for (int i = 0; i < 20; ++i) on_thread[0] = compiler::compile_graph(g, none, i % 2 ? unfused : fused).str();
  });
  std::thread t1([&] {
    for (int i = 0; i < 20; ++i) on_thread[1] = compiler::compile_graph(g, none, i % 2 ? fused : guarded).str();
  });
  t0.join(), t1.join();
  EXPECT_EQ(on_thread[0], b);
  EXPECT_EQ(on_thread[1], a);
  EXPECT_EQ(runtime::compile_options().key(), settings) << "the runtime's settings are untouched";
  EXPECT_NE(fused.key(), unfused.key());
  EXPECT_NE(fused.key(), guarded.key());
}

// ---------------------------------------------------------------- timing

// A GPT training step (forward, backward, AdamW update) as one graph: the passes' cost on the
// kind of graph every training compile sees. Printed, not asserted (shared CI machines).
TEST(Passes, TimingOnATrainingStepGraph) {
  nn::GPTConfig cfg;
  cfg.vocab = 64;
  cfg.block = 32;
  cfg.embd = 64;
  cfg.heads = 4;
  cfg.layers = 6;
  manual_seed(1);
  nn::GPT model(cfg);
  optim::AdamW opt(model.parameters());
  Tensor idx = testing::random_int({2, 32}, 0, 63, kI64, 16), tgt = testing::random_int({2, 32}, 0, 63, kI64, 17);
  sync();
  Tensor loss = model.loss(idx, tgt);
  loss.backward();
  opt.step();
  opt.zero_grad();
  std::vector<NodePtr> nodes;
  for (auto& impl : detail::pending_impls()) nodes.push_back(impl->node);
  ir::Graph g = ir::build_graph(nodes);

  using clock = std::chrono::steady_clock;
  auto ms = [](clock::time_point t0) { return std::chrono::duration<double, std::milli>(clock::now() - t0).count(); };
  // TESSERA_PASS_REPS=<n> repeats each measurement n times (for profiling the passes).
  int reps = std::getenv("TESSERA_PASS_REPS") ? std::max(1, std::atoi(std::getenv("TESSERA_PASS_REPS"))) : 7;
  auto best_of = [&](auto&& f) {
    double best = 1e9;
    for (int r = 0; r < reps; ++r) {
      auto t0 = clock::now();
      f();
      best = std::min(best, ms(t0));
    }
    return best;
  };
  ir::Graph s = compiler::simplify(g), c = compiler::cse(s), d = compiler::dce(c);
  double t_simplify = best_of([&] { compiler::simplify(g); });
  double t_cse = best_of([&] { compiler::cse(s); });
  double t_dce = best_of([&] { compiler::dce(c); });
  compiler::Options without_ir_passes;
  without_ir_passes.disabled = {"simplify", "cse", "dce"};
  double t_on = best_of([&] { compiler::compile_graph(g, {}); });
  double t_off = best_of([&] { compiler::compile_graph(g, {}, without_ir_passes); });
  std::printf("[ timing ] training-step graph: %zu nodes -> simplify %zu -> cse %zu -> dce %zu\n", g.nodes.size(),
              s.nodes.size(), c.nodes.size(), d.nodes.size());
  std::printf("[ timing ] simplify %.3f ms, cse %.3f ms, dce %.3f ms (best of %d)\n", t_simplify, t_cse, t_dce, reps);
  std::printf("[ timing ] compile_graph with IR passes %.3f ms, without %.3f ms\n", t_on, t_off);
  ir::verify(d);
  EXPECT_LE(d.nodes.size(), g.nodes.size());
  EXPECT_EQ(d.outputs.size(), g.outputs.size());
  // The runtime's cold compile of this graph (passes, lowering, backend kernels).
  g = ir::Graph{};
  s = c = d = ir::Graph{};
  nodes.clear();
  double before = metrics().compile_ms;
  sync();
  std::printf("[ timing ] cold compile through the runtime (metrics().compile_ms): %.3f ms\n",
              metrics().compile_ms - before);
  EXPECT_TRUE(std::isfinite(loss.item()));
}

}  // namespace
}  // namespace tessera
