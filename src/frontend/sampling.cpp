// cumsum, topk and multinomial as decompositions: a triangular product; k rounds of argmax with the winner masked out, and
// the Gumbel-max trick (argmax of log-weights plus Gumbel noise draws exactly from the
// categorical; its top-k draws without replacement).
#include <limits>

#include "core/fail.h"
#include "tessera/ops.h"

namespace tessera {
namespace {

std::string desc(const Tensor& t) { return std::string(dtype_name(t.dtype())) + shape_str(t.shape()); }

}  // namespace

Tensor cumsum(const Tensor& a, int64_t dim) {
  if (!a.defined()) fail("cumsum", "called on an undefined tensor");
  if (a.dim() == 0) return is_floating(a.dtype()) ? a : a.to(DType::Int64);
  int64_t d = wrap_dim(dim, a.shape(), "cumsum");
  int64_t n = a.size(d);
  DType out = is_floating(a.dtype()) ? a.dtype() : DType::Int64;
  DType work = is_floating(a.dtype()) ? compute_dtype(a.dtype()) : DType::Float64;
  // upper[i][j] = 1 for i <= j: (x moved to the last dim) @ upper sums x[.., 0..j] into j.
  Tensor upper = triu(ones({n, n}, {work, a.device()}));
  Tensor x = a.to(work).transpose(d, -1);
  return matmul(x, upper).transpose(d, -1).to(out);
}

std::tuple<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted) {
  (void)sorted;  // always sorted: the rounds find the elements in order
  if (!a.defined()) fail("topk", "called on an undefined tensor");
  if (a.dtype() == DType::Bool) fail("topk", "not defined for bool tensors, got " + desc(a));
  if (a.dim() == 0) {
    if (k < 0 || k > 1) fail("topk", "k = " + std::to_string(k) + " out of range for a 0-d tensor");
    return {a, zeros({}, {DType::Int64, a.device()})};
  }
  int64_t d = wrap_dim(dim, a.shape(), "topk");
  int64_t n = a.size(d);
  if (k < 0 || k > n)
    fail("topk", "k = " + std::to_string(k) + " out of range for dim " + std::to_string(d) + " of " + desc(a));
  // Work in float64 for integers (exact up to 2^53), so the mask value -inf exists.
  Tensor work = (is_floating(a.dtype()) ? a : a.to(DType::Float64)).detach();
  if (!largest) work = -work;
  Shape s(size_t(a.dim()), 1);
  s[d] = n;
  Tensor pos = arange(0, double(n), 1, TensorOptions{DType::Int64, a.device()}).reshape(s);
  Tensor ninf = full({}, -std::numeric_limits<double>::infinity(), {work.dtype(), a.device()});
  std::vector<Tensor> picked;
  for (int64_t i = 0; i < k; ++i) {
    Tensor j = argmax(work, d, true);
    picked.push_back(j);
    if (i + 1 < k) work = where(eq(pos, j), ninf, work);
  }
  Shape empty = a.shape();
  empty[d] = 0;
  Tensor idx = k ? cat(picked, d) : zeros(empty, {DType::Int64, a.device()});
  return {gather(a, d, idx), idx};
}

Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement) {
  if (!probs.defined()) fail("multinomial", "called on an undefined tensor");
  if ((probs.dim() != 1 && probs.dim() != 2) || !is_floating(probs.dtype()))
    fail("multinomial", "expects floating weights [C] or [N, C], got " + desc(probs));
  int64_t c = probs.size(-1);
  if (num_samples <= 0) fail("multinomial", "num_samples must be positive, got " + std::to_string(num_samples));
  if (!replacement && num_samples > c)
    fail("multinomial", "cannot draw " + std::to_string(num_samples) + " samples without replacement from " +
                            std::to_string(c) + " categories (" + desc(probs) + ")");
  NoGradGuard no_grad;
  Tensor logw = log(probs.to(DType::Float32));
  auto gumbel = [&](const Shape& s) {
    Tensor u = rand(s, {DType::Float32, probs.device()});
    return -log(-log(u));
  };
  if (!replacement) return std::get<1>(topk(logw + gumbel(logw.shape()), num_samples, -1));
  Shape s = logw.shape();
  s.insert(s.end() - 1, num_samples);  // [..., samples, C]
  return argmax(logw.unsqueeze(-2) + gumbel(s), -1);
}

}  // namespace tessera
