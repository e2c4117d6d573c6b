// The pjrt backend (src/backends/pjrt/): its PJRT loader against broken plugins and XLA's CPU
// plugin on hand-written StableHLO; collectives emitted as StableHLO and run on 2 and 3 replicas of
// XLA's CPU plugin (its cpu_device_count option) against reference::evaluate_ranks; then whole
// programs through the backend plugin against the cpu backend. XLA's CPU plugin is the one scripts/run unpacks into the build folder; without it
// these tests skip, and fail when CI=true.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>

#include "../../bench/bench_common.h"
#include "pjrt_client.h"
#include "backends/backend.h"
#include "backends/stablehlo/emit.h"
#include "conformance/suite.h"
#include "core/half.h"
#include "ir/build.h"
#include "ir/collectives.h"
#include "ir/graph.h"
#include "reference/evaluator.h"
#include "runtime/allocator.h"
#include "tensor/tensor_impl.h"
#include "tessera/distributed.h"
#include "tessera/export.h"
#include "tessera/nn.h"
#include "tessera/optim.h"
#include "tessera/tessera.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace tt = tessera::testing;
using tt::in_ci;
using tt::random_tensor;

const char* kCpuPlugin = TESSERA_PJRT_CPU_PLUGIN;

#define REQUIRE_CPU_PLUGIN()                                                                   \
  do {                                                                                         \
    if (!std::ifstream(kCpuPlugin).good()) {                                                   \
      if (in_ci()) FAIL() << "XLA's CPU PJRT plugin is missing (CI=true): " << kCpuPlugin;     \
      GTEST_SKIP() << "no XLA CPU PJRT plugin at " << kCpuPlugin << " (scripts/run fetches it)"; \
    }                                                                                          \
  } while (0)

std::string load_error(const std::string& path) {
  try {
    pjrt::Plugin::load(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded)";
}

// ---- the loader refuses what is not a compatible plugin, with the reason ----

TEST(PjrtLoader, RefusesAFileThatIsNotASharedLibrary) {
  std::string path = ::testing::TempDir() + "/not_a_plugin.so";
  std::ofstream(path) << "this is a text file, not a PJRT plugin\n";
  std::string e = load_error(path);
  EXPECT_NE(e.find("[pjrt] plugin " + path + ": cannot load it:"), std::string::npos) << e;
}

TEST(PjrtLoader, RefusesAMissingFile) {
  std::string e = load_error("/nonexistent/pjrt_plugin.so");
  EXPECT_NE(e.find("[pjrt] plugin /nonexistent/pjrt_plugin.so: cannot load it"), std::string::npos) << e;
}

TEST(PjrtLoader, RefusesALibraryWithoutGetPjrtApi) {
  std::string e = load_error(TESSERA_PJRT_NO_SYMBOL_LIBRARY);
  EXPECT_NE(e.find("no GetPjrtApi symbol: not a PJRT plugin"), std::string::npos) << e;
}

TEST(PjrtLoader, RefusesAnIncompatibleMajorVersion) {
  std::string e = load_error(TESSERA_PJRT_WRONG_MAJOR);
  EXPECT_NE(e.find("PJRT API version 1.0 is not supported: this backend speaks 0.115 and later minors of major 0"),
            std::string::npos)
      << e;
}

// ---- XLA's CPU plugin on hand-written StableHLO ----

const pjrt::Plugin& cpu_plugin() {
  static std::unique_ptr<pjrt::Plugin> p = pjrt::Plugin::load(kCpuPlugin);
  return *p;
}

TEST(PjrtCpuPlugin, ReportsItsPlatformAndDevices) {
  REQUIRE_CPU_PLUGIN();
  const pjrt::Plugin& p = cpu_plugin();
  EXPECT_EQ(p.platform(), "cpu");
  EXPECT_GE(p.device_count(), 1);
  EXPECT_EQ(p.api_version(), "0.115");
}

TEST(PjrtCpuPlugin, CompilesAndRunsStableHLOText) {
  REQUIRE_CPU_PLUGIN();
  const pjrt::Plugin& p = cpu_plugin();
  // (x + y) * x and the sum of y: two results.
  const std::string mlir = R"(module @t {
  func.func public @main(%x: tensor<3xf32>, %y: tensor<3xf32>) -> (tensor<3xf32>, tensor<f32>) {
    %s = stablehlo.add %x, %y : tensor<3xf32>
    %m = stablehlo.multiply %s, %x : tensor<3xf32>
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %r = stablehlo.reduce(%y init: %z) applies stablehlo.add across dimensions = [0] : (tensor<3xf32>, tensor<f32>) -> tensor<f32>
    return %m, %r : tensor<3xf32>, tensor<f32>
  }
})";
  auto prog = p.compile(mlir);
  EXPECT_EQ(prog->num_outputs(), 2u);
  float x[3] = {1, 2, 3}, y[3] = {10, 20, 30};
  auto bx = p.upload(0, x, pjrt::tensor_type(DType::Float32, {3}));
  auto by = p.upload(0, y, pjrt::tensor_type(DType::Float32, {3}));
  auto out = prog->execute(0, {bx->buffer, by->buffer}, {}, {pjrt::tensor_type(DType::Float32, {3}), pjrt::tensor_type(DType::Float32, {})});
  float m[3], r;
  out[0]->to_host(m);
  out[1]->to_host(&r);
  EXPECT_EQ(m[0], 11.f);
  EXPECT_EQ(m[1], 44.f);
  EXPECT_EQ(m[2], 99.f);
  EXPECT_EQ(r, 60.f);
  pjrt::MemoryStats s = prog->memory_stats();
  EXPECT_TRUE(s.known);
  EXPECT_EQ(s.arguments, 24);
  EXPECT_GE(s.outputs, 16);  // 12 + 4 bytes, and XLA may count its table of the two results
  EXPECT_GE(s.peak, 16) << "temporaries " << s.temporaries;
  EXPECT_LE(s.peak, s.arguments + s.outputs + s.temporaries + 4096) << "temporaries " << s.temporaries;
}

TEST(PjrtCpuPlugin, AProgramWithATypeErrorIsRefusedWithXLAsMessage) {
  REQUIRE_CPU_PLUGIN();
  const std::string mlir = R"(module @bad {
  func.func public @main(%x: tensor<3xf32>, %y: tensor<4xi32>) -> tensor<3xf32> {
    %s = stablehlo.add %x, %y : (tensor<3xf32>, tensor<4xi32>) -> tensor<3xf32>
    return %s : tensor<3xf32>
  }
})";
  try {
    cpu_plugin().compile(mlir);
    FAIL() << "a mistyped program compiled";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(m.rfind("[pjrt] compile failed: ", 0), 0u) << m;
    EXPECT_GT(m.size(), std::string("[pjrt] compile failed: ").size() + 10) << m;
  }
}

// ---- collectives on replicas: XLA's CPU plugin with two devices (its create option
// "cpu_device_count"), one program compiled for 2 replicas, each replica a Tessera rank ----

const pjrt::Plugin& two_device_plugin() {
  static std::unique_ptr<pjrt::Plugin> p = pjrt::Plugin::load(kCpuPlugin, 2);
  return *p;
}

// A leaf of shape s and dtype t (its values are given per rank).
ir::NodePtr rank_leaf(const Shape& s, DType t) {
  return ir::leaf(runtime::allocate(Device("cpu"), size_t(numel(s)) * itemsize(t)), s, t);
}

std::vector<char> host_bytes(const reference::Value& v) {
  std::vector<char> out(v.data.size() * itemsize(v.dtype));
  for (size_t i = 0; i < v.data.size(); ++i) {
    char* q = out.data() + i * itemsize(v.dtype);
    double x = v.data[i];
    switch (v.dtype) {
      case DType::Float64: std::memcpy(q, &x, 8); break;
      case DType::Float32: { float f = float(x); std::memcpy(q, &f, 4); break; }
      case DType::Float16: { uint16_t h = half::float_to_f16(float(x)); std::memcpy(q, &h, 2); break; }
      case DType::BFloat16: { uint16_t h = half::float_to_bf16(float(x)); std::memcpy(q, &h, 2); break; }
      case DType::Int64: { int64_t k = int64_t(x); std::memcpy(q, &k, 8); break; }
      case DType::Int32: { int32_t k = int32_t(x); std::memcpy(q, &k, 4); break; }
      case DType::Bool: *q = x != 0; break;
      default: ADD_FAILURE() << "no host bytes for " << dtype_name(v.dtype);
    }
  }
  return out;
}

// Runs g (one rank's program) on replicas of XLA's CPU plugin, one per entry of `params`, with
// rank r's parameters on replica r, and compares every output of every rank with
// reference::evaluate_ranks.
void expect_replicas_match_reference(const ir::Graph& g, const std::vector<std::vector<reference::Value>>& params, double tol,
                                     const pjrt::Plugin& p = two_device_plugin()) {
  const int N = int(params.size());
  ASSERT_GE(p.device_count(), N) << "the CPU plugin ignored cpu_device_count";
  stablehlo::Program prog = stablehlo::emit(g);
  ASSERT_EQ(prog.replicas, N);
  auto exe = p.compile(prog.text, N);
  std::vector<std::vector<pjrt::BufferPtr>> held(static_cast<size_t>(N));
  std::vector<std::vector<pjrt::api::Buffer*>> args(static_cast<size_t>(N));
  for (int r = 0; r < N; ++r)
    for (const reference::Value& v : params[size_t(r)]) {
      std::vector<char> bytes = host_bytes(v);
      held[size_t(r)].push_back(p.upload(r, bytes.data(), pjrt::tensor_type(v.dtype, v.shape)));
      args[size_t(r)].push_back(held[size_t(r)].back()->buffer);
    }
  std::vector<pjrt::TensorType> types;
  for (int o : g.outputs) types.push_back(pjrt::tensor_type(g.nodes[size_t(o)]->dtype, g.nodes[size_t(o)]->shape));
  auto outs = exe->execute_replicas(args, types);
  auto want = reference::evaluate_ranks(std::vector<const ir::Graph*>(size_t(N), &g), 0, 0, params);
  for (size_t r = 0; r < size_t(N); ++r)
    for (size_t k = 0; k < g.outputs.size(); ++k) {
      const ir::Node& n = *g.nodes[size_t(g.outputs[k])];
      std::vector<char> bytes(outs[r][k]->nbytes());
      outs[r][k]->to_host(bytes.data());
      std::vector<double> got = reference::read_host(bytes.data(), n.dtype, numel(n.shape));
      const std::vector<double>& w = want[r][k].data;
      ASSERT_EQ(got.size(), w.size());
      for (size_t i = 0; i < w.size(); ++i) {
        if (std::isnan(w[i])) {
          EXPECT_TRUE(std::isnan(got[i])) << ir::op_name(n.op) << " rank " << r << " element " << i << ": " << got[i];
          continue;
        }
        EXPECT_NEAR(got[i], w[i], tol * (1 + std::abs(w[i])))
            << ir::op_name(n.op) << " (output " << k << ") rank " << r << " element " << i;
      }
    }
}

reference::Value values(const Shape& s, DType t, uint32_t seed, bool integral = false) {
  reference::Value v{s, t, std::vector<double>(size_t(numel(s)))};
  uint32_t x = seed * 2654435761u + 12345u;
  for (double& d : v.data) {
    x = x * 1664525u + 1013904223u;
    double u = double(x >> 8) / double(1 << 24);  // [0, 1)
    d = integral ? std::floor(u * 19) - 9 : t == DType::Float16 ? std::round((u * 4 - 2) * 256) / 256 : u * 4 - 2;
  }
  return v;
}

TEST(PjrtCollectives, TheCpuPluginRunsTwoReplicas) {
  REQUIRE_CPU_PLUGIN();
  EXPECT_EQ(two_device_plugin().device_count(), 2);
  EXPECT_GE(cpu_plugin().device_count(), 1);  // the plain client is unaffected
}

// Every collective on 2 replicas against the float64 reference over 2 ranks: all_reduce sum /
// mean / max (a NaN on one rank propagates), all_gather, reduce_scatter, all_to_all, broadcast
// and reduce from root 1, and permutes (a swap, and one pair: rank 0 gets zeros).
TEST(PjrtCollectives, EveryCollectiveOnTwoReplicasMatchesTheReference) {
  REQUIRE_CPU_PLUGIN();
  namespace b = ir::build;
  using ir::ReduceKind;
  ir::NodePtr x = rank_leaf({4, 6}, DType::Float32), h = rank_leaf({2, 3}, DType::Float16),
              k = rank_leaf({5}, DType::Int64), d = rank_leaf({3, 2}, DType::Float64), q = rank_leaf({4}, DType::Bool);
  std::vector<ir::NodePtr> outs = {
      b::all_reduce(x, 2, ReduceKind::Sum), b::all_reduce(x, 2, ReduceKind::Mean), b::all_reduce(x, 2, ReduceKind::Max),
      b::all_gather(x, 2, 1), b::reduce_scatter(x, 2, 0), b::all_to_all(x, 2, 0, 1), b::all_to_all(x, 2, 1, 0),
      b::broadcast(x, 2, 1), b::reduce_to_root(x, 2, 1), b::collective_permute(x, 2, {{0, 1}, {1, 0}}),
      b::collective_permute(x, 2, {{0, 1}}), b::all_reduce(h, 2, ReduceKind::Mean), b::reduce_scatter(h, 2, 0),
      b::all_reduce(k, 2, ReduceKind::Sum), b::all_reduce(k, 2, ReduceKind::Max), b::broadcast(d, 2, 0),
      b::broadcast(q, 2, 1), b::all_reduce(q, 2, ReduceKind::Max), b::reduce_to_root(d, 2, 0)};
  ir::Graph g = ir::build_graph(outs);
  ASSERT_EQ(g.params.size(), 5u);
  std::vector<std::vector<reference::Value>> params(2);
  for (uint32_t r = 0; r < 2; ++r) {
    params[r] = {values({4, 6}, DType::Float32, 10 + r), values({2, 3}, DType::Float16, 20 + r),
                 values({5}, DType::Int64, 30 + r, true), values({3, 2}, DType::Float64, 40 + r),
                 values({4}, DType::Bool, 50 + r, true)};
    for (double& v : params[r][4].data) v = v > 0;
  }
  params[1][0].data[7] = std::nan("");  // max propagates it; sums too
  // the graph's params are numbered by first appearance: x, h, k, d, q
  for (size_t i = 0; i < 5; ++i) ASSERT_EQ(g.nodes[size_t(g.params[i])]->dtype, params[0][i].dtype);
  expect_replicas_match_reference(g, params, 1e-6);
}

// The emitted text, by hand: replica groups over the ranks, the module's replica count, the
// permute's pairs, the masked all_reduce of a broadcast; a graph mixing group sizes is refused.
TEST(PjrtCollectives, TheEmittedTextNamesTheReplicasAndGroups) {
  namespace b = ir::build;
  ir::NodePtr x = rank_leaf({4}, DType::Float32);
  ir::Graph g = ir::build_graph({b::all_reduce(x, 2, ir::ReduceKind::Sum), b::collective_permute(x, 2, {{1, 0}}),
                                 b::broadcast(x, 2, 1)});
  std::string t = stablehlo::emit(g).text;
  EXPECT_NE(t.find("mhlo.num_replicas = 2 : i32"), std::string::npos) << t;
  EXPECT_NE(t.find("\"stablehlo.all_reduce\"(%arg0) ({"), std::string::npos) << t;
  EXPECT_NE(t.find("replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>"), std::string::npos) << t;
  EXPECT_NE(t.find("source_target_pairs = dense<[[1, 0]]> : tensor<1x2xi64>"), std::string::npos) << t;
  EXPECT_NE(t.find("\"stablehlo.bitcast_convert\"(%arg0) : (tensor<4xf32>) -> tensor<4xi32>"), std::string::npos) << t;
  EXPECT_NE(t.find("\"stablehlo.replica_id\"() : () -> tensor<ui32>"), std::string::npos) << t;
  EXPECT_NE(stablehlo::emit(ir::build_graph({b::neg(x)})).text.find("mhlo.num_replicas = 1 : i32"), std::string::npos);
  ir::Graph mixed = ir::build_graph({b::all_reduce(x, 2, ir::ReduceKind::Sum), b::all_gather(x, 3, 0)});
  std::string e = tt::error_message([&] { stablehlo::emit(mixed); });
  EXPECT_NE(e.find("[all_gather] a StableHLO module runs on one set of replicas: this collective is for 3 ranks, an earlier "
                   "all_reduce for 2"), std::string::npos) << e;
}

// Sub-group collectives (a 2 x 2 mesh's axes: 2 ranks at stride 1, {0, 1} and {2, 3}; at stride
// 2, {0, 2} and {1, 3}) on 4 replicas against the reference, which evaluates each group on its
// members: every kind, a root and a permute's pairs being positions in the group. By hand too: the
// emitted replica groups and pairs, and the module's replicas (the least common multiple of the
// groups' spans without a collective over every rank; that collective's ranks with one, which the
// sub-groups must tile).
TEST(PjrtCollectives, SubGroupCollectivesRunOverTheirGroupsOnFourReplicas) {
  namespace b = ir::build;
  ir::NodePtr x = rank_leaf({4, 6}, DType::Float32), d = rank_leaf({2, 2}, DType::Float64);
  using K = ir::ReduceKind;
  ir::Graph g = ir::build_graph({
      b::all_reduce(x, 2, K::Sum, 1), b::all_reduce(x, 2, K::Max, 2), b::all_reduce(d, 2, K::Mean, 1),
      b::all_gather(x, 2, 1, 2), b::reduce_scatter(x, 2, 0, 1), b::all_to_all(x, 2, 0, 1, 2),
      b::broadcast(x, 2, 1, 1), b::broadcast(d, 2, 1, 2), b::reduce_to_root(x, 2, 1, 2),
      b::collective_permute(x, 2, {{0, 1}}, 1), b::collective_permute(d, 2, {{1, 0}, {0, 1}}, 2),
  });
  std::string t = stablehlo::emit(g).text;
  EXPECT_NE(t.find("mhlo.num_replicas = 4 : i32"), std::string::npos) << t;
  EXPECT_NE(t.find("replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>"), std::string::npos) << t;
  EXPECT_NE(t.find("replica_groups = dense<[[0, 2], [1, 3]]> : tensor<2x2xi64>"), std::string::npos) << t;
  EXPECT_NE(t.find("source_target_pairs = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>"), std::string::npos) << t;
  EXPECT_NE(t.find("source_target_pairs = dense<[[2, 0], [0, 2], [3, 1], [1, 3]]> : tensor<4x2xi64>"), std::string::npos) << t;
  EXPECT_EQ(stablehlo::emit(ir::build_graph({b::all_reduce(x, 2, K::Sum, 1)})).replicas, 2);
  EXPECT_EQ(stablehlo::emit(ir::build_graph({b::all_reduce(x, 2, K::Sum, 3), b::all_gather(x, 3, 0, 1)})).replicas, 6);
  EXPECT_EQ(stablehlo::emit(ir::build_graph({b::all_reduce(x, 2, K::Sum, 1), b::all_gather(x, 8, 0)})).replicas, 8);
  std::string e = tt::error_message([&] { stablehlo::emit(ir::build_graph({b::all_reduce(x, 2, K::Sum, 2), b::all_gather(x, 6, 0)})); });
  EXPECT_NE(e.find("[all_reduce] a group of 2 ranks at stride 2 does not tile a communicator of 6 ranks"), std::string::npos) << e;

  REQUIRE_CPU_PLUGIN();
  static std::unique_ptr<pjrt::Plugin> four = pjrt::Plugin::load(kCpuPlugin, 4);
  std::vector<std::vector<reference::Value>> params(4);
  for (uint32_t r = 0; r < 4; ++r) params[r] = {values({4, 6}, DType::Float32, 60 + r), values({2, 2}, DType::Float64, 70 + r)};
  for (size_t i = 0; i < 2; ++i) ASSERT_EQ(g.nodes[size_t(g.params[i])]->dtype, params[0][i].dtype);
  expect_replicas_match_reference(g, params, 1e-6, *four);
}

// export_stablehlo of a traced data-parallel fragment: y = all_reduce(x_r @ w) and the gradient
// of sum(y * y) (whose VJP holds an all_reduce too). The module runs on 2 replicas, replica 0 on
// the exported arguments and replica 1 with its own x; by hand, y = (x0 + x1) @ w on both, and
// rank r's gradient is x_r^T (4 y) (the SPMD loss is the sum of the ranks' losses).
TEST(PjrtCollectives, AnExportedStepWithCollectivesRunsOnTwoReplicas) {
  REQUIRE_CPU_PLUGIN();
  Tensor x0 = random_tensor({3, 4}, DType::Float32, 1, -1, 1), x1 = random_tensor({3, 4}, DType::Float32, 2, -1, 1);
  Tensor w = random_tensor({4, 5}, DType::Float32, 3, -1, 1);
  sync();
  w.requires_grad_();
  Tensor y = dist::all_reduce(matmul(x0, w), 2);
  (y * y).sum().backward();
  StableHLOModule m = export_stablehlo({y, w.grad()});
  EXPECT_EQ(m.replicas, 2);
  ASSERT_EQ(m.arguments.size(), 2u);
  ASSERT_EQ(m.outputs, 2);
  const pjrt::Plugin& p = two_device_plugin();
  auto exe = p.compile(m.text, m.replicas);
  std::vector<std::vector<pjrt::BufferPtr>> held(2);
  std::vector<std::vector<pjrt::api::Buffer*>> args(2);
  for (int r = 0; r < 2; ++r)
    for (const Tensor& a : m.arguments) {
      // rank 1 reads its own x where rank 0 reads x0 (w is shared)
      std::vector<float> v = (r == 1 && a.shape() == x0.shape() ? x1 : a).to_vector<float>();
      held[size_t(r)].push_back(p.upload(r, v.data(), pjrt::tensor_type(DType::Float32, a.shape())));
      args[size_t(r)].push_back(held[size_t(r)].back()->buffer);
    }
  auto outs = exe->execute_replicas(args, {pjrt::tensor_type(DType::Float32, {3, 5}), pjrt::tensor_type(DType::Float32, {4, 5})});
  Tensor wd = w.detach();
  Tensor want_y = matmul(x0 + x1, wd);
  std::vector<Tensor> xs{x0, x1};
  for (int r = 0; r < 2; ++r) {
    std::vector<float> got_y(15), got_g(20);
    outs[size_t(r)][0]->to_host(got_y.data());
    outs[size_t(r)][1]->to_host(got_g.data());
    std::vector<double> gy(got_y.begin(), got_y.end()), gg(got_g.begin(), got_g.end());
    EXPECT_TRUE(tt::all_close(gy, want_y.to_vector<double>(), 1e-5)) << "rank " << r;
    EXPECT_TRUE(tt::all_close(gg, matmul(xs[size_t(r)].transpose(0, 1), want_y * 4.0).to_vector<double>(), 1e-5)) << "rank " << r;
  }
}

// One SPMD case of the conformance suite (Case::ranks ranks, each with its own inputs and output
// cotangents, as the suite's runner draws them) traced on the cpu, emitted, run on that many
// replicas of XLA's CPU plugin and compared, every rank's outputs and gradients, with
// reference::evaluate_ranks at twice the suite's tolerance (integers exact). "" when it matches.
std::string run_case_on_replicas(const pjrt::Plugin& p, const conformance::Case& c, uint32_t seed) {
  const size_t N = size_t(c.ranks);
  std::vector<conformance::Rng> rngs;
  for (size_t k = 0; k < N; ++k) rngs.emplace_back(seed + uint32_t(k) * 7919u);
  std::map<const Buffer*, std::vector<std::vector<double>>> known;  // rank 0's buffer -> every rank's values
  auto add_leaf = [&](std::vector<std::vector<double>> per_rank, const Shape& shape, DType t) {
    for (auto& v : per_rank) {  // as the dtype holds them
      std::vector<char> b = host_bytes({shape, t, v});
      v = reference::read_host(b.data(), t, numel(shape));
    }
    std::vector<char> bytes = host_bytes({shape, t, per_rank[0]});
    std::shared_ptr<Buffer> buf = runtime::upload(Device("cpu"), bytes.data(), bytes.size());
    known[buf.get()] = std::move(per_rank);
    return detail::from_buffer(buf, shape, t);
  };
  std::vector<Tensor> leaves, viewed;
  for (const conformance::Input& in : c.inputs) {
    std::vector<std::vector<double>> v(N, std::vector<double>(size_t(numel(in.shape))));
    for (size_t k = 0; k < N; ++k)
      for (double& x : v[k]) x = in.fixed.empty() ? in.gen(rngs[k]) : 0;
    if (!in.fixed.empty()) v.assign(N, in.fixed);
    Tensor t = add_leaf(std::move(v), in.shape, in.dtype);
    if (in.grad) t.requires_grad_();
    leaves.push_back(t);
    viewed.push_back(in.view ? in.view(t) : t);
  }
  conformance::Context ctx{Device("cpu"), [&](const std::vector<double>& v, const Shape& shape, DType t) {
                             return add_leaf(std::vector<std::vector<double>>(N, v), shape, t);
                           }};
  std::vector<Tensor> results = c.fn(viewed, ctx);
  const size_t n_out = results.size();
  for (const Tensor& o : results)
    if (o.requires_grad()) {
      std::vector<std::vector<double>> w(N, std::vector<double>(size_t(o.numel())));
      for (size_t k = 0; k < N; ++k)
        for (double& x : w[k]) x = std::uniform_real_distribution<double>(-1, 1)(rngs[k]);
      o.backward(add_leaf(std::move(w), o.shape(), o.dtype()));
    }
  for (size_t k = 0; k < c.inputs.size(); ++k)
    if (c.inputs[k].grad) {
      if (!leaves[k].grad().defined()) return "no gradient reached input " + std::to_string(k);
      results.push_back(leaves[k].grad());
    }
  std::vector<ir::NodePtr> nodes;
  for (const Tensor& t : results) nodes.push_back(detail::node_of(t));
  ir::Graph g = ir::build_graph(nodes);
  std::vector<std::vector<reference::Value>> params(N);
  for (int q : g.params) {
    const ir::Node& n = *g.nodes[size_t(q)];
    auto it = known.find(n.buffer.get());
    if (it == known.end()) return "a leaf the case did not make";
    for (size_t k = 0; k < N; ++k) params[k].push_back({n.shape, n.dtype, it->second[k]});
  }
  stablehlo::Program prog = stablehlo::emit(g);
  if (prog.replicas != int64_t(N)) return "emitted for " + std::to_string(prog.replicas) + " replicas";
  auto exe = p.compile(prog.text, prog.replicas);
  std::vector<std::vector<pjrt::BufferPtr>> held(N);
  std::vector<std::vector<pjrt::api::Buffer*>> args(N);
  for (size_t k = 0; k < N; ++k)
    for (const reference::Value& v : params[k]) {
      std::vector<char> bytes = host_bytes(v);
      held[k].push_back(p.upload(int(k), bytes.data(), pjrt::tensor_type(v.dtype, v.shape)));
      args[k].push_back(held[k].back()->buffer);
    }
  std::vector<pjrt::TensorType> types;
  for (int o : g.outputs) types.push_back(pjrt::tensor_type(g.nodes[size_t(o)]->dtype, g.nodes[size_t(o)]->shape));
  auto outs = exe->execute_replicas(args, types);
  std::vector<const ir::Graph*> graphs(N, &g);
  auto want = reference::evaluate_ranks(graphs, 0, 0, params);
  for (size_t k = 0; k < N; ++k)
    for (size_t o = 0; o < g.outputs.size(); ++o) {
      const reference::Value& w = want[k][o];
      std::vector<char> bytes(outs[k][o]->nbytes());
      if (!bytes.empty()) outs[k][o]->to_host(bytes.data());
      std::vector<double> got = reference::read_host(bytes.data(), w.dtype, numel(w.shape));
      const bool grad = o >= n_out;
      const double tol = !is_floating(w.dtype) ? 0 : 2 * (grad ? (c.grad_tol >= 0 ? c.grad_tol : conformance::default_tolerance(w.dtype, true))
                                                             : (c.tol >= 0 ? c.tol : conformance::default_tolerance(w.dtype, false)));
      double scale = 0, err = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        if (std::isnan(w.data[i]) != std::isnan(got[i])) return "rank " + std::to_string(k) + " result " + std::to_string(o) + ": NaN mismatch at " + std::to_string(i);
        if (std::isnan(w.data[i])) continue;
        scale = std::max(scale, std::abs(w.data[i]));
        err = std::max(err, std::abs(got[i] - w.data[i]));
      }
      if (err > tol * std::max(scale, 1e-30) && err > 0)
        return "rank " + std::to_string(k) + " result " + std::to_string(o) + " (" + dtype_name(w.dtype) + shape_str(w.shape) +
               "): error " + std::to_string(err) + " against max " + std::to_string(scale);
    }
  return "";
}

const pjrt::Plugin& three_device_plugin() {
  static std::unique_ptr<pjrt::Plugin> p = pjrt::Plugin::load(kCpuPlugin, 3);
  return *p;
}

// Every case of every collective row of the conformance suite (2 and 3 ranks; float32 and
// float64 with gradients, an integer dtype, permuted and strided inputs, zero-size shards) on
// replicas of XLA's CPU plugin against the reference: the collectives and their VJPs as StableHLO.
TEST(PjrtCollectives, TheConformanceSuitesCollectiveCasesMatchTheReferenceOnReplicas) {
  REQUIRE_CPU_PLUGIN();
  const pjrt::Plugin& p = three_device_plugin();
  ASSERT_EQ(p.device_count(), 3);
  int cases = 0;
  for (int op = int(ir::Op::AllReduce); op <= int(ir::Op::CollectivePermute); ++op)
    for (const conformance::Case& c : conformance::primitive_cases(ir::Op(op))) {
      ASSERT_GT(c.ranks, 0) << c.variant;
      SCOPED_TRACE(std::string(ir::op_name(ir::Op(op))) + " " + c.variant);
      std::string why;
      try {
        why = run_case_on_replicas(p, c, 1000u + uint32_t(cases));
      } catch (const std::exception& e) {
        why = e.what();
      }
      EXPECT_EQ(why, "");
      ++cases;
    }
  EXPECT_GE(cases, 30);  // the suite's collective rows held 30 cases when this was written
}

// A data-parallel training step exported as StableHLO and trained on 2 replicas: a small GPT,
// each replica its 2 rows of a global batch of 4, the gradients all_reduce(mean)ed, SGD; the
// step's module exported once, the updated weights fed back from their aliased outputs. Its
// losses (the all-reduced mean) equal one cpu device's on the whole batch (1e-5 over 3 steps).
TEST(PjrtCollectives, AnExportedDataParallelStepTrainsOnTwoReplicasAsOneDeviceOnTheWholeBatch) {
  REQUIRE_CPU_PLUGIN();
  const nn::GPTConfig cfg{.vocab = 24, .block = 8, .embd = 16, .heads = 2, .layers = 1, .dropout = 0.0, .bias = true, .tied_head = false};
  const int kSteps = 3;
  std::vector<std::vector<int64_t>> xs, ys;  // the global batch of each step, 4 x 8
  std::mt19937 gen(5);
  for (int s = 0; s < kSteps; ++s) {
    std::vector<int64_t> x(32), y(32);
    for (auto& v : x) v = int64_t(gen() % 24);
    for (auto& v : y) v = int64_t(gen() % 24);
    xs.push_back(x), ys.push_back(y);
  }
  TensorOptions ids{DType::Int64, Device("cpu")};
  auto rows = [](const std::vector<int64_t>& v, int r) { return std::vector<int64_t>(v.begin() + r * 16, v.begin() + (r + 1) * 16); };
  // One device, the whole batch.
  std::vector<double> want;
  {
    manual_seed(7);
    nn::GPT model(cfg);
    optim::SGD opt(model.parameters(), {.lr = 0.5});
    for (int s = 0; s < kSteps; ++s) {
      Tensor loss = model.loss(from_vector(xs[size_t(s)], {4, 8}, ids), from_vector(ys[size_t(s)], {4, 8}, ids));
      loss.backward();
      opt.step();
      opt.zero_grad();
      want.push_back(loss.item());
    }
  }
  // Replica 0's step traced on its rows and exported; replica 1 is given its own rows.
  manual_seed(7);
  nn::GPT model(cfg);
  optim::SGD opt(model.parameters(), {.lr = 0.5});
  sync();
  Tensor x0 = from_vector(rows(xs[0], 0), {2, 8}, ids), y0 = from_vector(rows(ys[0], 0), {2, 8}, ids);
  Tensor loss = model.loss(x0, y0);
  loss.backward();
  for (Tensor& p : model.parameters()) p.set_grad(dist::all_reduce(p.grad(), 2, dist::Reduce::Mean));
  opt.step();
  std::vector<Tensor> outs{dist::all_reduce(loss, 2, dist::Reduce::Mean)};
  for (const Tensor& p : model.parameters()) outs.push_back(p);
  StableHLOModule m = export_stablehlo(outs);
  ASSERT_EQ(m.replicas, 2);
  ASSERT_EQ(m.aliases.size(), model.parameters().size()) << "every weight updated in place";
  // An argument's bytes straight from its buffer: reading a tensor would sync the pending step,
  // whose collectives have no communicator here.
  auto bytes_of = [](const Tensor& t) {
    std::vector<char> b(size_t(t.numel()) * itemsize(t.dtype()));
    runtime::download(*detail::impl_of(t)->buffer, b.data(), b.size());
    return b;
  };
  std::vector<char> x0_bytes = bytes_of(x0);
  int xa = -1, ya = -1;  // the token arguments
  for (size_t a = 0; a < m.arguments.size(); ++a)
    if (m.arguments[a].dtype() == DType::Int64) (bytes_of(m.arguments[a]) == x0_bytes ? xa : ya) = int(a);
  ASSERT_GE(xa, 0);
  ASSERT_GE(ya, 0);
  const pjrt::Plugin& p = two_device_plugin();
  auto exe = p.compile(m.text, 2);
  std::vector<pjrt::TensorType> types;
  for (const Tensor& o : outs) types.push_back(pjrt::tensor_type(o.dtype(), o.shape()));
  for (int k = 0; k < m.index_checks; ++k) types.push_back({pjrt::api::ElementType::S64, {2}});  // the embeddings' gathers
  std::vector<std::vector<pjrt::BufferPtr>> held(2, std::vector<pjrt::BufferPtr>(m.arguments.size()));
  for (int r = 0; r < 2; ++r)
    for (size_t a = 0; a < m.arguments.size(); ++a)
      if (int(a) != xa && int(a) != ya) {
        ASSERT_EQ(m.arguments[a].dtype(), DType::Float32);
        std::vector<char> v = bytes_of(m.arguments[a]);
        held[size_t(r)][a] = p.upload(r, v.data(), pjrt::tensor_type(DType::Float32, m.arguments[a].shape()));
      }
  for (int s = 0; s < kSteps; ++s) {
    std::vector<std::vector<pjrt::api::Buffer*>> args(2);
    for (int r = 0; r < 2; ++r) {
      std::vector<int64_t> x = rows(xs[size_t(s)], r), y = rows(ys[size_t(s)], r);
      held[size_t(r)][size_t(xa)] = p.upload(r, x.data(), pjrt::tensor_type(DType::Int64, {2, 8}));
      held[size_t(r)][size_t(ya)] = p.upload(r, y.data(), pjrt::tensor_type(DType::Int64, {2, 8}));
      for (auto& b : held[size_t(r)]) args[size_t(r)].push_back(b->buffer);
    }
    auto got = exe->execute_replicas(args, types);
    for (int r = 0; r < 2; ++r) {
      float l = 0;
      got[size_t(r)][0]->to_host(&l);
      EXPECT_NEAR(l, want[size_t(s)], 1e-5 * std::abs(want[size_t(s)])) << "step " << s << " replica " << r;
      for (auto [a, o] : m.aliases) held[size_t(r)][size_t(a)] = got[size_t(r)][size_t(o)];  // the donated weights' new values
    }
  }
  EXPECT_GT(want[0], want[kSteps - 1]) << "it trains";
}

// A program for more replicas than the client has devices is refused before XLA sees it.
TEST(PjrtCollectives, MoreReplicasThanDevicesIsRefused) {
  REQUIRE_CPU_PLUGIN();
  ir::Graph g = ir::build_graph({ir::build::all_reduce(rank_leaf({4}, DType::Float32), 3, ir::ReduceKind::Sum)});
  std::string e = tt::error_message([&] { two_device_plugin().compile(stablehlo::emit(g).text, 3); });
  EXPECT_NE(e.find("[pjrt] a program for 3 replicas cannot run on the 2 devices of plugin"), std::string::npos) << e;
}

// ---- whole programs through the backend plugin: pjrt:0 is XLA's CPU plugin of the build, or the
// first plugin of TESSERA_PJRT_PLUGINS (scripts/gpu-check runs these on XLA's CUDA plugin) ----

const Device kPjrt("pjrt:0");

TEST(Pjrt, ListsThePluginAndItsDevices) {
  REQUIRE_CPU_PLUGIN();
  bool found = false;
  for (const DeviceInfo& d : devices())
    if (d.device == kPjrt) {
      found = true;
      // XLA's CPU plugin of the build, or the plugin TESSERA_PJRT_PLUGINS puts first (a GPU's).
      bool cpu = d.description.rfind("XLA cpu device 0 of ", 0) == 0;
      EXPECT_TRUE(cpu || d.description.rfind("XLA ", 0) == 0) << d.description;
      EXPECT_NE(d.description.find(" through PJRT 0."), std::string::npos) << d.description;
      EXPECT_EQ(d.accelerator, !cpu);
    }
  EXPECT_TRUE(found);
}

// Plugins that fail to load are listed beside the ones that work (a child: plugins are found once
// per process).
TEST(Pjrt, DevicesReportsPluginsThatCannotLoad) {
  REQUIRE_CPU_PLUGIN();
  std::string text = ::testing::TempDir() + "/text_plugin.so";
  std::ofstream(text) << "not a library\n";
  std::string cmd = "TESSERA_PJRT_PLUGINS=" + std::string(TESSERA_PJRT_WRONG_MAJOR) + ":" + text + " " + TESSERA_CLI + " devices 2>&1";
  int status = 0;
  std::string out = tt::run_command(cmd, &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("PJRT API version 1.0 is not supported"), std::string::npos) << out;
  EXPECT_NE(out.find("text_plugin.so: cannot load it"), std::string::npos) << out;
  EXPECT_NE(out.find("pjrt:0"), std::string::npos) << out;  // the build's CPU plugin still works
}

TEST(Pjrt, AProgramComputesWhatTheCpuComputes) {
  REQUIRE_CPU_PLUGIN();
  auto f = [](Device d) {
    Tensor a = random_tensor({4, 6}, DType::Float32, 1, -1, 1).to(d), b = random_tensor({6, 5}, DType::Float32, 2, -1, 1).to(d);
    Tensor idx = tt::make_tensor({3, 0, 2}, {3}, DType::Int64).to(d);
    Tensor y = softmax(matmul(a, b), 1);
    return std::vector<std::vector<double>>{y.to_vector<double>(), index_select(y, 0, idx).sum({1}).to_vector<double>()};
  };
  auto c = f(Device("cpu")), p = f(kPjrt);
  EXPECT_TRUE(tt::all_close(p[0], c[0], 1e-6));
  EXPECT_TRUE(tt::all_close(p[1], c[1], 1e-6));
  EXPECT_GT(metrics().devices["pjrt"].executables_run, 0);
}

// The memory report of a program compiled for pjrt carries XLA's own figures (it owns the
// temporaries); the cpu's has none.
TEST(Pjrt, TheMemoryReportIsXlas) {
  REQUIRE_CPU_PLUGIN();
  auto plan = [](Device d) {
    Tensor a = random_tensor({64, 32}, DType::Float32, 1).to(d), b = random_tensor({32, 48}, DType::Float32, 2).to(d);
    return plan_memory({softmax(matmul(a, b), 1).sum()});
  };
  MemoryPlan p = plan(kPjrt);
  EXPECT_EQ(p.device_report.rfind("XLA: peak ", 0), 0u) << p.device_report;
  EXPECT_NE(p.report().find("on the device: XLA: peak "), std::string::npos) << p.report();
  EXPECT_NE(p.device_report.find("arguments 0.01 MiB"), std::string::npos) << p.device_report;  // (64x32 + 32x48) x 4 bytes
  EXPECT_EQ(plan(Device("cpu")).device_report, "");
}

TEST(Pjrt, OutOfRangeIndexRaisesTheCpuError) {
  REQUIRE_CPU_PLUGIN();
  auto message = [](Device d) {
    Tensor w = random_tensor({4, 3}, DType::Float32, 1, -1, 1).to(d);
    Tensor idx = tt::make_tensor({1, 2, 7, 9}, {4}, DType::Int64).to(d);
    Scope s{"lookup"};
    return tt::error_message([&] { index_select(w, 0, idx).to_vector<double>(); });
  };
  std::string cpu = message(Device("cpu")), pjrt = message(kPjrt);
  EXPECT_NE(pjrt.find("index 7 out of range [0, 4)"), std::string::npos) << pjrt;
  EXPECT_EQ(pjrt, cpu);
}

TEST(Pjrt, RandomNumbersAreTheCpus) {
  REQUIRE_CPU_PLUGIN();
  auto draw = [](Device d) {
    manual_seed(11);
    return rand({1000}, {DType::Float32, d}).to_vector<double>();
  };
  EXPECT_EQ(draw(kPjrt), draw(Device("cpu")));
}

// Parameters stay on the device between steps: after the first steps, a step of SGD on a linear
// model moves what it moves on the cpu (its learning rate in, its loss out), no weights.
TEST(Pjrt, ParametersStayOnTheDeviceBetweenSteps) {
  REQUIRE_CPU_PLUGIN();
  auto train = [](Device d) {
    manual_seed(3);
    nn::Linear lin(16, 4);
    lin.to(d);
    optim::SGD opt(lin.parameters(), {.lr = 0.1});
    Tensor x = random_tensor({8, 16}, DType::Float32, 4).to(d);
    auto step = [&] {
      opt.zero_grad();
      Tensor loss = (lin.forward(x) * lin.forward(x)).mean();
      loss.backward();
      opt.step();
      return loss.item();
    };
    double first = step();
    step();
    DeviceMetrics m0 = metrics().devices[d.kind];
    double last = 0;
    for (int i = 0; i < 3; ++i) last = step();
    DeviceMetrics m1 = metrics().devices[d.kind];
    EXPECT_LT(last, first);
    EXPECT_EQ(m1.bytes_moved_in_graphs, m0.bytes_moved_in_graphs);
    return std::vector<int64_t>{m1.bytes_to_device - m0.bytes_to_device, m1.bytes_to_host - m0.bytes_to_host};
  };
  std::vector<int64_t> cpu = train(Device("cpu")), pjrt = train(kPjrt);
  EXPECT_EQ(pjrt, cpu);
  EXPECT_EQ(pjrt[1], 3 * 4) << "only the three losses come back";
  EXPECT_LT(pjrt[0], 16 * 4) << "the weights went back to the device";
}

TEST(Pjrt, ALaunchOfOneStepDeclinesClearly) {
  REQUIRE_CPU_PLUGIN();
  backends::Backend& be = backends::backend_for(kPjrt);
  kir::Step st;
  st.sources.push_back({"add", ""});
  auto k = be.compile(st);
  std::string e = tt::error_message([&] { be.launch(*k, st, {}); });
  EXPECT_NE(e.find("[pjrt] pjrt runs whole programs through XLA"), std::string::npos) << e;
}

// The benchmark GPT (bench/bench_common.h) with dropout, 20 AdamW steps: the loss on pjrt (XLA's
// CPU plugin) equals the cpu's at every step to 1e-4 relative.
TEST(Pjrt, BenchmarkGptTrainsToTheCpuLosses) {
  REQUIRE_CPU_PLUGIN();
  auto train = [](Device dev) { return tt::bench_gpt_losses(dev, 20); };
  auto t0 = std::chrono::steady_clock::now();
  std::vector<double> cpu = train(Device("cpu"));
  auto t1 = std::chrono::steady_clock::now();
  std::vector<double> xla = train(kPjrt);
  auto t2 = std::chrono::steady_clock::now();
  ASSERT_EQ(cpu.size(), xla.size());
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(xla[i], cpu[i], 1e-4 * std::abs(cpu[i])) << "step " << i;
  EXPECT_LT(cpu.back(), cpu.front());
  EXPECT_EQ(metrics().devices["pjrt"].bytes_moved_in_graphs, 0);
  auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::printf("[pjrt] gpt losses: step 0 %.6f / %.6f, step 19 %.6f / %.6f (cpu / pjrt); %.1f s / %.1f s with compiles\n", cpu[0],
              xla[0], cpu[19], xla[19], secs(t0, t1), secs(t1, t2));
}

}  // namespace
}  // namespace tessera
