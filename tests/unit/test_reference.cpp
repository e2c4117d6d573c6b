// The float64 reference evaluator against hand-derived values, on graphs built with ir::make.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/half.h"
#include "core/philox.h"
#include "ir/graph.h"
#include "reference/evaluator.h"
#include "test_util.h"

namespace tessera {
namespace {

using ir::Attrs;
using ir::NodePtr;
using ir::Op;
using V = std::vector<double>;
const double kNaN = std::numeric_limits<double>::quiet_NaN();

// A leaf over host memory holding `v` converted to `t`.
NodePtr host_leaf(const V& v, const Shape& s, DType t = DType::Float64) {
  size_t n = v.size() * itemsize(t);
  char* p = new char[std::max<size_t>(n, 1)];
  for (size_t i = 0; i < v.size(); ++i) {
    char* q = p + i * itemsize(t);
    switch (t) {
      case DType::Bool: { uint8_t x = v[i] != 0; std::memcpy(q, &x, 1); break; }
      case DType::Int32: { int32_t x = int32_t(v[i]); std::memcpy(q, &x, 4); break; }
      case DType::Int64: { int64_t x = int64_t(v[i]); std::memcpy(q, &x, 8); break; }
      case DType::Float16: { uint16_t x = half::float_to_f16(float(v[i])); std::memcpy(q, &x, 2); break; }
      case DType::BFloat16: { uint16_t x = half::float_to_bf16(float(v[i])); std::memcpy(q, &x, 2); break; }
      case DType::Float32: { float x = float(v[i]); std::memcpy(q, &x, 4); break; }
      case DType::Float64: std::memcpy(q, &v[i], 8); break;
    }
  }
  auto buf = std::make_shared<Buffer>(Device("cpu"), p, n, [](void* d, size_t) { delete[] static_cast<char*>(d); });
  return ir::leaf(buf, s, t);
}

NodePtr mk(Op op, std::vector<NodePtr> in, std::vector<int64_t> ints = {}, double f = 0) {
  return ir::make(op, std::move(in), Attrs{std::move(ints), f});
}
NodePtr make_shaped(Op op, std::vector<NodePtr> in, const Shape& s, std::vector<int64_t> ints = {}, double f = 0,
                    std::optional<DType> dt = std::nullopt) {
  return ir::make(op, std::move(in), Attrs{std::move(ints), f}, &s, dt);
}
NodePtr cast(const NodePtr& x, DType t) { return ir::make(Op::Cast, {x}, {}, nullptr, t); }

reference::Value eval(const NodePtr& n, uint64_t seed = 0, uint64_t offset = 0) {
  ir::Graph g = ir::build_graph({n});
  ir::verify(g);
  return reference::evaluate(g, seed, offset).at(0);
}

void expect_values(const reference::Value& v, const Shape& s, const V& want) {
  EXPECT_EQ(v.shape, s);
  ASSERT_EQ(v.data.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) EXPECT_TRUE(std::isnan(v.data[i])) << "element " << i;
    else EXPECT_EQ(v.data[i], want[i]) << "element " << i;
  }
}

TEST(Reference, MatmulByHand) {
  NodePtr a = host_leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  NodePtr b = host_leaf({7, 8, 9, 10, 11, 12}, {3, 2});
  reference::Value r = eval(mk(Op::Matmul, {a, b}));
  EXPECT_EQ(r.dtype, DType::Float64);
  expect_values(r, {2, 2}, {58, 64, 139, 154});
}

TEST(Reference, BatchedMatmul) {
  // batch 0: [1 2] x [[1],[1]] = 3 ; batch 1: [3 4] x [[2],[-1]] = 2
  NodePtr a = host_leaf({1, 2, 3, 4}, {2, 1, 2});
  NodePtr b = host_leaf({1, 1, 2, -1}, {2, 2, 1});
  expect_values(eval(mk(Op::Matmul, {a, b})), {2, 1, 1}, {3, 2});
  // Integer matmul is exact.
  NodePtr ai = host_leaf({1, 2, 3, 4}, {2, 2}, DType::Int32);
  NodePtr bi = host_leaf({5, 6, 7, 8}, {2, 2}, DType::Int32);
  reference::Value r = eval(mk(Op::Matmul, {ai, bi}));
  EXPECT_EQ(r.dtype, DType::Int32);
  expect_values(r, {2, 2}, {19, 22, 43, 50});
}

TEST(Reference, MatmulEmptyInnerDimIsZero) {
  NodePtr a = host_leaf({}, {2, 0});
  NodePtr b = host_leaf({}, {0, 3});
  expect_values(eval(mk(Op::Matmul, {a, b})), {2, 3}, {0, 0, 0, 0, 0, 0});
}

TEST(Reference, PadWithInterior) {
  NodePtr x = host_leaf({1, 2, 3}, {3});
  // lo 1, hi 2, interior 1: -1 1 -1 2 -1 3 -1 -1
  expect_values(eval(mk(Op::Pad, {x}, {1, 2, 1}, -1)), {8}, {-1, 1, -1, 2, -1, 3, -1, -1});
  // 2-D: [[1,2],[3,4]], dim 0: lo 0 hi 1 interior 1, dim 1: lo 1 hi 0 interior 0.
  NodePtr y = host_leaf({1, 2, 3, 4}, {2, 2});
  expect_values(eval(mk(Op::Pad, {y}, {0, 1, 1, 1, 0, 0}, 9)), {4, 3},
                {9, 1, 2,
                 9, 9, 9,
                 9, 3, 4,
                 9, 9, 9});
  // Interior padding of a size-1 dimension adds nothing.
  NodePtr z = host_leaf({5}, {1});
  expect_values(eval(mk(Op::Pad, {z}, {0, 0, 3}, 0)), {1}, {5});
}

TEST(Reference, SliceWithStep) {
  Shape s{10};
  NodePtr x = make_shaped(Op::Iota, {}, s, {0});
  expect_values(eval(mk(Op::Slice, {x}, {1, 8, 3})), {3}, {1, 4, 7});
  expect_values(eval(mk(Op::Slice, {x}, {2, 2, 1})), {0}, {});
  // 2-D [3,4] = 0..11: rows 0:3:2, cols 1:4:2 -> [[1,3],[9,11]]
  NodePtr y = host_leaf({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4});
  expect_values(eval(mk(Op::Slice, {y}, {0, 3, 2, 1, 4, 2})), {2, 2}, {1, 3, 9, 11});
}

TEST(Reference, Gather) {
  // torch.gather([[1,2],[3,4]], 1, [[0,0],[1,0]]) = [[1,1],[4,3]]
  NodePtr src = host_leaf({1, 2, 3, 4}, {2, 2});
  NodePtr idx = host_leaf({0, 0, 1, 0}, {2, 2}, DType::Int64);
  expect_values(eval(mk(Op::Gather, {src, idx}, {1})), {2, 2}, {1, 1, 4, 3});
  // Along axis 0 with an index smaller than src in the other dimension.
  NodePtr s3 = host_leaf({0, 1, 2, 10, 11, 12, 20, 21, 22}, {3, 3});
  NodePtr i3 = host_leaf({2, 0, 1, 1}, {2, 2}, DType::Int32);
  // out[i][j] = s3[i3[i][j]][j]: [[20, 1], [10, 11]]
  expect_values(eval(mk(Op::Gather, {s3, i3}, {0})), {2, 2}, {20, 1, 10, 11});
}

TEST(Reference, GatherOutOfRangeThrows) {
  NodePtr src = host_leaf({1, 2, 3, 4, 5}, {5});
  NodePtr idx = host_leaf({0, 7}, {2}, DType::Int64);
  NodePtr g = mk(Op::Gather, {src, idx}, {0});
  try {
    eval(g);
    FAIL() << "expected tessera::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[gather]", 0), 0u) << msg;
    EXPECT_NE(msg.find("index 7 out of range [0, 5)"), std::string::npos) << msg;
  }
  NodePtr neg = host_leaf({-1}, {1}, DType::Int64);
  EXPECT_THROW(eval(mk(Op::Gather, {src, neg}, {0})), Error);
}

TEST(Reference, GatherErrorNamesScope) {
  NodePtr src = host_leaf({1, 2, 3}, {3});
  NodePtr idx = host_leaf({3}, {1}, DType::Int64);
  NodePtr g;
  {
    Scope s("embed");
    g = mk(Op::Gather, {src, idx}, {0});
  }
  try {
    eval(g);
    FAIL() << "expected tessera::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("embed"), std::string::npos) << e.what();
  }
}

TEST(Reference, ScatterAddRepeatedIndices) {
  NodePtr base = host_leaf({0, 0, 0, 0, 0}, {5});
  NodePtr idx = host_leaf({0, 1, 0, 4, 0}, {5}, DType::Int64);
  NodePtr src = host_leaf({1, 2, 3, 4, 5}, {5});
  expect_values(eval(mk(Op::ScatterAdd, {base, idx, src}, {0})), {5}, {9, 2, 0, 0, 4});
  // 2-D along axis 1, index narrower than base in dimension 1 and shorter in dimension 0.
  NodePtr b2 = host_leaf({1, 1, 1, 1, 1, 1, 1, 1, 1}, {3, 3});
  NodePtr i2 = host_leaf({2, 2, 0, 1}, {2, 2}, DType::Int32);
  NodePtr s2 = host_leaf({10, 20, 30, 40}, {2, 2});
  expect_values(eval(mk(Op::ScatterAdd, {b2, i2, s2}, {1})), {3, 3},
                {1, 1, 31,
                 31, 41, 1,
                 1, 1, 1});
  NodePtr bad = host_leaf({5, 0, 0, 0, 0}, {5}, DType::Int64);
  EXPECT_THROW(eval(mk(Op::ScatterAdd, {base, bad, src}, {0})), Error);
}

TEST(Reference, DynamicUpdateSliceClamps) {
  NodePtr base = host_leaf({0, 0, 0, 0, 0}, {5});
  NodePtr upd = host_leaf({1, 2, 3}, {3});
  expect_values(eval(mk(Op::DynamicUpdateSlice, {base, upd, host_leaf({1}, {1}, DType::Int64)})), {5}, {0, 1, 2, 3, 0});
  expect_values(eval(mk(Op::DynamicUpdateSlice, {base, upd, host_leaf({4}, {1}, DType::Int64)})), {5}, {0, 0, 1, 2, 3});
  expect_values(eval(mk(Op::DynamicUpdateSlice, {base, upd, host_leaf({-3}, {1}, DType::Int64)})), {5}, {1, 2, 3, 0, 0});
  // 2-D: base 3x3 of 0, update 2x2 at (2, 1) -> row clamped to 1.
  NodePtr b2 = host_leaf(V(9, 0), {3, 3});
  NodePtr u2 = host_leaf({1, 2, 3, 4}, {2, 2});
  expect_values(eval(mk(Op::DynamicUpdateSlice, {b2, u2, host_leaf({2, 1}, {2}, DType::Int64)})), {3, 3},
                {0, 0, 0,
                 0, 1, 2,
                 0, 3, 4});
}

TEST(Reference, ReduceOverSeveralAxes) {
  V v(24);
  for (int i = 0; i < 24; ++i) v[i] = i;
  NodePtr x = host_leaf(v, {2, 3, 4});
  // sum over i,k of 12i + 4j + k = 32j + 60
  expect_values(eval(mk(Op::ReduceSum, {x}, {0, 2})), {1, 3, 1}, {60, 92, 124});
  expect_values(eval(mk(Op::ReduceMax, {x}, {1, 2})), {2, 1, 1}, {11, 23});
  expect_values(eval(mk(Op::ReduceSum, {x}, {0, 1, 2})), {1, 1, 1}, {276});
  expect_values(eval(mk(Op::ReduceMax, {x}, {0})), {1, 3, 4}, V(v.begin() + 12, v.end()));
  // Sum over an empty dimension is 0; max propagates NaN.
  expect_values(eval(mk(Op::ReduceSum, {host_leaf({}, {2, 0})}, {1})), {2, 1}, {0, 0});
  expect_values(eval(mk(Op::ReduceMax, {host_leaf({1, kNaN, 3, -1, -5, -2}, {2, 3})}, {1})), {2, 1}, {kNaN, -1});
}

TEST(Reference, CastRounding) {
  NodePtr x = host_leaf({2.7, -2.7, 0.5, -0.5, 1e10}, {5});
  expect_values(eval(cast(x, DType::Int64)), {5}, {2, -2, 0, 0, 1e10});
  expect_values(eval(cast(host_leaf({2.7, -2.7, 0.5, -0.5}, {4}), DType::Int32)), {4}, {2, -2, 0, 0});
  // float16: ulp at 1 is 2^-10; ties go to even.
  double u = std::ldexp(1.0, -11);
  NodePtr h = host_leaf({1 + u, 1 + 3 * u, 0.1, 65520, -70000, 1e-8}, {6});
  expect_values(eval(cast(h, DType::Float16)), {6}, {1, 1 + 4 * u, 0.0999755859375, INFINITY, -INFINITY, 0});
  // bfloat16: ulp at 1 is 2^-7.
  double ub = std::ldexp(1.0, -8);
  expect_values(eval(cast(host_leaf({1 + ub, 1 + 3 * ub, 3.14159}, {3}), DType::BFloat16)), {3},
                {1, 1 + 4 * ub, 3.140625});
  expect_values(eval(cast(host_leaf({0.1}, {1}), DType::Float32)), {1}, {double(0.1f)});
  expect_values(eval(cast(host_leaf({0, -0.0, 0.5, kNaN, -3}, {5}), DType::Bool)), {5}, {0, 0, 1, 1, 1});
  // From bool: 0/1.
  NodePtr b = host_leaf({1, 0, 1}, {3}, DType::Bool);
  reference::Value bf = eval(cast(b, DType::Float32));
  EXPECT_EQ(bf.dtype, DType::Float32);
  expect_values(bf, {3}, {1, 0, 1});
  // int64 -> int32 wraps like a C++ conversion.
  expect_values(eval(cast(host_leaf({4294967297.0}, {1}, DType::Int64), DType::Int32)), {1}, {1});
}

TEST(Reference, ReadsEveryDtype) {
  expect_values(eval(cast(host_leaf({1.5, -2}, {2}, DType::Float16), DType::Float64)), {2}, {1.5, -2});
  expect_values(eval(cast(host_leaf({1.5, -2}, {2}, DType::BFloat16), DType::Float64)), {2}, {1.5, -2});
  expect_values(eval(cast(host_leaf({0.1}, {1}, DType::Float32), DType::Float64)), {1}, {double(0.1f)});
  expect_values(eval(cast(host_leaf({-7, 3}, {2}, DType::Int32), DType::Float64)), {2}, {-7, 3});
  expect_values(eval(cast(host_leaf({-7, 3}, {2}, DType::Int64), DType::Float64)), {2}, {-7, 3});
  expect_values(eval(cast(host_leaf({1, 0}, {2}, DType::Bool), DType::Float64)), {2}, {1, 0});
  uint16_t h = half::float_to_f16(0.333f);
  EXPECT_EQ(reference::read_host(&h, DType::Float16, 1).at(0), double(half::f16_to_float(h)));
}

TEST(Reference, Concat) {
  NodePtr a = host_leaf({1, 2}, {2});
  NodePtr b = host_leaf({3}, {1});
  NodePtr e = host_leaf({}, {0});
  expect_values(eval(mk(Op::Concat, {a, e, b}, {0})), {3}, {1, 2, 3});
  NodePtr c = host_leaf({1, 2, 3, 4}, {2, 2});
  NodePtr d = host_leaf({5, 6}, {2, 1});
  expect_values(eval(mk(Op::Concat, {c, d}, {1})), {2, 3}, {1, 2, 5, 3, 4, 6});
}

TEST(Reference, MovementOps) {
  NodePtr x = host_leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  expect_values(eval(mk(Op::Permute, {x}, {1, 0})), {3, 2}, {1, 4, 2, 5, 3, 6});
  expect_values(eval(make_shaped(Op::Reshape, {x}, {3, 2})), {3, 2}, {1, 2, 3, 4, 5, 6});
  NodePtr r = host_leaf({7, 8}, {2, 1});
  expect_values(eval(make_shaped(Op::Expand, {r}, {2, 3})), {2, 3}, {7, 7, 7, 8, 8, 8});
  // Permute of rank 3: [2,1,3] -> perm {2,0,1} gives [3,2,1]; out[k][i][j] = x[i][j][k].
  NodePtr y = host_leaf({1, 2, 3, 4, 5, 6}, {2, 1, 3});
  expect_values(eval(mk(Op::Permute, {y}, {2, 0, 1})), {3, 2, 1}, {1, 4, 2, 5, 3, 6});
}

TEST(Reference, ElementwiseAndCompare) {
  NodePtr a = host_leaf({1, -2, kNaN, 4}, {4});
  NodePtr b = host_leaf({3, -2, 0, kNaN}, {4});
  expect_values(eval(mk(Op::Add, {a, b})), {4}, {4, -4, kNaN, kNaN});
  expect_values(eval(mk(Op::Sub, {a, b})), {4}, {-2, 0, kNaN, kNaN});
  expect_values(eval(mk(Op::Mul, {a, b})), {4}, {3, 4, kNaN, kNaN});
  expect_values(eval(mk(Op::Div, {a, b})), {4}, {1.0 / 3, 1, kNaN, kNaN});
  expect_values(eval(mk(Op::Maximum, {a, b})), {4}, {3, -2, kNaN, kNaN});
  expect_values(eval(mk(Op::Minimum, {a, b})), {4}, {1, -2, kNaN, kNaN});
  reference::Value eq = eval(mk(Op::Eq, {a, b}));
  EXPECT_EQ(eq.dtype, DType::Bool);
  expect_values(eq, {4}, {0, 1, 0, 0});
  expect_values(eval(mk(Op::Ne, {a, b})), {4}, {1, 0, 1, 1});
  expect_values(eval(mk(Op::Lt, {a, b})), {4}, {1, 0, 0, 0});
  expect_values(eval(mk(Op::Le, {a, b})), {4}, {1, 1, 0, 0});
  expect_values(eval(mk(Op::Gt, {a, b})), {4}, {0, 0, 0, 0});
  expect_values(eval(mk(Op::Ge, {a, b})), {4}, {0, 1, 0, 0});
  NodePtr p = host_leaf({0, 1, -1}, {3});
  expect_values(eval(mk(Op::Neg, {p})), {3}, {-0.0, -1, 1});
  expect_values(eval(mk(Op::Exp, {p})), {3}, {1, std::exp(1.0), std::exp(-1.0)});
  expect_values(eval(mk(Op::Log, {p})), {3}, {-INFINITY, 0, kNaN});
  expect_values(eval(mk(Op::Tanh, {p})), {3}, {0, std::tanh(1.0), std::tanh(-1.0)});
  NodePtr c = host_leaf({1, 0, 1}, {3}, DType::Bool);
  NodePtr x = host_leaf({1, 2, 3}, {3});
  NodePtr y = host_leaf({-1, -2, -3}, {3});
  expect_values(eval(mk(Op::Where, {c, x, y})), {3}, {1, -2, 3});
}

TEST(Reference, SourcesFullIotaRng) {
  expect_values(eval(make_shaped(Op::Full, {}, {2, 2}, {}, 2.5)), {2, 2}, {2.5, 2.5, 2.5, 2.5});
  // A constant holds a value of its dtype.
  expect_values(eval(make_shaped(Op::Full, {}, {1}, {}, 2.7, DType::Int32)), {1}, {2});
  expect_values(eval(make_shaped(Op::Iota, {}, {2, 3}, {1})), {2, 3}, {0, 1, 2, 0, 1, 2});
  expect_values(eval(make_shaped(Op::Iota, {}, {2, 3}, {0}, 0, DType::Float32)), {2, 3}, {0, 0, 0, 1, 1, 1});

  Shape s{3, 5};
  NodePtr u = make_shaped(Op::Rng, {}, s, {2, 0}, 0, DType::Float64);
  reference::Value ru = eval(u, 1234, 7);
  for (int64_t i = 0; i < 15; ++i) {
    EXPECT_EQ(ru.data[i], rng::sample(1234, 7, 2, uint64_t(i), 0));
    EXPECT_GE(ru.data[i], 0.0);
    EXPECT_LT(ru.data[i], 1.0);
  }
  NodePtr nrm = make_shaped(Op::Rng, {}, s, {0, 1}, 0, DType::Float32);
  reference::Value rn = eval(nrm, 99, 0);
  for (int64_t i = 0; i < 15; ++i) EXPECT_EQ(rn.data[i], double(float(rng::sample(99, 0, 0, uint64_t(i), 1))));
  // Different offsets draw different numbers.
  EXPECT_NE(eval(u, 1234, 8).data, ru.data);
}

TEST(Reference, ParamsOverrideLeaves) {
  NodePtr a = host_leaf({1, 2}, {2});
  NodePtr b = host_leaf({10, 20}, {2});
  NodePtr s = mk(Op::Add, {a, b});
  ir::Graph g = ir::build_graph({s});
  ASSERT_EQ(g.params.size(), 2u);
  std::vector<reference::Value> params = {{{2}, DType::Float64, {5, 6}}, {{2}, DType::Float64, {100, 200}}};
  expect_values(reference::evaluate(g, 0, 0, params).at(0), {2}, {105, 206});
  expect_values(reference::evaluate(g, 0, 0).at(0), {2}, {11, 22});
  params.pop_back();
  EXPECT_THROW(reference::evaluate(g, 0, 0, params), Error);
}

TEST(Reference, SeveralOutputsAndSharedNodes) {
  NodePtr a = host_leaf({1, 2, 3}, {3});
  NodePtr e = mk(Op::Exp, {a});
  NodePtr s = mk(Op::ReduceSum, {e}, {0});
  ir::Graph g = ir::build_graph({e, s, a});
  auto out = reference::evaluate(g, 0, 0);
  ASSERT_EQ(out.size(), 3u);
  expect_values(out[0], {3}, {std::exp(1.0), std::exp(2.0), std::exp(3.0)});
  expect_values(out[1], {1}, {std::exp(1.0) + std::exp(2.0) + std::exp(3.0)});
  expect_values(out[2], {3}, {1, 2, 3});
}

TEST(Reference, NormalizedErrorHelper) {
  using testing::normalized_error;
  EXPECT_NEAR(normalized_error({1, 2.2}, {1, 2}), 0.1, 1e-12);
  EXPECT_DOUBLE_EQ(normalized_error({0.5}, {0}), 0.5);
  EXPECT_EQ(normalized_error({kNaN, 1}, {kNaN, 1}), 0);
  EXPECT_TRUE(std::isinf(normalized_error({1, 1}, {kNaN, 1})));
  EXPECT_TRUE(std::isinf(normalized_error({kNaN}, {1})));
  EXPECT_EQ(normalized_error({INFINITY}, {INFINITY}), 0);
  EXPECT_TRUE(std::isinf(normalized_error({-INFINITY}, {INFINITY})));
  EXPECT_TRUE(std::isinf(normalized_error({1}, {1, 2})));
}

}  // namespace
}  // namespace tessera
