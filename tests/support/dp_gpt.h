// The data-parallel GPT check shared by test_data_parallel (in-process ranks) and tests/mpi (MPI
// ranks): a small benchmark-style GPT trained with AdamW for `steps` steps on fixed random token
// batches, either on one device on the whole batch or through optim::DataParallel; returns the
// losses and the final parameters (flattened). Same seed, same batches, same initial model.
#pragma once
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "tessera/tessera.h"

namespace tessera::testing {

struct DpRun {
  std::vector<double> losses;
  std::vector<float> params;
  int64_t state_numel = 0;  // ZeroAdamW: this rank's moment elements
};

inline nn::GPTConfig dp_gpt_config(double dropout) {
  return nn::GPTConfig{.vocab = 24, .block = 8, .embd = 16, .heads = 2, .layers = 2, .dropout = dropout, .bias = true, .tied_head = false};
}

// Step s's batch: tokens from a fixed little generator (the same on every rank).
inline std::pair<Tensor, Tensor> dp_gpt_batch(const nn::GPTConfig& cfg, int s, int64_t batch) {
  std::vector<int64_t> x(size_t(batch * cfg.block)), y(x.size());
  uint64_t st = 977 + uint64_t(s) * 131;
  for (size_t i = 0; i < x.size(); ++i) {
    st = st * 6364136223846793005ULL + 1442695040888963407ULL;
    x[i] = int64_t((st >> 33) % uint64_t(cfg.vocab));
    y[i] = (x[i] * 7 + 3) % cfg.vocab;  // learnable: a fixed map of the input token
  }
  return {from_vector(x, {batch, cfg.block}, {DType::Int64, Device("cpu")}), from_vector(y, {batch, cfg.block}, {DType::Int64, Device("cpu")})};
}

// dp == nullptr: one device on the whole batch. zero: optim::ZeroAdamW over dp's ranks (moments
// sharded) in place of AdamW and clip_grad_norm.
inline DpRun dp_gpt_train(optim::DataParallel* dp, double dropout, int steps = 20, int64_t batch = 4, bool zero = false) {
  const nn::GPTConfig cfg = dp_gpt_config(dropout);
  manual_seed(1234);
  nn::GPT model(cfg);
  std::vector<Tensor> params = model.parameters();
  optim::AdamW opt(params, {.lr = 3e-3, .weight_decay = 0.1});
  std::unique_ptr<optim::ZeroAdamW> zopt;
  if (zero) zopt = std::make_unique<optim::ZeroAdamW>(*dp, params, optim::AdamOptions{.lr = 3e-3, .weight_decay = 0.1}, 1.0);
  DpRun out;
  for (int s = 0; s < steps; ++s) {
    auto [X, Y] = dp_gpt_batch(cfg, s, batch);
    auto loss_fn = [&](const std::vector<Tensor>& b) { return model.loss(b[0], b[1]); };
    auto update = [&] {
      optim::clip_grad_norm(params, 1.0);
      opt.step();
      opt.zero_grad();
    };
    if (zopt) {
      out.losses.push_back(zopt->step({X, Y}, loss_fn));
      out.state_numel = zopt->state_numel();
    } else if (dp) {
      out.losses.push_back(dp->step(params, {X, Y}, loss_fn, update));
    } else {
      Tensor loss = loss_fn({X, Y});
      loss.backward();
      update();
      out.losses.push_back(loss.item());
    }
  }
  for (const Tensor& p : params)
    for (float v : p.to_vector<float>()) out.params.push_back(v);
  return out;
}

}  // namespace tessera::testing
