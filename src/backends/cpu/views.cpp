#include "backends/cpu/views.h"

namespace tessera::backends::cpu {
namespace {

// A view of a stacked index map below the top, tracking the multi-index of a linear position.
struct Level {
  const kir::View* v;
  int64_t idx[16];
  int64_t pos = -1;  // linear position in v->shape
  int64_t off = 0;   // v->offset + sum(idx * strides)

  // Moves to position p: a small step forward carries digit by digit; anything else unravels.
  void seek(int64_t p) {
    const Shape& s = v->shape;
    size_t r = s.size();
    int64_t delta = p - pos;
    if (pos >= 0 && delta >= 0 && r > 0 && delta < s[r - 1] - idx[r - 1]) {
      idx[r - 1] += delta;
      off += delta * v->strides[r - 1];
    } else {
      unravel(p, s, idx);
      off = v->offset;
      for (size_t d = 0; d < r; ++d) off += idx[d] * v->strides[d];
    }
    pos = p;
  }
  bool in_mask() const {
    if (!v->masked()) return true;
    for (size_t d = 0; d < v->shape.size(); ++d)
      if (idx[d] < v->lo[d] || idx[d] >= v->hi[d]) return false;
    return true;
  }
};

// Offsets through a stack of views: the top view's offset is a position in the view below it,
// and so on down to views[0]; consecutive positions usually move each level by a small step.
void stacked_offsets(const IndexMap& m, size_t top, int64_t* idx, int64_t n, int64_t* off, uint8_t* valid) {
  const kir::View& tv = m.views[top];
  const Shape& s = tv.shape;
  if (top > 15 || s.size() > 16) {  // deep stacks: evaluate each element on its own
    for (int64_t i = 0; i < n; ++i) {
      valid[i] = m.offset_from(top, idx, &off[i]);
      bump(idx, s);
    }
    return;
  }
  Level lv[16];
  for (size_t k = 0; k < top; ++k) lv[k].v = &m.views[k];
  for (int64_t i = 0; i < n; ++i) {
    bool ok = true;
    int64_t o = tv.offset;
    for (size_t d = 0; d < s.size(); ++d) {
      o += idx[d] * tv.strides[d];
      if (tv.masked()) ok &= idx[d] >= tv.lo[d] && idx[d] < tv.hi[d];
    }
    for (size_t k = top; ok && k-- > 0;) {
      lv[k].seek(o);
      ok = lv[k].in_mask();
      o = lv[k].off;
    }
    valid[i] = ok;
    off[i] = o;
    bump(idx, s);
  }
}

}  // namespace

void tile_offsets(const IndexMap& m, int64_t start, int64_t n, int64_t* off, uint8_t* valid) {
  size_t top = m.effective_top();
  const kir::View& v = m.views[top];
  const Shape& s = v.shape;
  size_t r = s.size();
  int64_t idx[32];
  unravel(start, s, idx);
  if (top > 0) {
    stacked_offsets(m, top, idx, n, off, valid);
    return;
  }
  if (r == 0) {
    for (int64_t i = 0; i < n; ++i) off[i] = v.offset, valid[i] = 1;
    return;
  }
  bool masked = v.masked();
  int64_t last = int64_t(r) - 1, inner = s[last], st = v.strides[last];
  int64_t lo = masked ? v.lo[last] : 0, hi = masked ? v.hi[last] : inner;
  for (int64_t i = 0; i < n;) {
    int64_t base = v.offset;
    bool row_ok = true;
    for (int64_t d = 0; d < last; ++d) {
      base += idx[d] * v.strides[d];
      if (masked) row_ok &= idx[d] >= v.lo[d] && idx[d] < v.hi[d];
    }
    int64_t run = std::min(n - i, inner - idx[last]);
    for (int64_t j = 0; j < run; ++j) {
      int64_t p = idx[last] + j;
      off[i + j] = base + p * st;
      valid[i + j] = row_ok && p >= lo && p < hi;
    }
    i += run;
    idx[last] += run - 1;
    bump(idx, s);
  }
}

kir::View coalesced(const kir::View& v) {
  kir::View r;
  r.offset = v.offset;
  const bool masked = v.masked();
  auto whole = [&](size_t d) { return !masked || (v.lo[d] <= 0 && v.hi[d] >= v.shape[d]); };
  bool prev_whole = false, any_mask = false;
  for (size_t d = 0; d < v.shape.size(); ++d) {
    const bool w = whole(d);
    if (w && v.shape[d] == 1) continue;
    if (w && prev_whole && r.strides.back() == v.strides[d] * v.shape[d]) {
      r.shape.back() *= v.shape[d];
      r.strides.back() = v.strides[d];
      if (masked) r.hi.back() = r.shape.back();
      continue;
    }
    r.shape.push_back(v.shape[d]);
    r.strides.push_back(v.strides[d]);
    if (masked) r.lo.push_back(w ? 0 : v.lo[d]), r.hi.push_back(w ? v.shape[d] : v.hi[d]);
    prev_whole = w;
    any_mask |= !w;
  }
  if (!any_mask) r.lo.clear(), r.hi.clear();
  return r;
}

}  // namespace tessera::backends::cpu
