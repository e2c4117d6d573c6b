// The counter-based generator that defines Tessera's random numbers (Philox4x32-10, Salmon et
// al. 2011). Every backend and the reference draw element i of draw d of a graph executed with
// (seed, offset) as philox(seed, offset, d, i), so all produce the same numbers. The counter
// holds the stream offset + d: the frontend numbers draws in trace order and advances the
// offset by the draws traced before each sync, so a tensor's numbers do not depend on how
// syncs grouped the draws into graphs.
#pragma once
#include <cmath>
#include <cstdint>

namespace tessera::rng {

struct Words {
  uint32_t w[4];
};

inline Words philox(uint64_t seed, uint64_t offset, uint32_t draw, uint64_t index) {
  const uint64_t stream = offset + draw;
  uint32_t c0 = uint32_t(index), c1 = uint32_t(index >> 32), c2 = uint32_t(stream), c3 = uint32_t(stream >> 32);
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = uint64_t(0xD2511F53u) * c0, p1 = uint64_t(0xCD9E8D57u) * c2;
    uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0, n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c0 = n0;
    c1 = uint32_t(p1);
    c2 = n2;
    c3 = uint32_t(p0);
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// Uniform in [0, 1) with 24 random bits (exact in float32).
inline double uniform(const Words& x) { return double(x.w[0] >> 8) * (1.0 / 16777216.0); }
// Standard normal by Box-Muller, computed in double.
inline double normal(const Words& x) {
  double u1 = (double(x.w[0] >> 8) + 1.0) * (1.0 / 16777216.0);  // (0, 1]
  double u2 = double(x.w[1] >> 8) * (1.0 / 16777216.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}
inline double sample(uint64_t seed, uint64_t offset, uint32_t draw, uint64_t index, int dist) {
  Words w = philox(seed, offset, draw, index);
  return dist == 0 ? uniform(w) : normal(w);
}

}  // namespace tessera::rng
