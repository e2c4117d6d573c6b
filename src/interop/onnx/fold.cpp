// Shape arithmetic on the host: the nodes of an exported model whose values depend only on the
// input shapes and constants (Shape, Gather, Concat, Unsqueeze, arithmetic on such values ...)
// are evaluated here, with no graph built or run, so the shape operands they feed (Reshape's
// shape, Slice's ends, ...) need no read back from the device. Each op follows the semantics
// of its traced implementation in ops_*.cpp; float32 results are rounded after every operation
// (exactly what the device's float32 arithmetic gives for + - * / and sqrt).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "interop/onnx/ops_util.h"
#include "tessera/ops.h"

namespace tessera::onnx::detail {

bool host_dtype(DType d) {
  return d == DType::Int64 || d == DType::Int32 || d == DType::Bool || d == DType::Float32 || d == DType::Float64;
}

int64_t numel_of(const Shape& s) { return std::accumulate(s.begin(), s.end(), int64_t(1), std::multiplies<>()); }

HostVal host_of(const Tensor& t) {
  HostVal h;
  h.dtype = t.dtype();
  h.shape = t.shape();
  if (h.floating()) h.f = t.to_vector<double>();  // to_vector converts on the host: no cast graph
  else h.i = t.to_vector<int64_t>();
  return h;
}

Tensor to_device(const HostVal& h, const Device& device) {
  TensorOptions o{h.dtype, device};
  switch (h.dtype) {
    case DType::Float32: return from_vector(std::vector<float>(h.f.begin(), h.f.end()), h.shape, o);
    case DType::Float64: return from_vector(h.f, h.shape, o);
    case DType::Int64: return from_vector(h.i, h.shape, o);
    case DType::Int32: return from_vector(std::vector<int32_t>(h.i.begin(), h.i.end()), h.shape, o);
    case DType::Bool: {
      std::vector<uint8_t> v(h.i.size());
      for (size_t k = 0; k < v.size(); ++k) v[k] = uint8_t(h.i[k] != 0);
      return from_vector(v, h.shape, o);
    }
    default: throw Error("onnx: internal: no host value of dtype " + std::string(dtype_name(h.dtype)));
  }
}

namespace {

using Shapes = std::vector<Shape>;

// A value of `dtype` and `shape` whose element k is f(k) (double for floating dtypes, int64 else),
// rounded to the dtype (float32, int32 wrap, bool).
template <class F> HostVal make(DType dtype, Shape shape, F&& f) {
  HostVal h;
  h.dtype = dtype;
  h.shape = std::move(shape);
  size_t n = size_t(numel_of(h.shape));
  if (h.floating()) {
    h.f.resize(n);
    for (size_t k = 0; k < n; ++k) {
      double v = f(k);
      h.f[k] = dtype == DType::Float32 ? double(float(v)) : v;
    }
  } else {
    h.i.resize(n);
    for (size_t k = 0; k < n; ++k) {
      auto v = f(k);
      int64_t x = int64_t(v);
      h.i[k] = dtype == DType::Bool ? int64_t(x != 0) : dtype == DType::Int32 ? int64_t(int32_t(uint32_t(uint64_t(x)))) : x;
    }
  }
  return h;
}

std::vector<int64_t> strides_of(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (size_t d = s.size(); d-- > 1;) st[d - 1] = st[d] * s[d];
  return st;
}

// The linear index into `in` (broadcast to `out`) of each position of `out`.
std::vector<size_t> broadcast_index(const Shape& in, const Shape& out) {
  size_t r = out.size(), off = r - in.size();
  std::vector<int64_t> ist = strides_of(in), ost = strides_of(out);
  size_t n = size_t(numel_of(out));
  std::vector<size_t> idx(n);
  for (size_t k = 0; k < n; ++k) {
    int64_t rem = int64_t(k), at = 0;
    for (size_t d = 0; d < r; ++d) {
      int64_t c = rem / ost[d];
      rem -= c * ost[d];
      if (d >= off && in[d - off] != 1) at += c * ist[d - off];
    }
    idx[k] = size_t(at);
  }
  return idx;
}

// Elements of x picked by one index list per axis (the cartesian product), in row-major order.
HostVal take(const HostVal& x, const std::vector<std::vector<int64_t>>& picks) {
  Shape out;
  for (const auto& p : picks) out.push_back(int64_t(p.size()));
  std::vector<int64_t> ist = strides_of(x.shape), ost = strides_of(out);
  auto src = [&](size_t k) {
    int64_t rem = int64_t(k), at = 0;
    for (size_t d = 0; d < out.size(); ++d) {
      int64_t c = rem / ost[d];
      rem -= c * ost[d];
      at += picks[d][size_t(c)] * ist[d];
    }
    return size_t(at);
  };
  if (x.floating()) return make(x.dtype, out, [&](size_t k) { return x.f[src(k)]; });
  return make(x.dtype, out, [&](size_t k) { return x.i[src(k)]; });
}

HostVal reshaped(HostVal x, Shape s) {
  x.shape = std::move(s);
  return x;
}

bool finite_ints(const HostVal& h) {
  for (double v : h.f)
    if (!std::isfinite(v) || std::abs(v) > 9.0e18) return false;
  return true;
}

// One node being folded: its host inputs, and where its outputs go. Each group of ops below
// returns false for an op it does not evaluate, so fold() tries them in turn.
struct Folder {
  Ctx& c;
  std::vector<HostVal>& out;
  const std::string& op;
  const std::vector<const HostVal*>& hin;
  size_t nin;
  const HostVal& x;
  using D = double;

  bool known(size_t k) const { return k < hin.size() && hin[k] != nullptr; }
  bool put(HostVal h) {
    if (numel_of(h.shape) > kHostMax) return false;
    out.push_back(std::move(h));
    return true;
  }
  std::vector<int64_t> ints(size_t k) { return c.ints_input(k); }  // a host-known shape operand

  bool elementwise() {
    auto unary_f = [&](auto f) {
      if (x.floating()) return put(make(x.dtype, x.shape, [&](size_t k) { return f(x.f[k]); }));
      return false;
    };
    if (op == "Identity") return put(x);
    if (op == "Neg") return x.floating() ? put(make(x.dtype, x.shape, [&](size_t k) { return -x.f[k]; }))
                                         : put(make(x.dtype, x.shape, [&](size_t k) { return int64_t(0 - uint64_t(x.i[k])); }));
    if (op == "Abs") return x.floating() ? put(make(x.dtype, x.shape, [&](size_t k) { return std::abs(x.f[k]); }))
                                         : put(make(x.dtype, x.shape, [&](size_t k) { return x.i[k] < 0 ? int64_t(0 - uint64_t(x.i[k])) : x.i[k]; }));
    if (op == "Not") return x.dtype == DType::Bool && put(make(x.dtype, x.shape, [&](size_t k) { return int64_t(!x.i[k]); }));
    if (op == "Sqrt") return unary_f([](D v) { return std::sqrt(v); });
    if (op == "Floor") return x.floating() ? unary_f([](D v) { return std::floor(v); }) : put(x);
    if (op == "Ceil") return x.floating() ? unary_f([](D v) { return std::ceil(v); }) : put(x);
    if (op == "Cast") {
      DType to = to_dtype(int32_t(c.i("to", 0)), "Cast node " + node_label(c.node, c.index));
      if (!host_dtype(to)) return false;
      if (x.floating() && !(to == DType::Float32 || to == DType::Float64 || to == DType::Bool) && !finite_ints(x)) return false;
      if (x.floating()) {
        if (to == DType::Bool) return put(make(to, x.shape, [&](size_t k) { return int64_t(x.f[k] != 0); }));
        if (to == DType::Float32 || to == DType::Float64) return put(make(to, x.shape, [&](size_t k) { return x.f[k]; }));
        return put(make(to, x.shape, [&](size_t k) { return int64_t(std::trunc(x.f[k])); }));
      }
      if (to == DType::Float32 || to == DType::Float64) return put(make(to, x.shape, [&](size_t k) { return double(x.i[k]); }));
      return put(make(to, x.shape, [&](size_t k) { return x.i[k]; }));
    }
    static const std::vector<std::string> arith{"Add", "Sub", "Mul", "Div", "Max", "Min"},
        compare{"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or"};
    bool is_arith = std::find(arith.begin(), arith.end(), op) != arith.end();
    bool is_compare = std::find(compare.begin(), compare.end(), op) != compare.end();
    if (is_arith || is_compare || op == "Where") {
      size_t arity = op == "Where" ? 3 : 2;
      if (nin != arity) return false;  // variadic Max/Min beyond two: traced
      for (size_t k = 0; k < arity; ++k)
        if (!known(k)) return false;    // an empty (optional) name: the traced op's error
      Shape s = hin[0]->shape;
      for (size_t k = 1; k < arity; ++k) s = broadcast_shapes(s, hin[k]->shape, op.c_str());
      if (numel_of(s) > kHostMax) return false;
      std::vector<std::vector<size_t>> at;
      for (size_t k = 0; k < arity; ++k) at.push_back(broadcast_index(hin[k]->shape, s));
      const HostVal &a = *hin[arity - 2], &b = *hin[arity - 1];  // Where: the two branches
      if (a.dtype != b.dtype) return false;                     // the traced op promotes; ONNX requires equal types
      if (op == "Where") {
        const HostVal& cond = *hin[0];
        if (cond.floating()) return false;
        auto pick = [&](size_t k) { return cond.i[at[0][k]] != 0; };
        if (a.floating()) return put(make(a.dtype, s, [&](size_t k) { return pick(k) ? a.f[at[1][k]] : b.f[at[2][k]]; }));
        return put(make(a.dtype, s, [&](size_t k) { return pick(k) ? a.i[at[1][k]] : b.i[at[2][k]]; }));
      }
      const auto &ia = at[0], &ib = at[1];
      if (is_compare) {
        auto cmp = [&](auto u, auto v) -> bool {
          if (op == "Equal") return u == v;
          if (op == "Less") return u < v;
          if (op == "Greater") return u > v;
          if (op == "LessOrEqual") return u <= v;
          if (op == "GreaterOrEqual") return u >= v;
          if (op == "And") return u != 0 && v != 0;
          return u != 0 || v != 0;  // Or
        };
        if (a.floating()) return put(make(DType::Bool, s, [&](size_t k) { return int64_t(cmp(a.f[ia[k]], b.f[ib[k]])); }));
        return put(make(DType::Bool, s, [&](size_t k) { return int64_t(cmp(a.i[ia[k]], b.i[ib[k]])); }));
      }
      if (a.floating()) {
        auto f = [&](D u, D v) {
          if (op == "Add") return u + v;
          if (op == "Sub") return u - v;
          if (op == "Mul") return u * v;
          if (op == "Div") return u / v;
          if (op == "Max") return std::isnan(u) || std::isnan(v) ? std::numeric_limits<D>::quiet_NaN() : std::max(u, v);
          return std::isnan(u) || std::isnan(v) ? std::numeric_limits<D>::quiet_NaN() : std::min(u, v);
        };
        if (a.dtype == DType::Float32 && (op == "Max" || op == "Min")) return false;  // NaN rules: traced
        return put(make(a.dtype, s, [&](size_t k) { return f(a.f[ia[k]], b.f[ib[k]]); }));
      }
      if (a.dtype == DType::Bool) return false;
      for (size_t k = 0; op == "Div" && k < ib.size(); ++k)
        if (b.i[ib[k]] == 0) return false;  // the traced op decides what division by zero gives
      auto f = [&](int64_t u, int64_t v) -> int64_t {
        // Wrapping arithmetic as the device's two's-complement integers do.
        if (op == "Add") return int64_t(uint64_t(u) + uint64_t(v));
        if (op == "Sub") return int64_t(uint64_t(u) - uint64_t(v));
        if (op == "Mul") return int64_t(uint64_t(u) * uint64_t(v));
        if (op == "Div") return u == std::numeric_limits<int64_t>::min() && v == -1 ? u : u / v;  // truncates toward zero
        if (op == "Max") return std::max(u, v);
        return std::min(u, v);
      };
      if (op == "Div" && a.dtype == DType::Int64) {
        // The traced Div divides in float64: identical to integer division below 2^53.
        for (size_t k = 0; k < ia.size(); ++k)
          if (std::abs(double(a.i[ia[k]])) > 9.0e15 || std::abs(double(b.i[ib[k]])) > 9.0e15) return false;
      }
      return put(make(a.dtype, s, [&](size_t k) { return f(a.i[ia[k]], b.i[ib[k]]); }));
    }

    return false;
  }

  bool views() {
    if (op == "Unsqueeze") {
      std::vector<int64_t> axes = c.opset >= 13 ? ints(1) : c.ints("axes");
      int64_t rank = int64_t(x.shape.size() + axes.size());
      axes = axes_of(c, axes, rank);
      std::sort(axes.begin(), axes.end());
      Shape s = x.shape;
      for (int64_t a : axes) {
        if (a > int64_t(s.size())) return false;
        s.insert(s.begin() + a, 1);
      }
      return put(reshaped(x, s));
    }
    if (op == "Squeeze") {
      std::vector<int64_t> axes = c.opset >= 13 ? (nin > 1 && known(1) ? ints(1) : std::vector<int64_t>{}) : c.ints("axes");
      Shape s;
      if (axes.empty()) {
        for (int64_t d : x.shape)
          if (d != 1) s.push_back(d);
      } else {
        axes = axes_of(c, axes, int64_t(x.shape.size()));
        for (size_t d = 0; d < x.shape.size(); ++d) {
          bool drop = std::find(axes.begin(), axes.end(), int64_t(d)) != axes.end();
          if (drop && x.shape[d] != 1) return false;  // the traced op's error
          if (!drop) s.push_back(x.shape[d]);
        }
      }
      return put(reshaped(x, s));
    }
    if (op == "Reshape") {
      if (c.opset < 5) return false;
      std::vector<int64_t> s = ints(1);
      bool allowzero = c.i("allowzero", 0) != 0;
      int64_t known_prod = 1, infer = -1;
      for (size_t k = 0; k < s.size(); ++k) {
        if (s[k] == 0 && !allowzero) {
          if (k >= x.shape.size()) return false;
          s[k] = x.shape[k];
        }
        if (s[k] == -1) {
          if (infer >= 0) return false;
          infer = int64_t(k);
        } else if (s[k] < 0) return false;
        else known_prod *= s[k];
      }
      int64_t n = int64_t(x.numel());
      if (infer >= 0) {
        if (known_prod == 0 || n % known_prod) return false;
        s[size_t(infer)] = n / known_prod;
      } else if (known_prod != n) return false;
      return put(reshaped(x, s));
    }
    if (op == "Concat") {
      int64_t rank = int64_t(x.shape.size());
      int64_t axis = axis_of(c, c.i("axis", 0), rank);
      Shape s = x.shape;
      s[size_t(axis)] = 0;
      for (size_t k = 0; k < nin; ++k) {
        const HostVal& v = *hin[k];
        if (v.dtype != x.dtype || v.shape.size() != x.shape.size()) return false;
        for (size_t d = 0; d < s.size(); ++d)
          if (int64_t(d) != axis && v.shape[d] != x.shape[d]) return false;
        s[size_t(axis)] += v.shape[size_t(axis)];
      }
      if (numel_of(s) > kHostMax) return false;
      int64_t outer = numel_of(Shape(s.begin(), s.begin() + axis)), inner = numel_of(Shape(s.begin() + axis + 1, s.end()));
      HostVal r;
      r.dtype = x.dtype;
      r.shape = s;
      for (int64_t o = 0; o < outer; ++o)
        for (size_t k = 0; k < nin; ++k) {
          const HostVal& v = *hin[k];
          int64_t len = v.shape[size_t(axis)] * inner;
          if (v.floating()) r.f.insert(r.f.end(), v.f.begin() + o * len, v.f.begin() + (o + 1) * len);
          else r.i.insert(r.i.end(), v.i.begin() + o * len, v.i.begin() + (o + 1) * len);
        }
      return put(std::move(r));
    }
    return false;
  }

  bool indexing() {
    if (op == "Gather") {
      int64_t rank = int64_t(x.shape.size());
      if (rank == 0) return false;
      int64_t axis = axis_of(c, c.i("axis", 0), rank), len = x.shape[size_t(axis)];
      if (!known(1)) return false;  // no indices: the traced op's error
      const HostVal& idx = *hin[1];
      if (idx.floating()) return false;
      std::vector<int64_t> picks;
      for (int64_t i : idx.i) {
        if (i < -len || i >= len) return false;  // the traced op's error
        picks.push_back(i < 0 ? i + len : i);
      }
      std::vector<std::vector<int64_t>> all;
      for (int64_t d = 0; d < rank; ++d) {
        std::vector<int64_t> p;
        if (d == axis) p = picks;
        else
          for (int64_t j = 0; j < x.shape[size_t(d)]; ++j) p.push_back(j);
        all.push_back(std::move(p));
      }
      Shape s(x.shape.begin(), x.shape.begin() + axis);
      s.insert(s.end(), idx.shape.begin(), idx.shape.end());
      s.insert(s.end(), x.shape.begin() + axis + 1, x.shape.end());
      if (numel_of(s) > kHostMax) return false;
      return put(reshaped(take(x, all), s));
    }
    if (op == "Slice") {
      if (c.opset < 10) return false;
      std::vector<int64_t> starts = ints(1), ends = ints(2), axes, steps;
      if (nin > 3 && known(3)) axes = ints(3);
      if (nin > 4 && known(4)) steps = ints(4);
      if (axes.empty())
        for (size_t k = 0; k < starts.size(); ++k) axes.push_back(int64_t(k));
      if (steps.empty()) steps.assign(starts.size(), 1);
      if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size()) return false;
      int64_t rank = int64_t(x.shape.size());
      std::vector<std::vector<int64_t>> all(static_cast<size_t>(rank));
      for (int64_t d = 0; d < rank; ++d)
        for (int64_t j = 0; j < x.shape[size_t(d)]; ++j) all[size_t(d)].push_back(j);
      std::vector<uint8_t> seen(static_cast<size_t>(rank), 0);
      for (size_t k = 0; k < starts.size(); ++k) {
        int64_t d = axis_of(c, axes[k], rank), len = x.shape[size_t(d)], st = steps[k];
        if (seen[size_t(d)]++) return false;  // an axis named twice: the traced op gives the error
        if (st == 0) return false;
        auto clampi = [](int64_t v, int64_t lo, int64_t hi) { return std::min(std::max(v, lo), hi); };
        int64_t s = starts[k], e = ends[k];
        if (s < 0) s = s < -len ? -1 - len : s + len;
        if (e < 0) e = e < -len ? -1 - len : e + len;
        std::vector<int64_t> p;
        const auto& cur = all[size_t(d)];
        if (st > 0) {
          s = clampi(s, 0, len);
          e = clampi(e, 0, len);
          for (int64_t j = s; j < e; j += st) p.push_back(cur[size_t(j)]);
        } else {
          s = clampi(s, 0, len - 1);
          e = clampi(e, -1, len - 1);
          for (int64_t j = s; j > e && len > 0; j += st) p.push_back(cur[size_t(j)]);
        }
        all[size_t(d)] = std::move(p);
      }
      return put(take(x, all));
    }
    return false;
  }

  bool generators() {
    if (op == "Range") {
      std::vector<double> v0 = c.doubles_input(0), v1 = c.doubles_input(1), v2 = c.doubles_input(2);
      if (v0.size() != 1 || v1.size() != 1 || v2.size() != 1) return false;
      double start = v0[0], limit = v1[0], delta = v2[0];
      if (delta == 0 || !std::isfinite(start) || !std::isfinite(limit) || !std::isfinite(delta)) return false;
      const double count = std::ceil((limit - start) / delta);  // may be far beyond int64: compared as a double
      if (!(count <= double(kHostMax))) return false;
      int64_t n = std::max<int64_t>(0, int64_t(count));
      return put(make(x.dtype, Shape{n}, [&](size_t k) { return start + double(k) * delta; }));
    }
    if (op == "ConstantOfShape") {
      Shape s = ints(0);
      for (int64_t d : s)
        if (d < 0) return false;
      if (numel_of(s) > kHostMax) return false;
      const ::onnx::AttributeProto* a = c.attr("value");
      if (!a) return put(make(DType::Float32, s, [](size_t) { return 0.0; }));
      Tensor v = to_tensor(a->t(), "", Device("cpu"), "ConstantOfShape node " + node_label(c.node, c.index));
      if (v.numel() != 1 || !host_dtype(v.dtype())) return false;
      HostVal one = host_of(v);
      if (one.floating()) return put(make(one.dtype, s, [&](size_t) { return one.f[0]; }));
      return put(make(one.dtype, s, [&](size_t) { return one.i[0]; }));
    }
    if (op == "Expand") {
      std::vector<int64_t> want = ints(1);
      Shape s = broadcast_shapes(x.shape, want, "Expand");
      if (numel_of(s) > kHostMax) return false;
      std::vector<size_t> at = broadcast_index(x.shape, s);
      if (x.floating()) return put(make(x.dtype, s, [&](size_t k) { return x.f[at[k]]; }));
      return put(make(x.dtype, s, [&](size_t k) { return x.i[at[k]]; }));
    }
    return false;
  }
};

}  // namespace

// The node's outputs on the host, or false when it is not foldable here (an op this file does
// not evaluate, an input that is not host-known, an unsupported dtype, a result above kHostMax
// elements, or a case the traced op handles with its own error: those then trace as before).
bool fold(Ctx& c, std::vector<HostVal>& out) {
  size_t nin = size_t(c.node.input_size());
  if (nin == 0) return false;
  for (size_t k = 0; k < nin; ++k) {
    bool present = !c.node.input(int(k)).empty();
    if (present && (k >= c.hin.size() || !c.hin[k] || !host_dtype(c.hin[k]->dtype))) return false;
  }
  if (!c.hin[0]) return false;
  Folder f{c, out, c.node.op_type(), c.hin, nin, *c.hin[0]};
  return f.elementwise() || f.views() || f.indexing() || f.generators();
}

}  // namespace tessera::onnx::detail
