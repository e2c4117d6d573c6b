// Run by mpirun on 2 ranks (groups: on 4) (tests/mpi/CMakeLists.txt). Each rank is a process that traces and
// runs its own graph normally, with the MPI communicator as the process's; the cpu backend runs
// the collective Steps through it.
//   graph     a graph of every collective (fused producers, strided inputs, consumers) on each
//             rank's own inputs, checked against reference::evaluate_ranks over both ranks'
//             inputs (each rank can draw the other's: fixed seeds)
//   mismatch  rank 0 all-reduces 4 elements, rank 1 3 (communicator calls): both must fail naming the collective
//   sequence  the ranks' graphs differ in their second collective: both fail before any Step runs
//             (the collective-sequence check), naming it; agreeing graphs run, checked once
//   die       rank 1 is killed before the all-reduce rank 0 waits in (rank_failure.sh lost checks the job)
//   stuck     rank 1 sleeps 20 s (alive) before the all-reduce rank 0 waits in; run with
//             TESSERA_COLLECTIVE_TIMEOUT_S=1, rank 0's wait must time out and end the job
//             (rank_failure.sh stuck checks it)
//   gpt       data parallelism (optim::DataParallel::process_group): the small GPT trained on the 2
//             ranks, each on half of every batch, against one device on the whole batch (each
//             rank trains that itself first): the same losses to 1e-5 relative over 20 steps, with
//             dropout 0.1 (each rank draws the masks of its rows of the batch); and ZeRO-1
//             (optim::ZeroAdamW, moments sharded) the same losses as plain data parallel
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <unistd.h>

#include "backends/communicator.h"
#include "ir/build.h"
#include "ir/collectives.h"
#include "ir/graph.h"
#include "reference/evaluator.h"
#include "runtime/allocator.h"
#include "runtime/realize.h"
#include "tessera/error.h"
#include "dp_gpt.h"
#include "tessera/distributed.h"
#include "tessera/nn.h"

using namespace tessera;
namespace b = ir::build;
using ir::ReduceKind;

namespace {

std::vector<double> values(size_t n, uint32_t seed) {
  std::mt19937 r(seed);
  std::uniform_real_distribution<double> u(-2, 2);
  std::vector<double> v(n);
  for (double& x : v) x = double(float(u(r)));  // float32 inputs: what the leaf holds
  return v;
}

ir::NodePtr leaf(const std::vector<double>& v, const Shape& s) {
  std::vector<float> f(v.begin(), v.end());
  return ir::leaf(runtime::upload(Device("cpu"), f.data(), f.size() * 4), s, DType::Float32);
}

int graph(int rank, int N) {
  const Shape s{4, 6};
  std::vector<std::vector<double>> xs, ws;
  for (int r = 0; r < N; ++r) xs.push_back(values(24, 10 + r)), ws.push_back(values(24, 20 + r));
  ir::NodePtr x = leaf(xs[size_t(rank)], s), w = leaf(ws[size_t(rank)], s);
  ir::NodePtr h = b::mul(x, w);
  std::vector<ir::NodePtr> outs = {
      b::add(b::all_reduce(h, N, ReduceKind::Sum), x), b::all_reduce(h, N, ReduceKind::Mean), b::all_reduce(x, N, ReduceKind::Max),
      b::all_gather(b::permute(x, {1, 0}), N, 1),     b::reduce_scatter(h, N, 1),            b::all_to_all(x, N, 0, 1),
      b::broadcast(b::unary(ir::Op::Exp, x), N, 1),   b::reduce_to_root(x, N, 1),
      b::collective_permute(x, N, {{1, 0}}),
  };
  std::vector<runtime::Request> req;
  for (auto& o : outs) req.push_back({o, {}});
  std::vector<std::shared_ptr<Buffer>> got = runtime::realize(req, {});
  ir::Graph g = ir::build_graph(outs);
  std::vector<std::vector<reference::Value>> params(static_cast<size_t>(N));
  for (int r = 0; r < N; ++r)
    for (int q : g.params)
      params[size_t(r)].push_back({s, DType::Float32, g.nodes[size_t(q)] == x ? xs[size_t(r)] : ws[size_t(r)]});
  std::vector<const ir::Graph*> gs(static_cast<size_t>(N), &g);
  auto ref = reference::evaluate_ranks(gs, 0, 0, params);
  int bad = 0;
  for (size_t k = 0; k < outs.size(); ++k) {
    std::vector<float> f(size_t(outs[k]->numel()));
    runtime::download(*got[k], f.data(), f.size() * 4);
    const std::vector<double>& want = ref[size_t(rank)][k].data;
    double err = 0, scale = 0;
    for (size_t i = 0; i < f.size(); ++i) err = std::max(err, std::fabs(f[i] - want[i])), scale = std::max(scale, std::fabs(want[i]));
    if (err > 1e-6 * std::max(scale, 1.0)) {
      std::fprintf(stderr, "rank %d: output %zu (%s) off the reference by %g\n", rank, k, ir::op_name(outs[k]->op), err);
      bad++;
    }
  }
  std::printf("rank %d of %d: %zu outputs of collectives %s the reference\n", rank, N, outs.size(), bad ? "DIFFER from" : "match");
  return bad ? 1 : 0;
}

// Each call's own check, on the communicator directly (a graph would meet the sequence check first).
int mismatch(int rank) {
  std::vector<float> x(4, 1.0f), y(4);
  try {
    backends::current_communicator()->all_reduce(x.data(), y.data(), size_t(4 - rank), DType::Float32, ReduceKind::Sum);
  } catch (const Error& e) {
    const std::string m = e.what();
    bool ok = m.find("[all_reduce] the ranks disagree") != std::string::npos &&
              m.find("rank 0: all_reduce sum of 4 float32; rank 1: all_reduce sum of 3 float32") != std::string::npos;
    std::printf("rank %d: %s: %s\n", rank, ok ? "refused as expected" : "WRONG MESSAGE", m.c_str());
    return ok ? 0 : 1;
  }
  std::printf("rank %d: the mismatch was not refused\n", rank);
  return 1;
}

// The collective-sequence check: each rank's graph writes 2x into x's buffer (donated), all-reduces
// it, then rank 0 all-reduces the result and rank 1 all-gathers it. Both ranks must fail before
// any Step runs (x intact, no Step launched), naming collective 1 and each rank's side; then a
// graph both ranks agree on runs, checked on its first launch only.
int sequence(int rank) {
  std::atomic<int> steps{0};
  runtime::set_after_step_hook([&](int, void* const*) { steps++; });
  const std::vector<double> v = values(32, 30 + uint32_t(rank));
  auto graph = [&](bool gather) {
    ir::NodePtr x = leaf(v, {4, 8});
    ir::NodePtr y = b::mul(x, b::full(2.0, {4, 8}, DType::Float32, Device("cpu")));
    ir::NodePtr c1 = b::all_reduce(y, 2, ReduceKind::Sum);
    return std::pair{x, std::vector<runtime::Request>{{y, x->buffer}, {gather ? b::all_gather(c1, 2, 0) : b::all_reduce(c1, 2, ReduceKind::Sum), {}}}};
  };
  int bad = 0;
  auto [x, req] = graph(rank == 1);
  const int64_t checks = runtime::collective_sequence_checks();
  try {
    runtime::realize(req, {});
    std::printf("rank %d: the different sequences were not refused\n", rank);
    ++bad;
  } catch (const Error& e) {
    const std::string m = e.what();
    const bool ok = m.find("[spmd] the ranks compiled different collective sequences (every rank fails): collective 1: rank 0 "
                           "all_reduce sum float32[4, 8] for 2 ranks; rank 1 all_gather(axis 0) float32[4, 8] for 2 ranks") !=
                    std::string::npos;
    std::printf("rank %d: %s: %s\n", rank, ok ? "refused up front as expected" : "WRONG MESSAGE", m.c_str());
    bad += !ok;
  }
  std::vector<float> now(32);
  runtime::download(*x->buffer, now.data(), now.size() * 4);
  for (size_t i = 0; i < 32; ++i) bad += now[i] != float(v[i]);
  if (steps != 0 || runtime::collective_sequence_checks() - checks != 1) {
    std::printf("rank %d: %d Steps ran, %lld checks made (0 and 1 expected)\n", rank, steps.load(),
                (long long)(runtime::collective_sequence_checks() - checks));
    ++bad;
  }
  // Agreeing ranks run; the second launch of the same sequence checks nothing.
  for (int round = 0; round < 2; ++round) {
    auto [x2, req2] = graph(false);
    const int64_t before = runtime::collective_sequence_checks();
    std::vector<std::shared_ptr<Buffer>> got = runtime::realize(req2, {});
    std::vector<float> c2(32);
    runtime::download(*got[1], c2.data(), c2.size() * 4);
    const std::vector<double> v0 = values(32, 30), v1 = values(32, 31);
    for (size_t i = 0; i < 32; ++i) bad += std::fabs(c2[i] - 4 * (v0[i] + v1[i])) > 1e-5;
    if (runtime::collective_sequence_checks() - before != (round == 0 ? 1 : 0)) {
      std::printf("rank %d: round %d made %lld checks\n", rank, round, (long long)(runtime::collective_sequence_checks() - before));
      ++bad;
    }
  }
  runtime::set_after_step_hook(nullptr);
  std::printf("rank %d: sequence check %s\n", rank, bad ? "FAILED" : "ok");
  return bad ? 1 : 0;
}

int die(int rank) {
  if (rank == 1) {
    std::printf("rank 1: killing myself before the all_reduce\n");
    std::fflush(stdout);
    raise(SIGKILL);
  }
  ir::NodePtr x = leaf(values(4, 1), {4});
  runtime::realize({{b::all_reduce(x, 2, ReduceKind::Sum), {}}}, {});
  std::printf("rank 0: the all_reduce returned without rank 1\n");
  return 0;
}

int stuck(int rank) {
  if (rank == 1) {
    std::printf("rank 1: sleeping 20 s before the all_reduce\n");
    std::fflush(stdout);
    sleep(20);
  }
  ir::NodePtr x = leaf(values(4, 1), {4});
  runtime::realize({{b::all_reduce(x, 2, ReduceKind::Sum), {}}}, {});
  std::printf("rank %d: the all_reduce returned\n", rank);
  return 0;
}

int gpt(int rank) {
  testing::DpRun one = testing::dp_gpt_train(nullptr, 0.1);
  optim::DataParallel dp = optim::DataParallel::process_group({.bucket_bytes = 4096});
  if (dp.ranks() != 2 || dp.rank() != rank) {
    std::fprintf(stderr, "rank %d: DataParallel sees rank %d of %d\n", rank, dp.rank(), dp.ranks());
    return 1;
  }
  testing::DpRun two = testing::dp_gpt_train(&dp, 0.1);
  optim::DataParallel dp2 = optim::DataParallel::process_group({.bucket_bytes = 4096});
  testing::DpRun zero = testing::dp_gpt_train(&dp2, 0.1, 20, 4, true);
  int bad = 0;
  for (size_t s = 0; s < two.losses.size(); ++s)
    if (std::fabs(zero.losses[s] - two.losses[s]) > 1e-5 * std::fabs(two.losses[s])) {
      std::fprintf(stderr, "rank %d step %zu: ZeRO-1 loss %.9g, data parallel %.9g\n", rank, s + 1, zero.losses[s], two.losses[s]);
      ++bad;
    }
  for (size_t s = 0; s < one.losses.size(); ++s) {
    const double rel = std::fabs(two.losses[s] - one.losses[s]) / std::fabs(one.losses[s]);
    if (rel > 1e-5) {
      std::fprintf(stderr, "rank %d step %zu: data-parallel loss %.9g, one device %.9g (relative %.3g)\n", rank, s + 1, two.losses[s],
                   one.losses[s], rel);
      ++bad;
    }
  }
  // The bucket all-reduces in flight across the backward's Steps (runtime/overlap.h, on by
  // default: the runs above) against the blocking form: the same losses over 5 steps, and Steps
  // ran while an all-reduce was pending only with the overlap on.
  runtime::set_collective_overlap(false);
  const runtime::CollectiveOverlapStats s0 = runtime::collective_overlap_stats();
  optim::DataParallel dp3 = optim::DataParallel::process_group({.bucket_bytes = 4096});
  testing::DpRun blocking = testing::dp_gpt_train(&dp3, 0.1, 5);
  const runtime::CollectiveOverlapStats s1 = runtime::collective_overlap_stats();
  runtime::set_collective_overlap(true);
  optim::DataParallel dp4 = optim::DataParallel::process_group({.bucket_bytes = 4096});
  testing::DpRun overlapped = testing::dp_gpt_train(&dp4, 0.1, 5);
  const runtime::CollectiveOverlapStats s2 = runtime::collective_overlap_stats();
  const long long buckets = (long long)dp4.buckets().size();
  if (s1.started != s0.started || s1.steps_overlapped != s0.steps_overlapped || s2.started - s1.started < 5 * (buckets + 1) ||
      s2.steps_overlapped - s1.steps_overlapped < 5 * buckets) {
    std::fprintf(stderr, "rank %d: overlap off started %lld and overlapped %lld Steps; on started %lld, overlapped %lld (%lld buckets)\n",
                 rank, (long long)(s1.started - s0.started), (long long)(s1.steps_overlapped - s0.steps_overlapped),
                 (long long)(s2.started - s1.started), (long long)(s2.steps_overlapped - s1.steps_overlapped), buckets);
    ++bad;
  }
  for (size_t s = 0; s < blocking.losses.size(); ++s)
    if (std::fabs(overlapped.losses[s] - blocking.losses[s]) > 1e-6 * std::fabs(blocking.losses[s])) {
      std::fprintf(stderr, "rank %d step %zu: overlapped loss %.9g, blocking %.9g\n", rank, s + 1, overlapped.losses[s], blocking.losses[s]);
      ++bad;
    }
  std::printf("rank %d: overlap: %lld all-reduces started, %lld Steps run while one was pending, %.2f ms completing them "
              "(5 steps); losses %s the blocking form's\n", rank, (long long)(s2.started - s1.started),
              (long long)(s2.steps_overlapped - s1.steps_overlapped), double(s2.wait_ns - s1.wait_ns) / 1e6,
              overlapped.losses == blocking.losses && overlapped.params == blocking.params ? "bit for bit" : "not bit for bit");
  if (!(one.losses.back() < one.losses.front() - 0.1)) {
    std::fprintf(stderr, "rank %d: the loss did not fall (%g -> %g)\n", rank, one.losses.front(), one.losses.back());
    ++bad;
  }
  std::printf("rank %d: %zu steps, %zu buckets, loss %.6f -> %.6f, data parallel %.6f -> %.6f, ZeRO-1 %.6f -> %.6f (%lld moment "
              "elements on this rank)%s\n", rank, one.losses.size(), dp.buckets().size(), one.losses.front(), one.losses.back(),
              two.losses.front(), two.losses.back(), zero.losses.front(), zero.losses.back(), (long long)zero.state_numel,
              bad ? "" : " (match)");
  return bad ? 1 : 0;
}

// The partitioner on MPI ranks: each process traces the small GPT's step on full shapes, cuts
// its own blocks of the weights split Megatron style over a 2-rank "model" axis, and runs the
// per-rank graph with every output gathered in it: the loss and every gradient equal one
// device's to 1e-5 on both ranks.
int partition(int rank) {
  manual_seed(77);
  Tensor x = randint(0, 24, {4, 8}), y = randint(0, 24, {4, 8});
  tessera::sync();
  const nn::GPTConfig cfg{.vocab = 24, .block = 8, .embd = 16, .heads = 2, .layers = 2};
  manual_seed(5);
  nn::GPT ref(cfg);
  manual_seed(5);
  nn::GPT tp(cfg);
  Tensor l = ref.loss(x, y);
  l.backward();
  tessera::sync();
  dist::Mesh mesh({{"model", 2}});
  tp.shard_tensor_parallel(mesh);
  Tensor lp = tp.loss(x, y);
  lp.backward();
  dist::PartitionStats st = dist::sync_partitioned(mesh);
  int bad = std::fabs(lp.item() - l.item()) > 1e-5 * std::fabs(l.item());
  auto rp = ref.named_parameters(), pp = tp.named_parameters();
  for (size_t i = 0; i < rp.size(); ++i) {
    std::vector<float> a = rp[i].second.grad().to_vector<float>(), g = pp[i].second.grad().to_vector<float>();
    for (size_t k = 0; k < a.size(); ++k)
      if (std::fabs(a[k] - g[k]) > 1e-5 * std::max(1.0f, std::fabs(a[k]))) {
        std::fprintf(stderr, "rank %d: %s[%zu] %.9g, one device %.9g\n", rank, rp[i].first.c_str(), k, g[k], a[k]);
        ++bad;
        break;
      }
  }
  std::printf("rank %d: partitioned loss %.6f, one device %.6f, %d all_reduces, %d all_gathers%s\n", rank, lp.item(), l.item(),
              st.collectives["all_reduce"], st.collectives["all_gather"], bad ? "" : " (match)");
  return bad ? 1 : 0;
}

// Sub-groups on 4 ranks, a 2 x 2 mesh {data: 2, model: 2} (started with -np 4):
// 1. collectives over stride 1 ({0, 1}, {2, 3}) and stride 2 ({0, 2}, {1, 3}) against the
//    reference, and the bytes this rank sent by hand (as test_collectives' in-process twin: x is
//    float32[2, 3], 24 bytes: all_reduce 24, all_gather 24, reduce_scatter 12, a broadcast from
//    group position 1 24 on ranks 2 and 3, a swap permute 24: 84 on ranks 0 and 1, 108 on 2 and 3);
// 2. the small GPT's step partitioned over the mesh (batch over "data", weights over "model"):
//    the loss and every gradient equal one device's to 1e-5;
// 3. rank 3's graph puts its all-reduce over stride 2 where the others' is over stride 1: every
//    rank fails before any Step runs, naming collective 0 and every rank's side.
int groups(int rank, int N) {
  if (N != 4) {
    std::fprintf(stderr, "groups: needs 4 ranks (mpirun -np 4), got %d\n", N);
    return 2;
  }
  int bad = 0;
  {
    const Shape s{2, 3};
    std::vector<std::vector<double>> xs;
    for (int r = 0; r < N; ++r) xs.push_back(values(6, 40 + r));
    ir::NodePtr x = leaf(xs[size_t(rank)], s);
    std::vector<ir::NodePtr> outs = {b::all_reduce(x, 2, ReduceKind::Sum, 1), b::all_gather(x, 2, 0, 2), b::reduce_scatter(x, 2, 0, 1),
                                     b::broadcast(x, 2, 1, 2), b::collective_permute(x, 2, {{0, 1}, {1, 0}}, 1)};
    std::vector<runtime::Request> req;
    for (auto& o : outs) req.push_back({o, {}});
    backends::Communicator& comm = *backends::current_communicator();
    const backends::Communicator::Traffic before = comm.traffic();
    std::vector<std::shared_ptr<Buffer>> got = runtime::realize(req, {});
    const int64_t calls = comm.traffic().calls - before.calls, bytes = comm.traffic().bytes - before.bytes;
    ir::Graph g = ir::build_graph(outs);
    std::vector<std::vector<reference::Value>> params(static_cast<size_t>(N));
    for (int r = 0; r < N; ++r) params[size_t(r)].push_back({s, DType::Float32, xs[size_t(r)]});
    std::vector<const ir::Graph*> gs(static_cast<size_t>(N), &g);
    auto ref = reference::evaluate_ranks(gs, 0, 0, params);
    for (size_t k = 0; k < outs.size(); ++k) {
      std::vector<float> f(size_t(outs[k]->numel()));
      runtime::download(*got[k], f.data(), f.size() * 4);
      const std::vector<double>& want = ref[size_t(rank)][k].data;
      for (size_t i = 0; i < f.size(); ++i)
        if (std::fabs(f[i] - want[i]) > 1e-5) {
          std::fprintf(stderr, "rank %d: output %zu (%s)[%zu] %g, reference %g\n", rank, k, ir::op_name(outs[k]->op), i, f[i], want[i]);
          bad++;
          break;
        }
    }
    if (calls != 5 || bytes != (rank < 2 ? 84 : 108)) {
      std::fprintf(stderr, "rank %d: %lld calls, %lld bytes sent (5 and %d expected)\n", rank, (long long)calls, (long long)bytes,
                   rank < 2 ? 84 : 108);
      bad++;
    }
  }
  {
    manual_seed(77);
    Tensor x = randint(0, 24, {4, 8}), y = randint(0, 24, {4, 8});
    tessera::sync();
    const nn::GPTConfig cfg{.vocab = 24, .block = 8, .embd = 16, .heads = 2, .layers = 1};
    manual_seed(5);
    nn::GPT ref(cfg);
    manual_seed(5);
    nn::GPT tp(cfg);
    Tensor l = ref.loss(x, y);
    l.backward();
    tessera::sync();
    dist::Mesh mesh({{"data", 2}, {"model", 2}});
    tp.shard_tensor_parallel(mesh, "model");
    dist::shard(x, mesh, {"data", dist::none});
    dist::shard(y, mesh, {"data", dist::none});
    Tensor lp = tp.loss(x, y);
    lp.backward();
    dist::PartitionStats st = dist::sync_partitioned(mesh);
    bad += std::fabs(lp.item() - l.item()) > 1e-5 * std::fabs(l.item());
    auto rp = ref.named_parameters(), pp = tp.named_parameters();
    for (size_t i = 0; i < rp.size(); ++i) {
      std::vector<float> a = rp[i].second.grad().to_vector<float>(), gr = pp[i].second.grad().to_vector<float>();
      for (size_t k = 0; k < a.size(); ++k)
        if (std::fabs(a[k] - gr[k]) > 1e-5 * std::max(1.0f, std::fabs(a[k]))) {
          std::fprintf(stderr, "rank %d: %s[%zu] %.9g, one device %.9g\n", rank, rp[i].first.c_str(), k, gr[k], a[k]);
          ++bad;
          break;
        }
    }
    std::printf("rank %d: 2 x 2 partitioned loss %.6f, one device %.6f; %lld collectives sent %lld bytes\n", rank, lp.item(), l.item(),
                (long long)(st.rank_comm_calls.empty() ? -1 : st.rank_comm_calls[0]),
                (long long)(st.rank_comm_bytes.empty() ? -1 : st.rank_comm_bytes[0]));
    dist::clear_shardings();
  }
  {
    ir::NodePtr x = leaf(values(6, 50), {2, 3});
    try {
      runtime::realize({{b::all_reduce(x, 2, ReduceKind::Sum, rank == 3 ? 2 : 1), {}}}, {});
      std::printf("rank %d: the different groups were not refused\n", rank);
      ++bad;
    } catch (const Error& e) {
      const std::string m = e.what();
      const bool ok = m.find("[spmd] the ranks compiled different collective sequences (every rank fails): collective 0: rank 0 "
                             "all_reduce sum float32[2, 3] for 2 ranks at stride 1;") != std::string::npos &&
                      m.find("rank 3 all_reduce sum float32[2, 3] for 2 ranks at stride 2") != std::string::npos;
      std::printf("rank %d: %s: %s\n", rank, ok ? "refused up front as expected" : "WRONG MESSAGE", m.c_str());
      bad += !ok;
    }
  }
  std::printf("rank %d: sub-groups %s\n", rank, bad ? "FAILED" : "ok");
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "graph";
  try {
    auto comm = backends::make_mpi_communicator();
    backends::set_process_communicator(comm);
    const int rank = comm->rank(), N = comm->size();
    if (mode == "graph") return graph(rank, N);
    if (mode == "mismatch") return mismatch(rank);
    if (mode == "sequence") return sequence(rank);
    if (mode == "die") return die(rank);
    if (mode == "stuck") return stuck(rank);
    if (mode == "gpt") return gpt(rank);
    if (mode == "partition") return partition(rank);
    if (mode == "groups") return groups(rank, N);
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
