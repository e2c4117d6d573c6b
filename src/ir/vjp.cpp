// VJP rules: given a node and the cotangent of its output, the cotangents of its inputs, built
// as new IR. Cotangents have their input's shape and dtype.
#include "ir/vjp.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

#include "ir/build.h"
#include "ir/node.h"

namespace tessera::ir {
namespace {

using namespace build;
using Grads = std::vector<NodePtr>;
const NodePtr& in(const Node& n, size_t k) { return n.inputs[k]; }
NodePtr c(const NodePtr& like, double v) { return full_like(like, v); }

Grads vjp_cast(const Node& n, const NodePtr&, const NodePtr& g) {
  return {is_floating(in(n, 0)->dtype) ? cast(g, in(n, 0)->dtype) : nullptr};
}
Grads vjp_neg(const Node&, const NodePtr&, const NodePtr& g) { return {neg(g)}; }
Grads vjp_exp(const Node&, const NodePtr& self, const NodePtr& g) { return {mul(g, self)}; }
Grads vjp_log(const Node& n, const NodePtr&, const NodePtr& g) { return {div(g, in(n, 0))}; }
Grads vjp_tanh(const Node&, const NodePtr& s, const NodePtr& g) { return {mul(g, sub(c(s, 1), mul(s, s)))}; }
Grads vjp_abs(const Node& n, const NodePtr&, const NodePtr& g) { return {mul(g, unary(Op::Sign, in(n, 0)))}; }
Grads vjp_sqrt(const Node&, const NodePtr& s, const NodePtr& g) { return {div(g, mul(c(s, 2), s))}; }
Grads vjp_sin(const Node& n, const NodePtr&, const NodePtr& g) { return {mul(g, unary(Op::Cos, in(n, 0)))}; }
Grads vjp_cos(const Node& n, const NodePtr&, const NodePtr& g) { return {neg(mul(g, unary(Op::Sin, in(n, 0))))}; }
Grads vjp_erf(const Node& n, const NodePtr&, const NodePtr& g) {
  const NodePtr& x = in(n, 0);
  return {mul(g, mul(c(x, 2 / std::sqrt(M_PI)), unary(Op::Exp, neg(mul(x, x)))))};
}

Grads vjp_add(const Node&, const NodePtr&, const NodePtr& g) { return {g, g}; }
Grads vjp_sub(const Node&, const NodePtr&, const NodePtr& g) { return {g, neg(g)}; }
Grads vjp_mul(const Node& n, const NodePtr&, const NodePtr& g) { return {mul(g, in(n, 1)), mul(g, in(n, 0))}; }
Grads vjp_div(const Node& n, const NodePtr& s, const NodePtr& g) {
  NodePtr ga = div(g, in(n, 1));
  return {ga, neg(mul(ga, s))};
}
// Like PyTorch: the larger operand takes the gradient; ties split it in halves.
Grads vjp_minmax(const Node& n, const NodePtr&, const NodePtr& g) {
  const NodePtr &a = in(n, 0), &b = in(n, 1);
  Op wins = n.op == Op::Maximum ? Op::Gt : Op::Lt;
  NodePtr zero = c(g, 0), half = mul(g, c(g, 0.5)), tie = binary(Op::Eq, a, b);
  return {where(binary(wins, a, b), g, where(tie, half, zero)), where(binary(wins, b, a), g, where(tie, half, zero))};
}
// d(a^b)/da = b a^(b-1); d(a^b)/db = a^b log a (0 where a == 0, as PyTorch).
Grads vjp_pow(const Node& n, const NodePtr& s, const NodePtr& g) {
  const NodePtr &a = in(n, 0), &b = in(n, 1);
  NodePtr ga = mul(g, mul(b, binary(Op::Pow, a, sub(b, c(b, 1)))));
  NodePtr gb = where(binary(Op::Eq, a, c(a, 0)), c(g, 0), mul(g, mul(s, unary(Op::Log, a))));
  return {ga, gb};
}
Grads vjp_where(const Node& n, const NodePtr&, const NodePtr& g) {
  NodePtr zero = c(g, 0);
  return {nullptr, where(in(n, 0), g, zero), where(in(n, 0), zero, g)};
}

Grads vjp_reduce_sum(const Node& n, const NodePtr&, const NodePtr& g) { return {expand(g, in(n, 0)->shape)}; }
// The gradient goes to the first maximal element (row-major order over the reduced axes).
Grads vjp_reduce_max(const Node& n, const NodePtr& s, const NodePtr& g) {
  const NodePtr& x = in(n, 0);
  const Shape& D = x->shape;
  NodePtr pos = full(0, D, DType::Int64, x->device);
  int64_t stride = 1;
  for (size_t k = n.attrs.ints.size(); k-- > 0;) {
    int64_t ax = n.attrs.ints[k];
    pos = add(pos, mul(iota(D, ax, x->device), full(double(stride), D, DType::Int64, x->device)));
    stride *= D[ax];
  }
  NodePtr is_max = binary(Op::Eq, x, expand(s, D));
  NodePtr cand = where(is_max, neg(pos), full(-double(stride) - 1, D, DType::Int64, x->device));
  NodePtr first = binary(Op::Eq, cand, expand(reduce_max(cand, n.attrs.ints), D));
  first = where(is_max, first, full(0, D, DType::Bool, x->device));
  return {where(first, expand(g, D), c(x, 0))};
}

Grads vjp_reshape(const Node& n, const NodePtr&, const NodePtr& g) { return {reshape(g, in(n, 0)->shape)}; }
Grads vjp_permute(const Node& n, const NodePtr&, const NodePtr& g) {
  std::vector<int64_t> inv(n.attrs.ints.size());
  for (size_t i = 0; i < inv.size(); ++i) inv[n.attrs.ints[i]] = int64_t(i);
  return {permute(g, inv)};
}
Grads vjp_expand(const Node& n, const NodePtr&, const NodePtr& g) { return {sum_to(g, in(n, 0)->shape)}; }
// A strided slice's VJP is a pad with interior padding (zeros between the picked elements).
Grads vjp_slice(const Node& n, const NodePtr&, const NodePtr& g) {
  const NodePtr& x = in(n, 0);
  if (n.numel() == 0) return {c(x, 0)};
  std::vector<int64_t> p;
  for (size_t d = 0; d < x->shape.size(); ++d) {
    int64_t start = n.attrs.ints[3 * d], step = n.attrs.ints[3 * d + 2], m = n.shape[d];
    int64_t last = start + (m - 1) * step;
    p.insert(p.end(), {start, x->shape[d] - 1 - last, step - 1});
  }
  return {pad(g, p)};
}
Grads vjp_pad(const Node& n, const NodePtr&, const NodePtr& g) {
  const NodePtr& x = in(n, 0);
  if (x->numel() == 0) return {c(x, 0)};
  std::vector<int64_t> v;
  for (size_t d = 0; d < x->shape.size(); ++d) {
    int64_t lo = n.attrs.ints[3 * d], interior = n.attrs.ints[3 * d + 2];
    v.insert(v.end(), {lo, lo + (x->shape[d] - 1) * (interior + 1) + 1, interior + 1});
  }
  return {slice(g, v)};
}
Grads vjp_concat(const Node& n, const NodePtr&, const NodePtr& g) {
  Grads r;
  int64_t ax = n.attrs.ints[0], start = 0;
  for (const NodePtr& x : n.inputs) {
    std::vector<int64_t> v;
    for (size_t d = 0; d < n.shape.size(); ++d)
      if (int64_t(d) == ax) v.insert(v.end(), {start, start + x->shape[d], 1});
      else v.insert(v.end(), {0, n.shape[d], 1});
    r.push_back(slice(g, v));
    start += x->shape[ax];
  }
  return r;
}
Grads vjp_matmul(const Node& n, const NodePtr&, const NodePtr& g) {
  return {matmul(g, transpose_last2(in(n, 1))), matmul(transpose_last2(in(n, 0)), g)};
}
Grads vjp_gather(const Node& n, const NodePtr&, const NodePtr& g) {
  return {scatter_add(c(in(n, 0), 0), n.attrs.ints[0], in(n, 1), g), nullptr};
}
Grads vjp_scatter_add(const Node& n, const NodePtr&, const NodePtr& g) {
  return {g, nullptr, gather(g, n.attrs.ints[0], in(n, 1))};
}
// update's cotangent is g at the (clamped) offsets: one gather per sliced dimension.
Grads vjp_dus(const Node& n, const NodePtr&, const NodePtr& g) {
  const NodePtr &upd = in(n, 1), &off = in(n, 2);
  NodePtr cur = g;
  for (size_t d = 0; d < n.shape.size(); ++d) {
    int64_t full_n = n.shape[d], u = upd->shape[d];
    if (u == full_n) continue;
    NodePtr o = reshape(slice(off, {int64_t(d), int64_t(d) + 1, 1}), {});
    o = binary(Op::Maximum, binary(Op::Minimum, o, full(double(full_n - u), {}, DType::Int64, n.device)),
               full(0, {}, DType::Int64, n.device));
    Shape is = cur->shape;
    is[d] = u;
    Shape ones(is.size(), 1);
    NodePtr idx = add(iota(is, int64_t(d), n.device), expand(reshape(o, ones), is));
    cur = gather(cur, int64_t(d), idx);
  }
  return {dynamic_update_slice(g, c(upd, 0), off), cur, nullptr};
}

Grads vjp_reverse(const Node& n, const NodePtr&, const NodePtr& g) { return {reverse(g, n.attrs.ints)}; }

// The input cotangent of a strided conv (stride s > 1 on some axis; no dilation) by phases: the
// input positions i = q * s + r of one residue r per axis take only the kernel taps k = k0 + t * s
// with k0 = (r + lo) mod s, so each phase is a stride-1 conv of the cotangent itself (not dilated
// by the stride) with that sub-kernel. The phases run as one conv whose output channels are
// [F, phases] (each phase's sub-kernel padded to a common window; a phase no tap reaches has a
// zero kernel), and its output [B, F, s..., Q...] permuted to [B, F, Q, s, ...] is the input
// cotangent, cropped to X. A 3x3 stride-2 conv's does 16 multiplies per 9 of the kernel's, where
// the cotangent dilated by the stride made 36 (most of them by zeros) and needed the dilated copy.
// Where only one phase per axis has taps (a 1x1 strided conv) the conv is that phase's alone,
// placed by padding. Null where it does not apply.
NodePtr strided_input_grad(const ConvAttrs& c, const NodePtr& g, const NodePtr& wt, const Shape& xshape) {
  const size_t S = c.axes.size();
  bool strided = false;
  for (const ConvAxis& a : c.axes) {
    if (a.lhs_dilation != 1 || a.rhs_dilation != 1) return nullptr;
    strided |= a.stride > 1;
  }
  if (!strided) return nullptr;
  struct Phase {
    int64_t k0 = 0, taps = 0, lo = 0;  // the first tap, how many, the conv's low padding for this phase
  };
  std::vector<std::vector<Phase>> phases(S);
  std::vector<int64_t> L(S), T(S), Q(S), live(S);  // per axis: common low padding, common taps, positions per phase, phases with taps
  for (size_t d = 0; d < S; ++d) {
    const ConvAxis& a = c.axes[d];
    const int64_t s = a.stride, X = xshape[d + 2], K = wt->shape[d + 2];
    Q[d] = (X + s - 1) / s;
    L[d] = INT64_MIN;
    for (int64_t r = 0; r < s; ++r) {
      Phase p;
      p.k0 = ((r + a.lo) % s + s) % s;
      if (p.k0 < K && r < X) {
        p.taps = (K - p.k0 + s - 1) / s;
        p.lo = p.taps - 1 - (r + a.lo - p.k0) / s;
        L[d] = std::max(L[d], p.lo), ++live[d];
      }
      phases[d].push_back(p);
    }
    if (!live[d]) return full(0.0, xshape, g->dtype, g->device);
    T[d] = 0;
    for (const Phase& p : phases[d])
      if (p.taps) T[d] = std::max(T[d], p.taps + L[d] - p.lo);
  }
  const int64_t F = wt->shape[0], Og = wt->shape[1];
  bool single = true;
  for (size_t d = 0; d < S; ++d) single &= live[d] == 1;
  // Phase r's kernel, its taps u = 0..T-1 reversed (v = T - 1 - u), is wt[base + r + v * s] with
  // base = lo + (L - T + 1) * s (zero outside the kernel): the taps of all phases are one
  // stride-1 run of T * s positions of wt padded, split [T, s] and moved to [F, s..., Og, T...].
  Shape split_k{F, Og}, flat{F, Og};
  std::vector<int64_t> pads(6, 0), run{0, F, 1, 0, Og, 1}, perm_k{0};
  int64_t phases_run = 1;
  for (size_t d = 0; d < S; ++d) {
    const ConvAxis& a = c.axes[d];
    const int64_t s = a.stride, K = wt->shape[d + 2];
    int64_t base = a.lo + (L[d] - T[d] + 1) * s, len = T[d] * s, r = 0;
    if (single) {  // the one live residue's taps alone
      while (!phases[d][size_t(r)].taps) ++r;
      base += r, len = (T[d] - 1) * s + 1;
    }
    const int64_t lo = std::max<int64_t>(0, -base), hi = std::max<int64_t>(0, base + len - K);
    pads.insert(pads.end(), {lo, hi, 0});
    run.insert(run.end(), {base + lo, base + lo + len, single ? s : 1});
    if (!single) split_k.insert(split_k.end(), {T[d], s}), phases_run *= s;
    flat.push_back(T[d]);
  }
  NodePtr k = slice(pad(wt, pads), run);
  if (!single) {
    for (size_t d = 0; d < S; ++d) perm_k.push_back(int64_t(3 + 2 * d));
    perm_k.push_back(1);
    for (size_t d = 0; d < S; ++d) perm_k.push_back(int64_t(2 + 2 * d));
    k = permute(reshape(k, split_k), perm_k);  // [F, s..., Og, T...]
  }
  flat[0] = F * phases_run;
  std::vector<int64_t> taps_axes;
  for (size_t d = 0; d < S; ++d) taps_axes.push_back(int64_t(single ? 2 + d : 2 + S + d));
  k = reshape(reverse(k, taps_axes), flat);
  ConvAttrs cp;
  cp.groups = c.groups;
  for (size_t d = 0; d < S; ++d) {
    const int64_t P = g->shape[d + 2];
    cp.axes.push_back({1, L[d], Q[d] + T[d] - 1 - P - L[d], 1, 1});
  }
  NodePtr y = conv(g, k, cp);  // [B, F * phases, Q...]
  const int64_t B = g->shape[0];
  Shape split{B, F}, inter{B, F};
  std::vector<int64_t> perm{0, 1}, crop{0, B, 1, 0, F, 1};
  if (single) {
    // [B, F, Q...] as [B, F, Q, 1, ...] padded to [B, F, Q, s, ...] at the live residue.
    std::vector<int64_t> pads(6, 0);
    for (size_t d = 0; d < S; ++d) {
      int64_t r = 0;
      while (!phases[d][size_t(r)].taps) ++r;
      split.insert(split.end(), {Q[d], 1});
      pads.insert(pads.end(), {0, 0, 0, r, c.axes[d].stride - 1 - r, 0});
    }
    y = pad(reshape(y, split), pads);
  } else {
    for (size_t d = 0; d < S; ++d) split.push_back(c.axes[d].stride);
    for (size_t d = 0; d < S; ++d) split.push_back(Q[d]);
    for (size_t d = 0; d < S; ++d) perm.insert(perm.end(), {int64_t(2 + S + d), int64_t(2 + d)});
    y = permute(reshape(y, split), perm);
  }
  for (size_t d = 0; d < S; ++d) {
    inter.push_back(Q[d] * c.axes[d].stride);
    crop.insert(crop.end(), {0, xshape[d + 2], 1});
  }
  y = reshape(y, inter);
  return inter == xshape ? y : slice(y, crop);
}

// Both cotangents are convolutions. The input's: the output cotangent dilated by the stride,
// correlated with the kernel flipped and transposed per group (input and output channels
// swapped), window stride = the lhs dilation. The kernel's: the input (batch and channels
// swapped) correlated with the output cotangent as the kernel, rhs dilation = the stride.
Grads vjp_conv(const Node& n, const NodePtr&, const NodePtr& g) {
  const NodePtr &x = in(n, 0), &w = in(n, 1);
  ConvAttrs c = ConvAttrs::from(n.attrs);
  size_t S = c.axes.size();
  int64_t G = c.groups, B = x->shape[0], F = x->shape[1], Fg = F / G, O = w->shape[0], Og = O / G;
  Shape sx(x->shape.begin() + 2, x->shape.end()), sk(w->shape.begin() + 2, w->shape.end()),
      sp(n.shape.begin() + 2, n.shape.end());
  auto with = [](Shape lead, const Shape& tail) {
    lead.insert(lead.end(), tail.begin(), tail.end());
    return lead;
  };
  auto perm = [S](std::vector<int64_t> lead) {
    for (size_t d = 0; d < S; ++d) lead.push_back(int64_t(lead.size()));
    return lead;
  };
  std::vector<int64_t> spatial;
  for (size_t d = 0; d < S; ++d) spatial.push_back(int64_t(d + 2));
  ConvAttrs cx, cw;
  cx.groups = cw.groups = G;
  for (size_t d = 0; d < S; ++d) {
    const ConvAxis& a = c.axes[d];
    int64_t X = sx[d], K = sk[d], P = sp[d];
    ConvAxis bx{a.lhs_dilation, (K - 1) * a.rhs_dilation - a.lo, 0, a.stride, a.rhs_dilation};
    bx.hi = (X - 1) * a.lhs_dilation + conv_kernel_extent(K, a) - ((P - 1) * a.stride + 1) - bx.lo;
    cx.axes.push_back(bx);
    int64_t extra = conv_padded_extent(X, a) - (P - 1) * a.stride - conv_kernel_extent(K, a);
    cw.axes.push_back({a.rhs_dilation, a.lo, a.hi - extra, a.lhs_dilation, a.stride});
  }
  NodePtr wt = reshape(permute(reshape(w, with({G, Og, Fg}, sk)), perm({0, 2, 1})), with({F, Og}, sk));
  NodePtr dx = strided_input_grad(c, g, wt, x->shape);
  if (!dx) dx = conv(g, reverse(wt, spatial), cx);
  NodePtr xt = reshape(permute(reshape(x, with({B, G, Fg}, sx)), perm({2, 1, 0})), with({Fg, G * B}, sx));
  NodePtr gt = reshape(permute(reshape(g, with({B, G, Og}, sp)), perm({1, 2, 0})), with({O, B}, sp));
  NodePtr dw = permute(conv(xt, gt, cw), perm({1, 0}));
  return {dx, dw};
}

// A product of 16-bit float operands returns float32: its operands' cotangents are the same
// products of the cotangent rounded to their dtype, rounded to it again (products accumulate in
// float32 and return it).
template <VjpRule rule>
Grads vjp_product(const Node& n, const NodePtr& self, const NodePtr& g) {
  const DType t = in(n, 0)->dtype;
  if (compute_dtype(t) == t) return rule(n, self, g);
  Grads r = rule(n, self, cast(g, t));
  for (NodePtr& x : r) x = cast(x, t);
  return r;
}

}  // namespace

VjpRule vjp_rule(Op op) {
  switch (op) {
    case Op::Cast: return vjp_cast;
    case Op::Neg: return vjp_neg;
    case Op::Exp: return vjp_exp;
    case Op::Log: return vjp_log;
    case Op::Tanh: return vjp_tanh;
    case Op::Abs: return vjp_abs;
    case Op::Sqrt: return vjp_sqrt;
    case Op::Sin: return vjp_sin;
    case Op::Cos: return vjp_cos;
    case Op::Erf: return vjp_erf;
    case Op::Add: return vjp_add;
    case Op::Sub: return vjp_sub;
    case Op::Mul: return vjp_mul;
    case Op::Div: return vjp_div;
    case Op::Maximum:
    case Op::Minimum: return vjp_minmax;
    case Op::Pow: return vjp_pow;
    case Op::Where: return vjp_where;
    case Op::ReduceSum: return vjp_reduce_sum;
    case Op::ReduceMax: return vjp_reduce_max;
    case Op::Reshape: return vjp_reshape;
    case Op::Permute: return vjp_permute;
    case Op::Expand: return vjp_expand;
    case Op::Slice: return vjp_slice;
    case Op::Pad: return vjp_pad;
    case Op::Concat: return vjp_concat;
    case Op::Matmul: return vjp_product<vjp_matmul>;
    case Op::Gather: return vjp_gather;
    case Op::ScatterAdd: return vjp_scatter_add;
    case Op::DynamicUpdateSlice: return vjp_dus;
    case Op::Reverse: return vjp_reverse;
    case Op::Conv: return vjp_product<vjp_conv>;
    default: return nullptr;
  }
}

}  // namespace tessera::ir
