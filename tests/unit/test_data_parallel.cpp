// Data parallelism (optim::DataParallel) on in-process ranks: the benchmark-style GPT trained on 2
// rank threads, each on half of every batch with its gradients averaged in buckets, gives one
// device's losses on the whole batch to 1e-5 relative over 20 steps -- with dropout 0.1 too,
// whose masks each rank draws at its rows of the batch. tests/mpi runs the same over MPI ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <thread>

#include "backends/communicator.h"
#include "runtime/realize.h"

#include "dp_gpt.h"
#include "tessera/distributed.h"
#include "tessera/io.h"
#include "test_util.h"

namespace tessera {
namespace {

// 20 steps (6 under the sanitizers, where each step is many times slower).
constexpr int kSteps = testing::steps_or_few(20, 6);

void expect_same_training(const testing::DpRun& one, const testing::DpRun& dp) {
  ASSERT_EQ(one.losses.size(), dp.losses.size());
  for (size_t s = 0; s < one.losses.size(); ++s)
    EXPECT_NEAR(dp.losses[s], one.losses[s], 1e-5 * std::fabs(one.losses[s])) << "step " << s + 1;
  ASSERT_EQ(one.params.size(), dp.params.size());
  double worst = 0;
  for (size_t i = 0; i < one.params.size(); ++i) worst = std::max(worst, double(std::fabs(one.params[i] - dp.params[i])));
  EXPECT_LT(worst, 1e-3) << "largest parameter difference after training (AdamW normalizes tiny gradients: rounding moves them)";
  // The training did something: the loss fell.
  EXPECT_LT(one.losses.back(), one.losses.front() - (kSteps >= 20 ? 0.1 : 0.01));
}

TEST(DataParallel, TwoInProcessRanksTrainTheGptLikeOneDeviceOnTheWholeBatch) {
  testing::DpRun one = testing::dp_gpt_train(nullptr, 0.0, kSteps);
  // A small bucket: several all_reduces, most holding several parameters.
  optim::DataParallel dp = optim::DataParallel::in_process(2, {.bucket_bytes = 4096});
  testing::DpRun two = testing::dp_gpt_train(&dp, 0.0, kSteps);
  expect_same_training(one, two);
  size_t params = 0, multi = 0;
  for (const auto& b : dp.buckets()) {
    params += b.size(), multi += b.size() > 1;
    EXPECT_LE(b.size(), size_t(8));  // DataParallelOptions::bucket_params
  }
  EXPECT_GT(dp.buckets().size(), size_t(2));
  EXPECT_GT(multi, size_t(1));
  EXPECT_EQ(params, nn::GPT(testing::dp_gpt_config(0)).parameters().size());
  // The last parameter is reduced first (the backward finishes it first).
  EXPECT_EQ(dp.buckets()[0][0], params - 1);
}

// The bucket all-reduces are started at their Step and completed before the first Step that
// touches their buffers (runtime/overlap.h): the backward's later Steps run while they are in
// flight, and the losses are the blocking form's (the same reduction, only later).
TEST(DataParallel, BucketAllReducesStayInFlightAcrossTheBackwardWithTheBlockingLosses) {
  constexpr int kFew = 4;
  runtime::set_collective_overlap(false);
  const runtime::CollectiveOverlapStats s0 = runtime::collective_overlap_stats();
  optim::DataParallel blocking_dp = optim::DataParallel::in_process(2, {.bucket_bytes = 4096});
  testing::DpRun blocking = testing::dp_gpt_train(&blocking_dp, 0.1, kFew);
  const runtime::CollectiveOverlapStats s1 = runtime::collective_overlap_stats();
  runtime::set_collective_overlap(true);
  optim::DataParallel dp = optim::DataParallel::in_process(2, {.bucket_bytes = 4096});
  testing::DpRun overlapped = testing::dp_gpt_train(&dp, 0.1, kFew);
  const runtime::CollectiveOverlapStats s2 = runtime::collective_overlap_stats();
  // Off: nothing started without waiting.
  EXPECT_EQ(s1.started, s0.started);
  EXPECT_EQ(s1.steps_overlapped, s0.steps_overlapped);
  // On: per step and rank, every bucket's all-reduce and the loss's started; Steps ran while some
  // were pending -- at least one per bucket (its wait comes after the next Step at the earliest).
  const int64_t buckets = int64_t(dp.buckets().size());
  ASSERT_GT(buckets, 2);
  EXPECT_GE(s2.started - s1.started, 2 * kFew * (buckets + 1));
  EXPECT_GE(s2.steps_overlapped - s1.steps_overlapped, 2 * kFew * buckets);  // (the schedule puts their readers after the backward)
  ASSERT_EQ(blocking.losses.size(), overlapped.losses.size());
  for (size_t s = 0; s < blocking.losses.size(); ++s)
    EXPECT_NEAR(overlapped.losses[s], blocking.losses[s], 1e-6 * std::fabs(blocking.losses[s])) << "step " << s + 1;
  ASSERT_EQ(blocking.params.size(), overlapped.params.size());
  for (size_t i = 0; i < blocking.params.size(); ++i) ASSERT_EQ(blocking.params[i], overlapped.params[i]) << "parameter element " << i;
}

TEST(DataParallel, DropoutMasksAreTheWholeBatchsOnEveryRank) {
  testing::DpRun one = testing::dp_gpt_train(nullptr, 0.1, kSteps);
  optim::DataParallel dp = optim::DataParallel::in_process(2);
  testing::DpRun two = testing::dp_gpt_train(&dp, 0.1, kSteps);
  expect_same_training(one, two);
  // And the dropout run is not the run without dropout (the masks are in play).
  testing::DpRun plain = testing::dp_gpt_train(nullptr, 0.0, 3);
  EXPECT_GT(std::fabs(plain.losses[1] - one.losses[1]), 1e-3);
}

TEST(DataParallel, ZeroOneMatchesPlainDataParallelWithHalfTheMomentsPerRank) {
  optim::DataParallel dp = optim::DataParallel::in_process(2, {.bucket_bytes = 4096});
  testing::DpRun plain = testing::dp_gpt_train(&dp, 0.1, kSteps);
  optim::DataParallel dp2 = optim::DataParallel::in_process(2, {.bucket_bytes = 4096});
  testing::DpRun zero = testing::dp_gpt_train(&dp2, 0.1, kSteps, 4, true);
  expect_same_training(plain, zero);
  // Each rank keeps half of every bucket's two moments (buckets padded to an even length).
  int64_t n = 0;
  for (const Tensor& p : nn::GPT(testing::dp_gpt_config(0)).parameters()) n += p.numel();
  EXPECT_GE(zero.state_numel, n);
  EXPECT_LE(zero.state_numel, n + 2 * int64_t(dp2.buckets().size()));
  // One rank: ZeroAdamW is AdamW with clipping.
  optim::DataParallel one = optim::DataParallel::process_group();
  testing::DpRun z1 = testing::dp_gpt_train(&one, 0.0, 5, 4, true);
  testing::DpRun ref = testing::dp_gpt_train(nullptr, 0.0, 5);
  for (size_t s = 0; s < 5; ++s) EXPECT_NEAR(z1.losses[s], ref.losses[s], 1e-5 * std::fabs(ref.losses[s])) << "step " << s + 1;
  EXPECT_EQ(z1.state_numel, 2 * n);
}

// ZeRO-1 checkpoints: 3 steps on 2 in-process ranks, then the model's and ZeroAdamW's state (both
// ranks' moment shards) and the generator's saved to a safetensors file; a fresh model and
// optimizer loaded from it train steps 4-6 with the losses of an uninterrupted 6-step run (dropout
// 0.1: the generator resumes too). Another number of ranks is refused.
TEST(DataParallel, ZeroOneResumesFromItsCheckpointWithTheSameLosses) {
  const nn::GPTConfig cfg = testing::dp_gpt_config(0.1);
  const std::string file = ::testing::TempDir() + "zero1_ckpt.safetensors";
  // load: 0 nothing, 1 the model and generator only, 2 the optimizer's moments too.
  auto run = [&](int ranks, int from, int to, int load, bool save) {
    manual_seed(1234);
    nn::GPT model(cfg);
    std::vector<Tensor> params = model.parameters();
    optim::DataParallel dp = optim::DataParallel::in_process(ranks, {.bucket_bytes = 4096});
    optim::ZeroAdamW opt(dp, params, {.lr = 3e-3, .weight_decay = 0.1}, 1.0);
    if (load) {
      io::Metadata meta;
      io::TensorMap t = io::load_safetensors(file, &meta);
      std::map<std::string, Tensor> ms, os;
      for (auto& [k, v] : t) (k.rfind("model.", 0) == 0 ? ms[k.substr(6)] : os[k.substr(6)]) = v;
      model.load_state_dict(ms);
      if (load == 2) opt.load_state_dict(os);
      set_rng_state({std::stoull(meta.at("rng_seed")), std::stoull(meta.at("rng_offset"))});
      if (load == 2) {
        EXPECT_EQ(opt.steps(), from);
      }
    }
    std::vector<double> losses;
    auto loss_fn = [&](const std::vector<Tensor>& b) { return model.loss(b[0], b[1]); };
    for (int s = from; s < to; ++s) {
      auto [X, Y] = testing::dp_gpt_batch(cfg, s, 4);
      losses.push_back(opt.step({X, Y}, loss_fn));
    }
    if (save) {
      io::TensorMap t;
      for (auto& [k, v] : model.state_dict()) t["model." + k] = v;
      std::map<std::string, Tensor> os = opt.state_dict();
      EXPECT_TRUE(os.count("rank0.m.0") && os.count("rank1.v.0")) << "every in-process rank's shards";
      for (auto& [k, v] : os) t["optim." + k] = v;
      RngState rs = rng_state();
      io::save_safetensors(file, t, {{"rng_seed", std::to_string(rs.seed)}, {"rng_offset", std::to_string(rs.offset)}});
    }
    return losses;
  };
  const std::vector<double> whole = run(2, 0, 6, 0, false);
  run(2, 0, 3, 0, true);
  const std::vector<double> resumed = run(2, 3, 6, 2, false);
  ASSERT_EQ(resumed.size(), 3u);
  for (size_t s = 0; s < 3; ++s) EXPECT_NEAR(resumed[s], whole[s + 3], 1e-6 * std::fabs(whole[s + 3])) << "step " << s + 4;
  // Without the moments (a fresh ZeroAdamW on the loaded model) step 5's loss moves: they are in play.
  const std::vector<double> fresh = run(2, 3, 5, 1, false);
  EXPECT_GT(std::fabs(fresh[1] - whole[4]), 1e-4) << fresh[1] << " " << whole[4];
  std::string e = testing::error_message([&] { run(3, 3, 4, 2, false); });
  EXPECT_NE(e.find("[DataParallel] ZeroAdamW: the state's moments are sharded over 2 ranks, this run has 3"), std::string::npos) << e;
  std::remove(file.c_str());
}

TEST(DataParallel, OneRankIsPlainTraining) {
  testing::DpRun one = testing::dp_gpt_train(nullptr, 0.0, 5);
  optim::DataParallel dp = optim::DataParallel::process_group();  // no MPI: one rank
  EXPECT_EQ(dp.ranks(), 1);
  testing::DpRun same = testing::dp_gpt_train(&dp, 0.0, 5);
  for (size_t s = 0; s < 5; ++s) EXPECT_DOUBLE_EQ(same.losses[s], one.losses[s]);
}

TEST(DataParallel, ABatchThatDoesNotSplitEvenlyIsAClearError) {
  optim::DataParallel dp = optim::DataParallel::in_process(2);
  std::string e = testing::error_message([&] { testing::dp_gpt_train(&dp, 0.0, 1, 3); });
  EXPECT_NE(e.find("[DataParallel] a batch of 3 rows (int64[3, 8]) does not divide into 2 ranks"), std::string::npos) << e;
  e = testing::error_message([] { optim::DataParallel::in_process(0); });
  EXPECT_NE(e.find("[DataParallel] needs at least one rank"), std::string::npos) << e;
}

TEST(DataParallel, ARankThatFailsEndsTheStepNamingItAndTheModelIsKept) {
  // Rank 1's rows hold a token outside the vocabulary: the embedding's gather fails there only.
  const nn::GPTConfig cfg = testing::dp_gpt_config(0);
  manual_seed(5);
  nn::GPT model(cfg);
  std::vector<Tensor> params = model.parameters();
  optim::AdamW opt(params, {.lr = 1e-2});
  optim::DataParallel dp = optim::DataParallel::in_process(2);
  std::vector<int64_t> tok(size_t(4 * cfg.block), 1);
  tok.back() = 99;
  Tensor X = from_vector(tok, {4, cfg.block}, {DType::Int64, Device("cpu")});
  auto loss_fn = [&](const std::vector<Tensor>& b) { return model.loss(b[0], b[0]); };
  auto update = [&] {
    opt.step();
    opt.zero_grad();
  };
  const std::vector<float> before = params[0].to_vector<float>();
  std::string e = testing::error_message([&] { dp.step(params, {X}, loss_fn, update); });
  EXPECT_NE(e.find("rank 1 of 2 failed"), std::string::npos) << e;
  EXPECT_NE(e.find("99"), std::string::npos) << e;
  EXPECT_EQ(params[0].to_vector<float>(), before);  // the update was taken back
  // The next step, on good rows, trains.
  tok.back() = 2;
  Tensor good = from_vector(tok, {4, cfg.block}, {DType::Int64, Device("cpu")});
  double l = dp.step(params, {good}, loss_fn, update);
  EXPECT_TRUE(std::isfinite(l));
  EXPECT_NE(params[0].to_vector<float>(), before);
}

// A ZeroAdamW step that fails on a rank is not counted: the retried step's bias correction is the
// first step's, so the parameters after it equal a run whose first step succeeded (bit for bit).
TEST(DataParallel, AFailedZeroAdamWStepIsNotCounted) {
  const nn::GPTConfig cfg = testing::dp_gpt_config(0);
  auto train = [&](bool fail_first) {
    manual_seed(5);
    nn::GPT model(cfg);
    std::vector<Tensor> params = model.parameters();
    optim::DataParallel dp = optim::DataParallel::in_process(2);
    optim::ZeroAdamW opt(dp, params, {.lr = 1e-2});
    std::vector<int64_t> tok(size_t(4 * cfg.block), 1);
    auto batch = [&] { return from_vector(tok, {4, cfg.block}, {DType::Int64, Device("cpu")}); };
    auto loss_fn = [&](const std::vector<Tensor>& b) { return model.loss(b[0], b[0]); };
    if (fail_first) {
      tok.back() = 99;  // outside the vocabulary, in rank 1's rows
      std::string e = testing::error_message([&] { opt.step({batch()}, loss_fn); });
      EXPECT_NE(e.find("rank 1 of 2 failed"), std::string::npos) << e;
      EXPECT_EQ(opt.steps(), 0);
    }
    tok.back() = 2;
    opt.step({batch()}, loss_fn);
    EXPECT_EQ(opt.steps(), 1);
    return params[0].to_vector<float>();
  };
  EXPECT_EQ(train(true), train(false));
}

TEST(DataParallel, RanksOnOneHostSplitItsThreads) {
  // On a fresh thread (a rank thread's situation): T threads become max(1, T / n).
  int before = 0, half = 0, third_of_half = 0;
  if (backends::host_threads() < 2) GTEST_SKIP() << "one host thread: every share is 1";
  std::thread([&] {
    before = backends::host_threads();
    backends::share_host_threads(2);
    half = backends::host_threads();
    backends::share_host_threads(3);
    third_of_half = backends::host_threads();
  }).join();
  EXPECT_GE(before, 1);
  EXPECT_EQ(half, std::max(1, before / 2));
  EXPECT_EQ(third_of_half, std::max(1, half / 3));
}

TEST(DataParallel, TensorCollectivesAndSyncRanks) {
  // dist::all_reduce traced on tensors, run on 3 in-process ranks each with its own input.
  Tensor x = from_vector<float>({1, 2}, {2});
  Tensor y = dist::all_reduce(x * 2.0, 3, dist::Reduce::Sum);
  Tensor g = dist::all_gather(x, 3, 0);
  dist::sync_ranks(3, {{{x, from_vector<float>({10, 20}, {2})}}, {{x, from_vector<float>({100, 200}, {2})}}});
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{222, 444}));
  EXPECT_EQ(g.to_vector<float>(), (std::vector<float>{1, 2, 10, 20, 100, 200}));
  std::string e = testing::error_message([] { dist::all_gather(from_vector<float>({1}, {1}), 2, 3); });
  EXPECT_NE(e.find("[all_gather] dimension 3 out of range for [1]"), std::string::npos) << e;
}

TEST(DataParallel, AllToAllBroadcastAndPermuteOnTensors) {
  // 3 in-process ranks, rank r's x = 10 r + [0 1 2; 3 4 5] as [2, 3]; values by hand.
  auto x_of = [](float r) { return from_vector<float>({10 * r, 10 * r + 1, 10 * r + 2, 10 * r + 3, 10 * r + 4, 10 * r + 5}, {2, 3}); };
  Tensor x = x_of(0);
  Tensor a = dist::all_to_all(x, 3, 1, 0);  // rank c gets column c of every rank, stacked: [6, 1]
  Tensor b = dist::broadcast(x * 2.0, 3, 2);
  Tensor p = dist::collective_permute(x, 3, {{0, 1}, {1, 2}});  // rank 0 receives nothing: zeros
  auto ranks = dist::sync_ranks(3, {{{x, x_of(1)}}, {{x, x_of(2)}}}, 0, {a, b, p});
  const std::vector<std::vector<float>> want_a = {{0, 3, 10, 13, 20, 23}, {1, 4, 11, 14, 21, 24}, {2, 5, 12, 15, 22, 25}};
  const std::vector<float> want_b = {40, 42, 44, 46, 48, 50};
  EXPECT_EQ(a.shape(), (Shape{6, 1}));
  EXPECT_EQ(a.to_vector<float>(), want_a[0]);
  EXPECT_EQ(b.to_vector<float>(), want_b);
  EXPECT_EQ(p.to_vector<float>(), std::vector<float>(6, 0.f));
  ASSERT_EQ(ranks.size(), 2u);
  for (int r = 1; r <= 2; ++r) {
    EXPECT_EQ(ranks[size_t(r - 1)][0].to_vector<float>(), want_a[size_t(r)]) << "rank " << r;
    EXPECT_EQ(ranks[size_t(r - 1)][1].to_vector<float>(), want_b) << "rank " << r;
    EXPECT_EQ(ranks[size_t(r - 1)][2].to_vector<float>(), x_of(float(r - 1)).to_vector<float>()) << "rank " << r;
  }
  auto err = [](auto f) { return testing::error_message(f); };
  std::string e = err([] { dist::all_to_all(from_vector<float>({1, 2}, {2}), 3, 0, 0); });
  EXPECT_NE(e.find("[all_to_all] uneven split"), std::string::npos) << e;
  e = err([] { dist::broadcast(from_vector<float>({1}, {1}), 2, 2); });
  EXPECT_NE(e.find("[broadcast] root 2 out of range for 2 ranks"), std::string::npos) << e;
  e = err([] { dist::collective_permute(from_vector<float>({1}, {1}), 2, {{0, 1}, {0, 0}}); });
  EXPECT_NE(e.find("[collective_permute] rank 0 appears twice"), std::string::npos) << e;
}

}  // namespace
}  // namespace tessera
