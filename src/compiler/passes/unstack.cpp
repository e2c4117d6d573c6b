// Batch unstacking inside one step (a budget pass, "unstack"; budget.cpp decides when it runs).
// From the largest computed node of the graph, a region of nodes is grown that is independent
// along one dimension (the batch, the rows of a row-wise op, the rows of a cross-entropy over
// huge logits): every member's output is sliced along one of its axes, and each member reads
// each input either sliced along an axis the op's rule gives (an elementwise op: the same axis; a
// matmul's M rows: the lhs's rows, the rhs whole; a reshape: the leading rows; ...) or whole (a
// weight, a broadcast scalar). Consumers whose op sums over the sliced dimension join as sinks
// (a reduce_sum or reduce_max over it, a matmul contracting it: the head weight's gradient
// x^T dlogits); they are computed per slice and their partial results added (or maxed) across
// slices (in the value's own dtype). Anything else coupled along the sliced dimension ends the
// region. The region first takes only values of at least 1/16 of the seed's bytes (a small
// value's Step per slice costs launches that it does not pay back), plus whatever leaves it and
// comes back into it; when no slice count meets the budget so, everything the slicing reaches.
//
// The graph is then rewritten into k copies of the region, one per slice: inputs from outside
// are sliced (a `slice`, free as a view; constants and iotas are rebuilt at the slice's size; a
// random draw gets its first element index, as under BatchSliceScope, so it draws the unsliced
// tensor's numbers), row outputs read outside are concatenated, sinks accumulated by a chain of
// adds. The node order puts every node slice i needs before slice i + 1's, and the slices' exit
// values are stored as they are computed (not fused into the concatenation or the last add), so
// the lowering order runs the slices one after another and slice i's temporaries die before
// slice i + 1's are made; the scheduler keeps an order only when its peak is lower.
#include <algorithm>

#include "compiler/passes/passes.h"
#include "compiler/passes/rewrite.h"

namespace tessera::compiler {
namespace {

using ir::Node;
using ir::NodePtr;
using ir::Op;

constexpr int kWhole = -1;
using Axes = std::vector<int>;

struct Member {
  int axis = kWhole;  // the axis its output is sliced along (a sink: kWhole, its output whole)
  Axes in;            // per input: the axis it is read sliced along, or kWhole
  bool sink = false;
};

bool source(Op op) { return ir::info(op).category == ir::Category::Source; }
bool elementwise(Op op) { return ir::info(op).category == ir::Category::Elementwise; }

int64_t prefix(const Shape& s, int a) {
  int64_t p = 1;
  for (int d = 0; d < a; ++d) p *= s[size_t(d)];
  return p;
}
int first_nonunit(const Shape& s) {
  for (size_t d = 0; d < s.size(); ++d)
    if (s[d] != 1) return int(d);
  return -1;
}
bool has(const std::vector<int64_t>& v, int a) { return std::find(v.begin(), v.end(), int64_t(a)) != v.end(); }
bool divides(const Shape& s, int a, int k) { return a >= 0 && a < int(s.size()) && s[size_t(a)] >= k && s[size_t(a)] % k == 0; }

// The axes a node whose output is sliced along `a` reads its inputs at (empty: not sliceable).
std::optional<Axes> inputs_for(const Node& n, int a, int k) {
  if (!divides(n.shape, a, k)) return std::nullopt;
  const size_t ni = n.inputs.size();
  auto sh = [&](size_t j) -> const Shape& { return n.inputs[j]->shape; };
  if (elementwise(n.op)) return Axes(ni, a);
  switch (n.op) {
    case Op::ReduceSum:
    case Op::ReduceMax:
      if (has(n.attrs.ints, a)) return std::nullopt;
      return Axes{a};
    case Op::Reshape: {  // leading rows: contiguous in both shapes
      const int ai = first_nonunit(sh(0));
      if (prefix(n.shape, a) != 1 || ai < 0 || !divides(sh(0), ai, k)) return std::nullopt;
      return Axes{ai};
    }
    case Op::Permute: return Axes{int(n.attrs.ints[size_t(a)])};
    case Op::Expand: return Axes{sh(0)[size_t(a)] == 1 ? kWhole : a};
    case Op::Slice:
      if (n.attrs.ints[3 * a] != 0 || n.attrs.ints[3 * a + 1] != sh(0)[size_t(a)] || n.attrs.ints[3 * a + 2] != 1) return std::nullopt;
      return Axes{a};
    case Op::Pad:
      if (n.attrs.ints[3 * a] || n.attrs.ints[3 * a + 1] || n.attrs.ints[3 * a + 2]) return std::nullopt;
      return Axes{a};
    case Op::Reverse:
      if (has(n.attrs.ints, a)) return std::nullopt;
      return Axes{a};
    case Op::Concat:
      if (n.attrs.ints[0] == a) return std::nullopt;
      return Axes(ni, a);
    case Op::Matmul: {
      const int r = int(n.shape.size());
      if (sh(0).size() != n.shape.size() || sh(1).size() != n.shape.size()) return std::nullopt;
      if (a < r - 2) return Axes{a, a};
      return a == r - 2 ? Axes{a, kWhole} : Axes{kWhole, a};
    }
    case Op::Gather: {
      const int ax = int(n.attrs.ints[0]);
      if (a == ax) return Axes{kWhole, a};
      if (sh(0)[size_t(a)] != n.shape[size_t(a)]) return std::nullopt;
      return Axes{a, a};
    }
    case Op::ScatterAdd:
      if (a == int(n.attrs.ints[0]) || sh(1)[size_t(a)] != n.shape[size_t(a)]) return std::nullopt;
      return Axes{a, a, a};
    case Op::Conv:
      if (a != 0) return std::nullopt;
      return Axes{0, kWhole};
    default: return std::nullopt;
  }
}

// A sink: n reading input j sliced along `ai` reduces over the slices (its output is whole).
std::optional<Axes> sink_inputs(const Node& n, size_t j, int ai, int k) {
  if ((n.op == Op::ReduceSum || n.op == Op::ReduceMax) && has(n.attrs.ints, ai)) return Axes{ai};
  if (n.op == Op::Matmul) {
    const int r = int(n.shape.size());
    if (n.inputs[0]->shape.size() != n.shape.size() || n.inputs[1]->shape.size() != n.shape.size()) return std::nullopt;
    if (!divides(n.inputs[0]->shape, r - 1, k)) return std::nullopt;
    if ((j == 0 && ai == r - 1) || (j == 1 && ai == r - 2)) return Axes{r - 1, r - 2};
  }
  return std::nullopt;
}

// The axis a consumer's output is sliced along when its input j is sliced along `ai`.
std::optional<int> output_axis(const Node& c, size_t j, int ai) {
  if (elementwise(c.op)) return ai;
  switch (c.op) {
    case Op::ReduceSum:
    case Op::ReduceMax:
    case Op::Expand:
    case Op::Slice:
    case Op::Pad:
    case Op::Reverse:
    case Op::Concat:
    case Op::ScatterAdd:
    case Op::Gather: return ai;
    case Op::Reshape: {
      if (prefix(c.inputs[0]->shape, ai) != 1) return std::nullopt;
      int ao = first_nonunit(c.shape);
      if (ao < 0) return std::nullopt;
      return ao;
    }
    case Op::Permute:
      for (size_t d = 0; d < c.attrs.ints.size(); ++d)
        if (c.attrs.ints[d] == ai) return int(d);
      return std::nullopt;
    case Op::Matmul: {
      const int r = int(c.shape.size());
      if (ai < r - 2 || (j == 0 && ai == r - 2) || (j == 1 && ai == r - 1)) return ai;
      return std::nullopt;
    }
    case Op::Conv: return j == 0 && ai == 0 ? std::optional<int>(0) : std::nullopt;
    default: return std::nullopt;
  }
}

struct Region {
  std::vector<char> in;
  std::vector<Member> m;
  int members = 0, sinks = 0;
};

size_t bytes_of(const Node& n) { return size_t(n.numel()) * itemsize(n.dtype); }

// Grows from the seed; `big`: the bytes from which a value is worth slicing. A producer joins
// when it is big; a consumer when it or the member it reads is big (a big value is not left to
// be concatenated whole), or when it sums over the slices; small values around the region stay
// whole (a Step per slice costs a launch, which a small value does not pay back).
Region grow(const ir::Graph& g, const std::vector<std::vector<int>>& consumers, int seed, int axis, int k, size_t big) {
  const size_t n = g.nodes.size();
  Region R{std::vector<char>(n, 0), std::vector<Member>(n), 0, 0};
  auto idx = [&](const NodePtr& p) { return g.index.at(p.get()); };
  auto compatible = [&](int i, const Member& m) {
    const Node& nd = *g.nodes[size_t(i)];
    for (size_t j = 0; j < nd.inputs.size(); ++j) {
      const int p = idx(nd.inputs[j]);
      if (R.in[size_t(p)] && (R.m[size_t(p)].sink || m.in[j] != R.m[size_t(p)].axis)) return false;
    }
    for (int c : consumers[size_t(i)]) {
      if (!R.in[size_t(c)]) continue;
      if (m.sink) return false;
      const Node& cn = *g.nodes[size_t(c)];
      for (size_t j = 0; j < cn.inputs.size(); ++j)
        if (cn.inputs[j].get() == &nd && R.m[size_t(c)].in[j] != m.axis) return false;
    }
    return true;
  };
  std::vector<int> queue;
  auto add = [&](int i, Member m) {
    R.in[size_t(i)] = 1;
    R.sinks += m.sink;
    R.m[size_t(i)] = std::move(m);
    ++R.members;
    queue.push_back(i);
  };
  // Consumer c of member i joins (force: whatever its size).
  auto join = [&](int c, int i, bool force) {
    const Node& nd = *g.nodes[size_t(i)];
    const Member& mi = R.m[size_t(i)];
    const Node& cn = *g.nodes[size_t(c)];
    size_t j = 0;
    while (cn.inputs[j].get() != &nd) ++j;
    std::optional<Member> mc;
    if (std::optional<int> ao = output_axis(cn, j, mi.axis)) {
      std::optional<Axes> ins = inputs_for(cn, *ao, k);
      if (ins && (*ins)[j] == mi.axis) mc = Member{*ao, *ins, false};
    }
    if (mc && !force && bytes_of(cn) < big && bytes_of(nd) < big) mc.reset();
    if (!mc)
      if (std::optional<Axes> s = sink_inputs(cn, j, mi.axis, k)) mc = Member{kWhole, *s, true};
    if (mc && compatible(c, *mc)) add(c, std::move(*mc));
  };
  std::optional<Axes> first = inputs_for(*g.nodes[size_t(seed)], axis, k);
  if (!first) return R;
  add(seed, Member{axis, *first, false});
  for (int round = 0; round < 64; ++round) {
    for (size_t q = 0; q < queue.size(); ++q) {
      const int i = queue[q];
      const Member mi = R.m[size_t(i)];
      const Node& nd = *g.nodes[size_t(i)];
      for (size_t j = 0; j < nd.inputs.size(); ++j) {  // producers read sliced
        const int p = idx(nd.inputs[j]);
        if (mi.in[j] == kWhole || R.in[size_t(p)] || source(g.nodes[size_t(p)]->op) || bytes_of(*g.nodes[size_t(p)]) < big) continue;
        std::optional<Axes> ins = inputs_for(*g.nodes[size_t(p)], mi.in[j], k);
        if (!ins) continue;
        Member mp{mi.in[j], *ins, false};
        if (compatible(p, mp)) add(p, std::move(mp));
      }
      if (mi.sink) continue;
      for (int c : consumers[size_t(i)])  // consumers of a sliced value
        if (!R.in[size_t(c)]) join(c, i, false);
    }
    queue.clear();
    // Values that leave the region and come back into it (a row statistic whose small result
    // the backward reads again) would make every slice wait for all of them: they join too.
    std::vector<char> below(n, 0), above(n, 0);
    for (size_t i = 0; i < n; ++i)
      for (const NodePtr& p : g.nodes[i]->inputs) {
        const size_t x = size_t(idx(p));
        below[i] |= R.in[x] || below[x];
      }
    for (size_t i = n; i-- > 0;)
      for (int c : consumers[i]) above[i] |= R.in[size_t(c)] || above[size_t(c)];
    for (size_t c = 0; c < n; ++c) {
      if (R.in[c] || !below[c] || !above[c]) continue;
      for (const NodePtr& p : g.nodes[c]->inputs) {
        const int x = idx(p);
        if (R.in[size_t(x)] && !R.m[size_t(x)].sink && !R.in[c]) join(int(c), x, true);
      }
    }
    if (queue.empty()) break;
  }
  return R;
}

// The region rewritten into k slices; `store`: nodes of the result (by index) the lowering must
// store as soon as they are computed (each slice's exits and the accumulating adds).
struct Rewritten {
  ir::Graph graph;
  std::vector<int> store;
  int exits = 0;
};

Rewritten apply(const ir::Graph& g, const std::vector<std::vector<int>>& consumers, const Region& R, int k) {
  const size_t n = g.nodes.size();
  rewrite::ScopeSwitch scope;
  auto make = [&](const Node& like, Op op, std::vector<NodePtr> ins, ir::Attrs attrs, const Shape& s, DType t) {
    scope.enter(like.scope);
    return ir::make(op, std::move(ins), std::move(attrs), &s, t, like.device);
  };
  auto sliced = [&](Shape s, int a) {
    s[size_t(a)] /= k;
    return s;
  };
  std::vector<std::vector<NodePtr>> piece(n), acc(n);
  std::vector<NodePtr> out(n);  // non-members: the node over rewritten inputs; members: their whole value
  // Slice s of an outside value x (already rewritten) along a.
  auto boundary = [&](const NodePtr& x, int a, int s) -> NodePtr {
    const Node& xn = *x;
    const int64_t len = xn.shape[size_t(a)] / k, start = int64_t(s) * len;
    const Shape sh = sliced(xn.shape, a);
    if (xn.op == Op::Full) return make(xn, Op::Full, {}, xn.attrs, sh, xn.dtype);
    if (xn.op == Op::Iota) {
      NodePtr part = make(xn, Op::Iota, {}, xn.attrs, sh, xn.dtype);
      if (xn.attrs.ints[0] != a || start == 0) return part;
      return make(xn, Op::Add, {part, make(xn, Op::Full, {}, ir::Attrs{{}, double(start)}, sh, xn.dtype)}, {}, sh, xn.dtype);
    }
    if (xn.op == Op::Rng && prefix(xn.shape, a) == 1) {  // the unsliced draw's elements from start * row size
      scope.enter(xn.scope);
      return ir::rng_from(xn, start * (numel(xn.shape) / xn.shape[size_t(a)]), sh);
    }
    std::vector<int64_t> r;
    for (size_t d = 0; d < xn.shape.size(); ++d) {
      const bool here = int(d) == a;
      r.insert(r.end(), {here ? start : 0, here ? start + len : xn.shape[d], 1});
    }
    return make(xn, Op::Slice, {x}, ir::Attrs{std::move(r), 0}, sh, xn.dtype);
  };
  auto idx = [&](const NodePtr& p) { return size_t(g.index.at(p.get())); };
  for (size_t i = 0; i < n; ++i) {
    const Node& nd = *g.nodes[i];
    if (!R.in[i]) {
      bool changed = false;
      std::vector<NodePtr> ins;
      for (const NodePtr& p : nd.inputs) {
        ins.push_back(out[idx(p)]);
        changed |= ins.back() != p;
      }
      out[i] = changed ? make(nd, nd.op, std::move(ins), nd.attrs, nd.shape, nd.dtype) : g.nodes[i];
      continue;
    }
    const Member& m = R.m[i];
    const Shape sh = m.sink ? nd.shape : sliced(nd.shape, m.axis);
    for (int s = 0; s < k; ++s) {
      std::vector<NodePtr> ins;
      for (size_t j = 0; j < nd.inputs.size(); ++j) {
        const size_t p = idx(nd.inputs[j]);
        if (m.in[j] == kWhole) ins.push_back(out[p]);
        else if (R.in[p]) ins.push_back(piece[p][size_t(s)]);
        else ins.push_back(boundary(out[p], m.in[j], s));
      }
      ir::Attrs at = nd.attrs;
      if (nd.op == Op::Slice) at.ints[3 * size_t(m.axis) + 1] = sh[size_t(m.axis)];
      piece[i].push_back(make(nd, nd.op, std::move(ins), std::move(at), sh, nd.dtype));
    }
    if (m.sink) {  // partial results accumulated in slice order
      const Op op = nd.op == Op::ReduceMax ? Op::Maximum : Op::Add;
      acc[i].push_back(piece[i][0]);
      for (int s = 1; s < k; ++s) acc[i].push_back(make(nd, op, {acc[i].back(), piece[i][size_t(s)]}, {}, nd.shape, nd.dtype));
      out[i] = acc[i].back();
    } else {
      out[i] = make(nd, Op::Concat, piece[i], ir::Attrs{{m.axis}, 0}, nd.shape, nd.dtype);
    }
  }
  // Exits: members read outside the region (or requested), per slice.
  std::vector<char> is_output(n, 0);
  for (int o : g.outputs) is_output[size_t(o)] = 1;
  std::vector<std::vector<NodePtr>> roots(size_t(k) + 1);
  Rewritten r;
  for (size_t i = 0; i < n; ++i) {
    if (!R.in[i]) continue;
    bool exit = R.m[i].sink || is_output[i];
    for (int c : consumers[i]) exit |= !R.in[size_t(c)];
    if (!exit) continue;
    ++r.exits;
    for (int s = 0; s < k; ++s) {
      roots[size_t(s)].push_back(piece[i][size_t(s)]);
      if (R.m[i].sink && s) roots[size_t(s)].push_back(acc[i][size_t(s)]);
    }
  }
  std::vector<NodePtr> outs;
  for (int o : g.outputs) outs.push_back(out[size_t(o)]);
  roots[size_t(k)] = outs;
  std::vector<NodePtr> stored;
  for (int s = 0; s < k; ++s) stored.insert(stored.end(), roots[size_t(s)].begin(), roots[size_t(s)].end());
  // Post-order from the roots, slice by slice, then the outputs: each slice's nodes come together.
  ir::Graph& h = r.graph;
  std::vector<std::pair<NodePtr, size_t>> stack;
  for (const auto& rs : roots)
    for (const NodePtr& root : rs) {
      if (h.index.find(root.get())) continue;
      stack.push_back({root, 0});
      while (!stack.empty()) {
        auto& [node, next] = stack.back();
        if (next < node->inputs.size()) {
          const NodePtr& in = node->inputs[next++];
          if (!h.index.find(in.get())) stack.push_back({in, 0});  // never on the stack already: a DAG
          continue;
        }
        if (h.index.emplace(node.get(), int(h.nodes.size()))) {
          if (node->op == Op::Leaf) h.params.push_back(int(h.nodes.size()));
          h.nodes.push_back(node);
        }
        stack.pop_back();
      }
    }
  for (const NodePtr& o : outs) h.outputs.push_back(h.index.at(o.get()));
  for (const NodePtr& s : stored)
    if (s->op != Op::Leaf) r.store.push_back(h.index.at(s.get()));
  h.key = g.key;
  return r;
}

}  // namespace

std::optional<Unstacked> unstack(const ir::Graph& g, size_t budget, size_t current, const PlanBuilder& build) {
  const size_t n = g.nodes.size();
  std::vector<std::vector<int>> consumers(n);
  for (size_t i = 0; i < n; ++i) {
    const auto& ins = g.nodes[i]->inputs;
    for (size_t j = 0; j < ins.size(); ++j) {
      const int p = g.index.at(ins[j].get());
      if (std::find(ins.begin(), ins.begin() + std::ptrdiff_t(j), ins[j]) == ins.begin() + std::ptrdiff_t(j)) consumers[size_t(p)].push_back(int(i));
    }
  }
  // The seed: the largest value a Step computes (not a parameter, constant or view).
  int seed = -1;
  size_t seed_bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    const Node& nd = *g.nodes[i];
    const ir::Category c = ir::info(nd.op).category;
    if (c == ir::Category::Source || c == ir::Category::Movement) continue;
    const size_t b = size_t(nd.numel()) * itemsize(nd.dtype);
    if (b > seed_bytes) seed = int(i), seed_bytes = b;
  }
  if (seed < 0) return std::nullopt;
  const Node& sn = *g.nodes[size_t(seed)];
  // Regions: first only the values of at least 1/16 of the seed's bytes, then every value the
  // slicing reaches (the whole step, like micro-batches in one graph) when that falls short.
  std::optional<Unstacked> best;
  for (size_t big : {seed_bytes / 16, size_t(0)}) {
    // Per axis: the fewest step bytes so far and how many slice counts in a row gained nothing (two
    // stop the axis; one does not: 2 slices can lose where 4 gain, a slice's own temporaries and
    // the concatenations outweighing half the activations).
    std::vector<size_t> fewest(sn.shape.size(), current);
    std::vector<int> misses(sn.shape.size(), 0);
    for (int k = 2; k <= 64; k *= 2) {
      for (int a = 0; a < int(sn.shape.size()); ++a) {
        if (!divides(sn.shape, a, k) || misses[size_t(a)] == 2) continue;
        Region R = grow(g, consumers, seed, a, k, big);
        if (!R.members) continue;
        Rewritten rw = apply(g, consumers, R, k);
        Plan p = build(rw.graph, rw.store);
        if (p.memory.step_bytes < fewest[size_t(a)]) fewest[size_t(a)] = p.memory.step_bytes, misses[size_t(a)] = 0;
        else ++misses[size_t(a)];
        if (p.memory.step_bytes >= (best ? best->plan.memory.step_bytes : current)) continue;
        std::string what = std::string(ir::op_name(sn.op)) + " " + dtype_short(sn.dtype) + shape_str(sn.shape);
        if (!sn.scope->empty()) what += " in " + *sn.scope;
        what += " along axis " + std::to_string(a) + " into " + std::to_string(k) + " slices (" + std::to_string(R.members) +
                " nodes, " + std::to_string(R.sinks) + " sums over the slices, " + std::to_string(rw.exits) + " values leaving)";
        best = Unstacked{std::move(p), std::move(rw.graph), k, R.members, std::move(what)};
      }
      if (best && best->plan.memory.step_bytes <= budget) return best;
    }
  }
  return best;
}

}  // namespace tessera::compiler
