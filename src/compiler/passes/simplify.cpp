// simplify: algebraic identities and constant folding, bottom-up in one walk. Every rule keeps
// the value the CPU backend computes bit for bit (with passes off each primitive is one Step,
// computed in compute_dtype and rounded to the storage dtype on store), NaN, infinities and the
// sign of zero included:
//
//   identities   x*1, 1*x, x/1, x-(+0), x+(-0), (-0)+x -> x; x+(+0), (+0)+x -> x only when x
//                cannot be -0 (integers, exp, casts from integers, sums of those ...), since
//                -0 + +0 is +0 (and 1/x would then flip from -inf to +inf); x-(-0) likewise;
//                neg(neg x) -> x; maximum/minimum(x, x) -> x; where(c, x, x) -> x;
//                where(full c, a, b) -> a or b; cast to the same dtype -> x; a widening cast
//                cast back (f32->f64->f32, int32->int64->int32, f16/bf16->f32->same) -> x;
//                reduce over extent-1 axes only -> x (sum: integers or x cannot be -0);
//                sum over an empty axis -> full 0; reduce_max(full v) -> full v
//                (a "full" is a Full node of any shape: x+0 traced as add(x, expand(full)) is
//                caught because expand(full) has already become a full)
//   movement     reshape(reshape x) and expand(expand x) -> one; permute(permute x) -> composed
//                (or x when the composition is the identity); slice(slice x) -> one slice;
//                reshape/expand to the same shape, identity permutation, whole-range slice,
//                zero pad and single-input concat -> x
//   constants    reshape/expand/permute/slice of a full -> full; pad of a full with its own
//                value -> full; concat of fulls of one value -> full; neg/abs/sign/sqrt/floor/
//                ceil/round/add/sub/mul/div/maximum/minimum/comparisons/cast of fulls -> full,
//                computed in the CPU's compute type and rounded to the dtype as a Step stores it
//
// Not done, because they change values: x*0 -> 0 (NaN, infinities), any reassociation,
// transcendental folding (exp/log/tanh/sin/cos/erf/pow: libm results may differ by an ulp from
// the backend's vectorised loops), integer folds that overflow, int64 results beyond 2^53
// (a Full's value is a double). Leaf contents are never read: a compiled plan is reused for any
// values of its parameters.
//
// Cost: one walk in topological order; a node is rebuilt (ir::make, in its own scope) only when
// a rule fires or an input was replaced; untouched nodes are shared with the input graph.
#include <cmath>
#include <cstdint>
#include <limits>

#include "compiler/passes/passes.h"
#include "compiler/passes/rewrite.h"
#include "core/half.h"

namespace tessera::compiler {
namespace {

using ir::Node;
using ir::NodePtr;
using ir::Op;

// ---- constant values as the CPU backend holds them ----

enum class Kind { Float, Double, Int, Bool };
Kind kind_of(DType t) {
  switch (compute_dtype(t)) {
    case DType::Float64: return Kind::Double;
    case DType::Int32:
    case DType::Int64: return Kind::Int;
    case DType::Bool: return Kind::Bool;
    default: return Kind::Float;  // float32; float16/bfloat16 compute in float32
  }
}

constexpr double kTwo53 = 9007199254740992.0;

// A compute-type value stored to dtype t and read back (what the next Step sees), or nullopt
// when the CPU's result is not a well-defined value of t (integer overflow, NaN to integer).
std::optional<double> stored(double v, DType t) {
  switch (t) {
    case DType::Float32: return double(float(v));
    case DType::Float64: return v;
    case DType::Float16: return double(half::f16_to_float(half::float_to_f16(float(v))));
    case DType::BFloat16: return double(half::bf16_to_float(half::float_to_bf16(float(v))));
    case DType::Bool: return v != 0 ? 1.0 : 0.0;
    case DType::Int32:
      if (!(v >= -2147483648.0 && v <= 2147483647.0) || v != std::trunc(v)) return std::nullopt;
      return v;
    case DType::Int64:
      if (!(v >= -kTwo53 && v <= kTwo53) || v != std::trunc(v)) return std::nullopt;
      return v;
  }
  return std::nullopt;
}

// The value a Full holds in its compute type (the backend's Const instruction), or nullopt.
std::optional<double> const_value(const Node& n) {
  if (n.op != Op::Full) return std::nullopt;
  double v = n.attrs.f;
  switch (n.dtype) {
    case DType::Int32:
    case DType::Int64:  // the backend truncates; out of range (or NaN) is not a defined value
      if (std::isnan(v)) return std::nullopt;
      return stored(std::trunc(v), n.dtype);
    default: return stored(v, n.dtype);
  }
}

template <class T> T nan_max(T a, T b) {
  if constexpr (std::is_floating_point_v<T>)
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  return a > b ? a : b;
}
template <class T> T nan_min(T a, T b) {
  if constexpr (std::is_floating_point_v<T>)
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  return a < b ? a : b;
}

// One elementwise primitive on compute values of type T (float or double), as the backend runs it.
template <class T>
std::optional<double> eval_float(Op op, T a, T b) {
  switch (op) {
    case Op::Neg: return double(T(-a));
    case Op::Abs: return double(a < T(0) ? T(-a) : a);
    case Op::Sign: return double(a > T(0) ? T(1) : a < T(0) ? T(-1) : a);
    case Op::Sqrt: return double(T(std::sqrt(a)));
    case Op::Floor: return double(T(std::floor(a)));
    case Op::Ceil: return double(T(std::ceil(a)));
    case Op::Round: return double(T(std::nearbyint(a)));
    case Op::Add: { T r = a + b; return double(r); }
    case Op::Sub: { T r = a - b; return double(r); }
    case Op::Mul: { T r = a * b; return double(r); }
    case Op::Div: { T r = a / b; return double(r); }
    case Op::Maximum: return double(nan_max(a, b));
    case Op::Minimum: return double(nan_min(a, b));
    case Op::Eq: return a == b ? 1.0 : 0.0;
    case Op::Ne: return a != b ? 1.0 : 0.0;
    case Op::Lt: return a < b ? 1.0 : 0.0;
    case Op::Le: return a <= b ? 1.0 : 0.0;
    case Op::Gt: return a > b ? 1.0 : 0.0;
    case Op::Ge: return a >= b ? 1.0 : 0.0;
    default: return std::nullopt;
  }
}

// Integers (and bool, as 0/1): exact in int64; nullopt on overflow or beyond 2^53 (a Full's
// value is a double). The dtype's own range is checked on store.
std::optional<double> eval_int(Op op, int64_t a, int64_t b) {
  int64_t r = 0;
  bool overflow = false;
  switch (op) {
    case Op::Neg: overflow = __builtin_sub_overflow(int64_t(0), a, &r); break;
    case Op::Abs:
      r = a;
      if (a < 0) overflow = __builtin_sub_overflow(int64_t(0), a, &r);
      break;
    case Op::Sign: r = a > 0 ? 1 : a < 0 ? -1 : 0; break;
    case Op::Floor:
    case Op::Ceil:
    case Op::Round: r = a; break;
    case Op::Add: overflow = __builtin_add_overflow(a, b, &r); break;
    case Op::Sub: overflow = __builtin_sub_overflow(a, b, &r); break;
    case Op::Mul: overflow = __builtin_mul_overflow(a, b, &r); break;
    case Op::Maximum: r = a > b ? a : b; break;
    case Op::Minimum: r = a < b ? a : b; break;
    case Op::Eq: r = a == b; break;
    case Op::Ne: r = a != b; break;
    case Op::Lt: r = a < b; break;
    case Op::Le: r = a <= b; break;
    case Op::Gt: r = a > b; break;
    case Op::Ge: r = a >= b; break;
    default: return std::nullopt;
  }
  constexpr int64_t kMax = int64_t(1) << 53;
  if (overflow || r > kMax || r < -kMax) return std::nullopt;
  return double(r);
}

bool foldable(Op op) {
  switch (op) {
    case Op::Neg: case Op::Abs: case Op::Sign: case Op::Sqrt: case Op::Floor: case Op::Ceil: case Op::Round:
    case Op::Add: case Op::Sub: case Op::Mul: case Op::Div: case Op::Maximum: case Op::Minimum:
    case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge:
      return true;
    default: return false;
  }
}

// The value of unary/binary `op` on compute values a, b of dtype `in`, stored as `out`.
std::optional<double> fold(Op op, DType in, DType out, double a, double b) {
  std::optional<double> r;
  switch (kind_of(in)) {
    case Kind::Float: r = eval_float<float>(op, float(a), float(b)); break;
    case Kind::Double: r = eval_float<double>(op, a, b); break;
    case Kind::Int:
    case Kind::Bool: r = eval_int(op, int64_t(a), int64_t(b)); break;
  }
  if (!r) return r;
  return stored(*r, out);
}

// cast: the backend's store_as from compute type `from` to compute type `to`, then the storage
// rounding of the result's dtype.
std::optional<double> fold_cast(double v, DType from, DType to) {
  Kind kf = kind_of(from), kt = kind_of(to);
  if (kt == Kind::Bool) return v != 0 ? 1.0 : 0.0;  // NaN != 0: true, as the backend
  if (kt == Kind::Int) {
    if (std::isnan(v)) return std::nullopt;
    return stored(std::trunc(v), to);  // int->int is exact when in range; float->int truncates
  }
  (void)kf;  // to a float type: T(double(v)) (float through double, as store_as does)
  return stored(kt == Kind::Float ? double(float(v)) : v, to);
}

// Whether every value of `narrow` survives a trip through `wide` and back unchanged.
bool round_trips(DType narrow, DType wide) {
  if (narrow == wide) return true;
  switch (narrow) {
    case DType::Bool: return true;  // 0/1 in any dtype, back through v != 0
    case DType::Int32: return wide == DType::Int64 || wide == DType::Float64;
    case DType::Float16:
    case DType::BFloat16: return wide == DType::Float32 || wide == DType::Float64;
    case DType::Float32: return wide == DType::Float64;
    default: return false;
  }
}

bool is_neg_zero(double v) { return v == 0 && std::signbit(v); }

// False when n's value certainly has no -0 element (conservative: true when unsure).
bool may_be_neg_zero(const Node& n, int depth = 0) {
  if (!is_floating(n.dtype)) return false;
  switch (n.op) {
    case Op::Full: {
      auto v = const_value(n);
      return !v || is_neg_zero(*v);
    }
    case Op::Iota: case Op::Exp: return false;  // (abs(-0) is -0 on the CPU backend)
    case Op::Cast: return is_floating(n.inputs[0]->dtype) && (depth > 8 || may_be_neg_zero(*n.inputs[0], depth + 1));
    case Op::Add:  // a + b is -0 only when both are -0
      return depth <= 8 && may_be_neg_zero(*n.inputs[0], depth + 1) && may_be_neg_zero(*n.inputs[1], depth + 1);
    case Op::Reshape: case Op::Permute: case Op::Expand: case Op::Slice:
      return depth > 8 || may_be_neg_zero(*n.inputs[0], depth + 1);
    default: return true;
  }
}

bool is_const(const NodePtr& n, double v) {
  auto c = const_value(*n);
  return c && *c == v;
}
bool is_pos_zero(const NodePtr& n) {
  auto c = const_value(*n);
  return c && *c == 0 && (!is_floating(n->dtype) || !std::signbit(*c));
}
bool is_neg_zero(const NodePtr& n) {
  auto c = const_value(*n);
  return c && is_neg_zero(*c);
}

struct Simplifier : rewrite::Rewriter {
  using Rewriter::Rewriter;

  // n with inputs `in` (already simplified): a simpler equal node, or null when no rule applies.
  NodePtr rule(const Node& n, const std::vector<NodePtr>& in) {
    switch (n.op) {
      case Op::Reshape:
      case Op::Expand: {
        const NodePtr& x = in[0];
        if (x->shape == n.shape) return x;
        if (x->op == Op::Full) return full(n, x->attrs.f, n.shape, n.dtype);
        if (x->op == n.op) {  // reshape(reshape y) / expand(expand y): one step from y
          const NodePtr& y = x->inputs[0];
          if (y->shape == n.shape) return y;
          return remake(n, {y});
        }
        return nullptr;
      }
      case Op::Permute: {
        const NodePtr& x = in[0];
        const auto& p = n.attrs.ints;
        if (x->op == Op::Full) return full(n, x->attrs.f, n.shape, n.dtype);
        bool ident = true;
        for (size_t i = 0; i < p.size(); ++i) ident &= p[i] == int64_t(i);
        if (ident) return x;
        if (x->op == Op::Permute) {  // out dim i = x dim p[i] = y dim q[p[i]]
          const auto& q = x->attrs.ints;
          std::vector<int64_t> r(p.size());
          bool id = true;
          for (size_t i = 0; i < p.size(); ++i) id &= (r[i] = q[size_t(p[i])]) == int64_t(i);
          if (id) return x->inputs[0];
          return make_in(n.scope, Op::Permute, {x->inputs[0]}, ir::Attrs{r, 0}, &n.shape, n.dtype, n.device);
        }
        // (a @ b)^T = b^T @ a^T for a matrix product read only here: the product comes out in the
        // layout its reader wants (a Linear's weight gradient, which AdamW would otherwise read
        // across rows). BLAS takes the transposed operands as they are; each element is the same
        // dot product, though BLAS may round it differently. (Batched products, attention's, are
        // left alone: their readers move heads around, and a transposed read is no worse there.)
        if (x->op == Op::Matmul && p.size() == 2 && uses[size_t(g.index.at(n.inputs[0].get()))] == 1)
          return make_in(n.scope, Op::Matmul, {transposed(n, x->inputs[1]), transposed(n, x->inputs[0])}, x->attrs,
                         &n.shape, n.dtype, n.device);
        // The same through casts read only here (autocast's weight gradient: the product rounded
        // to bfloat16 and back, then transposed): the casts commute with the transpose.
        if (x->op == Op::Cast && p.size() == 2) return transpose_through_casts(n, n.inputs[0]);
        return nullptr;
      }
      case Op::Slice: {
        const NodePtr& x = in[0];
        const auto& v = n.attrs.ints;
        if (x->op == Op::Full) return full(n, x->attrs.f, n.shape, n.dtype);
        bool whole = true;
        for (size_t d = 0; d < n.shape.size(); ++d) whole &= v[3 * d] == 0 && n.shape[d] == x->shape[d] && v[3 * d + 2] == 1;
        if (whole) return x;
        if (x->op == Op::Slice) {  // element j of dim d: y[(s1 + s2*k1) + j*(k1*k2)]
          const auto& u = x->attrs.ints;
          std::vector<int64_t> r(v.size());
          for (size_t d = 0; d < n.shape.size(); ++d) {
            if (n.shape[d] == 0) {  // empty: [0:0:1] (the composed start may lie past the end)
              r[3 * d] = r[3 * d + 1] = 0;
              r[3 * d + 2] = 1;
              continue;
            }
            int64_t k1 = u[3 * d + 2], start = u[3 * d] + v[3 * d] * k1, step = k1 * v[3 * d + 2];
            r[3 * d] = start;
            r[3 * d + 1] = start + (n.shape[d] - 1) * step + 1;
            r[3 * d + 2] = step;
          }
          return make_in(n.scope, Op::Slice, {x->inputs[0]}, ir::Attrs{r, 0}, &n.shape, n.dtype, n.device);
        }
        return nullptr;
      }
      case Op::Pad: {
        const NodePtr& x = in[0];
        bool zero = true;
        for (int64_t p : n.attrs.ints) zero &= p == 0;
        if (zero) return x;
        if (x->op == Op::Full && x->attrs.f == n.attrs.f) return full(n, x->attrs.f, n.shape, n.dtype);
        return nullptr;
      }
      case Op::Concat: {
        if (in.size() == 1) return in[0];
        for (const NodePtr& x : in)
          if (x->op != Op::Full || !(x->attrs.f == in[0]->attrs.f)) return nullptr;
        return full(n, in[0]->attrs.f, n.shape, n.dtype);
      }
      case Op::ReduceSum:
      case Op::ReduceMax: {
        const NodePtr& x = in[0];
        bool ones = true, empty = false;
        for (int64_t ax : n.attrs.ints) {
          ones &= x->shape[size_t(ax)] == 1;
          empty |= x->shape[size_t(ax)] == 0;
        }
        // Sums accumulate from +0, so a sum of one -0 is +0.
        if (ones && (n.op == Op::ReduceMax || !may_be_neg_zero(*x))) return x;
        if (n.op == Op::ReduceSum && empty) return full(n, 0.0, n.shape, n.dtype);
        if (n.op == Op::ReduceMax && x->op == Op::Full) return full(n, x->attrs.f, n.shape, n.dtype);
        return nullptr;
      }
      case Op::Cast: {
        const NodePtr& x = in[0];
        if (x->dtype == n.dtype) return x;
        if (x->op == Op::Full) {
          auto c = const_value(*x);
          if (!c) return nullptr;
          auto r = fold_cast(*c, x->dtype, n.dtype);
          return r ? full(n, *r, n.shape, n.dtype) : nullptr;
        }
        if (x->op == Op::Cast && x->inputs[0]->dtype == n.dtype && round_trips(n.dtype, x->dtype)) return x->inputs[0];
        return nullptr;
      }
      case Op::Neg:
        if (in[0]->op == Op::Neg) return in[0]->inputs[0];
        break;
      case Op::Add:
        // x + (-0) is x for every x; x + (+0) turns -0 into +0.
        if (is_neg_zero(in[1]) || (is_pos_zero(in[1]) && !may_be_neg_zero(*in[0]))) return in[0];
        if (is_neg_zero(in[0]) || (is_pos_zero(in[0]) && !may_be_neg_zero(*in[1]))) return in[1];
        break;
      case Op::Sub:
        if (is_pos_zero(in[1]) || (is_neg_zero(in[1]) && !may_be_neg_zero(*in[0]))) return in[0];
        break;
      case Op::Mul:
        if (is_const(in[1], 1)) return in[0];
        if (is_const(in[0], 1)) return in[1];
        break;
      case Op::Div:
        if (is_const(in[1], 1)) return in[0];
        break;
      case Op::Maximum:
      case Op::Minimum:
        if (in[0] == in[1]) return in[0];
        break;
      case Op::Where: {
        if (in[1] == in[2]) return in[1];
        auto c = const_value(*in[0]);
        if (c) return *c != 0 ? in[1] : in[2];
        return nullptr;
      }
      default: break;
    }
    // Elementwise unary/binary primitives of constants.
    if (!foldable(n.op)) return nullptr;
    double v[2] = {0, 0};
    for (size_t k = 0; k < in.size(); ++k) {
      auto c = const_value(*in[k]);
      if (!c) return nullptr;
      v[k] = *c;
    }
    auto r = fold(n.op, in[0]->dtype, n.dtype, v[0], v[1]);
    return r ? full(n, *r, n.shape, n.dtype) : nullptr;
  }

  // How many nodes (and graph outputs) read each node of g.
  std::vector<int> uses = [&] {
    std::vector<int> u(g.nodes.size(), 0);
    for (const NodePtr& np : g.nodes)
      for (const NodePtr& x : np->inputs) ++u[size_t(g.index.at(x.get()))];
    for (int o : g.outputs) ++u[size_t(o)];
    return u;
  }();

  // The 2-D transpose `n` of original node `orig`, pushed through casts read only by it down to a
  // product read only by them, which then computes the transposed result (b^T a^T); none when
  // the chain ends otherwise. Each element is the same dot product, cast the same way.
  NodePtr transpose_through_casts(const Node& n, const NodePtr& orig) {
    const int* at = g.index.find(orig.get());
    if (!at || uses[size_t(*at)] != 1 || orig->shape.size() != 2) return nullptr;
    const NodePtr& x = out[size_t(*at)];
    Shape t{x->shape[1], x->shape[0]};
    if (x->op == Op::Matmul && x->shape.size() == 2)
      return make_in(n.scope, Op::Matmul, {transposed(n, x->inputs[1]), transposed(n, x->inputs[0])}, x->attrs, &t, x->dtype,
                     n.device);
    if (x->op != Op::Cast || orig->op != Op::Cast) return nullptr;
    NodePtr y = transpose_through_casts(n, orig->inputs[0]);
    return y ? make_in(n.scope, Op::Cast, {y}, x->attrs, &t, x->dtype, n.device) : nullptr;
  }

  // Matrix x transposed, in `like`'s scope: x's own input when x is a transpose.
  NodePtr transposed(const Node& like, const NodePtr& x) {
    if (x->op == Op::Permute && x->attrs.ints == std::vector<int64_t>{1, 0}) return x->inputs[0];
    return make_in(like.scope, Op::Permute, {x}, ir::Attrs{{1, 0}, 0}, nullptr, x->dtype, like.device);
  }

  ir::Graph run() {
    return apply([this](const Node& n, const std::vector<NodePtr>& in) { return rule(n, in); });
  }
};

}  // namespace

ir::Graph simplify(const ir::Graph& g) { return Simplifier(g).run(); }

}  // namespace tessera::compiler
