#include <algorithm>
#include <cmath>
#include <random>

#include "core/fail.h"
#include "tessera/nn.h"

namespace tessera::nn {
namespace {

Tensor int_scalar(int64_t v, const Device& d) { return from_vector<int64_t>({v}, {}, {DType::Int64, d}); }

// Temperature and top-k sampling on the host from one row of logits.
int64_t sample(std::vector<double> logits, const SampleOptions& o, std::mt19937_64& rng) {
  for (double& l : logits) l /= o.temperature;
  if (o.top_k > 0 && o.top_k < int64_t(logits.size())) {
    std::vector<double> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<>());
    double kth = sorted[o.top_k - 1];
    for (double& l : logits)
      if (l < kth) l = -INFINITY;
  }
  double m = *std::max_element(logits.begin(), logits.end()), total = 0;
  for (double& l : logits) total += (l = std::exp(l - m));
  double u = std::uniform_real_distribution<double>(0, total)(rng), acc = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    if ((acc += logits[i]) > u && logits[i] > 0) return int64_t(i);
  return int64_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace

std::vector<int64_t> generate(GPT& model, const std::vector<int64_t>& prompt, const SampleOptions& o,
                              const std::function<void(int64_t)>& on_token) {
  const GPTConfig& c = model.config();
  if (prompt.empty()) fail("generate", "the prompt must hold at least one token", "");
  if (o.temperature <= 0) fail("generate", "temperature must be positive, got " + std::to_string(o.temperature), "");
  for (int64_t t : prompt)
    if (t < 0 || t >= c.vocab) fail("generate", "token " + std::to_string(t) + " outside the vocabulary of " + std::to_string(c.vocab), "");
  NoGradGuard ng;
  bool was_training = model.is_training();
  model.eval();
  Device dev = model.wte->weight.device();
  std::mt19937_64 rng(o.seed);
  KVCache cache = model.make_cache(1);
  std::vector<int64_t> ctx(prompt.end() - std::min<int64_t>(int64_t(prompt.size()), c.block), prompt.end());
  std::vector<int64_t> out;

  // Logits of the last context token after prefilling `ctx` (padded to the block) at position 0.
  auto prefill = [&] {
    std::vector<int64_t> padded(size_t(c.block), 0);
    std::copy(ctx.begin(), ctx.end(), padded.begin());
    Tensor idx = from_vector(padded, {1, c.block}, {DType::Int64, dev});
    Tensor logits = model.forward_cached(idx, cache, int_scalar(0, dev));  // [1, block, V]
    Tensor last = int_scalar(int64_t(ctx.size()) - 1, dev).reshape({1, 1, 1}).expand({1, 1, c.vocab});
    return gather(logits, 1, last).to_vector<double>();
  };
  std::vector<double> row = prefill();
  for (int64_t n = 0; n < o.tokens; ++n) {
    int64_t tok = sample(row, o, rng);
    out.push_back(tok);
    if (on_token) on_token(tok);
    if (n + 1 == o.tokens) break;
    if (int64_t(ctx.size()) == c.block) {  // full: keep the last half, prefill again
      ctx.erase(ctx.begin(), ctx.begin() + c.block / 2 + (c.block % 2));
      ctx.push_back(tok);
      row = prefill();
      continue;
    }
    ctx.push_back(tok);
    Tensor idx = from_vector<int64_t>({tok}, {1, 1}, {DType::Int64, dev});
    row = model.forward_cached(idx, cache, int_scalar(int64_t(ctx.size()) - 1, dev)).to_vector<double>();
  }
  model.train(was_training);
  return out;
}

}  // namespace tessera::nn
