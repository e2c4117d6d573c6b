#include "backends/cpu/bf16_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <utility>
#include <cstdlib>
#include <cstring>

namespace tessera::backends::bf16_gemm {

bool available() {
#if defined(__x86_64__)
  static const bool ok = [] {
    const char* e = std::getenv("TESSERA_CPU_BF16");
    if (e && std::strcmp(e, "0") == 0) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") != 0;
  }();
  return ok;
#else
  return false;
#endif
}

int64_t packed_size(int64_t K, int64_t N) { return (K + 1) / 2 * 2 * ((N + 15) / 16 * 16); }

void pack_b(const uint16_t* b, int64_t rs, int64_t cs, int64_t K, int64_t N, uint16_t* out) {
  const int64_t P = (K + 1) / 2;
  for (int64_t j0 = 0; j0 < N; j0 += 16) {
    const int64_t w = std::min<int64_t>(16, N - j0);
    for (int64_t p = 0; p < P; ++p, out += 32) {
      for (int h = 0; h < 2; ++h) {
        const int64_t k = 2 * p + h;
        if (k >= K) {
          for (int l = 0; l < 16; ++l) out[2 * l + h] = 0;
          continue;
        }
        const uint16_t* row = b + k * rs + j0 * cs;
        int l = 0;
        for (; l < w; ++l) out[2 * l + h] = row[l * cs];
        for (; l < 16; ++l) out[2 * l + h] = 0;
      }
    }
  }
}

void pack_a(const uint16_t* a, int64_t rs, int64_t cs, int64_t M, int64_t K, uint16_t* out) {
  const int64_t K2 = (K + 1) / 2 * 2;
  for (int64_t m = 0; m < M; ++m, out += K2) {
    for (int64_t k = 0; k < K; ++k) out[k] = a[m * rs + k * cs];
    if (K2 > K) out[K] = 0;
  }
}

#if defined(__x86_64__)
namespace {

using Tile = void (*)(const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t, float*, int64_t, int);

// MR rows x NR vectors of 16 columns: MR x NR accumulators (at most 24; with the NR vectors of B
// and A's broadcast pair, within the 32 registers). `last`: columns stored of the last vector.
template <int MR, int NR>
__attribute__((target("avx512f,avx512bf16"))) void tile(const uint16_t* a, int64_t lda, int64_t P, const uint16_t* bp,
                                                        int64_t bstride, float* c, int64_t ldc, int last) {
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < P; ++p) {
    __m512bh bv[NR];
    for (int j = 0; j < NR; ++j) bv[j] = (__m512bh)_mm512_loadu_si512(bp + j * bstride + p * 32);
    for (int i = 0; i < MR; ++i) {
      int32_t pair;
      std::memcpy(&pair, a + i * lda + 2 * p, 4);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, bv[j]);
    }
  }
  const __mmask16 tail = __mmask16((1u << last) - 1);
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      float* dst = c + i * ldc + 16 * j;
      if (j + 1 < NR || last == 16) _mm512_storeu_ps(dst, acc[i][j]);
      else _mm512_mask_storeu_ps(dst, tail, acc[i][j]);
    }
}

constexpr int kMR = 6, kNR = 4;

template <int MR, int... NR>
constexpr std::array<Tile, kNR> row_of(std::integer_sequence<int, NR...>) {
  return {tile<MR, NR + 1>...};
}
template <int... MR>
constexpr std::array<std::array<Tile, kNR>, kMR> table(std::integer_sequence<int, MR...>) {
  return {row_of<MR + 1>(std::make_integer_sequence<int, kNR>())...};
}
constexpr auto kTiles = table(std::make_integer_sequence<int, kMR>());

}  // namespace

void product(const uint16_t* a, int64_t lda, int64_t K, const uint16_t* bp, int64_t M, int64_t N, float* c, int64_t ldc) {
  const int64_t P = K / 2, bstride = P * 32;
  for (int64_t n0 = 0; n0 < N; n0 += 16 * kNR) {
    const int64_t w = std::min<int64_t>(16 * kNR, N - n0), nr = (w + 15) / 16;
    const int last = int(w - 16 * (nr - 1));
    const uint16_t* b = bp + (n0 / 16) * bstride;
    for (int64_t m0 = 0; m0 < M; m0 += kMR) {
      const int64_t mr = std::min<int64_t>(kMR, M - m0);
      kTiles[size_t(mr - 1)][size_t(nr - 1)](a + m0 * lda, lda, P, b, bstride, c + m0 * ldc + n0, ldc, last);
    }
  }
}
#else
void product(const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t, int64_t, float*, int64_t) {}
#endif

}  // namespace tessera::backends::bf16_gemm
