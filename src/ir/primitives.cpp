// One entry per primitive: shape/dtype rule, cost rule, differentiability -- kept together.
#include "ir/primitives.h"

#include <algorithm>
#include <array>

#include "ir/collectives.h"
#include "ir/conv.h"
#include "ir/node.h"
#include "ir/vjp.h"
#include "core/fail.h"

namespace tessera::ir {
namespace {

using In = const InferArgs&;
std::string desc(const NodePtr& n) { return std::string(dtype_name(n->dtype)) + shape_str(n->shape); }

double bytes_of(const Node& n) { return double(n.numel()) * double(itemsize(n.dtype)); }
double in_bytes(const Node& n) {
  double b = 0;
  for (auto& i : n.inputs) b += bytes_of(*i);
  return b;
}

// Extent arithmetic on attributes (pads, strides, lengths): an overflow is an error, not UB.
int64_t add_extents(int64_t a, int64_t b, const char* op, const std::string& what) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) fail(op, "extent overflows 64 bits: " + what);
  return r;
}
int64_t mul_extents(int64_t a, int64_t b, const char* op, const std::string& what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) fail(op, "extent overflows 64 bits: " + what);
  return r;
}

const Shape& need_shape(In a, const char* op) {
  if (!a.shape) fail(op, "needs an output shape");
  int64_t n = 1;
  for (int64_t d : *a.shape) {
    if (d < 0) fail(op, "negative extent in shape " + shape_str(*a.shape));
    // The message is built only on overflow: this runs for every node traced.
    if (__builtin_mul_overflow(n, d, &n)) fail(op, "extent overflows 64 bits: shape " + shape_str(*a.shape));
  }
  return *a.shape;
}

// The axis attribute of cat, gather and scatter_add: exactly one integer.
int64_t axis_attr(In a, const char* op) {
  if (a.attrs.ints.size() != 1) fail(op, "needs one axis attribute, got " + std::to_string(a.attrs.ints.size()));
  return a.attrs.ints[0];
}

TypeShape infer_source(In a, const char* op, DType dflt) {
  return {need_shape(a, op), a.dtype.value_or(dflt)};
}
TypeShape infer_full(In a) { return infer_source(a, "full", DType::Float32); }
TypeShape infer_iota(In a) {
  TypeShape r = infer_source(a, "iota", DType::Int64);
  if (a.attrs.ints.size() != 1 || a.attrs.ints[0] < 0 || a.attrs.ints[0] >= int64_t(r.shape.size()))
    fail("iota", "axis out of range for shape " + shape_str(r.shape));
  return r;
}
TypeShape infer_rng(In a) {
  TypeShape r = infer_source(a, "rng", DType::Float32);
  if (!is_floating(r.dtype)) fail("rng", std::string("random values need a floating dtype, got ") + dtype_name(r.dtype));
  // ints: draw, distribution and optionally the first element index (a batch slice of a draw).
  const auto& k = a.attrs.ints;
  if (k.size() < 2 || k.size() > 3 || k[1] < 0 || k[1] > 1 || (k.size() == 3 && k[2] < 0)) fail("rng", "bad attributes");
  return r;
}
TypeShape infer_cast(In a) {
  if (!a.dtype) fail("cast", "needs a dtype");
  return {a.inputs[0]->shape, *a.dtype};
}

template <Op O>
TypeShape infer_unary(In a) {
  const NodePtr& x = a.inputs[0];
  const char* name = op_name(O);
  if (x->dtype == DType::Bool) fail(name, "not defined for bool tensors, got " + desc(x));
  bool int_ok = O == Op::Neg || O == Op::Abs || O == Op::Sign || O == Op::Floor || O == Op::Ceil || O == Op::Round;
  if (!int_ok && !is_floating(x->dtype))
    fail(name, "needs a floating tensor, got " + desc(x));
  return {x->shape, x->dtype};
}

template <Op O>
TypeShape infer_binary(In a) {
  const NodePtr &x = a.inputs[0], &y = a.inputs[1];
  const char* name = op_name(O);
  if (x->shape != y->shape || x->dtype != y->dtype)
    fail(name, "operands must agree after broadcasting and promotion, got " + desc(x) + " and " + desc(y));
  bool cmp = is_compare(O);
  if (!cmp && x->dtype == DType::Bool && O != Op::Maximum && O != Op::Minimum)
    fail(name, "arithmetic on bool tensors is not supported, got " + desc(x));
  if ((O == Op::Div || O == Op::Pow) && !is_floating(x->dtype)) fail(name, "needs floating operands, got " + desc(x));
  return {x->shape, cmp ? DType::Bool : x->dtype};
}

TypeShape infer_where(In a) {
  const NodePtr &c = a.inputs[0], &x = a.inputs[1], &y = a.inputs[2];
  if (c->dtype != DType::Bool) fail("where", "condition must be bool, got " + desc(c));
  if (c->shape != x->shape || x->shape != y->shape || x->dtype != y->dtype)
    fail("where", "operands must agree, got " + desc(c) + ", " + desc(x) + ", " + desc(y));
  return {x->shape, x->dtype};
}

template <Op O>
TypeShape infer_reduce(In a) {
  const NodePtr& x = a.inputs[0];
  Shape s = x->shape;
  int64_t prev = -1;
  for (int64_t ax : a.attrs.ints) {
    if (ax <= prev || ax >= int64_t(s.size())) fail(op_name(O), "bad axes for " + desc(x));
    if (O == Op::ReduceMax && s[ax] == 0)
      fail(op_name(O), "cannot take the max over an empty dimension of " + desc(x));
    s[ax] = 1;
    prev = ax;
  }
  if (x->dtype == DType::Bool && O == Op::ReduceSum) fail(op_name(O), "sum of bool: cast first, got " + desc(x));
  return {s, x->dtype};
}

TypeShape infer_reshape(In a) {
  const Shape& s = need_shape(a, "reshape");
  const NodePtr& x = a.inputs[0];
  if (numel(s) != x->numel()) fail("reshape", "cannot reshape " + desc(x) + " to " + shape_str(s));
  return {s, x->dtype};
}

TypeShape infer_permute(In a) {
  const NodePtr& x = a.inputs[0];
  const auto& p = a.attrs.ints;
  std::vector<bool> seen(x->shape.size(), false);
  if (p.size() != x->shape.size()) fail("permute", "permutation of length " + std::to_string(p.size()) + " for " + desc(x));
  Shape s(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] < 0 || p[i] >= int64_t(p.size()) || seen[p[i]]) fail("permute", "invalid permutation for " + desc(x));
    seen[p[i]] = true;
    s[i] = x->shape[p[i]];
  }
  return {s, x->dtype};
}

TypeShape infer_expand(In a) {
  const Shape& s = need_shape(a, "expand");
  const NodePtr& x = a.inputs[0];
  bool ok = s.size() == x->shape.size();
  for (size_t i = 0; ok && i < s.size(); ++i) ok = x->shape[i] == s[i] || x->shape[i] == 1;
  if (!ok) fail("expand", "cannot expand " + desc(x) + " to " + shape_str(s));
  return {s, x->dtype};
}

TypeShape infer_slice(In a) {
  const NodePtr& x = a.inputs[0];
  const auto& v = a.attrs.ints;
  if (v.size() != 3 * x->shape.size()) fail("slice", "needs start/stop/step per dimension of " + desc(x));
  Shape s(x->shape.size());
  for (size_t d = 0; d < s.size(); ++d) {
    int64_t st = v[3 * d], sp = v[3 * d + 1], step = v[3 * d + 2];
    if (step < 1 || st < 0 || sp < st || sp > x->shape[d])
      fail("slice", "bad range [" + std::to_string(st) + ":" + std::to_string(sp) + ":" + std::to_string(step) +
                        "] for dimension " + std::to_string(d) + " of " + desc(x));
    s[d] = sp == st ? 0 : (sp - st - 1) / step + 1;
  }
  return {s, x->dtype};
}

TypeShape infer_pad(In a) {
  const NodePtr& x = a.inputs[0];
  const auto& v = a.attrs.ints;
  if (v.size() != 3 * x->shape.size()) fail("pad", "needs lo/hi/interior per dimension of " + desc(x));
  Shape s(x->shape.size());
  for (size_t d = 0; d < s.size(); ++d) {
    if (v[3 * d] < 0 || v[3 * d + 1] < 0 || v[3 * d + 2] < 0) fail("pad", "negative padding for " + desc(x));
    int64_t n = x->shape[d];
    const std::string what = "padding dimension " + std::to_string(d) + " of " + desc(x);
    int64_t interior = mul_extents(std::max<int64_t>(n - 1, 0), v[3 * d + 2], "pad", what);
    s[d] = add_extents(add_extents(add_extents(v[3 * d], v[3 * d + 1], "pad", what), n, "pad", what), interior, "pad", what);
  }
  return {s, x->dtype};
}

TypeShape infer_concat(In a) {
  const NodePtr& x = a.inputs[0];
  int64_t ax = axis_attr(a, "cat");
  if (ax < 0 || ax >= int64_t(x->shape.size())) fail("cat", "axis out of range for " + desc(x));
  Shape s = x->shape;
  s[ax] = 0;
  for (const NodePtr& y : a.inputs) {
    bool ok = y->dtype == x->dtype && y->shape.size() == x->shape.size();
    for (size_t d = 0; ok && d < s.size(); ++d) ok = int64_t(d) == ax || y->shape[d] == x->shape[d];
    if (!ok) fail("cat", "tensors must agree except along dimension " + std::to_string(ax) + ", got " + desc(x) + " and " + desc(y));
    s[ax] = add_extents(s[ax], y->shape[ax], "cat", "joining " + desc(x) + " and " + desc(y));
  }
  return {s, x->dtype};
}

// Products of float16/bfloat16 operands accumulate in float32 and return float32 (mixed
// precision: the products of autocast, docs/architecture.md "Autocast"); others keep their dtype.
DType product_dtype(DType operands) { return compute_dtype(operands); }

TypeShape infer_matmul(In a) {
  const NodePtr &x = a.inputs[0], &y = a.inputs[1];
  size_t r = x->shape.size();
  bool ok = r >= 2 && y->shape.size() == r && x->dtype == y->dtype && x->dtype != DType::Bool;
  for (size_t d = 0; ok && d + 2 < r; ++d) ok = x->shape[d] == y->shape[d];
  if (!ok || x->shape[r - 1] != y->shape[r - 2])
    fail("matmul", "incompatible operands " + desc(x) + " and " + desc(y));
  Shape s = x->shape;
  s[r - 1] = y->shape[r - 1];
  return {s, product_dtype(x->dtype)};
}

void check_index(const char* op, const NodePtr& src, const NodePtr& idx, int64_t ax, bool equal_extents) {
  if (!is_integral(idx->dtype)) fail(op, "index must be int32 or int64, got " + desc(idx));
  if (idx->shape.size() != src->shape.size()) fail(op, "index " + desc(idx) + " must have the rank of " + desc(src));
  if (ax < 0 || ax >= int64_t(src->shape.size())) fail(op, "axis out of range for " + desc(src));
  for (size_t d = 0; d < src->shape.size(); ++d)
    if (int64_t(d) != ax && (equal_extents ? idx->shape[d] != src->shape[d] : idx->shape[d] > src->shape[d]))
      fail(op, "index " + desc(idx) + " does not fit " + desc(src) + " in dimension " + std::to_string(d));
}

TypeShape infer_gather(In a) {
  check_index("gather", a.inputs[0], a.inputs[1], axis_attr(a, "gather"), false);
  return {a.inputs[1]->shape, a.inputs[0]->dtype};
}

TypeShape infer_scatter_add(In a) {
  const NodePtr &base = a.inputs[0], &idx = a.inputs[1], &src = a.inputs[2];
  check_index("scatter_add", base, idx, axis_attr(a, "scatter_add"), false);
  if (src->shape != idx->shape || src->dtype != base->dtype || base->dtype == DType::Bool)
    fail("scatter_add", "source " + desc(src) + " must match index " + desc(idx) + " and base " + desc(base));
  return {base->shape, base->dtype};
}

TypeShape infer_dus(In a) {
  const NodePtr &base = a.inputs[0], &upd = a.inputs[1], &off = a.inputs[2];
  bool ok = upd->shape.size() == base->shape.size() && upd->dtype == base->dtype;
  for (size_t d = 0; ok && d < base->shape.size(); ++d) ok = upd->shape[d] <= base->shape[d];
  if (!ok) fail("dynamic_update_slice", "update " + desc(upd) + " does not fit " + desc(base));
  if (off->dtype != DType::Int64 || off->shape != Shape{int64_t(base->shape.size())})
    fail("dynamic_update_slice", "offsets must be int64[" + std::to_string(base->shape.size()) + "], got " + desc(off));
  return {base->shape, base->dtype};
}

TypeShape infer_reverse(In a) {
  const NodePtr& x = a.inputs[0];
  int64_t prev = -1;
  for (int64_t ax : a.attrs.ints) {
    if (ax <= prev || ax >= int64_t(x->shape.size())) fail("reverse", "bad axes for " + desc(x));
    prev = ax;
  }
  return {x->shape, x->dtype};
}

TypeShape infer_conv(In a) {
  const NodePtr &x = a.inputs[0], &w = a.inputs[1];
  ConvAttrs c = ConvAttrs::from(a.attrs);
  size_t S = c.axes.size(), r = S + 2;
  std::string both = desc(x) + " and kernel " + desc(w);
  if (x->shape.size() != r || w->shape.size() != r)
    fail("conv", std::to_string(S) + " spatial dims need rank-" + std::to_string(r) + " input and kernel, got " + both);
  if (x->dtype != w->dtype || !is_floating(x->dtype))
    fail("conv", "input and kernel must both be of one floating dtype, got " + both);
  int64_t g = c.groups, F = x->shape[1], O = w->shape[0];
  if (g < 1 || F % g != 0 || O % g != 0 || w->shape[1] != F / g)
    fail("conv", "groups=" + std::to_string(g) + " needs input channels " + std::to_string(F) +
                     " = groups * kernel dim 1 and output channels divisible by groups, got " + both);
  Shape s{x->shape[0], O};
  for (size_t d = 0; d < S; ++d) {
    const ConvAxis& ax = c.axes[d];
    int64_t n = x->shape[d + 2], k = w->shape[d + 2];
    if (ax.stride < 1 || ax.lhs_dilation < 1 || ax.rhs_dilation < 1)
      fail("conv", "stride and dilations must be >= 1 (spatial dim " + std::to_string(d) + ") for " + both);
    if (n < 1 || k < 1) fail("conv", "empty spatial dimension " + std::to_string(d) + " in " + both);
    const std::string what = "spatial dim " + std::to_string(d) + " of " + both;  // the helpers below, checked
    add_extents(add_extents(add_extents(mul_extents(n - 1, ax.lhs_dilation, "conv", what), 1, "conv", what), ax.lo, "conv", what),
                ax.hi, "conv", what);
    mul_extents(k - 1, ax.rhs_dilation, "conv", what);
    if (conv_padded_extent(n, ax) < conv_kernel_extent(k, ax))
      fail("conv", "kernel extent " + std::to_string(conv_kernel_extent(k, ax)) + " exceeds the padded input extent " +
                       std::to_string(conv_padded_extent(n, ax)) + " in spatial dim " + std::to_string(d) + " of " + both);
    s.push_back(conv_output_extent(n, k, ax));
  }
  return {s, product_dtype(x->dtype)};
}

TypeShape infer_leaf(In) { fail("leaf", "leaves are made by ir::leaf()"); }

// ---- cost rules (flops; bytes = bytes read + bytes written) ----
Cost cost_none(const Node& n) { return {0, bytes_of(n)}; }
Cost cost_rng(const Node& n) { return {double(n.numel()), bytes_of(n)}; }
Cost cost_cast(const Node& n) { return {0, in_bytes(n) + bytes_of(n)}; }
Cost cost_elementwise(const Node& n) { return {double(n.numel()), in_bytes(n) + bytes_of(n)}; }
Cost cost_reduce(const Node& n) { return {double(n.inputs[0]->numel()), in_bytes(n) + bytes_of(n)}; }
// A materialized movement reads each output element once and writes it.
Cost cost_movement(const Node& n) { return {0, 2 * bytes_of(n)}; }
Cost cost_matmul(const Node& n) {
  const Shape& a = n.inputs[0]->shape;
  double k = double(a.back());
  return {2.0 * double(n.numel()) * k, in_bytes(n) + bytes_of(n)};
}
Cost cost_gather(const Node& n) { return {0, bytes_of(*n.inputs[1]) + 2 * bytes_of(n)}; }
Cost cost_scatter_add(const Node& n) {
  return {double(n.inputs[2]->numel()), 2 * bytes_of(n) + bytes_of(*n.inputs[1]) + bytes_of(*n.inputs[2])};
}
Cost cost_conv(const Node& n) {
  const Shape& w = n.inputs[1]->shape;
  double per_out = 1;
  for (size_t d = 1; d < w.size(); ++d) per_out *= double(w[d]);  // F/groups * kernel positions
  return {2.0 * double(n.numel()) * per_out, in_bytes(n) + bytes_of(n)};
}
Cost cost_dus(const Node& n) { return {0, 2 * bytes_of(n) + bytes_of(*n.inputs[1])}; }

using C = Category;
#define UN(O, nm, d) {nm, 1, C::Elementwise, d, infer_unary<Op::O>, cost_elementwise, d ? vjp_rule(Op::O) : nullptr}
#define BIN(O, nm, d) {nm, 2, C::Elementwise, d, infer_binary<Op::O>, cost_elementwise, d ? vjp_rule(Op::O) : nullptr}
template <Op O>
TypeShape infer_coll(In a) { return infer_collective(O, a); }
#define COLL(O, nm) {nm, 1, C::Collective, true, infer_coll<Op::O>, cost_collective, collective_vjp_rule(Op::O)}
std::array<PrimitiveInfo, kNumOps> kTable = {{
    {"leaf", 0, C::Source, false, infer_leaf, cost_none, nullptr},
    {"full", 0, C::Source, false, infer_full, cost_none, nullptr},
    {"iota", 0, C::Source, false, infer_iota, cost_none, nullptr},
    {"rng", 0, C::Source, false, infer_rng, cost_rng, nullptr},
    {"cast", 1, C::Elementwise, true, infer_cast, cost_cast, vjp_rule(Op::Cast)},
    UN(Neg, "neg", true), UN(Exp, "exp", true), UN(Log, "log", true), UN(Tanh, "tanh", true),
    UN(Abs, "abs", true), UN(Sign, "sign", false), UN(Sqrt, "sqrt", true), UN(Sin, "sin", true),
    UN(Cos, "cos", true), UN(Erf, "erf", true), UN(Floor, "floor", false), UN(Ceil, "ceil", false),
    UN(Round, "round", false),
    BIN(Add, "add", true), BIN(Sub, "sub", true), BIN(Mul, "mul", true), BIN(Div, "div", true),
    BIN(Maximum, "maximum", true), BIN(Minimum, "minimum", true), BIN(Pow, "pow", true),
    BIN(Eq, "eq", false), BIN(Ne, "ne", false), BIN(Lt, "lt", false), BIN(Le, "le", false),
    BIN(Gt, "gt", false), BIN(Ge, "ge", false),
    {"where", 3, C::Elementwise, true, infer_where, cost_elementwise, vjp_rule(Op::Where)},
    {"reduce_sum", 1, C::Reduce, true, infer_reduce<Op::ReduceSum>, cost_reduce, vjp_rule(Op::ReduceSum)},
    {"reduce_max", 1, C::Reduce, true, infer_reduce<Op::ReduceMax>, cost_reduce, vjp_rule(Op::ReduceMax)},
    {"reshape", 1, C::Movement, true, infer_reshape, cost_movement, vjp_rule(Op::Reshape)},
    {"permute", 1, C::Movement, true, infer_permute, cost_movement, vjp_rule(Op::Permute)},
    {"expand", 1, C::Movement, true, infer_expand, cost_movement, vjp_rule(Op::Expand)},
    {"slice", 1, C::Movement, true, infer_slice, cost_movement, vjp_rule(Op::Slice)},
    {"pad", 1, C::Movement, true, infer_pad, cost_movement, vjp_rule(Op::Pad)},
    {"concat", -1, C::Movement, true, infer_concat, cost_movement, vjp_rule(Op::Concat)},
    {"matmul", 2, C::Contraction, true, infer_matmul, cost_matmul, vjp_rule(Op::Matmul)},
    {"gather", 2, C::Indexing, true, infer_gather, cost_gather, vjp_rule(Op::Gather)},
    {"scatter_add", 3, C::Indexing, true, infer_scatter_add, cost_scatter_add, vjp_rule(Op::ScatterAdd)},
    {"dynamic_update_slice", 3, C::Indexing, true, infer_dus, cost_dus, vjp_rule(Op::DynamicUpdateSlice)},
    {"reverse", 1, C::Movement, true, infer_reverse, cost_movement, vjp_rule(Op::Reverse)},
    {"conv", 2, C::Contraction, true, infer_conv, cost_conv, vjp_rule(Op::Conv)},
    COLL(AllReduce, "all_reduce"), COLL(AllGather, "all_gather"), COLL(ReduceScatter, "reduce_scatter"),
    COLL(AllToAll, "all_to_all"), COLL(Broadcast, "broadcast"), COLL(Reduce, "reduce"),
    COLL(CollectivePermute, "collective_permute"),
}};
#undef UN
#undef BIN
#undef COLL

}  // namespace

const PrimitiveInfo& info(Op op) { return kTable[static_cast<size_t>(op)]; }
VjpRule replace_vjp_for_testing(Op op, VjpRule rule) {
  VjpRule old = kTable[static_cast<size_t>(op)].vjp;
  kTable[static_cast<size_t>(op)].vjp = rule;
  return old;
}
bool is_compare(Op op) { return op >= Op::Eq && op <= Op::Ge; }
const char* reduce_kind_name(ReduceKind k) {
  switch (k) {
    case ReduceKind::Sum: return "sum";
    case ReduceKind::Mean: return "mean";
    case ReduceKind::Max: return "max";
  }
  return "?";
}

}  // namespace tessera::ir
