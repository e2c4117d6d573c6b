#include "backends/cpu/bf16_gemm.h"

// GCC 12 warns that the undefined vector behind its widening intrinsics may be used
// uninitialized; it is not (every masked load here zeroes).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <utility>
#include <vector>
#include <cstdlib>
#include <cstring>

#include "core/half.h"

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

#if defined(__x86_64__)
namespace {
// B's rows contiguous (element (k, n) at b[k * rs + n]): per pair of depths, the two rows' 16
// columns widened to 32-bit words and the second shifted into the high halves (zeros past N by
// the masked loads, past K by a zero row).
__attribute__((target("avx512f,avx512bw,avx512vl"))) void pack_b_rows(const uint16_t* b, int64_t rs, int64_t K, int64_t N,
                                                                        uint16_t* out) {
  const int64_t P = (K + 1) / 2;
  for (int64_t j0 = 0; j0 < N; j0 += 16) {
    const int64_t w = std::min<int64_t>(16, N - j0);
    const __mmask16 m = __mmask16((1u << w) - 1);
    for (int64_t p = 0; p < P; ++p, out += 32) {
      const uint16_t* r0 = b + 2 * p * rs + j0;
      const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r0));
      const __m512i hi = 2 * p + 1 < K ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r0 + rs)) : _mm512_setzero_si512();
      _mm512_storeu_si512(out, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
}
}  // namespace
#endif

namespace {
// B stored by columns: column j's K bfloat16 values contiguous at column(j) (a pointer valid
// until the next call), packed 16 columns a panel, each depth pair one 32-bit word (the high
// half 0 past an odd K), columns past N zero.
template <class Column>
void pack_b_columns(int64_t K, int64_t N, uint16_t* out, Column column) {
  const int64_t P = (K + 1) / 2;
  for (int64_t j0 = 0; j0 < N; j0 += 16, out += 32 * P) {
    const int64_t w = std::min<int64_t>(16, N - j0);
    uint32_t* o = reinterpret_cast<uint32_t*>(out);
    for (int64_t l = 0; l < 16; ++l) {
      if (l >= w) {
        for (int64_t p = 0; p < P; ++p) o[p * 16 + l] = 0;
        continue;
      }
      const uint16_t* col = column(j0 + l);
      int64_t p = 0;
      for (; 2 * p + 1 < K; ++p) {
        uint32_t v;
        std::memcpy(&v, col + 2 * p, 4);
        o[p * 16 + l] = v;
      }
      if (p < P) o[p * 16 + l] = col[2 * p];
    }
  }
}
}  // namespace

void pack_b(const uint16_t* b, int64_t rs, int64_t cs, int64_t K, int64_t N, uint16_t* out) {
  const int64_t P = (K + 1) / 2;
#if defined(__x86_64__)
  if (cs == 1) return pack_b_rows(b, rs, K, N, out);
#endif
  if (rs == 1) {
    // B's columns contiguous (B^T's rows: dY W^T's W^T): a column's pair of depths is one
    // 32-bit word of the source, copied column by column.
    return pack_b_columns(K, N, out, [&](int64_t j) { return b + j * cs; });
  }
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

#if defined(__x86_64__)
namespace {
// 16 float32 values rounded to bfloat16 (half::float_to_bf16's bits: to nearest even, a NaN
// quieted), each in the low half of its 32-bit lane. Integer arithmetic, not vcvtneps2bf16,
// which flushes denormal inputs to zero.
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512i round16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
  return _mm512_srli_epi32(r, 16);
}

// n <= 16 contiguous float32 values rounded into n bfloat16 (zeros past n in the lanes).
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512i load_round(const float* x, int64_t n) {
  const __mmask16 m = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
  return _mm512_maskz_mov_epi32(m, round16(_mm512_maskz_loadu_ps(m, x)));
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void round_run(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t w = std::min<int64_t>(16, n - i);
    _mm256_mask_storeu_epi16(out + i, __mmask16(w >= 16 ? 0xffff : (1u << w) - 1), _mm512_cvtepi32_epi16(load_round(x + i, w)));
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void pack_b_f32_rows(const float* b, int64_t rs, int64_t K, int64_t N,
                                                                            uint16_t* out) {
  const int64_t P = (K + 1) / 2;
  for (int64_t j0 = 0; j0 < N; j0 += 16) {
    const int64_t w = std::min<int64_t>(16, N - j0);
    for (int64_t p = 0; p < P; ++p, out += 32) {
      const float* r0 = b + 2 * p * rs + j0;
      const __m512i lo = load_round(r0, w);
      const __m512i hi = 2 * p + 1 < K ? load_round(r0 + rs, w) : _mm512_setzero_si512();
      _mm512_storeu_si512(out, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
}
}  // namespace
#else
namespace {
void round_run(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = half::float_to_bf16(x[i]);
}
}  // namespace
#endif

void pack_b_f32(const float* b, int64_t rs, int64_t cs, int64_t K, int64_t N, uint16_t* out) {
#if defined(__x86_64__)
  if (cs == 1) return pack_b_f32_rows(b, rs, K, N, out);
#endif
  if (rs == 1) {
    // Columns contiguous (the weight's W^T): each column rounded as a run, then packed as pack_b
    // packs a bfloat16 B stored by columns.
    thread_local std::vector<uint16_t> col;
    col.resize(size_t(K));
    return pack_b_columns(K, N, out, [&](int64_t j) {
      round_run(b + j * cs, K, col.data());
      return static_cast<const uint16_t*>(col.data());
    });
  }
  std::vector<uint16_t> tmp(size_t(K * N));
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) tmp[size_t(k * N + n)] = half::float_to_bf16(b[k * rs + n * cs]);
  pack_b(tmp.data(), N, 1, K, N, out);
}

void pack_a_f32(const float* a, int64_t rs, int64_t cs, int64_t M, int64_t K, uint16_t* out) {
  const int64_t K2 = (K + 1) / 2 * 2;
  for (int64_t m = 0; m < M; ++m, out += K2) {
    if (cs == 1) round_run(a + m * rs, K, out);
    else
      for (int64_t k = 0; k < K; ++k) out[k] = half::float_to_bf16(a[m * rs + k * cs]);
    if (K2 > K) out[K] = 0;
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
__attribute__((target("avx512f,avx512bw,avx512vl"))) void pack_a_pairs(const uint16_t* a, int64_t ld, int64_t M, int64_t K,
                                                                         uint32_t* out, int64_t ldo) {
  const int64_t P = (K + 1) / 2;
  for (int64_t p = 0; p < P; ++p, out += ldo) {
    const uint16_t* r0 = a + 2 * p * ld;
    const bool two = 2 * p + 1 < K;
    int64_t m = 0;
    for (; m + 16 <= M; m += 16) {
      const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + m)));
      const __m512i hi = two ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + ld + m)))
                             : _mm512_setzero_si512();
      _mm512_storeu_si512(out + m, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
    for (; m < M; ++m) out[m] = uint32_t(r0[m]) | (two ? uint32_t(r0[ld + m]) << 16 : 0u);
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void pack_a_pairs_f32(const float* a, int64_t ld, int64_t M, int64_t K,
                                                                             uint32_t* out, int64_t ldo) {
  const int64_t P = (K + 1) / 2;
  for (int64_t p = 0; p < P; ++p, out += ldo) {
    const float* r0 = a + 2 * p * ld;
    const bool two = 2 * p + 1 < K;
    for (int64_t m = 0; m < M; m += 16) {
      const int64_t w = std::min<int64_t>(16, M - m);
      const __m512i lo = load_round(r0 + m, w);
      const __m512i hi = two ? load_round(r0 + ld + m, w) : _mm512_setzero_si512();
      _mm512_mask_storeu_epi32(out + m, __mmask16(w >= 16 ? 0xffff : (1u << w) - 1), _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
}
#else
void pack_a_pairs(const uint16_t*, int64_t, int64_t, int64_t, uint32_t*, int64_t) {}
void pack_a_pairs_f32(const float*, int64_t, int64_t, int64_t, uint32_t*, int64_t) {}
#endif

#if defined(__x86_64__)
namespace {

using Tile = void (*)(const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t, float*, int64_t, int);

// MR rows x NR vectors of 16 columns: MR x NR accumulators (at most 24; with the NR vectors of B
// and A's broadcast pair, within the 32 registers). `last`: columns stored of the last vector.
// APAIRS: A as pack_a_pairs wrote it (row i's pair p at the 32-bit word p * lda + i); else rows
// lda elements apart, pair p at 2p.
template <int MR, int NR, bool APAIRS>
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
      if constexpr (APAIRS) std::memcpy(&pair, a + 2 * (p * lda + i), 4);
      else std::memcpy(&pair, a + i * lda + 2 * p, 4);
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

template <bool APAIRS, int MR, int... NR>
constexpr std::array<Tile, kNR> row_of(std::integer_sequence<int, NR...>) {
  return {tile<MR, NR + 1, APAIRS>...};
}
template <bool APAIRS, int... MR>
constexpr std::array<std::array<Tile, kNR>, kMR> table(std::integer_sequence<int, MR...>) {
  return {row_of<APAIRS, MR + 1>(std::make_integer_sequence<int, kNR>())...};
}
constexpr std::array<std::array<std::array<Tile, kNR>, kMR>, 2> kTiles{table<false>(std::make_integer_sequence<int, kMR>()),
                                                                      table<true>(std::make_integer_sequence<int, kMR>())};

// Column panels of 64 outer, row tiles inner (a panel's pairs stay in cache across the rows).
// APAIRS: a_at(m0) is a + 2 * m0 (words), else a + m0 * lda (elements).
template <bool APAIRS>
void run(const uint16_t* a, int64_t lda, int64_t P, const uint16_t* bp, int64_t M, int64_t N, float* c, int64_t ldc) {
  const int64_t bstride = P * 32;
  for (int64_t n0 = 0; n0 < N; n0 += 16 * kNR) {
    const int64_t w = std::min<int64_t>(16 * kNR, N - n0), nr = (w + 15) / 16;
    const int last = int(w - 16 * (nr - 1));
    const uint16_t* b = bp + (n0 / 16) * bstride;
    for (int64_t m0 = 0; m0 < M; m0 += kMR) {
      const int64_t mr = std::min<int64_t>(kMR, M - m0);
      kTiles[APAIRS][size_t(mr - 1)][size_t(nr - 1)](APAIRS ? a + 2 * m0 : a + m0 * lda, lda, P, b, bstride, c + m0 * ldc + n0, ldc,
                                                     last);
    }
  }
}

}  // namespace

void product(const uint16_t* a, int64_t lda, int64_t K, const uint16_t* bp, int64_t M, int64_t N, float* c, int64_t ldc) {
  run<false>(a, lda, K / 2, bp, M, N, c, ldc);
}
void product_pairs(const uint32_t* ap, int64_t lda, int64_t P, const uint16_t* bp, int64_t M, int64_t N, float* c, int64_t ldc) {
  run<true>(reinterpret_cast<const uint16_t*>(ap), lda, P, bp, M, N, c, ldc);
}
#else
void product(const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t, int64_t, float*, int64_t) {}
void product_pairs(const uint32_t*, int64_t, int64_t, const uint16_t*, int64_t, int64_t, float*, int64_t) {}
#endif

}  // namespace tessera::backends::bf16_gemm
