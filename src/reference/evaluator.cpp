// The float64 reference evaluator. Every primitive is a plain loop over multi-indices, written for
// clarity rather than speed; nothing here is shared with src/kernel_ir or src/backends.
#include "reference/evaluator.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/half.h"
#include "core/philox.h"
#include "core/fail.h"

namespace tessera::reference {
namespace {

using ir::Node;
using ir::Op;

std::string desc(const Shape& s, DType t) { return std::string(dtype_name(t)) + shape_str(s); }

int64_t to_int64(double x) {
  if (std::isnan(x)) return 0;
  double t = std::trunc(x);
  if (t >= 9223372036854775808.0) return std::numeric_limits<int64_t>::max();
  if (t < -9223372036854775808.0) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(t);
}

// Rounds a double to what a value of dtype `t` can hold, like a C++ conversion (integers
// truncate toward zero; narrowing integers wrap; float16/bfloat16 go through float32).
double round_to(double x, DType t) {
  switch (t) {
    case DType::Bool: return x != 0 ? 1.0 : 0.0;  // NaN != 0
    case DType::Int32: return double(static_cast<int32_t>(static_cast<uint32_t>(to_int64(x))));
    case DType::Int64: return double(to_int64(x));
    case DType::Float16: return double(half::f16_to_float(half::float_to_f16(float(x))));
    case DType::BFloat16: return double(half::bf16_to_float(half::float_to_bf16(float(x))));
    case DType::Float32: return double(float(x));
    case DType::Float64: return x;
  }
  return x;
}

// NaN-propagating max/min (PyTorch's maximum/minimum).
double nan_max(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return a > b ? a : b;
}
double nan_min(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return a < b ? a : b;
}

double unary(Op op, double x) {
  switch (op) {
    case Op::Neg: return -x;
    case Op::Exp: return std::exp(x);
    case Op::Log: return std::log(x);
    case Op::Tanh: return std::tanh(x);
    case Op::Abs: return std::fabs(x);
    case Op::Sign: return x > 0 ? 1.0 : x < 0 ? -1.0 : x == 0 ? 0.0 : x;  // NaN stays NaN
    case Op::Sqrt: return std::sqrt(x);
    case Op::Sin: return std::sin(x);
    case Op::Cos: return std::cos(x);
    case Op::Erf: return std::erf(x);
    case Op::Floor: return std::floor(x);
    case Op::Ceil: return std::ceil(x);
    case Op::Round: return std::nearbyint(x);  // half to even in the default rounding mode
    default: break;
  }
  fail("reference", std::string("not a unary op: ") + ir::op_name(op));
}

double binary(Op op, double a, double b) {
  switch (op) {
    case Op::Add: return a + b;
    case Op::Sub: return a - b;
    case Op::Mul: return a * b;
    case Op::Div: return a / b;
    case Op::Maximum: return nan_max(a, b);
    case Op::Minimum: return nan_min(a, b);
    case Op::Pow: return std::pow(a, b);
    case Op::Eq: return a == b ? 1.0 : 0.0;
    case Op::Ne: return a != b ? 1.0 : 0.0;
    case Op::Lt: return a < b ? 1.0 : 0.0;
    case Op::Le: return a <= b ? 1.0 : 0.0;
    case Op::Gt: return a > b ? 1.0 : 0.0;
    case Op::Ge: return a >= b ? 1.0 : 0.0;
    default: break;
  }
  fail("reference", std::string("not a binary op: ") + ir::op_name(op));
}

// Reads an integer index value and checks it against [0, extent).
int64_t checked_index(const Node& n, double v, int64_t extent, int64_t axis, const Value& target) {
  int64_t k = to_int64(v);
  if (k < 0 || k >= extent)
    fail(ir::op_name(n.op), "index " + std::to_string(k) + " out of range [0, " + std::to_string(extent) + ") along dimension " +
             std::to_string(axis) + " of " + desc(target.shape, target.dtype),
         *n.scope);
  return k;
}

// Leaves, constants, random numbers, casts and elementwise ops.
void eval_values(const Node& n, const std::vector<const Value*>& in, uint64_t seed, uint64_t offset, Value& out) {
  const int64_t total = numel(n.shape);
  const auto& ints = n.attrs.ints;
  Index idx;
  switch (n.op) {
    case Op::Leaf:
      fail("reference", "leaves are read by evaluate()");

    case Op::Full: {
      double v = round_to(n.attrs.f, n.dtype);
      std::fill(out.data.begin(), out.data.end(), v);
      break;
    }

    case Op::Iota: {
      for (int64_t i = 0; i < total; ++i) {
        unravel(i, n.shape, idx);
        out.data[i] = round_to(double(idx[ints.at(0)]), n.dtype);
      }
      break;
    }

    case Op::Rng: {
      uint32_t draw = uint32_t(ints.at(0));
      int dist = int(ints.at(1));
      uint64_t first = ints.size() > 2 ? uint64_t(ints[2]) : 0;  // a batch slice's first element
      for (int64_t i = 0; i < total; ++i)
        out.data[i] = round_to(rng::sample(seed, offset, draw, first + uint64_t(i), dist), n.dtype);
      break;
    }

    case Op::Cast: {
      const Value& x = *in[0];
      for (int64_t i = 0; i < total; ++i) out.data[i] = round_to(x.data[i], n.dtype);
      break;
    }

    case Op::Neg: case Op::Exp: case Op::Log: case Op::Tanh: case Op::Abs: case Op::Sign:
    case Op::Sqrt: case Op::Sin: case Op::Cos: case Op::Erf: case Op::Floor: case Op::Ceil: case Op::Round: {
      const Value& x = *in[0];
      for (int64_t i = 0; i < total; ++i) out.data[i] = unary(n.op, x.data[i]);
      break;
    }

    case Op::Add: case Op::Sub: case Op::Mul: case Op::Div: case Op::Maximum: case Op::Minimum: case Op::Pow:
    case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge: {
      const Value &a = *in[0], &b = *in[1];
      for (int64_t i = 0; i < total; ++i) out.data[i] = binary(n.op, a.data[i], b.data[i]);
      break;
    }

    case Op::Where: {
      const Value &c = *in[0], &a = *in[1], &b = *in[2];
      for (int64_t i = 0; i < total; ++i) out.data[i] = c.data[i] != 0 ? a.data[i] : b.data[i];
      break;
    }

    default:
      fail("reference", std::string("not handled here: ") + ir::op_name(n.op));
  }
}

// Sums and maxima over the reduced axes (kept as extent 1).
void eval_reduction(const Node& n, const std::vector<const Value*>& in, Value& out) {
  const auto& ints = n.attrs.ints;
  Index idx;
  switch (n.op) {
    case Op::ReduceSum: case Op::ReduceMax: {
      const Value& x = *in[0];
      bool is_max = n.op == Op::ReduceMax;
      if (is_max) std::fill(out.data.begin(), out.data.end(), -std::numeric_limits<double>::infinity());
      std::vector<bool> reduced(x.shape.size(), false);
      for (int64_t ax : ints) reduced.at(size_t(ax)) = true;
      for (int64_t i = 0; i < numel(x.shape); ++i) {
        unravel(i, x.shape, idx);
        for (size_t d = 0; d < idx.size(); ++d)
          if (reduced[d]) idx[d] = 0;
        double& o = out.data[ravel(idx, n.shape)];
        double v = x.data[i];
        if (!is_max) o += v;
        else if (std::isnan(v) || std::isnan(o)) o = std::numeric_limits<double>::quiet_NaN();
        else o = std::max(o, v);
      }
      break;
    }

    default:
      fail("reference", std::string("not handled here: ") + ir::op_name(n.op));
  }
}

// Movement: every output position reads one input position (or the pad value).
void eval_movement(const Node& n, const std::vector<const Value*>& in, Value& out) {
  const int64_t total = numel(n.shape);
  const auto& ints = n.attrs.ints;
  Index idx, src;
  switch (n.op) {
    case Op::Reshape:
      out.data = in[0]->data;
      break;

    case Op::Permute: {
      const Value& x = *in[0];
      src.resize(x.shape.size());
      for (int64_t i = 0; i < total; ++i) {
        unravel(i, n.shape, idx);
        for (size_t d = 0; d < idx.size(); ++d) src[size_t(ints[d])] = idx[d];
        out.data[i] = x.data[ravel(src, x.shape)];
      }
      break;
    }

    case Op::Expand: {
      const Value& x = *in[0];
      for (int64_t i = 0; i < total; ++i) {
        unravel(i, n.shape, idx);
        for (size_t d = 0; d < idx.size(); ++d)
          if (x.shape[d] == 1) idx[d] = 0;
        out.data[i] = x.data[ravel(idx, x.shape)];
      }
      break;
    }

    case Op::Slice: {
      const Value& x = *in[0];
      for (int64_t i = 0; i < total; ++i) {
        unravel(i, n.shape, idx);
        for (size_t d = 0; d < idx.size(); ++d) idx[d] = ints[3 * d] + idx[d] * ints[3 * d + 2];
        out.data[i] = x.data[ravel(idx, x.shape)];
      }
      break;
    }

    case Op::Pad: {
      const Value& x = *in[0];
      for (int64_t i = 0; i < total; ++i) {
        unravel(i, n.shape, idx);
        bool inside = true;
        for (size_t d = 0; inside && d < idx.size(); ++d) {
          int64_t t = idx[d] - ints[3 * d], gap = ints[3 * d + 2] + 1;
          if (t < 0 || t % gap != 0 || t / gap >= x.shape[d]) inside = false;
          else idx[d] = t / gap;
        }
        out.data[i] = inside ? x.data[ravel(idx, x.shape)] : round_to(n.attrs.f, n.dtype);
      }
      break;
    }

    case Op::Concat: {
      size_t axis = size_t(ints.at(0));
      int64_t start = 0;
      for (const Value* x : in) {
        for (int64_t i = 0; i < numel(x->shape); ++i) {
          unravel(i, x->shape, idx);
          idx[axis] += start;
          out.data[ravel(idx, n.shape)] = x->data[i];
        }
        start += x->shape[axis];
      }
      break;
    }

    case Op::Reverse: {
      const Value& x = *in[0];
      for (int64_t i = 0; i < total; ++i) {
        unravel(i, n.shape, idx);
        for (int64_t ax : ints) idx[size_t(ax)] = n.shape[size_t(ax)] - 1 - idx[size_t(ax)];
        out.data[i] = x.data[ravel(idx, x.shape)];
      }
      break;
    }

    default:
      fail("reference", std::string("not handled here: ") + ir::op_name(n.op));
  }
}

// Indexing with runtime indices, checked against the indexed extent.
void eval_indexing(const Node& n, const std::vector<const Value*>& in, Value& out) {
  const int64_t total = numel(n.shape);
  const auto& ints = n.attrs.ints;
  Index idx;
  switch (n.op) {
    case Op::Gather: {
      const Value &x = *in[0], &index = *in[1];
      int64_t axis = ints.at(0);
      for (int64_t i = 0; i < total; ++i) {
        unravel(i, n.shape, idx);
        idx[size_t(axis)] = checked_index(n, index.data[i], x.shape[size_t(axis)], axis, x);
        out.data[i] = x.data[ravel(idx, x.shape)];
      }
      break;
    }

    case Op::ScatterAdd: {
      const Value &base = *in[0], &index = *in[1], &upd = *in[2];
      int64_t axis = ints.at(0);
      out.data = base.data;
      for (int64_t i = 0; i < numel(index.shape); ++i) {
        unravel(i, index.shape, idx);
        idx[size_t(axis)] = checked_index(n, index.data[i], base.shape[size_t(axis)], axis, base);
        out.data[ravel(idx, base.shape)] += upd.data[i];
      }
      break;
    }

    case Op::DynamicUpdateSlice: {
      const Value &base = *in[0], &upd = *in[1], &offs = *in[2];
      out.data = base.data;
      Index start(base.shape.size());
      for (size_t d = 0; d < start.size(); ++d)
        start[d] = std::clamp<int64_t>(to_int64(offs.data[d]), 0, base.shape[d] - upd.shape[d]);
      for (int64_t i = 0; i < numel(upd.shape); ++i) {
        unravel(i, upd.shape, idx);
        for (size_t d = 0; d < idx.size(); ++d) idx[d] += start[d];
        out.data[ravel(idx, base.shape)] = upd.data[i];
      }
      break;
    }

    default:
      fail("reference", std::string("not handled here: ") + ir::op_name(n.op));
  }
}

// Matrix products and convolutions, accumulated in double.
void eval_product(const Node& n, const std::vector<const Value*>& in, Value& out) {
  const int64_t total = numel(n.shape);
  const auto& ints = n.attrs.ints;
  Index idx;
  switch (n.op) {
    case Op::Matmul: {
      const Value &a = *in[0], &b = *in[1];
      size_t r = n.shape.size();
      int64_t M = a.shape[r - 2], K = a.shape[r - 1], N = b.shape[r - 1];
      int64_t batch = 1;
      for (size_t d = 0; d + 2 < r; ++d) batch *= n.shape[d];
      for (int64_t bt = 0; bt < batch; ++bt)
        for (int64_t m = 0; m < M; ++m)
          for (int64_t j = 0; j < N; ++j) {
            double acc = 0;
            for (int64_t k = 0; k < K; ++k) acc += a.data[(bt * M + m) * K + k] * b.data[(bt * K + k) * N + j];
            out.data[(bt * M + m) * N + j] = acc;
          }
      break;
    }

    case Op::Conv: {
      // out[b, o, p] = sum over f < F/groups and kernel positions k of
      // lhs'[b, g*F/groups + f, p*stride + k*rhs_dil] * rhs[o, f, k], where lhs' is lhs with
      // lhs_dil - 1 zeros between elements and pad_lo/pad_hi zeros around (negative: cropped).
      const Value &x = *in[0], &w = *in[1];
      size_t S = n.shape.size() - 2;
      int64_t groups = ints.at(0), Fg = w.shape[1], Og = w.shape[0] / groups;
      Shape kshape(w.shape.begin() + 2, w.shape.end());
      Index k, xi(x.shape.size()), wi(w.shape.size());
      for (int64_t i = 0; i < total; ++i) {
        unravel(i, n.shape, idx);
        int64_t b = idx[0], o = idx[1], g = o / Og;
        double acc = 0;
        for (int64_t f = 0; f < Fg; ++f)
          for (int64_t kl = 0; kl < numel(kshape); ++kl) {
            unravel(kl, kshape, k);
            bool inside = true;
            for (size_t d = 0; d < S && inside; ++d) {
              int64_t stride = ints[1 + 5 * d], lo = ints[2 + 5 * d], ld = ints[4 + 5 * d], rd = ints[5 + 5 * d];
              int64_t t = idx[d + 2] * stride + k[d] * rd - lo;  // position in the dilated input
              if (t < 0 || t % ld != 0 || t / ld >= x.shape[d + 2]) inside = false;
              else xi[d + 2] = t / ld;
              wi[d + 2] = k[d];
            }
            if (!inside) continue;
            xi[0] = b;
            xi[1] = g * Fg + f;
            wi[0] = o;
            wi[1] = f;
            acc += x.data[ravel(xi, x.shape)] * w.data[ravel(wi, w.shape)];
          }
        out.data[i] = acc;
      }
      break;
    }

    default:
      fail("reference", std::string("not handled here: ") + ir::op_name(n.op));
  }
}

Value eval_node(const Node& n, const std::vector<const Value*>& in, uint64_t seed, uint64_t offset) {
  Value out{n.shape, n.dtype, {}};
  out.data.assign(size_t(numel(n.shape)), 0.0);
  switch (n.op) {
    case Op::Leaf: case Op::Full: case Op::Iota: case Op::Rng: case Op::Cast: case Op::Neg: case Op::Exp: case Op::Log: case Op::Tanh: case Op::Abs: case Op::Sign: case Op::Sqrt: case Op::Sin: case Op::Cos: case Op::Erf: case Op::Floor: case Op::Ceil: case Op::Round: case Op::Add: case Op::Sub: case Op::Mul: case Op::Div: case Op::Maximum: case Op::Minimum: case Op::Pow: case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge: case Op::Where:
      eval_values(n, in, seed, offset, out);
      break;
    case Op::ReduceSum: case Op::ReduceMax:
      eval_reduction(n, in, out);
      break;
    case Op::Reshape: case Op::Permute: case Op::Expand: case Op::Slice: case Op::Pad: case Op::Concat: case Op::Reverse:
      eval_movement(n, in, out);
      break;
    case Op::Gather: case Op::ScatterAdd: case Op::DynamicUpdateSlice:
      eval_indexing(n, in, out);
      break;
    case Op::Matmul: case Op::Conv:
      eval_product(n, in, out);
      break;
    case Op::AllReduce: case Op::AllGather: case Op::ReduceScatter: case Op::AllToAll: case Op::Broadcast: case Op::Reduce:
    case Op::CollectivePermute:
      fail("reference", "collectives are evaluated by evaluate_ranks()");
    case Op::Count_:
      fail("reference", "unknown op");
  }
  return out;
}

}  // namespace

std::vector<double> read_host(const void* data, DType dtype, int64_t n) {
  std::vector<double> v(size_t(std::max<int64_t>(n, 0)));
  auto get = [&](auto tag, int64_t i) {
    using T = decltype(tag);
    T x;
    std::memcpy(&x, static_cast<const char*>(data) + i * int64_t(sizeof(T)), sizeof(T));
    return x;
  };
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::Bool: v[i] = get(uint8_t{}, i) != 0 ? 1.0 : 0.0; break;
      case DType::Int32: v[i] = double(get(int32_t{}, i)); break;
      case DType::Int64: v[i] = double(get(int64_t{}, i)); break;
      case DType::Float16: v[i] = double(half::f16_to_float(get(uint16_t{}, i))); break;
      case DType::BFloat16: v[i] = double(half::bf16_to_float(get(uint16_t{}, i))); break;
      case DType::Float32: v[i] = double(get(float{}, i)); break;
      case DType::Float64: v[i] = get(double{}, i); break;
    }
  }
  return v;
}

namespace {

// One rank's walk through its graph (evaluate_ranks).
struct RankRun {
  const ir::Graph* g;
  const std::vector<Value>* params;
  std::vector<Value> vals;
  size_t at = 0, next_param = 0;
};

std::string collective_desc(const Node& n) {
  const Node& x = *n.inputs[0];
  std::string a;
  for (int64_t v : n.attrs.ints) a += (a.empty() ? "" : ",") + std::to_string(v);
  return std::string(ir::op_name(n.op)) + "{" + a + "} of " + desc(x.shape, x.dtype);
}

// Evaluates rank `r`'s nodes up to (not including) its next collective or the end.
void advance(RankRun& rr, uint64_t seed, uint64_t offset) {
  const ir::Graph& g = *rr.g;
  std::vector<const Value*> in;
  for (; rr.at < g.nodes.size(); ++rr.at) {
    const Node& n = *g.nodes[rr.at];
    if (ir::is_collective(n.op)) return;
    if (n.op == Op::Leaf) {
      size_t p = rr.next_param++;
      if (!rr.params->empty()) {
        const Value& v = (*rr.params)[p];
        if (v.shape != n.shape || int64_t(v.data.size()) != n.numel())
          fail("reference", "parameter " + std::to_string(p) + " is " + desc(v.shape, v.dtype) + ", graph expects " +
                                desc(n.shape, n.dtype), *n.scope);
        rr.vals[rr.at] = Value{n.shape, n.dtype, v.data};
        continue;
      }
      if (!n.buffer || (n.numel() > 0 && !n.buffer->data))
        fail("reference", "leaf " + desc(n.shape, n.dtype) + " on device " + n.device.str() + " has no host memory", *n.scope);
      if (n.buffer->nbytes < size_t(n.numel()) * itemsize(n.dtype))
        fail("reference", "leaf buffer too small for " + desc(n.shape, n.dtype), *n.scope);
      rr.vals[rr.at] = Value{n.shape, n.dtype, read_host(n.buffer->data, n.dtype, n.numel())};
      continue;
    }
    in.clear();
    for (const ir::NodePtr& x : n.inputs) in.push_back(&rr.vals[size_t(g.index.at(x.get()))]);
    rr.vals[rr.at] = eval_node(n, in, seed, offset);
  }
}

}  // namespace

std::vector<std::vector<Value>> evaluate_ranks(const std::vector<const ir::Graph*>& graphs, uint64_t seed, uint64_t offset,
                                               const std::vector<std::vector<Value>>& params) {
  const size_t N = graphs.size();
  if (N == 0) fail("reference", "no ranks to evaluate");
  if (!params.empty() && params.size() != N)
    fail("reference", "parameters for " + std::to_string(params.size()) + " ranks, evaluating " + std::to_string(N));
  static const std::vector<Value> none;
  std::vector<RankRun> runs(N);
  for (size_t r = 0; r < N; ++r) {
    const ir::Graph& g = *graphs[r];
    const std::vector<Value>& p = params.empty() ? none : params[r];
    if (!p.empty() && p.size() != g.params.size())
      fail("reference", "rank " + std::to_string(r) + ": expected " + std::to_string(g.params.size()) + " parameters, got " +
                            std::to_string(p.size()));
    runs[r] = RankRun{&g, &p, std::vector<Value>(g.nodes.size())};
  }
  std::vector<const Value*> x(N);
  for (;;) {
    for (RankRun& rr : runs) advance(rr, seed, offset);
    // Every rank is at its end or at a collective: all at their ends, or all at the same one.
    size_t done = 0;
    for (RankRun& rr : runs) done += rr.at == rr.g->nodes.size();
    if (done == N) break;
    const Node* first = nullptr;
    bool same = done == 0;
    std::string sides;
    for (size_t r = 0; r < N; ++r) {
      const RankRun& rr = runs[r];
      const Node* n = rr.at < rr.g->nodes.size() ? rr.g->nodes[rr.at].get() : nullptr;
      sides += "; rank " + std::to_string(r) + ": " + (n ? collective_desc(*n) : std::string("no further collective"));
      if (!n) continue;
      if (!first) first = n;
      same = same && n->op == first->op && n->attrs.ints == first->attrs.ints && n->inputs[0]->shape == first->inputs[0]->shape &&
             n->inputs[0]->dtype == first->inputs[0]->dtype;
    }
    if (!same)
      fail(ir::op_name(first->op), "the ranks disagree about this collective (every rank fails)" + sides, *first->scope);
    for (size_t r = 0; r < N; ++r) {
      const RankRun& rr = runs[r];
      x[r] = &rr.vals[size_t(rr.g->index.at(rr.g->nodes[rr.at]->inputs[0].get()))];
    }
    std::vector<Value> outs = evaluate_collective(*runs[0].g->nodes[runs[0].at], x);
    for (size_t r = 0; r < N; ++r) runs[r].vals[runs[r].at++] = std::move(outs[r]);
  }
  std::vector<std::vector<Value>> result(N);
  for (size_t r = 0; r < N; ++r)
    for (int o : runs[r].g->outputs) result[r].push_back(runs[r].vals[size_t(o)]);
  return result;
}

std::vector<Value> evaluate(const ir::Graph& g, uint64_t seed, uint64_t offset, const std::vector<Value>& params) {
  if (!params.empty() && params.size() != g.params.size())
    fail("reference", "expected " + std::to_string(g.params.size()) + " parameters, got " + std::to_string(params.size()));
  std::vector<std::vector<Value>> p;
  if (!params.empty()) p.push_back(params);
  return evaluate_ranks({&g}, seed, offset, p).front();
}

}  // namespace tessera::reference
