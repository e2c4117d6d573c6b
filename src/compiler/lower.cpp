#include "compiler/lower.h"

#include <algorithm>
#include <sstream>

#include "compiler/lowering.h"
#include "ir/saved.h"
#include "core/fail.h"

namespace tessera::compiler {
namespace lowering {

using ir::Node;
using ir::Op;
using kir::Code;
using kir::IndexMap;
using kir::Instr;
using kir::Step;
using kir::StepKind;

namespace {

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

// Keeps the frag's result (instruction k) last: an equal earlier instruction is repeated.
void set_result(Frag& f, int k) {
  if (k != int(f.ins.size()) - 1) f.ins.push_back(f.ins[k]);
}

// True when moving an expression stacked views onto one of its loads.
bool deeper(const Frag& before, const Frag& after) {
  size_t a = 0, b = 0;
  for (auto& in : before.ins) a = std::max(a, in.map.views.size());
  for (auto& in : after.ins) b = std::max(b, in.map.views.size());
  return b > a;
}

// n rounds a float32 value to bfloat16 (autocast's cast of a product's operand).
bool rounds_float(const Node& n) { return n.op == Op::Cast && n.dtype == DType::BFloat16 && n.inputs[0]->dtype == DType::Float32; }

// The permutation of `rank` dimensions swapping the last two.
std::vector<int64_t> swap_last_two(size_t rank) {
  std::vector<int64_t> p(rank);
  for (size_t k = 0; k < rank; ++k) p[k] = int64_t(k);
  std::swap(p[rank - 2], p[rank - 1]);
  return p;
}

bool addressed(Op op) { return op == Op::Matmul || op == Op::Gather || op == Op::ScatterAdd || op == Op::DynamicUpdateSlice; }

}  // namespace

// ---- setup ----

Lowerer::Lowerer(const ir::Graph& graph, const std::vector<ir::NodePtr>& params, const Options& opts)
    : g(graph), fuse(opts.enabled("fuse")), store_saved(opts.enabled("saved")),
      gemm_out_strides(opts.target.gemm_out_strides),
      gemm_out_offset(opts.target.gemm_out_strides && opts.target.gemm_out_offset),
      place(opts.enabled("place")),
      attention_out_maps(opts.target.attention_out_maps && opts.target.gemm_out_strides && opts.target.gemm_out_offset) {
  for (size_t p = 0; p < params.size(); ++p) {
    param_slot.push_back(new_slot(kir::SlotKind::Param, int(p), params[p]->shape, params[p]->dtype));
    param_of.emplace(params[p].get(), int(p));
  }
  plan.slots_of_params = param_slot;
  for (size_t k = 0; k < g.outputs.size(); ++k) output_of_node.emplace(g.outputs[k], int(k));
  users.assign(g.nodes.size(), 0);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    auto& ins = g.nodes[i]->inputs;
    for (size_t k = 0; k < ins.size(); ++k) {
      bool seen = false;
      for (size_t j = 0; j < k; ++j) seen |= ins[j] == ins[k];
      if (!seen) users[g.index.at(ins[k].get())]++;
    }
  }
  for (int o : g.outputs) users[o]++;
  store_early.assign(g.nodes.size(), 0);
  attn_at.assign(g.nodes.size(), -1);
  attn_bwd_at.assign(g.nodes.size(), -1);
  absorbed.assign(g.nodes.size(), 0);
  if (opts.enabled("attention") && opts.target.attention) {
    for (AttentionMatch& m : find_attention(g, opts.target.attention_bf16 && attention_out_maps)) {
      if (m.dk_rows && !attention_out_maps) continue;  // dK's rows are written through Step::out_maps only
      std::vector<int> roots = {m.root}, inner = m.absorbed, operands = {m.q, m.kt, m.v};
      if (m.has_backward()) {
        roots.insert(roots.end(), {m.g_dv, m.g_dkt, m.g_dq});
        inner.insert(inner.end(), m.absorbed_backward.begin(), m.absorbed_backward.end());
        operands.push_back(m.g_dy);
      }
      bool free = true;  // matches never share a node
      for (int k : roots) free &= attn_at[size_t(k)] < 0 && attn_bwd_at[size_t(k)] < 0 && !absorbed[size_t(k)];
      for (int k : inner) free &= !absorbed[size_t(k)] && attn_at[size_t(k)] < 0 && attn_bwd_at[size_t(k)] < 0;
      for (int k : operands) free &= !absorbed[size_t(k)];
      if (!free) continue;
      for (int k : inner) absorbed[size_t(k)] = 1;
      attn_at[size_t(m.root)] = int(attn.size());
      if (m.has_backward())
        for (int k : {m.g_dv, m.g_dkt, m.g_dq}) attn_bwd_at[size_t(k)] = int(attn.size());
      attn.push_back(std::move(m));
    }
    attn_lse.assign(attn.size(), -1);
    attn_concat.assign(attn.size(), -1);
    if (attention_out_maps && place && fuse) {
      std::vector<int> sole_reader(g.nodes.size(), -1);  // the one distinct reader, else -1 (-2: several)
      for (size_t i = 0; i < g.nodes.size(); ++i)
        for (const ir::NodePtr& x : g.nodes[i]->inputs) {
          int& r = sole_reader[size_t(g.index.at(x.get()))];
          r = r == -1 || r == int(i) ? int(i) : -2;
        }
      for (size_t k = 0; k < attn.size(); ++k) {
        const AttentionMatch& m = attn[k];
        if (!m.has_backward()) continue;
        const int c = concat_of_gradient(m.g_dq, sole_reader);
        if (c >= 0 && g.nodes[size_t(c)]->inputs.size() == 3 && !output_of_node.count(c) && concat_of_gradient(m.g_dkt, sole_reader) == c &&
            concat_of_gradient(m.g_dv, sole_reader) == c)
          attn_concat[k] = c;
      }
    }
    // A node every reader of which is absorbed (the causal mask and the scale that all layers
    // share) is absorbed too, never an operand the Steps read.
    if (!attn.empty()) {
      std::vector<uint8_t> operand(g.nodes.size(), 0);
      for (const AttentionMatch& m : attn)
        for (int k : {m.q, m.kt, m.v, m.g_dy})
          if (k >= 0) operand[size_t(k)] = 1;
      std::vector<std::vector<int>> readers(g.nodes.size());
      for (size_t i = 0; i < g.nodes.size(); ++i)
        for (const ir::NodePtr& x : g.nodes[i]->inputs) {
          auto& r = readers[size_t(g.index.at(x.get()))];
          if (r.empty() || r.back() != int(i)) r.push_back(int(i));
        }
      for (size_t k = g.nodes.size(); k-- > 0;) {
        if (absorbed[k] || operand[k] || attn_at[k] >= 0 || attn_bwd_at[k] >= 0 || output_of_node.count(int(k)) || readers[k].empty() ||
            g.nodes[k]->op == Op::Leaf)
          continue;
        bool all = true;
        for (int u : readers[k]) all &= absorbed[size_t(u)] || attn_at[size_t(u)] >= 0 || attn_bwd_at[size_t(u)] >= 0;
        absorbed[k] = all;
      }
    }
  }
  // Through slices too when every reader of the source is a slice (a fused qkv product's
  // bias add split into Q, K and V): stored once, whole, each part is then a strided view
  // (K^T too), and the add becomes the product's epilogue; without this each part was stored
  // on its own in its reader's layout (K^T transposed), the bias added there.
  // Nodes of autocast's fused attention read their operands' float32 sources rounded as read
  // (lower_attention), not the casts: those are not stored for them.
  std::vector<uint8_t> half_attn(g.nodes.size(), 0);
  for (const AttentionMatch& m : attn)
    if (m.bf16) {
      for (int k : {m.root, m.g_dq, m.g_dkt, m.g_dv})
        if (k >= 0) half_attn[size_t(k)] = 1;
      for (const std::vector<int>* v : {&m.absorbed, &m.absorbed_backward})
        for (int k : *v) half_attn[size_t(k)] = 1;
    }
  std::vector<uint8_t> only_slices(g.nodes.size(), 1);
  for (const ir::NodePtr& n : g.nodes)
    for (const ir::NodePtr& x : n->inputs)
      if (n->op != Op::Slice) only_slices[size_t(g.index.at(x.get()))] = 0;
  for (const ir::NodePtr& n : g.nodes) {
    if (!addressed(n->op) || half_attn[size_t(g.index.at(n.get()))]) continue;
    for (const ir::NodePtr& x : n->inputs) {
      const Node* s = x.get();
      while (s->op == Op::Reshape || s->op == Op::Permute ||
             (s->op == Op::Slice && only_slices[size_t(g.index.at(s->inputs[0].get()))]))
        s = s->inputs[0].get();
      int si = g.index.at(s);
      if (s != x.get() && users[size_t(si)] > 1) store_early[size_t(si)] = 1;
    }
  }
  // The same for the float32 sources autocast's fused attention reads rounded (its Q, K^T and V
  // as views of the biased qkv product, the bias its epilogue, as in float32).
  for (const AttentionMatch& m : attn)
    for (int k : {m.q, m.kt, m.v, m.g_dy}) {
      if (!m.bf16 || k < 0 || !rounds_float(*g.nodes[size_t(k)])) continue;
      const Node* x = g.nodes[size_t(k)]->inputs[0].get();
      const Node* s = x;
      while (s->op == Op::Reshape || s->op == Op::Permute || (s->op == Op::Slice && only_slices[size_t(g.index.at(s->inputs[0].get()))]))
        s = s->inputs[0].get();
      const int si = g.index.at(s);
      if (s != x && users[size_t(si)] > 1) store_early[size_t(si)] = 1;
    }
}

Plan Lowerer::run() {
  vals.resize(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    vals[i] = lower_node(int(i));
    // Values computed by expressions are stored when the fusion pass is off, for outputs, and
    // when a BLAS or indexing Step stores them anyway.
    // Values saved for a custom VJP's backward (ir/saved.h) are stored where they are computed
    // ("saved" on; the budget passes turn it off: passes/budget.cpp).
    if (vals[i].kind == Val::Expr && (!fuse || output_of_node.count(int(i)) || store_early[i] || (store_saved && ir::is_saved(g.nodes[i].get()))))
      materialize(int(i));
  }
  plan.output_slot.assign(g.outputs.size(), -1);
  for (size_t k = 0; k < g.outputs.size(); ++k) {
    int node = g.outputs[k];
    int first = output_of_node.at(node);
    if (first != int(k)) {  // the same node requested twice: each tensor gets its own buffer
      copy_out(node, int(k));
      plan.output_slot[k] = vals[node].slot;
      continue;
    }
    const Val& v = vals[node];
    // Written by the node's own Step (a view of another output's slot is not).
    bool written = v.kind == Val::Slot && plan.slots[v.slot].kind == kir::SlotKind::Output && plan.slots[v.slot].index == int(k);
    if (!written) copy_out(node, int(k));
    plan.output_slot[k] = vals[node].slot;
  }
  plan.donated.assign(g.outputs.size(), -1);
  return std::move(plan);
}

// ---- slots and Steps ----

int Lowerer::new_slot(kir::SlotKind kind, int index, const Shape& s, DType t, kir::Source src) {
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

int Lowerer::slot_for(int node) {
  const Node& n = *g.nodes[node];
  auto it = output_of_node.find(node);
  kir::Source src{ir::op_name(n.op), *n.scope};
  if (it != output_of_node.end()) return new_slot(kir::SlotKind::Output, it->second, n.shape, n.dtype, src);
  return new_slot(kir::SlotKind::Temp, 0, n.shape, n.dtype, src);
}

Step Lowerer::begin(StepKind kind, int node) {
  const Node& n = *g.nodes[node];
  Step st;
  st.kind = kind;
  st.shape = n.shape;
  st.dtype = n.dtype;
  st.cost = ir::info(n.op).cost(n);
  st.sources.push_back({ir::op_name(n.op), *n.scope, st.cost.flops});
  return st;
}

int Lowerer::input_index(Step& st, int slot) {
  for (size_t i = 0; i < st.inputs.size(); ++i)
    if (st.inputs[i] == slot) return int(i);
  st.inputs.push_back(slot);
  return int(st.inputs.size()) - 1;
}

void Lowerer::set_program(Step& st, const Frag& f) {
  st.program = f.ins;
  for (Instr& in : st.program)
    if (in.code == Code::Load) in.input = input_index(st, in.input);
}

void Lowerer::attribute(Step& st, const std::vector<int>& nodes, int self) {
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

Val Lowerer::push(Step st, const Shape& shape) {
  plan.steps.push_back(std::move(st));
  return slot_val(plan.steps.back().output, shape);
}

// ---- values ----

Val Lowerer::slot_val(int slot, const Shape& s) {
  Val v;
  v.kind = Val::Slot;
  v.slot = slot;
  v.map = IndexMap::contiguous(s);
  return v;
}

Val Lowerer::as_expr(const Val& v, DType t, const Shape& shape) {
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

void Lowerer::materialize(int node) {
  Val& v = vals[node];
  if (v.kind != Val::Expr) return;
  Step st = begin(v.row ? StepKind::Row : StepKind::Elementwise, node);
  st.domain = v.eval;
  st.row = v.row;
  set_program(st, v.frag);
  attribute(st, v.nodes, node);
  st.output = slot_for(node);
  vals[node] = push(std::move(st), g.nodes[node]->shape);
}

Val Lowerer::copy_to_slot(int node, int producer, kir::SlotKind kind, int index) {
  const Node& n = *g.nodes[node];
  Step st = begin(StepKind::Copy, producer);
  st.shape = n.shape;
  st.dtype = n.dtype;
  st.cost = {0, 2.0 * double(n.numel()) * double(itemsize(n.dtype))};
  st.sources.front().flops = 0;  // a copy computes nothing
  set_program(st, as_expr(vals[node], n.dtype, n.shape).frag);
  st.output = new_slot(kind, index, n.shape, n.dtype, st.sources.front());
  return push(std::move(st), n.shape);
}

int Lowerer::copy_map(int src, const IndexMap& map, DType t, int producer) {
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

Val Lowerer::strided(int node, int producer) {
  materialize(node);
  const Val& v = vals[node];
  if (v.kind == Val::Slot && v.map.single()) return v;
  return copy_to_slot(node, producer, kir::SlotKind::Temp, 0);
}

int Lowerer::summed_inputs(const Val& v) const {
  std::vector<int> seen;
  const int64_t n = numel(v.eval);
  for (const Instr& in : v.frag.ins) {
    if (in.code == Code::Add || in.code == Code::Sub) continue;
    if (in.code != Code::Load) return 0;
    if (numel(plan.slots[size_t(in.input)].shape) >= n && std::find(seen.begin(), seen.end(), in.input) == seen.end())
      seen.push_back(in.input);
  }
  return int(seen.size());
}

const Val& Lowerer::operand(int node) {
  Val& v = vals[node];
  if (v.kind != Val::Expr || users[node] <= 1) return v;
  // A sum of several stored values at full size (the GPT's residual stream: products and
  // biases) is stored once where it is computed rather than re-read, input by input, by every
  // reader (kMaxSummedInputs; it becomes the epilogue of a GEMM whose product only it reads:
  // nothing new is launched).
  if (!v.row && !v.rowconst && !v.positional && summed_inputs(v) > kMaxSummedInputs) {
    materialize(node);
    return vals[node];
  }
  if (v.frag.weight() > kMaxDuplicateWeight) {
    // A Row expression keeps its per-position part pending when storing its row statistics
    // makes it light enough (a layer norm's deviation: the mean stored, not the deviation).
    bool light = v.row && !v.rowconst && store_row_stats(node) && vals[node].frag.weight() <= kMaxDuplicateWeight;
    if (!light) materialize(node);
  } else if (v.row && v.frag.has(Code::RowSum)) {
    // Light, but each reader in another Step would sum the rows again (a layer norm's deviation
    // and standard deviation over a stored input, read by its backward): a row-constant value is
    // stored once per row, a per-position one stores its row statistics, and the merges join
    // their Steps into the forward's.
    if (v.rowconst) materialize(node);
    else store_row_stats(node);
  }
  return vals[node];
}

Val Lowerer::move_expr(const Val& v, const Shape& shape, const std::function<IndexMap(const IndexMap&)>& f) {
  Val r = v;
  r.frag = v.frag.rebuilt([&](Instr& in) {
    if (in.code == Code::Load) in.map = f(in.map);
  });
  r.eval = shape;
  return r;
}

Val Lowerer::to_rowconst(int node, Val v, const Shape& eval, int64_t row) {
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
  return move_expr(v, eval, [&](const IndexMap& m) { return m.expand(eval); });
}

// ---- nodes ----

Val Lowerer::lower_node(int i) {
  const Node& n = *g.nodes[i];
  if (absorbed[size_t(i)]) return {};  // computed inside an Attention Step
  if (attn_at[size_t(i)] >= 0) return lower_attention(i, attn[size_t(attn_at[size_t(i)])]);
  if (attn_bwd_at[size_t(i)] >= 0) return lower_attention_backward(i, attn_bwd_at[size_t(i)]);
  switch (n.op) {
    case Op::Leaf:
      return slot_val(param_slot.at(param_of.at(&n)), n.shape);
    case Op::Full: {
      Val v;
      v.kind = Val::Const;
      v.value = n.attrs.f;
      return v;
    }
    case Op::Iota:
    case Op::Rng:
      return lower_positional(i);
    case Op::Reshape:
    case Op::Permute:
    case Op::Expand:
    case Op::Slice:
    case Op::Pad:
    case Op::Reverse:
      return lower_movement(i);
    case Op::Conv:
      return lower_conv(i);
    case Op::Concat:
      return lower_concat(i);
    case Op::ReduceSum:
    case Op::ReduceMax:
      return lower_reduce(i);
    case Op::AllReduce: case Op::AllGather: case Op::ReduceScatter: case Op::AllToAll: case Op::Broadcast:
    case Op::Reduce: case Op::CollectivePermute:
      return lower_collective(i);
    case Op::Matmul:
    case Op::Gather:
    case Op::ScatterAdd:
    case Op::DynamicUpdateSlice:
      return lower_addressed(i);
    default:
      return lower_elementwise(i);
  }
}

Val Lowerer::lower_positional(int i) {
  const Node& n = *g.nodes[i];
  Val v;
  v.kind = Val::Expr;
  v.eval = n.shape;
  v.positional = true;
  Instr ins;
  ins.code = n.op == Op::Iota ? Code::Iota : Code::Rng;
  ins.dtype = n.dtype;
  ins.i0 = n.attrs.ints[0];
  if (n.op == Op::Rng) ins.i1 = n.attrs.ints[1];
  if (n.op == Op::Rng && n.attrs.ints.size() > 2) ins.value = double(n.attrs.ints[2]);
  v.frag.add(ins);
  v.nodes.push_back(i);
  return v;
}

Val Lowerer::lower_movement(int i) {
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

Val Lowerer::lower_elementwise(int i) {
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

Val Lowerer::lower_reduce(int i) {
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
  if (xv.kind == Val::Expr && xv.row && !xv.rowconst && store_row_stats(x)) xv = vals[x];  // a Reduce holds no RowSum
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
  return push(std::move(st), n.shape);
}

// out = where(pos < end0, x0, where(pos < end1, x1, ...)) along the axis; each x padded into the
// output's extent so every load stays in bounds.
Val Lowerer::lower_concat(int i) {
  const Node& n = *g.nodes[i];
  if (auto it = placed_concat.find(i); it != placed_concat.end()) return slot_val(it->second, n.shape);
  if (Val placed; place_concat(i, &placed)) return placed;
  Step st = begin(StepKind::Copy, i);
  Frag f;
  int64_t ax = n.attrs.ints[0], start = 0;
  Instr io;
  io.code = Code::Iota;
  io.dtype = DType::Int64;
  io.i0 = ax;
  int pos = f.add(io);
  std::vector<std::pair<int, int64_t>> parts;  // (instr, end)
  for (const ir::NodePtr& input : n.inputs) {
    int node = g.index.at(input.get());
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
  return push(std::move(st), n.shape);
}

bool Lowerer::place_concat(int i, Val* out) {
  const Node& n = *g.nodes[size_t(i)];
  if (!place || !fuse || !gemm_out_offset || output_of_node.count(i)) return false;
  const size_t ax = size_t(n.attrs.ints[0]);
  struct Part {
    size_t step;
    std::vector<int64_t> strides;
    int64_t offset;
  };
  std::vector<Part> parts;
  int64_t start = 0;
  for (const ir::NodePtr& input : n.inputs) {
    const int x = g.index.at(input.get());
    const Val& v = vals[size_t(x)];
    // Down to the product through reshapes and permutes, each (and the product) read only on
    // this way, so nothing else will read the product's own slot.
    int k = x;
    while (users[size_t(k)] == 1 && !output_of_node.count(k) && (g.nodes[size_t(k)]->op == Op::Reshape || g.nodes[size_t(k)]->op == Op::Permute))
      k = g.index.at(g.nodes[size_t(k)]->inputs[0].get());
    if (g.nodes[size_t(k)]->op != Op::Matmul || users[size_t(k)] != 1 || output_of_node.count(k) || v.kind != Val::Slot ||
        vals[size_t(k)].kind != Val::Slot || vals[size_t(k)].slot != v.slot)
      return false;
    const kir::Slot& sl = plan.slots[size_t(v.slot)];
    if (sl.kind != kir::SlotKind::Temp || sl.dtype != n.dtype || !v.map.is_contiguous() || v.map.views[0].offset != 0 ||
        numel(sl.shape) != input->numel())
      return false;
    // Its one writer: a floating Gemm without epilogue or accumulation, and no reader yet.
    size_t w = plan.steps.size();
    for (size_t s = 0; s < plan.steps.size(); ++s) {
      const Step& st = plan.steps[s];
      if (std::count(st.inputs.begin(), st.inputs.end(), v.slot)) return false;
      for (int o : st.outputs())
        if (o == v.slot) {
          if (w != plan.steps.size()) return false;
          w = s;
        }
    }
    if (w == plan.steps.size() || std::any_of(parts.begin(), parts.end(), [&](const Part& q) { return q.step == w; }))
      return false;  // (one product read twice: concat(x, x))
    const Step& G = plan.steps[w];
    if (G.kind != StepKind::Gemm || !G.program.empty() || G.accumulate || G.out_offset || !G.more_outputs.empty() ||
        (G.dtype != DType::Float32 && G.dtype != DType::Float64))
      return false;
    // Where each position of the product's slot lies in the concatenation's: the slot's row-major
    // order is the operand's, which fills [start, start + its extent) along the axis.
    std::vector<int64_t> range(3 * n.shape.size());
    for (size_t d = 0; d < n.shape.size(); ++d) {
      range[3 * d] = d == ax ? start : 0;
      range[3 * d + 1] = d == ax ? start + input->shape[d] : n.shape[d];
      range[3 * d + 2] = 1;
    }
    const IndexMap at = IndexMap::contiguous(n.shape).slice(range).reshape(sl.shape);
    if (!at.single()) return false;
    std::vector<int64_t> strides(G.shape.size());
    auto perm = permuted_slot.find(v.slot);
    if (perm != permuted_slot.end()) {
      for (size_t j = 0; j < strides.size(); ++j) strides[size_t(perm->second[j])] = at.views[0].strides[j];
    } else {
      if (sl.shape != G.shape) return false;
      strides = at.views[0].strides;
    }
    if (strides.back() != 1) return false;  // columns contiguous
    parts.push_back({w, std::move(strides), at.views[0].offset});
    start += input->shape[ax];
  }
  const int slot = slot_for(i);
  for (Part& p : parts) {
    Step& G = plan.steps[p.step];
    G.output = slot;
    G.out_strides = std::move(p.strides);
    G.out_offset = p.offset;
  }
  *out = slot_val(slot, n.shape);
  return true;
}

Val Lowerer::lower_addressed(int i) {
  const Node& n = *g.nodes[i];
  StepKind kind = n.op == Op::Matmul       ? StepKind::Gemm
                  : n.op == Op::Gather     ? StepKind::Gather
                  : n.op == Op::ScatterAdd ? StepKind::ScatterAdd
                                           : StepKind::DynamicUpdateSlice;
  Step st = begin(kind, i);
  if (!n.attrs.ints.empty()) st.axis = n.attrs.ints[0];
  for (const ir::NodePtr& input : n.inputs) {
    // These Steps address their operands directly: plain strided views only.
    Val x = strided(g.index.at(input.get()), i);
    st.inputs.push_back(x.slot);
    st.maps.push_back(x.map);
    st.input_dtypes.push_back(input->dtype);
  }
  if (const std::vector<int64_t> perm = permuted_product(i); !perm.empty()) {
    // Written as the permute reads it: the slot holds the permuted shape densely, the product's
    // dimension perm[j] at that shape's stride j; the permute is then a plain contiguous view
    // (and a reshape after it free, where it copied the product before).
    const size_t r = perm.size();
    Shape ps(r);
    std::vector<int64_t> inv(r);
    for (size_t j = 0; j < r; ++j) ps[j] = n.shape[size_t(perm[j])], inv[size_t(perm[j])] = int64_t(j);
    const std::vector<int64_t> cs = contiguous_strides(ps);
    st.out_strides.assign(r, 0);
    for (size_t j = 0; j < r; ++j) st.out_strides[size_t(perm[j])] = cs[j];
    st.output = new_slot(kir::SlotKind::Temp, 0, ps, n.dtype, kir::Source{ir::op_name(n.op), *n.scope});
    permuted_slot[st.output] = perm;
    Val v = push(std::move(st), ps);
    v.map = v.map.permute(inv);
    return v;
  }
  st.output = slot_for(i);
  return push(std::move(st), n.shape);
}

std::vector<int64_t> Lowerer::permuted_product(int i) const {
  const Node& n = *g.nodes[size_t(i)];
  const size_t r = n.shape.size();
  // Floating products: float32/float64 operands, or 16-bit ones with a float32 result (autocast's).
  const DType a = n.inputs[0]->dtype, b = n.inputs[1]->dtype;
  const bool half = n.dtype == DType::Float32 && a == b && (a == DType::BFloat16 || a == DType::Float16);
  if (!gemm_out_strides || !fuse || n.op != Op::Matmul || r < 3 || users[size_t(i)] != 1 || output_of_node.count(i) ||
      (!half && ((n.dtype != DType::Float32 && n.dtype != DType::Float64) || a != n.dtype || b != n.dtype)))
    return {};
  for (size_t k = size_t(i) + 1; k < g.nodes.size(); ++k) {
    const Node& u = *g.nodes[k];
    if (std::none_of(u.inputs.begin(), u.inputs.end(), [&](const ir::NodePtr& x) { return x.get() == &n; })) continue;
    if (u.op != Op::Permute || absorbed[k] || u.attrs.ints.back() != int64_t(r - 1)) return {};
    return u.attrs.ints;  // the one reader (an identity permute does not survive simplify)
  }
  return {};
}

// A collective reads its input densely (a communicator moves plain buffers) and writes its
// output densely: a strided or fused input is copied into a temporary first.
Val Lowerer::lower_collective(int i) {
  const Node& n = *g.nodes[i];
  Step st = begin(StepKind::Collective, i);
  st.collective = n.op;
  st.collective_attrs = n.attrs.ints;
  const int x = g.index.at(n.inputs[0].get());
  Val xv = strided(x, i);
  if (!xv.map.is_contiguous() || xv.map.views[0].offset != 0) xv = copy_to_slot(x, i, kir::SlotKind::Temp, 0);
  st.inputs.push_back(xv.slot);
  st.maps.push_back(xv.map);
  st.input_dtypes.push_back(n.inputs[0]->dtype);
  st.output = slot_for(i);
  return push(std::move(st), n.shape);
}

// softmax(scale * Q K^T, masked) V as one Step: Q, K^T and V as plain strided views (K^T's view
// permuted back to [..., Tk, D]); the scores and probabilities are never stored.
Val Lowerer::lower_attention(int i, const AttentionMatch& m) {
  const Node& n = *g.nodes[i];
  Step st = begin(StepKind::Attention, i);
  const Val q = attention_operand(st, m, m.q, 0, i), kt = attention_operand(st, m, m.kt, 1, i), v = attention_operand(st, m, m.v, 2, i);
  const size_t r = n.shape.size();
  std::vector<int64_t> perm(r);
  for (size_t k = 0; k < r; ++k) perm[k] = int64_t(k);
  std::swap(perm[r - 2], perm[r - 1]);
  st.inputs = {q.slot, kt.slot, v.slot};
  st.maps = {q.map, kt.map.permute(perm), v.map};
  for (int k : {m.q, m.kt, m.v}) st.input_dtypes.push_back(g.nodes[size_t(k)]->dtype);
  kir::Step::Attention a;
  a.batch = 1;
  for (size_t k = 0; k + 2 < r; ++k) a.batch *= n.shape[k];
  a.tq = n.shape[r - 2];
  a.dv = n.shape[r - 1];
  a.d = q.map.shape()[r - 1];
  a.tk = kt.map.shape()[r - 1];
  a.scale = m.scale;
  a.causal = m.causal;
  a.causal_offset = m.causal_offset;
  a.bf16 = m.bf16;
  st.attention = a;
  std::vector<int64_t> perm_out;  // the output written as its one reader, a permute, reads it
  if (attention_out_maps) perm_out = permuted_product(i);
  if (!perm_out.empty()) {  // as lower_addressed does for a product (Step::out_strides there)
    Shape ps(r);
    std::vector<int64_t> inv(r);
    for (size_t j = 0; j < r; ++j) ps[j] = n.shape[size_t(perm_out[j])], inv[size_t(perm_out[j])] = int64_t(j);
    st.output = new_slot(kir::SlotKind::Temp, 0, ps, n.dtype, kir::Source{ir::op_name(n.op), *n.scope});
    permuted_slot[st.output] = perm_out;
    st.out_maps = {IndexMap::contiguous(ps).permute(inv)};
  } else {
    st.output = slot_for(i);
  }
  attribute(st, m.absorbed, i);
  // Bytes: Q, K and V read once (a task reads its K and V tiles from cache), the output written.
  const double item = double(itemsize(n.dtype));
  st.cost.bytes = item * double(a.batch) * double(a.tq * a.d + a.tk * (a.d + a.dv) + a.tq * a.dv);
  // The first source names the Step ("attention" in the profile's op table and errors).
  st.sources.insert(st.sources.begin(), kir::Source{"attention", *n.scope, 0});
  if (m.has_backward()) {  // each row's log-sum-exp, for the backward Step
    Shape ls(n.shape.begin(), n.shape.end() - 1);
    const int lse = new_slot(kir::SlotKind::Temp, 0, ls, n.dtype, kir::Source{"attention", *n.scope, 0});
    st.more_outputs = {lse};
    st.more_results = {0};
    st.cost.bytes += item * double(a.batch * a.tq);
    attn_lse[size_t(&m - attn.data())] = lse;
  }
  if (!perm_out.empty()) {
    const IndexMap at = st.out_maps[0];
    const Shape ps = plan.slots[size_t(st.output)].shape;
    Val v = push(std::move(st), ps);
    v.map = at;
    return v;
  }
  return push(std::move(st), n.shape);
}

// The backward of a fused attention: one Step writing dQ, dK^T and dV (the three gradient nodes)
// from Q, K, V, the forward's output and log-sum-exp and the output's cotangent. Emitted when the
// first of the three is lowered (all its inputs are lowered by then); the others read its slots.
Val Lowerer::lower_attention_backward(int i, int match) {
  auto done = attn_bwd_vals.find(i);
  if (done != attn_bwd_vals.end()) return done->second;
  const AttentionMatch& m = attn[size_t(match)];
  auto fwd_at = std::find_if(plan.steps.begin(), plan.steps.end(),
                             [&](const Step& s) { return s.attention && !s.more_outputs.empty() && s.more_outputs[0] == attn_lse[size_t(match)]; });
  if (fwd_at == plan.steps.end()) fail("lower", "internal: a fused attention's backward before its forward", *g.nodes[size_t(i)]->scope);
  const Step fwd = *fwd_at;  // a copy: strided() below may add Steps
  const Node& dq = *g.nodes[size_t(m.g_dq)];
  Step st = begin(StepKind::Attention, m.g_dq);
  st.rounded = uint8_t(fwd.rounded & 7u);
  const Val dy = attention_operand(st, m, m.g_dy, 4, m.g_dq);
  const int lse = attn_lse[size_t(match)];
  st.inputs = {fwd.inputs[0], fwd.inputs[1], fwd.inputs[2], fwd.output, dy.slot, lse};
  const IndexMap o = fwd.out_maps.empty() ? IndexMap::contiguous(fwd.shape) : fwd.out_maps[0];  // O as the forward wrote it
  st.maps = {fwd.maps[0], fwd.maps[1], fwd.maps[2], o, dy.map, IndexMap::contiguous(plan.slots[size_t(lse)].shape)};
  st.input_dtypes = {fwd.input_dtypes[0], fwd.input_dtypes[1], fwd.input_dtypes[2], fwd.dtype, g.nodes[size_t(m.g_dy)]->dtype, fwd.dtype};
  kir::Step::Attention a = *fwd.attention;
  a.backward = true;
  st.attention = a;
  std::vector<IndexMap> at;  // each gradient's map into the concatenation's slot
  const int c = attn_concat[size_t(match)];
  if (c >= 0) {
    // Each operand of the concatenation covers [start, start + extent) along its axis; its map
    // there, carried back through the reshapes and permutes to the gradient node's shape.
    const Node& cn = *g.nodes[size_t(c)];
    const size_t ax = size_t(cn.attrs.ints[0]);
    std::map<int, IndexMap> of;
    int64_t start = 0;
    for (const ir::NodePtr& input : cn.inputs) {
      std::vector<int64_t> range(3 * cn.shape.size());
      for (size_t d = 0; d < cn.shape.size(); ++d) {
        range[3 * d] = d == ax ? start : 0;
        range[3 * d + 1] = d == ax ? start + input->shape[d] : cn.shape[d];
        range[3 * d + 2] = 1;
      }
      start += input->shape[ax];
      IndexMap map = IndexMap::contiguous(cn.shape).slice(range);
      const Node* x = input.get();
      while (x->op == Op::Reshape || x->op == Op::Permute) {
        const Node& y = *x->inputs[0];
        if (x->op == Op::Reshape) {
          map = map.reshape(y.shape);
        } else {  // x's dimension k is y's dimension p[k]
          std::vector<int64_t> inv(x->attrs.ints.size());
          for (size_t k = 0; k < inv.size(); ++k) inv[size_t(x->attrs.ints[k])] = int64_t(k);
          map = map.permute(inv);
        }
        if (!map.single()) break;
        x = &y;
      }
      of.emplace(g.index.at(x), map);
    }
    for (int k : {m.g_dq, m.g_dkt, m.g_dv}) {
      auto it = of.find(k);
      if (it == of.end() || !it->second.single() || it->second.views[0].strides.empty()) break;
      at.push_back(k == m.g_dkt && m.dk_rows ? it->second.permute(swap_last_two(it->second.shape().size())) : it->second);
    }
    if (at.size() != 3) at.clear();
  }
  if (at.empty() && m.dk_rows) {  // dK's rows in its own slot, written as dK^T through the transposed map
    st.output = slot_for(m.g_dq);
    st.more_outputs = {slot_for(m.g_dkt), slot_for(m.g_dv)};
    const Shape& ks = g.nodes[size_t(m.g_dkt)]->shape;
    st.out_maps = {IndexMap::contiguous(dq.shape), IndexMap::contiguous(ks).permute(swap_last_two(ks.size())),
                   IndexMap::contiguous(g.nodes[size_t(m.g_dv)]->shape)};
  }
  if (!at.empty()) {  // dQ, dK^T and dV written into their parts of the concatenation's slot
    const int slot = slot_for(c);
    placed_concat[c] = slot;
    st.output = slot;
    st.more_outputs = {slot, slot};
    st.out_maps = at;
  } else if (!m.dk_rows) {
    st.output = slot_for(m.g_dq);
    st.more_outputs = {slot_for(m.g_dkt), slot_for(m.g_dv)};
  }
  const int dkt = st.more_outputs[0], dv = st.more_outputs[1];
  st.more_results = {0, 0};
  std::vector<int> nodes = m.absorbed_backward;
  nodes.insert(nodes.end(), {m.g_dv, m.g_dkt});
  attribute(st, nodes, m.g_dq);
  const double item = double(itemsize(dq.dtype));
  st.cost.bytes = item * double(a.batch) * double(2 * (a.tq * a.d + a.tk * (a.d + a.dv)) + 2 * a.tq * a.dv + a.tq);
  st.sources.insert(st.sources.begin(), kir::Source{"attention_backward", *dq.scope, 0});
  push(std::move(st), dq.shape);
  attn_bwd_vals[m.g_dq] = slot_val(plan.steps.back().output, dq.shape);
  attn_bwd_vals[m.g_dkt] = slot_val(dkt, g.nodes[size_t(m.g_dkt)]->shape);
  attn_bwd_vals[m.g_dv] = slot_val(dv, g.nodes[size_t(m.g_dv)]->shape);
  if (!at.empty()) {  // the gradients as views of their parts (only the concatenation reads them)
    attn_bwd_vals[m.g_dq].map = at[0];
    attn_bwd_vals[m.g_dkt].map = m.dk_rows ? at[1].permute(swap_last_two(at[1].shape().size())) : at[1];
    attn_bwd_vals[m.g_dv].map = at[2];
  }
  return attn_bwd_vals.at(i);
}

// An attention Step's operand node k (its input `bit`): under autocast a rounding cast of a
// float32 value is read as that value, rounded as the kernel reads it (Step::rounded); else the
// node's own value.
Val Lowerer::attention_operand(Step& st, const AttentionMatch& m, int k, int bit, int reader) {
  if (!m.bf16) return strided(k, reader);
  auto movements = [](const Node* n, std::vector<const Node*>& out) {
    while (n->op == Op::Reshape || n->op == Op::Permute) out.push_back(n), n = n->inputs[0].get();
    return n;
  };
  // The operand as a rounding of a float32 value y, moved (reshapes and permutes of the cast,
  // or the cast itself); else a bfloat16 value read as it is.
  std::vector<const Node*> moves;
  const Node* r = movements(g.nodes[size_t(k)].get(), moves);
  if (!rounds_float(*r)) return strided(k, reader);
  const Node* y = r->inputs[0].get();
  // y itself a rounding widened and moved (autocast's cotangent dY: a product's result rounded
  // to bfloat16, widened, reshaped and permuted): rounding again gives the same bits, so the
  // product's result is read through all the movements.
  std::vector<const Node*> deeper = moves;
  const Node* w = movements(y, deeper);
  if (w->op == Op::Cast && w->dtype == DType::Float32 && w->inputs[0]->dtype == DType::BFloat16) {
    const Node* r2 = movements(w->inputs[0].get(), deeper);
    if (rounds_float(*r2)) y = r2->inputs[0].get(), moves = deeper;
  }
  Val v = strided(g.index.at(y), reader);
  for (size_t j = moves.size(); j-- > 0 && v.map.single();) {
    const Node& mv = *moves[j];
    v.map = mv.op == Op::Reshape ? v.map.reshape(mv.shape) : v.map.permute(mv.attrs.ints);
  }
  if (!v.map.single()) return strided(k, reader);
  st.rounded = uint8_t(st.rounded | (1u << bit));
  return v;
}

int Lowerer::concat_of_gradient(int x, const std::vector<int>& sole_reader) const {
  for (int depth = 0; depth < 16; ++depth) {
    const int r = sole_reader[size_t(x)];
    if (r < 0 || users[size_t(x)] != 1 || output_of_node.count(x)) return -1;
    const Op op = g.nodes[size_t(r)]->op;
    if (op == Op::Concat) return r;
    if (op != Op::Reshape && op != Op::Permute) return -1;
    x = r;
  }
  return -1;
}

void Lowerer::copy_out(int node, int out) { vals[node] = copy_to_slot(node, node, kir::SlotKind::Output, out); }

}  // namespace lowering

Plan lower(const ir::Graph& g, const std::vector<ir::NodePtr>& params, const Options& opts) {
  return lowering::Lowerer(g, params, opts).run();
}

Plan lower(const ir::Graph& g, const std::vector<ir::NodePtr>& params, const Options& opts, const std::vector<int>& store) {
  lowering::Lowerer l(g, params, opts);
  for (int i : store) l.store(i);
  return l.run();
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
