// sort and argsort as a bitonic sorting network over the primitives: the dim is moved last and
// padded to a power of two, then log2(m) * (log2(m) + 1) / 2 compare-exchange stages each
// reshape it to [..., m / 2j, 2, j] and swap the halves where they are out of order. Keys compare
// as (value, index) pairs, so the order is total: the sort is stable and the padding (+inf at
// indices >= n) lands after every element. The values are gathered from the input by the final
// indices, so their gradient flows back through the gather.
#include <cmath>
#include <limits>

#include "core/fail.h"
#include "tessera/ops.h"

namespace tessera {
namespace {

std::string desc(const Tensor& t) { return std::string(dtype_name(t.dtype())) + shape_str(t.shape()); }

// Blocks of the stage (k, j) that sort ascending: block b starts at position b * 2j, and a
// position's direction bit is (position & k) == 0, that is floor(position / k) is even (k is a
// power of two). Made from an iota (exact in float32 up to 2^24 positions), so tracing a sort
// uploads nothing.
Tensor ascending_blocks(int64_t m, int64_t k, int64_t j, const Device& dev) {
  Tensor q = floor(arange(0, double(m / (2 * j)), 1, TensorOptions{DType::Float32, dev}) * double(2 * j) * (1.0 / double(k)));
  return eq(q - floor(q * 0.5) * 2.0, zeros({}, {DType::Float32, dev})).reshape({m / (2 * j), 1});
}

// One compare-exchange stage on keys v and indices i, both [..., m].
void stage(Tensor& v, Tensor& i, int64_t m, int64_t k, int64_t j) {
  Shape s = v.shape();
  Shape split(s.begin(), s.end() - 1);
  split.insert(split.end(), {m / (2 * j), 2, j});
  Tensor vs = v.reshape(split), is = i.reshape(split);
  Tensor vlo = vs.narrow(-2, 0, 1), vhi = vs.narrow(-2, 1, 1);
  Tensor ilo = is.narrow(-2, 0, 1), ihi = is.narrow(-2, 1, 1);
  // (vlo, ilo) > (vhi, ihi), lexicographically
  Tensor greater = logical_or(gt(vlo, vhi), logical_and(eq(vlo, vhi), gt(ilo, ihi)));
  Tensor asc = ascending_blocks(m, k, j, v.device()).unsqueeze(-1);  // [m/2j, 1, 1]
  Tensor swap = logical_xor(greater, logical_not(asc));  // ascending: swap if greater
  v = cat({where(swap, vhi, vlo), where(swap, vlo, vhi)}, -2).reshape(s);
  i = cat({where(swap, ihi, ilo), where(swap, ilo, ihi)}, -2).reshape(s);
}

// The int64 indices that sort a along d (n = a.size(d) >= 2), without autodiff history.
Tensor sorted_indices(const Tensor& a, int64_t d, bool descending) {
  NoGradGuard no_grad;
  int64_t n = a.size(d);
  // Keys: floats in their compute dtype, integers and bool as float64 (exact up to 2^53); NaN
  // counts as +inf (ordered among the infinities by index); descending sorts the negation.
  DType work = is_floating(a.dtype()) ? compute_dtype(a.dtype()) : DType::Float64;
  Tensor v = a.to(work).transpose(d, -1);
  double inf = std::numeric_limits<double>::infinity();
  v = where(ne(v, v), full({}, inf, {work, a.device()}), v);
  if (descending) v = -v;
  if (n > (int64_t(1) << 24)) fail("sort", "sorts at most 2^24 elements along a dimension, got " + desc(a) + " along " + std::to_string(d));
  int64_t m = 1;
  while (m < n) m *= 2;
  if (m > n) {
    std::vector<int64_t> pads(size_t(2 * v.dim()), 0);
    pads.back() = m - n;
    v = pad(v, pads, inf);
  }
  Shape ishape(size_t(v.dim()), 1);
  ishape.back() = m;
  Tensor i = arange(0, double(m), 1, TensorOptions{DType::Int64, a.device()}).reshape(ishape).expand(v.shape());
  for (int64_t k = 2; k <= m; k *= 2)
    for (int64_t j = k / 2; j >= 1; j /= 2) stage(v, i, m, k, j);
  return i.narrow(-1, 0, n).transpose(d, -1);
}

}  // namespace

std::tuple<Tensor, Tensor> sort(const Tensor& a, int64_t dim, bool descending) {
  if (!a.defined()) fail("sort", "called on an undefined tensor");
  if (a.dim() == 0) return {a, zeros({}, {DType::Int64, a.device()})};
  int64_t d = wrap_dim(dim, a.shape(), "sort");
  if (a.size(d) <= 1) return {a, zeros(a.shape(), {DType::Int64, a.device()})};
  Tensor idx = sorted_indices(a.detach(), d, descending);
  return {gather(a, d, idx), idx};
}

Tensor argsort(const Tensor& a, int64_t dim, bool descending) { return std::get<1>(sort(a, dim, descending)); }

}  // namespace tessera
