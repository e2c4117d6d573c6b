// Op entry points: broadcasting, PyTorch type promotion and argument checks, then IR nodes.
#include <algorithm>
#include <cmath>

#include "autodiff/autograd.h"
#include "tensor/tensor_impl.h"
#include "core/fail.h"
#include "tessera/autocast.h"
#include "tessera/ops.h"

namespace tessera {
namespace {

using ir::Attrs;
using ir::NodePtr;
using ir::Op;

NodePtr N(const Tensor& t) { return detail::node_of(t); }
// The result of one op: a new tensor on node n, with autodiff history when an input needs it.
Tensor T(NodePtr n, const std::vector<const Tensor*>& inputs = {}) {
  Tensor t = detail::from_node(std::move(n));
  autodiff::record(t, inputs);
  return t;
}
Tensor as_view(NodePtr n, const Tensor& input) {
  Tensor t = T(std::move(n), {&input});
  detail::impl_of(t)->is_view = true;
  return t;
}

NodePtr constant(double v, DType t, const Device& d, const Shape& s = {}) {
  return ir::make(Op::Full, {}, Attrs{{}, v}, &s, t, d);
}
NodePtr cast(NodePtr n, DType t) {
  if (n->dtype == t) return n;
  return ir::make(Op::Cast, {std::move(n)}, {}, nullptr, t);
}
// Broadcasts n to shape s (prepending unit dimensions, then expanding).
NodePtr broadcast_to(NodePtr n, const Shape& s) {
  if (n->shape == s) return n;
  if (n->shape.size() < s.size()) {
    Shape r(s.size() - n->shape.size(), 1);
    r.insert(r.end(), n->shape.begin(), n->shape.end());
    n = ir::make(Op::Reshape, {n}, {}, &r);
  }
  if (n->shape == s) return n;
  return ir::make(Op::Expand, {n}, {}, &s);
}
NodePtr reshape_node(NodePtr n, const Shape& s) {
  if (n->shape == s) return n;
  return ir::make(Op::Reshape, {std::move(n)}, {}, &s);
}

std::string desc(const Tensor& t) { return std::string(dtype_name(t.dtype())) + shape_str(t.shape()); }

// Promotes and broadcasts the operands, then applies a binary primitive.
Tensor binary(Op op, const Tensor& a, const Tensor& b, bool float_result = false) {
  const char* name = ir::op_name(op);
  if (!a.defined() || !b.defined()) fail(name, "called on an undefined tensor");
  DType t = promote(a.dtype(), b.dtype());
  if (float_result && !is_floating(t)) t = DType::Float32;
  if (a.device() != b.device())
    fail(name, "tensors on different devices: " + a.device().str() + " and " + b.device().str() + " (" + desc(a) + ", " +
                   desc(b) + "); move one with .to(device)");
  Shape s = broadcast_shapes(a.shape(), b.shape(), name);
  return T(ir::make(op, {broadcast_to(cast(N(a), t), s), broadcast_to(cast(N(b), t), s)}), {&a, &b});
}
// Tensor-scalar: the scalar is weakly typed (it never widens a float tensor).
Tensor binary_scalar(Op op, const Tensor& a, double s, bool scalar_first, bool float_result = false) {
  const char* name = ir::op_name(op);
  if (!a.defined()) fail(name, "called on an undefined tensor");
  DType t = promote_scalar(a.dtype(), s);
  if (float_result && !is_floating(t)) t = DType::Float32;
  NodePtr x = cast(N(a), t);
  NodePtr c = constant(s, t, a.device(), a.shape());  // one node, not a scalar reshaped and expanded
  return T(scalar_first ? ir::make(op, {c, x}) : ir::make(op, {x, c}), {&a});
}

Tensor unary_float(Op op, const Tensor& a) {
  if (!a.defined()) fail(ir::op_name(op), "called on an undefined tensor");
  DType t = is_floating(a.dtype()) ? a.dtype() : DType::Float32;
  return T(ir::make(op, {cast(N(a), t)}), {&a});
}

// abs, sign, floor, ceil, round: integers keep their dtype; bool is refused by the rule.
Tensor unary_keep(Op op, const Tensor& a) {
  if (!a.defined()) fail(ir::op_name(op), "called on an undefined tensor");
  return T(ir::make(op, {N(a)}), {&a});
}

std::vector<int64_t> reduce_axes(const Tensor& a, std::vector<int64_t> dims, const char* op) {
  int64_t r = a.dim();
  if (dims.empty())
    for (int64_t d = 0; d < r; ++d) dims.push_back(d);
  for (auto& d : dims) d = wrap_dim(d, a.shape(), op);
  std::sort(dims.begin(), dims.end());
  if (std::adjacent_find(dims.begin(), dims.end()) != dims.end()) fail(op, "repeated dimension for " + desc(a));
  return dims;
}

Tensor reduce(Op op, const Tensor& a, std::vector<int64_t> dims, bool keepdim, const char* name) {
  if (!a.defined()) fail(name, "called on an undefined tensor");
  std::vector<int64_t> axes = reduce_axes(a, std::move(dims), name);
  NodePtr x = N(a);
  // Like PyTorch, integer and bool sums accumulate as int64.
  if (op == Op::ReduceSum && !is_floating(a.dtype())) x = cast(x, DType::Int64);
  if (op == Op::ReduceMax)
    for (int64_t ax : axes)
      if (a.shape()[ax] == 0) fail(name, "cannot take the max over an empty dimension of " + desc(a));
  NodePtr r = ir::make(op, {x}, Attrs{axes, 0});
  if (!keepdim) {
    Shape s;
    for (int64_t d = 0; d < a.dim(); ++d)
      if (!std::binary_search(axes.begin(), axes.end(), d)) s.push_back(a.shape()[d]);
    r = reshape_node(r, s);
  }
  return T(r, {&a});
}

void check_inplace(const Tensor& self, const char* op) {
  if (!self.defined()) fail(op, "called on an undefined tensor");
  const auto& m = detail::impl_of(self)->grad_meta;
  if (autodiff::grad_enabled() && m && m->requires_grad && !m->grad_fn)
    fail(op, "a leaf tensor that requires grad cannot be modified in place outside no_grad, got " + desc(self));
  if (detail::impl_of(self)->is_view)
    fail(op, "in-place ops on views (results of reshape/permute/expand/slice) are not supported yet; got " + desc(self));
}
// Rebinds self to `result`, which must keep self's shape; cast back to self's dtype like PyTorch
// only when the promotion does not leave self's category.
Tensor& assign(Tensor& self, Tensor result, const char* op) {
  if (result.shape() != self.shape())
    fail(op, "result shape " + shape_str(result.shape()) + " does not match the tensor's shape " + shape_str(self.shape()));
  if (promote(result.dtype(), self.dtype()) != self.dtype())
    fail(op, std::string("result type ") + dtype_name(result.dtype()) + " can't be cast to the tensor's " + dtype_name(self.dtype()));
  result = result.to(self.dtype());
  TensorImpl& impl = *detail::impl_of(self);
  impl.rebind(N(result));
  // A leaf that requires grad keeps its identity (updates happen under no_grad); anything else
  // takes the history of its new value.
  bool grad_leaf = impl.grad_meta && impl.grad_meta->requires_grad && !impl.grad_meta->grad_fn;
  if (!grad_leaf) impl.grad_meta = detail::impl_of(result)->grad_meta;
  return self;
}

}  // namespace

// ---- elementwise ----
Tensor add(const Tensor& a, const Tensor& b) { return binary(Op::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(Op::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(Op::Mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(Op::Div, a, b, true); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary(Op::Maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary(Op::Minimum, a, b); }
Tensor eq(const Tensor& a, const Tensor& b) { return binary(Op::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary(Op::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary(Op::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary(Op::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary(Op::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary(Op::Ge, a, b); }
Tensor exp(const Tensor& a) { return unary_float(Op::Exp, a); }
Tensor log(const Tensor& a) { return unary_float(Op::Log, a); }
Tensor tanh(const Tensor& a) { return unary_float(Op::Tanh, a); }

Tensor where(const Tensor& c, const Tensor& a, const Tensor& b) {
  if (!c.defined() || !a.defined() || !b.defined()) fail("where", "called on an undefined tensor");
  if (c.dtype() != DType::Bool) fail("where", "condition must be bool, got " + desc(c));
  if (c.device() != a.device() || a.device() != b.device())
    fail("where", "tensors on different devices: " + c.device().str() + ", " + a.device().str() + ", " + b.device().str());
  DType t = promote(a.dtype(), b.dtype());
  Shape s = broadcast_shapes(broadcast_shapes(c.shape(), a.shape(), "where"), b.shape(), "where");
  return T(ir::make(Op::Where, {broadcast_to(N(c), s), broadcast_to(cast(N(a), t), s), broadcast_to(cast(N(b), t), s)}),
           {&c, &a, &b});
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, double s) { return binary_scalar(Op::Add, a, s, false); }
Tensor operator-(const Tensor& a, double s) { return binary_scalar(Op::Sub, a, s, false); }
Tensor operator*(const Tensor& a, double s) { return binary_scalar(Op::Mul, a, s, false); }
Tensor operator/(const Tensor& a, double s) { return binary_scalar(Op::Div, a, s, false, true); }
Tensor operator+(double s, const Tensor& a) { return binary_scalar(Op::Add, a, s, true); }
Tensor operator-(double s, const Tensor& a) { return binary_scalar(Op::Sub, a, s, true); }
Tensor operator*(double s, const Tensor& a) { return binary_scalar(Op::Mul, a, s, true); }
Tensor operator/(double s, const Tensor& a) { return binary_scalar(Op::Div, a, s, true, true); }
Tensor operator==(const Tensor& a, const Tensor& b) { return eq(a, b); }
Tensor operator!=(const Tensor& a, const Tensor& b) { return ne(a, b); }
Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }
Tensor operator<(const Tensor& a, double s) { return binary_scalar(Op::Lt, a, s, false); }
Tensor operator>(const Tensor& a, double s) { return binary_scalar(Op::Gt, a, s, false); }
Tensor operator<=(const Tensor& a, double s) { return binary_scalar(Op::Le, a, s, false); }
Tensor operator>=(const Tensor& a, double s) { return binary_scalar(Op::Ge, a, s, false); }

Tensor Tensor::to(DType t) const {
  if (!defined()) fail("cast", "called on an undefined tensor");
  return t == dtype() ? *this : T(cast(N(*this), t), {this});
}

// A reshape to the same shape: a new node (ir::make does not fold it) with the value's history.
Tensor Tensor::clone() const {
  if (!defined()) fail("clone", "called on an undefined tensor");
  return T(ir::make(Op::Reshape, {N(*this)}, {}, &shape()), {this});
}

Tensor neg(const Tensor& a) {
  if (!a.defined()) fail("neg", "called on an undefined tensor");
  if (a.dtype() == DType::Bool) fail("neg", "not defined for bool tensors, got " + desc(a));
  return T(ir::make(Op::Neg, {N(a)}), {&a});
}
Tensor sqrt(const Tensor& a) { return unary_float(Op::Sqrt, a); }
Tensor sin(const Tensor& a) { return unary_float(Op::Sin, a); }
Tensor cos(const Tensor& a) { return unary_float(Op::Cos, a); }
Tensor erf(const Tensor& a) { return unary_float(Op::Erf, a); }
Tensor abs(const Tensor& a) { return unary_keep(Op::Abs, a); }
Tensor sign(const Tensor& a) { return unary_keep(Op::Sign, a); }
Tensor floor(const Tensor& a) { return unary_keep(Op::Floor, a); }
Tensor ceil(const Tensor& a) { return unary_keep(Op::Ceil, a); }
Tensor round(const Tensor& a) { return unary_keep(Op::Round, a); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary(Op::Pow, a, b, true); }
Tensor pow(const Tensor& a, double e) { return binary_scalar(Op::Pow, a, e, false, true); }
Tensor pow(double base, const Tensor& e) { return binary_scalar(Op::Pow, e, base, true, true); }

Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  if (!a.defined() || !index.defined() || !src.defined()) fail("scatter_add", "called on an undefined tensor");
  int64_t d = wrap_dim(dim, a.shape(), "scatter_add");
  return T(ir::make(Op::ScatterAdd, {N(a), N(index), cast(N(src), a.dtype())}, Attrs{{d}, 0}), {&a, &index, &src});
}

Tensor dynamic_update_slice(const Tensor& a, const Tensor& update, const Tensor& offsets) {
  if (!a.defined() || !update.defined() || !offsets.defined()) fail("dynamic_update_slice", "called on an undefined tensor");
  if (!is_integral(offsets.dtype()))
    fail("dynamic_update_slice", "offsets must be integers, got " + desc(offsets) + " for " + desc(a));
  return T(ir::make(Op::DynamicUpdateSlice, {N(a), cast(N(update), a.dtype()), cast(N(offsets), DType::Int64)}),
           {&a, &update, &offsets});
}

// ---- reductions ----
Tensor sum(const Tensor& a, std::vector<int64_t> dims, bool keepdim) { return reduce(Op::ReduceSum, a, std::move(dims), keepdim, "sum"); }
Tensor amax(const Tensor& a, std::vector<int64_t> dims, bool keepdim) { return reduce(Op::ReduceMax, a, std::move(dims), keepdim, "amax"); }

// ---- movement ----
Tensor reshape(const Tensor& a, Shape s) {
  if (!a.defined()) fail("reshape", "called on an undefined tensor");
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (infer >= 0) fail("reshape", "only one dimension can be -1, got " + shape_str(s));
      infer = int64_t(i);
    } else if (s[i] < 0) {
      fail("reshape", "invalid shape " + shape_str(s) + " for " + desc(a));
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || a.numel() % known != 0) fail("reshape", "cannot reshape " + desc(a) + " to " + shape_str(s));
    s[infer] = a.numel() / known;
  }
  if (numel(s) != a.numel()) fail("reshape", "cannot reshape " + desc(a) + " to " + shape_str(s));
  return as_view(reshape_node(N(a), s), a);
}

Tensor permute(const Tensor& a, std::vector<int64_t> perm) {
  if (!a.defined()) fail("permute", "called on an undefined tensor");
  if (int64_t(perm.size()) != a.dim())
    fail("permute", "permutation of length " + std::to_string(perm.size()) + " for " + desc(a));
  for (auto& p : perm) p = wrap_dim(p, a.shape(), "permute");
  return as_view(ir::make(Op::Permute, {N(a)}, Attrs{perm, 0}), a);
}

Tensor transpose(const Tensor& a, int64_t d0, int64_t d1) {
  if (!a.defined()) fail("transpose", "called on an undefined tensor");
  std::vector<int64_t> perm(static_cast<size_t>(a.dim()));
  for (int64_t i = 0; i < a.dim(); ++i) perm[i] = i;
  std::swap(perm[wrap_dim(d0, a.shape(), "transpose")], perm[wrap_dim(d1, a.shape(), "transpose")]);
  return permute(a, perm);
}

Tensor expand(const Tensor& a, Shape s) {
  if (!a.defined()) fail("expand", "called on an undefined tensor");
  const Shape& have_shape = a.shape();
  if (s.size() < have_shape.size()) fail("expand", "cannot expand " + desc(a) + " to fewer dimensions " + shape_str(s));
  size_t lead = s.size() - have_shape.size();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (i < lead) fail("expand", "-1 is not allowed for new leading dimensions in " + shape_str(s));
      s[i] = have_shape[i - lead];
    }
    int64_t have = i < lead ? 1 : have_shape[i - lead];
    if (s[i] != have && have != 1) fail("expand", "cannot expand " + desc(a) + " to " + shape_str(s));
  }
  return as_view(broadcast_to(N(a), s), a);
}

Tensor slice(const Tensor& a, int64_t d, int64_t start, int64_t stop, int64_t step) {
  if (!a.defined()) fail("slice", "called on an undefined tensor");
  d = wrap_dim(d, a.shape(), "slice");
  if (step < 1) fail("slice", "step must be positive, got " + std::to_string(step) + " for " + desc(a));
  int64_t n = a.shape()[d];
  auto clampi = [n](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + n : v, 0, n); };
  start = clampi(start);
  stop = std::max(start, clampi(stop));
  std::vector<int64_t> v;
  for (int64_t k = 0; k < a.dim(); ++k) {
    if (k == d) v.insert(v.end(), {start, stop, step});
    else v.insert(v.end(), {0, a.shape()[k], 1});
  }
  return as_view(ir::make(Op::Slice, {N(a)}, Attrs{v, 0}), a);
}

Tensor pad(const Tensor& a, const std::vector<int64_t>& pads, double value) {
  if (!a.defined()) fail("pad", "called on an undefined tensor");
  if (int64_t(pads.size()) != 2 * a.dim())
    fail("pad", "needs 2 entries per dimension (" + std::to_string(2 * a.dim()) + "), got " + std::to_string(pads.size()) + " for " + desc(a));
  std::vector<int64_t> v;
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (pads[2 * d] < 0 || pads[2 * d + 1] < 0) fail("pad", "negative padding is not supported (use slice), got " + shape_str(pads));
    v.insert(v.end(), {pads[2 * d], pads[2 * d + 1], 0});
  }
  NodePtr x = N(a);
  // The pad value is weakly typed: it must be representable in the tensor's dtype.
  if (!is_floating(a.dtype()) && std::floor(value) != value)
    fail("pad", "value " + std::to_string(value) + " does not fit a " + desc(a) + " tensor");
  return T(ir::make(Op::Pad, {x}, Attrs{v, value}), {&a});
}

Tensor cat(const std::vector<Tensor>& ts, int64_t dim) {
  if (ts.empty()) fail("cat", "needs at least one tensor");
  for (auto& t : ts)
    if (!t.defined()) fail("cat", "called on an undefined tensor");
  DType t = ts[0].dtype();
  for (auto& x : ts) t = promote(t, x.dtype());
  int64_t d = wrap_dim(dim, ts[0].shape(), "cat");
  std::vector<NodePtr> in;
  std::vector<const Tensor*> srcs;
  for (auto& x : ts) in.push_back(cast(N(x), t)), srcs.push_back(&x);
  return T(ir::make(Op::Concat, in, Attrs{{d}, 0}), srcs);
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) fail("matmul", "called on an undefined tensor");
  if (a.dim() == 0 || b.dim() == 0) fail("matmul", "both operands need at least one dimension, got " + desc(a) + " and " + desc(b));
  int64_t ka = a.shape().back(), kb = b.dim() == 1 ? b.shape()[0] : b.shape()[b.dim() - 2];
  if (ka != kb)
    fail("matmul", "shapes " + shape_str(a.shape()) + " and " + shape_str(b.shape()) + ": inner dimensions differ (" +
                       std::to_string(ka) + " vs " + std::to_string(kb) + ")");
  if (a.device() != b.device()) fail("matmul", "tensors on different devices: " + a.device().str() + " and " + b.device().str());
  DType t = promote(a.dtype(), b.dtype());
  if (t == DType::Bool) fail("matmul", "not defined for bool tensors, got " + desc(a) + " and " + desc(b));
  // Autocast: float32 operands in its dtype. A product of 16-bit floats returns float32 (the
  // primitive accumulates in it), rounded back to the operands' dtype outside autocast (PyTorch's
  // result dtype); under autocast the float32 product is the result.
  const DType result = t;
  if (t == DType::Float32 && autocast_dtype()) t = *autocast_dtype();
  NodePtr x = cast(N(a), t), y = cast(N(b), t);
  // PyTorch's 1-D rules: a vector is a row (left) or a column (right), removed afterwards.
  Shape xs = x->shape, ys = y->shape;
  if (xs.size() == 1) xs.insert(xs.begin(), 1);
  if (ys.size() == 1) ys.push_back(1);
  Shape xb(xs.begin(), xs.end() - 2), yb(ys.begin(), ys.end() - 2);
  Shape batch = broadcast_shapes(xb, yb, "matmul");
  if (yb.empty() && !xb.empty()) {
    // [..., M, K] @ [K, N]: one GEMM over all rows instead of a batch sharing one operand.
    int64_t rows = numel(xs) / xs.back();
    NodePtr r = ir::make(Op::Matmul, {reshape_node(x, {rows, xs.back()}), reshape_node(y, ys)});
    Shape out = xb;
    if (a.dim() > 1) out.push_back(xs[xs.size() - 2]);
    if (b.dim() > 1) out.push_back(ys.back());
    return T(cast(reshape_node(r, out), result), {&a, &b});
  }
  Shape xf = batch, yf = batch;
  xf.insert(xf.end(), xs.end() - 2, xs.end());
  yf.insert(yf.end(), ys.end() - 2, ys.end());
  x = broadcast_to(reshape_node(x, xs), xf);
  y = broadcast_to(reshape_node(y, ys), yf);
  NodePtr r = ir::make(Op::Matmul, {x, y});
  Shape out = batch;
  if (a.dim() > 1) out.push_back(xs[xs.size() - 2]);
  if (b.dim() > 1) out.push_back(ys.back());
  return T(cast(reshape_node(r, out), result), {&a, &b});
}

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  if (!a.defined() || !index.defined()) fail("gather", "called on an undefined tensor");
  int64_t d = wrap_dim(dim, a.shape(), "gather");
  return T(ir::make(Op::Gather, {N(a), N(index)}, Attrs{{d}, 0}), {&a, &index});
}

// ---- in place ----
Tensor& Tensor::add_(const Tensor& o) { check_inplace(*this, "add_"); return assign(*this, add(*this, o), "add_"); }
Tensor& Tensor::add_(double s) { check_inplace(*this, "add_"); return assign(*this, *this + s, "add_"); }
Tensor& Tensor::sub_(const Tensor& o) { check_inplace(*this, "sub_"); return assign(*this, sub(*this, o), "sub_"); }
Tensor& Tensor::mul_(const Tensor& o) { check_inplace(*this, "mul_"); return assign(*this, mul(*this, o), "mul_"); }
Tensor& Tensor::sub_(double s) { check_inplace(*this, "sub_"); return assign(*this, *this - s, "sub_"); }
Tensor& Tensor::mul_(double s) { check_inplace(*this, "mul_"); return assign(*this, *this * s, "mul_"); }
Tensor& Tensor::div_(const Tensor& o) { check_inplace(*this, "div_"); return assign(*this, div(*this, o), "div_"); }
Tensor& Tensor::div_(double s) { check_inplace(*this, "div_"); return assign(*this, *this / s, "div_"); }
Tensor& Tensor::copy_(const Tensor& src) {
  check_inplace(*this, "copy_");
  if (!src.defined()) fail("copy_", "source is undefined");
  if (src.device() != device()) fail("copy_", "source on " + src.device().str() + ", tensor on " + device().str() + "; use .to(device) first");
  broadcast_shapes(src.shape(), shape(), "copy_");
  NodePtr n = broadcast_to(cast(N(src), dtype()), shape());
  if (n->shape != shape()) fail("copy_", "cannot broadcast " + desc(src) + " to " + desc(*this));
  return assign(*this, T(n, {&src}), "copy_");
}

Tensor& Tensor::fill_(double value) {
  check_inplace(*this, "fill_");
  return assign(*this, full(shape(), value, {promote_scalar(dtype(), value), device()}).to(dtype()), "fill_");  // cast like PyTorch
}
Tensor& Tensor::zero_() { return fill_(0); }
Tensor& Tensor::index_put_(const std::vector<indexing::TensorIndex>& indices, const Tensor& value) {
  check_inplace(*this, "index_put_");
  return assign(*this, index_put(*this, indices, value), "index_put_");
}
Tensor& Tensor::index_put_(const std::vector<indexing::TensorIndex>& indices, double value) {
  check_inplace(*this, "index_put_");
  return index_put_(indices, full({}, value, {promote_scalar(dtype(), value), device()}));  // cast like PyTorch
}

// ---- factories ----
Tensor full(const Shape& s, double value, TensorOptions o) {
  for (int64_t d : s)
    if (d < 0) fail("full", "negative extent in shape " + shape_str(s));
  return T(constant(value, o.dtype, o.device, s));
}
Tensor zeros(const Shape& s, TensorOptions o) { return full(s, 0, o); }
Tensor ones(const Shape& s, TensorOptions o) { return full(s, 1, o); }
Tensor full_like(const Tensor& t, double v) { return full(t.shape(), v, {t.dtype(), t.device()}); }
Tensor zeros_like(const Tensor& t) { return full_like(t, 0); }
Tensor ones_like(const Tensor& t) { return full_like(t, 1); }
Tensor scalar_tensor(double v, TensorOptions o) { return full({}, v, o); }

Tensor arange(double end, std::optional<TensorOptions> o) { return arange(0, end, 1, o); }
Tensor arange(double start, double end, double step, std::optional<TensorOptions> o) {
  if (step == 0 || !std::isfinite(start) || !std::isfinite(end) || !std::isfinite(step))
    fail("arange", "needs finite bounds and a non-zero step, got (" + std::to_string(start) + ", " + std::to_string(end) + ", " + std::to_string(step) + ")");
  bool integral = std::floor(start) == start && std::floor(end) == end && std::floor(step) == step;
  TensorOptions opt = o.value_or(TensorOptions{integral ? DType::Int64 : DType::Float32, Device("cpu")});
  int64_t n = std::max<int64_t>(0, int64_t(std::ceil((end - start) / step)));
  Shape s{n};
  NodePtr i = ir::make(Op::Iota, {}, Attrs{{0}, 0}, &s, DType::Int64, opt.device);
  // start + i * step, computed in the result dtype (float64 for float32 results, then rounded).
  DType work = is_floating(opt.dtype) ? DType::Float64 : DType::Int64;
  NodePtr v = ir::make(Op::Add, {ir::make(Op::Mul, {cast(i, work), constant(step, work, opt.device, s)}),
                                 constant(start, work, opt.device, s)});
  return T(cast(v, opt.dtype));
}

static Tensor random(const Shape& s, TensorOptions o, int dist, const char* name) {
  for (int64_t d : s)
    if (d < 0) fail(name, "negative extent in shape " + shape_str(s));
  if (!is_floating(o.dtype)) fail(name, std::string("needs a floating dtype, got ") + dtype_name(o.dtype));
  std::vector<int64_t> attrs{int64_t(detail::next_draw()), dist};
  // In a batch slice, the rows of the whole batch's draw: element indices from start * row size.
  detail::BatchSlice b = detail::batch_slice();
  if (b.rows && !s.empty() && s[0] == b.rows && b.start) attrs.push_back(b.start * (numel(s) / b.rows));
  return T(ir::make(Op::Rng, {}, Attrs{std::move(attrs), 0}, &s, o.dtype, o.device));
}
Tensor rand(const Shape& s, TensorOptions o) { return random(s, o, 0, "rand"); }
Tensor randn(const Shape& s, TensorOptions o) { return random(s, o, 1, "randn"); }

}  // namespace tessera
