#include "compiler/lower.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <unordered_map>

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
  enum Kind { None, Slot, Const } kind = None;
  int slot = -1;
  IndexMap map;      // Slot: node index -> element of the slot's buffer
  double value = 0;  // Const: the value; Slot: what masked positions of `map` read
};

struct Lowerer {
  const ir::Graph& g;
  Plan plan;
  std::vector<Val> vals;
  std::vector<int> param_slot;
  std::unordered_map<const Node*, int> param_of;  // leaf -> parameter number
  std::map<int, int> output_of_node;  // node index -> output number (first)

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
    st.sources.push_back({ir::op_name(n.op), *n.scope});
    st.cost = ir::info(n.op).cost(n);
    return st;
  }

  int input_index(Step& st, int slot) {
    for (size_t i = 0; i < st.inputs.size(); ++i)
      if (st.inputs[i] == slot) return int(i);
    st.inputs.push_back(slot);
    return int(st.inputs.size()) - 1;
  }

  int emit(Step& st, Instr in) {
    st.program.push_back(std::move(in));
    return int(st.program.size()) - 1;
  }

  // An instruction reading value v (of dtype t) over the step's domain via `map`.
  int load(Step& st, const Val& v, const IndexMap& map, DType t) {
    Instr in;
    in.dtype = t;
    if (v.kind == Val::Const) {
      in.code = Code::Const;
      in.value = v.value;
    } else {
      in.code = Code::Load;
      in.input = input_index(st, v.slot);
      in.map = map;
      in.value = v.value;
    }
    return emit(st, std::move(in));
  }
  int load(Step& st, int node) { return load(st, vals[node], vals[node].map, g.nodes[node]->dtype); }

  Val finish(Step st, int node) {
    st.output = slot_for(node);
    plan.steps.push_back(std::move(st));
    Val v;
    v.kind = Val::Slot;
    v.slot = plan.steps.back().output;
    v.map = IndexMap::contiguous(g.nodes[node]->shape);
    return v;
  }

  // A Copy Step writing node's value densely into a new slot (attributed to `producer`).
  Val copy_to_slot(int node, int producer, kir::SlotKind kind, int index) {
    const Node& n = *g.nodes[node];
    Step st = begin(StepKind::Copy, producer);
    st.shape = n.shape;
    st.dtype = n.dtype;
    st.cost = {0, 2.0 * double(n.numel()) * double(itemsize(n.dtype))};
    load(st, node);
    st.output = new_slot(kind, index, n.shape, n.dtype, st.sources.front());
    plan.steps.push_back(std::move(st));
    Val r;
    r.kind = Val::Slot;
    r.slot = plan.steps.back().output;
    r.map = IndexMap::contiguous(n.shape);
    return r;
  }

  // A value as a plain strided view (for BLAS and indexing Steps): copies when it is not one.
  Val strided(int node, int producer) {
    const Val& v = vals[node];
    if (v.kind == Val::Slot && v.map.single()) return v;
    return copy_to_slot(node, producer, kir::SlotKind::Temp, 0);
  }

  Val lower_node(int i) {
    const Node& n = *g.nodes[i];
    auto in = [&](int k) { return g.index.at(n.inputs[k].get()); };
    Val v;
    switch (n.op) {
      case Op::Leaf:
        v.kind = Val::Slot;
        v.slot = param_slot.at(param_of.at(&n));
        v.map = IndexMap::contiguous(n.shape);
        return v;
      case Op::Full:
        v.kind = Val::Const;
        v.value = n.attrs.f;
        return v;
      case Op::Iota:
      case Op::Rng: {
        Step st = begin(StepKind::Elementwise, i);
        Instr ins;
        ins.code = n.op == Op::Iota ? Code::Iota : Code::Rng;
        ins.dtype = n.dtype;
        ins.i0 = n.attrs.ints[0];
        if (n.op == Op::Rng) ins.i1 = n.attrs.ints[1];
        emit(st, ins);
        return finish(std::move(st), i);
      }
      case Op::Reshape:
      case Op::Permute:
      case Op::Expand:
      case Op::Slice:
      case Op::Pad: {
        const Val& x = vals[in(0)];
        if (x.kind == Val::Const && (n.op != Op::Pad || n.attrs.f == x.value)) return x;
        if (x.kind == Val::Const || (n.op == Op::Pad && x.map.views.back().masked() && x.value != n.attrs.f))
          vals[in(0)] = strided(in(0), in(0));
        v = vals[in(0)];
        switch (n.op) {
          case Op::Reshape: v.map = v.map.reshape(n.shape); break;
          case Op::Permute: v.map = v.map.permute(n.attrs.ints); break;
          case Op::Expand: v.map = v.map.expand(n.shape); break;
          case Op::Slice: v.map = v.map.slice(n.attrs.ints); break;
          default:
            v.map = v.map.pad(n.attrs.ints);
            v.value = n.attrs.f;
        }
        return v;
      }
      case Op::Concat: {
        // out = where(pos < end0, x0, where(pos < end1, x1, ...)) along the axis; each x padded
        // into the output's extent so every load stays in bounds.
        Step st = begin(StepKind::Copy, i);
        int64_t ax = n.attrs.ints[0], start = 0;
        Instr io;
        io.code = Code::Iota;
        io.dtype = DType::Int64;
        io.i0 = ax;
        int pos = emit(st, io);
        int acc = -1;
        std::vector<std::pair<int, int64_t>> parts;  // (instr, end)
        for (size_t k = 0; k < n.inputs.size(); ++k) {
          int node = in(int(k));
          int64_t len = g.nodes[node]->shape[ax];
          std::vector<int64_t> pads(3 * n.shape.size(), 0);
          pads[3 * ax] = start;
          pads[3 * ax + 1] = n.shape[ax] - start - len;
          const Val& xv = vals[node];
          int ld = load(st, xv, xv.kind == Val::Slot ? xv.map.pad(pads) : xv.map, n.dtype);
          start += len;
          parts.push_back({ld, start});
        }
        acc = parts.back().first;
        for (size_t k = parts.size() - 1; k-- > 0;) {
          Instr c;
          c.code = Code::Const;
          c.dtype = DType::Int64;
          c.value = double(parts[k].second);
          int bound = emit(st, c);
          Instr lt;
          lt.code = Code::Lt;
          lt.dtype = DType::Bool;
          lt.a = pos;
          lt.b = bound;
          int cond = emit(st, lt);
          Instr w;
          w.code = Code::Where;
          w.dtype = n.dtype;
          w.a = cond;
          w.b = parts[k].first;
          w.c = acc;
          acc = emit(st, w);
        }
        return finish(std::move(st), i);
      }
      case Op::ReduceSum:
      case Op::ReduceMax: {
        Step st = begin(StepKind::Reduce, i);
        st.domain = n.inputs[0]->shape;
        st.axes = n.attrs.ints;
        st.reduce_op = n.op;
        load(st, in(0));
        return finish(std::move(st), i);
      }
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
          Val x = vals[in(int(k))];
          // These Steps address their operands directly: plain strided views only.
          if (x.kind == Val::Const || !x.map.single()) x = strided(in(int(k)), i);
          st.inputs.push_back(x.slot);
          st.maps.push_back(x.map);
          st.input_dtypes.push_back(n.inputs[k]->dtype);
        }
        return finish(std::move(st), i);
      }
      default: {
        // Elementwise primitives: cast, unary, binary, compare, where.
        Step st = begin(StepKind::Elementwise, i);
        std::vector<int> args;
        for (size_t k = 0; k < n.inputs.size(); ++k) args.push_back(load(st, in(int(k))));
        Instr ins;
        ins.dtype = n.dtype;
        ins.a = args[0];
        if (args.size() > 1) ins.b = args[1];
        if (args.size() > 2) ins.c = args[2];
        static const std::map<Op, Code> codes = {
            {Op::Cast, Code::Cast}, {Op::Neg, Code::Neg},   {Op::Exp, Code::Exp},         {Op::Log, Code::Log},
            {Op::Tanh, Code::Tanh}, {Op::Abs, Code::Abs},   {Op::Sign, Code::Sign},       {Op::Sqrt, Code::Sqrt},
            {Op::Sin, Code::Sin},   {Op::Cos, Code::Cos},   {Op::Erf, Code::Erf},         {Op::Floor, Code::Floor},
            {Op::Ceil, Code::Ceil}, {Op::Round, Code::Round}, {Op::Pow, Code::Pow},
            {Op::Add, Code::Add},   {Op::Sub, Code::Sub},         {Op::Mul, Code::Mul},
            {Op::Div, Code::Div},   {Op::Maximum, Code::Max}, {Op::Minimum, Code::Min}, {Op::Eq, Code::Eq},
            {Op::Ne, Code::Ne},     {Op::Lt, Code::Lt},     {Op::Le, Code::Le},           {Op::Gt, Code::Gt},
            {Op::Ge, Code::Ge},     {Op::Where, Code::Where}};
        auto it = codes.find(n.op);
        if (it == codes.end()) fail("lower", std::string("no lowering for primitive ") + ir::op_name(n.op), *n.scope);
        ins.code = it->second;
        emit(st, ins);
        return finish(std::move(st), i);
      }
    }
  }

  // Outputs whose value is a view, a constant or a parameter get a Copy Step into their slot.
  void copy_out(int node, int out) { vals[node] = copy_to_slot(node, node, kir::SlotKind::Output, out); }

};

}  // namespace

Plan lower(const ir::Graph& g, const std::vector<ir::NodePtr>& params) {
  Lowerer L(g);
  for (size_t p = 0; p < params.size(); ++p) {
    L.param_slot.push_back(L.new_slot(kir::SlotKind::Param, int(p), params[p]->shape, params[p]->dtype));
    L.param_of.emplace(params[p].get(), int(p));
  }
  L.plan.slots_of_params = L.param_slot;
  for (size_t k = 0; k < g.outputs.size(); ++k) L.output_of_node.emplace(g.outputs[k], int(k));
  L.vals.resize(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) L.vals[i] = L.lower_node(int(i));
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
    if (plan.steps[s].output == oslot) producer = s;
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
