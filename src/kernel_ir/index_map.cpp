#include "kernel_ir/index_map.h"

#include <algorithm>
#include <sstream>

namespace tessera::kir {
namespace {

View plain(const Shape& s, int64_t offset = 0) {
  View v;
  v.shape = s;
  v.strides = contiguous_strides(s);
  v.offset = offset;
  return v;
}

// Strides for viewing (shape, strides) as new_shape without copying, if possible (the algorithm
// PyTorch uses for Tensor.view); false if the dimensions cannot be merged/split in place.
bool restride(const Shape& old, const std::vector<int64_t>& st, const Shape& nw, std::vector<int64_t>& out) {
  out.assign(nw.size(), 0);
  if (numel(old) == 0 || old.empty()) {
    out = contiguous_strides(nw);
    return true;
  }
  int64_t view_d = int64_t(nw.size()) - 1;
  int64_t chunk_base = st.back(), tensor_numel = 1, view_numel = 1;
  for (int64_t d = int64_t(old.size()) - 1; d >= 0; --d) {
    tensor_numel *= old[d];
    if (d == 0 || (old[d - 1] != 1 && st[d - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || nw[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base;
        view_numel *= nw[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base = st[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

void ensure_mask(View& v) {
  if (v.masked()) return;
  v.lo.assign(v.shape.size(), 0);
  v.hi = v.shape;
}

}  // namespace

IndexMap IndexMap::contiguous(const Shape& s) { return IndexMap{{plain(s)}}; }

bool IndexMap::operator==(const IndexMap& o) const { return views == o.views; }

size_t IndexMap::hash() const {
  size_t h = views.size();
  auto mix = [&](int64_t x) { h ^= size_t(x) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  for (const View& v : views) {
    for (int64_t x : v.shape) mix(x);
    for (int64_t x : v.strides) mix(x);
    mix(v.offset);
    for (int64_t x : v.lo) mix(x);
    for (int64_t x : v.hi) mix(x);
  }
  return h;
}

bool IndexMap::is_contiguous() const {
  if (!single()) return false;
  const View& v = views[0];
  int64_t acc = 1;
  for (size_t i = v.shape.size(); i-- > 0;) {
    if (v.shape[i] != 1 && v.strides[i] != acc) return false;
    acc *= v.shape[i];
  }
  return true;
}

// A masked view reshaped in place: the dimensions are restrided, and every group of old
// dimensions that becomes a group of new ones (equal products) either has no mask or has one
// dimension longer than 1 on each side, which keeps its mask.
static bool masked_reshape(const View& v, const Shape& s, View& out) {
  std::vector<int64_t> st;
  if (numel(v.shape) == 0 || !restride(v.shape, v.strides, s, st)) return false;
  View r;
  r.shape = s;
  r.strides = st;
  r.offset = v.offset;
  r.lo.assign(s.size(), 0);
  r.hi = s;
  bool empty = false;
  for (size_t d = 0; d < v.shape.size(); ++d) empty |= v.lo[d] >= v.hi[d];
  size_t i = 0, j = 0, no = v.shape.size(), nn = s.size();
  while (i < no || j < nn) {
    size_t i0 = i, j0 = j;
    int64_t po = i < no ? v.shape[i++] : 1, pn = j < nn ? s[j++] : 1;
    while (po != pn) {
      if (po < pn && i < no) po *= v.shape[i++];
      else if (pn < po && j < nn) pn *= s[j++];
      else return false;
    }
    int masked_old = -1, long_old = 0, long_new = -1, n_long_new = 0;
    for (size_t a = i0; a < i; ++a) {
      if (v.lo[a] != 0 || v.hi[a] != v.shape[a]) masked_old = int(a);
      long_old += v.shape[a] > 1;
    }
    for (size_t b = j0; b < j; ++b)
      if (s[b] > 1) long_new = int(b), n_long_new++;
    if (masked_old < 0 || empty) continue;
    if (long_old != 1 || n_long_new != 1 || v.shape[masked_old] <= 1) return false;
    r.lo[long_new] = v.lo[masked_old];
    r.hi[long_new] = v.hi[masked_old];
  }
  if (empty && !s.empty()) r.lo[0] = r.hi[0] = 0;
  if (empty && s.empty()) return false;
  out = r;
  return true;
}

IndexMap IndexMap::reshape(const Shape& s) const {
  IndexMap r = *this;
  View& top = r.views.back();
  if (top.shape == s) return r;
  std::vector<int64_t> st;
  if (!top.masked() && restride(top.shape, top.strides, s, st)) {
    top.shape = s;
    top.strides = st;
    return r;
  }
  View m;
  if (top.masked() && masked_reshape(top, s, m)) {
    top = m;
    return r;
  }
  r.views.push_back(plain(s));  // index -> linear position in the previous view -> unravel
  return r;
}

IndexMap IndexMap::permute(const std::vector<int64_t>& p) const {
  IndexMap r = *this;
  View& top = r.views.back();
  View old = top;
  for (size_t i = 0; i < p.size(); ++i) {
    top.shape[i] = old.shape[p[i]];
    top.strides[i] = old.strides[p[i]];
    if (old.masked()) {
      top.lo[i] = old.lo[p[i]];
      top.hi[i] = old.hi[p[i]];
    }
  }
  return r;
}

IndexMap IndexMap::expand(const Shape& s) const {
  IndexMap r = *this;
  View& top = r.views.back();
  for (size_t i = 0; i < s.size(); ++i) {
    if (top.shape[i] == s[i]) continue;
    top.strides[i] = 0;
    if (top.masked()) top.hi[i] = top.lo[i] < top.hi[i] ? s[i] : 0;
    top.shape[i] = s[i];
  }
  return r;
}

IndexMap IndexMap::slice(const std::vector<int64_t>& v) const {
  IndexMap r = *this;
  View& top = r.views.back();
  for (size_t d = 0; d < top.shape.size(); ++d) {
    int64_t start = v[3 * d], stop = v[3 * d + 1], step = v[3 * d + 2];
    int64_t n = (stop - start + step - 1) / step;
    top.offset += start * top.strides[d];
    top.strides[d] *= step;
    if (top.masked()) {
      auto ceil_div = [](int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); };
      top.lo[d] = std::clamp<int64_t>(ceil_div(top.lo[d] - start, step), 0, n);
      top.hi[d] = std::clamp<int64_t>(ceil_div(top.hi[d] - start, step), top.lo[d], n);
    }
    top.shape[d] = n;
  }
  return r;
}

IndexMap IndexMap::pad(const std::vector<int64_t>& v) const {
  IndexMap r = *this;
  size_t rank = shape().size();
  // Interior padding of dimension d: view it as [n, 1], pad to [n, p+1], merge, drop the tail.
  for (size_t d = 0; d < rank; ++d) {
    int64_t p = v[3 * d + 2], n = r.shape()[d];
    if (p == 0 || n <= 1) continue;
    Shape s = r.shape();
    Shape split = s;
    split.insert(split.begin() + d + 1, 1);
    r = r.reshape(split);
    std::vector<int64_t> pads(3 * split.size(), 0);
    pads[3 * (d + 1) + 1] = p;
    r = r.pad(pads);
    Shape merged = s;
    merged[d] = n * (p + 1);
    r = r.reshape(merged);
    std::vector<int64_t> sl(3 * rank);
    for (size_t k = 0; k < rank; ++k) sl[3 * k] = 0, sl[3 * k + 1] = merged[k], sl[3 * k + 2] = 1;
    sl[3 * d + 1] = n * (p + 1) - p;
    r = r.slice(sl);
  }
  View& top = r.views.back();
  for (size_t d = 0; d < rank; ++d) {
    int64_t lo = v[3 * d], hi = v[3 * d + 1];
    if (lo == 0 && hi == 0) continue;
    ensure_mask(top);
    top.offset -= lo * top.strides[d];
    top.lo[d] += lo;
    top.hi[d] += lo;
    top.shape[d] += lo + hi;
  }
  return r;
}

IndexMap IndexMap::reverse(const std::vector<int64_t>& axes) const {
  IndexMap r = *this;
  View& top = r.views.back();
  for (int64_t d : axes) {
    int64_t n = top.shape[d];
    if (n == 0) continue;
    top.offset += (n - 1) * top.strides[d];
    top.strides[d] = -top.strides[d];
    if (top.masked()) {
      int64_t lo = top.lo[d];
      top.lo[d] = n - top.hi[d];
      top.hi[d] = n - lo;
    }
  }
  return r;
}

IndexMap IndexMap::window(const Shape& s, const std::vector<int64_t>& dims, const std::vector<int64_t>& steps) const {
  IndexMap r = *this;
  const View& top = r.views.back();
  View w;
  w.shape = s;
  w.offset = top.masked() ? 0 : top.offset;
  std::vector<int64_t> base = top.masked() ? contiguous_strides(top.shape) : top.strides;
  for (size_t j = 0; j < s.size(); ++j) w.strides.push_back(steps[j] * base[size_t(dims[j])]);
  if (top.masked()) r.views.push_back(w);
  else r.views.back() = w;
  return r;
}

size_t IndexMap::effective_top() const {
  size_t k = views.size() - 1;
  while (k > 0) {
    const View& v = views[k];
    if (v.masked() || v.offset != 0 || v.strides != contiguous_strides(v.shape)) break;
    --k;
  }
  return k;
}

bool IndexMap::offset_from(size_t top, const int64_t* idx, int64_t* out) const {
  int64_t buf[16];
  std::vector<int64_t> heap;
  const int64_t* cur = idx;
  for (size_t k = top + 1; k-- > 0;) {
    const View& v = views[k];
    size_t rank = v.shape.size();
    if (v.masked())
      for (size_t d = 0; d < rank; ++d)
        if (cur[d] < v.lo[d] || cur[d] >= v.hi[d]) return false;
    int64_t off = v.offset;
    for (size_t d = 0; d < rank; ++d) off += cur[d] * v.strides[d];
    if (k == 0) {
      *out = off;
      return true;
    }
    const Shape& ps = views[k - 1].shape;
    int64_t* dst = buf;
    if (ps.size() > 16) {
      heap.resize(ps.size());
      dst = heap.data();
    }
    for (size_t d = ps.size(); d-- > 0;) {
      int64_t e = ps[d] == 0 ? 1 : ps[d];
      dst[d] = off % e;
      off /= e;
    }
    cur = dst;
  }
  return false;
}

std::string IndexMap::str() const {
  std::ostringstream os;
  for (size_t k = 0; k < views.size(); ++k) {
    const View& v = views[k];
    os << (k ? " <- " : "") << "view(" << shape_str(v.shape) << " strides=" << shape_str(v.strides) << " offset=" << v.offset;
    if (v.masked()) os << " mask=" << shape_str(v.lo) << ".." << shape_str(v.hi);
    os << ")";
  }
  return os.str();
}

}  // namespace tessera::kir
