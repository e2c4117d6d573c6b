// Copy Steps and the copies other engines make.
#include <omp.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "backends/cpu/copies.h"
#include "backends/cpu/kernel.h"
#include "backends/cpu/views.h"

namespace tessera::backends::cpu {
namespace {

// A Copy Step of one masked view whose rows are a few elements (a dilation's interleaved zeros,
// [.., X, 2] masked to [.., X, 1]): the output filled with the pad, then the mask's box copied
// over it along the box's last dim longer than 1, whatever its strides (row by row, the
// rows otherwise a few elements each cost ~3 ns per element).
void run_box_copy(const Step& st, const Instr& I, const LaunchArgs& args) {
  const kir::View& v = I.map.views[0];
  const Shape& s = v.shape;
  const std::vector<int64_t> ostr = contiguous_strides(s);
  Shape box;
  std::vector<int64_t> os, is;
  int64_t obase = 0, ibase = v.offset;
  for (size_t d = 0; d < s.size(); ++d) {
    const int64_t lo = std::clamp<int64_t>(v.lo[d], 0, s[d]), hi = std::clamp<int64_t>(v.hi[d], lo, s[d]);
    obase += lo * ostr[d], ibase += lo * v.strides[d];
    if (hi - lo != 1) box.push_back(hi - lo), os.push_back(ostr[d]), is.push_back(v.strides[d]);
  }
  if (box.empty()) box = {1}, os = {0}, is = {0};
  const size_t last = box.size() - 1;
  const int64_t inner = box[last], rows = inner ? numel(box) / inner : 0, total = numel(s);
  const Shape outer(box.begin(), box.end() - 1);
  with_storage(st.dtype, [&](auto* sp) {
    using S = std::remove_pointer_t<decltype(sp)>;
    const S* src = static_cast<const S*>(args.slots[st.inputs[I.input]]);
    S* out = static_cast<S*>(args.slots[st.output]);
    const S pad = from_c<S>(I.value);
#pragma omp parallel for schedule(static) if (total >= kParallelMin)
    for (int64_t e = 0; e < total; e += kParallelMin) std::fill(out + e, out + std::min(total, e + kParallelMin), pad);
#pragma omp parallel for schedule(static) if (total >= kParallelMin)
    for (int64_t row = 0; row < rows; ++row) {
      int64_t idx[32], o = obase, i = ibase;
      unravel(row, outer, idx);
      for (size_t d = 0; d < last; ++d) o += idx[d] * os[d], i += idx[d] * is[d];
      for (int64_t j = 0; j < inner; ++j) out[o + j * os[last]] = src[i + j * is[last]];
    }
  });
}

// A Copy whose one load is a single strided view (masked or not) of the output's dtype -- im2col,
// padding, transposes: written row by row along the view's last dimension straight from the
// source (no registers), rows split over the pool; is_view_copy says whether a Copy Step is of that form.
bool is_view_copy(const Step& st) {
  if (st.program.size() != 1 || st.program[0].code != Code::Load) return false;
  const Instr& I = st.program[0];
  if (I.dtype != st.dtype || I.map.effective_top() != 0 || numel(st.shape) == 0) return false;
  const Shape& s = I.map.views[0].shape;
  return !s.empty() && s.size() <= 32;
}

void run_view_copy(const Step& st, const LaunchArgs& args) {
  const Instr& I = st.program[0];
  const kir::View& v = I.map.views[0];
  const Shape& s = v.shape;
  size_t r = s.size(), last = r - 1;
  int64_t inner = s[last], rows = numel(s) / inner, st_in = v.strides[last];
  bool masked = v.masked();
  if (masked && inner <= 4) return run_box_copy(st, I, args);
  with_storage(st.dtype, [&](auto* sp) {
    using S = std::remove_pointer_t<decltype(sp)>;
    const S* src = static_cast<const S*>(args.slots[st.inputs[I.input]]);
    S* out = static_cast<S*>(args.slots[st.output]);
    S pad = from_c<S>(I.value);
    int nt = numel(st.shape) >= kParallelMin ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(nt)
    {
      int t = omp_get_thread_num(), n = omp_get_num_threads();
      int64_t r0 = rows * t / n, r1 = rows * (t + 1) / n;
      int64_t idx[32] = {0}, off = v.offset;
      unravel(r0, Shape(s.begin(), s.end() - 1), idx);
      for (size_t d = 0; d < last; ++d) off += idx[d] * v.strides[d];
      for (int64_t row = r0; row < r1; ++row) {
        S* o = out + row * inner;
        int64_t a = 0, b = inner;
        if (masked) {
          bool ok = true;
          for (size_t d = 0; d < last; ++d) ok &= idx[d] >= v.lo[d] && idx[d] < v.hi[d];
          a = ok ? std::clamp<int64_t>(v.lo[last], 0, inner) : 0;
          b = ok ? std::clamp<int64_t>(v.hi[last], a, inner) : 0;
          std::fill(o, o + a, pad);
          std::fill(o + b, o + inner, pad);
        }
        const S* p = src + off + a * st_in;
        if (st_in == 1) {
          if (o + a != p) std::memmove(o + a, p, size_t(b - a) * sizeof(S));
        }
        else for (int64_t j = a; j < b; ++j) o[j] = p[(j - a) * st_in];
        next_outer(idx, off, v, last);
      }
    }
  });
}

struct ViewCopyKernel final : CpuKernel {
  void run(const Step& st, const LaunchArgs& args) const override { run_view_copy(st, args); }
};

}  // namespace

// A Copy Step whose load is not one strided view of the output's dtype runs its program as an
// elementwise one (the interpreter: Copy Steps get no native loop).
std::unique_ptr<CpuKernel> compile_copy(const Step& st) {
  if (is_view_copy(st)) return std::make_unique<ViewCopyKernel>();
  return compile_elementwise(st);
}

// A single unmasked view (plain reshapes above it keep its order) is walked row by row along its
// last dimension, dense runs as one copy; other maps go through tile_offsets.
void copy_positions(const IndexMap& m, const void* src, int64_t start, int64_t n, void* dst, size_t elem) {
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  const size_t top = m.effective_top();
  const kir::View& v = m.views[top];
  if (top == 0 && !v.masked() && !v.shape.empty()) {
    const size_t last = v.shape.size() - 1;
    const int64_t inner = v.shape[last], st = v.strides[last];
    int64_t idx[32] = {}, off = v.offset;
    unravel(start, v.shape, idx);
    for (size_t k = 0; k < last; ++k) off += idx[k] * v.strides[k];
    for (int64_t j = idx[last]; n > 0; j = 0, next_outer(idx, off, v, last)) {
      const int64_t run = std::min(n, inner - j);
      const char* p = s + (off + j * st) * int64_t(elem);
      if (st == 1) std::memcpy(d, p, size_t(run) * elem);
      else for (int64_t q = 0; q < run; ++q) std::memcpy(d + size_t(q) * elem, p + q * st * int64_t(elem), elem);
      d += size_t(run) * elem;
      n -= run;
    }
    return;
  }
  constexpr int64_t kChunk = 256;
  int64_t off[kChunk];
  uint8_t valid[kChunk];
  for (int64_t p = 0; p < n; p += kChunk) {
    const int64_t c = std::min(kChunk, n - p);
    tile_offsets(m, start + p, c, off, valid);
    for (int64_t q = 0; q < c; ++q, d += elem)
      if (valid[q]) std::memcpy(d, s + off[q] * int64_t(elem), elem);
      else std::memset(d, 0, elem);
  }
}

void copy_map(const IndexMap& m, const void* src, void* dst, size_t elem) {
  const int64_t n = numel(m.shape()), chunks = (n + kParallelMin - 1) / kParallelMin;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t start = c * kParallelMin;
    copy_positions(m, src, start, std::min(kParallelMin, n - start), static_cast<char*>(dst) + size_t(start) * elem, elem);
  }
}

void stream_copy(void* dst, const void* src, size_t bytes) {
#if defined(__SSE2__)
  auto* d = static_cast<char*>(dst);
  auto* s = static_cast<const char*>(src);
  if ((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(s)) % 16 == 0) {
    size_t i = 0;
    for (; i + 16 <= bytes; i += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), _mm_load_si128(reinterpret_cast<const __m128i*>(s + i)));
    std::memcpy(d + i, s + i, bytes - i);
    _mm_sfence();  // ordered before this thread's later stores and the pool's barrier
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

}  // namespace tessera::backends::cpu
