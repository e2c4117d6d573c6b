// The fused attention Step (StepKind::Attention, kernel_ir/step.h): out = softmax(scale * Q K^T,
// masked) V for every batch element, without the T_q x T_k scores in memory.
//
// Tasks are (batch element, block of kRows query rows), a fixed grid run by a static OpenMP loop:
// each output row is computed by one task in one order whatever the thread count, so results are
// bit-identical for any number of threads. A task walks the keys in tiles of kKeys: it copies the
// tile's K transposed ([D, kKeys]) and its V rows into per-thread buffers, computes each score of
// the tile once (a broadcast of q[i][d] times a row of K^T: vectorized over the keys), masks it,
// and updates the row's running maximum m, running sum l and accumulator (rescaled by exp(m_old -
// m_new) when the maximum grows: the online softmax); the row's output is acc / l at the end. A
// row whose keys are all masked gets 0 / 0 = NaN, as the unfused softmax gives. Everything a task
// touches besides Q, K, V and its output rows is a few KiB (L1).
#include <omp.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cpu/common.h"
#include "backends/cpu/kernel.h"
#include "backends/cpu/vmath.h"
#include "core/fail.h"
#include "core/half.h"

namespace tessera::backends::cpu {
namespace {

constexpr int64_t kRows = 16;  // query rows per task
constexpr int64_t kKeys = 64;  // keys per tile (four 16-float vectors)

// One operand [batch..., T, C] as a plain strided view: per flat batch element its offset, and
// the strides of its last two dimensions.
struct Operand {
  std::vector<int64_t> off;
  int64_t rs = 0, cs = 0;
};

Operand operand_of(const kir::IndexMap& m, int64_t batch) {
  const kir::View& v = m.views[0];
  const size_t r = v.shape.size();
  Operand o;
  o.rs = v.strides[r - 2];
  o.cs = v.strides[r - 1];
  o.off.resize(size_t(batch));
  std::vector<int64_t> idx(r - 2, 0);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t off = v.offset;
    for (size_t d = 0; d + 2 < r; ++d) off += idx[d] * v.strides[d];
    o.off[size_t(b)] = off;
    for (size_t d = r - 2; d-- > 0;) {  // next batch index, row-major
      if (++idx[d] < v.shape[d]) break;
      idx[d] = 0;
    }
  }
  return o;
}

template <class T>
void exp_inplace(T* x, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    vmath::vexp(x, x, n);
  } else {
    for (int64_t j = 0; j < n; ++j) x[j] = std::exp(x[j]);
  }
}

// float32: register-blocked forms with GCC vector extensions (v8: 8 floats, one AVX register;
// the build leaves AVX-512 off). Loads and stores through memcpy (any alignment), as macros.
typedef float v8 __attribute__((vector_size(32)));
#define VLOAD(v, p) std::memcpy(&(v), (p), sizeof(v8))
#define VSTORE(p, v) std::memcpy((p), &(v), sizeof(v8))

// sr[0, w) = exp(sr - m), its values added into 8 lane sums (w a multiple of 8; a scalar sum
// would be a chain of dependent adds), and the lanes' total.
void exp_shifted(float* sr, int64_t w, float m, v8& part) {
  for (int64_t j = 0; j < w; ++j) sr[j] -= m;
  vmath::vexp(sr, sr, w);
  for (int64_t j = 0; j < w; j += 8) {
    v8 y;
    VLOAD(y, sr + j);
    part += y;
  }
}
float lanes_total(const v8& part) {
  float sum = 0;
  for (int i = 0; i < 8; ++i) sum += part[i];
  return sum;
}

// s[r][0, 16 nv) = scale * q[r] . K^T columns, for 4 rows of q (row stride D): per 16 keys,
// 4 rows x 2 registers of accumulators held over the head dimension.
void scores4(const float* q, int64_t D, const float* kt, int64_t nv, float scale, float* s) {
  for (int64_t v = 0; v < nv; ++v) {
    v8 a0[4] = {}, a1[4] = {};
    for (int64_t d = 0; d < D; ++d) {
      v8 k0, k1;
      VLOAD(k0, kt + d * kKeys + 16 * v);
      VLOAD(k1, kt + d * kKeys + 16 * v + 8);
      for (int r = 0; r < 4; ++r) {
        const float x = q[r * D + d];
        a0[r] += x * k0;
        a1[r] += x * k1;
      }
    }
    for (int r = 0; r < 4; ++r) {
      a0[r] *= scale;
      a1[r] *= scale;
      VSTORE(s + r * kKeys + 16 * v, a0[r]);
      VSTORE(s + r * kKeys + 16 * v + 8, a1[r]);
    }
  }
}

#if defined(__x86_64__)
// AVX-512 forms (the build leaves AVX-512 off; chosen at run time where the CPU has it): the same
// blocks with 16-float registers, 4 rows x NV key vectors of scores (up to 16 accumulators) and
// 4 rows x NC column vectors of the weighted sum.
typedef float vz __attribute__((vector_size(64)));

// acc[r][v] = q[r] . K^T's keys 16 v .. 16 v + 15 for 4 rows of q (D apart), over the head dimension.
template <int NV>
__attribute__((target("avx512f"), always_inline)) inline void dots4_z(const float* q, int64_t D, const float* kt, vz (&acc)[4][NV]) {
  for (int64_t d = 0; d < D; ++d) {
    vz k[NV];
    for (int v = 0; v < NV; ++v) std::memcpy(&k[v], kt + d * kKeys + 16 * v, sizeof(vz));
    for (int r = 0; r < 4; ++r) {
      const float x = q[r * D + d];
      for (int v = 0; v < NV; ++v) acc[r][v] += x * k[v];
    }
  }
}

template <int NV>
__attribute__((target("avx512f"))) void scores4_z(const float* q, int64_t D, const float* kt, float scale, float* s) {
  vz acc[4][NV] = {};
  dots4_z<NV>(q, D, kt, acc);
  for (int r = 0; r < 4; ++r)
    for (int v = 0; v < NV; ++v) {
      acc[r][v] *= scale;
      std::memcpy(s + r * kKeys + 16 * v, &acc[r][v], sizeof(vz));
    }
}

// acc[r][c0, c0 + 16 NC) += sum_j<n p[r][j] v[j][...] for 4 rows (gr of them stored).
template <int NC>
__attribute__((target("avx512f"))) void pv4_z(const float* p, const float* vt, int64_t Dv, int64_t c0, int64_t n, float* acc, int gr) {
  vz x[4][NC] = {};
  for (int r = 0; r < gr; ++r)
    for (int c = 0; c < NC; ++c) std::memcpy(&x[r][c], acc + r * Dv + c0 + 16 * c, sizeof(vz));
  for (int64_t j = 0; j < n; ++j) {
    vz u[NC];
    for (int c = 0; c < NC; ++c) std::memcpy(&u[c], vt + j * Dv + c0 + 16 * c, sizeof(vz));
    for (int r = 0; r < 4; ++r) {
      const float w = p[r * kKeys + j];
      for (int c = 0; c < NC; ++c) x[r][c] += w * u[c];
    }
  }
  for (int r = 0; r < gr; ++r)
    for (int c = 0; c < NC; ++c) std::memcpy(acc + r * Dv + c0 + 16 * c, &x[r][c], sizeof(vz));
}

// 16-lane helpers of the forward's group step (AVX-512): the largest and the sum of the lanes
// (a fixed tree), and e^x lane by lane: vmath's exp1 (the same reduction, polynomial and two-step
// scaling, so the same accuracy) written on whole registers, always with fused multiply-adds:
// its bits are exp1's only in builds that have FMA (vmath rounds a*b+c twice without it).
typedef uint32_t vzu __attribute__((vector_size(64))); typedef int32_t vzi __attribute__((vector_size(64)));
template <bool Max>
__attribute__((target("avx512f"), always_inline)) inline vz step_z(vz x, vz y) { return Max ? (x > y ? x : y) : x + y; }
template <bool Max>  // the lanes' largest value (Max) or sum
__attribute__((target("avx512f"), always_inline)) inline float reduce_z(vz x) {
  x = step_z<Max>(x, __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
  x = step_z<Max>(x, __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
  x = step_z<Max>(x, __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
  return step_z<Max>(x, __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14))[0];
}
__attribute__((target("avx512f"), always_inline)) inline vz splat_z(float x) { return vz{} + x; }
__attribute__((target("avx512f"), always_inline)) inline vz fma_z(vz a, vz b, vz c) { return _mm512_fmadd_ps(a, b, c); }
__attribute__((target("avx512f"), always_inline)) inline vz exp_z(vz x) {
  using namespace vmath::detail;
  x = x < -104.0f ? splat_z(-104.0f) : x > 89.0f ? splat_z(89.0f) : x;  // NaN passes through
  const vz t = fma_z(x, splat_z(kLog2e), splat_z(kShift));
  const vz kf = t - kShift;
  const vzu k = (vzu)t - bits(kShift);
  const vz r = fma_z(kf, splat_z(-kLn2Lo), fma_z(kf, splat_z(-kLn2Hi), x));
  vz p = splat_z(kExpP[0]);
  for (int i = 1; i < 5; ++i) p = fma_z(p, r, splat_z(kExpP[i]));
  const vz y = fma_z(r * r, p, r);
  const vzu k1 = (vzu)((vzi)k >> 1), k2 = k - k1;
  const vz s1 = (vz)((k1 + 127u) << 23), s2 = (vz)((k2 + 127u) << 23);
  return fma_z(y, s1, s1) * s2;
}

// The forward's step for 4 query rows (gr of them real) and one key tile, AVX-512: the scores
// scale * q . K^T for the first 16 NV keys in registers, masked past each row's limit lim[r],
// then the online-softmax update of the rows' running maximum m, sum l and accumulators (rows
// of acc, Dv apart: rescaled when the maximum grows), and the probabilities exp(s - m) into
// p[r][0, 16 NV) (kKeys per row; 0 where masked) for the product with V.
template <int NV>
__attribute__((target("avx512f"))) void softmax4_z(const float* q, int64_t D, const float* kt, float scale, const int64_t* lim, int gr, float* m,
                                                   float* l, float* acc, int64_t Dv, float* p) {
  vz x[4][NV] = {};
  dots4_z<NV>(q, D, kt, x);
  const float ninf = -std::numeric_limits<float>::infinity();
  const vz iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  for (int r = 0; r < 4; ++r) {
    float* pr = p + r * kKeys;
    const float lr = r < gr ? float(lim[r]) : 0.0f;
    vz mx = splat_z(ninf);
    for (int v = 0; v < NV; ++v) {
      const vz y = x[r][v] * scale;
      x[r][v] = iota + float(16 * v) < lr ? y : splat_z(ninf);
      mx = x[r][v] > mx ? x[r][v] : mx;
    }
    const float mold = r < gr ? m[r] : ninf, mnew = std::max(mold, reduce_z<true>(mx));
    vz sum = {};
    for (int v = 0; v < NV; ++v) {
      vz e = {};
      if (mnew != ninf && float(16 * v) < lr) {
        e = exp_z(x[r][v] - mnew);
        e = iota + float(16 * v) < lr ? e : vz{};
      }
      sum += e;
      std::memcpy(pr + 16 * v, &e, sizeof(vz));
    }
    if (r >= gr || mnew == ninf) continue;  // past the block, or nothing seen yet in this row
    const float corr = mold == ninf ? 0.0f : std::exp(mold - mnew);
    l[r] = l[r] * corr + reduce_z<false>(sum);
    m[r] = mnew;
    if (mold != ninf && corr != 1.0f)  // (before the first key the accumulators are all zero)
      for (float* ar = acc + r * Dv; ar != acc + (r + 1) * Dv; ++ar) *ar *= corr;
  }
}

// The backward's probabilities of one row, AVX-512: p[0, width) = exp(p - lse) for the first lim
// keys, 0 past them (width a multiple of 16).
__attribute__((target("avx512f"))) void probs_z(float* p, int64_t width, int64_t lim, float lse) {
  const vz iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  for (int64_t j = 0; j < width; j += 16) {
    vz x, e = {};
    std::memcpy(&x, p + j, sizeof(vz));
    if (j < lim) e = iota + float(j) < float(lim) ? exp_z(x - lse) : vz{};
    std::memcpy(p + j, &e, sizeof(vz));
  }
}

// The backward's two score blocks of 4 rows at once, AVX-512: s = scale * q . K^T and dp = g . V^T
// over the first 16 NV keys (kt, vtt: [D, kKeys]; q, g: D apart, d == dv); two sets of independent
// accumulators keep the FMA units busy where one set of 4 x NV would wait on its own latency.
template <int NV>
__attribute__((target("avx512f"))) void scores_pair_z(const float* q, int64_t D, const float* kt, float scale, float* s, const float* g,
                                                      const float* vtt, float* dp) {
  vz x[4][NV] = {}, y[4][NV] = {};
  for (int64_t d = 0; d < D; ++d) {
    vz k[NV], u[NV];
    for (int v = 0; v < NV; ++v) std::memcpy(&k[v], kt + d * kKeys + 16 * v, sizeof(vz));
    for (int v = 0; v < NV; ++v) std::memcpy(&u[v], vtt + d * kKeys + 16 * v, sizeof(vz));
    for (int r = 0; r < 4; ++r) {
      const float w = q[r * D + d], e = g[r * D + d];
      for (int v = 0; v < NV; ++v) x[r][v] += w * k[v];
      for (int v = 0; v < NV; ++v) y[r][v] += e * u[v];
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int v = 0; v < NV; ++v) {
      x[r][v] *= scale;
      std::memcpy(s + r * kKeys + 16 * v, &x[r][v], sizeof(vz));
      std::memcpy(dp + r * kKeys + 16 * v, &y[r][v], sizeof(vz));
    }
}

// Read when a Step compiles: TESSERA_CPU_ATTENTION=avx2 keeps the AVX forms (tests compare them).
bool has_avx512() {
  const char* e = std::getenv("TESSERA_CPU_ATTENTION");
  if (e && std::strcmp(e, "avx2") == 0) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") != 0;
}
#else
bool has_avx512() { return false; }
#endif

// c[r][c0, c0 + W NC) = sum_{k0 <= k < k1} a[r ars + k acs] b[k][c0, ...) for R rows (gr of them
// stored; b and c of row stride cols): R x NC vectors of W floats accumulated in registers over k.
// The small-T backward's products (dQ = dS K, dV = P^T dY, dK = dS^T Q: a's strides read P and dS
// as stored or transposed). Written once for both vector widths; the AVX-512 form is the target
// wrapper below.
template <class VT, int R, int NC>
inline __attribute__((always_inline)) void mm_block(const float* a, int64_t ars, int64_t acs, const float* b, int64_t cols, int64_t c0, int64_t k0,
                                                    int64_t k1, float* c, int gr, bool add) {
  constexpr int W = int(sizeof(VT) / sizeof(float));
  VT x[R][NC] = {};
  if (add)
    for (int r = 0; r < gr; ++r)
      for (int j = 0; j < NC; ++j) std::memcpy(&x[r][j], c + r * cols + c0 + W * j, sizeof(VT));
  for (int64_t k = k0; k < k1; ++k) {
    VT u[NC];
    for (int j = 0; j < NC; ++j) std::memcpy(&u[j], b + k * cols + c0 + W * j, sizeof(VT));
    const float* ak = a + k * acs;
    for (int r = 0; r < R; ++r) {
      const float w = ak[r * ars];
      for (int j = 0; j < NC; ++j) x[r][j] += w * u[j];
    }
  }
  for (int r = 0; r < gr; ++r)
    for (int j = 0; j < NC; ++j) std::memcpy(c + r * cols + c0 + W * j, &x[r][j], sizeof(VT));
}

#if defined(__x86_64__)
template <int NC>
__attribute__((target("avx512f"))) void mm8_z(const float* a, int64_t ars, int64_t acs, const float* b, int64_t cols, int64_t c0, int64_t k0, int64_t k1,
                                              float* c, int gr, bool add) {
  mm_block<vz, 8, NC>(a, ars, acs, b, cols, c0, k0, k1, c, gr, add);
}
#endif

// mm_block over all cols columns for 8 rows (gr stored; add: c += instead of c =): AVX-512 8 rows
// x 32 (16) columns, else two blocks of 4 rows x 16 columns; the last cols % 16 columns plainly.
void mm8(const float* a, int64_t ars, int64_t acs, const float* b, int64_t cols, int64_t k0, int64_t k1, float* c, int gr, bool z, bool add = false) {
  int64_t c0 = 0;
#if defined(__x86_64__)
  if (z) {
    for (; c0 + 32 <= cols; c0 += 32) mm8_z<2>(a, ars, acs, b, cols, c0, k0, k1, c, gr, add);
    for (; c0 + 16 <= cols; c0 += 16) mm8_z<1>(a, ars, acs, b, cols, c0, k0, k1, c, gr, add);
  }
#endif
  for (; c0 + 16 <= cols; c0 += 16) {
    mm_block<v8, 4, 2>(a, ars, acs, b, cols, c0, k0, k1, c, std::min(gr, 4), add);
    if (gr > 4) mm_block<v8, 4, 2>(a + 4 * ars, ars, acs, b, cols, c0, k0, k1, c + 4 * cols, gr - 4, add);
  }
  for (; c0 < cols; ++c0)
    for (int r = 0; r < gr; ++r) {
      float v = add ? c[r * cols + c0] : 0.0f;
      for (int64_t k = k0; k < k1; ++k) v += a[r * ars + k * acs] * b[k * cols + c0];
      c[r * cols + c0] = v;
    }
}

// The largest of x[0, n) (n a multiple of 8) after masking positions >= lim to -inf in place.
float mask_max(float* x, int64_t n, int64_t lim) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t j = lim; j < n; ++j) x[j] = ninf;
  v8 m = {ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf};
  for (int64_t j = 0; j < n; j += 8) {
    v8 y;
    VLOAD(y, x + j);
    m = y > m ? y : m;
  }
  float r = ninf;
  for (int i = 0; i < 8; ++i) r = m[i] > r ? m[i] : r;
  return r;
}

// acc[r][0, cols) += sum_j<n p[r][j] x[j][0, cols) for 4 rows of p (row stride kKeys; gr rows of
// acc stored, row stride cols): 4 rows x 32 (16) columns of accumulators in registers.
void pv4(const float* p, const float* x, int64_t cols, int64_t n, float* acc, int gr, bool z) {
  int64_t c0 = 0;
#if defined(__x86_64__)
  if (z) {
    for (; c0 + 32 <= cols; c0 += 32) pv4_z<2>(p, x, cols, c0, n, acc, gr);
    for (; c0 + 16 <= cols; c0 += 16) pv4_z<1>(p, x, cols, c0, n, acc, gr);
  }
#endif
  for (; c0 + 16 <= cols; c0 += 16) {
    v8 x0[4] = {}, x1[4] = {};
    for (int r = 0; r < gr; ++r) {
      VLOAD(x0[r], acc + r * cols + c0);
      VLOAD(x1[r], acc + r * cols + c0 + 8);
    }
    for (int64_t j = 0; j < n; ++j) {
      v8 u0, u1;
      VLOAD(u0, x + j * cols + c0);
      VLOAD(u1, x + j * cols + c0 + 8);
      for (int r = 0; r < 4; ++r) {
        const float w = p[r * kKeys + j];
        x0[r] += w * u0;
        x1[r] += w * u1;
      }
    }
    for (int r = 0; r < gr; ++r) {
      VSTORE(acc + r * cols + c0, x0[r]);
      VSTORE(acc + r * cols + c0 + 8, x1[r]);
    }
  }
  for (; c0 < cols; ++c0)
    for (int r = 0; r < gr; ++r) {
      float v = acc[r * cols + c0];
      for (int64_t j = 0; j < n; ++j) v += p[r * kKeys + j] * x[j * cols + c0];
      acc[r * cols + c0] = v;
    }
}

// scores4 in the form the CPU runs best.
void scores4_any(const float* q, int64_t D, const float* kt, int64_t nv, float scale, float* s, bool z) {
#if defined(__x86_64__)
  if (z) {
    switch (nv) {
      case 1: return scores4_z<1>(q, D, kt, scale, s);
      case 2: return scores4_z<2>(q, D, kt, scale, s);
      case 3: return scores4_z<3>(q, D, kt, scale, s);
      default: return scores4_z<4>(q, D, kt, scale, s);
    }
  }
#endif
  scores4(q, D, kt, nv, scale, s);
}

// One key tile of the forward: K^T [D, kKeys] (columns past nk zero) and V [nk, Dv], densely,
// from keys j0 .. j0 + nk of the batch element's strided K and V.
template <class T>
void pack_tile(const T* kp, const Operand& k, const T* vp, const Operand& v, int64_t j0, int64_t nk, int64_t D, int64_t Dv, T* kt, T* vt) {
  for (int64_t j = 0; j < nk; ++j) {
    const T* kr = kp + (j0 + j) * k.rs;
    for (int64_t d = 0; d < D; ++d) kt[size_t(d * kKeys + j)] = kr[d * k.cs];
    const T* vr = vp + (j0 + j) * v.rs;
    if (v.cs == 1)
      std::memcpy(vt + j * Dv, vr, size_t(Dv) * sizeof(T));
    else
      for (int64_t c = 0; c < Dv; ++c) vt[size_t(j * Dv + c)] = vr[c * v.cs];
  }
  for (int64_t j = nk; j < kKeys; ++j)
    for (int64_t d = 0; d < D; ++d) kt[size_t(d * kKeys + j)] = T(0);
}

// Whether an attention Step's work (batch x query rows x keys x (d + dv)) is worth the threads.
bool threaded(const kir::Step::Attention& a) {
  return double(a.batch) * double(a.tq) * double(a.tk) * double(a.d + a.dv) >= double(kParallelMin) * 16;
}

// bfloat16 autocast (Step::Attention::bf16). How an operand's slot holds its bfloat16 values:
// float32 values rounded as read (Step::rounded), bfloat16 itself, or (the forward's output and
// log-sum-exp, read by the backward) plain float32.
enum class Held { Float, Rounded, BFloat16 };

Held held(const Step& st, size_t i) {
  if (st.rounded >> i & 1) return Held::Rounded;
  return st.input_dtypes.at(i) == DType::BFloat16 ? Held::BFloat16 : Held::Float;
}

// x[0, n) rounded to bfloat16 in place (to nearest even: half::bf16_round_bits, the cast's bits),
// 8 lanes at a time.
typedef uint32_t u8v __attribute__((vector_size(32)));
inline void round_bf16(float* x, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    u8v u;
    std::memcpy(&u, x + j, sizeof(u));
    const u8v nan = (u & 0x7fffffffu) > 0x7f800000u;
    u = ((u | 0x400000u) & nan) | ((u + 0x7fffu + ((u >> 16) & 1u)) & ~nan);
    u &= 0xffff0000u;
    std::memcpy(x + j, &u, sizeof(u));
  }
  for (; j < n; ++j) x[j] = half::from_bits(half::bf16_round_bits(half::bits(x[j])));
}

// n values at src + off, cs apart, as float32 into dst (bfloat16 widened, float32 rounded when so held).
void read_row(const void* src, Held h, int64_t off, int64_t cs, int64_t n, float* dst) {
  if (h == Held::BFloat16) {
    const uint16_t* p = static_cast<const uint16_t*>(src) + off;
    for (int64_t j = 0; j < n; ++j) dst[j] = half::bf16_to_float(p[j * cs]);
    return;
  }
  const float* p = static_cast<const float*>(src) + off;
  if (cs == 1)
    std::memcpy(dst, p, size_t(n) * sizeof(float));
  else
    for (int64_t j = 0; j < n; ++j) dst[j] = p[j * cs];
  if (h == Held::Rounded) round_bf16(dst, n);
}

// Batch element b of an operand ([rows, cols] through x) dense into dst as float32.
void dense_any(const void* src, Held h, const Operand& x, int64_t b, int64_t rows, int64_t cols, float* dst) {
  for (int64_t r = 0; r < rows; ++r) read_row(src, h, x.off[size_t(b)] + r * x.rs, x.cs, cols, dst + r * cols);
}

struct AttentionKernel : CpuKernel {
  kir::Step::Attention a;
  Operand q, k, v;
  Operand out;  // where the output [.., Tq, Dv] is written (Step::out_maps; else dense)
  bool avx512 = has_avx512();

  explicit AttentionKernel(const Step& st) : a(*st.attention) {
    q = operand_of(st.maps.at(0), a.batch);
    k = operand_of(st.maps.at(1), a.batch);
    v = operand_of(st.maps.at(2), a.batch);
    if (!st.out_maps.empty()) {
      out = operand_of(st.out_maps[0], a.batch);
    } else {
      out.rs = a.dv, out.cs = 1;
      for (int64_t b = 0; b < a.batch; ++b) out.off.push_back(b * a.tq * a.dv);
    }
  }

  template <class T>
  void run_typed(const Step& st, const LaunchArgs& args) const {
    const T* Q = static_cast<const T*>(args.slots[st.inputs[0]]);
    const T* K = static_cast<const T*>(args.slots[st.inputs[1]]);
    const T* V = static_cast<const T*>(args.slots[st.inputs[2]]);
    T* O = static_cast<T*>(args.slots[st.output]);
    T* lse = st.more_outputs.empty() ? nullptr : static_cast<T*>(args.slots[st.more_outputs[0]]);
    const int64_t B = a.batch, Tq = a.tq, Tk = a.tk, D = a.d, Dv = a.dv;
    const int64_t blocks = (Tq + kRows - 1) / kRows, tasks = B * blocks;
    const T scale = T(a.scale), ninf = -std::numeric_limits<T>::infinity();
#pragma omp parallel if (threaded(a))
    {
      // Per thread: K^T and V of one tile, the task's rows of Q, running max/sum/accumulators.
      std::vector<T> kt(size_t(D * kKeys), T(0)), vt(size_t(kKeys * Dv)), qb(size_t(kRows * D)), acc(size_t(kRows * Dv));
      T m[kRows], l[kRows];
      alignas(64) T s[kKeys];
#pragma omp for schedule(static)
      for (int64_t t = 0; t < tasks; ++t) {
        const int64_t b = t / blocks, i0 = (t % blocks) * kRows, rows = std::min(kRows, Tq - i0);
        const T* qp = Q + q.off[size_t(b)];
        const T* kp = K + k.off[size_t(b)];
        const T* vp = V + v.off[size_t(b)];
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t d = 0; d < D; ++d) qb[size_t(r * D + d)] = qp[(i0 + r) * q.rs + d * q.cs];
        std::fill(acc.begin(), acc.end(), T(0));
        std::fill(m, m + kRows, ninf);
        std::fill(l, l + kRows, T(0));
        // Keys any row of the block may see: j - i <= offset.
        int64_t kend = Tk;
        if (a.causal) kend = std::clamp<int64_t>(i0 + rows - 1 + a.causal_offset + 1, 0, Tk);
        for (int64_t j0 = 0; j0 < kend; j0 += kKeys) {
          const int64_t nk = std::min(kKeys, kend - j0);
          pack_tile(kp, k, vp, v, j0, nk, D, Dv, kt.data(), vt.data());
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t j = 0; j < kKeys; ++j) s[j] = T(0);
            const T* qr = qb.data() + r * D;
            for (int64_t d = 0; d < D; ++d) {
              const T x = qr[d];
              const T* kd = kt.data() + d * kKeys;
              for (int64_t j = 0; j < kKeys; ++j) s[j] += x * kd[j];
            }
            // Keys past the tile, and past the causal limit of this row, are masked.
            int64_t lim = nk;
            if (a.causal) lim = std::clamp<int64_t>(i0 + r + a.causal_offset + 1 - j0, 0, nk);
            T mt = ninf;
            for (int64_t j = 0; j < kKeys; ++j) {
              s[j] = j < lim ? s[j] * scale : ninf;
              mt = std::max(mt, s[j]);
            }
            const T mnew = std::max(m[r], mt);
            if (mnew == ninf) continue;  // nothing seen yet in this row
            const T corr = m[r] == ninf ? T(0) : T(std::exp(m[r] - mnew));
            for (int64_t j = 0; j < kKeys; ++j) s[j] -= mnew;
            exp_inplace(s, kKeys);
            T sum = 0;
            for (int64_t j = 0; j < kKeys; ++j) sum += s[j];
            l[r] = l[r] * corr + sum;
            m[r] = mnew;
            T* ar = acc.data() + r * Dv;
            if (corr != T(1))
              for (int64_t c = 0; c < Dv; ++c) ar[c] *= corr;
            for (int64_t j = 0; j < lim; ++j) {
              const T p = s[j];
              const T* vr = vt.data() + j * Dv;
              for (int64_t c = 0; c < Dv; ++c) ar[c] += p * vr[c];
            }
          }
        }
        T* op = O + out.off[size_t(b)] + i0 * out.rs;
        for (int64_t r = 0; r < rows; ++r) {
          const T inv = l[r];
          for (int64_t c = 0; c < Dv; ++c) op[r * out.rs + c * out.cs] = acc[size_t(r * Dv + c)] / inv;
          if (lse) lse[b * Tq + i0 + r] = m[r] + std::log(l[r]);
        }
      }
    }
  }

  // float32: tasks of kBlock query rows (K and V tiles copied once per task and tile), rows in
  // groups of 4.
  void run_float(const Step& st, const LaunchArgs& args) const {
    constexpr int64_t kBlock = 64;
    const float* Q = static_cast<const float*>(args.slots[st.inputs[0]]);
    const float* K = static_cast<const float*>(args.slots[st.inputs[1]]);
    const float* V = static_cast<const float*>(args.slots[st.inputs[2]]);
    float* O = static_cast<float*>(args.slots[st.output]);
    float* lse = st.more_outputs.empty() ? nullptr : static_cast<float*>(args.slots[st.more_outputs[0]]);
    const int64_t B = a.batch, Tq = a.tq, Tk = a.tk, D = a.d, Dv = a.dv;
    const int64_t blocks = (Tq + kBlock - 1) / kBlock, tasks = B * blocks;
    const float scale = float(a.scale), ninf = -std::numeric_limits<float>::infinity();
    [[maybe_unused]] const bool z = avx512;
#pragma omp parallel if (threaded(a))
    {
      std::vector<float> kt(size_t(D * kKeys), 0.0f), vt(size_t(kKeys * Dv)), qb(size_t((kBlock + 3) * D), 0.0f),
          acc(size_t(kBlock * Dv));
      float m[kBlock], l[kBlock];
      alignas(64) float s[4 * kKeys];
#pragma omp for schedule(static)
      for (int64_t t = 0; t < tasks; ++t) {
        const int64_t b = t / blocks, i0 = (t % blocks) * kBlock, rows = std::min(kBlock, Tq - i0);
        const float* qp = Q + q.off[size_t(b)];
        const float* kp = K + k.off[size_t(b)];
        const float* vp = V + v.off[size_t(b)];
        for (int64_t r = 0; r < rows; ++r)
          if (q.cs == 1)
            std::memcpy(qb.data() + r * D, qp + (i0 + r) * q.rs, size_t(D) * sizeof(float));
          else
            for (int64_t d = 0; d < D; ++d) qb[size_t(r * D + d)] = qp[(i0 + r) * q.rs + d * q.cs];
        std::fill(qb.begin() + rows * D, qb.end(), 0.0f);
        std::fill(acc.begin(), acc.end(), 0.0f);
        std::fill(m, m + kBlock, ninf);
        std::fill(l, l + kBlock, 0.0f);
        int64_t kend = Tk;
        if (a.causal) kend = std::clamp<int64_t>(i0 + rows - 1 + a.causal_offset + 1, 0, Tk);
        for (int64_t j0 = 0; j0 < kend; j0 += kKeys) {
          const int64_t nk = std::min(kKeys, kend - j0);
          pack_tile(kp, k, vp, v, j0, nk, D, Dv, kt.data(), vt.data());
          for (int64_t g = 0; g < rows; g += 4) {
            // Keys this group may see in the tile: the causal limit of its last row.
            int64_t glim = nk;
            if (a.causal) glim = std::clamp<int64_t>(i0 + std::min(g + 3, rows - 1) + a.causal_offset + 1 - j0, 0, nk);
            if (glim == 0) continue;
            const int64_t nv = (glim + 15) / 16;
            const int gr = int(std::min<int64_t>(4, rows - g));
#if defined(__x86_64__)
            if (z) {  // scores, mask and softmax update in registers
              int64_t lim[4];
              for (int r = 0; r < gr; ++r) lim[r] = a.causal ? std::clamp<int64_t>(i0 + g + r + a.causal_offset + 1 - j0, 0, nk) : nk;
              float* ag = acc.data() + g * Dv;
              constexpr decltype(&softmax4_z<1>) form[4] = {softmax4_z<1>, softmax4_z<2>, softmax4_z<3>, softmax4_z<4>};
              form[std::min<int64_t>(nv, 4) - 1](qb.data() + g * D, D, kt.data(), scale, lim, gr, m + g, l + g, ag, Dv, s);
              pv4(s, vt.data(), Dv, glim, ag, gr, z);
              continue;
            }
#endif
            scores4(qb.data() + g * D, D, kt.data(), nv, scale, s);
            const int64_t width = (glim + 15) / 16 * 16;
            for (int64_t r = 0; r < 4; ++r) {
              float* sr = s + r * kKeys;
              const int64_t row = g + r;
              if (row >= rows) {
                std::fill(sr, sr + width, 0.0f);
                continue;
              }
              int64_t lim = nk;
              if (a.causal) lim = std::clamp<int64_t>(i0 + row + a.causal_offset + 1 - j0, 0, nk);
              const float mt = mask_max(sr, width, lim);
              const float mnew = std::max(m[row], mt);
              if (mnew == ninf) {  // nothing seen yet in this row
                std::fill(sr, sr + width, 0.0f);
                continue;
              }
              const float corr = m[row] == ninf ? 0.0f : std::exp(m[row] - mnew);
              v8 part = {};
              exp_shifted(sr, width, mnew, part);
              l[row] = l[row] * corr + lanes_total(part);
              m[row] = mnew;
              if (corr != 1.0f)
                for (float* ar = acc.data() + row * Dv; ar != acc.data() + (row + 1) * Dv; ++ar) *ar *= corr;
            }
            // acc[g..g+4) += P V over the group's keys.
            pv4(s, vt.data(), Dv, glim, acc.data() + g * Dv, gr, z);
          }
        }
        float* op = O + out.off[size_t(b)] + i0 * out.rs;
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < Dv; ++c) op[r * out.rs + c * out.cs] = acc[size_t(r * Dv + c)] / l[r];
          if (lse) lse[b * Tq + i0 + r] = m[r] + std::log(l[r]);
        }
      }
    }
  }

  // bfloat16 autocast: the decomposition's numbers in one Step. Per task (batch element, block of
  // kBlock query rows), two passes over the key tiles: the first computes every score of the
  // block's rows (Q and K rounded to bfloat16 as packed, float32 accumulation, scaled and masked)
  // into a per-thread buffer [tile][row][kKeys]; then per row the softmax in float32 (maximum,
  // exp, sum, e / sum) with the probabilities rounded to bfloat16, as autocast rounds P for its
  // product; the second pass accumulates P V (V rounded as packed) in float32. The output needs
  // no division (P is normalised); a row with every key masked gets NaN, as the softmax does.
  void run_bf16(const Step& st, const LaunchArgs& args) const {
    constexpr int64_t kBlock = 64, kPad = kBlock + 4;  // rows padded to whole groups of 4
    const void *Q = args.slots[st.inputs[0]], *K = args.slots[st.inputs[1]], *V = args.slots[st.inputs[2]];
    const Held hq = held(st, 0), hk = held(st, 1), hv = held(st, 2);
    float* O = static_cast<float*>(args.slots[st.output]);
    float* lse = st.more_outputs.empty() ? nullptr : static_cast<float*>(args.slots[st.more_outputs[0]]);
    const int64_t B = a.batch, Tq = a.tq, Tk = a.tk, D = a.d, Dv = a.dv;
    const int64_t blocks = (Tq + kBlock - 1) / kBlock, tasks = B * blocks, tiles = (Tk + kKeys - 1) / kKeys;
    const float scale = float(a.scale), ninf = -std::numeric_limits<float>::infinity();
    [[maybe_unused]] const bool z = avx512;
#pragma omp parallel if (threaded(a))
    {
      std::vector<float> kt(size_t(D * kKeys), 0.0f), vt(size_t(kKeys * Dv), 0.0f), qb(size_t(kPad * D), 0.0f), acc(size_t(kBlock * Dv));
      std::vector<float> sc(size_t(tiles * kPad * kKeys)), kr(size_t(kKeys * D));
      float m[kBlock], l[kBlock];
#pragma omp for schedule(static)
      for (int64_t t = 0; t < tasks; ++t) {
        const int64_t b = t / blocks, i0 = (t % blocks) * kBlock, rows = std::min(kBlock, Tq - i0);
        for (int64_t r = 0; r < rows; ++r) read_row(Q, hq, q.off[size_t(b)] + (i0 + r) * q.rs, q.cs, D, qb.data() + r * D);
        std::fill(qb.begin() + rows * D, qb.end(), 0.0f);
        int64_t kend = Tk;
        if (a.causal) kend = std::clamp<int64_t>(i0 + rows - 1 + a.causal_offset + 1, 0, Tk);
        const int64_t nt = (kend + kKeys - 1) / kKeys;
        auto lim_of = [&](int64_t row, int64_t j0, int64_t nk) {  // keys row may see in the tile
          return a.causal ? std::clamp<int64_t>(i0 + row + a.causal_offset + 1 - j0, 0, nk) : nk;
        };
        for (int64_t ti = 0; ti < nt; ++ti) {  // pass 1: the scores
          const int64_t j0 = ti * kKeys, nk = std::min(kKeys, kend - j0);
          for (int64_t j = 0; j < nk; ++j)
            read_row(K, hk, k.off[size_t(b)] + (j0 + j) * k.rs, k.cs, D, kr.data() + j * D);  // K's rows, then transposed
          for (int64_t j = 0; j < kKeys; ++j)
            for (int64_t d = 0; d < D; ++d) kt[size_t(d * kKeys + j)] = j < nk ? kr[size_t(j * D + d)] : 0.0f;
          for (int64_t g = 0; g < rows; g += 4) {
            float* s = sc.data() + (ti * kPad + g) * kKeys;
            const int64_t glim = lim_of(std::min(g + 3, rows - 1), j0, nk), nv = (glim + 15) / 16;
            if (nv > 0) scores4_any(qb.data() + g * D, D, kt.data(), nv, scale, s, z);
            for (int64_t r = 0; r < 4; ++r) {
              const int64_t lim = g + r < rows ? std::min(lim_of(g + r, j0, nk), glim) : 0;
              std::fill(s + r * kKeys + lim, s + (r + 1) * kKeys, ninf);
            }
          }
        }
        for (int64_t r = 0; r < rows; ++r) {  // the softmax, P rounded to bfloat16
          // per tile, the keys the row sees rounded up to 16 (past them -inf, then 0)
          int64_t width[64];
          float mx = ninf;
          for (int64_t ti = 0; ti < nt; ++ti) {  // (past 64 tiles, whole tiles: their masked keys are -inf)
            const int64_t w = nt > 64 ? kKeys : (lim_of(r, ti * kKeys, std::min(kKeys, kend - ti * kKeys)) + 15) / 16 * 16;
            if (ti < 64) width[ti] = w;
            if (w > 0) mx = std::max(mx, mask_max(sc.data() + (ti * kPad + r) * kKeys, w, w));
          }
          m[r] = mx;
          if (mx == ninf) {  // every key masked
            for (int64_t ti = 0; ti < nt; ++ti) std::fill_n(sc.data() + (ti * kPad + r) * kKeys, kKeys, 0.0f);
            l[r] = 0.0f;
            continue;
          }
          v8 part = {};
          for (int64_t ti = 0; ti < nt; ++ti) {
            float* sr = sc.data() + (ti * kPad + r) * kKeys;
            const int64_t w = nt > 64 ? kKeys : width[ti];
            exp_shifted(sr, w, mx, part);
            std::fill(sr + w, sr + kKeys, 0.0f);
          }
          const float sum = lanes_total(part);
          l[r] = sum;
          for (int64_t ti = 0; ti < nt; ++ti) {
            float* sr = sc.data() + (ti * kPad + r) * kKeys;
            const int64_t w = nt > 64 ? kKeys : width[ti];
            for (int64_t j = 0; j < w; ++j) sr[j] /= sum;
            round_bf16(sr, w);
          }
        }
        for (int64_t r = rows; r < (rows + 3) / 4 * 4; ++r)  // a last group's rows past the block
          for (int64_t ti = 0; ti < nt; ++ti) std::fill_n(sc.data() + (ti * kPad + r) * kKeys, kKeys, 0.0f);
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t ti = 0; ti < nt; ++ti) {  // pass 2: P V
          const int64_t j0 = ti * kKeys, nk = std::min(kKeys, kend - j0);
          for (int64_t j = 0; j < nk; ++j) read_row(V, hv, v.off[size_t(b)] + (j0 + j) * v.rs, v.cs, Dv, vt.data() + j * Dv);
          for (int64_t g = 0; g < rows; g += 4) {
            const int64_t glim = lim_of(std::min(g + 3, rows - 1), j0, nk);
            if (glim > 0)
              pv4(sc.data() + (ti * kPad + g) * kKeys, vt.data(), Dv, glim, acc.data() + g * Dv, int(std::min<int64_t>(4, rows - g)), z);
          }
        }
        float* op = O + out.off[size_t(b)] + i0 * out.rs;
        for (int64_t r = 0; r < rows; ++r) {
          const float nan = l[r] > 0 ? 1.0f : std::numeric_limits<float>::quiet_NaN();
          for (int64_t c = 0; c < Dv; ++c) op[r * out.rs + c * out.cs] = acc[size_t(r * Dv + c)] * nan;
          if (lse) lse[b * Tq + i0 + r] = m[r] + std::log(l[r]);
        }
      }
    }
  }

  void run(const Step& st, const LaunchArgs& args) const override {
    if (st.dtype == DType::Float64)
      run_typed<double>(st, args);
    else if (a.bf16)
      run_bf16(st, args);
    else
      run_float(st, args);
  }
};

// The backward Step (Step::attention->backward): from Q, K, V, the forward's output O, its
// cotangent dO and the forward's per-row log-sum-exp, the gradients dQ, dK (written as K^T's
// layout [..., d, Tk], the node the graph holds) and dV, recomputing each score once:
//   p = exp(scale q.k - lse); dV[j] += p dO[i]; ds = p (dO[i].v[j] - dO[i].O[i]) scale;
//   dQ[i] += ds k[j]; dK[j] += ds q[i].
// One task per batch element (its rows and keys), so every sum is in one order whatever the
// thread count. The operands of the element are copied dense first (per thread).
template <class T>
T dot(const T* x, const T* y, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    v8 part = {};
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
      v8 a, b;
      VLOAD(a, x + c);
      VLOAD(b, y + c);
      part += a * b;
    }
    float r = 0;
    for (int i = 0; i < 8; ++i) r += part[i];
    for (; c < n; ++c) r += x[c] * y[c];
    return r;
  } else {
    T r = 0;
    for (int64_t c = 0; c < n; ++c) r += x[c] * y[c];
    return r;
  }
}

struct AttentionBackwardKernel : CpuKernel {
  kir::Step::Attention a;
  Operand q, k, v, o, g;
  // Where dQ [.., Tq, D], dK^T [.., D, Tk] and dV [.., Tk, Dv] are written (Step::out_maps; dense
  // in their own slots without them).
  Operand oq, okt, ov;
  bool avx512 = has_avx512();

  explicit AttentionBackwardKernel(const Step& st) : a(*st.attention) {
    q = operand_of(st.maps.at(0), a.batch);
    k = operand_of(st.maps.at(1), a.batch);
    v = operand_of(st.maps.at(2), a.batch);
    o = operand_of(st.maps.at(3), a.batch);
    g = operand_of(st.maps.at(4), a.batch);
    auto dense_map = [&](int64_t rows, int64_t cols) {
      Operand x;
      x.rs = cols, x.cs = 1;
      for (int64_t b = 0; b < a.batch; ++b) x.off.push_back(b * rows * cols);
      return x;
    };
    const bool maps = !st.out_maps.empty();
    oq = maps ? operand_of(st.out_maps[0], a.batch) : dense_map(a.tq, a.d);
    okt = maps ? operand_of(st.out_maps[1], a.batch) : dense_map(a.d, a.tk);
    ov = maps ? operand_of(st.out_maps[2], a.batch) : dense_map(a.tk, a.dv);
  }

  // Stores rows x cols dense values src through x's view of batch element b at dst.
  template <class T>
  static void store(const T* src, int64_t rows, int64_t cols, T* dst, const Operand& x, int64_t b) {
    T* p = dst + x.off[size_t(b)];
    if (x.cs == 1) {
      for (int64_t r = 0; r < rows; ++r) std::memcpy(p + r * x.rs, src + r * cols, size_t(cols) * sizeof(T));
      return;
    }
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) p[r * x.rs + c * x.cs] = src[r * cols + c];
  }
  // dK (Tk x D, dense) stored as dK^T through x's view (D x Tk) of batch element b.
  template <class T>
  static void store_transposed(const T* dk, int64_t tk, int64_t d, T* dst, const Operand& x, int64_t b) {
    T* p = dst + x.off[size_t(b)];
    if (x.rs == 1) {  // dK's rows contiguous there (the qkv gradient's K columns)
      for (int64_t j = 0; j < tk; ++j) std::memcpy(p + j * x.cs, dk + j * d, size_t(d) * sizeof(T));
      return;
    }
    for (int64_t c = 0; c < d; ++c)
      for (int64_t j = 0; j < tk; ++j) p[c * x.rs + j * x.cs] = dk[j * d + c];
  }

  template <class T>
  static void dense(const T* src, const Operand& x, int64_t b, int64_t rows, int64_t cols, T* dst) {
    const T* p = src + x.off[size_t(b)];
    if (x.cs == 1) {  // rows contiguous (the GPT's head-split views of the qkv product)
      for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * cols, p + r * x.rs, size_t(cols) * sizeof(T));
      return;
    }
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = p[r * x.rs + c * x.cs];
  }

  // The first query row (a multiple of 8) that sees the key tile from j0; rows before it are not read.
  int64_t first_of(int64_t j0) const { return a.causal ? std::clamp<int64_t>(j0 - a.causal_offset, 0, a.tq) / 8 * 8 : int64_t(0); }

  // The key tile from j0 (nkey keys; K, V, Q and dY dense in kb, vb, qb, gb, Q and dY padded to
  // 8-row blocks): its K^T and V^T into kt and vtt (keys past the tile zero), then for every row
  // from `first`, in groups of 4 up to the group's causal limit, P = exp(S - lse) into p and dP =
  // dY V^T into ds (kKeys per row; past each row's limit P is 0). finish(i, P row, dP row, width)
  // then turns row i's dP into what the products read (float32: dS; bfloat16: dP rounded first);
  // the rest of each row is zeroed.
  template <class F>
  void tile_scores(const float* kb, const float* vb, const float* qb, const float* gb, const float* lse, int64_t j0, int64_t nkey,
                   int64_t first, float* kt, float* vtt, float* p, float* ds, bool z, F&& finish) const {
    const int64_t Tq = a.tq, D = a.d, Dv = a.dv, off = a.causal_offset, nq = (Tq + 7) / 8 * 8;
    const float scale = float(a.scale), ninf = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < nkey; ++j) {
      for (int64_t d = 0; d < D; ++d) kt[d * kKeys + j] = kb[(j0 + j) * D + d];
      for (int64_t c = 0; c < Dv; ++c) vtt[c * kKeys + j] = vb[(j0 + j) * Dv + c];
    }
    if (nkey < kKeys) {
      for (int64_t d = 0; d < D; ++d) std::fill(kt + d * kKeys + nkey, kt + (d + 1) * kKeys, 0.0f);
      for (int64_t c = 0; c < Dv; ++c) std::fill(vtt + c * kKeys + nkey, vtt + (c + 1) * kKeys, 0.0f);
    }
    for (int64_t g0 = first; g0 < nq; g0 += 4) {
      const int64_t gr = std::clamp<int64_t>(Tq - g0, 0, 4);
      float *pg = p + g0 * kKeys, *dg = ds + g0 * kKeys;
      int64_t glim = gr > 0 ? nkey : 0;
      if (a.causal && gr > 0) glim = std::clamp<int64_t>(g0 + gr - 1 + off + 1 - j0, 0, nkey);
      const int64_t nv = (glim + 15) / 16, width = nv * 16;
#if defined(__x86_64__)
      if (z && nv > 0 && nv < 4 && D == Dv) {
        constexpr decltype(&scores_pair_z<1>) form[3] = {scores_pair_z<1>, scores_pair_z<2>, scores_pair_z<3>};
        form[nv - 1](qb + g0 * D, D, kt, scale, pg, gb + g0 * Dv, vtt, dg);
      } else
#endif
      if (nv > 0) {
        scores4_any(qb + g0 * D, D, kt, nv, scale, pg, z);
        scores4_any(gb + g0 * Dv, Dv, vtt, nv, 1.0f, dg, z);
      }
      for (int64_t r = 0; r < 4; ++r) {
        float* pr = pg + r * kKeys;
        float* dr = dg + r * kKeys;
        const int64_t i = g0 + r;
        if (width > 0) {
          int64_t lim = r < gr ? glim : 0;
          if (r < gr && a.causal) lim = std::clamp<int64_t>(i + off + 1 - j0, 0, nkey);
          if (r < gr && !std::isfinite(lse[i])) lim = 0;  // every key masked: no gradient defined here
          const float li = r < gr ? lse[i] : 0.0f;
#if defined(__x86_64__)
          if (z) {
            probs_z(pr, width, lim, li);
          } else
#endif
          {
            for (int64_t j = 0; j < width; ++j) pr[j] = j < lim ? pr[j] - li : ninf;
            vmath::vexp(pr, pr, width);
          }
          finish(i, pr, dr, width);
        }
        std::fill(pr + width, pr + kKeys, 0.0f);
        std::fill(dr + width, dr + kKeys, 0.0f);
      }
    }
  }

  // The key tile's products from P and dS (p, ds: kKeys per row): dQ += dS K for the query rows
  // from `first` (up to each 8-row block's causal limit), and the tile's dV = P^T dY into dvp and
  // dK = dS^T Q into dk (key rows, from the first query that sees each block's first key).
  void tile_products(const float* p, const float* ds, const float* kb, const float* qb, const float* gb, int64_t j0, int64_t nkey,
                     int64_t first, float* dq, float* dvp, float* dk, bool z) const {
    const int64_t Tq = a.tq, D = a.d, Dv = a.dv, off = a.causal_offset;
    for (int64_t i0 = first; i0 < Tq; i0 += 8) {
      const int gr = int(std::min<int64_t>(8, Tq - i0));
      int64_t k1 = nkey;
      if (a.causal) k1 = std::clamp<int64_t>(i0 + gr - 1 + off + 1 - j0, 0, nkey);
      mm8(ds + i0 * kKeys, kKeys, 1, kb + j0 * D, D, 0, k1, dq + i0 * D, gr, z, true);
    }
    for (int64_t jj = 0; jj < nkey; jj += 8) {
      const int gr = int(std::min<int64_t>(8, nkey - jj));
      int64_t k0 = 0;
      if (a.causal) k0 = std::clamp<int64_t>(j0 + jj - off, 0, Tq);
      mm8(p + jj, 1, kKeys, gb, Dv, k0, Tq, dvp + (j0 + jj) * Dv, gr, z);
      mm8(ds + jj, 1, kKeys, qb, D, k0, Tq, dk + (j0 + jj) * D, gr, z);
    }
  }

  template <class T>
  void run_typed(const Step& st, const LaunchArgs& args) const {
    auto in = [&](size_t i) { return static_cast<const T*>(args.slots[st.inputs[i]]); };
    const T *Q = in(0), *K = in(1), *V = in(2), *O = in(3), *G = in(4), *L = in(5);
    T* dQ = static_cast<T*>(args.slots[st.output]);
    T* dKT = static_cast<T*>(args.slots[st.more_outputs.at(0)]);
    T* dV = static_cast<T*>(args.slots[st.more_outputs.at(1)]);
    const int64_t B = a.batch, Tq = a.tq, Tk = a.tk, D = a.d, Dv = a.dv;
    const T scale = T(a.scale);
#pragma omp parallel if (threaded(a))
    {
      const size_t nq = static_cast<size_t>(Tq), nk = static_cast<size_t>(Tk);
      std::vector<T> qb(nq * size_t(D)), kb(nk * size_t(D)), vb(nk * size_t(Dv)), gb(nq * size_t(Dv)), ob(nq * size_t(Dv));
      std::vector<T> dq(nq * size_t(D)), dk(nk * size_t(D)), dv(nk * size_t(Dv)), di(nq);
#pragma omp for schedule(static)
      for (int64_t b = 0; b < B; ++b) {
        dense(Q, q, b, Tq, D, qb.data());
        dense(K, k, b, Tk, D, kb.data());
        dense(V, v, b, Tk, Dv, vb.data());
        dense(G, g, b, Tq, Dv, gb.data());
        dense(O, o, b, Tq, Dv, ob.data());
        std::fill(dq.begin(), dq.end(), T(0));
        std::fill(dk.begin(), dk.end(), T(0));
        std::fill(dv.begin(), dv.end(), T(0));
        for (int64_t i = 0; i < Tq; ++i) di[size_t(i)] = dot(gb.data() + i * Dv, ob.data() + i * Dv, Dv);
        const T* lse = L + b * Tq;
        for (int64_t i = 0; i < Tq; ++i) {
          int64_t jend = Tk;
          if (a.causal) jend = std::clamp<int64_t>(i + a.causal_offset + 1, 0, Tk);
          if (!std::isfinite(lse[i])) continue;  // every key masked: the forward gave NaN, its gradient is not defined here
          const T* qi = qb.data() + i * D;
          const T* gi = gb.data() + i * Dv;
          T* dqi = dq.data() + i * D;
          for (int64_t j = 0; j < jend; ++j) {
            const T* kj = kb.data() + j * D;
            const T p = std::exp(scale * dot(qi, kj, D) - lse[i]);
            T* dvj = dv.data() + j * Dv;
            for (int64_t c = 0; c < Dv; ++c) dvj[c] += p * gi[c];
            const T ds = p * (dot(gi, vb.data() + j * Dv, Dv) - di[size_t(i)]) * scale;
            T* dkj = dk.data() + j * D;
            for (int64_t c = 0; c < D; ++c) {
              dqi[c] += ds * kj[c];
              dkj[c] += ds * qi[c];
            }
          }
        }
        store(dq.data(), Tq, D, dQ, oq, b);
        store(dv.data(), Tk, Dv, dV, ov, b);
        store_transposed(dk.data(), Tk, D, dKT, okt, b);
      }
    }
  }

  // float32, by key tiles of kKeys: per batch element and tile, P and dS of every row that sees the
  // tile are computed once into per-thread [Tq, kKeys] buffers (the scores and dP = dY V^T in
  // groups of 4 rows, only up to each group's causal limit; the rest of a row zero), then the
  // three products read them as register-blocked 8-row blocks over the causal range only:
  // dQ += dS K (query rows, the tile's keys up to the block's limit), and the tile's dV = P^T dY and
  // dK = dS^T Q (key rows, from the first query that sees the block's first key). dV is written
  // straight into the output.
  void run_float(const Step& st, const LaunchArgs& args) const {
    auto in = [&](size_t i) { return static_cast<const float*>(args.slots[st.inputs[i]]); };
    const float *Q = in(0), *K = in(1), *V = in(2), *O = in(3), *G = in(4), *L = in(5);
    float* dQ = static_cast<float*>(args.slots[st.output]);
    float* dKT = static_cast<float*>(args.slots[st.more_outputs.at(0)]);
    float* dV = static_cast<float*>(args.slots[st.more_outputs.at(1)]);
    const int64_t B = a.batch, Tq = a.tq, Tk = a.tk, D = a.d, Dv = a.dv;
    const float scale = float(a.scale);
    const bool z = avx512;
    const int64_t nq = (Tq + 7) / 8 * 8;  // rows padded to the 8-row blocks (zero rows)
#pragma omp parallel if (threaded(a))
    {
      std::vector<float> qb(size_t(nq * D), 0.0f), kb(size_t(Tk * D)), vb(size_t(Tk * Dv)), gb(size_t(nq * Dv), 0.0f), ob(size_t(Tq * Dv));
      std::vector<float> kt(size_t(D * kKeys), 0.0f), vtt(size_t(Dv * kKeys), 0.0f), dq(size_t(nq * D)), dk(size_t(Tk * D));
      // dV straight into the output when it is dense there, else here first.
      const bool dv_dense = ov.rs == Dv && ov.cs == 1;
      std::vector<float> dvb(dv_dense ? 0 : size_t(Tk * Dv));
      std::vector<float> di(static_cast<size_t>(nq)), p(size_t(nq * kKeys), 0.0f), ds(size_t(nq * kKeys), 0.0f);
#pragma omp for schedule(static)
      for (int64_t b = 0; b < B; ++b) {
        dense(Q, q, b, Tq, D, qb.data());
        dense(K, k, b, Tk, D, kb.data());
        dense(V, v, b, Tk, Dv, vb.data());
        dense(G, g, b, Tq, Dv, gb.data());
        dense(O, o, b, Tq, Dv, ob.data());
        std::fill(dq.begin(), dq.end(), 0.0f);
        for (int64_t i = 0; i < Tq; ++i) di[size_t(i)] = dot(gb.data() + i * Dv, ob.data() + i * Dv, Dv);
        const float* lse = L + b * Tq;
        for (int64_t j0 = 0; j0 < Tk; j0 += kKeys) {
          const int64_t nkey = std::min(kKeys, Tk - j0), first = first_of(j0);
          tile_scores(kb.data(), vb.data(), qb.data(), gb.data(), lse, j0, nkey, first, kt.data(), vtt.data(), p.data(), ds.data(), z,
                      [&](int64_t i, float* pr, float* dr, int64_t width) {  // dS = P (dP - di) scale
                        const float dii = di[size_t(i)];
                        for (int64_t j = 0; j < width; ++j) dr[j] = pr[j] * (dr[j] - dii) * scale;
                      });
          tile_products(p.data(), ds.data(), kb.data(), qb.data(), gb.data(), j0, nkey, first, dq.data(),
                        dv_dense ? dV + ov.off[size_t(b)] : dvb.data(), dk.data(), z);
        }
        store(dq.data(), Tq, D, dQ, oq, b);
        if (!dv_dense) store(dvb.data(), Tk, Dv, dV, ov, b);
        store_transposed(dk.data(), Tk, D, dKT, okt, b);
      }
    }
  }

  // bfloat16 autocast: run_float's tiles and products over the decomposition's roundings. Q, K,
  // V and dY are rounded to bfloat16 as they are copied dense; per tile, P = exp(S - lse) in
  // float32 and dP = dY V^T rounded to bfloat16 (autocast rounds that product's result);
  // di = rowsum(P dP) over all keys as the softmax's backward sums it (when there are several
  // tiles, a first pass over them computes it: the scores are computed twice there), dS = P (dP -
  // di) scale rounded to bfloat16, and P rounded to bfloat16 for P^T dY; the products accumulate
  // in float32.
  void run_bf16(const Step& st, const LaunchArgs& args) const {
    auto in = [&](size_t i) { return args.slots[st.inputs[i]]; };
    const Held hq = held(st, 0), hk = held(st, 1), hv = held(st, 2), hg = held(st, 4);
    const float* L = static_cast<const float*>(in(5));
    float* dQ = static_cast<float*>(args.slots[st.output]);
    float* dKT = static_cast<float*>(args.slots[st.more_outputs.at(0)]);
    float* dV = static_cast<float*>(args.slots[st.more_outputs.at(1)]);
    const int64_t B = a.batch, Tq = a.tq, Tk = a.tk, D = a.d, Dv = a.dv;
    const float scale = float(a.scale);
    const bool z = avx512;
    const int64_t nq = (Tq + 7) / 8 * 8;
#pragma omp parallel if (threaded(a))
    {
      std::vector<float> qb(size_t(nq * D), 0.0f), kb(size_t(Tk * D)), vb(size_t(Tk * Dv)), gb(size_t(nq * Dv), 0.0f);
      std::vector<float> kt(size_t(D * kKeys), 0.0f), vtt(size_t(Dv * kKeys), 0.0f), dq(size_t(nq * D)), dk(size_t(Tk * D)), dvb(size_t(Tk * Dv));
      std::vector<float> di(static_cast<size_t>(nq)), p(size_t(nq * kKeys), 0.0f), ds(size_t(nq * kKeys), 0.0f);
#pragma omp for schedule(static)
      for (int64_t b = 0; b < B; ++b) {
        dense_any(in(0), hq, q, b, Tq, D, qb.data());
        dense_any(in(1), hk, k, b, Tk, D, kb.data());
        dense_any(in(2), hv, v, b, Tk, Dv, vb.data());
        dense_any(in(4), hg, g, b, Tq, Dv, gb.data());
        std::fill(dq.begin(), dq.end(), 0.0f);
        std::fill(di.begin(), di.end(), 0.0f);
        const float* lse = L + b * Tq;
        // P (float32) and dP (rounded) of the tile from j0 for every row that sees it (from `first`).
        auto tile = [&](int64_t j0, int64_t nkey, int64_t first) {
          tile_scores(kb.data(), vb.data(), qb.data(), gb.data(), lse, j0, nkey, first, kt.data(), vtt.data(), p.data(), ds.data(), z,
                      [](int64_t, float*, float* dr, int64_t width) { round_bf16(dr, width); });
        };
        auto add_di = [&](int64_t first) {  // di += rowsum(P dP) over the tile
          for (int64_t i = first; i < Tq; ++i) {
            const float *pr = p.data() + i * kKeys, *dr = ds.data() + i * kKeys;
            v8 part = {};
            for (int64_t j = 0; j < kKeys; j += 8) {
              v8 x, y;
              VLOAD(x, pr + j);
              VLOAD(y, dr + j);
              part += x * y;
            }
            di[size_t(i)] += lanes_total(part);
          }
        };
        if (Tk > kKeys)
          for (int64_t j0 = 0; j0 < Tk; j0 += kKeys) {
            tile(j0, std::min(kKeys, Tk - j0), first_of(j0));
            add_di(first_of(j0));
          }
        for (int64_t j0 = 0; j0 < Tk; j0 += kKeys) {
          const int64_t nkey = std::min(kKeys, Tk - j0), first = first_of(j0);
          tile(j0, nkey, first);
          if (Tk <= kKeys) add_di(first);
          for (int64_t i = first; i < nq; ++i) {  // dS = P (dP - di) scale, then dS and P rounded
            float *pr = p.data() + i * kKeys, *dr = ds.data() + i * kKeys;
            const float dii = di[size_t(i)];
            for (int64_t j = 0; j < kKeys; ++j) dr[j] = pr[j] * (dr[j] - dii) * scale;
            round_bf16(dr, kKeys);
            round_bf16(pr, kKeys);
          }
          tile_products(p.data(), ds.data(), kb.data(), qb.data(), gb.data(), j0, nkey, first, dq.data(), dvb.data(), dk.data(), z);
        }
        store(dq.data(), Tq, D, dQ, oq, b);
        store(dvb.data(), Tk, Dv, dV, ov, b);
        store_transposed(dk.data(), Tk, D, dKT, okt, b);
      }
    }
  }

  void run(const Step& st, const LaunchArgs& args) const override {
    if (st.dtype == DType::Float64)
      run_typed<double>(st, args);
    else if (a.bf16)
      run_bf16(st, args);
    else
      run_float(st, args);
  }
};

#undef VLOAD
#undef VSTORE

}  // namespace

std::unique_ptr<CpuKernel> compile_attention(const Step& st) {
  const kir::Source src = st.sources.empty() ? kir::Source{"attention", ""} : st.sources.front();
  const size_t n = st.attention && st.attention->backward ? 6 : 3;
  if (!st.attention || st.inputs.size() != n || st.maps.size() < n - (n == 6) ||
      st.more_outputs.size() != (st.attention->backward ? 2u : st.more_outputs.size()))
    fail(src.op, "internal: an attention Step without its fields or its operands (" + st.str() + ")", src.scope);
  if (st.dtype != DType::Float32 && st.dtype != DType::Float64)
    fail(src.op, std::string("the fused attention Step runs float32 and float64, not ") + dtype_name(st.dtype), src.scope);
  // Operands: the Step's dtype, or under autocast (bf16) bfloat16 ones (q, k, v, do), held as
  // bfloat16 or as float32 rounded as read; the output and log-sum-exp the backward reads are
  // the Step's dtype.
  for (size_t i = 0; i < n; ++i) {
    const bool half = st.attention->bf16 && i != 3 && i != 5;
    const DType want = half ? DType::BFloat16 : st.dtype;
    if (i < st.input_dtypes.size() && (st.input_dtypes[i] != want || (((st.rounded >> i) & 1) && !half)))
      fail(src.op, "internal: attention operand " + std::to_string(i) + " is " + dtype_name(st.input_dtypes[i]) + ", not " + dtype_name(want) +
                       " (" + st.str() + ")", src.scope);
  }
  if (st.attention->bf16 && st.dtype != DType::Float32)
    fail(src.op, "internal: a bfloat16 attention Step's results are float32 (" + st.str() + ")", src.scope);
  for (size_t i = 0; i < std::min<size_t>(st.maps.size(), 5); ++i)
    if (!st.maps[i].single() || st.maps[i].shape().size() < 2)
      fail(src.op, "internal: an attention operand is not a plain strided view (" + st.maps[i].str() + ")", src.scope);
  if (!st.out_maps.empty() && st.out_maps.size() != (st.attention->backward ? 3u : 1u))
    fail(src.op, "internal: an attention Step's out_maps are not one per output it writes through them (" + st.str() + ")", src.scope);
  // Each out map over its result's own shape: [batch..., rows, cols] with the leading extents
  // making `batch` (operand_of walks them; a smaller product would wrap its writes).
  const kir::Step::Attention& a = *st.attention;
  const std::vector<std::pair<int64_t, int64_t>> want =
      a.backward ? std::vector<std::pair<int64_t, int64_t>>{{a.tq, a.d}, {a.d, a.tk}, {a.tk, a.dv}}
                 : std::vector<std::pair<int64_t, int64_t>>{{a.tq, a.dv}};
  for (size_t i = 0; i < st.out_maps.size(); ++i) {
    const kir::IndexMap& m = st.out_maps[i];
    const Shape sh = m.shape();
    int64_t lead = 1;
    for (size_t d = 0; d + 2 < sh.size(); ++d) lead *= sh[d];
    if (!m.single() || sh.size() < 2 || lead != a.batch || sh[sh.size() - 2] != want[i].first || sh.back() != want[i].second)
      fail(src.op, "internal: an attention Step's out map " + std::to_string(i) + " is not a plain strided view over [batch " +
                       std::to_string(a.batch) + ", " + std::to_string(want[i].first) + ", " + std::to_string(want[i].second) +
                       "] (" + m.str() + ")", src.scope);
  }
  if (st.attention->backward) return std::make_unique<AttentionBackwardKernel>(st);
  return std::make_unique<AttentionKernel>(st);
}

}  // namespace tessera::backends::cpu
