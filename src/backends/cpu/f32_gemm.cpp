#include "backends/cpu/f32_gemm.h"

// GCC 12 warns that the undefined vector behind its masked-load intrinsics may be used
// uninitialized; it is not (every masked load here zeroes).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "backends/cpu/copies.h"
#include "backends/cpu/window_gemm.h"

namespace tessera::backends::f32_gemm {

namespace {
const char* mode() {
  const char* e = std::getenv("TESSERA_CPU_GEMM");
  return e ? e : "";
}
}  // namespace

// window_gemm's condition (AVX-512F, TESSERA_CPU_GEMM not "blas") and AVX-512VL, which pack_a's
// 256-bit masked loads need.
bool available() {
#if defined(__x86_64__)
  static const bool ok = window_gemm::available() && __builtin_cpu_supports("avx512vl") != 0;
  return ok;
#else
  return false;
#endif
}

bool forced() {
  static const bool own = std::strcmp(mode(), "own") == 0;
  return own;
}

// The rule, from bench/f32_gemm (docs/architecture.md, "float32 products", has the table):
// every single product of the benchmark GPT's step ran as fast or faster here than through
// OpenBLAS in the backend's blocks (forward and input gradients 5-20% faster; weight gradients,
// K = 1024, within a few % either way), and the batched attention products with 64 columns
// (Q K^T, dO V^T: K = 32) 15-20% faster; the batched ones with 32 columns (P V, dS K and the
// transposed P^T dO, dS^T Q: K = 64) 15-30% slower (80-96 against 111 GFLOP/s on one thread;
// tiles of 12 rows x 32 columns, 24 accumulators instead of 12, ran no faster: 84-95). Those
// stay with OpenBLAS, and so do deep narrow products (K > 2048 with N <= 64: a conv's kernel
// gradient), which the BLAS path splits over K, and products whose packed B would pass 16 MiB.
// No condition looks at M: a row's result must not depend on how many rows the batch has.
bool chosen(int64_t batch, int64_t, int64_t N, int64_t K) {
  if (!available()) return false;
  if (forced()) return true;
  if (batch > 1 && N <= 32) return false;
  // Tiny products pay the grid's fixed cost (a parallel region, B's packing): the small CNN's fc2
  // (64 x 10 x 128) took 0.011-0.016 ms here against OpenBLAS's 0.008-0.012 (one thread). The
  // bound is on a row's work, not the rows': a row's result must not depend on how many rows
  // the batch has (micro-batches, batch slices and the whole batch compute each row alike).
  if (N * K < (int64_t(1) << 11)) return false;
  // Deep and narrow (a conv's kernel gradient: K = batch x pixels, few columns): the BLAS path
  // splits K into tasks. On N and K only, as above (the small CNN's fc1, 32 x 128 x 3136 in a
  // micro-batch of 32 rows, went to OpenBLAS at 32 rows and here at 64 under a rule on M x N,
  // and its micro-batched losses parted from the whole batch's by 1.5e-4).
  if (batch == 1 && K > 2048 && N <= 64) return false;
  // B is packed whole per launch: past 16 MiB of panels (a vocabulary-sized projection) the
  // copy is memory the BLAS path does not take (a bound, not a measurement).
  if (batch == 1 && (N + 63) / 64 * 64 * K > (int64_t(1) << 22)) return false;
  return true;
}

#if defined(__x86_64__)
namespace {

constexpr int kMR = 6;           // rows of a register tile
constexpr int kNR = 4;           // vectors of 16 columns of a register tile
constexpr int64_t kW = 16 * kNR;  // columns of a packed panel of B
constexpr int64_t kKc = 256;     // depths of one K block

// The epilogue a tile applies as it stores (Problem::epi; None before a product's last K block):
// its operand's element (i, j) of the tile at x[i * rs + j].
struct TileEpi {
  Problem::Epi op = Problem::Epi::None;
  const float* x = nullptr;
  int64_t rs = 0;
};

using Tile = void (*)(const float*, int64_t, int64_t, const float*, int64_t, int64_t, float*, int64_t, int, bool, TileEpi);

// MR rows x NR vectors of C from A (ACOLS: A(i, k) at a[k * acs + i]; else at a[i * ars + k]) and
// a packed panel of B (row k at bp + k * ldb, NR vectors, zeros past N), over K depths in order,
// from zero or (load_c) from what C holds. `last`: columns stored of the last vector. `epi`: the
// op applied to each final value with its operand's element as it is stored (Problem::epi), in
// the EPI instances only: the tiles without one are compiled as they were before it (with the
// epilogue's branches in them, the plain products measured 1-2% slower in the step).
template <int MR, int NR, bool ACOLS, bool EPI>
__attribute__((target("avx512f"))) void tile(const float* a, int64_t ars, int64_t acs, const float* bp, int64_t ldb, int64_t K,
                                             float* c, int64_t ldc, int last, bool load_c, TileEpi epi) {
  __m512 acc[MR][NR];
  const __mmask16 tail = last >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << last) - 1);
  // A tile starting from zero stores C lines it never read; where they are out of cache the
  // stores miss at the end of the tile. Fetched now, they arrive while the K loop runs: on
  // operands evicted from every cache (bench_f32_gemm --cold) the step's products took 40.1 ms on
  // 2 threads against 43.5, warm ones unchanged; in the training step itself no change was
  // measurable. (prefetchw, fetching them exclusive: cold 31.0 ms, but warm 2-thread products
  // 1.4x slower and the step's Gemm Steps slower; docs/architecture.md, "float32 products".)
  if (!load_c)
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + 16 * j), _MM_HINT_T0);
  // The epilogue's operand lines (made by another Step, often out of every cache: GELU's saved
  // derivative) are fetched into L2 now, so they arrive while the K loop runs; into L1 they were
  // evicted again by the B panel the loop streams (K = 128: 32 KiB, all of L1). In the step, dY W
  // with the GELU-backward epilogue, 2 threads: 0.83-0.84 ms without, 0.78 into L1, 0.74 into L2.
  if constexpr (EPI)
    for (int i = 0; i < (epi.rs ? MR : 1); ++i)
      for (int j = 0; j < NR; ++j) _mm_prefetch(reinterpret_cast<const char*>(epi.x + i * epi.rs + 16 * j), _MM_HINT_T1);
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      if (!load_c) acc[i][j] = _mm512_setzero_ps();
      else if (j + 1 < NR) acc[i][j] = _mm512_loadu_ps(c + i * ldc + 16 * j);
      else acc[i][j] = _mm512_maskz_loadu_ps(tail, c + i * ldc + 16 * j);
    }
  // With an epilogue, the last kEpiAhead depths also fetch the operand's lines into L1, one line
  // per depth: by the stores they were still arriving (the tile-start prefetch above brings them
  // into L2 only), and in L1 from the tile's start the B panel's stream evicted them. On operands
  // out of every cache (bench_f32_gemm --cold --epilogue --best, dY W 1024 x 512 x 128, one
  // thread) 87-88 GFLOP/s became 93 (96-97 without the epilogue); fetching them into L2 there
  // instead, or the next tile's lines a whole tile ahead, changed nothing (docs/architecture.md).
  constexpr int64_t kEpiAhead = 48;
  const int64_t plain = EPI ? std::max<int64_t>(0, K - kEpiAhead) : K;  // depths without prefetches
  const float* ap[MR];
  for (int i = 0; i < MR; ++i) ap[i] = a + i * ars;
  if constexpr (ACOLS) {
    for (int64_t k = 0; k < plain; ++k, a += acs, bp += ldb) {
      __m512 bv[NR];
      for (int j = 0; j < NR; ++j) bv[j] = _mm512_loadu_ps(bp + 16 * j);
      for (int i = 0; i < MR; ++i) {
        const __m512 av = _mm512_set1_ps(a[i]);
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(av, bv[j], acc[i][j]);
      }
    }
  } else {
    for (int64_t k = 0; k < plain; ++k, bp += ldb) {
      __m512 bv[NR];
      for (int j = 0; j < NR; ++j) bv[j] = _mm512_loadu_ps(bp + 16 * j);
      for (int i = 0; i < MR; ++i) {
        const __m512 av = _mm512_set1_ps(ap[i][k]);
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(av, bv[j], acc[i][j]);
      }
    }
  }
  if constexpr (EPI)
    for (int64_t k = plain; k < K; ++k, bp += ldb) {
      const int64_t line = k - plain, i = line / NR, j = line % NR;
      if (i < MR && (epi.rs || i == 0)) _mm_prefetch(reinterpret_cast<const char*>(epi.x + i * epi.rs + 16 * j), _MM_HINT_T0);
      __m512 bv[NR];
      for (int jj = 0; jj < NR; ++jj) bv[jj] = _mm512_loadu_ps(bp + 16 * jj);
      for (int ii = 0; ii < MR; ++ii) {
        const __m512 av = _mm512_set1_ps(ACOLS ? a[(k - plain) * acs + ii] : ap[ii][k]);
        for (int jj = 0; jj < NR; ++jj) acc[ii][jj] = _mm512_fmadd_ps(av, bv[jj], acc[ii][jj]);
      }
    }
  if constexpr (EPI)
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) {
        const float* src = epi.x + i * epi.rs + 16 * j;  // (past N: not read)
        const __m512 x = j + 1 < NR ? _mm512_loadu_ps(src) : _mm512_maskz_loadu_ps(tail, src);
        acc[i][j] = epi.op == Problem::Epi::Mul ? _mm512_mul_ps(acc[i][j], x) : _mm512_add_ps(acc[i][j], x);
      }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      float* dst = c + i * ldc + 16 * j;
      if (j + 1 < NR || last == 16) _mm512_storeu_ps(dst, acc[i][j]);  // (a masked store is slow here)
      else _mm512_mask_storeu_ps(dst, tail, acc[i][j]);
    }
}

template <bool ACOLS, bool EPI, int MR, int... NR>
constexpr std::array<Tile, kNR> row_of(std::integer_sequence<int, NR...>) {
  return {tile<MR, NR + 1, ACOLS, EPI>...};
}
template <bool ACOLS, bool EPI, int... MR>
constexpr std::array<std::array<Tile, kNR>, kMR> table(std::integer_sequence<int, MR...>) {
  return {row_of<ACOLS, EPI, MR + 1>(std::make_integer_sequence<int, kNR>())...};
}
// [A stored by columns][with an epilogue][rows - 1][vectors - 1]
using TileTable = std::array<std::array<Tile, kNR>, kMR>;
constexpr std::array<std::array<TileTable, 2>, 2> kTiles{
    {{table<false, false>(std::make_integer_sequence<int, kMR>()), table<false, true>(std::make_integer_sequence<int, kMR>())},
     {table<true, false>(std::make_integer_sequence<int, kMR>()), table<true, true>(std::make_integer_sequence<int, kMR>())}}};

int64_t panels(int64_t N) { return (N + kW - 1) / kW; }
// The epilogue of the tile whose first element is row i0 (counted over the batch's matrices
// stacked) and column j0.
TileEpi tile_epi(const Problem& p, int64_t i0, int64_t j0) {
  if (p.epi == Problem::Epi::None) return {};
  return {p.epi, p.x + i0 * p.x_rs + j0, p.x_rs};
}
// Padded width of panel q (its row length in the packed buffer).
int64_t panel_width(int64_t N, int64_t q) { return (std::min(kW, N - q * kW) + 15) / 16 * 16; }

// Panel q of batch element bi's B over depths [k0, k0 + kc) (all K by default), at out (kc rows
// of panel_width floats).
void pack_panel(const Problem& p, int64_t bi, int64_t q, float* out, int64_t k0 = 0, int64_t kc = -1) {
  const int64_t j0 = q * kW, w = std::min(kW, p.N - j0), wp = panel_width(p.N, q);
  const float* b = p.b + (p.b_off ? p.b_off[bi] : 0);
  if (kc < 0) kc = p.K;
  if (p.bcs == 1) {
    for (int64_t k = 0; k < kc; ++k) {
      float* row = out + k * wp;
      std::memcpy(row, b + (k0 + k) * p.brs + j0, size_t(w) * sizeof(float));
      std::fill(row + w, row + wp, 0.0f);
    }
    return;
  }
  // B(k, j) = b[k + j * bcs]: the rows of B^T transposed.
  window_gemm::pack_transposed(b + j0 * p.bcs + k0, p.bcs, w, kc, out, wp);
}

// Rows [m0, m1) of an A stored transposed (A(i, k) at a[k * acs + i]) over kc depths, as tiles of
// kMR rows: tile t at out + t * (kMR * kc + 8), depth k's kMR values together, zeros past m1. Each
// depth is stored as 8 floats (its 6, then 2 that the next depth's store writes over, or the 8
// spare after the tile):
// AVX-512 stores under a mask are slow on this host (Zen 4), and they made dY^T X with M = 128
// three times slower than with A in rows.
__attribute__((target("avx512f,avx512vl"))) void pack_a(const float* a, int64_t acs, int64_t m0, int64_t m1, int64_t kc,
                                                         float* out) {
  // Depth by depth, so that each depth's rows are read as one run (a column stride of 2 KiB
  // maps a tile's depths to two L1 sets: tile by tile, dY^T X with M = 512 ran ~15% slower).
  static_assert(kMR <= 8);
  const __mmask8 last = __mmask8((1u << ((m1 - m0 - 1) % kMR + 1)) - 1);
  for (int64_t k = 0; k < kc; ++k) {
    const float* src = a + k * acs;
    float* dst = out + k * kMR;
    int64_t i0 = m0;
    for (; i0 + kMR < m1; i0 += kMR, dst += kMR * kc + 8) _mm256_storeu_ps(dst, _mm256_maskz_loadu_ps(0xFF >> (8 - kMR), src + i0));
    _mm256_storeu_ps(dst, _mm256_maskz_loadu_ps(last, src + i0));
  }
}

// Batch element bi's C rows [m0, m1) x columns [n0, n1) (n0 a multiple of kW) from its packed B
// (panel q at bp + q * kW * K), or (ldd > 0) from B in place, rows ldd apart. An A stored
// transposed (columns contiguous) is packed per K block
// as [row tile][depth][6 rows]: read in place, its rows' depths lie a column stride apart, often a
// power of two, whose lines share a few L1 sets (dY^T X with M = 512 ran at ~15% of the peak).
void block(const Problem& p, int64_t bi, const float* bp, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t ldd = 0) {
  const bool acols = p.ars == 1 && p.acs != 1;
  const auto& tiles_of = kTiles[acols ? 1 : 0];
  const float* a = p.a + (p.a_off ? p.a_off[bi] : 0);
  float* c = p.c + bi * p.M * p.N;
  thread_local std::vector<float, cpu::LineAligned<float>> apk;
  if (acols) apk.resize(std::max(apk.size(), size_t((m1 - m0 + kMR - 1) / kMR * (kMR * std::min(kKc, p.K) + 8))));
  for (int64_t k0 = 0; k0 < p.K; k0 += kKc) {
    const int64_t kc = std::min(kKc, p.K - k0);
    const bool load = p.accumulate || k0 > 0;
    if (acols) pack_a(a + k0 * p.acs, p.acs, m0, m1, kc, apk.data());
    for (int64_t q = n0 / kW; q * kW < n1; ++q) {
      const int64_t wp = panel_width(p.N, q), w = std::min(kW, p.N - q * kW), nr = wp / 16;
      const int last = int(w - 16 * (nr - 1));
      const float* panel = ldd ? bp + q * kW + k0 * ldd : bp + q * kW * p.K + k0 * wp;
      for (int64_t i0 = m0; i0 < m1; i0 += kMR) {
        const int64_t mr = std::min<int64_t>(kMR, m1 - i0);
        const TileEpi e = k0 + kc == p.K ? tile_epi(p, bi * p.M + i0, q * kW) : TileEpi{};
        const auto& tiles = tiles_of[e.op != Problem::Epi::None ? 1 : 0];
        if (acols)
          tiles[size_t(mr - 1)][size_t(nr - 1)](apk.data() + (i0 - m0) / kMR * (kMR * kc + 8), 1, kMR, panel, ldd ? ldd : wp, kc, c + i0 * p.N + q * kW, p.N,
                                                last, load, e);
        else
          tiles[size_t(mr - 1)][size_t(nr - 1)](a + i0 * p.ars + k0, p.ars, 1, panel, ldd ? ldd : wp, kc, c + i0 * p.N + q * kW, p.N, last,
                                                load, e);
      }
    }
  }
}

// A weight gradient's block (one matrix, A stored transposed: dY^T X, K = the tokens): C rows
// [m0, m1) x columns [n0, n1) (n0 a multiple of kW), with both operands packed per K block by the
// task itself into its thread's buffers: A as pack_a's tiles, B as panels of kc rows. Every
// depth a task reads lies in its own core's cache; with B packed once for all tasks and A per
// tile, half of what each task read had been written by the other core.
void local_block(const Problem& p, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  const auto& tiles_of = kTiles[1];
  thread_local std::vector<float, cpu::LineAligned<float>> apk, bpk;
  const int64_t kcm = std::min(kKc, p.K), q0 = n0 / kW, q1 = (n1 + kW - 1) / kW;
  apk.resize(std::max(apk.size(), size_t((m1 - m0 + kMR - 1) / kMR * (kMR * kcm + 8))));
  bpk.resize(std::max(bpk.size(), size_t((q1 - q0) * kW * kcm)));
  const float* a = p.a + (p.a_off ? p.a_off[0] : 0);
  for (int64_t k0 = 0; k0 < p.K; k0 += kKc) {
    const int64_t kc = std::min(kKc, p.K - k0);
    const bool load = p.accumulate || k0 > 0;
    pack_a(a + k0 * p.acs, p.acs, m0, m1, kc, apk.data());
    for (int64_t q = q0; q < q1; ++q) pack_panel(p, 0, q, bpk.data() + (q - q0) * kW * kc, k0, kc);
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t wp = panel_width(p.N, q), w = std::min(kW, p.N - q * kW), nr = wp / 16;
      const int last = int(w - 16 * (nr - 1));
      const float* panel = bpk.data() + (q - q0) * kW * kc;
      for (int64_t i0 = m0; i0 < m1; i0 += kMR) {
        const int64_t mr = std::min<int64_t>(kMR, m1 - i0);
        const TileEpi e = k0 + kc == p.K ? tile_epi(p, i0, q * kW) : TileEpi{};
        tiles_of[e.op != Problem::Epi::None ? 1 : 0][size_t(mr - 1)][size_t(nr - 1)](
            apk.data() + (i0 - m0) / kMR * (kMR * kc + 8), 1, kMR, panel, wp, kc, p.c + i0 * p.N + q * kW, p.N, last, load, e);
      }
    }
  }
}

// One matrix with A stored transposed: blocks of at most kWgRows rows x kWgCols columns, each
// one task packing its own operands (local_block), their count split further (the larger side
// first) until it is even, so that two threads get equal work: the benchmark GPT's weight
// gradients (K = 1,024) are 2 blocks (M = 128 x N = 128; 114 x 128; 384 x 128) or 4 (512 x 128;
// 128 x 512 in 2 of 256 columns). Measured on those products (bench_f32_gemm --only "dY^T", two
// threads, GFLOP/s): 192 rows 207 for qkv against 200 in 4 blocks of 96; 256 columns 198-202
// for mlp.proj against 185-196 in 128; K blocks of 128 2-10% slower than 256, 384 within noise.
// Fixed by the shape alone; every C element sums its K in the same order as in `block`.
constexpr int64_t kWgRows = 192, kWgCols = 256;
void weight_gradient(const Problem& p, TileDone done, void* ctx) {
  const int64_t np = panels(p.N);
  int64_t rb = (p.M + kWgRows - 1) / kWgRows, cb = (p.N + kWgCols - 1) / kWgCols;
  while ((rb * cb) % 2 != 0) {
    const int64_t rows = (p.M + rb - 1) / rb, cols = (np + cb - 1) / cb * kW;
    if (rows >= cols && rows > kMR) ++rb;
    else if (cb < np) ++cb;
    else if (rows > kMR) ++rb;
    else break;  // one tile: nothing to split
  }
  const int64_t rows = ((p.M + rb - 1) / rb + kMR - 1) / kMR * kMR, cols = (np + cb - 1) / cb;
  const int64_t mt = (p.M + rows - 1) / rows, nt = (np + cols - 1) / cols;
#pragma omp parallel for schedule(dynamic, 1) if (mt * nt > 1)
  for (int64_t t = 0; t < mt * nt; ++t) {
    const int64_t m0 = t / nt * rows, m1 = std::min(p.M, m0 + rows);
    const int64_t n0 = t % nt * cols * kW, n1 = std::min(p.N, n0 + cols * kW);
    local_block(p, m0, m1, n0, n1);
    if (done) done(ctx, 0, m0, m1, n0, n1);
  }
}

}  // namespace

void gemm(const Problem& p, TileDone done, void* ctx) {
  if (p.batch * p.M * p.N == 0) return;
  const int64_t np = panels(p.N), psize = np * kW * p.K;  // one batch element's packed B
  if (p.batch > 1) {
    // Batched (attention's per-head products): one task per batch element and row block of up
    // to 128 rows, each packing its element's B into its own buffer, or reading it in place
    // where its rows are dense vectors (N and the row stride multiples of 16: P V at one thread
    // went from 96 to 102 GFLOP/s, still short of OpenBLAS's 111, so the rule keeps N <= 32 there).
    const int64_t mb = (p.M + 127) / 128, rows = (p.M + mb - 1) / mb;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t t = 0; t < p.batch * mb; ++t) {
      const int64_t bi = t / mb, m0 = t % mb * rows, m1 = std::min(p.M, m0 + rows);
      thread_local std::vector<float, cpu::LineAligned<float>> buf;
      buf.resize(std::max(buf.size(), size_t(psize)));
      if (p.bcs == 1 && p.N % 16 == 0 && p.brs % 16 == 0) {
        block(p, bi, p.b + (p.b_off ? p.b_off[bi] : 0), m0, m1, 0, p.N, p.brs);
      } else {
        for (int64_t q = 0; q < np; ++q) pack_panel(p, bi, q, buf.data() + q * kW * p.K);
        block(p, bi, buf.data(), m0, m1, 0, p.N);
      }
      if (done) done(ctx, bi, m0, m1, 0, p.N);
    }
    return;
  }
  if (p.ars == 1 && p.acs != 1) return weight_gradient(p, done, ctx);
  // One matrix: B packed once (a task per panel), then tiles of rows x panels, fixed by the shape
  // alone, dynamically scheduled: a tile's K runs in one task, so which thread takes it changes
  // nothing. From 48 rows x all panels, the panels are halved while a tile has more than 2 (128
  // columns) and there are fewer than 32 tiles; then rows (down to the register tile's), then
  // panels, while there are fewer than 8. The benchmark GPT's products (M = 1,024): N = 128 as
  // 22 tasks of 48 rows x 128 columns, each thread reading its A rows once; N = 384 and 512 as
  // 44 tasks of 48 rows x 192 or 256. Splitting panels first down to 32 tasks for every N (44
  // tasks of 48 x 64 for N = 128: both threads read every A row) ran the N = 128 Steps slower on
  // 2 threads, and 22 tasks for every N ran the N = 512 ones slower (per-Step profiles,
  // alternated: docs/architecture.md, "Epilogue prefetch and the one-matrix grid").
  // Every float a tile reads is written by pack_panel (zeros past N included): not zeroed first.
  float* const bp = cpu::launch_buffer<struct PackedB, float>(static_cast<size_t>(psize));
  int64_t rows = 8 * kMR, cols = np;  // panels per tile
  auto count = [&] { return (p.M + rows - 1) / rows * ((np + cols - 1) / cols); };
  while (count() < 32 && cols > 2) cols = (cols + 1) / 2;
  while (count() < 8 && (cols > 1 || rows > kMR)) {
    if (rows > kMR) rows = std::max<int64_t>(kMR, rows / 2 / kMR * kMR);
    else cols = (cols + 1) / 2;
  }
  const int64_t mt = (p.M + rows - 1) / rows, nt = (np + cols - 1) / cols;
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t q = 0; q < np; ++q) pack_panel(p, 0, q, bp + q * kW * p.K);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < mt * nt; ++t) {
      const int64_t m0 = t / nt * rows, m1 = std::min(p.M, m0 + rows);
      const int64_t n0 = t % nt * cols * kW, n1 = std::min(p.N, n0 + cols * kW);
      block(p, 0, bp, m0, m1, n0, n1);
      if (done) done(ctx, 0, m0, m1, n0, n1);
    }
  }
}
#else
void gemm(const Problem&, TileDone, void*) {}
#endif

}  // namespace tessera::backends::f32_gemm
