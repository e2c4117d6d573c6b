// Reduce Steps: the domain is permuted so kept axes come first; output o then owns the contiguous
// range [o * R, (o + 1) * R) of the permuted domain, reduced in order (deterministic). The values
// reduced come from the program through its native loop (float32) or the interpreter. A Step with
// further outputs reduces several of its program's values in the same pass (one accumulator per
// output), each in the same order as alone.
#include <algorithm>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "backends/cpu/interpreter.h"
#include "backends/cpu/kernel.h"
#include "backends/cpu/native_loops.h"
#include "backends/cpu/views.h"
#include "core/fail.h"

namespace tessera::backends::cpu {
namespace {

struct ReduceKernel final : CpuKernel {
  std::vector<Instr> program;  // loads permuted to the kept-first order (unless `columns`), coalesced
  RegPlan regs;
  Shape domain;                // kept-first
  int64_t outer = 1, inner = 1;  // kept and reduced extents
  // When the reduced axes all come before the kept ones (column sums, bias gradients), the
  // domain is walked in its own order, each row adding into a vector of accumulators.
  bool columns = false;
  // The instructions whose values are reduced, in output order (Step::outputs()).
  std::vector<int> results;
  // The program's loop over the domain, writing the value to be reduced, float32 only: not for a
  // lone load, which the interpreter reduces in place (a bias gradient's sum of a GEMM's output).
  NativeLoop loop;
  // Column sums of a lone float32 load of at most kDirectColumns kept positions read densely:
  // element (r, j) of the [reduced, kept] domain at the view's offset + r * ld + j, summed
  // straight from the input (a bias gradient), no tile evaluated; -1: not such a load.
  int64_t direct_ld = -1;
  // Column sums added through add_rows (float32 sums of a loop's values, or of a lone load of at
  // most kDirectColumns columns); else the scalar loop, row by row.
  bool blocked = false;

  void run(const Step& st, const LaunchArgs& args) const override {
    columns ? run_columns(st, args) : run_rows(st, args);
  }
  void run_columns(const Step& st, const LaunchArgs& args) const;
  void run_rows(const Step& st, const LaunchArgs& args) const;
};

// This thread's buffers for a tile's values of nres results (kTile floats each).
float* const* tile_buffers(size_t nres) {
  thread_local std::vector<float, LineAligned<float>> buf;
  thread_local float* outs[kir::kMaxReduceOutputs];
  if (buf.size() < nres * size_t(kTile)) buf.resize(nres * size_t(kTile));
  for (size_t r = 0; r < nres; ++r) outs[r] = buf.data() + r * size_t(kTile);
  return outs;
}

// The values a Reduce reduces at positions [start, start + n <= kTile) of its domain, one array per
// result (v[r]): through its loop (float32) into this thread's buffers, else by the interpreter.
template <class T>
void reduce_tile(const ReduceKernel& k, const std::vector<const void*>& in, const std::vector<char*>& base,
                 const LaunchArgs& args, Scratch& sc, int64_t start, int64_t n, const T** v) {
  const size_t nres = k.results.size();
  if constexpr (std::is_same_v<T, float>)
    if (k.loop.loop) {
      float* const* outs = tile_buffers(nres);
      for (size_t r = 0; r < nres; ++r) v[r] = outs[r];
      loop_range(k.loop, base, start, n, outs, nres);
      return;
    }
  run_program(k.program, k.regs, in, k.domain, start, n, args, sc);
  for (size_t r = 0; r < nres; ++r) v[r] = val<T>(sc, k.results[r]);
}

// acc[j] += v[i * ld + j] for rows i = 0 .. rows - 1 in order, j < n: each column's sum in row
// order, as a scalar loop adds them (the same bits). Groups of 8 rows, each group's rows added to
// blocks of 32 columns held in registers (AVX2: the build leaves AVX-512 to the native loops,
// CMakeLists.txt), so the accumulators are loaded and stored once per 8 rows, not per element,
// and memory is still read row after row within a group (a [1024, 512] bias gradient walked
// column block by column block down 64 rows read 2 KiB apart, which the prefetchers do not follow).
void add_rows(double* acc, const float* v, int64_t rows, int64_t n, int64_t ld) {
  for (int64_t i0 = 0; i0 < rows; i0 += 8) {
    const int64_t m = std::min<int64_t>(8, rows - i0);
    const float* g = v + i0 * ld;
    int64_t j = 0;
#if defined(__AVX2__)
    for (; j + 32 <= n; j += 32) {
      __m256d a[8];
      for (int b = 0; b < 8; ++b) a[b] = _mm256_loadu_pd(acc + j + 4 * b);
      const float* p = g + j;
      for (int64_t i = 0; i < m; ++i, p += ld)
        for (int b = 0; b < 4; ++b) {
          const __m256 x = _mm256_loadu_ps(p + 8 * b);
          a[2 * b] = _mm256_add_pd(a[2 * b], _mm256_cvtps_pd(_mm256_castps256_ps128(x)));
          a[2 * b + 1] = _mm256_add_pd(a[2 * b + 1], _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)));
        }
      for (int b = 0; b < 8; ++b) _mm256_storeu_pd(acc + j + 4 * b, a[b]);
    }
    for (; j + 4 <= n; j += 4) {
      __m256d a = _mm256_loadu_pd(acc + j);
      const float* p = g + j;
      for (int64_t i = 0; i < m; ++i, p += ld) a = _mm256_add_pd(a, _mm256_cvtps_pd(_mm_loadu_ps(p)));
      _mm256_storeu_pd(acc + j, a);
    }
#endif
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = j; c < n; ++c) acc[c] += double(g[i * ld + c]);
  }
}

// Output r of a Reduce Step (r = 0: st.output).
template <class S>
S* output_of(const Step& st, const LaunchArgs& args, size_t r) {
  return static_cast<S*>(args.slots[r == 0 ? st.output : st.more_outputs[r - 1]]);
}

// Column sums: the reduced rows are cut into chunks fixed by the shape alone (at least
// kColumnChunkMin elements each, at most kColumnChunks tasks with the column blocks), each chunk
// reduced in row order, the chunks' partials combined in chunk order: the same bits for any thread
// count, and a bias gradient of [1024, 128] spread over the pool instead of one thread. Wide sums
// (many column blocks) keep one chunk and write their outputs directly, so the partials stay small.
// When one block holds every column, whole rows are evaluated per call (the domain's rows are
// contiguous), not one row a call.
constexpr int64_t kColumnChunks = 16, kColumnChunkMin = int64_t(1) << 15;
// Wider sums of a lone load (the [1024, 384] and [1024, 512] bias gradients) keep the row-by-row
// loop over tiles the interpreter reads in place: summed in place in blocks (add_rows) they took
// 0.23 -> 0.28 and 0.32 -> 0.41 ms per step in the machine's slow state (0.18 -> 0.15 and 0.28 ->
// 0.23 in its fast one).
constexpr int64_t kDirectColumns = 128;

void ReduceKernel::run_columns(const Step& st, const LaunchArgs& args) const {
  auto in = inputs_of(st, args);
  std::vector<char*> base;
  if (loop.loop) load_bases(*loop.loop, program, in, base);
  const int64_t K = outer, R = inner;  // kept extent, reduced extent
  const bool is_max = st.reduce_op == ir::Op::ReduceMax;
  const size_t nres = results.size();
  const int64_t nblocks = (K + kTile - 1) / kTile;
  const int64_t chunks = std::max<int64_t>(1, std::min({K * R / kColumnChunkMin, kColumnChunks / std::max<int64_t>(nblocks, 1), R}));
  const int64_t chunk_rows = (R + chunks - 1) / chunks;
  const int64_t rows_per_call = nblocks == 1 ? std::max<int64_t>(1, kTile / K) : 1;
  with_compute(st.dtype, [&](auto* tp) {
    using T = std::remove_pointer_t<decltype(tp)>;
    using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
    const T lowest = std::is_floating_point_v<T> ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::lowest();
    with_storage(st.dtype, [&](auto* sp) {
      using S = std::remove_pointer_t<decltype(sp)>;
      auto store = [&](size_t q, int64_t j, Acc s, T m) { output_of<S>(st, args, q)[j] = is_max ? store_as<S>(m) : store_as<S>(T(s)); };
      // Chunk c's partials of result q, column j at [(c * nres + q) * K + j] (chunks > 1 only).
      std::vector<Acc> psum(chunks > 1 && !is_max ? size_t(chunks) * nres * size_t(K) : 0);
      std::vector<T> pmax(chunks > 1 && is_max ? size_t(chunks) * nres * size_t(K) : 0);
#pragma omp parallel for schedule(static) if (K * R >= kParallelMin && nblocks * chunks > 1)
      for (int64_t task = 0; task < nblocks * chunks; ++task) {
        Scratch& sc = scratch(program.size(), size_t(regs.nregs));
        const int64_t b = task / chunks, c = task % chunks;
        const int64_t k0 = b * kTile, n = std::min(kTile, K - k0);
        const int64_t r0 = c * chunk_rows;
        int64_t r1 = std::min(R, r0 + chunk_rows);
        std::vector<Acc> sum(is_max ? 0 : size_t(n) * nres, Acc(0));
        std::vector<T> mx(is_max ? size_t(n) * nres : 0, lowest);
        const T* v[kir::kMaxReduceOutputs];
        if constexpr (std::is_same_v<T, float>)
          if (direct_ld >= 0 && !is_max) {  // a lone dense load: its rows summed in place
            const float* x = static_cast<const float*>(in[size_t(program[0].input)]) + program[0].map.views[0].offset;
            add_rows(sum.data(), x + r0 * direct_ld + k0, r1 - r0, n, direct_ld);
            r1 = r0;  // done
          }
        for (int64_t r = r0; r < r1; r += rows_per_call) {  // rows in order: deterministic
          const int64_t m = std::min(rows_per_call, r1 - r);
          bool done = false;
          if constexpr (std::is_same_v<T, float>)
            if (loop.loop && nblocks == 1 && m > 1) {  // the m rows in one loop call where they allow it
              float* const* outs = tile_buffers(nres);
              loop_rows(loop, base, r * K, K, m, K, outs, nres);
              for (size_t q = 0; q < nres; ++q) v[q] = outs[q];
              done = true;
            }
          if (!done) reduce_tile<T>(*this, in, base, args, sc, r * K + k0, m * n, v);
          for (size_t q = 0; q < nres; ++q) {
            if constexpr (std::is_same_v<T, float>)
              if (!is_max && blocked) {
                add_rows(sum.data() + q * size_t(n), v[q], m, n, n);
                continue;
              }
            for (int64_t i = 0; i < m; ++i) {
              const T* row = v[q] + i * n;
              if (is_max)
                for (int64_t j = 0; j < n; ++j) mx[q * size_t(n) + size_t(j)] = nan_max(mx[q * size_t(n) + size_t(j)], row[j]);
              else
                for (int64_t j = 0; j < n; ++j) sum[q * size_t(n) + size_t(j)] += Acc(row[j]);
            }
          }
        }
        for (size_t q = 0; q < nres; ++q)
          for (int64_t j = 0; j < n; ++j) {
            const size_t from = q * size_t(n) + size_t(j), to = (size_t(c) * nres + q) * size_t(K) + size_t(k0 + j);
            if (chunks == 1) store(q, k0 + j, is_max ? Acc(0) : sum[from], is_max ? mx[from] : lowest);
            else if (is_max) pmax[to] = mx[from];
            else psum[to] = sum[from];
          }
      }
      if (chunks == 1) return;
#pragma omp parallel for schedule(static) if (K >= kTile)
      for (int64_t j = 0; j < K; ++j)
        for (size_t q = 0; q < nres; ++q) {
          Acc s = 0;
          T m = lowest;
          for (int64_t c = 0; c < chunks; ++c) {  // chunk order: deterministic
            const size_t at = (size_t(c) * nres + q) * size_t(K) + size_t(j);
            if (is_max) m = nan_max(m, pmax[at]);
            else s += psum[at];
          }
          store(q, j, s, m);
        }
    });
  });
}

void ReduceKernel::run_rows(const Step& st, const LaunchArgs& args) const {
  auto in = inputs_of(st, args);
  std::vector<char*> base;
  if (loop.loop) load_bases(*loop.loop, program, in, base);
  bool is_max = st.reduce_op == ir::Op::ReduceMax;
  const size_t nres = results.size();
  with_compute(st.dtype, [&](auto* tp) {
    using T = std::remove_pointer_t<decltype(tp)>;
    // Sums accumulate in double (floats) or int64 (integers); max in the compute type.
    using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
    with_storage(st.dtype, [&](auto* sp) {
      using S = std::remove_pointer_t<decltype(sp)>;
      // Outputs per task: 64 short reductions, or one long one (a few outputs, such as a conv's
      // per-channel bias gradient, still spread over the pool). Fixed by the shape alone.
      const int64_t group = inner >= kTile ? 1 : 64;
      bool par = outer > 1 && outer * inner >= kParallelMin;
#pragma omp parallel for schedule(static) if (par)
      for (int64_t ob = 0; ob < outer; ob += group) {
        Scratch& sc = scratch(program.size(), size_t(regs.nregs));
        int64_t oe = std::min(outer, ob + group);
        Acc sum[kir::kMaxReduceOutputs][64];
        T mx[kir::kMaxReduceOutputs][64];
        for (size_t q = 0; q < nres; ++q)
          for (int64_t j = 0; j < oe - ob; ++j) {
            sum[q][j] = 0;
            if constexpr (std::is_floating_point_v<T>) mx[q][j] = -std::numeric_limits<T>::infinity();
            else mx[q][j] = std::numeric_limits<T>::lowest();
          }
        const T* v[kir::kMaxReduceOutputs];
        int64_t lo = ob * inner, hi = oe * inner;
        for (int64_t start = lo; start < hi; start += kTile) {
          int64_t n = std::min(kTile, hi - start);
          reduce_tile<T>(*this, in, base, args, sc, start, n, v);
          for (int64_t i = 0; i < n;) {
            int64_t oi = (start + i) / inner, seg = std::min(n - i, (oi + 1) * inner - (start + i));
            int64_t j = oi - ob;
            for (size_t q = 0; q < nres; ++q) {
              if (is_max) mx[q][j] = nan_max(mx[q][j], run_max(v[q] + i, seg, mx[q][j]));
              else sum[q][j] += run_sum(v[q] + i, seg);
            }
            i += seg;
          }
        }
        for (size_t q = 0; q < nres; ++q) {
          S* o = output_of<S>(st, args, q);
          for (int64_t j = 0; j < oe - ob; ++j) o[ob + j] = is_max ? store_as<S>(mx[q][j]) : store_as<S>(T(sum[q][j]));
        }
      }
    });
  });
}

// For a lone float32 load of a column sum (reduced axes first): the elements between consecutive
// rows when its view reads the kept positions densely and the reduced ones as rows at
// one stride, else -1.
int64_t rows_stride(const Instr& I, const Step& st) {
  if (I.code != Code::Load || I.dtype != DType::Float32 || I.map.views.size() != 1) return -1;
  const kir::View& v = I.map.views[0];
  if (v.masked() || v.shape != st.domain || v.offset < 0) return -1;
  const size_t nred = st.axes.size();
  int64_t expect = 1, ld = -1;
  for (size_t d = v.shape.size(); d-- > 0;) {
    if (v.shape[d] == 1) continue;
    if (d >= nred) {  // kept: dense
      if (v.strides[d] != expect) return -1;
      expect *= v.shape[d];
      continue;
    }
    if (ld < 0) ld = v.strides[d], expect = 1;  // the innermost reduced dim sets the row stride
    if (v.strides[d] != ld * expect || ld < 0) return -1;
    expect *= v.shape[d];
  }
  return ld < 0 ? 0 : ld;
}

}  // namespace

std::unique_ptr<CpuKernel> compile_reduce(const Step& st) {
  auto k = std::make_unique<ReduceKernel>();
  k->regs = plan_registers(st.program, results_of(st));
  std::vector<int64_t> perm;
  std::vector<bool> red(st.domain.size(), false);
  for (int64_t a : st.axes) red[a] = true;
  for (size_t d = 0; d < red.size(); ++d)
    if (!red[d]) perm.push_back(int64_t(d));
  for (int64_t a : st.axes) perm.push_back(a);
  for (size_t d = 0; d < red.size(); ++d) {
    k->domain.push_back(st.domain[perm[d]]);
    (red[perm[d]] ? k->inner : k->outer) *= st.domain[perm[d]];
  }
  k->program = st.program;
  if (st.more_outputs.size() + 1 > size_t(kir::kMaxReduceOutputs) || st.more_results.size() != st.more_outputs.size())
    fail("cpu", "a Reduce Step has at most " + std::to_string(kir::kMaxReduceOutputs) + " outputs (step " + st.str() + ")", "");
  k->results.push_back(int(st.program.size()) - 1);
  k->results.insert(k->results.end(), st.more_results.begin(), st.more_results.end());
  k->columns = !st.axes.empty() && st.axes.size() < st.domain.size();
  for (size_t i = 0; i < st.axes.size(); ++i) k->columns &= st.axes[i] == int64_t(i);
  if (k->columns) k->domain = st.domain;
  for (Instr& I : k->program) {
    if (I.code == Code::Iota || I.code == Code::Rng)
      fail("cpu", "reduce programs cannot use iota or rng (step " + st.str() + ")", "");
    if (I.code == Code::Load && !k->columns) I.map = I.map.permute(perm);
  }
  if (st.dtype == DType::Float32 && k->program.size() > 1)
    build_loop(k->loop, k->program, k->domain, k->results, std::vector<uint8_t>(k->results.size(), 1), false);
  if (k->columns && st.dtype == DType::Float32 && k->program.size() == 1 && st.more_outputs.empty() && k->outer <= kDirectColumns)
    k->direct_ld = rows_stride(k->program[0], st);
  k->blocked = k->loop.loop || k->outer <= kDirectColumns;
  for (Instr& I : k->program)
    if (I.code == Code::Load && I.map.views.size() == 1) I.map.views[0] = coalesced(I.map.views[0]);
  k->regs.load = load_paths(k->program);
  return k;
}

}  // namespace tessera::backends::cpu
