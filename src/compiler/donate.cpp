// Donation: an output written into the buffer of a parameter that dies with this graph (an
// in-place update's old value), decided after the Step passes so the final order is known.
#include <algorithm>

#include "compiler/lower.h"

namespace tessera::compiler {
namespace {

bool reads(const kir::Step& st, int slot) { return std::find(st.inputs.begin(), st.inputs.end(), slot) != st.inputs.end(); }

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
  const kir::Step& ps = plan.steps[producer];
  if (ps.kind != kir::StepKind::Elementwise && ps.kind != kir::StepKind::Copy) return false;
  for (const kir::Instr& in : ps.program)
    if (in.code == kir::Code::Load && ps.inputs[in.input] == pslot &&
        !(in.map.is_contiguous() && in.map.views[0].offset == 0 && in.map.shape() == ps.shape))
      return false;
  for (size_t s = producer + 1; s < plan.steps.size(); ++s)
    if (reads(plan.steps[s], pslot)) return false;
  for (kir::Step& st : plan.steps) {
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

void inplace_last(Plan& plan) {
  const size_t n = plan.steps.size();
  std::vector<bool> donated_slot(plan.slots.size(), false);
  for (size_t k = 0; k < plan.donated.size(); ++k)
    if (plan.donated[k] >= 0) donated_slot[plan.output_slot[k]] = true;
  // The Steps that write a donated buffer and everything after them that depends on them through
  // a slot (reads what they wrote, or writes what they read or wrote): moved after the rest, each
  // part in its order, which keeps every read-after-write, write-after-read and write-after-write.
  std::vector<bool> late(n, false), written(plan.slots.size(), false), touched(plan.slots.size(), false);
  for (size_t s = 0; s < n; ++s) {
    const kir::Step& st = plan.steps[s];
    std::vector<int> outs = st.outputs();
    bool is_late = false;
    for (int o : outs) is_late = is_late || donated_slot[o] || touched[o];
    for (int x : st.inputs) is_late = is_late || written[x];
    if (!is_late) continue;
    late[s] = true;
    for (int o : outs) written[o] = touched[o] = true;
    for (int x : st.inputs) touched[x] = true;
  }
  std::vector<kir::Step> order;
  order.reserve(n);
  for (int pass = 0; pass < 2; ++pass)
    for (size_t s = 0; s < n; ++s)
      if (late[s] == (pass == 1)) order.push_back(std::move(plan.steps[s]));
  plan.steps = std::move(order);
}

}  // namespace tessera::compiler
