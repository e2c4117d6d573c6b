// Row statistics stored once per row (lowering.h, Lowerer::store_row_stats): a pending
// per-position Row expression that would be stored whole (read by several nodes and too heavy
// to recompute in each, or the operand of a Reduce Step, which holds no row reductions) keeps
// its per-position part pending and stores only the row-constant values it reads (a layer
// norm's mean and 1/sd, a softmax's maximum), one value per row, from one Row Step. Every
// pending expression holding those values then loads them instead (the backward pass's reads of
// the forward's statistics too), and `merge_rows` joins the statistics' Step into the Row or
// elementwise Step that reads them: a layer norm's forward is one Row Step storing y and its two
// statistics, its backward's input gradient one Row Step.
#include <algorithm>

#include "compiler/lowering.h"

namespace tessera::compiler::lowering {

using kir::Code;
using kir::IndexMap;
using kir::Instr;
using kir::Step;
using kir::StepKind;

namespace {

bool reduction(Code c) { return c == Code::RowSum || c == Code::RowMax; }

// Whether a load reads one value per row: its single view does not move along the row (the
// trailing dims of `eval` whose extents multiply to `row`).
bool per_row_load(const Instr& in, const Shape& eval, int64_t row) {
  if (in.map.views.size() != 1 || in.map.views[0].masked() || in.map.shape() != eval) return false;
  const kir::View& v = in.map.views[0];
  int64_t inner = 1;
  for (size_t d = eval.size(); d-- > 0 && inner < row;) {
    inner *= eval[d];
    if (eval[d] != 1 && v.strides[d] != 0) return false;
  }
  return true;
}

// f rewritten over `base` (f's instructions are base's or new ones: pasting f onto a copy of base
// finds them): those at a statistic of base (stat_of >= 0) become its load; then only what f's
// result reads is kept. Returns f unchanged when it holds no statistic.
Frag with_stats(const Frag& base, const std::vector<int>& stat_of, const std::vector<Instr>& loads, const Frag& f, bool* changed) {
  Frag scratch = base;
  const size_t n0 = base.ins.size(), n = f.ins.size();
  std::vector<int> load_of(n, -1);
  std::vector<int> pos(n);
  *changed = false;
  for (size_t k = 0; k < n; ++k) {
    Instr in = f.ins[k];
    for (int* o : {&in.a, &in.b, &in.c})
      if (*o >= 0) *o = pos[size_t(*o)];
    pos[k] = scratch.add(in);
    if (size_t(pos[k]) < n0 && stat_of[size_t(pos[k])] >= 0) load_of[k] = stat_of[size_t(pos[k])], *changed = true;
  }
  if (!*changed) return f;
  std::vector<uint8_t> live(n, 0);
  live[n - 1] = 1;
  for (size_t k = n; k-- > 0;) {
    if (!live[k] || load_of[k] >= 0) continue;
    for (int o : {f.ins[k].a, f.ins[k].b, f.ins[k].c})
      if (o >= 0) live[size_t(o)] = 1;
  }
  Frag r;
  std::vector<int> at(n, -1);
  for (size_t k = 0; k < n; ++k) {
    if (!live[k]) continue;
    Instr in = load_of[k] >= 0 ? loads[size_t(load_of[k])] : f.ins[k];
    if (load_of[k] < 0)
      for (int* o : {&in.a, &in.b, &in.c})
        if (*o >= 0) *o = at[size_t(*o)];
    at[k] = r.add(in);
  }
  if (at[n - 1] != int(r.ins.size()) - 1) r.ins.push_back(r.ins[size_t(at[n - 1])]);  // the result stays last
  return r;
}

}  // namespace

bool Lowerer::store_row_stats(int node) {
  const Val v = vals[size_t(node)];
  if (!fuse || v.kind != Val::Expr || v.row <= 1 || v.rowconst || v.positional) return false;
  const std::vector<Instr>& ins = v.frag.ins;
  const size_t n = ins.size();
  // Row-constant instructions (rc), and those computed from a row reduction (dep).
  std::vector<uint8_t> rc(n, 0), dep(n, 0);
  for (size_t k = 0; k < n; ++k) {
    const Instr& in = ins[k];
    if (reduction(in.code)) {
      rc[k] = dep[k] = 1;
    } else if (in.code == Code::Const) {
      rc[k] = 1;
    } else if (in.code == Code::Load) {
      rc[k] = per_row_load(in, v.eval, v.row);
    } else if (in.code != Code::Iota && in.code != Code::Rng) {
      rc[k] = 1;
      for (int o : {in.a, in.b, in.c})
        if (o >= 0) rc[k] &= rc[size_t(o)], dep[k] |= dep[size_t(o)];
    }
  }
  // The statistics: row-constant values from a reduction that a per-position instruction reads.
  std::vector<int> stats, stat_of(n, -1);
  for (size_t k = 0; k < n; ++k) {
    if (rc[k]) continue;
    for (int o : {ins[k].a, ins[k].b, ins[k].c})
      if (o >= 0 && rc[size_t(o)] && dep[size_t(o)] && stat_of[size_t(o)] < 0) stat_of[size_t(o)] = 0, stats.push_back(o);
  }
  if (stats.empty()) return false;
  std::sort(stats.begin(), stats.end());
  for (int s : stats) {  // stored exactly as computed (a narrower type would round them)
    const DType t = ins[size_t(s)].dtype;
    if ((t != DType::Float32 && t != DType::Float64) || compute_dtype(t) != t) return false;
  }
  Shape per_row = v.eval;  // the statistics' shape: the row's dims at 1
  int64_t inner = 1;
  for (size_t d = per_row.size(); d-- > 0 && inner < v.row;) inner *= per_row[d], per_row[d] = 1;
  if (inner != v.row) return false;
  // Their Step: what they read, in order; the last statistic is the main output.
  std::vector<uint8_t> need(n, 0);
  for (int s : stats) need[size_t(s)] = 1;
  for (size_t k = n; k-- > 0;)
    if (need[k])
      for (int o : {ins[k].a, ins[k].b, ins[k].c})
        if (o >= 0) need[size_t(o)] = 1;
  Frag sf;
  std::vector<int> at(n, -1);
  for (size_t k = 0; k <= size_t(stats.back()); ++k) {
    if (!need[k]) continue;
    Instr in = ins[k];
    for (int* o : {&in.a, &in.b, &in.c})
      if (*o >= 0) *o = at[size_t(*o)];
    at[k] = sf.add(in);
  }
  // The nodes of one value per row are the statistics' (their cost and name), the rest stay.
  std::vector<int> stat_nodes, rest;
  for (int k : v.nodes) (numel(g.nodes[size_t(k)]->shape) * v.row == numel(v.eval) ? stat_nodes : rest).push_back(k);
  const int self = stat_nodes.empty() ? node : stat_nodes.front();
  Step st = begin(StepKind::Row, self);
  st.domain = v.eval;
  st.row = v.row;
  st.shape = per_row;
  st.dtype = ins[size_t(stats.back())].dtype;
  set_program(st, sf);
  attribute(st, stat_nodes, self);
  const kir::Source src{ir::op_name(g.nodes[size_t(self)]->op), *g.nodes[size_t(self)]->scope};
  std::vector<Instr> loads;
  std::vector<int> slots;
  for (size_t j = 0; j < stats.size(); ++j) {
    const DType t = ins[size_t(stats[j])].dtype;
    slots.push_back(new_slot(kir::SlotKind::Temp, 0, per_row, t, src));
    stat_of[size_t(stats[j])] = int(j);
    loads.push_back(Instr::load(slots.back(), t, IndexMap::contiguous(per_row).expand(v.eval)));
  }
  st.output = slots.back();
  for (size_t j = 0; j + 1 < stats.size(); ++j) {
    st.more_outputs.push_back(slots[j]);
    st.more_results.push_back(at[size_t(stats[j])]);
  }
  plan.steps.push_back(std::move(st));
  // Every pending expression over these rows that computes a statistic now loads it; a
  // row-constant node whose value is one becomes its slot.
  for (size_t k = 0; k < vals.size(); ++k) {
    Val& u = vals[k];
    if (u.kind != Val::Expr || u.row != v.row || u.eval != v.eval || u.positional) continue;
    bool changed = false;
    Frag f = with_stats(v.frag, stat_of, loads, u.frag, &changed);
    if (!changed) continue;
    if (u.rowconst && f.ins.size() == 1 && f.ins[0].code == Code::Load && numel(g.nodes[k]->shape) * v.row == numel(v.eval)) {
      u = slot_val(f.ins[0].input, g.nodes[k]->shape);
      continue;
    }
    u.frag = std::move(f);
    if (!u.rowconst && !u.frag.has(Code::RowSum) && !u.frag.has(Code::RowMax)) u.row = 0;  // no longer a Row expression
    std::vector<int> keep;
    for (int x : u.nodes)
      if (std::find(stat_nodes.begin(), stat_nodes.end(), x) == stat_nodes.end()) keep.push_back(x);
    u.nodes = std::move(keep);
  }
  return true;
}

}  // namespace tessera::compiler::lowering
