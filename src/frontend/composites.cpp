// Decompositions: every op here is built from public ops (and so from primitives), which gives
// each backend the op for free and lets autodiff differentiate it through its parts (gelu gives
// its own derivative, computed in the forward and saved: autodiff::record_custom).
#include <algorithm>
#include <cmath>

#include "autodiff/autograd.h"
#include "core/fail.h"
#include "ir/build.h"
#include "tensor/tensor_impl.h"
#include "tessera/autocast.h"
#include "tessera/ops.h"

namespace tessera {
namespace {

std::string desc(const Tensor& t) { return std::string(dtype_name(t.dtype())) + shape_str(t.shape()); }
void need(const Tensor& t, const char* op) {
  if (!t.defined()) fail(op, "called on an undefined tensor");
}
Tensor floating(const Tensor& a, const char* op) {
  need(a, op);
  return is_floating(a.dtype()) ? a : a.to(DType::Float32);
}
// Validates reduction dims under the caller's name before any internal op sees them.
void check_dims(const Tensor& a, const std::vector<int64_t>& dims, const char* op) {
  need(a, op);
  std::vector<int64_t> seen;
  for (int64_t d : dims) {
    int64_t w = wrap_dim(d, a.shape(), op);
    if (std::find(seen.begin(), seen.end(), w) != seen.end()) fail(op, "repeated dimension " + std::to_string(d) + " for " + desc(a));
    seen.push_back(w);
  }
}
void check_binary(const Tensor& a, const Tensor& b, const char* op) {
  need(a, op);
  need(b, op);
  broadcast_shapes(a.shape(), b.shape(), op);
}
Tensor as_bool(const Tensor& a) { return a.dtype() == DType::Bool ? a : ne(a, zeros({}, {a.dtype(), a.device()})); }
// iota along `dim` of a tensor of `rank` dims, shaped to broadcast against it.
Tensor position(int64_t n, int64_t dim, int64_t rank, const Device& d) {
  Shape s(size_t(rank), 1);
  s[dim] = n;
  return arange(0, double(n), 1, TensorOptions{DType::Int64, d}).reshape(s);
}

}  // namespace

// ---- factories ----
Tensor linspace(double start, double end, int64_t steps, TensorOptions o) {
  if (steps < 0) fail("linspace", "number of steps must be non-negative, got " + std::to_string(steps));
  if (steps == 1) return full({1}, start, o);
  Tensor i = arange(0, double(steps), 1, TensorOptions{DType::Float64, o.device});
  double step = steps > 1 ? (end - start) / double(steps - 1) : 0;
  // Symmetric like PyTorch: both endpoints are exact.
  Tensor lo = i * step + start, hi = (i - double(steps - 1)) * step + end;
  return where(i < double(steps / 2), lo, hi).to(o.dtype);
}

Tensor eye(int64_t n, int64_t m, TensorOptions o) {
  if (m < 0) m = n;
  if (n < 0) fail("eye", "size must be non-negative, got " + std::to_string(n));
  return eq(position(n, 0, 2, o.device), position(m, 1, 2, o.device)).to(o.dtype);
}

Tensor randint(int64_t low, int64_t high, const Shape& s, TensorOptions o) {
  if (high <= low) fail("randint", "empty range [" + std::to_string(low) + ", " + std::to_string(high) + ")");
  Tensor u = rand(s, {DType::Float64, o.device});
  return (floor(u * double(high - low)) + double(low)).to(o.dtype);
}
Tensor rand_like(const Tensor& t) { return rand(t.shape(), {t.dtype(), t.device()}); }
Tensor randn_like(const Tensor& t) { return randn(t.shape(), {t.dtype(), t.device()}); }

// ---- elementwise ----
Tensor rsqrt(const Tensor& a) { return 1.0 / sqrt(floating(a, "rsqrt")); }
Tensor reciprocal(const Tensor& a) { return 1.0 / floating(a, "reciprocal"); }
Tensor square(const Tensor& a) { need(a, "square"); return a * a; }

// exp(-|x|) never overflows, so neither the value nor the gradient meets inf * 0.
Tensor sigmoid(const Tensor& a) {
  Tensor x = floating(a, "sigmoid"), t = exp(-abs(x));
  return where(x >= zeros_like(x), 1.0 / (1.0 + t), t / (1.0 + t));
}
Tensor relu(const Tensor& a) {
  need(a, "relu");
  return where(a > 0.0, a, zeros_like(a));
}
Tensor gelu(const Tensor& a, bool tanh_approximation) {
  Tensor x = floating(a, "gelu");
  if (tanh_approximation) {
    const double k = std::sqrt(2.0 / M_PI);
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
  }
  // Under autocast the backward's product rounds GELU's gradient to bfloat16 in a Step of its own
  // either way, and saving the derivative made the benchmark GPT's bf16 step ~1 ms slower
  // (docs/architecture.md, "GELU saves its derivative"): there the backward recomputes it.
  if (!autodiff::grad_enabled() || !autodiff::requires_grad(x) || autocast_dtype())
    return 0.5 * x * (1.0 + erf(x * M_SQRT1_2));
  // With a gradient: the same value, and its derivative computed beside it in the forward
  // (sharing erf) and saved, so the backward is g * GELU'(x) rather than erf and exp again
  // (ir/saved.h): GELU'(x) = (1 + erf(u)) / 2 + x e^(-u^2) / sqrt(2 pi), u = x / sqrt 2.
  Tensor y, d;
  {
    NoGradGuard no_grad;
    Tensor u = x * M_SQRT1_2, e1 = 1.0 + erf(u);
    y = 0.5 * x * e1;
    d = 0.5 * e1 + x * (exp(neg(u * u)) * (1 / std::sqrt(2 * M_PI)));
  }
  autodiff::record_custom(y, {&x}, {detail::node_of(d)}, [](const ir::NodePtr& g, const std::vector<ir::NodePtr>& saved) {
    return std::vector<ir::NodePtr>{ir::build::mul(g, saved[0])};
  });
  return y;
}
Tensor silu(const Tensor& a) { return floating(a, "silu") * sigmoid(a); }

// log(1 + u) for u >= 0, accurate for tiny u (no log1p primitive yet).
static Tensor log1p_nonneg(const Tensor& u) {
  Tensor small = u < 1e-4;
  Tensor series = u - u * u * 0.5 + u * u * u * (1.0 / 3);
  return where(small, series, log(1.0 + where(small, ones_like(u), u)));
}
Tensor softplus(const Tensor& a, double beta, double threshold) {
  Tensor x = floating(a, "softplus"), z = x * beta;
  // Above the threshold softplus is x; the other branch is evaluated on a clamped input so it
  // stays finite (where() would otherwise pass 0 * inf = NaN gradients).
  Tensor zc = minimum(z, full_like(z, threshold));
  Tensor sp = (maximum(zc, zeros_like(zc)) + log1p_nonneg(exp(-abs(zc)))) / beta;
  return where(z > threshold, x, sp);
}

Tensor clamp(const Tensor& a, std::optional<double> lo, std::optional<double> hi) {
  need(a, "clamp");
  if (!lo && !hi) fail("clamp", "needs at least one of min and max");
  // max then min, as PyTorch: with lo > hi every element becomes hi.
  Tensor r = a;
  if (lo) {
    Tensor l = full({}, *lo, {promote_scalar(r.dtype(), *lo), r.device()});
    r = where(r < l, l, r);
  }
  if (hi) {
    Tensor h = full({}, *hi, {promote_scalar(r.dtype(), *hi), r.device()});
    r = where(r > h, h, r);
  }
  return r;
}

// ---- logical ----
Tensor logical_and(const Tensor& a, const Tensor& b) {
  check_binary(a, b, "logical_and");
  return minimum(as_bool(a), as_bool(b));
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  check_binary(a, b, "logical_or");
  return maximum(as_bool(a), as_bool(b));
}
Tensor logical_xor(const Tensor& a, const Tensor& b) {
  check_binary(a, b, "logical_xor");
  return ne(as_bool(a), as_bool(b));
}
Tensor logical_not(const Tensor& a) {
  need(a, "logical_not");
  return eq(as_bool(a), zeros({}, {DType::Bool, a.device()}));
}

// ---- reductions ----
Tensor mean(const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  need(a, "mean");
  Tensor x = floating(a, "mean");
  int64_t n = 1;
  if (dims.empty()) n = x.numel();
  for (int64_t d : dims) n *= x.shape()[wrap_dim(d, x.shape(), "mean")];
  return x.sum(dims, keepdim) / double(n);
}

static void check_extreme(const Tensor& a, const std::vector<int64_t>& dims, const char* op) {
  check_dims(a, dims, op);
  for (int64_t d = 0; d < a.dim(); ++d) {
    bool reduced = dims.empty();
    for (int64_t x : dims) reduced |= wrap_dim(x, a.shape(), op) == d;
    if (reduced && a.shape()[d] == 0) fail(op, "cannot reduce over the empty dimension " + std::to_string(d) + " of " + desc(a));
  }
}
Tensor amin(const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  check_extreme(a, dims, "amin");
  if (a.dtype() == DType::Bool) fail("amin", "not defined for bool tensors, got " + desc(a));
  return -amax(-a, std::move(dims), keepdim);
}
Tensor max(const Tensor& a) { return amax(a); }
Tensor min(const Tensor& a) { return amin(a); }

static Tensor arg_extreme(const Tensor& a, std::optional<int64_t> dim, bool keepdim, bool is_max, const char* op) {
  need(a, op);
  Tensor x = dim ? a : a.reshape({-1});
  int64_t d = wrap_dim(dim.value_or(0), x.shape(), op);
  int64_t n = x.shape()[d];
  if (n == 0) fail(op, "cannot take the index of an extreme over an empty dimension of " + desc(a));
  Tensor v = is_max ? x : -x.to(is_floating(x.dtype()) ? x.dtype() : DType::Int64);
  Tensor m = amax(v, {d}, true);
  Tensor pos = position(n, d, x.dim(), x.device());
  // The first extreme: the largest -position among the extremes.
  Tensor cand = where(v == m, -pos, full_like(pos, -double(n)));
  Tensor r = -amax(cand, {d}, true);
  if (!dim) return keepdim ? r.reshape(Shape(size_t(a.dim()), 1)) : r.reshape({});
  return keepdim ? r : squeeze(r, d);
}
Tensor argmax(const Tensor& a, std::optional<int64_t> dim, bool keepdim) { return arg_extreme(a, dim, keepdim, true, "argmax"); }
Tensor argmin(const Tensor& a, std::optional<int64_t> dim, bool keepdim) { return arg_extreme(a, dim, keepdim, false, "argmin"); }
// The values are amax/amin over dim: the same maximum node argmax builds (interned once), and
// its gradient goes to the first extreme, the element the index names.
static std::tuple<Tensor, Tensor> extreme_along(const Tensor& a, int64_t dim, bool keepdim, bool is_max) {
  const char* op = is_max ? "max" : "min";
  need(a, op);
  int64_t d = wrap_dim(dim, a.shape(), op);
  if (a.shape()[d] == 0) fail(op, "cannot reduce over the empty dimension " + std::to_string(d) + " of " + desc(a));
  if (is_max) return {amax(a, {d}, keepdim), argmax(a, d, keepdim)};
  return {amin(a, {d}, keepdim), argmin(a, d, keepdim)};
}
std::tuple<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim) { return extreme_along(a, dim, keepdim, true); }
std::tuple<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim) { return extreme_along(a, dim, keepdim, false); }

Tensor var(const Tensor& a, std::vector<int64_t> dims, int64_t correction, bool keepdim) {
  need(a, "var");
  Tensor x = floating(a, "var");
  int64_t n = 1;
  if (dims.empty()) n = x.numel();
  for (int64_t d : dims) n *= x.shape()[wrap_dim(d, x.shape(), "var")];
  Tensor dev = x - mean(x, dims, true);
  return (dev * dev).sum(dims, keepdim) / double(std::max<int64_t>(n - correction, 0));
}
Tensor std(const Tensor& a, std::vector<int64_t> dims, int64_t correction, bool keepdim) {
  check_dims(a, dims, "std");
  return sqrt(var(a, std::move(dims), correction, keepdim));
}

Tensor logsumexp(const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  check_dims(a, dims, "logsumexp");
  Tensor x = floating(a, "logsumexp");
  if (x.numel() == 0) return full(x.sum(dims, keepdim).shape(), -INFINITY, {x.dtype(), x.device()});  // log(0)
  Tensor m = amax(x, dims, true).detach();
  m = where(eq(abs(m), full_like(m, INFINITY)), zeros_like(m), m);  // all -inf (or inf) rows: shift by 0
  Tensor r = log(exp(x - m).sum(dims, true)) + m;
  if (keepdim) return r;
  return x.sum(dims, false).numel() == r.numel() ? r.reshape(x.sum(dims, false).shape()) : r;
}

// ---- views ----
Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length) {
  need(a, "narrow");
  int64_t d = wrap_dim(dim, a.shape(), "narrow"), n = a.shape()[d];
  if (start < 0) start += n;
  if (start < 0 || length < 0 || start + length > n)
    fail("narrow", "range [" + std::to_string(start) + ", " + std::to_string(start + length) + ") out of bounds for dimension " +
                       std::to_string(d) + " of " + desc(a));
  return a.slice(d, start, start + length);
}

Tensor squeeze(const Tensor& a) {
  need(a, "squeeze");
  Shape s;
  for (int64_t e : a.shape())
    if (e != 1) s.push_back(e);
  return a.reshape(s);
}
Tensor squeeze(const Tensor& a, int64_t dim) {
  need(a, "squeeze");
  int64_t d = wrap_dim(dim, a.shape(), "squeeze");
  if (a.shape()[d] != 1) return a;  // like PyTorch: a no-op on other extents
  Shape s = a.shape();
  s.erase(s.begin() + d);
  return a.reshape(s);
}
Tensor unsqueeze(const Tensor& a, int64_t dim) {
  need(a, "unsqueeze");
  int64_t d = wrap_dim(dim, a.shape(), "unsqueeze", true);
  Shape s = a.shape();
  s.insert(s.begin() + d, 1);
  return a.reshape(s);
}
Tensor flatten(const Tensor& a, int64_t start_dim, int64_t end_dim) {
  need(a, "flatten");
  if (a.dim() == 0) return a.reshape({1});
  int64_t s0 = wrap_dim(start_dim, a.shape(), "flatten"), s1 = wrap_dim(end_dim, a.shape(), "flatten");
  if (s0 > s1) fail("flatten", "start_dim " + std::to_string(s0) + " comes after end_dim " + std::to_string(s1) + " for " + desc(a));
  Shape s(a.shape().begin(), a.shape().begin() + s0);
  int64_t m = 1;
  for (int64_t d = s0; d <= s1; ++d) m *= a.shape()[d];
  s.push_back(m);
  s.insert(s.end(), a.shape().begin() + s1 + 1, a.shape().end());
  return a.reshape(s);
}

std::vector<Tensor> split(const Tensor& a, int64_t split_size, int64_t dim) {
  need(a, "split");
  int64_t d = wrap_dim(dim, a.shape(), "split"), n = a.shape()[d];
  if (split_size <= 0) fail("split", "split size must be positive, got " + std::to_string(split_size) + " for " + desc(a));
  std::vector<Tensor> r;
  for (int64_t s = 0; s < n; s += split_size) r.push_back(a.slice(d, s, std::min(n, s + split_size)));
  if (r.empty()) r.push_back(a);
  return r;
}
std::vector<Tensor> chunk(const Tensor& a, int64_t chunks, int64_t dim) {
  need(a, "chunk");
  if (chunks <= 0) fail("chunk", "number of chunks must be positive, got " + std::to_string(chunks) + " for " + desc(a));
  int64_t n = a.shape()[wrap_dim(dim, a.shape(), "chunk")];
  return split(a, std::max<int64_t>(1, (n + chunks - 1) / chunks), dim);
}

Tensor stack(const std::vector<Tensor>& ts, int64_t dim) {
  if (ts.empty()) fail("stack", "needs at least one tensor");
  for (auto& t : ts) {
    need(t, "stack");
    if (t.shape() != ts[0].shape()) fail("stack", "tensors must have one shape, got " + desc(ts[0]) + " and " + desc(t));
  }
  int64_t d = wrap_dim(dim, ts[0].shape(), "stack", true);
  std::vector<Tensor> u;
  for (auto& t : ts) u.push_back(unsqueeze(t, d));
  return cat(u, d);
}

Tensor repeat(const Tensor& a, const std::vector<int64_t>& reps) {
  need(a, "repeat");
  if (int64_t(reps.size()) < a.dim())
    fail("repeat", "needs at least one repeat count per dimension of " + desc(a));
  size_t lead = reps.size() - size_t(a.dim());
  Shape inter, expanded, out;
  for (size_t i = 0; i < reps.size(); ++i) {
    if (reps[i] < 0) fail("repeat", "repeat counts must be non-negative, got " + shape_str(reps) + " for " + desc(a));
    int64_t e = i < lead ? 1 : a.shape()[i - lead];
    inter.insert(inter.end(), {1, e});
    expanded.insert(expanded.end(), {reps[i], e});
    out.push_back(reps[i] * e);
  }
  return a.reshape(inter).expand(expanded).reshape(out);
}

// ---- selection and indexing ----
Tensor masked_fill(const Tensor& a, const Tensor& mask, double value) {
  need(a, "masked_fill");
  need(mask, "masked_fill");
  if (mask.dtype() != DType::Bool) fail("masked_fill", "mask must be bool, got " + desc(mask));
  broadcast_shapes(a.shape(), mask.shape(), "masked_fill");
  return where(mask, full({}, value, {a.dtype(), a.device()}), a);
}

static Tensor triangle(const Tensor& a, int64_t k, bool lower, const char* op) {
  need(a, op);
  if (a.dim() < 2) fail(op, "needs at least 2 dimensions, got " + desc(a));
  int64_t r = a.shape()[a.dim() - 2], c = a.shape()[a.dim() - 1];
  Tensor rows = position(r, 0, 2, a.device()), cols = position(c, 1, 2, a.device());
  Tensor diff = cols - rows;
  Tensor keep = lower ? diff <= full({}, double(k), {DType::Int64, a.device()})
                      : diff >= full({}, double(k), {DType::Int64, a.device()});
  return where(keep, a, zeros({}, {a.dtype(), a.device()}));
}
Tensor tril(const Tensor& a, int64_t k) { return triangle(a, k, true, "tril"); }
Tensor triu(const Tensor& a, int64_t k) { return triangle(a, k, false, "triu"); }

Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) {
  need(a, "index_select");
  need(index, "index_select");
  if (index.dim() != 1 || !is_integral(index.dtype()))
    fail("index_select", "index must be a 1-D integer tensor, got " + desc(index));
  int64_t d = wrap_dim(dim, a.shape(), "index_select");
  Shape s(size_t(a.dim()), 1), full_shape = a.shape();
  s[d] = index.numel();
  full_shape[d] = index.numel();
  return gather(a, d, index.reshape(s).expand(full_shape));
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  need(weight, "embedding");
  need(indices, "embedding");
  if (weight.dim() != 2) fail("embedding", "weight must be [num_embeddings, dim], got " + desc(weight));
  if (!is_integral(indices.dtype())) fail("embedding", "indices must be integers, got " + desc(indices));
  Shape s = indices.shape();
  s.push_back(weight.shape()[1]);
  return index_select(weight, 0, indices.reshape({-1})).reshape(s);
}

// ---- composites for networks ----
Tensor softmax(const Tensor& a, int64_t dim) {
  need(a, "softmax");
  Tensor x = floating(a, "softmax");
  int64_t d = wrap_dim(dim, x.shape(), "softmax");
  Tensor e = exp(x - amax(x, {d}, true).detach());  // the shift cancels in the gradient
  return e / e.sum({d}, true);
}

Tensor log_softmax(const Tensor& a, int64_t dim) {
  need(a, "log_softmax");
  Tensor x = floating(a, "log_softmax");
  int64_t d = wrap_dim(dim, x.shape(), "log_softmax");
  Tensor z = x - amax(x, {d}, true).detach();
  return z - log(exp(z).sum({d}, true));
}

Tensor layer_norm(const Tensor& a, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias, double eps) {
  need(a, "layer_norm");
  int64_t k = int64_t(normalized_shape.size());
  bool ok = k >= 1 && k <= a.dim();
  for (int64_t i = 0; ok && i < k; ++i) ok = a.shape()[a.dim() - k + i] == normalized_shape[i];
  if (!ok) fail("layer_norm", "normalized shape " + shape_str(normalized_shape) + " does not end the input's " + desc(a));
  for (const Tensor* p : {&weight, &bias})
    if (p->defined() && p->shape() != normalized_shape)
      fail("layer_norm", "weight and bias must have shape " + shape_str(normalized_shape) + ", got " + desc(*p));
  std::vector<int64_t> dims;
  for (int64_t i = a.dim() - k; i < a.dim(); ++i) dims.push_back(i);
  Tensor x = floating(a, "layer_norm");
  Tensor mu = mean(x, dims, true), dev = x - mu;
  Tensor y = dev * rsqrt(mean(dev * dev, dims, true) + eps);
  if (weight.defined()) y = y * weight;
  if (bias.defined()) y = y + bias;
  return y;
}

}  // namespace tessera
