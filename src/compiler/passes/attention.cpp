#include "compiler/passes/attention.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "compiler/passes/fuse.h"
#include "ir/node.h"
#include "ir/primitives.h"

namespace tessera::compiler {
namespace {

using ir::Node;
using ir::Op;

// An integer value affine in the element's index: c + sum coef[d] * index[d] (coefficients of
// extent-1 dimensions are 0).
struct Affine {
  std::vector<int64_t> coef;
  int64_t c = 0;
};

class Matcher {
 public:
  Matcher(const ir::Graph& g, bool bf16) : g_(g), bf16_(bf16), consumers_(g.nodes.size()), output_(g.nodes.size(), 0) {
    for (size_t i = 0; i < g.nodes.size(); ++i)
      for (const ir::NodePtr& x : g.nodes[i]->inputs) {
        auto& c = consumers_[size_t(id(x.get()))];
        if (c.empty() || c.back() != int(i)) c.push_back(int(i));
      }
    for (int o : g.outputs) output_[size_t(o)] = 1;
  }

  std::optional<AttentionMatch> match(int root) const {
    const Node& y = *g_.nodes[size_t(root)];
    if (y.op != Op::Matmul || (y.dtype != DType::Float32 && y.dtype != DType::Float64)) return std::nullopt;
    // Under bfloat16 autocast the product reads P rounded to bfloat16 (and V as bfloat16); its
    // result, like the scores, is float32.
    const Node* pin = y.inputs[0].get();
    std::vector<int> core;
    const bool half = pin->dtype == DType::BFloat16;
    if (half) {
      if (!bf16_ || y.dtype != DType::Float32 || !rounds(*pin)) return std::nullopt;
      core.push_back(id(pin));
    }
    const Node* p = half ? pin->inputs[0].get() : pin;
    const DType operand = half ? DType::BFloat16 : y.dtype;  // the products' operands
    if (p->dtype != y.dtype || y.inputs[1]->dtype != operand) return std::nullopt;
    // P = e / expand(reduce_sum(e, last))
    if (p->op != Op::Div) return std::nullopt;
    const Node* e = p->inputs[0].get();
    if (!reduced_back(p->inputs[1].get(), Op::ReduceSum, e, core)) return std::nullopt;
    // e = exp(x - expand(reduce_max(x, last)))
    if (e->op != Op::Exp || e->inputs[0]->op != Op::Sub) return std::nullopt;
    const Node* sub = e->inputs[0].get();
    const Node* x = sub->inputs[0].get();
    if (!reduced_back(sub->inputs[1].get(), Op::ReduceMax, x, core)) return std::nullopt;
    core.insert(core.end(), {id(p), id(e), id(sub)});
    AttentionMatch m;
    m.root = root;
    m.bf16 = half;
    // x = where(mask, -inf, s) or s
    const Node* s = x;
    const Node* mask = nullptr;
    if (x->op == Op::Where) {
      std::optional<double> fill = constant(x->inputs[1].get());
      if (!fill || !(std::isinf(*fill) && *fill < 0)) return std::nullopt;
      mask = x->inputs[0].get();
      s = x->inputs[2].get();
      core.push_back(id(x));
    }
    // s = scores * c, c * scores, scores / c or the scores themselves
    const Node* scores = s;
    if (s->op == Op::Mul || s->op == Op::Div) {
      std::optional<double> c;
      if ((c = constant(s->inputs[1].get())))
        scores = s->inputs[0].get();
      else if (s->op == Op::Mul && (c = constant(s->inputs[0].get())))
        scores = s->inputs[1].get();
      else
        return std::nullopt;
      if (!(std::isfinite(*c) && *c > 0)) return std::nullopt;  // a scale <= 0 would change which entries the mask's -inf wins
      m.scale = s->op == Op::Mul ? *c : 1.0 / *c;
      core.push_back(id(s));
    }
    if (scores->op != Op::Matmul || scores->dtype != y.dtype || scores->inputs[0]->dtype != operand || scores->inputs[1]->dtype != operand)
      return std::nullopt;
    core.push_back(id(scores));
    const size_t r = scores->shape.size();
    if (r < 2 || y.inputs[1]->shape[r - 2] != scores->shape[r - 1]) return std::nullopt;
    if (scores->shape[r - 1] < kAttentionMinKeys) return std::nullopt;  // the measured rule (fuse.h)
    if (mask) {
      std::optional<Affine> d = predicate(mask);
      if (!d) return std::nullopt;
      for (size_t k = 0; k + 2 < r; ++k)
        if (d->coef[k] != 0) return std::nullopt;
      if (d->coef[r - 1] != 1 || d->coef[r - 2] != -1) return std::nullopt;  // masked where key - query + c > 0
      m.causal = true;
      m.causal_offset = -d->c;
    }
    m.q = id(scores->inputs[0].get());
    m.kt = id(scores->inputs[1].get());
    m.v = id(y.inputs[1].get());
    // A training graph: the backward of the same attention (the products' and the softmax's
    // VJPs as autodiff and simplify leave them) reads the intermediate values; both fuse.
    std::vector<int> bcore;
    const bool bw = backward(m, p, pin, e, x != s ? x : nullptr, mask, s != scores ? s : nullptr, scores, y, bcore);
    if (bw && scores->shape[r - 1] < kAttentionMinKeysWithBackward) return std::nullopt;  // the measured rule (fuse.h)
    // The backward Step reads the forward's output and log-sum-exp: lowered in node order, the
    // forward must come first (a cotangent that does not depend on Y may put a gradient before it).
    if (bw && m.root > std::min({m.g_dv, m.g_dkt, m.g_dq})) return std::nullopt;
    if (bw) core.insert(core.end(), bcore.begin(), bcore.end());
    // Nothing else reads an intermediate value (the probabilities, the scores, ...).
    std::sort(core.begin(), core.end());
    core.erase(std::unique(core.begin(), core.end()), core.end());
    for (int c : core) {
      if (output_[size_t(c)]) return std::nullopt;
      for (int u : consumers_[size_t(c)])
        if (u != root && (!bw || (u != m.g_dv && u != m.g_dkt && u != m.g_dq)) && !std::binary_search(core.begin(), core.end(), u))
          return std::nullopt;
    }
    if (!bw) m.g_dy = m.g_dv = m.g_dkt = m.g_dq = -1;
    for (int c : core) (bw && std::find(bcore.begin(), bcore.end(), c) != bcore.end() ? m.absorbed_backward : m.absorbed).push_back(c);
    return m;
  }

 private:
  const ir::Graph& g_;
  const bool bf16_;  // match autocast's form too (Target::attention_bf16)
  std::vector<std::vector<int>> consumers_;
  std::vector<uint8_t> output_;

  int id(const Node* n) const { return g_.index.at(n); }

  // The first node reading n that satisfies f.
  template <class F>
  const Node* reader(const Node* n, F&& f) const {
    for (int u : consumers_[size_t(id(n))])
      if (f(*g_.nodes[size_t(u)])) return g_.nodes[size_t(u)].get();
    return nullptr;
  }
  static bool swaps_last_two(const std::vector<int64_t>& perm) {
    const size_t r = perm.size();
    if (r < 2) return false;
    for (size_t k = 0; k + 2 < r; ++k)
      if (perm[k] != int64_t(k)) return false;
    return perm[r - 2] == int64_t(r - 1) && perm[r - 1] == int64_t(r - 2);
  }
  // a holds b with its last two dimensions swapped: a permute of b, b a permute of a, or both
  // permutes of one node (simplify composes a permute of a permute).
  static bool transposed(const Node* a, const Node* b) {
    if (a->op == Op::Permute && a->inputs[0].get() == b && swaps_last_two(a->attrs.ints)) return true;
    if (b->op == Op::Permute && b->inputs[0].get() == a && swaps_last_two(b->attrs.ints)) return true;
    if (a->op != Op::Permute || b->op != Op::Permute || a->inputs[0] != b->inputs[0]) return false;
    const auto &pa = a->attrs.ints, &pb = b->attrs.ints;
    const size_t r = pa.size();
    if (pb.size() != r || r < 2) return false;
    for (size_t k = 0; k + 2 < r; ++k)
      if (pa[k] != pb[k]) return false;
    return pa[r - 2] == pb[r - 1] && pa[r - 1] == pb[r - 2];
  }
  // n rounds a float32 value to bfloat16 (autocast's cast of a product's operand).
  static bool rounds(const Node& n) {
    return n.op == Op::Cast && n.dtype == DType::BFloat16 && n.inputs[0]->dtype == DType::Float32;
  }
  static bool is_pair(const Node& n, Op op, const Node* x, const Node* y) {
    return n.op == op && ((n.inputs[0].get() == x && n.inputs[1].get() == y) || (n.inputs[0].get() == y && n.inputs[1].get() == x));
  }

  // The backward of the forward match: fills m.g_* and the nodes only it computes.
  // pin: P as the forward's product reads it (P, or under autocast its rounding to bfloat16).
  bool backward(AttentionMatch& m, const Node* p, const Node* pin, const Node* e, const Node* where, const Node* mask, const Node* smul,
                const Node* scores, const Node& y, std::vector<int>& core) const {
    const Node* es = p->inputs[1].get();
    const Node* q = scores->inputs[0].get();
    const Node* kt = scores->inputs[1].get();
    const Node* v = y.inputs[1].get();
    // dV = P^T dY
    const Node* pt = reader(pin, [&](const Node& n) { return n.op == Op::Permute && swaps_last_two(n.attrs.ints); });
    if (!pt) return false;
    const Node* dv = reader(pt, [&](const Node& n) { return n.op == Op::Matmul && n.inputs[0].get() == pt; });
    if (!dv) return false;
    const Node* dy = dv->inputs[1].get();
    if (dy->shape != y.shape || dy->dtype != (m.bf16 ? DType::BFloat16 : y.dtype)) return false;
    // dP = dY V^T; dE = dP / s; the sum's share: -rowsum(dE * P); dX = (dE + that) * e
    const Node* dp = reader(dy, [&](const Node& n) { return n.op == Op::Matmul && n.inputs[0].get() == dy && transposed(n.inputs[1].get(), v); });
    if (!dp) return false;
    const Node* dpv = dp;  // dP as the softmax's backward reads it: under autocast rounded to bfloat16 and back
    if (m.bf16) {
      const Node* r = reader(dp, [&](const Node& n) { return rounds(n); });
      const Node* w = r ? reader(r, [&](const Node& n) { return n.op == Op::Cast && n.dtype == DType::Float32; }) : nullptr;
      if (!w) return false;
      core.insert(core.end(), {id(r), id(w)});
      dpv = w;
    }
    const Node* de = reader(dpv, [&](const Node& n) { return n.op == Op::Div && n.inputs[0].get() == dpv && n.inputs[1].get() == es; });
    if (!de) return false;
    const Node* t = reader(de, [&](const Node& n) { return is_pair(n, Op::Mul, de, p); });
    if (!t) return false;
    const Node* ng = reader(t, [&](const Node& n) { return n.op == Op::Neg; });
    if (!ng) return false;
    const int64_t last = int64_t(p->shape.size()) - 1;
    const Node* rs = reader(ng, [&](const Node& n) { return n.op == Op::ReduceSum && n.attrs.ints == std::vector<int64_t>{last}; });
    if (!rs) return false;
    const Node* rse = reader(rs, [&](const Node& n) { return n.op == Op::Expand && n.shape == p->shape; });
    if (!rse) return false;
    const Node* ad = reader(de, [&](const Node& n) { return is_pair(n, Op::Add, de, rse); });
    if (!ad) return false;
    const Node* dx = reader(ad, [&](const Node& n) { return is_pair(n, Op::Mul, ad, e); });
    if (!dx) return false;
    core.insert(core.end(), {id(pt), id(dp), id(de), id(t), id(ng), id(rs), id(rse), id(ad), id(dx)});
    // the mask's zeros, then the scale
    const Node* ds = dx;
    if (where) {
      const Node* w = reader(ds, [&](const Node& n) {
        if (n.op != Op::Where || n.inputs[0].get() != mask || n.inputs[2].get() != ds) return false;
        std::optional<double> z = constant(n.inputs[1].get());
        return z && *z == 0;
      });
      if (!w) return false;
      core.push_back(id(w));
      ds = w;
    }
    if (smul) {
      const std::optional<double> c = constant(smul->inputs[1].get()) ? constant(smul->inputs[1].get()) : constant(smul->inputs[0].get());
      const Node* ms = reader(ds, [&](const Node& n) {
        if (n.op != smul->op) return false;
        if (n.op == Op::Div) return n.inputs[0].get() == ds && constant(n.inputs[1].get()) == c;
        return (n.inputs[0].get() == ds && constant(n.inputs[1].get()) == c) || (n.inputs[1].get() == ds && constant(n.inputs[0].get()) == c);
      });
      if (!ms) return false;
      core.push_back(id(ms));
      ds = ms;
    }
    if (m.bf16) {  // dS rounded to bfloat16 for its two products
      const Node* r = reader(ds, [&](const Node& n) { return rounds(n); });
      if (!r) return false;
      core.push_back(id(r));
      ds = r;
    }
    // dK^T = Q^T dS, or dK = dS^T Q (simplify moves the transpose into the product when casts
    // stood between: autocast); dQ = dS K
    const Node* dkt = reader(ds, [&](const Node& n) { return n.op == Op::Matmul && n.inputs[1].get() == ds && transposed(n.inputs[0].get(), q); });
    if (!dkt && m.bf16) {  // (only autocast's form: the float32 one has no casts to move the transpose)
      const Node* dst = reader(ds, [&](const Node& n) { return n.op == Op::Permute && swaps_last_two(n.attrs.ints); });
      dkt = dst ? reader(dst, [&](const Node& n) { return n.op == Op::Matmul && n.inputs[0].get() == dst && n.inputs[1].get() == q; }) : nullptr;
      if (dkt) {
        core.push_back(id(dst));
        m.dk_rows = true;
      }
    }
    const Node* dq = reader(ds, [&](const Node& n) { return n.op == Op::Matmul && n.inputs[0].get() == ds && transposed(n.inputs[1].get(), kt); });
    if (!dkt || !dq) return false;
    m.g_dy = id(dy);
    m.g_dv = id(dv);
    m.g_dkt = id(dkt);
    m.g_dq = id(dq);
    return true;
  }

  // b = expand(reduce(x, last axis)) (the expand may be absent when the last axis has extent 1).
  bool reduced_back(const Node* b, Op reduce, const Node* x, std::vector<int>& core) const {
    if (b->shape != x->shape) return false;
    if (b->op == Op::Expand) {
      core.push_back(id(b));
      b = b->inputs[0].get();
    }
    const int64_t last = int64_t(x->shape.size()) - 1;
    if (b->op != reduce || b->inputs[0].get() != x || b->attrs.ints != std::vector<int64_t>{last}) return false;
    core.push_back(id(b));
    return true;
  }

  // A constant (a Full through reshapes and expands).
  static std::optional<double> constant(const Node* n) {
    while (n->op == Op::Expand || n->op == Op::Reshape) n = n->inputs[0].get();
    if (n->op == Op::Full) return n->attrs.f;
    return std::nullopt;
  }

  static void normalize(Affine& a, const Shape& s) {
    for (size_t k = 0; k < s.size(); ++k)
      if (s[k] == 1) a.coef[k] = 0;
  }

  // The value of an integer node as an affine function of its index, if it is one.
  std::optional<Affine> affine(const Node* n, int depth = 0) const {
    if (depth > 16) return std::nullopt;
    Affine a;
    a.coef.assign(n->shape.size(), 0);
    switch (n->op) {
      case Op::Iota:
        if (n->dtype != DType::Int64 && n->dtype != DType::Int32) return std::nullopt;
        a.coef[size_t(n->attrs.ints[0])] = 1;
        break;
      case Op::Full:
        if (!is_integral(n->dtype) || n->attrs.f != std::floor(n->attrs.f) || std::fabs(n->attrs.f) > 1e15) return std::nullopt;
        a.c = int64_t(n->attrs.f);
        break;
      case Op::Add:
      case Op::Sub: {
        if (!is_integral(n->dtype)) return std::nullopt;
        auto x = affine(n->inputs[0].get(), depth + 1), y = affine(n->inputs[1].get(), depth + 1);
        if (!x || !y) return std::nullopt;
        const int64_t sign = n->op == Op::Add ? 1 : -1;
        for (size_t k = 0; k < a.coef.size(); ++k) a.coef[k] = x->coef[k] + sign * y->coef[k];
        a.c = x->c + sign * y->c;
        break;
      }
      case Op::Expand:
      case Op::Reshape: {
        if (!is_integral(n->dtype)) return std::nullopt;
        auto x = affine(n->inputs[0].get(), depth + 1);
        if (!x || !remap(*x, n->inputs[0]->shape, n->shape, a)) return std::nullopt;
        break;
      }
      default: return std::nullopt;
    }
    normalize(a, n->shape);
    return a;
  }

  // Moves coefficients from shape `from` to `to` (an expand: the same rank; a reshape: only
  // extent-1 dimensions added or removed).
  static bool remap(const Affine& x, const Shape& from, const Shape& to, Affine& out) {
    out.c = x.c;
    if (from.size() == to.size()) {
      bool same = true;
      for (size_t k = 0; k < to.size(); ++k) same &= from[k] == to[k] || from[k] == 1;
      if (same) {
        for (size_t k = 0; k < to.size(); ++k) out.coef[k] = from[k] == 1 ? 0 : x.coef[k];
        return true;
      }
    }
    size_t j = 0;
    for (size_t k = 0; k < to.size(); ++k) {
      if (to[k] == 1) continue;
      while (j < from.size() && from[j] == 1) ++j;
      if (j == from.size() || from[j] != to[k]) return false;
      out.coef[k] = x.coef[j++];
    }
    while (j < from.size() && from[j] == 1) ++j;
    return j == from.size();
  }

  // A bool node that is true exactly where d(index) > 0 for an affine d.
  std::optional<Affine> predicate(const Node* n, int depth = 0) const {
    if (depth > 16 || n->dtype != DType::Bool) return std::nullopt;
    Affine d;
    d.coef.assign(n->shape.size(), 0);
    switch (n->op) {
      case Op::Gt: case Op::Lt: case Op::Ge: case Op::Le: {
        auto x = affine(n->inputs[0].get(), depth + 1), y = affine(n->inputs[1].get(), depth + 1);
        if (!x || !y) return std::nullopt;
        const bool flip = n->op == Op::Lt || n->op == Op::Le;
        if (flip) std::swap(x, y);
        for (size_t k = 0; k < d.coef.size(); ++k) d.coef[k] = x->coef[k] - y->coef[k];
        d.c = x->c - y->c + (n->op == Op::Ge || n->op == Op::Le ? 1 : 0);  // integers: a >= b is a - b + 1 > 0
        break;
      }
      case Op::Expand:
      case Op::Reshape: {
        auto x = predicate(n->inputs[0].get(), depth + 1);
        if (!x || !remap(*x, n->inputs[0]->shape, n->shape, d)) return std::nullopt;
        break;
      }
      default: return std::nullopt;
    }
    normalize(d, n->shape);
    return d;
  }
};

}  // namespace

std::vector<AttentionMatch> find_attention(const ir::Graph& g, bool bf16) {
  std::vector<AttentionMatch> out;
  Matcher m(g, bf16);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i]->op == Op::Matmul)
      if (auto a = m.match(int(i))) out.push_back(std::move(*a));
  return out;
}

}  // namespace tessera::compiler
