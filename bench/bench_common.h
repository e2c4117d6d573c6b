// Pieces the benchmarks share: the machine's load, and the benchmark GPT's configuration and
// token batches (the same ones bench/gpt_step_torch.py draws, so both sides train on equal data).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

namespace bench {

// The 1-minute load average: a busy machine makes every number meaningless.
inline double load_average() {
  double l = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

// The p-quantile of v with linear interpolation (numpy's default), p in [0, 1].
inline double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  double pos = p * double(v.size() - 1);
  size_t lo = size_t(pos), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

// The benchmark GPT: vocab 114, block 64, embd 128, 4 heads, 4 layers, batch 16.
constexpr int64_t kVocab = 114, kBlock = 64, kEmbd = 128, kHeads = 4, kLayers = 4, kBatch = 16, kBatches = 4;

inline uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// kBatches (inputs, targets) pairs of [batch, block] token ids in [0, vocab): the targets are
// the inputs shifted by one within a stream of block + 1 tokens, as a text loader gives them.
inline std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> make_batches(int64_t batch = kBatch, int64_t block = kBlock,
                                                                                       int64_t vocab = kVocab) {
  uint64_t s = 1234;
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> r;
  for (int64_t b = 0; b < kBatches; ++b) {
    std::vector<int64_t> x, y;
    for (int64_t i = 0; i < batch; ++i) {
      std::vector<int64_t> row;
      for (int64_t t = 0; t <= block; ++t) row.push_back(int64_t(splitmix64(s) % uint64_t(vocab)));
      x.insert(x.end(), row.begin(), row.end() - 1);
      y.insert(y.end(), row.begin() + 1, row.end());
    }
    r.emplace_back(std::move(x), std::move(y));
  }
  return r;
}

}  // namespace bench
