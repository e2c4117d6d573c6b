// Pieces the benchmarks share: the machine's load, the register-only FMA loop, and the benchmark
// GPT's configuration and token batches (the same ones bench/gpt_step_torch.py draws, so both sides train on equal data).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace bench {

#if defined(__x86_64__)
// 16 independent AVX-512 FMA chains, nothing loaded (FMA latency 4 x 2 pipes needs 8): the
// core's float32 FMA rate, 16 x 16 lanes x 2 flops per loop trip. The sum keeps it live.
constexpr int kFmaChains = 16;
__attribute__((target("avx512f"), noinline)) inline float fma_loop(int64_t iters, float seed = 0) {
  __m512 acc[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) acc[i] = _mm512_set1_ps(seed + float(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < kFmaChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  for (int i = 1; i < kFmaChains; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  float lanes[16];
  _mm512_storeu_ps(lanes, acc[0]);
  float s = 0;
  for (float v : lanes) s += v;
  return s;
}
#endif

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
