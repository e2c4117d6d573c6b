// Indexing Steps: gather, scatter-add and dynamic_update_slice.
#include "backends/cpu/copies.h"
#include "backends/cpu/kernel.h"
#include "core/fail.h"

namespace tessera::backends::cpu {
namespace {

[[noreturn]] void index_error(const Step& st, int64_t v, int64_t extent, const Shape& src) {
  const kir::Source& s = st.sources.front();
  fail(s.op, "index " + std::to_string(v) + " out of range [0, " + std::to_string(extent) + ") along dimension " +
                 std::to_string(st.axis) + " of a tensor of shape " + shape_str(src),
       s.scope);
}

// Gather and scatter-add walk the index row by row along the last dimension: a row's offsets are
// computed once and each element steps by the views' last strides; a row with one index (an
// embedding's) is checked once and moved as a run. Row-major order, so the first out-of-range
// index is the one reported and scatter-add adds in a fixed order.
struct IndexRows {
  Shape outer;  // the index's shape but the last dimension
  int64_t last, inner, rows, ax, istride, sstride;
  bool along_last;
  std::vector<int64_t> idx;  // the row's position over every dimension but the last
  // iv: the index's view; sv: the view walked along the row besides it (gather's source,
  // scatter-add's updates).
  IndexRows(const Step& st, const kir::View& iv, const kir::View& sv)
      : outer(iv.shape.begin(), iv.shape.end() - 1), last(int64_t(iv.shape.size()) - 1), inner(iv.shape[size_t(last)]),
        rows(inner ? numel(iv.shape) / inner : 0), ax(st.axis), istride(iv.strides[size_t(last)]),
        sstride(sv.strides[size_t(last)]), along_last(st.axis == last), idx(size_t(last), 0) {}
  // Offset in view v of the row's first element; the axis term left out when skip_axis.
  int64_t row_offset(const kir::View& v, bool skip_axis) const {
    int64_t o = v.offset;
    for (int64_t d = 0; d < last; ++d)
      if (!(skip_axis && d == ax)) o += idx[size_t(d)] * v.strides[size_t(d)];
    return o;
  }
  void next() { bump(idx.data(), outer); }
};

void run_gather(const Step& st, const LaunchArgs& args, DType src_t, DType idx_t) {
  const kir::View& sv = st.maps[0].views[0];
  const kir::View& iv = st.maps[1].views[0];
  const char* src = static_cast<const char*>(args.slots[st.inputs[0]]);
  const void* index = args.slots[st.inputs[1]];
  char* out = static_cast<char*>(args.slots[st.output]);
  const size_t elem = itemsize(src_t);
  const int64_t extent = sv.shape[size_t(st.axis)], sax = sv.strides[size_t(st.axis)];
  IndexRows w(st, iv, sv);
  for (int64_t row = 0; row < w.rows; ++row, w.next()) {
    const int64_t ioff = w.row_offset(iv, false), soff = w.row_offset(sv, true);
    char* o = out + size_t(row * w.inner) * elem;
    if (!w.along_last && w.istride == 0) {
      int64_t v = read_index(index, idx_t, ioff);
      if (v < 0 || v >= extent) index_error(st, v, extent, sv.shape);
      const char* p = src + size_t(soff + v * sax) * elem;
      if (w.sstride == 1) std::memcpy(o, p, size_t(w.inner) * elem);
      else for (int64_t j = 0; j < w.inner; ++j) std::memcpy(o + size_t(j) * elem, p + j * w.sstride * int64_t(elem), elem);
      continue;
    }
    for (int64_t j = 0; j < w.inner; ++j) {
      int64_t v = read_index(index, idx_t, ioff + j * w.istride);
      if (v < 0 || v >= extent) index_error(st, v, extent, sv.shape);
      int64_t so = soff + v * sax + (w.along_last ? 0 : j * w.sstride);
      std::memcpy(o + size_t(j) * elem, src + size_t(so) * elem, elem);
    }
  }
}

void run_scatter_add(const Step& st, const LaunchArgs& args, DType t, DType idx_t) {
  const kir::View& iv = st.maps[1].views[0];
  const kir::View& sv = st.maps[2].views[0];
  void* out = args.slots[st.output];
  copy_map(st.maps[0], args.slots[st.inputs[0]], out, itemsize(t));
  const void* index = args.slots[st.inputs[1]];
  const std::vector<int64_t> ostr = contiguous_strides(st.shape);
  const int64_t extent = st.shape[size_t(st.axis)], oax = ostr[size_t(st.axis)];
  kir::View ov{st.shape, ostr, 0, {}, {}};  // the output as a view, for row offsets
  IndexRows w(st, iv, sv);
  with_storage(t, [&](auto* sp) {
    using S = std::remove_pointer_t<decltype(sp)>;
    S* o = static_cast<S*>(out);
    const S* src = static_cast<const S*>(args.slots[st.inputs[2]]);
    auto add = [](S& dst, S v) {
      if constexpr (std::is_same_v<S, F16> || std::is_same_v<S, BF16>) dst = from_c<S>(to_c<float>(dst) + to_c<float>(v));
      else dst = S(dst + v);
    };
    for (int64_t row = 0; row < w.rows; ++row, w.next()) {
      const int64_t ioff = w.row_offset(iv, false), soff = w.row_offset(sv, false), obase = w.row_offset(ov, true);
      if (!w.along_last && w.istride == 0) {
        int64_t v = read_index(index, idx_t, ioff);
        if (v < 0 || v >= extent) index_error(st, v, extent, st.shape);
        S* q = o + obase + v * oax;
        for (int64_t j = 0; j < w.inner; ++j) add(q[j], src[soff + j * w.sstride]);
        continue;
      }
      for (int64_t j = 0; j < w.inner; ++j) {
        int64_t v = read_index(index, idx_t, ioff + j * w.istride);
        if (v < 0 || v >= extent) index_error(st, v, extent, st.shape);
        add(o[obase + v * oax + (w.along_last ? 0 : j)], src[soff + j * w.sstride]);
      }
    }
  });
}

void run_dus(const Step& st, const LaunchArgs& args) {
  const kir::View& uv = st.maps[1].views[0];
  const kir::View& ov = st.maps[2].views[0];
  size_t elem = itemsize(st.dtype);
  char* out = static_cast<char*>(args.slots[st.output]);
  copy_map(st.maps[0], args.slots[st.inputs[0]], out, elem);
  size_t r = st.shape.size();
  std::vector<int64_t> start(r), ostr = contiguous_strides(st.shape), idx(r, 0);
  for (size_t d = 0; d < r; ++d) {
    int64_t v = static_cast<const int64_t*>(args.slots[st.inputs[2]])[ov.offset + int64_t(d) * ov.strides[0]];
    start[d] = std::clamp<int64_t>(v, 0, st.shape[d] - uv.shape[d]);
  }
  const char* upd = static_cast<const char*>(args.slots[st.inputs[1]]);
  int64_t total = numel(uv.shape);
  for (int64_t i = 0; i < total; ++i) {
    int64_t uoff = uv.offset, ooff = 0;
    for (size_t d = 0; d < r; ++d) uoff += idx[d] * uv.strides[d], ooff += (start[d] + idx[d]) * ostr[d];
    std::memcpy(out + size_t(ooff) * elem, upd + size_t(uoff) * elem, elem);
    bump(idx.data(), uv.shape);
  }
}

struct GatherKernel final : CpuKernel {
  void run(const Step& st, const LaunchArgs& args) const override { run_gather(st, args, st.dtype, st.input_dtypes.at(1)); }
};
struct ScatterAddKernel final : CpuKernel {
  void run(const Step& st, const LaunchArgs& args) const override {
    run_scatter_add(st, args, st.dtype, st.input_dtypes.at(1));
  }
};
struct DynamicUpdateSliceKernel final : CpuKernel {
  void run(const Step& st, const LaunchArgs& args) const override { run_dus(st, args); }
};

}  // namespace

std::unique_ptr<CpuKernel> compile_gather(const Step&) { return std::make_unique<GatherKernel>(); }
std::unique_ptr<CpuKernel> compile_scatter_add(const Step&) { return std::make_unique<ScatterAddKernel>(); }
std::unique_ptr<CpuKernel> compile_dynamic_update_slice(const Step&) { return std::make_unique<DynamicUpdateSliceKernel>(); }

}  // namespace tessera::backends::cpu
