// StableHLO lowerings of sources, casts, elementwise ops and reductions (lower.h).
#include <cmath>
#include <limits>

#include "backends/stablehlo/lower.h"
#include "core/fail.h"

namespace tessera::stablehlo {
namespace {

using ir::Op;

bool is_float_elem(const std::string& e) { return e[0] == 'f' || e == "bf16"; }

const char* unary_name(Op op) {
  switch (op) {
    case Op::Neg: return "stablehlo.negate";
    case Op::Exp: return "stablehlo.exponential";
    case Op::Log: return "stablehlo.log";
    case Op::Tanh: return "stablehlo.tanh";
    case Op::Abs: return "stablehlo.abs";
    case Op::Sign: return "stablehlo.sign";
    case Op::Sqrt: return "stablehlo.sqrt";
    case Op::Sin: return "stablehlo.sine";
    case Op::Cos: return "stablehlo.cosine";
    case Op::Erf: return "chlo.erf";  // CHLO: XLA legalizes it, as in jax's own modules
    case Op::Floor: return "stablehlo.floor";
    case Op::Ceil: return "stablehlo.ceil";
    case Op::Round: return "stablehlo.round_nearest_even";
    default: return nullptr;
  }
}

const char* binary_name(Op op, bool is_bool) {
  switch (op) {
    case Op::Add: return "stablehlo.add";
    case Op::Sub: return "stablehlo.subtract";
    case Op::Mul: return "stablehlo.multiply";
    case Op::Div: return "stablehlo.divide";
    case Op::Maximum: return is_bool ? "stablehlo.or" : "stablehlo.maximum";  // NaN-propagating in XLA
    case Op::Minimum: return is_bool ? "stablehlo.and" : "stablehlo.minimum";
    case Op::Pow: return "stablehlo.power";
    default: return nullptr;
  }
}

const char* compare_dir(Op op) {
  switch (op) {
    case Op::Eq: return "EQ";
    case Op::Ne: return "NE";
    case Op::Lt: return "LT";
    case Op::Le: return "LE";
    case Op::Gt: return "GT";
    case Op::Ge: return "GE";
    default: return nullptr;
  }
}

V lower_unary(Writer& w, const ir::Node& n, const V& x) {
  if (!is_floating(n.dtype)) {  // integers: floor/ceil/round are the identity
    if (n.op == Op::Floor || n.op == Op::Ceil || n.op == Op::Round) return x;
    return w.unary(unary_name(n.op), x);
  }
  if (n.op == Op::Neg || n.op == Op::Abs) return w.unary(unary_name(n.op), x);  // exact in any float
  return w.convert(w.unary(unary_name(n.op), compute(w, x)), x.elem);
}

V is_nan(Writer& w, const V& x) { return w.compare("NE", x, x); }

// XLA's CPU maximum/minimum (and reductions with them) may drop NaNs; Tessera's propagate them.
V nan_propagating(Writer& w, const char* name, const V& a, const V& b) {
  V m = w.binary(name, a, b);
  if (!is_float_elem(a.elem)) return m;
  return w.select(is_nan(w, a), a, w.select(is_nan(w, b), b, m));
}

V lower_reduce(Writer& w, const ir::Node& n, const V& x) {
  V cx = compute(w, x);
  const std::string& e = cx.elem;
  V init;
  std::string body;
  if (n.op == Op::ReduceSum) {
    init = w.constant(0, {}, e), body = "stablehlo.add";
  } else if (e == "i1") {
    init = w.constant(0, {}, e), body = "stablehlo.or";
  } else {
    double lowest = is_float_elem(e) ? -std::numeric_limits<double>::infinity()
                    : e == "i32"     ? double(std::numeric_limits<int32_t>::min())
                                     : -9223372036854775808.0;
    init = w.constant(lowest, {}, e), body = "stablehlo.maximum";
  }
  V r = w.reduce(cx, init, n.attrs.ints, body);
  if (n.op == Op::ReduceMax && is_float_elem(e)) {  // NaN wherever a reduced row holds one
    V any = w.reduce(is_nan(w, cx), w.constant(0, {}, "i1"), n.attrs.ints, "stablehlo.or");
    r = w.select(any, w.constant(NAN, r.shape, e), r);
  }
  return w.convert(w.reshape(r, n.shape), x.elem);
}

}  // namespace

V compute(Writer& w, const V& x) { return x.elem == "f16" || x.elem == "bf16" ? w.convert(x, "f32") : x; }

V cast(Writer& w, const V& x, DType from, DType to) {
  const std::string e = elem_of(to);
  if (from == to) return x;
  if (to == DType::Bool) return w.compare("NE", x, w.constant(0, x.shape, x.elem));  // NaN -> true
  if (to == DType::Float16 || to == DType::BFloat16) return w.convert(w.convert(x, "f32"), e);  // via float32
  if (to == DType::Int32 && is_floating(from)) return w.convert(w.convert(x, "i64"), e);  // wraps, as C++ does
  return w.convert(x, e);
}

V lower_elementwise(Lowering& L, const ir::Node& n, const std::vector<V>& in) {
  Writer& w = L.w;
  const std::string e = elem_of(n.dtype);
  switch (n.op) {
    case Op::Full: return w.constant(n.attrs.f, n.shape, e);
    case Op::Iota: return cast(w, w.iota(n.shape, n.attrs.ints.at(0), "i64"), DType::Int64, n.dtype);
    case Op::Cast: return cast(w, in[0], n.inputs[0]->dtype, n.dtype);
    case Op::Where: return w.select(in[0], in[1], in[2]);
    case Op::ReduceSum: case Op::ReduceMax: return lower_reduce(w, n, in[0]);
    default: break;
  }
  if (unary_name(n.op)) return lower_unary(w, n, in[0]);
  if (const char* dir = compare_dir(n.op)) return w.compare(dir, in[0], in[1]);
  if (const char* name = binary_name(n.op, n.dtype == DType::Bool)) {
    if (n.op == Op::Maximum || n.op == Op::Minimum) return nan_propagating(w, name, in[0], in[1]);  // exact
    return w.convert(w.binary(name, compute(w, in[0]), compute(w, in[1])), e);
  }
  fail("stablehlo", std::string("no elementwise lowering for ") + ir::op_name(n.op));
}

}  // namespace tessera::stablehlo
