// Convolution, pooling and batch norm. conv_general and flip build primitives (conv, reverse);
// conv1d/conv2d/conv_transpose2d, pooling and batch norm are decompositions over public ops.
#include <algorithm>
#include <cmath>
#include <limits>

#include "autodiff/autograd.h"
#include "tensor/tensor_impl.h"
#include "ir/conv.h"
#include "core/fail.h"
#include "tessera/autocast.h"
#include "tessera/ops.h"

namespace tessera {
namespace {

std::string desc(const Tensor& t) { return std::string(dtype_name(t.dtype())) + shape_str(t.shape()); }
std::string num(int64_t v) { return std::to_string(v); }

Tensor traced(ir::NodePtr n, const std::vector<const Tensor*>& inputs) {
  Tensor t = detail::from_node(std::move(n));
  autodiff::record(t, inputs);
  return t;
}

// A per-dim option: empty -> `dflt` for every dim; one value -> that value for every dim.
std::vector<int64_t> per_dim(const std::vector<int64_t>& v, size_t dims, int64_t dflt, const std::string& op, const char* what) {
  if (v.empty()) return std::vector<int64_t>(dims, dflt);
  if (v.size() == 1) return std::vector<int64_t>(dims, v[0]);
  if (v.size() != dims)
    fail(op, std::string(what) + " needs 1 or " + num(int64_t(dims)) + " values, got " + shape_str(v));
  return v;
}

// Checks shapes, dtypes and options under the caller's name, then builds the conv primitive.
Tensor conv_checked(const std::string& op, const Tensor& x, const Tensor& w, const ConvGeneralOptions& o) {
  if (!x.defined() || !w.defined()) fail(op, "called on an undefined tensor");
  std::string both = "input " + desc(x) + " and weight " + desc(w);
  if (x.dim() < 3 || w.dim() != x.dim())
    fail(op, "expects input [batch, channels, spatial...] and weight [out, in/groups, kernel...] of one rank, got " + both);
  if (x.device() != w.device())
    fail(op, "tensors on different devices: " + x.device().str() + " and " + w.device().str() + " (" + both + ")");
  DType t = promote(x.dtype(), w.dtype());
  if (!is_floating(t)) fail(op, "needs floating tensors, got " + both);
  // Autocast: float32 operands in its dtype, the float32 product the result (as in matmul); a
  // product of 16-bit operands is rounded back to their dtype outside autocast.
  const DType result = t;
  if (t == DType::Float32 && autocast_dtype()) t = *autocast_dtype();
  size_t S = size_t(x.dim() - 2);
  int64_t g = o.groups, C = x.shape()[1], O = w.shape()[0];
  if (g < 1) fail(op, "groups must be positive, got " + num(g));
  if (O % g != 0) fail(op, "weight " + desc(w) + " has " + num(O) + " output channels, not divisible by groups=" + num(g));
  if (C != w.shape()[1] * g)
    fail(op, "input " + desc(x) + " has " + num(C) + " channels; weight " + desc(w) + " with groups=" + num(g) + " expects " +
                 num(w.shape()[1] * g));
  std::vector<int64_t> st = per_dim(o.stride, S, 1, op, "stride"), lo = per_dim(o.pad_lo, S, 0, op, "padding"),
                       hi = per_dim(o.pad_hi, S, 0, op, "padding"), ld = per_dim(o.lhs_dilation, S, 1, op, "lhs_dilation"),
                       rd = per_dim(o.rhs_dilation, S, 1, op, "dilation");
  ir::ConvAttrs c;
  c.groups = g;
  for (size_t d = 0; d < S; ++d) {
    ir::ConvAxis a{st[d], lo[d], hi[d], ld[d], rd[d]};
    if (a.stride < 1 || a.lhs_dilation < 1 || a.rhs_dilation < 1)
      fail(op, "stride and dilation must be positive, got stride " + shape_str(st) + ", dilation " + shape_str(rd) + " for " + both);
    int64_t n = x.shape()[d + 2], k = w.shape()[d + 2];
    if (n < 1 || k < 1) fail(op, "empty spatial dimension in " + both);
    if (ir::conv_padded_extent(n, a) < ir::conv_kernel_extent(k, a))
      fail(op, "kernel of extent " + num(ir::conv_kernel_extent(k, a)) + " (after dilation) is larger than the padded input (" +
                   num(ir::conv_padded_extent(n, a)) + ") in spatial dim " + num(int64_t(d)) + " of " + both);
    c.axes.push_back(a);
  }
  ir::NodePtr r = ir::make(ir::Op::Conv, {detail::node_of(x.to(t)), detail::node_of(w.to(t))}, c.to_attrs());
  if (r->dtype != result) r = ir::make(ir::Op::Cast, {r}, {}, nullptr, result);
  return traced(std::move(r), {&x, &w});
}

Tensor add_bias(const std::string& op, Tensor y, const Tensor& bias) {
  if (!bias.defined()) return y;
  if (bias.dim() != 1 || bias.shape()[0] != y.shape()[1])
    fail(op, "bias " + desc(bias) + " must be [" + num(y.shape()[1]) + "] (one per output channel)");
  Shape s(size_t(y.dim()), 1);
  s[1] = y.shape()[1];
  return y + bias.reshape(s);
}

// Pooling geometry of [N, C, H, W] (a [C, H, W] input is given a batch of 1 by the caller).
struct Pool {
  std::vector<int64_t> k, s, p;
  int64_t oh, ow;
};
Pool pool_geometry(const char* op, const Tensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                   std::vector<int64_t> padding) {
  if (!x.defined()) fail(op, "called on an undefined tensor");
  if (x.dim() != 4) fail(op, "expects [N, C, H, W] or [C, H, W], got " + desc(x));
  Pool g;
  g.k = per_dim(kernel, 2, 1, op, "kernel_size");
  g.s = stride.empty() ? g.k : per_dim(stride, 2, 1, op, "stride");
  g.p = per_dim(padding, 2, 0, op, "padding");
  for (int d = 0; d < 2; ++d) {
    if (g.k[d] < 1 || g.s[d] < 1) fail(op, "kernel and stride must be positive, got kernel " + shape_str(g.k) + ", stride " + shape_str(g.s));
    if (g.p[d] < 0 || 2 * g.p[d] > g.k[d])
      fail(op, "padding must be between 0 and half the kernel, got padding " + shape_str(g.p) + " for kernel " + shape_str(g.k));
    if (x.shape()[2 + d] + 2 * g.p[d] < g.k[d])
      fail(op, "kernel " + shape_str(g.k) + " is larger than the padded input " + desc(x));
  }
  g.oh = (x.shape()[2] + 2 * g.p[0] - g.k[0]) / g.s[0] + 1;
  g.ow = (x.shape()[3] + 2 * g.p[1] - g.k[1]) / g.s[1] + 1;
  return g;
}

// The taps of the pooling windows: tap (i, j) is [N, C, OH, OW], each window's element at
// offset (i, j). Non-overlapping windows without padding are slices of a tap-major view
// [N, C, kH, kW, OH, OW] of x (a reshape and permute), so the gradient is summed in that layout
// with the output width innermost; others are strided slices of the padded input.
std::vector<Tensor> taps(const Tensor& x, const Pool& g, double pad) {
  Shape s = x.shape();
  std::vector<Tensor> r;
  if (g.p[0] == 0 && g.p[1] == 0 && g.s == g.k) {
    Tensor t = x.slice(2, 0, g.oh * g.k[0]).slice(3, 0, g.ow * g.k[1]);
    t = t.reshape({s[0], s[1], g.oh, g.k[0], g.ow, g.k[1]}).permute({0, 1, 3, 5, 2, 4});
    for (int64_t i = 0; i < g.k[0]; ++i)
      for (int64_t j = 0; j < g.k[1]; ++j) r.push_back(t.slice(2, i, i + 1).slice(3, j, j + 1).reshape({s[0], s[1], g.oh, g.ow}));
    return r;
  }
  Tensor xp = g.p[0] == 0 && g.p[1] == 0 ? x : tessera::pad(x, {0, 0, 0, 0, g.p[0], g.p[0], g.p[1], g.p[1]}, pad);
  for (int64_t i = 0; i < g.k[0]; ++i)
    for (int64_t j = 0; j < g.k[1]; ++j)
      r.push_back(xp.slice(2, i, i + (g.oh - 1) * g.s[0] + 1, g.s[0]).slice(3, j, j + (g.ow - 1) * g.s[1] + 1, g.s[1]));
  return r;
}

}  // namespace

Tensor flip(const Tensor& a, std::vector<int64_t> dims) {
  if (!a.defined()) fail("flip", "called on an undefined tensor");
  for (auto& d : dims) d = wrap_dim(d, a.shape(), "flip");
  std::sort(dims.begin(), dims.end());
  if (std::adjacent_find(dims.begin(), dims.end()) != dims.end()) fail("flip", "repeated dimension for " + desc(a));
  if (dims.empty()) return a;
  return traced(ir::make(ir::Op::Reverse, {detail::node_of(a)}, ir::Attrs{dims, 0}), {&a});
}

Tensor conv_general(const Tensor& x, const Tensor& w, const ConvGeneralOptions& o) { return conv_checked("conv", x, w, o); }

Tensor conv1d(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t stride, int64_t padding, int64_t dilation,
              int64_t groups) {
  if (x.defined() && x.dim() != 3) fail("conv1d", "expects input [N, C, L], got " + desc(x));
  if (padding < 0) fail("conv1d", "padding must be non-negative, got " + num(padding));
  Tensor y = conv_checked("conv1d", x, w, {{stride}, {padding}, {padding}, {1}, {dilation}, groups});
  return add_bias("conv1d", y, bias);
}

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, std::vector<int64_t> stride, std::vector<int64_t> padding,
              std::vector<int64_t> dilation, int64_t groups) {
  if (x.defined() && x.dim() != 4) fail("conv2d", "expects input [N, C, H, W], got " + desc(x));
  std::vector<int64_t> p = per_dim(padding, 2, 0, "conv2d", "padding");
  if (p[0] < 0 || p[1] < 0) fail("conv2d", "padding must be non-negative, got " + shape_str(p));
  Tensor y = conv_checked("conv2d", x, w, {stride, p, p, {1}, dilation, groups});
  return add_bias("conv2d", y, bias);
}

// The gradient of a conv2d with respect to its input: a conv with lhs dilation = stride over
// the kernel flipped and transposed per group.
Tensor conv_transpose2d(const Tensor& x, const Tensor& w, const Tensor& bias, std::vector<int64_t> stride,
                        std::vector<int64_t> padding, std::vector<int64_t> output_padding, int64_t groups,
                        std::vector<int64_t> dilation) {
  const char* op = "conv_transpose2d";
  if (!x.defined() || !w.defined()) fail(op, "called on an undefined tensor");
  if (x.dim() != 4 || w.dim() != 4) fail(op, "expects input [N, C, H, W] and weight [C, O/groups, kH, kW], got " + desc(x) + " and " + desc(w));
  if (groups < 1 || w.shape()[0] % groups != 0 || x.shape()[1] != w.shape()[0])
    fail(op, "input " + desc(x) + " has " + num(x.shape()[1]) + " channels; weight " + desc(w) + " expects " + num(w.shape()[0]) +
                 " (divisible by groups=" + num(groups) + ")");
  std::vector<int64_t> s = per_dim(stride, 2, 1, op, "stride"), p = per_dim(padding, 2, 0, op, "padding"),
                       op_ = per_dim(output_padding, 2, 0, op, "output_padding"), d = per_dim(dilation, 2, 1, op, "dilation");
  for (int i = 0; i < 2; ++i) {
    if (s[i] < 1 || d[i] < 1 || p[i] < 0) fail(op, "stride and dilation must be positive and padding non-negative");
    if (op_[i] < 0 || (op_[i] >= s[i] && op_[i] >= d[i]))
      fail(op, "output_padding must be smaller than the stride or the dilation, got " + shape_str(op_));
  }
  int64_t C = w.shape()[0], Og = w.shape()[1], kh = w.shape()[2], kw = w.shape()[3];
  Tensor wt = flip(w.reshape({groups, C / groups, Og, kh, kw}).permute({0, 2, 1, 3, 4}).reshape({groups * Og, C / groups, kh, kw}), {2, 3});
  std::vector<int64_t> lo{d[0] * (kh - 1) - p[0], d[1] * (kw - 1) - p[1]};
  std::vector<int64_t> hi{lo[0] + op_[0], lo[1] + op_[1]};
  Tensor y = conv_checked(op, x, wt, {{1}, lo, hi, s, d, groups});
  return add_bias(op, y, bias);
}

Tensor max_pool2d(const Tensor& input, std::vector<int64_t> kernel, std::vector<int64_t> stride, std::vector<int64_t> padding) {
  auto body = [&](const Tensor& x) {
    Pool g = pool_geometry("max_pool2d", x, kernel, stride, padding);
    if (x.dtype() == DType::Bool) fail("max_pool2d", "not defined for bool tensors, got " + desc(x));
    double lowest = is_floating(x.dtype()) ? -INFINITY : double(std::numeric_limits<int32_t>::min());
    // The winning tap of each window: a later tap wins only when strictly larger or NaN (as in
    // PyTorch's kernel), so ties go to the first maximum in row-major window order. The output
    // selects the winner's value, so the gradient (where's) reaches that tap alone.
    std::vector<Tensor> t = taps(x, g, lowest);
    Tensor best = t[0], win = zeros(best.shape(), {DType::Int32, x.device()});
    for (size_t k = 1; k < t.size(); ++k) {
      const Tensor& c = t[k];
      Tensor wins = logical_or(c > best, c != c);
      win = where(wins, full({}, double(k), {DType::Int32, x.device()}), win);
      best = where(wins, c, best);
    }
    Tensor y = t.back();
    for (size_t k = t.size() - 1; k-- > 0;) y = where(win == full({}, double(k), {DType::Int32, x.device()}), t[k], y);
    return y;
  };
  if (input.defined() && input.dim() == 3) return squeeze(body(unsqueeze(input, 0)), 0);
  return body(input);
}

Tensor avg_pool2d(const Tensor& input, std::vector<int64_t> kernel, std::vector<int64_t> stride, std::vector<int64_t> padding,
                  bool count_include_pad) {
  auto body = [&](const Tensor& x0) {
    Pool g = pool_geometry("avg_pool2d", x0, kernel, stride, padding);
    Tensor x = is_floating(x0.dtype()) ? x0 : x0.to(DType::Float32);
    if (g.p[0] == 0 && g.p[1] == 0 && g.s == g.k) {  // non-overlapping: a reshape and a sum (its VJP a broadcast)
      Shape s = x.shape();
      Tensor c = x.slice(2, 0, g.oh * g.k[0]).slice(3, 0, g.ow * g.k[1]);
      return c.reshape({s[0], s[1], g.oh, g.k[0], g.ow, g.k[1]}).sum({3, 5}) / double(g.k[0] * g.k[1]);
    }
    auto window_sum = [&](const Tensor& a) {
      std::vector<Tensor> t = taps(a, g, 0);
      Tensor s = t[0];
      for (size_t k = 1; k < t.size(); ++k) s = s + t[k];
      return s;
    };
    Tensor sum = window_sum(x);
    if (count_include_pad || (g.p[0] == 0 && g.p[1] == 0)) return sum / double(g.k[0] * g.k[1]);
    return sum / window_sum(tessera::ones({1, 1, x.shape()[2], x.shape()[3]}, {x.dtype(), x.device()}));
  };
  if (input.defined() && input.dim() == 3) return squeeze(body(unsqueeze(input, 0)), 0);
  return body(input);
}

Tensor adaptive_avg_pool2d(const Tensor& input, std::vector<int64_t> output_size) {
  const char* op = "adaptive_avg_pool2d";
  auto body = [&](const Tensor& x0) {
    if (x0.dim() != 4) fail(op, "expects [N, C, H, W] or [C, H, W], got " + desc(x0));
    std::vector<int64_t> os = per_dim(output_size, 2, 1, op, "output_size");
    Tensor x = is_floating(x0.dtype()) ? x0 : x0.to(DType::Float32);
    int64_t H = x.shape()[2], W = x.shape()[3];
    if (os[0] < 1 || os[1] < 1) fail(op, "output size must be positive, got " + shape_str(os));
    if (H % os[0] == 0 && W % os[1] == 0) return avg_pool2d(x, {H / os[0], W / os[1]});
    // Uneven windows: averaging matrices on both sides, A_h [OH, H] @ x @ A_w^T [W, OW], traced
    // on x's device (no host data, so compile-only devices trace it too). Row i covers
    // floor(i*in/out) <= j < ceil((i+1)*in/out), in exact integer arithmetic.
    auto averaging = [&](int64_t in, int64_t out) {
      TensorOptions o{DType::Int64, x.device()};
      Tensor i = arange(0, double(out), 1, o).reshape({out, 1}), j = arange(0, double(in), 1, o).reshape({1, in});
      Tensor m = logical_and(j * double(out) + double(out) > i * double(in), j * double(out) < (i + 1.0) * double(in)).to(x.dtype());
      return m / m.sum({1}, true);
    };
    Autocast off{DType::BFloat16, false};  // pooling is float32 under autocast: not a product
    return matmul(matmul(averaging(H, os[0]), x), averaging(W, os[1]).transpose(0, 1));
  };
  if (!input.defined()) fail(op, "called on an undefined tensor");
  if (input.dim() == 3) return squeeze(body(unsqueeze(input, 0)), 0);
  return body(input);
}

Tensor batch_norm(const Tensor& input, Tensor running_mean, Tensor running_var, const Tensor& weight, const Tensor& bias,
                  bool training, double momentum, double eps) {
  const char* op = "batch_norm";
  if (!input.defined()) fail(op, "called on an undefined tensor");
  if (input.dim() < 2) fail(op, "expects [N, C, ...], got " + desc(input));
  Tensor x = is_floating(input.dtype()) ? input : input.to(DType::Float32);
  int64_t C = x.shape()[1], n = x.numel() / std::max<int64_t>(C, 1);
  for (const Tensor* t : std::vector<const Tensor*>{&running_mean, &running_var, &weight, &bias})
    if (t->defined() && t->shape() != Shape{C}) fail(op, "per-channel tensors must be [" + num(C) + "] for " + desc(x) + ", got " + desc(*t));
  if (running_mean.defined() != running_var.defined()) fail(op, "running_mean and running_var must both be given or both omitted");
  if (!training && !running_mean.defined()) fail(op, "eval mode needs running statistics");
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  Shape bshape(size_t(x.dim()), 1);
  bshape[1] = C;
  Tensor mean, var, y;
  if (training) {
    if (detail::batch_slice().rows)
      fail(op, "training mode normalizes with statistics over the whole batch, which a slice of it (a micro-batch or a "
               "data-parallel rank's rows) does not see: train this model without micro-batches (a memory budget is then "
               "met by rematerialization alone) and on one rank");
    if (n < 2) fail(op, "training needs more than one value per channel, got " + desc(x));
    // Both statistics in one pass over x, as sums of d = x - k and of d^2 over the same axes (a
    // backend may reduce them in one Step; the two-pass form, the mean and then the squared
    // deviations from it, reads x twice). k is each channel's first value: shifted near the mean,
    // E[d^2] - E[d]^2 does not cancel as E[x^2] - E[x]^2 does for a mean large against the
    // spread. k is detached (the statistics do not depend on it: its gradient is 0) and the
    // variance clamped at 0 (rounding). y = d * scale + shift with per-channel scale and shift:
    // one multiply-add per element, and the backward's sums over the batch are two, of the
    // gradient and of the gradient times d, both reading only the gradient and x (the two-pass
    // form's backward chained its sums: the mean's term needs the variance's).
    Tensor k = x;
    for (int64_t d : dims) k = k.narrow(d, 0, 1);
    k = k.detach();
    Tensor d = x - k;
    Tensor dmean = tessera::mean(d, dims, true);
    var = (tessera::mean(d * d, dims, true) - dmean * dmean).clamp(0.0);
    mean = k + dmean;
    Tensor scale = rsqrt(var + eps);
    if (weight.defined()) scale = scale * weight.reshape(bshape);
    Tensor shift = bias.defined() ? bias.reshape(bshape) - dmean * scale : -(dmean * scale);
    y = d * scale + shift;
    if (running_mean.defined()) {
      NoGradGuard ng;
      Tensor m = mean.detach().reshape({C}), v = var.detach().reshape({C}) * (double(n) / double(n - 1));
      running_mean.mul_(1 - momentum).add_(m * momentum);
      running_var.mul_(1 - momentum).add_(v * momentum);
    }
  } else {
    mean = running_mean.reshape(bshape);
    var = running_var.reshape(bshape);
    y = (x - mean) * rsqrt(var + eps);
    if (weight.defined()) y = y * weight.reshape(bshape);
    if (bias.defined()) y = y + bias.reshape(bshape);
  }
  return y;
}

}  // namespace tessera
