// libtorch-style indexing, x.index({Slice(1, None), 0, None, Ellipsis}), as public ops: slices
// and reshapes for reading, pad + where for index_put's write.
#include <algorithm>
#include <limits>

#include "core/fail.h"
#include "tessera/ops.h"

namespace tessera {
namespace {

using indexing::TensorIndex;
using Kind = TensorIndex::Kind;

std::string desc(const Tensor& t) { return std::string(dtype_name(t.dtype())) + shape_str(t.shape()); }

std::string bound(const std::optional<int64_t>& b) { return b ? std::to_string(*b) : "None"; }
std::string index_str(const std::vector<TensorIndex>& ix) {
  std::string s = "{";
  for (size_t i = 0; i < ix.size(); ++i) {
    if (i) s += ", ";
    const TensorIndex& e = ix[i];
    switch (e.kind()) {
      case Kind::Integer: s += std::to_string(e.integer()); break;
      case Kind::Slice:
        s += "Slice(" + bound(e.slice().start) + ", " + bound(e.slice().stop) + ", " + bound(e.slice().step) + ")";
        break;
      case Kind::None: s += "None"; break;
      case Kind::Ellipsis: s += "Ellipsis"; break;
      case Kind::Tensor: s += e.tensor().defined() ? "tensor " + desc(e.tensor()) : "undefined tensor"; break;
    }
  }
  return s + "}";
}

// One entry per source dim (Ellipsis expanded, unindexed trailing dims as Slice()), plus the
// None entries in place; integers wrapped, slice steps and tensor dtypes checked.
std::vector<TensorIndex> normalize(const Tensor& a, const std::vector<TensorIndex>& ix, const char* op) {
  if (!a.defined()) fail(op, "called on an undefined tensor");
  auto bad = [&](const std::string& why) { fail(op, why + ": indices " + index_str(ix) + " for " + desc(a)); };
  int64_t consuming = 0, ellipses = 0, tensors = 0;
  for (const TensorIndex& e : ix) {
    consuming += e.kind() == Kind::Integer || e.kind() == Kind::Slice || e.kind() == Kind::Tensor;
    ellipses += e.kind() == Kind::Ellipsis;
    tensors += e.kind() == Kind::Tensor;
  }
  if (ellipses > 1) bad("at most one Ellipsis");
  if (tensors > 1) bad("one tensor index at most (several would index jointly, which is not supported)");
  if (consuming > a.dim()) bad("too many indices (" + std::to_string(consuming) + ") for " + std::to_string(a.dim()) + " dims");
  std::vector<TensorIndex> out;
  int64_t d = 0;  // the source dim the next consuming entry indexes
  auto fill_to = [&](int64_t end) {
    for (; d < end; ++d) out.emplace_back(indexing::Slice());
  };
  for (const TensorIndex& e : ix) {
    switch (e.kind()) {
      case Kind::Ellipsis: fill_to(d + a.dim() - consuming); continue;
      case Kind::None: out.push_back(e); continue;
      case Kind::Integer: {
        int64_t n = a.shape()[d], i = e.integer();
        if (i < -n || i >= n)
          bad("index " + std::to_string(i) + " is out of bounds for dim " + std::to_string(d) + " of extent " + std::to_string(n));
        out.emplace_back(i < 0 ? i + n : i);
        break;
      }
      case Kind::Slice:
        if (e.slice().step.value_or(1) < 1) bad("slice steps must be positive");
        out.push_back(e);
        break;
      case Kind::Tensor:
        if (!e.tensor().defined()) bad("an undefined tensor index");
        if (e.tensor().dtype() == DType::Bool)
          bad("bool (mask) indices are not supported: the result's shape would depend on the values; use where or masked_fill");
        if (!is_integral(e.tensor().dtype())) bad("tensor indices must be integers");
        out.push_back(e);
        break;
    }
    ++d;
  }
  fill_to(a.dim());
  return out;
}

// A slice entry's [start, stop) clamped like Python's, and its step.
struct Range {
  int64_t start, count, step;
};
Range range_of(const indexing::Slice& s, int64_t n) {
  auto clampi = [n](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + n : v, 0, n); };
  int64_t start = clampi(s.start.value_or(0)), stop = std::max(start, clampi(s.stop.value_or(n))), step = s.step.value_or(1);
  return {start, (stop - start + step - 1) / step, step};
}

// Spreads t's dim d (count entries) to a stride of `step` elements: entry k lands at k * step,
// `fill` in between; the result has (count - 1) * step + 1 entries along d.
Tensor spread(const Tensor& t, int64_t d, int64_t step, double fill) {
  if (step == 1 || t.shape()[d] == 0) return t;
  Tensor u = unsqueeze(t, d + 1);
  std::vector<int64_t> pads(size_t(2 * u.dim()), 0);
  pads[size_t(2 * (d + 1) + 1)] = step - 1;
  Shape s = t.shape();
  s[d] *= step;
  return slice(reshape(pad(u, pads, fill), s), d, 0, (t.shape()[d] - 1) * step + 1);
}

}  // namespace

Tensor index(const Tensor& a, const std::vector<TensorIndex>& indices) {
  std::vector<TensorIndex> ix = normalize(a, indices, "index");
  Tensor r = a;
  int64_t d = 0;  // the result's dim the next entry applies to
  for (const TensorIndex& e : ix) {
    switch (e.kind()) {
      case Kind::None: r = unsqueeze(r, d++); break;
      case Kind::Integer: r = squeeze(slice(r, d, e.integer(), e.integer() + 1), d); break;
      case Kind::Slice: {
        Range g = range_of(e.slice(), r.shape()[d]);
        r = slice(r, d++, g.start, g.start + g.count * g.step, g.step);
        break;
      }
      case Kind::Tensor: {
        const Tensor& t = e.tensor();
        int64_t n = r.shape()[d];
        Tensor i = t.reshape({-1});
        i = where(i < 0.0, i + double(n), i);  // negative entries count from the end
        Shape s = r.shape();
        s.erase(s.begin() + d);
        s.insert(s.begin() + d, t.shape().begin(), t.shape().end());
        r = reshape(index_select(r, d, i), s);
        d += t.dim();
        break;
      }
      case Kind::Ellipsis: break;  // expanded by normalize
    }
  }
  return r;
}

Tensor index_put(const Tensor& a, const std::vector<TensorIndex>& indices, const Tensor& value) {
  std::vector<TensorIndex> ix = normalize(a, indices, "index_put");
  if (!value.defined()) fail("index_put", "the value is undefined; indices " + index_str(indices) + " for " + desc(a));
  // The indexed region as a box over a's dims (integers keep an extent-1 dim), and the shape
  // x.index(indices) has, which the value broadcasts to.
  Shape view_shape, box_shape;
  std::vector<Range> ranges;
  for (const TensorIndex& e : ix) {
    if (e.kind() == Kind::None) {
      view_shape.push_back(1);
      continue;
    }
    if (e.kind() == Kind::Tensor)
      fail("index_put", "tensor indices are not supported (use scatter_add or where); indices " + index_str(indices) + " for " + desc(a));
    int64_t n = a.shape()[ranges.size()];
    Range g = e.kind() == Kind::Integer ? Range{e.integer(), 1, 1} : range_of(e.slice(), n);
    if (e.kind() == Kind::Slice) view_shape.push_back(g.count);
    box_shape.push_back(g.count);
    ranges.push_back(g);
  }
  if (broadcast_shapes(value.shape(), view_shape, "index_put") != view_shape)
    fail("index_put", "value " + desc(value) + " does not broadcast to the indexed shape " + shape_str(view_shape) + " of " + desc(a));
  if (numel(box_shape) == 0) return a;
  Tensor v = reshape(expand(value.to(a.dtype()), view_shape), box_shape);
  Tensor mask = full(box_shape, 1, {DType::Bool, a.device()});
  std::vector<int64_t> pads;
  for (int64_t d = 0; d < a.dim(); ++d) {
    const Range& g = ranges[size_t(d)];
    v = spread(v, d, g.step, 0);
    mask = spread(mask, d, g.step, 0);
    pads.insert(pads.end(), {g.start, a.shape()[d] - g.start - v.shape()[d]});
  }
  return where(pad(mask, pads, 0), pad(v, pads, 0), a);
}

Tensor Tensor::index(const std::vector<TensorIndex>& indices) const { return tessera::index(*this, indices); }

}  // namespace tessera
