// Gemm Steps: C = A @ B per batch element through OpenBLAS on the operands' own strides (operands
// it cannot address packed per block or as a whole), through window_gemm for a float32 product
// whose B is a conv's window read in place, or through f32_gemm (the project's own packed-panel
// kernel) for a float32 product its measured rule chooses; then the Step's epilogue on each block
// while it is in cache, through its native loop where it has one.
#include <cblas.h>
#include <omp.h>

#include <atomic>
#include <optional>

#include "backends/cpu/bf16_gemm.h"
#include "backends/cpu/copies.h"
#include "backends/cpu/f32_gemm.h"
#include "backends/cpu/interpreter.h"
#include "backends/cpu/kernel.h"
#include "backends/cpu/native_loops.h"
#include "backends/cpu/window_gemm.h"
#include "core/half.h"

namespace tessera::backends::cpu {
namespace {

std::atomic<uint64_t> register_epilogues{0};  // once per launch, on the launching thread

// A float32 Gemm Step whose B (a conv's im2col window) window_gemm reads in place: per batch
// element, B's offset and which of A's distinct matrices it multiplies (at a_off, rows a_rs
// apart, columns a_cs); B's element (k, n) of a batch lies k_off[k] + n_off[n] further.
// `lanes`: a shallow product (K < 32) computed with the positions as vector lanes
// (window_gemm::lanes_product), over pieces of at most 16 consecutive positions made of at most
// two runs that each lie densely in B (a piece's first position, length, the first run's length,
// and where the second run lies: window_gemm's off1).
struct Window {
  std::vector<int64_t> b_off, a_off, k_off, n_off;
  std::vector<int> a_of;
  int64_t a_rs = 0, a_cs = 0;
  bool lanes = false;
  struct Piece { int64_t at, len, split, off1; };
  std::vector<Piece> pieces;
};

// A float32 epilogue that is one Add or Mul of the product with one operand whose element for
// C(i, j) lies at offset + i * rs + j (rows counted over the batch; rs 0: a bias), which
// f32_gemm applies in registers as each tile is stored (f32_gemm::Problem::epi).
struct RegisterEpilogue {
  f32_gemm::Problem::Epi op = f32_gemm::Problem::Epi::None;
  int input = -1;  // the operand's index in Step::inputs
  int64_t offset = 0, rs = 0;
};

struct GemmKernel final : CpuKernel {
  RegPlan regs;         // the epilogue's, for the interpreter
  NativeLoop epilogue;  // a float32 epilogue's native loop, over its loads' domain, its result in place
  RegisterEpilogue in_registers;
  std::optional<Window> window;
  void run(const Step& st, const LaunchArgs& args) const override;
};

// C[m, n] = op(A)[m, k] @ op(B)[k, n] (+ C[m, n] when `add`) through the BLAS, row-major, R float
// or double.
template <class R>
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const R* a, int64_t lda, const R* b, int64_t ldb, R* c,
               int64_t ldc, bool add = false) {
  auto oa = ta ? CblasTrans : CblasNoTrans, ob = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<R, float>) cblas_sgemm(CblasRowMajor, oa, ob, m, n, k, 1.0f, a, lda, b, ldb, add ? 1.0f : 0.0f, c, ldc);
  else cblas_dgemm(CblasRowMajor, oa, ob, m, n, k, 1.0, a, lda, b, ldb, add ? 1.0 : 0.0, c, ldc);
}

// An accumulating Step (Step::accumulate) through a kernel that stores its product rather than
// adding it (the lanes form, vdpbf16ps): the rows x cols block at c (rows ldc apart) is saved in
// this thread's buffer before the product overwrites it, and added back after. The buffer holds
// one block (at most 128 rows, or M x 16), never the whole output.
class PriorBlock {
 public:
  PriorBlock(bool on, float* c, int64_t rows, int64_t cols, int64_t ldc) : c_(on ? c : nullptr), rows_(rows), cols_(cols), ldc_(ldc) {
    if (!c_) return;
    buf().resize(std::max(buf().size(), size_t(rows * cols)));
    for (int64_t i = 0; i < rows; ++i) std::copy(c + i * ldc, c + i * ldc + cols, buf().data() + i * cols);
  }
  void add() const {
    if (!c_) return;
    const float* p = buf().data();
    for (int64_t i = 0; i < rows_; ++i)
      for (int64_t j = 0; j < cols_; ++j) c_[i * ldc_ + j] += p[i * cols_ + j];
  }

 private:
  static std::vector<float, LineAligned<float>>& buf() {
    thread_local std::vector<float, LineAligned<float>> b;
    return b;
  }
  float* c_;
  int64_t rows_, cols_, ldc_;
};

// One operand of a matmul as BLAS sees it. One that is not BLAS-addressable (an im2col window,
// a stacked map) is packed densely: per_block (a floating product over several batches), block
// by block inside the task that multiplies it (see pack_rows), so a conv's columns are written
// into the cache of the core that reads them rather than through a buffer of the whole batch;
// otherwise as a whole.
struct GemmOperand {
  std::vector<int64_t> batch_strides;
  int64_t offset = 0, ld = 0;
  bool trans = false;
  const void* data = nullptr;
  const kir::IndexMap* pack = nullptr;  // packed per block from this map
  std::vector<char> packed;              // packed as a whole
};

GemmOperand gemm_operand(const kir::IndexMap& m, const void* data, DType t, bool per_block) {
  GemmOperand g;
  const Shape& s = m.shape();
  size_t r = s.size();
  int64_t rows = s[r - 2], cols = s[r - 1];
  g.data = data;
  if (m.single()) {
    const kir::View& v = m.views[0];
    const int64_t sr = v.strides[r - 2], sc = v.strides[r - 1];
    g.batch_strides.assign(v.strides.begin(), v.strides.end() - 2);
    g.offset = v.offset;
    if ((sc == 1 || cols <= 1) && (sr >= std::max<int64_t>(cols, 1) || rows <= 1)) {
      g.ld = rows <= 1 ? std::max<int64_t>(cols, 1) : sr;
      return g;
    }
    if ((sr == 1 || rows <= 1) && (sc >= std::max<int64_t>(rows, 1) || cols <= 1)) {
      g.trans = true;
      g.ld = cols <= 1 ? std::max<int64_t>(rows, 1) : sc;
      return g;
    }
  }
  g.ld = std::max<int64_t>(cols, 1);
  g.offset = 0;
  g.batch_strides = contiguous_strides(Shape(s.begin(), s.end() - 2));
  for (auto& b : g.batch_strides) b *= rows * cols;
  if (per_block) {
    g.pack = &m;
    return g;
  }
  g.packed.resize(size_t(numel(s)) * itemsize(t));
  copy_map(m, data, g.packed.data(), itemsize(t));
  g.data = g.packed.data();
  return g;
}

// Rows [r0, r1) of batch b of an operand packed per block, densely into this thread's buffer for
// operand `which` (0: A, 1: B).
const void* pack_rows(const GemmOperand& g, int which, int64_t b, int64_t r0, int64_t r1, size_t elem) {
  thread_local std::vector<char, LineAligned<char>> bufs[2];
  std::vector<char, LineAligned<char>>& buf = bufs[which];
  const Shape& s = g.pack->shape();
  const int64_t cols = s.back();
  buf.resize(std::max(buf.size(), size_t((r1 - r0) * cols) * elem));
  copy_positions(*g.pack, g.data, (b * s[s.size() - 2] + r0) * cols, (r1 - r0) * cols, buf.data(), elem);
  return buf.data();
}

// c[e] = part[e] + part[n + e] + ... + part[(chunks - 1) * n + e], added in that order, for e < n
// (with `add`: c[e] + part[e] + ...): split-K partial products summed. Blocks of e take every
// chunk in turn, so each chunk is read in runs (the chunks lie a multiple of 4 KiB apart, whose
// same elements share an L1 set).
template <class R>
void sum_partials(const R* part, int64_t chunks, int64_t n, R* c, bool add) {
  constexpr int64_t kRun = 1024;
#pragma omp parallel for schedule(static) if (n * chunks >= kParallelMin)
  for (int64_t e0 = 0; e0 < n; e0 += kRun) {
    const int64_t e1 = std::min(n, e0 + kRun);
    if (add)
      for (int64_t e = e0; e < e1; ++e) c[e] += part[e];
    else
      std::copy(part + e0, part + e1, c + e0);
    for (int64_t q = 1; q < chunks; ++q)
      for (int64_t e = e0; e < e1; ++e) c[e] += part[q * n + e];
  }
}

// Element offsets of map m over [batch..., R, C] that split as batch[b] + row[r] + col[c]: a
// single unmasked view, or a plain reshape of one whose dims group into the domain's (a conv's
// window [B, G, F, kh, kw, oh, ow] read as [B, G, F * kh * kw, oh * ow]). False otherwise.
bool split_offsets(const kir::IndexMap& m, std::vector<int64_t>& batch, std::vector<int64_t>& row, std::vector<int64_t>& col) {
  const kir::View& v = m.views[0];
  if (v.masked() || m.views.size() > 2) return false;
  if (m.views.size() == 2) {
    const kir::View& top = m.views[1];
    if (top.masked() || top.offset != 0 || top.strides != contiguous_strides(top.shape)) return false;
  }
  const Shape& dom = m.shape();
  const size_t r = dom.size();
  if (r < 2) return false;
  // Per domain dim, the offsets of its indices: the view dims it groups, walked row-major.
  std::vector<std::vector<int64_t>> offs(r);
  size_t p = 0;
  for (size_t d = 0; d < r; ++d) {
    std::vector<int64_t>& o = offs[d];
    o = {0};
    int64_t ext = 1;
    while (ext < dom[d] && p < v.shape.size()) {
      std::vector<int64_t> next;
      next.reserve(o.size() * size_t(v.shape[p]));
      for (int64_t base : o)
        for (int64_t i = 0; i < v.shape[p]; ++i) next.push_back(base + i * v.strides[p]);
      o = std::move(next);
      ext *= v.shape[p++];
    }
    if (ext != dom[d]) return false;
  }
  for (; p < v.shape.size(); ++p)
    if (v.shape[p] != 1) return false;
  batch = {v.offset};
  for (size_t d = 0; d + 2 < r; ++d) {
    std::vector<int64_t> next;
    for (int64_t base : batch)
      for (int64_t o : offs[d]) next.push_back(base + o);
    batch = std::move(next);
  }
  row = std::move(offs[r - 2]);
  col = std::move(offs[r - 1]);
  return true;
}

// The Window plan of a float32 Gemm Step whose B is a window read in place (window_gemm), or
// none: B already dense (the BLAS reads it as it is), or A not a single view. A product shallower
// than the tile pays for (K < 32: a conv over one or a few channels) takes the lanes form where
// its positions lie in runs of at least 8 on average (a stride-1 conv's output rows); else the
// BLAS.
std::optional<Window> window_plan(const Step& st) {
  if (!window_gemm::available() || st.dtype != DType::Float32 || st.maps[1].single() || !st.out_strides.empty()) return std::nullopt;
  for (DType t : st.input_dtypes)
    if (t != DType::Float32) return std::nullopt;
  const size_t r = st.shape.size();
  const kir::IndexMap& am = st.maps[0];
  const int64_t K = am.shape()[r - 1];
  if (!am.single()) return std::nullopt;
  Window w;
  if (!split_offsets(st.maps[1], w.b_off, w.k_off, w.n_off)) return std::nullopt;
  if (K < 32) {
    const int64_t n = int64_t(w.n_off.size());
    auto run = [&](int64_t j, int64_t most) {  // positions from j on that lie densely, at most `most`
      int64_t len = 1;
      while (j + len < n && len < most && w.n_off[size_t(j + len)] == w.n_off[size_t(j)] + len) ++len;
      return len;
    };
    for (int64_t j = 0; j < n;) {
      const int64_t a = run(j, 16), b = j + a < n && a < 16 ? run(j + a, 16 - a) : 0;
      w.pieces.push_back({j, a + b, a, b ? w.n_off[size_t(j + a)] - w.n_off[size_t(j)] - a : 0});
      j += a + b;
    }
    if (int64_t(w.pieces.size()) * 8 > n) return std::nullopt;  // pieces of 8 positions or more, on average
    w.lanes = true;
  }
  std::vector<int64_t> rows, cols;
  split_offsets(am, w.a_off, rows, cols);
  const kir::View& av = am.views[0];
  w.a_rs = av.strides[r - 2], w.a_cs = av.strides[r - 1];
  // A's distinct matrices (one, or one per group; the batch broadcasts it).
  std::vector<int64_t> distinct;
  for (int64_t o : w.a_off) {
    auto it = std::find(distinct.begin(), distinct.end(), o);
    w.a_of.push_back(int(it - distinct.begin()));
    if (it == distinct.end()) distinct.push_back(o);
  }
  w.a_off = std::move(distinct);
  return w;
}

// One launch of a Gemm Step: the product's shape and the epilogue over its blocks. Results do not
// depend on the thread count: every split below is fixed by the shape alone.
class GemmLaunch {
 public:
  GemmLaunch(const GemmKernel& k, const Step& st, const LaunchArgs& args)
      : k_(k), st_(st), args_(args), r_(st.shape.size()), M_(st.shape[r_ - 2]), N_(st.shape[r_ - 1]),
        K_(st.maps[0].shape()[r_ - 1]), batch_(st.shape.begin(), st.shape.end() - 2), nb_(numel(batch_)),
        out_(static_cast<char*>(args.slots[st.output])), elem_(itemsize(st.dtype)) {}

  void run() {
    if (M_ * N_ == 0) return;
    epi_in_ = inputs_of(st_, args_);
    loop_ = loop_for(k_.epilogue, st_.program, st_, epi_in_, args_, base_);
    if (K_ == 0) {
      for (int64_t b = 0, ldc = 0; b < nb_ && !st_.accumulate; ++b)  // (strided C: only its own rows of the slot)
        for (int64_t i = 0; i < M_; ++i) std::memset(c_at(b, &ldc) + size_t(i * ldc) * elem_, 0, size_t(N_) * elem_);
      for (int64_t b = 0; b < nb_; ++b) epilogue(b, 0, M_, 0, N_);
      return;
    }
    if (k_.window) return window_product();
    if (compute_dtype(st_.input_dtypes[0]) != st_.input_dtypes[0]) return half_product();
    if (own_product()) return;
    blas_product();
  }

 private:
  // The epilogue over rows [m0, m1) and columns [n0, n1) of batch b, while they are in cache: its
  // loads of the output slot read the product. Blocks of whole rows are one range.
  void epilogue(int64_t b, int64_t m0, int64_t m1, int64_t n0, int64_t n1) const {
    if (st_.program.empty()) return;
    if (n0 == 0 && n1 == N_) return epilogue_range(b * M_ * N_ + m0 * N_, b * M_ * N_ + m1 * N_);
    const int64_t p = b * M_ * N_ + m0 * N_ + n0;
    if (loop_) return loop_rows(k_.epilogue, base_, p, n1 - n0, m1 - m0, N_, reinterpret_cast<float*>(base_.back()) + p);
    for (int64_t i = m0; i < m1; ++i) epilogue_range(b * M_ * N_ + i * N_ + n0, b * M_ * N_ + i * N_ + n1);
  }
  // Output positions [p, e): through the epilogue's native loop where it has one.
  void epilogue_range(int64_t p, int64_t e) const {
    if (loop_) return loop_range(k_.epilogue, base_, p, e - p, reinterpret_cast<float*>(base_.back()) + p);
    Scratch& sc = scratch(st_.program.size(), size_t(k_.regs.nregs));
    for (; p < e; p += kTile) {
      int64_t n = std::min(kTile, e - p);
      run_program(st_.program, k_.regs, epi_in_, st_.shape, p, n, args_, sc);
      store_tile(st_, out_, p, n, sc);
    }
  }

  // Batch element b's C and its row stride: dense, or through Step::out_strides from
  // Step::out_offset (the lowering gives such strides, columns contiguous, to floating products
  // without an epilogue: a permuted reader's layout, or a part of a concatenation's slot).
  char* c_at(int64_t b, int64_t* ldc) const {
    if (st_.out_strides.empty()) {
      *ldc = N_;
      return out_ + size_t(b * M_ * N_) * elem_;
    }
    int64_t idx[32];
    unravel(b, batch_, idx);
    int64_t co = st_.out_offset;
    for (size_t d = 0; d < batch_.size(); ++d) co += idx[d] * st_.out_strides[d];
    *ldc = st_.out_strides[r_ - 2];
    return out_ + size_t(co) * elem_;
  }

  // ---- The window kernel ----
  // Each batch element's product is computed transposed (its positions as rows, M as vector
  // columns, A^T packed as [K, M rounded up to 16] with zeros past M) and stored into [M, N].
  void window_product() {
    if (k_.window->lanes) return lanes_product();
    mp_ = (M_ + 15) / 16 * 16;
    // Deep products over fewer than 8 batch elements (a conv's kernel gradient: K = batch x
    // positions): K in chunks of equal depth whose partial products are summed in chunk order,
    // each chunk's A^T packed by the task that multiplies it. Chunks: a multiple of 4 (even work
    // for 1, 2 or 4 threads), about 1,024 deep. (The small CNN's conv2 kernel gradient, K =
    // 12,544, in 16 chunks: 2.2 ms standalone against 2.9 in 25 chunks of 504, 2.4 in 13 of 968.)
    constexpr int64_t kDepth = 1024, kMaxPartial = int64_t(1) << 22;
    const int64_t deep = (K_ + kDepth - 1) / kDepth, nk = deep > 1 ? (deep + 3) / 4 * 4 : 1;
    if (nb_ < 8 && nk > 1 && nk * nb_ * M_ * N_ <= kMaxPartial) return window_split_k(nk);
    window_batches();
  }

  // The shallow form: each distinct A packed transposed ([K, M]), then per batch element its
  // runs of positions, and the epilogue over the element while it is in cache.
  void lanes_product() const {
    const Window& w = *k_.window;
    const int64_t na = int64_t(w.a_off.size());
    std::vector<float> ad(size_t(na * M_ * K_));
    const float* as = static_cast<const float*>(args_.slots[st_.inputs[0]]);
    for (int64_t d = 0; d < na; ++d)
      for (int64_t q = 0; q < K_; ++q)
        for (int64_t i = 0; i < M_; ++i) ad[size_t((d * K_ + q) * M_ + i)] = as[w.a_off[size_t(d)] + i * w.a_rs + q * w.a_cs];
    const float* bm = static_cast<const float*>(args_.slots[st_.inputs[1]]);
    float* c = reinterpret_cast<float*>(out_);
    const int64_t np = int64_t(w.pieces.size());
#pragma omp parallel for schedule(static) if (nb_ * M_ * N_ * K_ >= kParallelMin)
    for (int64_t b = 0; b < nb_; ++b) {
      const float* a = ad.data() + w.a_of[size_t(b)] * M_ * K_;
      const float* x = bm + w.b_off[size_t(b)];
      for (int64_t q = 0; q < np; ++q) {
        const Window::Piece& pc = w.pieces[size_t(q)];
        PriorBlock prior(st_.accumulate, c + b * M_ * N_ + pc.at, M_, pc.len, N_);
        window_gemm::lanes_product(x + w.n_off[size_t(pc.at)], pc.split, pc.off1, w.k_off.data(), K_, a, M_, M_, pc.len,
                                   c + b * M_ * N_ + pc.at, N_);
        prior.add();
      }
      epilogue(b, 0, M_, 0, N_);
    }
  }

  // A^T rows [k0, k1) of distinct A d into at.
  void pack_at(float* at, int64_t d, int64_t k0, int64_t k1) const {
    const Window& w = *k_.window;
    const float* ab = static_cast<const float*>(args_.slots[st_.inputs[0]]) + w.a_off[size_t(d)];
    if (w.a_cs == 1) return window_gemm::pack_transposed(ab + k0, w.a_rs, M_, k1 - k0, at, mp_);
    for (int64_t q = k0; q < k1; ++q) {
      float* row = at + (q - k0) * mp_;
      for (int64_t i = 0; i < M_; ++i) row[i] = ab[i * w.a_rs + q * w.a_cs];
      std::fill(row + M_, row + mp_, 0.0f);
    }
  }

  // Columns [n0, n1) of batch b's product over depths [k0, k1), into dst ([M, N]; added to it with `add`).
  void window_tile(const float* at, int64_t b, int64_t n0, int64_t n1, int64_t k0, int64_t k1, float* dst, bool add) const {
    const Window& w = *k_.window;
    const float* bm = static_cast<const float*>(args_.slots[st_.inputs[1]]);
    window_gemm::product(bm + w.b_off[size_t(b)], w.n_off.data() + n0, n1 - n0, w.k_off.data() + k0, k1 - k0, at, mp_, M_,
                         dst + n0, N_, true, add);
  }

  void window_split_k(int64_t nk) const {
    const Window& w = *k_.window;
    const int64_t depth = ((K_ + nk - 1) / nk + 7) / 8 * 8, chunks = (K_ + depth - 1) / depth;
    std::vector<float> part(size_t(chunks * nb_ * M_ * N_));
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < nb_ * chunks; ++t) {
      const int64_t b = t / chunks, q = t % chunks, k0 = q * depth, k1 = std::min(K_, k0 + depth);
      thread_local std::vector<float, LineAligned<float>> at;
      at.resize(size_t(depth * mp_));
      pack_at(at.data(), w.a_of[size_t(b)], k0, k1);
      window_tile(at.data(), b, 0, N_, k0, k1, part.data() + (q * nb_ + b) * M_ * N_, false);
    }
    sum_partials(part.data(), chunks, nb_ * M_ * N_, reinterpret_cast<float*>(out_), st_.accumulate);
    for (int64_t b = 0; b < nb_; ++b) epilogue(b, 0, M_, 0, N_);
  }

  // A^T packed once per distinct A; tasks per batch element (N in chunks when the batch is small).
  void window_batches() const {
    const Window& w = *k_.window;
    const int64_t na = int64_t(w.a_off.size());
    // pack_at writes every row up to mp_ (zeros past M): the thread's buffer is reused as it is.
    float* const at = launch_buffer<struct WindowAT, float>(size_t(na * K_ * mp_));
    for (int64_t d = 0; d < na; ++d) pack_at(at + d * K_ * mp_, d, 0, K_);
    constexpr int64_t kChunk = 240;
    const int64_t nch = nb_ >= 2 * int64_t(omp_get_max_threads()) ? 1 : (N_ + kChunk - 1) / kChunk;
    const int64_t len = (N_ + nch - 1) / nch;
    float* c = reinterpret_cast<float*>(out_);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < nb_ * nch; ++t) {
      const int64_t b = t / nch, n0 = t % nch * len, n1 = std::min(N_, n0 + len);
      window_tile(at + w.a_of[size_t(b)] * K_ * mp_, b, n0, n1, 0, K_, c + b * M_ * N_, st_.accumulate);
      epilogue(b, 0, M_, n0, n1);
    }
  }

  // ---- 16-bit float operands (autocast's products): float32 results ----
  // bfloat16 on AVX512-BF16 through bf16_gemm (vdpbf16ps); otherwise (float16, or no such
  // instructions) the operands are converted to float32 for the BLAS. B is prepared once per batch
  // element (packed in pairs of depths, or converted) -- by the element's own task where each
  // element is one row block (`local`, below) --, then tasks of 128-row blocks (and column blocks,
  // for few rows) read it; A stored by columns is packed once per element as pairs of depths
  // (bf16), other A rows are prepared by each task unless bf16_gemm reads them in place.
  void half_product() {
    const DType t = st_.input_dtypes[0];
    const bool dot = t == DType::BFloat16 && bf16_gemm::available();
    // A float32 operand read rounded (Step::rounded: a cast folded in) is rounded as it is packed:
    // B always, A by rows or by columns; any other (or no vdpbf16ps) is rounded whole first.
    ra_ = (st_.rounded & 1) != 0, rb_ = (st_.rounded & 2) != 0;
    a_ = gemm_operand(st_.maps[0], args_.slots[st_.inputs[0]], ra_ ? DType::Float32 : t, false);
    b_ = gemm_operand(st_.maps[1], args_.slots[st_.inputs[1]], rb_ ? DType::Float32 : t, false);
    if (ra_ && (!dot || !a_.packed.empty())) a_ = rounded_whole(st_.maps[0], args_.slots[st_.inputs[0]]), ra_ = false;
    if (rb_ && (!dot || !b_.packed.empty())) b_ = rounded_whole(st_.maps[1], args_.slots[st_.inputs[1]]), rb_ = false;
    const int64_t P = (K_ + 1) / 2, ncb = (N_ + 15) / 16, bsize = dot ? bf16_gemm::packed_size(K_, N_) : K_ * N_;
    // Few row blocks in all (a weight gradient: M = 128..512, K = the tokens) also split the
    // columns, in multiples of 16, so that both threads work: into 4 tasks, or 2 per row block
    // where there are 3 or 5 (3 tasks left one thread running two: the qkv weight gradient
    // dY^T X, 384 x 128); fixed by the shape alone.
    const int64_t mb = (M_ + kBlock - 1) / kBlock, rb = nb_ * mb;
    const int64_t nbk = std::min<int64_t>(rb > 1 && rb < 6 && rb % 2 ? 2 : rb < 4 ? 4 / rb : 1, ncb);
    const int64_t cw = (ncb + nbk - 1) / nbk * 16, per = mb * nbk;
    // Batched products of one row block per element (attention's, 64 x 64 x 32 and the like)
    // under vdpbf16ps: each element's task packs its own B (and A by columns) into its thread's
    // buffers and multiplies from there at once, one parallel region instead of three (the
    // packing loops' barriers cost more than these products' arithmetic saves).
    const bool local = dot && nb_ >= 4 && mb == 1;
    // Packed B and A pairs: the packing loops write every element the products read (zeros past
    // N and K included), so the launching thread's buffers are reused as they are.
    uint16_t* const bh = dot && !local ? launch_buffer<struct HalfB, uint16_t>(size_t(nb_ * bsize)) : nullptr;
    std::vector<float, LineAligned<float>> bf(dot ? 0 : size_t(nb_ * bsize));
#pragma omp parallel for schedule(static) if (!local && nb_ * K_ * N_ >= kParallelMin)
    for (int64_t t2 = 0; t2 < (local ? 0 : nb_ * ncb); ++t2) {
      const int64_t b = t2 / ncb, n0 = t2 % ncb * 16, w = std::min<int64_t>(16, N_ - n0);
      const int64_t rs = b_.trans ? 1 : b_.ld, cs = b_.trans ? b_.ld : 1;
      if (rb_) {
        bf16_gemm::pack_b_f32(f32_at(b_, b) + (b_.trans ? n0 * b_.ld : n0), rs, cs, K_, w, bh + b * bsize + n0 * 2 * P);
        continue;
      }
      const uint16_t* src = half_at(b_, b) + (b_.trans ? n0 * b_.ld : n0);
      if (dot) {
        bf16_gemm::pack_b(src, rs, cs, K_, w, bh + b * bsize + n0 * 2 * P);
        continue;
      }
      float* dst = bf.data() + b * bsize + n0;
      for (int64_t k = 0; k < K_; ++k)
        for (int64_t j = 0; j < w; ++j) dst[k * N_ + j] = to_float(t, src[k * rs + j * cs]);
    }
    // A stored by columns (dY^T of a weight gradient, P^T and dS^T in attention's backward) under
    // vdpbf16ps: packed once per batch element as pairs of depths (bf16_gemm::pack_a_pairs, in
    // chunks of 64 pairs), which the tasks read at their rows; per task with pack_a it was read
    // one element per column stride, by every column task again.
    const int64_t pchunks = (P + 63) / 64;
    const bool pairs = dot && a_.trans;
    uint32_t* const apr = pairs && !local ? launch_buffer<struct HalfAPairs, uint32_t>(size_t(nb_ * P * M_)) : nullptr;
    if (pairs && !local) {
#pragma omp parallel for schedule(static) if (nb_ * K_ * M_ >= kParallelMin)
      for (int64_t t2 = 0; t2 < nb_ * pchunks; ++t2) {
        const int64_t b = t2 / pchunks, p0 = t2 % pchunks * 64, k0 = 2 * p0, k1 = std::min(K_, k0 + 128);
        if (ra_) bf16_gemm::pack_a_pairs_f32(f32_at(a_, b) + k0 * a_.ld, a_.ld, M_, k1 - k0, apr + (b * P + p0) * M_, M_);
        else bf16_gemm::pack_a_pairs(half_at(a_, b) + k0 * a_.ld, a_.ld, M_, k1 - k0, apr + (b * P + p0) * M_, M_);
      }
    }
#pragma omp parallel for schedule(static)
    for (int64_t task = 0; task < nb_ * per; ++task) {
      const int64_t b = task / per, m0 = task % per / nbk * kBlock, m1 = std::min(M_, m0 + kBlock), rows = m1 - m0;
      const int64_t n0 = task % nbk * cw, n1 = std::min(N_, n0 + cw);
      if (n0 >= n1) continue;
      const int64_t rs = a_.trans ? 1 : a_.ld, cs = a_.trans ? a_.ld : 1;
      const uint16_t* a = ra_ ? nullptr : half_at(a_, b) + (a_.trans ? m0 : m0 * a_.ld);
      int64_t ldc = 0;
      float* c = reinterpret_cast<float*>(c_at(b, &ldc)) + m0 * ldc;
      const uint16_t* bpk = dot && !local ? bh + b * bsize + n0 * 2 * P : nullptr;
      if (local) {  // n0 == 0, n1 == N_, m0 == 0, m1 == M_
        thread_local std::vector<uint16_t, LineAligned<uint16_t>> bl;
        bl.resize(std::max(bl.size(), size_t(bsize)));
        if (rb_) bf16_gemm::pack_b_f32(f32_at(b_, b), b_.trans ? 1 : b_.ld, b_.trans ? b_.ld : 1, K_, N_, bl.data());
        else bf16_gemm::pack_b(half_at(b_, b), b_.trans ? 1 : b_.ld, b_.trans ? b_.ld : 1, K_, N_, bl.data());
        bpk = bl.data();
      }
      if (pairs) {
        const uint32_t* ap = nullptr;  // apr is empty when local
        int64_t lda = M_;
        if (local) {
          thread_local std::vector<uint32_t, LineAligned<uint32_t>> al;
          al.resize(std::max(al.size(), size_t(P * rows)));
          if (ra_) bf16_gemm::pack_a_pairs_f32(f32_at(a_, b) + m0, a_.ld, rows, K_, al.data(), rows);
          else bf16_gemm::pack_a_pairs(a, a_.ld, rows, K_, al.data(), rows);
          ap = al.data(), lda = rows;
        } else {
          ap = apr + b * P * M_ + m0;
        }
        PriorBlock prior(st_.accumulate, c + n0, rows, n1 - n0, ldc);
        bf16_gemm::product_pairs(ap, lda, P, bpk, rows, n1 - n0, c + n0, ldc);
        prior.add();
      } else if (dot) {
        thread_local std::vector<uint16_t, LineAligned<uint16_t>> ap;
        int64_t lda = a_.ld;
        if (ra_ || cs != 1 || K_ % 2 != 0) {
          lda = (K_ + 1) / 2 * 2;
          ap.resize(std::max(ap.size(), size_t(rows * lda)));
          if (ra_) bf16_gemm::pack_a_f32(f32_at(a_, b) + (a_.trans ? m0 : m0 * a_.ld), rs, cs, rows, K_, ap.data());
          else bf16_gemm::pack_a(a, rs, cs, rows, K_, ap.data());
          a = ap.data();
        }
        PriorBlock prior(st_.accumulate, c + n0, rows, n1 - n0, ldc);
        bf16_gemm::product(a, lda, 2 * P, bpk, rows, n1 - n0, c + n0, ldc);
        prior.add();
      } else {
        thread_local std::vector<float, LineAligned<float>> af;
        af.resize(std::max(af.size(), size_t(rows * K_)));
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t q = 0; q < K_; ++q) af[size_t(i * K_ + q)] = to_float(t, a[i * rs + q * cs]);
        blas_gemm(false, false, rows, n1 - n0, K_, af.data(), K_, bf.data() + b * bsize + n0, N_, c + n0, ldc, st_.accumulate);
      }
      epilogue(b, m0, m1, n0, n1);
    }
    if (dot) backends::report_bf16_flops(2 * nb_ * M_ * N_ * K_);
  }

  // Batch element b's first element of an operand of element type T (uint16_t: 16-bit floats).
  template <class T>
  const T* at(const GemmOperand& g, int64_t b) const {
    int64_t idx[32] = {}, off = g.offset;
    unravel(b, batch_, idx);
    for (size_t d = 0; d < batch_.size(); ++d) off += idx[d] * g.batch_strides[d];
    return static_cast<const T*>(g.data) + off;
  }
  const uint16_t* half_at(const GemmOperand& g, int64_t b) const { return at<uint16_t>(g, b); }
  const float* f32_at(const GemmOperand& g, int64_t b) const { return at<float>(g, b); }
  // A float32 operand rounded to bfloat16 as a whole, dense and row-major, for the paths that
  // do not round as they pack (half::float_to_bf16: the bits of the cast Step it replaces).
  static GemmOperand rounded_whole(const kir::IndexMap& m, const void* data) {
    const Shape& s = m.shape();
    const size_t r = s.size();
    const int64_t rows = s[r - 2], cols = s[r - 1], n = numel(s);
    GemmOperand g;
    g.ld = std::max<int64_t>(cols, 1);
    g.batch_strides = contiguous_strides(Shape(s.begin(), s.end() - 2));
    for (auto& x : g.batch_strides) x *= rows * cols;
    std::vector<float> f(static_cast<size_t>(n));
    copy_map(m, data, f.data(), sizeof(float));
    g.packed.resize(size_t(n) * 2);
    uint16_t* o = reinterpret_cast<uint16_t*>(g.packed.data());
    for (int64_t i = 0; i < n; ++i) o[i] = half::float_to_bf16(f[size_t(i)]);
    g.data = g.packed.data();
    return g;
  }
  static float to_float(DType t, uint16_t h) { return t == DType::BFloat16 ? half::bf16_to_float(h) : half::f16_to_float(h); }

  // ---- float32 through the project's kernel (f32_gemm), where its measured rule chooses it ----
  // An operand it cannot address (neither rows nor columns contiguous) is packed as a whole
  // first when the product is a single one; in a batched product such an operand goes to the
  // BLAS path, which packs it block by block inside its tasks (a conv's im2col window over the
  // batch would otherwise be copied whole, on one thread). The epilogue runs on each C tile in
  // the task that computed it. False: the BLAS's.
  bool own_product() {
    if (st_.dtype != DType::Float32 || st_.input_dtypes[0] != DType::Float32 || st_.input_dtypes[1] != DType::Float32)
      return false;
    if (!f32_gemm::chosen(nb_, M_, N_, K_) || !st_.out_strides.empty()) return false;  // C dense only
    a_ = gemm_operand(st_.maps[0], args_.slots[st_.inputs[0]], st_.dtype, nb_ > 1);
    b_ = gemm_operand(st_.maps[1], args_.slots[st_.inputs[1]], st_.dtype, nb_ > 1);
    if (a_.pack || b_.pack) return false;
    std::vector<int64_t> ao(static_cast<size_t>(nb_)), bo(static_cast<size_t>(nb_));
    int64_t idx[32];
    for (int64_t b = 0; b < nb_; ++b) {
      unravel(b, batch_, idx);
      ao[size_t(b)] = a_.offset, bo[size_t(b)] = b_.offset;
      for (size_t d = 0; d < batch_.size(); ++d)
        ao[size_t(b)] += idx[d] * a_.batch_strides[d], bo[size_t(b)] += idx[d] * b_.batch_strides[d];
    }
    f32_gemm::Problem p;
    p.batch = nb_, p.M = M_, p.N = N_, p.K = K_;
    p.a = static_cast<const float*>(a_.data), p.a_off = ao.data();
    p.ars = a_.trans ? 1 : a_.ld, p.acs = a_.trans ? a_.ld : 1;
    p.b = static_cast<const float*>(b_.data), p.b_off = bo.data();
    p.brs = b_.trans ? 1 : b_.ld, p.bcs = b_.trans ? b_.ld : 1;
    p.c = reinterpret_cast<float*>(out_), p.accumulate = st_.accumulate;
    // The epilogue in registers where it is one Add or Mul (register_epilogue) and its operand
    // does not overlap C; else on each finished tile through its native loop.
    const RegisterEpilogue& re = k_.in_registers;
    if (re.op != f32_gemm::Problem::Epi::None) {
      const float* x = static_cast<const float*>(args_.slots[st_.inputs[size_t(re.input)]]) + re.offset;
      const float* xe = x + (nb_ * M_ - 1) * re.rs + N_;
      const float* c = p.c;
      if (xe <= c || c + nb_ * M_ * N_ <= x) {
        p.epi = re.op, p.x = x, p.x_rs = re.rs;
        f32_gemm::gemm(p);
        register_epilogues.fetch_add(1, std::memory_order_relaxed);
        return true;
      }
    }
    f32_gemm::gemm(
        p,
        [](void* self, int64_t b, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
          static_cast<const GemmLaunch*>(self)->epilogue(b, m0, m1, n0, n1);
        },
        this);
    return true;
  }

  // ---- The BLAS ----
  // Our pool runs the BLAS over fixed blocks (128 rows; 128 columns too when the matrix is only a
  // row block tall and B is not packed per block, whose rows are then packed whole, in one walk).
  // Every call is made inside an active parallel region, where OpenBLAS's OpenMP build stays on
  // the calling thread (outside one it would start its own threads, which was slow here).
  static constexpr int64_t kBlock = 128;

  void blas_product() {
    floating_ = st_.dtype == DType::Float32 || st_.dtype == DType::Float64;
    a_ = gemm_operand(st_.maps[0], args_.slots[st_.inputs[0]], st_.dtype, floating_ && nb_ > 1);
    b_ = gemm_operand(st_.maps[1], args_.slots[st_.inputs[1]], st_.dtype, floating_ && nb_ > 1);
    const int64_t mb = (M_ + kBlock - 1) / kBlock, nbk = M_ <= kBlock && !b_.pack ? (N_ + kBlock - 1) / kBlock : 1;
    const int64_t per = mb * nbk, tasks = nb_ * per;
    // Deep, narrow products (a conv's kernel gradient: K = batch x pixels, M x N a few hundred by
    // a few dozen; a Linear layer on a flattened image) give those blocks too few tasks: K is then
    // cut into chunks of equal depth (at most 2048, a multiple of 8) whose partial products are
    // added in chunk order, and the rows into equal blocks of at most 256 (the tasks come from K
    // here). The epilogue runs on the sum. The partial products are bounded (a vocabulary-sized
    // weight gradient keeps the blocks). Equal tasks: docs/architecture.md (Threads) says what
    // unequal ones cost.
    constexpr int64_t kChunkK = 2048, kMaxPartial = int64_t(1) << 22;
    const int64_t chunks = (K_ + kChunkK - 1) / kChunkK;
    if (floating_ && nb_ == 1 && tasks < 8 && K_ > kChunkK && chunks * M_ * N_ <= kMaxPartial && st_.out_strides.empty()) {
      if (st_.dtype == DType::Float32) blas_split_k<float>(chunks, nbk);
      else blas_split_k<double>(chunks, nbk);
      return epilogue(0, 0, M_, 0, N_);
    }
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tasks; ++t) {
      int64_t b = t / per, i = (t % per) / nbk, j = t % nbk;
      int64_t n0 = nbk == 1 ? 0 : j * kBlock, n1 = nbk == 1 ? N_ : std::min(N_, n0 + kBlock);
      blas_block(b, i * kBlock, std::min(M_, (i + 1) * kBlock), n0, n1);
    }
  }

  // Rows [m0, m1) and columns [n0, n1) of batch b, then its epilogue. op(A)'s rows are A's rows,
  // or A's columns when transposed; likewise op(B)'s columns.
  void blas_block(int64_t b, int64_t m0, int64_t m1, int64_t n0, int64_t n1) const {
    int64_t idx[32];
    unravel(b, batch_, idx);
    int64_t ao = a_.offset, bo = b_.offset;
    for (size_t d = 0; d < batch_.size(); ++d) ao += idx[d] * a_.batch_strides[d], bo += idx[d] * b_.batch_strides[d];
    // C: batch b's matrix, dense, or through Step::out_strides (rows ldc apart; the lowering
    // gives floating products without an epilogue such strides).
    int64_t ldc = 0;
    char* c = c_at(b, &ldc);
    if (!floating_) {
      integer_block(ao, bo, c, m0, m1, n0, n1);
      return epilogue(b, m0, m1, n0, n1);
    }
    ao += a_.trans ? m0 : m0 * a_.ld;
    bo += b_.trans ? n0 * b_.ld : n0;
    c += size_t(m0 * ldc + n0) * elem_;
    const char* ap = static_cast<const char*>(a_.data) + ao * int64_t(elem_);
    const char* bp = static_cast<const char*>(b_.data) + bo * int64_t(elem_);
    int64_t lda = a_.ld, ldb = b_.ld;
    if (a_.pack) ap = static_cast<const char*>(pack_rows(a_, 0, b, m0, m1, elem_)), lda = K_;
    if (b_.pack) bp = static_cast<const char*>(pack_rows(b_, 1, b, 0, K_, elem_)), ldb = N_;  // whole rows: n0 = 0
    if (st_.dtype == DType::Float32)
      blas_gemm(a_.trans, b_.trans, m1 - m0, n1 - n0, K_, reinterpret_cast<const float*>(ap), lda,
                reinterpret_cast<const float*>(bp), ldb, reinterpret_cast<float*>(c), ldc, st_.accumulate);
    else
      blas_gemm(a_.trans, b_.trans, m1 - m0, n1 - n0, K_, reinterpret_cast<const double*>(ap), lda,
                reinterpret_cast<const double*>(bp), ldb, reinterpret_cast<double*>(c), ldc, st_.accumulate);
    epilogue(b, m0, m1, n0, n1);
  }

  // Integers: int64 accumulation, element by element (A at ao, B at bo, the batch's C at c).
  void integer_block(int64_t ao, int64_t bo, char* c, int64_t m0, int64_t m1, int64_t n0, int64_t n1) const {
    auto at = [&](const GemmOperand& g, int64_t off, int64_t i, int64_t j) {
      return read_index(g.data, st_.dtype, off + (g.trans ? j * g.ld + i : i * g.ld + j));
    };
    for (int64_t i = m0; i < m1; ++i)
      for (int64_t j = n0; j < n1; ++j) {
        int64_t sum = st_.accumulate ? read_index(c, st_.dtype, i * N_ + j) : 0;
        for (int64_t q = 0; q < K_; ++q) sum += at(a_, ao, i, q) * at(b_, bo, q, j);
        if (st_.dtype == DType::Int32) reinterpret_cast<int32_t*>(c)[i * N_ + j] = int32_t(sum);
        else reinterpret_cast<int64_t*>(c)[i * N_ + j] = sum;
      }
  }

  template <class R>
  void blas_split_k(int64_t chunks, int64_t nbk) const {
    const int64_t depth = ((K_ + chunks - 1) / chunks + 7) / 8 * 8, nch = (K_ + depth - 1) / depth;
    const int64_t row_blocks = (M_ + 2 * kBlock - 1) / (2 * kBlock), rows = (M_ + row_blocks - 1) / row_blocks;
    const int64_t per_chunk = row_blocks * nbk;
    std::vector<R> part(size_t(nch * M_ * N_));
    const R* a = static_cast<const R*>(a_.data);
    const R* bm = static_cast<const R*>(b_.data);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < nch * per_chunk; ++t) {
      int64_t q = t / per_chunk, i = (t % per_chunk) / nbk, j = t % nbk;
      int64_t m0 = i * rows, m1 = std::min(M_, m0 + rows);
      int64_t n0 = nbk == 1 ? 0 : j * kBlock, n1 = nbk == 1 ? N_ : std::min(N_, n0 + kBlock);
      int64_t k0 = q * depth, k1 = std::min(K_, k0 + depth);
      int64_t ao = a_.offset + (a_.trans ? k0 * a_.ld + m0 : m0 * a_.ld + k0);
      int64_t bo = b_.offset + (b_.trans ? n0 * b_.ld + k0 : k0 * b_.ld + n0);
      blas_gemm(a_.trans, b_.trans, m1 - m0, n1 - n0, k1 - k0, a + ao, a_.ld, bm + bo, b_.ld,
                part.data() + q * M_ * N_ + m0 * N_ + n0, N_);
    }
    sum_partials(part.data(), nch, M_ * N_, reinterpret_cast<R*>(out_), st_.accumulate);
  }

  const GemmKernel& k_;
  const Step& st_;
  const LaunchArgs& args_;
  const size_t r_;
  const int64_t M_, N_, K_;
  const Shape batch_;
  const int64_t nb_;
  char* const out_;
  const size_t elem_;
  std::vector<const void*> epi_in_;
  std::vector<char*> base_;  // the epilogue loop's pointers (loads, then the output)
  const jit::Loop* loop_ = nullptr;
  int64_t mp_ = 0;  // window: M rounded up to 16
  bool floating_ = false;
  GemmOperand a_, b_;  // BLAS: the operands as it sees them
  bool ra_ = false, rb_ = false;  // half_product: A / B float32, rounded as packed
};

void GemmKernel::run(const Step& st, const LaunchArgs& args) const { GemmLaunch(*this, st, args).run(); }

}  // namespace

// Step st's epilogue as a RegisterEpilogue, or none: a program of two float32 Loads and one Add
// or Mul of them, one Load the product (the output slot, read element for element: the epilogue
// pass's condition) and the other a single view that walks C's rows evenly and its columns
// densely, in another slot (an operand the tiles read while others write C could otherwise
// change under them).
RegisterEpilogue register_epilogue(const Step& st) {
  const std::vector<Instr>& pr = st.program;
  if (st.dtype != DType::Float32 || !st.more_outputs.empty() || pr.size() != 3 || pr[0].code != Code::Load || pr[1].code != Code::Load ||
      (pr[2].code != Code::Add && pr[2].code != Code::Mul) || std::min(pr[2].a, pr[2].b) != 0 || std::max(pr[2].a, pr[2].b) != 1)
    return {};
  const bool first_is_c = st.inputs[size_t(pr[0].input)] == st.output;
  const Instr& x = pr[first_is_c ? 1 : 0];
  const Instr& c = pr[first_is_c ? 0 : 1];
  if (st.inputs[size_t(c.input)] != st.output || !c.map.is_contiguous() || c.map.views[0].offset != 0 || pr[2].dtype != DType::Float32 || st.inputs[size_t(x.input)] == st.output ||
      x.dtype != DType::Float32)
    return {};
  const int64_t N = st.shape.back(), rows = numel(st.shape) / std::max<int64_t>(N, 1);
  if (N == 0 || rows == 0 || numel(x.map.shape()) != rows * N) return {};
  const kir::IndexMap m = x.map.reshape({rows, N});
  if (!m.single()) return {};
  const kir::View& v = m.views[0];
  const int64_t rs = rows == 1 ? 0 : v.strides[0];
  if ((N > 1 && v.strides[1] != 1) || rs < 0) return {};
  return {pr[2].code == Code::Mul ? f32_gemm::Problem::Epi::Mul : f32_gemm::Problem::Epi::Add, x.input, v.offset, rs};
}

uint64_t gemm_register_epilogue_launches() { return register_epilogues.load(std::memory_order_relaxed); }

std::unique_ptr<CpuKernel> compile_gemm(const Step& st) {
  auto k = std::make_unique<GemmKernel>();
  k->regs = plan_registers(st.program, results_of(st));
  k->regs.load = load_paths(st.program);
  k->window = window_plan(st);
  if (st.dtype == DType::Float32 && !st.program.empty()) {
    Shape dom = st.shape;  // the epilogue's loads' domain (the consumer's shape)
    for (const Instr& I : st.program)
      if (I.code == Code::Load) dom = I.map.shape();
    build_loop(k->epilogue, st.program, dom, {int(st.program.size()) - 1}, {1}, false);
    k->in_registers = register_epilogue(st);
  }
  return k;
}

}  // namespace tessera::backends::cpu
