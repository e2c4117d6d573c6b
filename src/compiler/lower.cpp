#include "compiler/lower.h"

#include <algorithm>
#include <functional>
#include <map>
#include <sstream>
#include <unordered_map>

#include "compiler/passes/fuse.h"
#include "ir/conv.h"
#include "tessera/error.h"

namespace tessera::compiler {
namespace {

using ir::Node;
using ir::Op;
using kir::Code;
using kir::IndexMap;
using kir::Instr;
using kir::Step;
using kir::StepKind;

// How a node's value is reached while lowering.
struct Val {
  enum Kind { None, Slot, Const, Expr } kind = None;
  int slot = -1;
  IndexMap map;      // Slot: node index -> element of the slot's buffer
  double value = 0;  // Const: the value; Slot: what masked positions of `map` read
  // Expr (a pending fused expression, result last): evaluated over the positions of `eval`,
  // which is the node's shape unless `rowconst`: then the node's shape is `eval` with the row
  // dimensions at 1, and the expression is constant along each row of `row` positions.
  Frag frag;
  Shape eval;
  int64_t row = 0;          // run length of the RowSum/RowMax inside (0: none)
  bool rowconst = false;
  bool positional = false;  // holds Iota or Rng: valid over its own positions only
  std::vector<int> nodes;   // graph nodes it computes (Step sources and cost)
};

const std::map<Op, Code>& elementwise_codes() {
  static const std::map<Op, Code> codes = {
      {Op::Cast, Code::Cast}, {Op::Neg, Code::Neg},   {Op::Exp, Code::Exp},         {Op::Log, Code::Log},
      {Op::Tanh, Code::Tanh}, {Op::Abs, Code::Abs},   {Op::Sign, Code::Sign},       {Op::Sqrt, Code::Sqrt},
      {Op::Sin, Code::Sin},   {Op::Cos, Code::Cos},   {Op::Erf, Code::Erf},         {Op::Floor, Code::Floor},
      {Op::Ceil, Code::Ceil}, {Op::Round, Code::Round}, {Op::Pow, Code::Pow},
      {Op::Add, Code::Add},   {Op::Sub, Code::Sub},         {Op::Mul, Code::Mul},
      {Op::Div, Code::Div},   {Op::Maximum, Code::Max}, {Op::Minimum, Code::Min}, {Op::Eq, Code::Eq},
      {Op::Ne, Code::Ne},     {Op::Lt, Code::Lt},     {Op::Le, Code::Le},           {Op::Gt, Code::Gt},
      {Op::Ge, Code::Ge},     {Op::Where, Code::Where}};
  return codes;
}

// Appends `in` and keeps the frag's result last (an equal earlier instruction is repeated).
void set_result(Frag& f, int k) {
  if (k != int(f.ins.size()) - 1) f.ins.push_back(f.ins[k]);
}

struct Lowerer {
  const ir::Graph& g;
  Plan plan;
  std::vector<Val> vals;
  std::vector<int> param_slot;
  std::unordered_map<const Node*, int> param_of;  // leaf -> parameter number
  std::map<int, int> output_of_node;  // node index -> output number (first)
  std::vector<int> users;             // distinct consumer nodes (+1 per output request)
  // Expressions stored as soon as they are lowered: read by a BLAS or indexing Step (which
  // stores its operands) through reshapes and permutes, and by other nodes too, which then read
  // the stored values instead of recomputing them.
  std::vector<uint8_t> store_early;
  bool fuse = true;

  explicit Lowerer(const ir::Graph& graph) : g(graph) {}

  int new_slot(kir::SlotKind kind, int index, const Shape& s, DType t, kir::Source src = {"parameter", ""}) {
    kir::Slot sl;
    sl.source = std::move(src);
    sl.kind = kind;
    sl.index = index;
    sl.shape = s;
    sl.dtype = t;
    sl.nbytes = size_t(numel(s)) * itemsize(t);
    plan.slots.push_back(sl);
    return int(plan.slots.size()) - 1;
  }

  // The slot a node's Step writes: its output slot if it is a graph output, else a temp.
  int slot_for(int node) {
    const Node& n = *g.nodes[node];
    auto it = output_of_node.find(node);
    kir::Source src{ir::op_name(n.op), *n.scope};
    if (it != output_of_node.end()) return new_slot(kir::SlotKind::Output, it->second, n.shape, n.dtype, src);
    return new_slot(kir::SlotKind::Temp, 0, n.shape, n.dtype, src);
  }

  Step begin(StepKind kind, int node) {
    const Node& n = *g.nodes[node];
    Step st;
    st.kind = kind;
    st.shape = n.shape;
    st.dtype = n.dtype;
    st.cost = ir::info(n.op).cost(n);
    st.sources.push_back({ir::op_name(n.op), *n.scope, st.cost.flops});
    return st;
  }

  int input_index(Step& st, int slot) {
    for (size_t i = 0; i < st.inputs.size(); ++i)
      if (st.inputs[i] == slot) return int(i);
    st.inputs.push_back(slot);
    return int(st.inputs.size()) - 1;
  }

  // A frag's instructions as a Step's program: loads renumbered to the Step's inputs.
  void set_program(Step& st, const Frag& f) {
    st.program = f.ins;
    for (Instr& in : st.program)
      if (in.code == Code::Load) in.input = input_index(st, in.input);
  }

  // The sources and cost of a Step computing the nodes of an expression.
  void attribute(Step& st, const std::vector<int>& nodes, int self) {
    st.sources.clear();
    st.cost = {};
    std::vector<int> all = nodes;
    if (std::find(all.begin(), all.end(), self) == all.end()) all.push_back(self);
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    for (int k : all) {
      const Node& n = *g.nodes[k];
      const double flops = ir::info(n.op).cost(n).flops;
      st.sources.push_back({ir::op_name(n.op), *n.scope, flops});
      st.cost.flops += flops;
    }
    // Bytes: each input slot read once (at most the domain's worth) and the output written.
    int64_t dom = numel(st.kind == StepKind::Row || st.kind == StepKind::Reduce ? st.domain : st.shape);
    for (int s : st.inputs)
      st.cost.bytes += double(std::min<size_t>(plan.slots[s].nbytes, size_t(dom) * itemsize(plan.slots[s].dtype)));
    st.cost.bytes += double(numel(st.shape)) * double(itemsize(st.dtype));
  }

  Val slot_val(int slot, const Shape& s) {
    Val v;
    v.kind = Val::Slot;
    v.slot = slot;
    v.map = IndexMap::contiguous(s);
    return v;
  }

  // A value as a fused expression over its node's shape.
  Val as_expr(const Val& v, DType t, const Shape& shape) {
    if (v.kind == Val::Expr) return v;
    Val e;
    e.kind = Val::Expr;
    e.eval = shape;
    Instr in;
    in.dtype = t;
    if (v.kind == Val::Const) {
      in.code = Code::Const;
      in.value = v.value;
    } else {
      in.code = Code::Load;
      in.input = v.slot;
      in.map = v.map;
      in.value = v.value;
    }
    e.frag.add(in);
    return e;
  }

  // Emits the Step computing a pending expression into the node's slot; the node becomes a slot.
  void materialize(int node) {
    Val& v = vals[node];
    if (v.kind != Val::Expr) return;
    const Node& n = *g.nodes[node];
    Step st = begin(v.row ? StepKind::Row : StepKind::Elementwise, node);
    st.domain = v.eval;
    st.row = v.row;
    set_program(st, v.frag);
    attribute(st, v.nodes, node);
    st.output = slot_for(node);
    plan.steps.push_back(std::move(st));
    vals[node] = slot_val(plan.steps.back().output, n.shape);
  }

  // A Copy Step writing node's value densely into a new slot (attributed to `producer`).
  Val copy_to_slot(int node, int producer, kir::SlotKind kind, int index) {
    const Node& n = *g.nodes[node];
    Step st = begin(StepKind::Copy, producer);
    st.shape = n.shape;
    st.dtype = n.dtype;
    st.cost = {0, 2.0 * double(n.numel()) * double(itemsize(n.dtype))};
    st.sources.front().flops = 0;  // a copy computes nothing
    set_program(st, as_expr(vals[node], n.dtype, n.shape).frag);
    st.output = new_slot(kind, index, n.shape, n.dtype, st.sources.front());
    plan.steps.push_back(std::move(st));
    return slot_val(plan.steps.back().output, n.shape);
  }

  // A value as a plain strided view (for BLAS and indexing Steps): stores it when it is not one.
  Val strided(int node, int producer) {
    materialize(node);
    const Val& v = vals[node];
    if (v.kind == Val::Slot && v.map.single()) return v;
    return copy_to_slot(node, producer, kir::SlotKind::Temp, 0);
  }

  // The value of input node k as a consumer sees it: a pending expression read by several
  // nodes is stored first unless it is cheap enough to recompute in each.
  const Val& operand(int node) {
    Val& v = vals[node];
    if (v.kind == Val::Expr && users[node] > 1 && v.frag.weight() > kMaxDuplicateWeight) materialize(node);
    return vals[node];
  }

  // Applies a movement to every load of an expression (positions of the new shape -> old).
  Val move_expr(const Val& v, const Shape& shape, const std::function<IndexMap(const IndexMap&)>& f) {
    Val r = v;
    r.frag = v.frag.rebuilt([&](Instr& in) {
      if (in.code == Code::Load) in.map = f(in.map);
    });
    r.eval = shape;
    return r;
  }

  // True when moving an expression stacked views onto one of its loads.
  static bool deeper(const Frag& before, const Frag& after) {
    size_t a = 0, b = 0;
    for (auto& in : before.ins) a = std::max(a, in.map.views.size());
    for (auto& in : after.ins) b = std::max(b, in.map.views.size());
    return b > a;
  }

  Val lower_movement(int i) {
    const Node& n = *g.nodes[i];
    int x = g.index.at(n.inputs[0].get());
    auto apply = [&](const IndexMap& m) {
      switch (n.op) {
        case Op::Reshape: return m.reshape(n.shape);
        case Op::Permute: return m.permute(n.attrs.ints);
        case Op::Expand: return m.expand(n.shape);
        case Op::Slice: return m.slice(n.attrs.ints);
        case Op::Reverse: return m.reverse(n.attrs.ints);
        default: return m.pad(n.attrs.ints);
      }
    };
    Val xv = operand(x);
    if (xv.kind == Val::Const && (n.op != Op::Pad || n.attrs.f == xv.value)) return xv;
    if (xv.kind == Val::Expr) {
      const Shape& xs = g.nodes[x]->shape;
      if (xv.rowconst && n.op == Op::Expand && n.shape == xv.eval) {  // a row reduction broadcast back
        if (users[i] > 1 && xv.frag.weight() > kMaxDuplicateWeight) {
          // Read by several nodes: stored once per row (not once per position) and broadcast.
          materialize(x);
          Val v = vals[x];
          v.map = v.map.expand(n.shape);
          return v;
        }
        xv.rowconst = false;
        xv.nodes.push_back(i);
        return xv;
      }
      if (n.op == Op::Reshape && n.shape == xs) return xv;
      bool blowup = n.op == Op::Expand && numel(n.shape) > numel(xs) && xv.frag.weight() > kExpandRecomputeWeight;
      if (!fuse || xv.rowconst || xv.row || xv.positional || n.op == Op::Pad || blowup) {
        materialize(x);
        xv = vals[x];
      } else {
        Val r = move_expr(xv, n.shape, apply);
        if (!deeper(xv.frag, r.frag)) {
          r.nodes.push_back(i);
          return r;
        }
        materialize(x);  // a reshape no strides express: store the expression densely first
        xv = vals[x];
      }
    }
    if (xv.kind == Val::Const || (n.op == Op::Pad && xv.map.views.back().masked() && xv.value != n.attrs.f))
      xv = vals[x] = strided(x, x);
    Val v = xv;
    v.map = apply(v.map);
    if (n.op == Op::Reshape && fuse && v.map.views.size() > xv.map.views.size()) {
      // No strides express this reshape of the view: reading it would unravel every position
      // through stacked views, so the view is copied densely once and reshaped for free.
      xv = vals[x] = copy_to_slot(x, x, kir::SlotKind::Temp, 0);
      v = xv;
      v.map = apply(v.map);
    }
    if (n.op == Op::Pad) v.value = n.attrs.f;
    return v;
  }

  // Brings operand v (of node shape `s`) to a row-constant expression over `eval`.
  Val to_rowconst(int node, Val v, const Shape& eval, int64_t row) {
    if (v.kind == Val::Expr && (v.rowconst ? (v.eval != eval || v.row != row) : (v.row || v.positional ||
                                                                                  v.frag.weight() > kExpandRecomputeWeight))) {
      materialize(node);
      v = vals[node];
    }
    if (v.kind == Val::Const || (v.kind == Val::Expr && v.rowconst)) return v;
    if (v.kind == Val::Slot) {
      v.map = v.map.expand(eval);
      return v;
    }
    Val r = move_expr(v, eval, [&](const IndexMap& m) { return m.expand(eval); });
    return r;
  }

  Val lower_elementwise(int i) {
    const Node& n = *g.nodes[i];
    std::vector<int> in;
    std::vector<Val> ops;
    for (auto& p : n.inputs) {
      in.push_back(g.index.at(p.get()));
      ops.push_back(operand(in.back()));
    }
    // The domain: a row-constant operand makes the result row-constant over its positions.
    const Val* rc = nullptr;
    for (auto& v : ops)
      if (v.kind == Val::Expr && v.rowconst) rc = rc ? rc : &v;
    Shape eval = rc ? rc->eval : n.shape;
    int64_t row = rc ? rc->row : 0;
    if (rc) {
      Val keep = *rc;
      for (size_t k = 0; k < ops.size(); ++k) ops[k] = to_rowconst(in[k], ops[k], keep.eval, keep.row);
    } else {
      // Row Steps reduce one row length: expressions reducing other rows are stored first.
      for (size_t k = 0; k < ops.size(); ++k)
        if (ops[k].kind == Val::Expr && ops[k].row) {
          if (!row) row = ops[k].row;
          else if (ops[k].row != row) {
            materialize(in[k]);
            ops[k] = vals[in[k]];
          }
        }
    }
    for (int attempt = 0;; ++attempt) {
      Val r;
      r.kind = Val::Expr;
      r.eval = eval;
      r.row = row;
      r.rowconst = rc != nullptr;
      std::vector<int> args;
      for (size_t k = 0; k < ops.size(); ++k) {
        Val e = as_expr(ops[k], g.nodes[in[k]]->dtype, eval);
        args.push_back(r.frag.paste(e.frag));
        r.positional |= e.positional;
        r.nodes.insert(r.nodes.end(), e.nodes.begin(), e.nodes.end());
      }
      Instr ins;
      ins.dtype = n.dtype;
      ins.a = args[0];
      if (args.size() > 1) ins.b = args[1];
      if (args.size() > 2) ins.c = args[2];
      auto it = elementwise_codes().find(n.op);
      if (it == elementwise_codes().end()) fail("lower", std::string("no lowering for primitive ") + ir::op_name(n.op), *n.scope);
      ins.code = it->second;
      set_result(r.frag, r.frag.add(ins));
      r.nodes.push_back(i);
      if (r.frag.ins.size() <= kMaxFragInstrs || attempt > 0) return r;
      // Too large: store the operand expressions and combine their stored values.
      for (size_t k = 0; k < ops.size(); ++k)
        if (ops[k].kind == Val::Expr && !(rc && ops[k].rowconst)) {
          materialize(in[k]);
          ops[k] = rc ? to_rowconst(in[k], vals[in[k]], eval, row) : vals[in[k]];
        }
    }
  }

  Val lower_reduce(int i) {
    const Node& n = *g.nodes[i];
    int x = g.index.at(n.inputs[0].get());
    const Shape& xs = g.nodes[x]->shape;
    Val xv = operand(x);
    const auto& axes = n.attrs.ints;
    // Trailing axes: a row reduction, kept pending as a row-constant expression.
    bool trailing = !axes.empty();
    int64_t row = 1;
    for (size_t k = 0; k < axes.size(); ++k) {
      trailing &= axes[k] == int64_t(xs.size() - axes.size() + k);
      row *= xs[axes[k]];
    }
    if (fuse && trailing && row > 0 && row <= kMaxRow && numel(xs) > 0 && xv.kind != Val::Const) {
      // (A positional expression stays: the Row Step's domain is its own positions.)
      if (xv.kind == Val::Expr && (xv.rowconst || (xv.row && xv.row != row))) {
        materialize(x);
        xv = vals[x];
      }
      Val r = as_expr(xv, g.nodes[x]->dtype, xs);
      Instr red;
      red.code = n.op == Op::ReduceSum ? Code::RowSum : Code::RowMax;
      red.dtype = n.dtype;
      red.a = int(r.frag.ins.size()) - 1;
      set_result(r.frag, r.frag.add(red));
      r.eval = xs;
      r.row = row;
      r.rowconst = true;
      r.nodes.push_back(i);
      return r;
    }
    if (xv.kind == Val::Expr && (xv.rowconst || xv.row || xv.positional)) {
      materialize(x);
      xv = vals[x];
    }
    Val e = as_expr(xv, g.nodes[x]->dtype, xs);
    Step st = begin(StepKind::Reduce, i);
    st.domain = xs;
    st.axes = axes;
    st.reduce_op = n.op;
    set_program(st, e.frag);
    attribute(st, e.nodes, i);
    st.output = slot_for(i);
    plan.steps.push_back(std::move(st));
    return slot_val(plan.steps.back().output, n.shape);
  }

  // A Copy Step writing `map` (over slot `src`, masked positions read 0) densely into a temp.
  int copy_map(int src, const IndexMap& map, DType t, int producer) {
    Step st = begin(StepKind::Copy, producer);
    st.shape = map.shape();
    st.dtype = t;
    st.cost = {0, 2.0 * double(numel(st.shape)) * double(itemsize(t))};
    st.inputs = {src};
    st.program = {Instr::load(0, t, map)};
    st.output = new_slot(kir::SlotKind::Temp, 0, st.shape, t, st.sources.front());
    plan.steps.push_back(std::move(st));
    return plan.steps.back().output;
  }

  // conv as im2col + GEMM: the input, padded and dilated (stored densely first when it is, so
  // its masked view is read once rather than once per kernel position), is read through a
  // window view as columns [B, G, F/G * kernel, positions]; a GEMM batched over batch and
  // groups multiplies the kernel [G, O/G, F/G * kernel] (broadcast over the batch) with them.
  Val lower_conv(int i) {
    const Node& n = *g.nodes[i];
    int xn = g.index.at(n.inputs[0].get()), wn = g.index.at(n.inputs[1].get());
    const Shape &xs = g.nodes[xn]->shape, &ks = g.nodes[wn]->shape;
    ir::ConvAttrs c = ir::ConvAttrs::from(n.attrs);
    size_t S = c.axes.size(), r = S + 2;
    int64_t B = xs[0], G = c.groups, Fg = ks[1], O = ks[0], kk = 1, pp = 1;
    for (size_t d = 0; d < S; ++d) kk *= ks[d + 2], pp *= n.shape[d + 2];
    Val xv = strided(xn, i);
    int xslot = xv.slot;
    IndexMap xm = xv.map;
    bool has_pad = false;
    std::vector<int64_t> pads(3 * r, 0), crop;
    Shape padded = xs;
    for (size_t d = 0; d < S; ++d) {
      const ir::ConvAxis& a = c.axes[d];
      has_pad |= a.lo != 0 || a.hi != 0;
      pads[3 * (d + 2)] = std::max<int64_t>(a.lo, 0);
      pads[3 * (d + 2) + 1] = std::max<int64_t>(a.hi, 0);
      pads[3 * (d + 2) + 2] = a.lhs_dilation - 1;
      padded[d + 2] = ir::conv_padded_extent(xs[d + 2], a);
    }
    bool dilated = false;
    for (const ir::ConvAxis& a : c.axes) dilated |= a.lhs_dilation > 1;
    if (dilated) {
      // Dilation first, as its own dense copy through one masked view: each spatial dim split
      // into [X, dilation] whose second index reads x only at 0 (interior padding would stack
      // views). The result [.., X * dilation, ..] has dilation - 1 zeros after each element.
      Shape split{xs[0], xs[1]}, merged{xs[0], xs[1]};
      std::vector<int64_t> sp(6, 0);
      for (size_t d = 0; d < S; ++d) {
        int64_t ld = c.axes[d].lhs_dilation;
        split.insert(split.end(), {xs[d + 2], 1});
        merged.push_back(xs[d + 2] * ld);
        sp.insert(sp.end(), {0, 0, 0, 0, ld - 1, 0});
      }
      xslot = copy_map(xslot, xm.reshape(split).pad(sp), n.dtype, i);
      xm = IndexMap::contiguous(merged);
      // Its trailing zeros serve as up to dilation - 1 of the high padding.
      std::vector<int64_t> keep;
      for (size_t d = 0; d < r; ++d) {
        int64_t ext = d < 2 ? xs[d] : (xs[d] - 1) * c.axes[d - 2].lhs_dilation + 1;
        if (d >= 2) {
          const int64_t extra = std::min<int64_t>(pads[3 * d + 1], c.axes[d - 2].lhs_dilation - 1);
          ext += extra, pads[3 * d + 1] -= extra, pads[3 * d + 2] = 0;
        }
        keep.insert(keep.end(), {0, ext, 1});
      }
      xm = xm.slice(keep);
    }
    if (has_pad) {
      bool grows = false;
      for (size_t d = 2; d < r; ++d) grows |= pads[3 * d] > 0 || pads[3 * d + 1] > 0;
      for (size_t d = 0; d < r; ++d) {  // negative padding crops
        int64_t lo = d < 2 ? 0 : std::max<int64_t>(-c.axes[d - 2].lo, 0);
        crop.insert(crop.end(), {lo, lo + padded[d], 1});
      }
      if (grows) {
        xslot = copy_map(xslot, xm.pad(pads).slice(crop), n.dtype, i);
        xm = IndexMap::contiguous(padded);
      } else {
        xm = xm.slice(crop);  // only crops: a view
      }
    }
    // Columns [B, G, F/G * kernel, positions] (output positions innermost) for a GEMM per batch
    // element and group, out[b, g] = kernel[g] @ cols[b, g]. When the kernel's last extent is the
    // longer (kernel gradients, whose kernel is an output gradient: [B, P] per batch element would
    // be a few columns deep), the batch is folded into the columns instead, [G, F/G * kernel,
    // B * positions], for one GEMM per group, kernel[g] @ cols[g], whose product [G, O/G, B, P]
    // is the output permuted.
    bool folded = ks.back() > n.shape.back();
    Shape ws, cols;
    std::vector<int64_t> dims, steps;
    auto add = [&](int64_t extent, int64_t dim, int64_t step) { ws.push_back(extent), dims.push_back(dim), steps.push_back(step); };
    auto add_kernel = [&] {
      add(Fg, 1, 1);
      for (size_t d = 0; d < S; ++d) add(ks[d + 2], int64_t(d + 2), c.axes[d].rhs_dilation);
    };
    auto add_positions = [&] {
      for (size_t d = 0; d < S; ++d) add(n.shape[d + 2], int64_t(d + 2), c.axes[d].stride);
    };
    if (folded) {
      add(G, 1, Fg), add_kernel(), add(B, 0, 1), add_positions();
      cols = {G, Fg * kk, B * pp};
    } else {
      add(B, 0, 1), add(G, 1, Fg), add_kernel(), add_positions();
      cols = {B, G, Fg * kk, pp};
    }
    IndexMap cm = xm.window(ws, dims, steps);
    if (cm.single()) {
      // The GEMM reads the columns through the window itself: a 1x1 kernel with unit strides is
      // the input; otherwise the backend packs each block of columns where it multiplies it.
      cm = cm.reshape(cols);
    } else {
      xslot = copy_map(xslot, cm, n.dtype, i);
      cm = IndexMap::contiguous(cols);
    }
    // The kernel [O, F/G, kernel...] as [B (stride 0), G, O/G, F/G * kernel], or for the folded
    // product [G, O/G, F/G * kernel].
    Shape kshape = folded ? Shape{G, O / G, Fg * kk} : Shape{1, G, O / G, Fg * kk};
    Val wv = strided(wn, i);
    if (!wv.map.reshape(kshape).single()) wv = copy_to_slot(wn, i, kir::SlotKind::Temp, 0);
    IndexMap wm = wv.map.reshape(kshape);
    Step st = begin(StepKind::Gemm, i);
    st.input_dtypes = {n.dtype, n.dtype};
    st.inputs = {wv.slot, xslot};
    if (!folded) {
      st.shape = {B, G, O / G, pp};
      st.maps = {wm.expand({B, G, O / G, Fg * kk}), cm};
      st.output = slot_for(i);
      plan.steps.push_back(std::move(st));
      return slot_val(plan.steps.back().output, n.shape);
    }
    st.shape = {G, O / G, B * pp};
    st.maps = {wm, cm};
    st.output = new_slot(kir::SlotKind::Temp, 0, st.shape, n.dtype, st.sources.front());
    plan.steps.push_back(std::move(st));
    // The product [G, O/G, B, positions...] read as [B, O, positions...].
    Shape prod{G, O / G, B};
    std::vector<int64_t> perm{2, 0, 1};
    for (size_t d = 0; d < S; ++d) prod.push_back(n.shape[d + 2]), perm.push_back(int64_t(d + 3));
    Val v = slot_val(plan.steps.back().output, prod);
    v.map = v.map.permute(perm).reshape(n.shape);
    return v;
  }

  Val lower_node(int i) {
    const Node& n = *g.nodes[i];
    auto in = [&](int k) { return g.index.at(n.inputs[k].get()); };
    Val v;
    switch (n.op) {
      case Op::Leaf:
        return slot_val(param_slot.at(param_of.at(&n)), n.shape);
      case Op::Full:
        v.kind = Val::Const;
        v.value = n.attrs.f;
        return v;
      case Op::Iota:
      case Op::Rng: {
        v.kind = Val::Expr;
        v.eval = n.shape;
        v.positional = true;
        Instr ins;
        ins.code = n.op == Op::Iota ? Code::Iota : Code::Rng;
        ins.dtype = n.dtype;
        ins.i0 = n.attrs.ints[0];
        if (n.op == Op::Rng) ins.i1 = n.attrs.ints[1];
        v.frag.add(ins);
        v.nodes.push_back(i);
        return v;
      }
      case Op::Reshape:
      case Op::Permute:
      case Op::Expand:
      case Op::Slice:
      case Op::Pad:
      case Op::Reverse:
        return lower_movement(i);
      case Op::Conv:
        return lower_conv(i);
      case Op::Concat: {
        // out = where(pos < end0, x0, where(pos < end1, x1, ...)) along the axis; each x padded
        // into the output's extent so every load stays in bounds.
        Step st = begin(StepKind::Copy, i);
        Frag f;
        int64_t ax = n.attrs.ints[0], start = 0;
        Instr io;
        io.code = Code::Iota;
        io.dtype = DType::Int64;
        io.i0 = ax;
        int pos = f.add(io);
        std::vector<std::pair<int, int64_t>> parts;  // (instr, end)
        for (size_t k = 0; k < n.inputs.size(); ++k) {
          int node = in(int(k));
          materialize(node);
          int64_t len = g.nodes[node]->shape[ax];
          std::vector<int64_t> pads(3 * n.shape.size(), 0);
          pads[3 * ax] = start;
          pads[3 * ax + 1] = n.shape[ax] - start - len;
          Val xv = vals[node];
          if (xv.kind == Val::Slot) xv.map = xv.map.pad(pads);
          int ld = f.paste(as_expr(xv, n.dtype, n.shape).frag);
          start += len;
          parts.push_back({ld, start});
        }
        int acc = parts.back().first;
        for (size_t k = parts.size() - 1; k-- > 0;) {
          Instr c;
          c.code = Code::Const;
          c.dtype = DType::Int64;
          c.value = double(parts[k].second);
          int bound = f.add(c);
          Instr lt;
          lt.code = Code::Lt;
          lt.dtype = DType::Bool;
          lt.a = pos;
          lt.b = bound;
          int cond = f.add(lt);
          Instr w;
          w.code = Code::Where;
          w.dtype = n.dtype;
          w.a = cond;
          w.b = parts[k].first;
          w.c = acc;
          acc = f.add(w);
        }
        set_result(f, acc);
        set_program(st, f);
        st.output = slot_for(i);
        plan.steps.push_back(std::move(st));
        return slot_val(plan.steps.back().output, n.shape);
      }
      case Op::ReduceSum:
      case Op::ReduceMax:
        return lower_reduce(i);
      case Op::Matmul:
      case Op::Gather:
      case Op::ScatterAdd:
      case Op::DynamicUpdateSlice: {
        StepKind kind = n.op == Op::Matmul ? StepKind::Gemm
                        : n.op == Op::Gather ? StepKind::Gather
                        : n.op == Op::ScatterAdd ? StepKind::ScatterAdd
                                                 : StepKind::DynamicUpdateSlice;
        Step st = begin(kind, i);
        if (!n.attrs.ints.empty()) st.axis = n.attrs.ints[0];
        for (size_t k = 0; k < n.inputs.size(); ++k) {
          // These Steps address their operands directly: plain strided views only.
          Val x = strided(in(int(k)), i);
          st.inputs.push_back(x.slot);
          st.maps.push_back(x.map);
          st.input_dtypes.push_back(n.inputs[k]->dtype);
        }
        st.output = slot_for(i);
        plan.steps.push_back(std::move(st));
        return slot_val(plan.steps.back().output, n.shape);
      }
      default:
        return lower_elementwise(i);
    }
  }

  // Outputs whose value is a view, a constant or a parameter get a Copy Step into their slot.
  void copy_out(int node, int out) { vals[node] = copy_to_slot(node, node, kir::SlotKind::Output, out); }
};

}  // namespace

Plan lower(const ir::Graph& g, const std::vector<ir::NodePtr>& params, const Options& opts) {
  Lowerer L(g);
  L.fuse = opts.enabled("fuse");
  for (size_t p = 0; p < params.size(); ++p) {
    L.param_slot.push_back(L.new_slot(kir::SlotKind::Param, int(p), params[p]->shape, params[p]->dtype));
    L.param_of.emplace(params[p].get(), int(p));
  }
  L.plan.slots_of_params = L.param_slot;
  for (size_t k = 0; k < g.outputs.size(); ++k) L.output_of_node.emplace(g.outputs[k], int(k));
  L.users.assign(g.nodes.size(), 0);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    auto& ins = g.nodes[i]->inputs;
    for (size_t k = 0; k < ins.size(); ++k) {
      bool seen = false;
      for (size_t j = 0; j < k; ++j) seen |= ins[j] == ins[k];
      if (!seen) L.users[g.index.at(ins[k].get())]++;
    }
  }
  for (int o : g.outputs) L.users[o]++;
  L.store_early.assign(g.nodes.size(), 0);
  for (const ir::NodePtr& n : g.nodes) {
    if (n->op != Op::Matmul && n->op != Op::Gather && n->op != Op::ScatterAdd && n->op != Op::DynamicUpdateSlice)
      continue;
    for (const ir::NodePtr& x : n->inputs) {
      const Node* s = x.get();
      while (s->op == Op::Reshape || s->op == Op::Permute) s = s->inputs[0].get();
      int si = g.index.at(s);
      if (s != x.get() && L.users[size_t(si)] > 1) L.store_early[size_t(si)] = 1;
    }
  }
  L.vals.resize(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    L.vals[i] = L.lower_node(int(i));
    // Values computed by expressions are stored when the fusion pass is off, for outputs, and
    // when a BLAS or indexing Step stores them anyway.
    if (L.vals[i].kind == Val::Expr && (!L.fuse || L.output_of_node.count(int(i)) || L.store_early[i]))
      L.materialize(int(i));
  }
  L.plan.output_slot.assign(g.outputs.size(), -1);
  for (size_t k = 0; k < g.outputs.size(); ++k) {
    int node = g.outputs[k];
    int first = L.output_of_node.at(node);
    if (first != int(k)) {  // the same node requested twice: each tensor gets its own buffer
      L.copy_out(node, int(k));
      L.plan.output_slot[k] = L.vals[node].slot;
      continue;
    }
    const Val& v = L.vals[node];
    // Written by the node's own Step (a view of another output's slot is not).
    bool written = v.kind == Val::Slot && L.plan.slots[v.slot].kind == kir::SlotKind::Output &&
                   L.plan.slots[v.slot].index == int(k);
    if (!written) L.copy_out(node, int(k));
    L.plan.output_slot[k] = L.vals[node].slot;
  }
  L.plan.donated.assign(g.outputs.size(), -1);
  return std::move(L.plan);
}

namespace {
bool reads(const Step& st, int slot) { return std::find(st.inputs.begin(), st.inputs.end(), slot) != st.inputs.end(); }

// Writing output `out` into parameter p's buffer is safe when its producer is elementwise and
// reads p only at the element it writes, and no later Step reads p.
bool try_donate(Plan& plan, int out, int p) {
  int oslot = plan.output_slot[out], pslot = plan.slots_of_params[p];
  if (plan.slots[oslot].nbytes != plan.slots[pslot].nbytes || plan.slots[oslot].kind != kir::SlotKind::Output) return false;
  size_t producer = plan.steps.size();
  for (size_t s = 0; s < plan.steps.size(); ++s)
    for (int o : plan.steps[s].outputs())
      if (o == oslot) producer = s;
  if (producer == plan.steps.size()) return false;
  const Step& ps = plan.steps[producer];
  if (ps.kind != StepKind::Elementwise && ps.kind != StepKind::Copy) return false;
  for (const Instr& in : ps.program)
    if (in.code == Code::Load && ps.inputs[in.input] == pslot &&
        !(in.map.is_contiguous() && in.map.views[0].offset == 0 && in.map.shape() == ps.shape))
      return false;
  for (size_t s = producer + 1; s < plan.steps.size(); ++s)
    if (reads(plan.steps[s], pslot)) return false;
  for (Step& st : plan.steps) {
    for (int& x : st.inputs)
      if (x == oslot) x = pslot;
    if (st.output == oslot) st.output = pslot;
    for (int& x : st.more_outputs)
      if (x == oslot) x = pslot;
  }
  plan.output_slot[out] = pslot;
  return true;
}
}  // namespace

void donate(Plan& plan, const std::vector<int>& donate) {
  plan.donated.assign(plan.output_slot.size(), -1);
  for (size_t k = 0; k < plan.output_slot.size() && k < donate.size(); ++k)
    if (donate[k] >= 0 && try_donate(plan, int(k), donate[k])) plan.donated[k] = donate[k];
}

std::string Plan::str() const {
  std::ostringstream os;
  static const char* kinds[] = {"param", "output", "temp"};
  for (size_t i = 0; i < slots.size(); ++i)
    os << "slot " << i << ": " << kinds[int(slots[i].kind)] << " " << slots[i].index << " "
       << dtype_short(slots[i].dtype) << shape_str(slots[i].shape) << " " << slots[i].nbytes << " B"
       << (slots[i].kind == kir::SlotKind::Temp ? " @" + std::to_string(slots[i].offset) : "") << "\n";
  for (size_t s = 0; s < steps.size(); ++s) os << "step " << s << ": " << steps[s].str() << "\n";
  os << "arena " << arena_bytes << " B\n";
  return os.str();
}

}  // namespace tessera::compiler
