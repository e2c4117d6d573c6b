// Collectives (docs/architecture.md "Parallelism"): the primitives' shape rules and errors; the
// float64 reference over N ranks against hand-computed values; every VJP rule against central
// finite differences of the TOTAL loss (the sum of every rank's loss: the SPMD convention),
// perturbing one element on one rank at a time; the in-process communicator on raw buffers
// (values, a mismatch failing every rank, a timeout naming the missing rank); and graphs with
// collectives compiled once and run on in-process ranks by the cpu backend, against the reference.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <thread>

#include "backends/communicator.h"
#include "ir/build.h"
#include "ir/collectives.h"
#include "ir/graph.h"
#include "reference/evaluator.h"
#include "runtime/allocator.h"
#include "runtime/realize.h"
#include "tensor/tensor_impl.h"
#include "test_util.h"

namespace tessera {
namespace {

using ir::NodePtr;
using ir::Op;
using ir::ReduceKind;
using reference::Value;
using V = std::vector<double>;
namespace b = ir::build;

// A float64 (or `t`) leaf over a fresh host buffer holding `v`.
NodePtr leaf(const V& v, const Shape& s, DType t = DType::Float64) {
  std::shared_ptr<Buffer> buf = runtime::allocate(Device("cpu"), v.size() * itemsize(t));
  for (size_t i = 0; i < v.size(); ++i) {
    char* q = static_cast<char*>(buf->data) + i * itemsize(t);
    if (t == DType::Float64) std::memcpy(q, &v[i], 8);
    else if (t == DType::Float32) { float f = float(v[i]); std::memcpy(q, &f, 4); }
    else if (t == DType::Int64) { int64_t k = int64_t(v[i]); std::memcpy(q, &k, 8); }
  }
  return ir::leaf(buf, s, t);
}
NodePtr zeros_leaf(const Shape& s, DType t = DType::Float64) { return leaf(V(size_t(numel(s)), 0.0), s, t); }

V random_values(size_t n, uint32_t seed) {
  std::mt19937 r(seed);
  std::uniform_real_distribution<double> u(-2, 2);
  V v(n);
  for (double& x : v) x = u(r);
  return v;
}

// Evaluates one graph on N ranks with per-rank parameter values (in the graph's params order).
std::vector<std::vector<Value>> on_ranks(const ir::Graph& g, const std::vector<std::vector<Value>>& params) {
  std::vector<const ir::Graph*> gs(params.size(), &g);
  return reference::evaluate_ranks(gs, 0, 0, params);
}

// ---- shape rules and errors ----
TEST(Collectives, ShapeRules) {
  NodePtr x = zeros_leaf({4, 6}, DType::Float32);
  EXPECT_EQ(b::all_reduce(x, 2, ReduceKind::Mean)->shape, (Shape{4, 6}));
  EXPECT_EQ(b::all_gather(x, 3, 1)->shape, (Shape{4, 18}));
  EXPECT_EQ(b::reduce_scatter(x, 2, 0)->shape, (Shape{2, 6}));
  EXPECT_EQ(b::all_to_all(x, 2, 0, 1)->shape, (Shape{2, 12}));
  EXPECT_EQ(b::all_to_all(x, 3, 1, 1)->shape, (Shape{4, 6}));
  EXPECT_EQ(b::broadcast(x, 4, 3)->shape, (Shape{4, 6}));
  EXPECT_EQ(b::collective_permute(x, 3, {{0, 1}, {1, 2}})->shape, (Shape{4, 6}));
  EXPECT_EQ(b::all_gather(x, 2, 0)->dtype, DType::Float32);
  // Cost: an all-reduce of N ranks sends 2 (N-1)/N of its bytes (a ring).
  NodePtr ar = b::all_reduce(x, 4, ReduceKind::Sum);
  EXPECT_DOUBLE_EQ(ir::info(Op::AllReduce).cost(*ar).comm_bytes, 2 * 0.75 * 24 * 4);
}

TEST(Collectives, BadAttributesAreClearErrors) {
  NodePtr x = zeros_leaf({2, 5}, DType::Float32);
  std::string e = testing::error_message([&] { b::reduce_scatter(x, 3, 1); });
  EXPECT_NE(e.find("[reduce_scatter]"), std::string::npos) << e;
  EXPECT_NE(e.find("uneven split"), std::string::npos) << e;
  EXPECT_NE(e.find("float32[2, 5]"), std::string::npos) << e;
  EXPECT_NE(e.find("3 ranks"), std::string::npos) << e;
  e = testing::error_message([&] { b::all_to_all(x, 2, 1, 0); });
  EXPECT_NE(e.find("[all_to_all] uneven split"), std::string::npos) << e;
  e = testing::error_message([&] { b::broadcast(x, 2, 2); });
  EXPECT_NE(e.find("[broadcast] root 2 out of range for 2 ranks"), std::string::npos) << e;
  e = testing::error_message([&] { b::collective_permute(x, 3, {{0, 1}, {2, 1}}); });
  EXPECT_NE(e.find("[collective_permute] rank 1 appears twice as a destination"), std::string::npos) << e;
  e = testing::error_message([&] { b::all_gather(x, 0, 0); });
  EXPECT_NE(e.find("group size"), std::string::npos) << e;
  e = testing::error_message([&] { b::all_gather(x, 2, 2); });
  EXPECT_NE(e.find("[all_gather] axis 2 out of range for float32[2, 5]"), std::string::npos) << e;
  e = testing::error_message([&] { b::all_reduce(zeros_leaf({2}, DType::Int64), 2, ReduceKind::Mean); });
  EXPECT_NE(e.find("mean needs a floating tensor"), std::string::npos) << e;
}

// ---- the reference over ranks, by hand ----
TEST(Collectives, ReferenceMatchesHandValues) {
  NodePtr x = zeros_leaf({2, 2});
  auto run = [&](const NodePtr& y, const std::vector<V>& xs) {
    ir::Graph g = ir::build_graph({y});
    std::vector<std::vector<Value>> p;
    for (const V& v : xs) p.push_back({Value{{2, 2}, DType::Float64, v}});
    std::vector<V> out;
    for (auto& r : on_ranks(g, p)) out.push_back(r[0].data);
    return out;
  };
  const std::vector<V> xs = {{1, 2, 3, 4}, {10, 20, 30, 40}};
  EXPECT_EQ(run(b::all_reduce(x, 2, ReduceKind::Sum), xs), (std::vector<V>{{11, 22, 33, 44}, {11, 22, 33, 44}}));
  EXPECT_EQ(run(b::all_reduce(x, 2, ReduceKind::Mean), xs), (std::vector<V>{{5.5, 11, 16.5, 22}, {5.5, 11, 16.5, 22}}));
  EXPECT_EQ(run(b::all_reduce(x, 2, ReduceKind::Max), {{1, 50, 3, -1}, {2, 5, 3, -2}}),
            (std::vector<V>{{2, 50, 3, -1}, {2, 50, 3, -1}}));
  // all_gather along axis 1: [[1,2,10,20],[3,4,30,40]] on both.
  EXPECT_EQ(run(b::all_gather(x, 2, 1), xs), (std::vector<V>{{1, 2, 10, 20, 3, 4, 30, 40}, {1, 2, 10, 20, 3, 4, 30, 40}}));
  // reduce_scatter along axis 0: the sum [[11,22],[33,44]], row r to rank r.
  EXPECT_EQ(run(b::reduce_scatter(x, 2, 0), xs), (std::vector<V>{{11, 22}, {33, 44}}));
  // reduce_scatter along axis 1: column r.
  EXPECT_EQ(run(b::reduce_scatter(x, 2, 1), xs), (std::vector<V>{{11, 33}, {22, 44}}));
  // all_to_all split rows, concat columns: rank r gets row r of every rank, side by side.
  EXPECT_EQ(run(b::all_to_all(x, 2, 0, 1), xs), (std::vector<V>{{1, 2, 10, 20}, {3, 4, 30, 40}}));
  // split and concat along columns: rank r gets column r of each rank.
  EXPECT_EQ(run(b::all_to_all(x, 2, 1, 1), xs), (std::vector<V>{{1, 10, 3, 30}, {2, 20, 4, 40}}));
  EXPECT_EQ(run(b::broadcast(x, 2, 1), xs), (std::vector<V>{{10, 20, 30, 40}, {10, 20, 30, 40}}));
  EXPECT_EQ(run(b::reduce_to_root(x, 2, 1), xs), (std::vector<V>{{0, 0, 0, 0}, {11, 22, 33, 44}}));
  EXPECT_EQ(run(b::collective_permute(x, 2, {{0, 1}}), xs), (std::vector<V>{{0, 0, 0, 0}, {1, 2, 3, 4}}));
  EXPECT_EQ(run(b::collective_permute(x, 2, {{0, 1}, {1, 0}}), xs), (std::vector<V>{{10, 20, 30, 40}, {1, 2, 3, 4}}));
}

TEST(Collectives, ReferenceRefusesRanksThatDisagree) {
  NodePtr x2 = zeros_leaf({2}), x3 = zeros_leaf({3});
  ir::Graph a = ir::build_graph({b::all_reduce(x2, 2, ReduceKind::Sum)});
  ir::Graph c = ir::build_graph({b::all_reduce(x3, 2, ReduceKind::Sum)});
  std::string e = testing::error_message([&] { reference::evaluate_ranks({&a, &c}, 0, 0); });
  EXPECT_NE(e.find("[all_reduce] the ranks disagree"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 0: all_reduce{2,0} of float64[2]"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 1: all_reduce{2,0} of float64[3]"), std::string::npos) << e;
  // A rank that ends without the collective the other waits in.
  ir::Graph plain = ir::build_graph({b::neg(x2)});
  e = testing::error_message([&] { reference::evaluate_ranks({&a, &plain}, 0, 0); });
  EXPECT_NE(e.find("rank 1: no further collective"), std::string::npos) << e;
  // A graph for 2 ranks on 3.
  e = testing::error_message([&] { reference::evaluate_ranks({&a, &a, &a}, 0, 0); });
  EXPECT_NE(e.find("the graph is for 2 ranks but runs on 3"), std::string::npos) << e;
}

// ---- VJPs against finite differences of the total loss ----
struct VjpCase {
  std::string name;
  std::function<NodePtr(const NodePtr&)> f;
  Shape in;
};

// The worst normalized error, over ranks, of the VJP rules' gradient of the total loss against
// central finite differences (N ranks; each rank's loss is sum(y_r * w_r), w_r random).
double vjp_error(const VjpCase& c, int N) {
  NodePtr x = zeros_leaf(c.in);
  NodePtr y = c.f(x);
  NodePtr w = zeros_leaf(y->shape);
  // The analytic gradient: the primitives' VJP rules applied backwards over the graph.
  ir::Graph fg = ir::build_graph({y});
  std::map<const ir::Node*, NodePtr> ct;
  ct[y.get()] = w;
  for (size_t i = fg.nodes.size(); i-- > 0;) {
    const ir::Node* n = fg.nodes[i].get();
    auto it = ct.find(n);
    if (it == ct.end() || n->op == Op::Leaf) continue;
    std::vector<NodePtr> gs = ir::info(n->op).vjp(*n, fg.nodes[i], it->second);
    for (size_t k = 0; k < gs.size(); ++k) {
      if (!gs[k]) continue;
      const ir::Node* in = n->inputs[k].get();
      ct[in] = ct.count(in) ? b::add(ct[in], gs[k]) : gs[k];
    }
  }
  if (!ct.count(x.get())) return 1e9;
  ir::Graph gg = ir::build_graph({ct[x.get()]});
  std::vector<std::vector<Value>> xs(N), ws(N);
  for (int r = 0; r < N; ++r) {
    xs[size_t(r)] = {Value{x->shape, DType::Float64, random_values(size_t(numel(x->shape)), 100 + r)}};
    ws[size_t(r)] = {Value{w->shape, DType::Float64, random_values(size_t(numel(w->shape)), 200 + r)}};
  }
  auto params_for = [&](const ir::Graph& g, const std::vector<std::vector<Value>>& xv) {
    std::vector<std::vector<Value>> p(N);
    for (int r = 0; r < N; ++r)
      for (int q : g.params) p[size_t(r)].push_back(g.nodes[size_t(q)] == x ? xv[size_t(r)][0] : ws[size_t(r)][0]);
    return p;
  };
  auto total_loss = [&](const std::vector<std::vector<Value>>& xv) {
    auto out = on_ranks(fg, params_for(fg, xv));
    double L = 0;
    for (int r = 0; r < N; ++r)
      for (size_t i = 0; i < out[size_t(r)][0].data.size(); ++i) L += out[size_t(r)][0].data[i] * ws[size_t(r)][0].data[i];
    return L;
  };
  auto analytic = on_ranks(gg, params_for(gg, xs));
  const double h = 1e-6;
  double worst = 0;
  for (int s = 0; s < N; ++s) {
    V fd(xs[size_t(s)][0].data.size());
    for (size_t i = 0; i < fd.size(); ++i) {
      auto plus = xs, minus = xs;
      plus[size_t(s)][0].data[i] += h;
      minus[size_t(s)][0].data[i] -= h;
      fd[i] = (total_loss(plus) - total_loss(minus)) / (2 * h);
    }
    worst = std::max(worst, testing::normalized_error(analytic[size_t(s)][0].data, fd));
  }
  return worst;
}

TEST(Collectives, VjpsMatchFiniteDifferencesOfTheTotalLoss) {
  const int N = 3;
  std::vector<VjpCase> cases = {
      {"all_reduce sum", [](const NodePtr& x) { return b::all_reduce(x, N, ReduceKind::Sum); }, {2, 3}},
      {"all_reduce mean", [](const NodePtr& x) { return b::all_reduce(x, N, ReduceKind::Mean); }, {2, 3}},
      {"all_reduce max", [](const NodePtr& x) { return b::all_reduce(x, N, ReduceKind::Max); }, {2, 3}},
      {"all_gather axis 1", [](const NodePtr& x) { return b::all_gather(x, N, 1); }, {2, 2}},
      {"reduce_scatter axis 0", [](const NodePtr& x) { return b::reduce_scatter(x, N, 0); }, {3, 2}},
      {"reduce_scatter axis 1", [](const NodePtr& x) { return b::reduce_scatter(x, N, 1); }, {2, 6}},
      {"all_to_all 0 -> 1", [](const NodePtr& x) { return b::all_to_all(x, N, 0, 1); }, {3, 2}},
      {"all_to_all 1 -> 1", [](const NodePtr& x) { return b::all_to_all(x, N, 1, 1); }, {2, 3}},
      {"broadcast root 2", [](const NodePtr& x) { return b::broadcast(x, N, 2); }, {2, 2}},
      {"reduce root 1", [](const NodePtr& x) { return b::reduce_to_root(x, N, 1); }, {2, 2}},
      {"permute ring", [](const NodePtr& x) { return b::collective_permute(x, N, {{0, 1}, {1, 2}, {2, 0}}); }, {2, 2}},
      {"permute partial", [](const NodePtr& x) { return b::collective_permute(x, N, {{2, 0}}); }, {3}},
      // A chain: the cotangent of the all_reduce flows through a product of two all_gathers.
      {"all_gather then all_reduce max",
       [](const NodePtr& x) { return b::all_reduce(b::mul(b::all_gather(x, N, 0), b::all_gather(x, N, 0)), N, ReduceKind::Max); },
       {2}},
  };
  for (const VjpCase& c : cases) EXPECT_LE(vjp_error(c, N), 1e-6) << c.name;
}

// The check catches a wrong convention: all_reduce(sum)'s VJP taken as the identity (each rank's
// own cotangent, as if the loss were one rank's) is off by the other ranks' cotangents.
std::vector<NodePtr> identity_vjp(const ir::Node&, const NodePtr&, const NodePtr& g) { return {g}; }
TEST(Collectives, TheVjpCheckCatchesAWrongRule) {
  VjpCase c{"all_reduce sum", [](const NodePtr& x) { return b::all_reduce(x, 3, ReduceKind::Sum); }, {4}};
  ir::VjpRule saved = ir::replace_vjp_for_testing(Op::AllReduce, identity_vjp);
  double e = vjp_error(c, 3);
  ir::replace_vjp_for_testing(Op::AllReduce, saved);
  EXPECT_GT(e, 0.1);
  EXPECT_LE(vjp_error(c, 3), 1e-6);
}

// ---- the in-process communicator on raw buffers ----
// Runs f(rank, comm) on n threads; returns each rank's error ("" when none).
std::vector<std::string> on_threads(int n, const std::function<void(int, backends::Communicator&)>& f,
                                    std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
  auto group = backends::make_inprocess_group(n);
  std::vector<std::string> err(static_cast<size_t>(n));
  std::vector<std::thread> t;
  for (int r = 0; r < n; ++r)
    t.emplace_back([&, r] {
      group[size_t(r)]->set_timeout(timeout);
      try {
        f(r, *group[size_t(r)]);
      } catch (const std::exception& e) {
        err[size_t(r)] = e.what();
      }
    });
  for (auto& th : t) th.join();
  return err;
}

TEST(Collectives, InProcessCommunicatorMovesTheRightValues) {
  const int N = 3;
  std::vector<std::vector<float>> got(N * 8);
  auto err = on_threads(N, [&](int r, backends::Communicator& c) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), N);
    std::vector<float> x = {float(r + 1), float(10 * (r + 1))};  // rank r: [r+1, 10(r+1)]
    std::vector<float> o(2), all(6), blocks = {float(r), float(r) + 0.5f, float(r) + 0.25f};
    c.all_reduce(x.data(), o.data(), 2, DType::Float32, ReduceKind::Sum);
    got[size_t(r * 8 + 0)] = o;
    c.all_reduce(x.data(), o.data(), 2, DType::Float32, ReduceKind::Mean);
    got[size_t(r * 8 + 1)] = o;
    c.all_gather(x.data(), all.data(), 2, DType::Float32);
    got[size_t(r * 8 + 2)] = all;
    std::vector<float> one(1), three(3);
    c.reduce_scatter(blocks.data(), one.data(), 1, DType::Float32);
    got[size_t(r * 8 + 3)] = one;
    c.all_to_all(blocks.data(), three.data(), 1, DType::Float32);
    got[size_t(r * 8 + 4)] = three;
    c.broadcast(x.data(), o.data(), 2, DType::Float32, 2);
    got[size_t(r * 8 + 5)] = o;
    std::vector<float> red = {-1, -1};
    c.reduce(x.data(), red.data(), 2, DType::Float32, 0);
    got[size_t(r * 8 + 6)] = red;
    std::vector<float> in_place = x;  // ring, in place
    c.permute(in_place.data(), in_place.data(), 2, DType::Float32, (r + 1) % N, (r + N - 1) % N);
    got[size_t(r * 8 + 7)] = in_place;
  });
  for (auto& e : err) EXPECT_EQ(e, "");
  for (int r = 0; r < N; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(got[size_t(r * 8 + 0)], (std::vector<float>{6, 60}));
    EXPECT_EQ(got[size_t(r * 8 + 1)], (std::vector<float>{2, 20}));
    EXPECT_EQ(got[size_t(r * 8 + 2)], (std::vector<float>{1, 10, 2, 20, 3, 30}));
    // block r summed over ranks: r + (r + 0.5) ... -> sum_s blocks_s[r].
    const float offs[3] = {0, 0.5f, 0.25f};
    EXPECT_EQ(got[size_t(r * 8 + 3)], (std::vector<float>{0 + 1 + 2 + 3 * offs[r]}));
    EXPECT_EQ(got[size_t(r * 8 + 4)], (std::vector<float>{0 + offs[r], 1 + offs[r], 2 + offs[r]}));
    EXPECT_EQ(got[size_t(r * 8 + 5)], (std::vector<float>{3, 30}));
    EXPECT_EQ(got[size_t(r * 8 + 6)], r == 0 ? (std::vector<float>{6, 60}) : (std::vector<float>{-1, -1}));
    const int from = (r + N - 1) % N;
    EXPECT_EQ(got[size_t(r * 8 + 7)], (std::vector<float>{float(from + 1), float(10 * (from + 1))}));
  }
}

TEST(Collectives, InProcessMismatchFailsOnEveryRank) {
  auto err = on_threads(2, [](int r, backends::Communicator& c) {
    std::vector<float> x(4, 1), y(8);
    if (r == 0) c.all_reduce(x.data(), y.data(), 4, DType::Float32, ReduceKind::Sum);
    else c.all_gather(x.data(), y.data(), 4, DType::Float32);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(err[size_t(r)].find("the ranks disagree about this collective"), std::string::npos) << err[size_t(r)];
    EXPECT_NE(err[size_t(r)].find("rank 0: all_reduce sum of 4 float32; rank 1: all_gather of 4 float32"), std::string::npos)
        << err[size_t(r)];
  }
  // Counts that differ: the same.
  err = on_threads(2, [](int r, backends::Communicator& c) {
    std::vector<float> x(4, 1), y(4);
    c.all_reduce(x.data(), y.data(), size_t(3 + r), DType::Float32, ReduceKind::Sum);
  });
  for (auto& e : err) EXPECT_NE(e.find("rank 1: all_reduce sum of 4 float32"), std::string::npos) << e;
}

TEST(Collectives, InProcessTimeoutNamesTheMissingRank) {
  auto t0 = std::chrono::steady_clock::now();
  auto err = on_threads(
      3,
      [](int r, backends::Communicator& c) {
        if (r == 2) return;  // never arrives
        std::vector<double> x(2, 1.0), y(2);
        c.all_reduce(x.data(), y.data(), 2, DType::Float64, ReduceKind::Sum);
      },
      std::chrono::milliseconds(300));
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 5);
  EXPECT_EQ(err[2], "");
  // The first to time out names the missing rank; the group is then broken for the other.
  std::string both = err[0] + " | " + err[1];
  EXPECT_NE(both.find("[all_reduce] timed out after 0.3"), std::string::npos) << both;
  EXPECT_NE(both.find("waiting for rank(s) 2"), std::string::npos) << both;
  EXPECT_NE(err[0], "");
  EXPECT_NE(err[1], "");
}

// ---- graphs with collectives on the cpu backend, on in-process ranks ----
struct SpmdRun {
  std::vector<std::vector<V>> got, want;
  std::vector<backends::Communicator::Traffic> traffic;  // each rank's
};

// One graph (outputs `outs`, leaves `leaves`) on N in-process ranks, rank r's leaf values
// values[r][k]; also the reference on the same inputs.
SpmdRun run_spmd(const std::vector<NodePtr>& outs, const std::vector<NodePtr>& leaves, const std::vector<std::vector<V>>& values) {
  const size_t N = values.size();
  std::vector<runtime::RankInputs> inputs(N);
  std::vector<std::vector<Value>> params(N);
  ir::Graph g = ir::build_graph(outs);
  for (size_t r = 0; r < N; ++r) {
    for (size_t k = 0; k < leaves.size(); ++k) {
      NodePtr l = leaf(values[r][k], leaves[k]->shape, leaves[k]->dtype);
      inputs[r].push_back({leaves[k]->buffer.get(), l->buffer});
    }
    for (int q : g.params)
      for (size_t k = 0; k < leaves.size(); ++k)
        if (g.nodes[size_t(q)] == leaves[k]) params[r].push_back(Value{leaves[k]->shape, leaves[k]->dtype, values[r][k]});
  }
  std::vector<runtime::Request> req;
  for (auto& o : outs) req.push_back({o, {}});
  auto group = backends::make_inprocess_group(int(N));
  auto bufs = runtime::realize_spmd(req, {}, inputs, group);
  SpmdRun res;
  for (const auto& c : group) res.traffic.push_back(c->traffic());
  auto ref = on_ranks(g, params);
  for (size_t r = 0; r < N; ++r) {
    res.got.emplace_back();
    res.want.emplace_back();
    for (size_t k = 0; k < outs.size(); ++k) {
      res.got[r].push_back(reference::read_host(bufs[r][k]->data, outs[k]->dtype, outs[k]->numel()));
      res.want[r].push_back(ref[r][k].data);
    }
  }
  return res;
}

TEST(Collectives, GraphsRunOnInProcessRanksLikeTheReference) {
  const int N = 2;
  NodePtr x = zeros_leaf({4, 6}, DType::Float32), w = zeros_leaf({4, 6}, DType::Float32);
  // Compute around the collectives: fused elementwise producers, a permuted (strided) input,
  // and consumers of their results.
  NodePtr h = b::mul(x, w);
  std::vector<NodePtr> outs = {
      b::add(b::all_reduce(h, N, ReduceKind::Sum), x),
      b::all_reduce(h, N, ReduceKind::Mean),
      b::all_reduce(x, N, ReduceKind::Max),
      b::all_gather(b::permute(x, {1, 0}), N, 1),
      b::reduce_scatter(h, N, 1),
      b::all_to_all(x, N, 0, 1),
      b::all_to_all(x, N, 1, 0),
      b::broadcast(b::unary(Op::Exp, x), N, 1),
      b::reduce_to_root(x, N, 1),
      b::collective_permute(x, N, {{1, 0}}),
      // A constant input (materialized first) and a collective read by two consumers.
      b::all_reduce(b::full(1.5, {3}, DType::Float32, Device("cpu")), N, ReduceKind::Sum),
      b::mul(b::all_gather(x, N, 0), b::all_gather(x, N, 0)),
  };
  std::vector<std::vector<V>> values(N);
  for (int r = 0; r < N; ++r) values[size_t(r)] = {random_values(24, 10 + r), random_values(24, 20 + r)};
  SpmdRun res = run_spmd(outs, {x, w}, values);
  for (int r = 0; r < N; ++r)
    for (size_t k = 0; k < outs.size(); ++k)
      EXPECT_TRUE(testing::all_close(res.got[size_t(r)][k], res.want[size_t(r)][k], 1e-6)) << "rank " << r << " output " << k;
}

// Sub-groups (CollectiveAttrs::stride) on 4 in-process ranks, as on a 2 x 2 mesh: stride 1 is
// the groups {0, 1}, {2, 3}; stride 2 {0, 2}, {1, 3}. Against the reference and by hand, and
// the bytes each rank sent (Communicator::Traffic) by hand: x is float32[2, 3] (24 bytes); an
// all-reduce over 2 ranks sends 2 (2 - 1) / 2 x 24 = 24, an all-gather (2 - 1) x 24 = 24, a
// reduce-scatter (2 - 1) / 2 x 24 = 12, a broadcast 24 from the root only (group position 1:
// ranks 2 and 3 at stride 2), a swap permute 24 from each rank: 84 bytes on ranks 0 and 1, 108
// on ranks 2 and 3, 5 calls each.
TEST(Collectives, SubGroupCollectivesRunOverTheirGroupOnly) {
  const int N = 4;
  NodePtr x = zeros_leaf({2, 3}, DType::Float32);
  std::vector<NodePtr> outs = {
      b::all_reduce(x, 2, ReduceKind::Sum, 1),
      b::all_gather(x, 2, 0, 2),
      b::reduce_scatter(x, 2, 0, 1),
      b::broadcast(x, 2, 1, 2),
      b::collective_permute(x, 2, {{0, 1}, {1, 0}}, 1),
  };
  std::vector<std::vector<V>> values(N);
  for (int r = 0; r < N; ++r) values[size_t(r)] = {random_values(6, 40 + uint32_t(r))};
  SpmdRun res = run_spmd(outs, {x}, values);
  for (int r = 0; r < N; ++r)
    for (size_t k = 0; k < outs.size(); ++k)
      EXPECT_TRUE(testing::all_close(res.got[size_t(r)][k], res.want[size_t(r)][k], 1e-6)) << "rank " << r << " output " << k;
  auto f = [&](int r, size_t i) { return double(float(values[size_t(r)][0][i])); };
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_NEAR(res.got[2][0][i], f(2, i) + f(3, i), 1e-5);  // all_reduce over {2, 3}
    EXPECT_NEAR(res.got[1][1][i], f(1, i), 1e-6);            // all_gather over {1, 3}: rank 1's rows, then rank 3's
    EXPECT_NEAR(res.got[1][1][6 + i], f(3, i), 1e-6);
    EXPECT_NEAR(res.got[0][3][i], f(2, i), 1e-6);            // broadcast from group position 1 of {0, 2}
    EXPECT_NEAR(res.got[3][4][i], f(2, i), 1e-6);            // permute 0 <-> 1 within {2, 3}
  }
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(res.got[3][2][i], f(2, 3 + i) + f(3, 3 + i), 1e-5);  // rank 3 keeps row 1 of {2, 3}'s sum
  for (int r = 0; r < N; ++r) {
    EXPECT_EQ(res.traffic[size_t(r)].calls, 5) << "rank " << r;
    EXPECT_EQ(res.traffic[size_t(r)].bytes, r < 2 ? 84 : 108) << "rank " << r;
  }
}

// Ranks whose graphs put a collective over different sub-groups fail up front, every one, naming
// both sides; groups that do not tile the ranks are refused too; on the communicator itself a
// sub-group is checked (members in range, the caller among them) and its calls are checked
// across its members like any collective's.
TEST(Collectives, SubGroupsThatDisagreeAreClearErrorsOnEveryRank) {
  NodePtr x = leaf(random_values(6, 5), {2, 3}, DType::Float32);
  std::vector<runtime::RankInputs> in(4);
  std::vector<std::vector<runtime::Request>> own(4);
  own[3] = {{b::all_reduce(x, 2, ReduceKind::Sum, 2), {}}};
  std::string e = testing::error_message([&] {
    runtime::realize_spmd({{b::all_reduce(x, 2, ReduceKind::Sum, 1), {}}}, {}, in, backends::make_inprocess_group(4), own);
  });
  EXPECT_NE(e.find("[spmd] the ranks compiled different collective sequences (every rank fails): collective 0: rank 0 all_reduce "
                   "sum float32[2, 3] for 2 ranks at stride 1; rank 1 all_reduce sum float32[2, 3] for 2 ranks at stride 1; rank 2 "
                   "all_reduce sum float32[2, 3] for 2 ranks at stride 1; rank 3 all_reduce sum float32[2, 3] for 2 ranks at stride 2"),
            std::string::npos)
      << e;
  e = testing::error_message([&] {
    runtime::realize_spmd({{b::all_reduce(x, 3, ReduceKind::Sum, 1), {}}}, {}, in, backends::make_inprocess_group(4));
  });
  EXPECT_NE(e.find("is not for the 4 ranks it runs on (its sub-groups do not tile them)"), std::string::npos) << e;
  // The communicator's own checks, on rank threads: a bad member list, then a count mismatch in
  // group {0, 1} (every member fails, naming both sides) while {2, 3} agrees.
  auto group = backends::make_inprocess_group(4);
  EXPECT_NE(testing::error_message([&] { group[0]->group({1, 2}); }).find("not in"), std::string::npos);
  EXPECT_NE(testing::error_message([&] { group[0]->group({0, 4}); }).find("distinct ranks in range"), std::string::npos);
  std::vector<std::string> errors(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r)
    threads.emplace_back([&, r] {
      std::vector<int> members = r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
      std::vector<float> a(4, 1.0f), o(4);
      const size_t n = r == 1 ? 3 : 4;
      errors[size_t(r)] = testing::error_message(
          [&] { group[size_t(r)]->group(members).all_reduce(a.data(), o.data(), n, DType::Float32, ReduceKind::Sum); });
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(errors[size_t(r)].find("[all_reduce] the ranks disagree about this collective (every rank fails); rank 0: all_reduce sum "
                                     "of 4 float32; rank 1: all_reduce sum of 3 float32"),
              std::string::npos)
        << errors[size_t(r)];
  EXPECT_EQ(errors[2] + errors[3], "(no error)(no error)");
}

TEST(Collectives, AFailingRankEndsEveryRankWithItsName) {
  // Rank 1's gather index is out of range: it fails before the all_reduce rank 0 waits in.
  NodePtr src = zeros_leaf({4}), idx = zeros_leaf({2}, DType::Int64);
  NodePtr y = b::all_reduce(b::gather(src, 0, idx), 2, ReduceKind::Sum);
  auto t0 = std::chrono::steady_clock::now();
  std::string e = testing::error_message([&] { run_spmd({y}, {src, idx}, {{V(4, 1.0), {0, 1}}, {V(4, 1.0), {0, 9}}}); });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10);
  EXPECT_NE(e.find("rank 1 of 2 failed"), std::string::npos) << e;
  EXPECT_NE(e.find("index 9 out of range"), std::string::npos) << e;
}

TEST(Collectives, OneRankGraphsRunWithoutACommunicator) {
  NodePtr x = leaf({1, 2, 3}, {3}, DType::Float32);
  NodePtr y = b::all_gather(b::all_reduce(x, 1, ReduceKind::Sum), 1, 0);
  EXPECT_TRUE(testing::matches_reference(detail::from_node(y)));
}

TEST(Collectives, AGraphForTwoRanksWithoutACommunicatorIsRefused) {
  NodePtr x = leaf({1, 2, 3}, {3}, DType::Float32);
  std::string e = testing::error_message([&] { detail::from_node(b::all_reduce(x, 2, ReduceKind::Sum)).to_vector<float>(); });
  EXPECT_NE(e.find("[all_reduce] no communicator for a graph of 2 ranks"), std::string::npos) << e;
}

// ---- the collective-sequence check (before an executable's first run on a communicator) ----
// Ranks the way an MPI job runs them, in one process: each thread realizes its own rank's graph
// through runtime::realize() with its in-process communicator current. The graphs are built and
// compiled on this thread first, so the rank threads only find them in the compile cache and run.
struct RankResult {
  std::vector<std::shared_ptr<Buffer>> out;
  std::string error;
};
std::vector<RankResult> realize_on_rank_threads(const std::vector<std::shared_ptr<backends::Communicator>>& group,
                                                const std::vector<std::vector<runtime::Request>>& reqs) {
  for (const auto& q : reqs) runtime::compile_only(q);
  std::vector<RankResult> res(reqs.size());
  std::vector<std::thread> t;
  for (size_t r = 0; r < reqs.size(); ++r)
    t.emplace_back([&, r] {
      backends::CommunicatorScope scope(group[r].get());
      try {
        res[r].out = runtime::realize(reqs[r], {});
      } catch (const std::exception& e) {
        res[r].error = e.what();
      }
    });
  for (auto& th : t) th.join();
  return res;
}

enum class Second { AllReduce, AllGather, Reshaped, None };
// A rank's graph: y = 2x written into x's buffer (donated: a Step with an effect the caller can
// see), c1 = all_reduce(y), then `second` of c1 (None: 3 c1, no second collective).
std::vector<runtime::Request> rank_graph(const NodePtr& x, Second second) {
  const Device cpu("cpu");
  NodePtr y = b::mul(x, b::full(2.0, x->shape, DType::Float32, cpu));
  NodePtr c1 = b::all_reduce(y, 2, ReduceKind::Sum);
  NodePtr c2 = second == Second::AllReduce   ? b::all_reduce(c1, 2, ReduceKind::Sum)
               : second == Second::AllGather ? b::all_gather(c1, 2, 0)
               : second == Second::Reshaped  ? b::all_reduce(b::reshape(c1, {8, 4}), 2, ReduceKind::Sum)
                                             : b::mul(c1, b::full(3.0, c1->shape, DType::Float32, cpu));
  return {{y, x->buffer}, {c2, {}}};
}

std::vector<float> floats(const Buffer& buf, size_t n) {
  std::vector<float> v(n);
  std::memcpy(v.data(), buf.data, n * 4);
  return v;
}

TEST(Collectives, RanksThatCompiledDifferentCollectivesAllFailBeforeAnyStep) {
  std::atomic<int> steps{0};
  runtime::set_after_step_hook([&](int, void* const*) { steps++; });
  const std::string head = "[spmd] the ranks compiled different collective sequences (every rank fails): collective 1: ";
  struct Case {
    Second rank1;
    std::string want;
  };
  // The reshape keeps the element count: each call's own check (op, count, dtype) would let it
  // through and the ranks would sum [4, 8] with [8, 4]; the sequences' shapes differ.
  const std::vector<Case> cases = {
      {Second::AllGather, "rank 0 all_reduce sum float32[4, 8] for 2 ranks; rank 1 all_gather(axis 0) float32[4, 8] for 2 ranks"},
      {Second::Reshaped, "rank 0 all_reduce sum float32[4, 8] for 2 ranks; rank 1 all_reduce sum float32[8, 4] for 2 ranks"},
      {Second::None, "rank 0 all_reduce sum float32[4, 8] for 2 ranks; rank 1 none (it compiled 1 collective)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.want);
    const V x0 = random_values(32, 1), x1 = random_values(32, 2);
    NodePtr a = leaf(x0, {4, 8}, DType::Float32), bb = leaf(x1, {4, 8}, DType::Float32);
    const int64_t checks = runtime::collective_sequence_checks();
    steps = 0;
    auto group = backends::make_inprocess_group(2);
    for (auto& g : group) g->set_timeout(std::chrono::milliseconds(10000));
    auto res = realize_on_rank_threads(group, {rank_graph(a, Second::AllReduce), rank_graph(bb, c.rank1)});
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(res[size_t(r)].out.empty()) << "rank " << r;
      EXPECT_NE(res[size_t(r)].error.find(head + c.want), std::string::npos) << "rank " << r << ": " << res[size_t(r)].error;
    }
    EXPECT_EQ(steps.load(), 0);  // no Step ran on either rank
    EXPECT_EQ(runtime::collective_sequence_checks() - checks, 2);
    // The donated inputs still hold their values (y = 2x would have been written into them).
    EXPECT_EQ(floats(*a->buffer, 32), std::vector<float>(x0.begin(), x0.end()));
    EXPECT_EQ(floats(*bb->buffer, 32), std::vector<float>(x1.begin(), x1.end()));
  }
  runtime::set_after_step_hook(nullptr);
}

TEST(Collectives, RanksThatAgreeRunAndAreCheckedOncePerSequenceAndCommunicator) {
  auto group = backends::make_inprocess_group(2);
  for (auto& g : group) g->set_timeout(std::chrono::milliseconds(10000));
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const V x0 = random_values(32, 10 + round), x1 = random_values(32, 20 + round);
    NodePtr a = leaf(x0, {4, 8}, DType::Float32), bb = leaf(x1, {4, 8}, DType::Float32);
    const int64_t checks = runtime::collective_sequence_checks();
    auto res = realize_on_rank_threads(group, {rank_graph(a, Second::AllReduce), rank_graph(bb, Second::AllReduce)});
    // Only the first launch on this communicator checks (once per rank); later rounds find the
    // sequence agreed and pay nothing.
    EXPECT_EQ(runtime::collective_sequence_checks() - checks, round == 0 ? 2 : 0);
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(res[size_t(r)].error, "") << "rank " << r;
      const std::vector<float> y = floats(*res[size_t(r)].out[0], 32), c2 = floats(*res[size_t(r)].out[1], 32);
      const V& x = r == 0 ? x0 : x1;
      for (size_t i = 0; i < 32; ++i) {
        EXPECT_EQ(y[i], float(2 * float(x[i])));
        // c2 = all_reduce(all_reduce(2x)) = 2 (2 x0 + 2 x1)
        EXPECT_NEAR(c2[i], 4 * (float(x0[i]) + float(x1[i])), 1e-5);
      }
    }
    // y was written into each rank's x: the donation took place.
    EXPECT_EQ(res[0].out[0].get(), a->buffer.get());
  }
  // A new communicator checks again: the agreement was its group's.
  auto other = backends::make_inprocess_group(2);
  NodePtr a = leaf(random_values(32, 5), {4, 8}, DType::Float32), bb = leaf(random_values(32, 6), {4, 8}, DType::Float32);
  const int64_t checks = runtime::collective_sequence_checks();
  auto res = realize_on_rank_threads(other, {rank_graph(a, Second::AllReduce), rank_graph(bb, Second::AllReduce)});
  EXPECT_EQ(res[0].error + res[1].error, "");
  EXPECT_EQ(runtime::collective_sequence_checks() - checks, 2);
}

TEST(Collectives, InProcessRanksWithGraphsOfTheirOwnAreComparedBeforeTheyStart) {
  // realize_spmd holds every rank's executable: it compares their sequences itself (no exchange).
  NodePtr x = leaf(random_values(32, 3), {4, 8}, DType::Float32);
  auto strip = [](std::vector<runtime::Request> q) {
    for (auto& r : q) r.donor.reset();
    return q;
  };
  std::vector<runtime::RankInputs> in(2);
  in[1].push_back({x->buffer.get(), leaf(random_values(32, 4), {4, 8}, DType::Float32)->buffer});
  const int64_t checks = runtime::collective_sequence_checks();
  std::string e = testing::error_message([&] {
    runtime::realize_spmd(strip(rank_graph(x, Second::AllReduce)), {}, in, backends::make_inprocess_group(2),
                          {{}, strip(rank_graph(x, Second::AllGather))});
  });
  EXPECT_NE(e.find("[spmd] the ranks compiled different collective sequences (every rank fails): collective 1: rank 0 all_reduce "
                   "sum float32[4, 8] for 2 ranks; rank 1 all_gather(axis 0) float32[4, 8] for 2 ranks"),
            std::string::npos)
      << e;
  EXPECT_EQ(runtime::collective_sequence_checks(), checks);
  // A graph for 3 ranks on 2 in-process ranks: refused before they start.
  e = testing::error_message([&] {
    runtime::realize_spmd({{b::all_reduce(x, 3, ReduceKind::Sum), {}}}, {}, in, backends::make_inprocess_group(2));
  });
  EXPECT_NE(e.find("collective 0 (all_reduce sum float32[4, 8] for 3 ranks) is not for the 2 ranks it runs on"), std::string::npos) << e;
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Data parallelism from these parts: a linear least-squares model trained by SGD on 2 in-process
// ranks, each on its half of the batch, its gradient all-reduced (mean) before the update, gives
// the same losses as one rank on the whole batch (20 steps, 1e-5 relative), and both ranks hold
// the same weights bit for bit. The step graph is built once per step on rank 0's shard.
struct StepOut {
  double loss;
  std::vector<float> w;
};
StepOut sgd_step(const std::vector<float>& w, const std::vector<std::vector<double>>& xs, const std::vector<std::vector<double>>& ys,
                 int64_t rows) {
  const int N = int(xs.size());
  const Device cpu("cpu");
  NodePtr W = leaf(V(w.begin(), w.end()), {4, 3}, DType::Float32);
  NodePtr x = leaf(xs[0], {rows, 4}, DType::Float32), y = leaf(ys[0], {rows, 3}, DType::Float32);
  NodePtr d = b::sub(b::matmul(x, W), y);
  const double scale = 1.0 / double(rows * 3);
  NodePtr loss = b::mul(b::reduce_sum(b::mul(d, d), {0, 1}), b::full(scale, {1, 1}, DType::Float32, cpu));
  NodePtr grad = b::mul(b::matmul(b::transpose_last2(x), d), b::full(2 * scale, {4, 3}, DType::Float32, cpu));
  NodePtr g = b::all_reduce(grad, N, ReduceKind::Mean);
  NodePtr w2 = b::sub(W, b::mul(g, b::full(0.1, {4, 3}, DType::Float32, cpu)));
  NodePtr L = b::all_reduce(loss, N, ReduceKind::Mean);
  std::vector<runtime::Request> req = {{w2, {}}, {L, {}}};
  std::vector<std::vector<std::shared_ptr<Buffer>>> out;
  if (N == 1) {
    out.push_back(runtime::realize(req, {}));
  } else {
    std::vector<runtime::RankInputs> in(static_cast<size_t>(N));
    for (int r = 1; r < N; ++r) {
      in[size_t(r)].push_back({x->buffer.get(), leaf(xs[size_t(r)], {rows, 4}, DType::Float32)->buffer});
      in[size_t(r)].push_back({y->buffer.get(), leaf(ys[size_t(r)], {rows, 3}, DType::Float32)->buffer});
    }
    out = runtime::realize_spmd(req, {}, in, backends::make_inprocess_group(N));
  }
  StepOut s;
  s.w.resize(12);
  std::memcpy(s.w.data(), out[0][0]->data, 48);
  float l = 0;
  std::memcpy(&l, out[0][1]->data, 4);
  s.loss = l;
  for (size_t r = 1; r < out.size(); ++r) EXPECT_EQ(std::memcmp(out[r][0]->data, out[0][0]->data, 48), 0) << "rank " << r;
  return s;
}

TEST(Collectives, DataParallelSgdMatchesOneRankOnTheWholeBatch) {
  const int64_t B = 8;  // the global batch; 4 rows per rank
  std::vector<float> w1(12, 0.0f), w2(12, 0.0f);
  V wtrue = random_values(12, 7);
  for (int step = 0; step < 20; ++step) {
    V xall = random_values(size_t(B * 4), 1000 + step), yall(size_t(B * 3));
    for (int64_t i = 0; i < B; ++i)
      for (int64_t j = 0; j < 3; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < 4; ++k) acc += xall[size_t(i * 4 + k)] * wtrue[size_t(k * 3 + j)];
        yall[size_t(i * 3 + j)] = acc;
      }
    auto half = [](const V& v, size_t part, size_t n) { return V(v.begin() + long(part * n), v.begin() + long((part + 1) * n)); };
    StepOut one = sgd_step(w1, {xall}, {yall}, B);
    StepOut two = sgd_step(w2, {half(xall, 0, 16), half(xall, 1, 16)}, {half(yall, 0, 12), half(yall, 1, 12)}, B / 2);
    EXPECT_NEAR(two.loss, one.loss, 1e-5 * std::max(1.0, std::fabs(one.loss))) << "step " << step;
    w1 = one.w, w2 = two.w;
  }
  for (size_t i = 0; i < 12; ++i) EXPECT_NEAR(w2[i], w1[i], 1e-5) << i;
}

}  // namespace
}  // namespace tessera
