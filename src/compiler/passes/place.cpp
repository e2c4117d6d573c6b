// place (the IR half; the lowering places, Lowerer::place_concat in lower.cpp): for a target that
// writes products through strides (Target::gemm_out_strides), gradients assembled from products
// become a concatenation that the products write straight into. Two rewrites, bottom-up in one
// walk:
//
//   add(pad(a), pad(b)) -> pad(concat(a, b)): zero pads (value +0, no interior padding) along one
//     and the same axis whose ranges are adjacent, where a and b are products seen through
//     reshapes and permutes (or such concatenations). A slice's gradient is the zero pad of the
//     slice's gradient, so the gradient of a value read as several adjacent slices (the qkv
//     product read as Q, K and V) is the sum of those pads; it is their concatenation. A pad of
//     nothing (lo = hi = 0) is the concatenation itself; a concatenation of a concatenation along
//     the same axis is one. Casts between the pad and the products (autocast's rounding of each
//     product to bfloat16 and back, the VJPs of its casts) are taken out of the pads, which they
//     commute with, and applied once to the concatenation; a reader's cast back to bfloat16
//     through reshapes and permutes then reads the rounded concatenation (the trip is exact,
//     simplify's rule through movements). Values: each element is the one
//     product element the sum added +0s to, so equal, except that a -0 stays -0 where the sum
//     made it +0.
//   permute(a @ b, p) -> permute(b^T @ a^T, p') when p moves the product's rows last and the
//     product is read only there (a batched product's columns are then written contiguously,
//     through Step::out_strides, instead of copied: attention's dK^T, read as [B, T, H, D]); p'
//     is p with the last two dimensions swapped (no permute when that is the identity). Each
//     element is the same dot product, though BLAS may round it differently (simplify's rule
//     for 2-D products, batched).
//
// The pipeline runs it only for such a target, with "fuse" on: the lowering then places the
// concatenation; a target that does not write products through strides keeps the sum of pads (a
// Copy Step concatenating would read and write as much as the add does).
#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include "compiler/passes/attention.h"
#include "compiler/passes/passes.h"
#include "compiler/passes/rewrite.h"

namespace tessera::compiler {
namespace {

using ir::Node;
using ir::NodePtr;
using ir::Op;

// A product seen through reshapes and permutes, or a concatenation of such; not one of the
// gradients a fused attention backward Step writes (`fused`).
// With `in_place` (Target::attention_out_maps) those count as products: the backward Step writes
// them through Step::out_maps into the concatenation (Lowerer::lower_attention_backward).
template <class Fused>
bool from_products(const Node& n, const Fused& fused, bool in_place, int depth = 0) {
  if (depth > 16) return false;
  if (n.op == Op::Matmul) return in_place || !fused(&n);
  if (n.op == Op::Reshape || n.op == Op::Permute) return from_products(*n.inputs[0], fused, in_place, depth + 1);
  if (n.op == Op::Concat)
    return std::all_of(n.inputs.begin(), n.inputs.end(), [&](const NodePtr& x) { return from_products(*x, fused, in_place, depth + 1); });
  return false;
}

// A +0 pad along one axis only, without interior padding: the axis and the range [start, end)
// its operand fills, or false.
bool zero_pad(const Node& n, int64_t* axis, int64_t* start, int64_t* end) {
  if (n.op != Op::Pad || n.attrs.f != 0 || std::signbit(n.attrs.f)) return false;
  *axis = -1;
  for (size_t d = 0; d < n.shape.size(); ++d) {
    const int64_t lo = n.attrs.ints[3 * d], hi = n.attrs.ints[3 * d + 1];
    if (n.attrs.ints[3 * d + 2] != 0) return false;
    if (lo == 0 && hi == 0) continue;
    if (*axis >= 0) return false;
    *axis = int64_t(d), *start = lo, *end = n.shape[d] - hi;
  }
  return *axis >= 0;
}

// Every value of 16-bit float `narrow` survives a trip through float32/float64 and back.
bool round_trips(DType narrow, DType wide) {
  return (narrow == DType::BFloat16 || narrow == DType::Float16) && (wide == DType::Float32 || wide == DType::Float64);
}

struct Placer : rewrite::Rewriter {
  Placer(const ir::Graph& graph, bool attention, bool in_place) : Rewriter(graph), in_place(attention && in_place) {
    if (attention)  // the lowering's "attention" pass finds these too and writes them in one Step
      for (const AttentionMatch& m : find_attention(g))
        if (m.has_backward())
          for (int k : {m.g_dq, m.g_dkt, m.g_dv}) fused.insert(g.nodes[size_t(k)].get());
  }
  std::set<const Node*> fused;
  bool in_place;

  // x is one of the fused gradients, or the replacement of one: a layer's nodes are rebuilt once
  // a later layer's pads join (its inputs changed), and must stay recognisable.
  bool is_fused(const Node* x) const {
    if (fused.count(x)) return true;
    for (size_t i = 0; i < out.size(); ++i)
      if (out[i].get() == x) return fused.count(g.nodes[i].get()) > 0;
    return false;
  }

  std::vector<int> uses = [&] {
    std::vector<int> u(g.nodes.size(), 0);
    for (const NodePtr& np : g.nodes)
      for (const NodePtr& x : np->inputs) ++u[size_t(g.index.at(x.get()))];
    for (int o : g.outputs) ++u[size_t(o)];
    return u;
  }();

  // An addend of the sum: casts over a +0 pad along one axis of movements over casts over
  // products. Casts and movements commute (and a cast keeps a +0 pad +0), so its value is
  // `casts` applied to the pad of `core`, the movements over the products (no cast between).
  struct Segment {
    std::vector<DType> casts;  // in the order they apply
    NodePtr core;
    int64_t axis = -1, start = 0, end = 0;
  };

  std::optional<Segment> segment(NodePtr x) {
    Segment s;
    std::vector<DType> top;
    while (x->op == Op::Cast) top.push_back(x->dtype), x = x->inputs[0];
    if (!zero_pad(*x, &s.axis, &s.start, &s.end)) return std::nullopt;
    const NodePtr& inner = x->inputs[0];
    std::vector<const Node*> moves;  // outermost first
    NodePtr y = inner;
    while (y->op == Op::Reshape || y->op == Op::Permute) moves.push_back(y.get()), y = y->inputs[0];
    std::vector<DType> bottom;
    while (y->op == Op::Cast) bottom.push_back(y->dtype), y = y->inputs[0];
    if (bottom.empty()) {
      s.core = inner;
    } else {
      s.core = y;  // the movements again, over the uncast value
      for (size_t k = moves.size(); k-- > 0;) {
        const Node& m = *moves[k];
        NodePtr r = m.op == Op::Permute ? transpose_product(m, {s.core}) : nullptr;
        s.core = r ? r : make_in(m.scope, m.op, {s.core}, m.attrs, &m.shape, y->dtype, m.device);
      }
    }
    if (!from_products(*s.core, [this](const Node* x) { return is_fused(x); }, in_place)) return std::nullopt;
    s.casts.assign(bottom.rbegin(), bottom.rend());
    s.casts.insert(s.casts.end(), top.rbegin(), top.rend());
    return s;
  }

  NodePtr join(const Node& n, const std::vector<NodePtr>& in) {
    if (in.size() != 2) return nullptr;
    std::optional<Segment> a = segment(in[0]), b = segment(in[1]);
    if (!a || !b || a->axis != b->axis || a->casts != b->casts || a->core->dtype != b->core->dtype) return nullptr;
    if (b->start < a->start) std::swap(a, b);
    if (a->end != b->start) return nullptr;  // not adjacent (or overlapping)
    const int64_t ax = a->axis;
    std::vector<NodePtr> parts;
    for (const NodePtr& x : {a->core, b->core}) {
      if (x->op == Op::Concat && x->attrs.ints[0] == ax) parts.insert(parts.end(), x->inputs.begin(), x->inputs.end());
      else parts.push_back(x);
    }
    Shape cs = n.shape;
    cs[size_t(ax)] = b->end - a->start;
    const DType t = a->core->dtype;
    NodePtr r = make_in(n.scope, Op::Concat, std::move(parts), ir::Attrs{{ax}, 0}, &cs, t, n.device);
    if (cs != n.shape) {
      std::vector<int64_t> p(3 * n.shape.size(), 0);
      p[size_t(3 * ax)] = a->start;
      p[size_t(3 * ax + 1)] = n.shape[size_t(ax)] - b->end;
      r = make_in(n.scope, Op::Pad, {r}, ir::Attrs{p, 0}, &n.shape, t, n.device);
    }
    for (DType c : a->casts) r = make_in(n.scope, Op::Cast, {r}, ir::Attrs{}, &n.shape, c, n.device);
    return r->dtype == n.dtype ? r : nullptr;
  }

  // x with its last two dimensions swapped, in `like`'s scope (x's input when x is that swap).
  NodePtr swapped(const Node& like, const NodePtr& x) {
    const size_t r = x->shape.size();
    std::vector<int64_t> sw(r);
    for (size_t k = 0; k < r; ++k) sw[k] = int64_t(k);
    std::swap(sw[r - 2], sw[r - 1]);
    std::vector<int64_t> p = sw;
    NodePtr base = x;
    if (x->op == Op::Permute) {  // composed: out dim k = x dim sw[k] = y dim q[sw[k]]
      for (size_t k = 0; k < r; ++k) p[k] = x->attrs.ints[size_t(sw[k])];
      base = x->inputs[0];
    }
    bool ident = true;
    for (size_t k = 0; k < r; ++k) ident &= p[k] == int64_t(k);
    if (ident) return base;
    Shape s = base->shape;
    for (size_t k = 0; k < r; ++k) s[k] = base->shape[size_t(p[k])];
    return make_in(like.scope, Op::Permute, {base}, ir::Attrs{p, 0}, &s, x->dtype, like.device);
  }

  // A node of g (as rewritten: its replacement) read by one node only.
  bool read_once(const NodePtr& x) const {
    const int* at = g.index.find(x.get());
    if (at) return uses[size_t(*at)] == 1;
    for (size_t i = 0; i < out.size(); ++i)  // a replacement: its original's uses
      if (out[i] == x) return uses[i] == 1;
    return false;
  }

  NodePtr transpose_product(const Node& n, const std::vector<NodePtr>& in) {
    const NodePtr& x = in[0];
    const auto& p = n.attrs.ints;
    const size_t r = p.size();
    if (x->op != Op::Matmul || r < 3 || p.back() != int64_t(r - 2) || !read_once(x) || is_fused(x.get())) return nullptr;
    Shape ts = x->shape;
    std::swap(ts[r - 2], ts[r - 1]);
    NodePtr t = make_in(x->scope, Op::Matmul, {swapped(n, x->inputs[1]), swapped(n, x->inputs[0])}, x->attrs, &ts, x->dtype, x->device);
    std::vector<int64_t> q(r);
    bool ident = true;
    for (size_t k = 0; k < r; ++k) {
      q[k] = p[k] == int64_t(r - 2) ? int64_t(r - 1) : p[k] == int64_t(r - 1) ? int64_t(r - 2) : p[k];
      ident &= q[k] == int64_t(k);
    }
    if (ident) return t;
    return make_in(n.scope, Op::Permute, {t}, ir::Attrs{q, 0}, &n.shape, x->dtype, n.device);
  }

  // A cast to 16 bits of a rounding trip that join() made, seen through reshapes and permutes
  // (the qkv gradient rounded to bfloat16 for its products): the movements over the rounded
  // value, which the trip gives back unchanged (simplify's rule, through movements).
  NodePtr uncast(const Node& n, const std::vector<NodePtr>& in) {
    std::vector<const Node*> moves;
    NodePtr x = in[0];
    while (x->op == Op::Reshape || x->op == Op::Permute) moves.push_back(x.get()), x = x->inputs[0];
    if (x->op != Op::Cast || g.index.find(x.get()) || x->inputs[0]->dtype != n.dtype || !round_trips(n.dtype, x->dtype)) return nullptr;
    // The movements over the value the trip starts from, and this cast above them: when that value
    // is itself a cast (the rounding of the concatenation), its input moved and cast once, so the
    // cast that feeds products stays a Step of its own, which fold_casts folds into them, and the
    // rounding trip's other readers (the bias sum) read the concatenation, not a rounded copy.
    NodePtr r = x->inputs[0];
    const bool recast = r->op == Op::Cast && is_floating(r->inputs[0]->dtype);
    if (recast) r = r->inputs[0];
    for (size_t k = moves.size(); k-- > 0;) r = make_in(moves[k]->scope, moves[k]->op, {r}, moves[k]->attrs, &moves[k]->shape, r->dtype, n.device);
    if (recast) r = make_in(n.scope, Op::Cast, {r}, ir::Attrs{}, &n.shape, n.dtype, n.device);
    return r;
  }

  ir::Graph run() {
    return apply([this](const Node& n, const std::vector<NodePtr>& in) -> NodePtr {
      return n.op == Op::Add ? join(n, in) : n.op == Op::Permute ? transpose_product(n, in) : n.op == Op::Cast ? uncast(n, in) : nullptr;
    });
  }
};

}  // namespace

ir::Graph join_pads(const ir::Graph& g, bool attention, bool attention_in_place) { return Placer(g, attention, attention_in_place).run(); }

}  // namespace tessera::compiler
