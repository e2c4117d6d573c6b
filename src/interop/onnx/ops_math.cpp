// ONNX ops: elementwise math, comparisons and logic, reductions, softmax and the losses.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "interop/onnx/ops_util.h"
#include "tessera/ops.h"

namespace tessera::onnx::detail {
namespace {

// ---- elementwise ----
using Unary = Tensor (*)(const Tensor&);
OpFn unary(Unary f) {
  return [f](Ctx& c) { return Ts{f(c.input(0))}; };
}
template <class F> OpFn unary_fn(F f) {
  return [f](Ctx& c) { return Ts{f(c, c.input(0))}; };
}
using Binary = Tensor (*)(const Tensor&, const Tensor&);
OpFn binary(Binary f) {
  return [f](Ctx& c) { return Ts{f(c.input(0), c.input(1))}; };
}
// Variadic Max/Min/Sum/Mean, broadcasting.
OpFn variadic(Binary f, bool mean = false) {
  return [f, mean](Ctx& c) {
    Tensor r = c.input(0);
    for (size_t k = 1; k < c.in.size(); ++k) r = f(r, c.input(k));
    if (mean) r = r / double(c.in.size());
    return Ts{r};
  };
}

// atan by two argument halvings and an odd series (|t| <= tan(pi/16): error below 1e-9).
Tensor atan_(const Tensor& x) {
  Tensor t = x;
  for (int k = 0; k < 2; ++k) t = t / (1.0 + sqrt(1.0 + t * t));
  Tensor t2 = t * t, term = t, s = t;
  for (int n = 3; n <= 15; n += 2) {
    term = -(term * t2);
    s = s + term / double(n);
  }
  return s * 4.0;
}
Tensor asin_(const Tensor& x) {
  Tensor r = atan_(x / sqrt(1.0 - x * x));
  return where(abs(x) >= like(1, x), sign(x) * (kPi / 2), r);  // +-1 exactly; NaN beyond
}

Tensor int_div(const Tensor& a, const Tensor& b) {
  if (!is_integral(a.dtype())) return div(a, b);
  Tensor q = div(a.to(DType::Float64), b.to(DType::Float64));
  return (sign(q) * floor(abs(q))).to(a.dtype());  // truncates toward zero
}

Tensor mod_(Ctx& c) {
  const Tensor &a = c.input(0), &b = c.input(1);
  bool fmod = c.i("fmod", 0) != 0;
  if (!fmod && !is_integral(a.dtype())) c.fail("fmod=0 is only defined for integers");
  DType w = is_integral(a.dtype()) ? DType::Float64 : compute_dtype(a.dtype());
  Tensor x = a.to(w), y = b.to(w), q = x / y;
  q = fmod ? sign(q) * floor(abs(q)) : floor(q);
  return (x - q * y).to(a.dtype());
}

// ---- reductions ----
enum class Red { Sum, Mean, Max, Min, Prod, L1, L2, LogSum, LogSumExp, SumSquare };
OpFn reduce(Red kind) {
  return [kind](Ctx& c) {
    const Tensor& x = c.input(0);
    bool keep = c.i("keepdims", 1) != 0;
    std::vector<int64_t> axes;
    bool axes_input = kind == Red::Sum && c.opset >= 13;
    if (axes_input) {
      if (c.has_input(1)) axes = c.ints_input(1);
      if (axes.empty() && c.i("noop_with_empty_axes", 0)) return Ts{x};
    } else {
      axes = c.ints("axes");
    }
    axes = axes_of(c, axes, x.dim());
    if (axes.empty())
      for (int64_t d = 0; d < x.dim(); ++d) axes.push_back(d);
    if (axes.empty()) return Ts{x};  // a scalar
    switch (kind) {
      case Red::Sum: return Ts{sum(x, axes, keep)};
      case Red::Mean: return Ts{mean(x, axes, keep)};
      case Red::Max: return Ts{amax(x, axes, keep)};
      case Red::Min: return Ts{amin(x, axes, keep)};
      case Red::L1: return Ts{sum(abs(x), axes, keep)};
      case Red::L2: return Ts{sqrt(sum(x * x, axes, keep))};
      case Red::LogSum: return Ts{log(sum(x, axes, keep))};
      case Red::LogSumExp: return Ts{logsumexp(x, axes, keep)};
      case Red::SumSquare: return Ts{sum(x * x, axes, keep)};
      case Red::Prod: {  // |product| from a sum of logs, its sign from the count of negatives
        Tensor mag = exp(sum(log(abs(x.to(compute_dtype(x.dtype()) == DType::Float64 ? DType::Float64 : DType::Float32))), axes, keep));
        Tensor negs = sum((x < 0.0).to(DType::Float32), axes, keep);
        Tensor sgn = 1.0 - 2.0 * (negs - 2.0 * floor(negs / 2.0));
        Tensor r = mag * sgn;
        return Ts{is_integral(x.dtype()) ? round(r).to(x.dtype()) : r.to(x.dtype())};
      }
    }
    c.fail("unreachable");
  };
}

OpFn arg_extreme(bool is_max) {
  return [is_max](Ctx& c) {
    Tensor x = c.input(0);
    int64_t axis = axis_of(c, c.i("axis", 0), x.dim());
    bool keep = c.i("keepdims", 1) != 0, last = c.i("select_last_index", 0) != 0;
    if (last) x = flip(x, {axis});
    Tensor idx = is_max ? argmax(x, axis, keep) : argmin(x, axis, keep);
    if (last) idx = (c.input(0).size(axis) - 1) - idx;
    return Ts{idx.to(DType::Int64)};
  };
}

// Softmax-like ops: before opset 13 over the 2-D view [prod(:axis), prod(axis:)].
template <class F> OpFn softmax_like(F f) {
  return [f](Ctx& c) {
    const Tensor& x = c.input(0);
    if (c.opset >= 13) return Ts{f(x, axis_of(c, c.i("axis", -1), x.dim()))};
    int64_t axis = axis_of(c, c.i("axis", 1), x.dim());
    Shape s = x.shape();
    int64_t outer = std::accumulate(s.begin(), s.begin() + axis, int64_t(1), std::multiplies<>());
    return Ts{f(x.reshape({outer, -1}), 1).reshape(s)};
  };
}
Tensor hardmax(const Tensor& x, int64_t axis) {
  Tensor idx = argmax(x, axis, true);
  Shape s(size_t(x.dim()), 1);
  s[size_t(axis)] = x.size(axis);
  Tensor pos = arange(double(x.size(axis)), TensorOptions{DType::Int64, x.device()}).reshape(s);
  return eq(pos, idx).to(x.dtype());
}


Tensor cumsum_(Ctx& c) {
  Tensor x = c.input(0);
  int64_t axis = axis_of(c, c.ints_input(1).at(0), x.dim());
  bool rev = c.i("reverse", 0) != 0;
  if (rev) x = flip(x, {axis});
  Tensor r = cumsum(x, axis).to(x.dtype());
  if (c.i("exclusive", 0)) r = r - x;
  return rev ? flip(r, {axis}) : r;
}

Ts top_k(Ctx& c) {
  const Tensor& x = c.input(0);
  int64_t k = c.opset >= 10 ? c.ints_input(1).at(0) : c.i("k", 0);
  int64_t axis = axis_of(c, c.i("axis", -1), x.dim());
  auto [v, i] = topk(x, k, axis, c.i("largest", 1) != 0, true);
  return {v, i.to(DType::Int64)};
}

// Negative log likelihood of log-probabilities [N, C, d...] at targets [N, d...] (ONNX's
// NegativeLogLikelihoodLoss; SoftmaxCrossEntropyLoss applies log_softmax first).
Tensor nll(Ctx& c, const Tensor& logp, const Tensor& target_in, const Tensor& weight) {
  Tensor target = target_in.to(DType::Int64);
  bool has_ii = c.has("ignore_index");
  int64_t ii = c.i("ignore_index", 0);
  Tensor keep = has_ii ? ne(target, full({}, double(ii), {DType::Int64, target.device()})) : ones(target.shape(), {DType::Bool, target.device()});
  Tensor t = where(keep, target, zeros_like(target));
  Tensor picked = gather(logp, 1, t.unsqueeze(1)).squeeze(1);
  Tensor w = weight.defined() ? index_select(weight, 0, t.reshape({t.numel()})).reshape(t.shape()) : ones_like(picked);
  w = where(keep, w, zeros_like(w));
  Tensor loss = -(picked * w);
  std::string red = c.s("reduction", "mean");
  if (red == "none") return loss;
  if (red == "sum") return sum(loss);
  if (red != "mean") c.fail("reduction '" + red + "'");
  return sum(loss) / sum(w);
}

Ts sce_loss(Ctx& c) {
  Tensor logp = log_softmax(c.input(0), 1);
  return {nll(c, logp, c.input(1), c.has_input(2) ? c.input(2) : Tensor()), logp};
}

Tensor clip_(Ctx& c) {
  std::optional<double> lo, hi;
  if (c.opset < 11) {
    if (c.has("min")) lo = c.f("min", 0);
    if (c.has("max")) hi = c.f("max", 0);
  } else {
    if (c.has_input(1)) lo = c.doubles_input(1).at(0);
    if (c.has_input(2)) hi = c.doubles_input(2).at(0);
  }
  const Tensor& x = c.input(0);
  if (!lo && !hi) return x;
  if (is_integral(x.dtype())) return clamp(x.to(DType::Float64), lo, hi).to(x.dtype());
  return clamp(x, lo, hi);
}

}  // namespace

void add_math_ops(OpTable& t) {
  t["Abs"] = unary(abs);
  t["Neg"] = unary(neg);
  t["Sqrt"] = unary(sqrt);
  t["Reciprocal"] = unary(reciprocal);
  t["Exp"] = unary(exp);
  t["Log"] = unary(log);
  t["Sin"] = unary(sin);
  t["Cos"] = unary(cos);
  t["Tan"] = unary_fn([](Ctx&, const Tensor& x) { return sin(x) / cos(x); });
  t["Tanh"] = unary(tanh);
  t["Sigmoid"] = unary(sigmoid);
  t["Relu"] = unary(relu);
  t["Erf"] = unary(erf);
  t["Floor"] = unary(floor);
  t["Ceil"] = unary(ceil);
  t["Round"] = unary(round);
  t["Sign"] = unary(sign);
  t["Atan"] = unary(atan_);
  t["Asin"] = unary(asin_);
  t["Acos"] = unary_fn([](Ctx&, const Tensor& x) { return (kPi / 2) - asin_(x); });
  t["Sinh"] = unary_fn([](Ctx&, const Tensor& x) { return (exp(x) - exp(-x)) * 0.5; });
  t["Cosh"] = unary_fn([](Ctx&, const Tensor& x) { return (exp(x) + exp(-x)) * 0.5; });
  t["Asinh"] = unary_fn([](Ctx&, const Tensor& x) { return log(x + sqrt(x * x + 1.0)); });
  t["Acosh"] = unary_fn([](Ctx&, const Tensor& x) { return log(x + sqrt(x * x - 1.0)); });
  t["Atanh"] = unary_fn([](Ctx&, const Tensor& x) { return log((1.0 + x) / (1.0 - x)) * 0.5; });
  t["Softplus"] = unary_fn([](Ctx&, const Tensor& x) { return softplus(x); });
  t["Softsign"] = unary_fn([](Ctx&, const Tensor& x) { return x / (1.0 + abs(x)); });
  t["Not"] = unary(logical_not);
  t["IsNaN"] = unary_fn([](Ctx&, const Tensor& x) { return ne(x, x); });
  t["IsInf"] = unary_fn([](Ctx& c, const Tensor& x) {
    Tensor pos = eq(x, like(kInf, x)), neg_ = eq(x, like(-kInf, x));
    bool p = c.i("detect_positive", 1) != 0, n = c.i("detect_negative", 1) != 0;
    if (p && n) return logical_or(pos, neg_);
    if (p) return pos;
    if (n) return neg_;
    return logical_and(pos, neg_);
  });
  t["LeakyRelu"] = unary_fn([](Ctx& c, const Tensor& x) { return where(x >= 0.0, x, x * c.f("alpha", 0.01)); });
  t["Elu"] = unary_fn([](Ctx& c, const Tensor& x) { return where(x > 0.0, x, (exp(x) - 1.0) * c.f("alpha", 1.0)); });
  t["Selu"] = unary_fn([](Ctx& c, const Tensor& x) {
    double a = c.f("alpha", 1.67326319217681884765625), g = c.f("gamma", 1.05070102214813232421875);
    return where(x > 0.0, x * g, (exp(x) - 1.0) * (a * g));
  });
  t["Celu"] = unary_fn([](Ctx& c, const Tensor& x) {
    double a = c.f("alpha", 1.0);
    return relu(x) + minimum(zeros_like(x), (exp(x / a) - 1.0) * a);
  });
  t["ThresholdedRelu"] = unary_fn([](Ctx& c, const Tensor& x) { return where(x > c.f("alpha", 1.0), x, zeros_like(x)); });
  t["HardSigmoid"] = unary_fn([](Ctx& c, const Tensor& x) { return clamp(x * c.f("alpha", 0.2) + c.f("beta", 0.5), 0.0, 1.0); });
  t["HardSwish"] = unary_fn([](Ctx&, const Tensor& x) { return x * clamp(x / 6.0 + 0.5, 0.0, 1.0); });
  t["Shrink"] = unary_fn([](Ctx& c, const Tensor& x) {
    double b = c.f("bias", 0.0), l = c.f("lambd", 0.5);
    return where(x < -l, x + b, where(x > l, x - b, zeros_like(x)));
  });
  t["Clip"] = [](Ctx& c) { return Ts{clip_(c)}; };
  t["Add"] = binary(add);
  t["Sub"] = binary(sub);
  t["Mul"] = binary(mul);
  t["Div"] = binary(int_div);
  // A constant exponent of 1 or 2 (LayerNorm's variance in PyTorch's exports) is x or x * x,
  // exactly what pow gives, without pow's exp/log evaluation.
  t["Pow"] = [](Ctx& c) {
    const Tensor& x = c.input(0);
    if (c.hin.size() > 1 && c.hin[1] && c.hin[1]->numel() == 1 && is_floating(x.dtype())) {
      const HostVal& e = *c.hin[1];
      double v = e.floating() ? e.f[0] : double(e.i[0]);
      Shape s = broadcast_shapes(x.shape(), e.shape, "Pow");
      if (s == x.shape() && v == 2) return Ts{x * x};
      if (s == x.shape() && v == 1) return Ts{x};
    }
    return Ts{cast(pow(x, c.input(1)), x.dtype())};
  };
  t["Mod"] = [](Ctx& c) { return Ts{mod_(c)}; };
  t["Equal"] = binary(eq);
  t["Greater"] = binary(gt);
  t["Less"] = binary(lt);
  t["GreaterOrEqual"] = binary(ge);
  t["LessOrEqual"] = binary(le);
  t["And"] = binary(logical_and);
  t["Or"] = binary(logical_or);
  t["Xor"] = binary(logical_xor);
  t["PRelu"] = [](Ctx& c) { const Tensor& x = c.input(0); return Ts{where(x < 0.0, x * c.input(1), x)}; };
  t["Max"] = variadic(maximum);
  t["Min"] = variadic(minimum);
  t["Sum"] = variadic(add);
  t["Mean"] = variadic(add, true);
  t["ReduceSum"] = reduce(Red::Sum);
  t["ReduceMean"] = reduce(Red::Mean);
  t["ReduceMax"] = reduce(Red::Max);
  t["ReduceMin"] = reduce(Red::Min);
  t["ReduceProd"] = reduce(Red::Prod);
  t["ReduceL1"] = reduce(Red::L1);
  t["ReduceL2"] = reduce(Red::L2);
  t["ReduceLogSum"] = reduce(Red::LogSum);
  t["ReduceLogSumExp"] = reduce(Red::LogSumExp);
  t["ReduceSumSquare"] = reduce(Red::SumSquare);
  t["ArgMax"] = arg_extreme(true);
  t["ArgMin"] = arg_extreme(false);
  t["CumSum"] = [](Ctx& c) { return Ts{cumsum_(c)}; };
  t["TopK"] = top_k;
  t["Softmax"] = softmax_like([](const Tensor& x, int64_t d) { return softmax(x, d); });
  t["LogSoftmax"] = softmax_like([](const Tensor& x, int64_t d) { return log_softmax(x, d); });
  t["Hardmax"] = softmax_like(hardmax);
  t["NegativeLogLikelihoodLoss"] = [](Ctx& c) { return Ts{nll(c, c.input(0), c.input(1), c.has_input(2) ? c.input(2) : Tensor())}; };
  t["SoftmaxCrossEntropyLoss"] = sce_loss;
}

}  // namespace tessera::onnx::detail
