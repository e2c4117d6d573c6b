#include "backends/cpu/window_gemm.h"

// GCC 12 warns that the undefined vector behind its masked-load intrinsics may be used
// uninitialized; it is not (every masked load here zeroes).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace tessera::backends::window_gemm {

bool available() {
#if defined(__x86_64__)
  static const bool ok = [] {
    const char* e = std::getenv("TESSERA_CPU_GEMM");
    if (e && std::strcmp(e, "blas") == 0) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return ok;
#else
  return false;
#endif
}

#if defined(__x86_64__)
namespace {

constexpr int kCols = 64;  // columns of one pass: at most 4 vectors

// One tile of MR rows x NR vectors of 16 columns, from zero, into t[MR][kCols]: MR x NR
// accumulators (at most 24; with the NR row vectors of y and the broadcast, within the 32
// registers). Each row's x pointer is a general register: more than 8 rows spill them, and the
// reloads cost more than the extra accumulators gain (M = 16: 12 x 1 ran at ~114 GFLOP/s on 2
// threads, 8 x 1 at ~180).
template <int MR, int NR>
__attribute__((target("avx512f"))) void tile(const float* x, const int64_t* xi, const int64_t* xk, int64_t K,
                                             const float* y, int64_t ldy, float* t) {
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  const float* xp[MR];
  for (int i = 0; i < MR; ++i) xp[i] = x + xi[i];
  for (int64_t k = 0; k < K; ++k) {
    const int64_t o = xk[k];
    const float* yr = y + k * ldy;
    __m512 yv[NR];
    for (int j = 0; j < NR; ++j) yv[j] = _mm512_loadu_ps(yr + 16 * j);
    for (int i = 0; i < MR; ++i) {
      const __m512 b = _mm512_set1_ps(xp[i][o]);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(b, yv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) _mm512_store_ps(t + i * kCols + 16 * j, acc[i][j]);
}

// Rows [0, rows) of columns [0, w) (w <= 16 * NR) in tiles of MR rows; a last partial tile
// repeats its last row (computed, not stored).
template <int MR, int NR>
__attribute__((target("avx512f"))) void pass(const float* x, const int64_t* xi, int64_t rows, const int64_t* xk, int64_t K,
                                             const float* y, int64_t ldy, int64_t w, float* c, int64_t ldc, bool transposed,
                                             bool accumulate) {
  alignas(64) float t[MR * kCols];
  int64_t idx[MR];
  for (int64_t i0 = 0; i0 < rows; i0 += MR) {
    const int64_t mr = std::min<int64_t>(MR, rows - i0);
    for (int i = 0; i < MR; ++i) idx[i] = xi[i0 + std::min<int64_t>(i, mr - 1)];
    tile<MR, NR>(x, idx, xk, K, y, ldy, t);
    if (transposed) {
      for (int64_t j = 0; j < w; ++j) {
        float* cj = c + j * ldc + i0;
        if (accumulate)
          for (int64_t i = 0; i < mr; ++i) cj[i] += t[i * kCols + j];
        else
          for (int64_t i = 0; i < mr; ++i) cj[i] = t[i * kCols + j];
      }
      continue;
    }
    for (int64_t i = 0; i < mr; ++i) {
      float* ci = c + (i0 + i) * ldc;
      for (int j = 0; j < NR; ++j) {
        const int64_t left = w - 16 * j;
        if (left <= 0) break;
        const __mmask16 m = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
        __m512 v = _mm512_load_ps(t + i * kCols + 16 * j);
        if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, ci + 16 * j));
        _mm512_mask_storeu_ps(ci + 16 * j, m, v);
      }
    }
  }
}

// Rows r[0..15] transposed in place (r[j] becomes column j).
__attribute__((target("avx512f"))) inline void transpose16(__m512* r) {
  __m512 t[16], u[16];
  for (int j = 0; j < 8; ++j) {
    t[2 * j] = _mm512_unpacklo_ps(r[2 * j], r[2 * j + 1]);
    t[2 * j + 1] = _mm512_unpackhi_ps(r[2 * j], r[2 * j + 1]);
  }
  // u[4j + c], 128-bit lane L: column 4L + c of rows 4j..4j+3.
  for (int j = 0; j < 4; ++j) {
    const __m512d a = _mm512_castps_pd(t[4 * j]), b = _mm512_castps_pd(t[4 * j + 1]);
    const __m512d e = _mm512_castps_pd(t[4 * j + 2]), f = _mm512_castps_pd(t[4 * j + 3]);
    u[4 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, e));
    u[4 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, e));
    u[4 * j + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, f));
    u[4 * j + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, f));
  }
  for (int c = 0; c < 4; ++c) {
    const __m512 xl = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88), xh = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
    const __m512 yl = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88), yh = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
    r[c] = _mm512_shuffle_f32x4(xl, yl, 0x88);
    r[4 + c] = _mm512_shuffle_f32x4(xh, yh, 0x88);
    r[8 + c] = _mm512_shuffle_f32x4(xl, yl, 0xDD);
    r[12 + c] = _mm512_shuffle_f32x4(xh, yh, 0xDD);
  }
}

// Rows [0, MR) of a piece of up to 16 positions: one accumulator per row, each x vector (the
// piece at tap k: lanes m0 from x, lanes m1 from x + off1) multiplied by the rows' A elements,
// broadcast from row k of A^T.
template <int MR>
__attribute__((target("avx512f"))) void lanes_tile(const float* x, int64_t off1, const int64_t* xk, int64_t K, const float* at,
                                                   int64_t ldat, __mmask16 m0, __mmask16 m1, float* c, int64_t ldc) {
  __m512 acc[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  const float* x1 = x + off1;
  for (int64_t k = 0; k < K; ++k, at += ldat) {
    __m512 v = _mm512_maskz_loadu_ps(m0, x + xk[k]);
    if (m1) v = _mm512_mask_loadu_ps(v, m1, x1 + xk[k]);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(at[i]), v, acc[i]);
  }
  const __mmask16 m = m0 | m1;
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) _mm512_mask_storeu_ps(c + i * ldc, m, acc[i]);
}

}  // namespace

void lanes_product(const float* x, int64_t split, int64_t off1, const int64_t* xk, int64_t K, const float* at, int64_t ldat,
                   int64_t rows, int64_t len, float* c, int64_t ldc) {
  const __mmask16 all = len >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << len) - 1);
  const __mmask16 m0 = split >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << split) - 1), m1 = all & __mmask16(~m0);
  int64_t i = 0;
  for (; i + 16 <= rows; i += 16) lanes_tile<16>(x, off1, xk, K, at + i, ldat, m0, m1, c + i * ldc, ldc);
  const float* ai = at + i;
  float* ci = c + i * ldc;
  switch (rows - i) {  // the last rows, at most 15, in one tile
    case 0: break;
    case 1: lanes_tile<1>(x, off1, xk, K, ai, ldat, m0, m1, ci, ldc); break;
    case 2: lanes_tile<2>(x, off1, xk, K, ai, ldat, m0, m1, ci, ldc); break;
    case 3: lanes_tile<3>(x, off1, xk, K, ai, ldat, m0, m1, ci, ldc); break;
    case 4: lanes_tile<4>(x, off1, xk, K, ai, ldat, m0, m1, ci, ldc); break;
    case 5: lanes_tile<5>(x, off1, xk, K, ai, ldat, m0, m1, ci, ldc); break;
    case 6: lanes_tile<6>(x, off1, xk, K, ai, ldat, m0, m1, ci, ldc); break;
    case 7: lanes_tile<7>(x, off1, xk, K, ai, ldat, m0, m1, ci, ldc); break;
    case 8: lanes_tile<8>(x, off1, xk, K, ai, ldat, m0, m1, ci, ldc); break;
    case 9: lanes_tile<9>(x, off1, xk, K, ai, ldat, m0, m1, ci, ldc); break;
    case 10: lanes_tile<10>(x, off1, xk, K, ai, ldat, m0, m1, ci, ldc); break;
    case 11: lanes_tile<11>(x, off1, xk, K, ai, ldat, m0, m1, ci, ldc); break;
    case 12: lanes_tile<12>(x, off1, xk, K, ai, ldat, m0, m1, ci, ldc); break;
    case 13: lanes_tile<13>(x, off1, xk, K, ai, ldat, m0, m1, ci, ldc); break;
    case 14: lanes_tile<14>(x, off1, xk, K, ai, ldat, m0, m1, ci, ldc); break;
    default: lanes_tile<15>(x, off1, xk, K, ai, ldat, m0, m1, ci, ldc); break;
  }
}

__attribute__((target("avx512f"))) void pack_transposed(const float* a, int64_t rs, int64_t m, int64_t k, float* at,
                                                        int64_t ldt) {
  __m512 r[16];
  for (int64_t i0 = 0; i0 < m; i0 += 16) {
    const int64_t ib = std::min<int64_t>(16, m - i0);
    for (int64_t q0 = 0; q0 < k; q0 += 16) {
      const int64_t qb = std::min<int64_t>(16, k - q0);
      const __mmask16 mask = qb == 16 ? __mmask16(0xFFFF) : __mmask16((1u << qb) - 1);
      for (int i = 0; i < 16; ++i)
        r[i] = i < ib ? _mm512_maskz_loadu_ps(mask, a + (i0 + i) * rs + q0) : _mm512_setzero_ps();
      transpose16(r);
      for (int q = 0; q < qb; ++q) _mm512_storeu_ps(at + (q0 + q) * ldt + i0, r[q]);
    }
  }
}

void product(const float* x, const int64_t* xi, int64_t rows, const int64_t* xk, int64_t K, const float* y, int64_t ldy,
             int64_t cols, float* c, int64_t ldc, bool transposed, bool accumulate) {
  for (int64_t j0 = 0; j0 < cols; j0 += kCols) {
    const int64_t w = std::min<int64_t>(kCols, cols - j0), nr = (w + 15) / 16;
    const float* yj = y + j0;
    float* cj = c + (transposed ? j0 * ldc : j0);
    switch (nr) {  // at most 8 rows (their pointers in registers), at most 24 accumulators
      case 1: pass<8, 1>(x, xi, rows, xk, K, yj, ldy, w, cj, ldc, transposed, accumulate); break;
      case 2: pass<8, 2>(x, xi, rows, xk, K, yj, ldy, w, cj, ldc, transposed, accumulate); break;
      case 3: pass<8, 3>(x, xi, rows, xk, K, yj, ldy, w, cj, ldc, transposed, accumulate); break;
      default: pass<6, 4>(x, xi, rows, xk, K, yj, ldy, w, cj, ldc, transposed, accumulate); break;
    }
  }
}
#else
void product(const float*, const int64_t*, int64_t, const int64_t*, int64_t, const float*, int64_t, int64_t, float*, int64_t,
             bool, bool) {}
void pack_transposed(const float*, int64_t, int64_t, int64_t, float*, int64_t) {}
void lanes_product(const float*, int64_t, int64_t, const int64_t*, int64_t, const float*, int64_t, int64_t, int64_t, float*,
                   int64_t) {}
#endif

}  // namespace tessera::backends::window_gemm
