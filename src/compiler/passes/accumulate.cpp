// In-place accumulation (a budget pass, "accumulate"; budget.cpp runs it on the plans it tries).
// A sum whose running value is a temporary that dies at the add is written into the add's own
// output buffer instead of a fresh one:
//   - a Gemm Step whose epilogue only adds such a temporary x (out = A @ B + x) becomes out +=
//     A @ B (Step::accumulate; only for a target declaring Target::gemm_accumulate);
//   - an Elementwise Step that reads such an x only at the element it writes (x + y) reads it
//     from its output buffer, as a donated update does (every backend runs those).
// Either way x's slot is renamed to the Step's output slot in every Step before it, so x's
// producer already writes the output buffer. Unstacked weight gradients, a chain of such adds
// over the slices, then accumulate in their output buffer, not in two running temporaries
// beside it. Safe because x has the output's bytes and dtype, no Step after the add reads x, and
// no Step before the add reads or writes the output slot (each slot has one writer until here).
#include <algorithm>

#include "compiler/passes/passes.h"

namespace tessera::compiler {
namespace {

using kir::Code;
using kir::Instr;
using kir::Step;
using kir::StepKind;

// A load of element p of its buffer at position p of a domain of `shape` (row-major, dense).
bool flat(const Instr& in, const Shape& shape) {
  return in.map.is_contiguous() && in.map.views[0].offset == 0 && in.map.shape() == shape;
}

// The temporary a Gemm Step's epilogue adds to the product (out = A @ B + x), or -1.
int gemm_addend(const Step& st) {
  if (st.program.size() != 3 || st.inputs.size() != 4) return -1;
  const Instr &a = st.program[0], &b = st.program[1], &sum = st.program[2];
  if (a.code != Code::Load || b.code != Code::Load || sum.code != Code::Add || sum.dtype != st.dtype) return -1;
  if (!((sum.a == 0 && sum.b == 1) || (sum.a == 1 && sum.b == 0))) return -1;
  const int sa = st.inputs[size_t(a.input)], sb = st.inputs[size_t(b.input)];
  if ((sa == st.output) == (sb == st.output)) return -1;  // one load of the product, one of x
  // Both at the same flat position: the epilogue's domain is the product's positions, maybe
  // reshaped (a conv's [B, O, H, W] over its product [B, G, O/G, H * W]).
  const Instr& load_x = sa == st.output ? b : a;
  const Shape& dom = a.map.shape();
  if (numel(dom) != numel(st.shape) || !flat(a, dom) || !flat(b, dom) || load_x.dtype != st.dtype) return -1;
  const int x = sa == st.output ? sb : sa;
  if (x == st.inputs[0] || x == st.inputs[1]) return -1;
  return x;
}

// The inputs an Elementwise Step reads only at the element it writes, in its dtype (each could
// be written over), when it does not read its own output slot (a donated update's parameter).
std::vector<int> elementwise_addends(const Plan& plan, const Step& st) {
  std::vector<int> xs;
  if (std::count(st.inputs.begin(), st.inputs.end(), st.output)) return xs;
  for (size_t k = 0; k < st.inputs.size(); ++k) {
    const int x = st.inputs[k];
    if (plan.slots[size_t(x)].dtype != st.dtype || std::count(st.inputs.begin(), st.inputs.end(), x) != 1) continue;
    bool ok = true;
    for (const Instr& in : st.program)
      if (in.code == Code::Load && in.input == int(k)) ok = ok && flat(in, st.shape) && in.dtype == st.dtype;
    if (ok) xs.push_back(x);
  }
  return xs;
}

}  // namespace

int accumulate_in_place(Plan& plan, const kir::Target& target) {
  const size_t n = plan.steps.size();
  // Per slot: the last Step reading it, and the first reading or writing it (a renamed slot's
  // first touch becomes its replacement's).
  std::vector<int> last_read(plan.slots.size(), -1), first_touch(plan.slots.size(), int(n));
  for (size_t s = n; s-- > 0;) {
    for (int x : plan.steps[s].inputs) {
      if (last_read[size_t(x)] < 0) last_read[size_t(x)] = int(s);
      first_touch[size_t(x)] = int(s);
    }
    for (int o : plan.steps[s].outputs()) first_touch[size_t(o)] = int(s);
  }
  int rewritten = 0;
  for (size_t s = 0; s < n; ++s) {
    Step& st = plan.steps[s];
    if (!st.more_outputs.empty() || st.accumulate || !st.out_strides.empty()) continue;
    std::vector<int> candidates;
    if (st.kind == StepKind::Gemm && target.gemm_accumulate) candidates = {gemm_addend(st)};
    else if (st.kind == StepKind::Elementwise) candidates = elementwise_addends(plan, st);
    const kir::Slot& os = plan.slots[size_t(st.output)];
    int x = -1;
    for (int c : candidates) {
      if (c < 0 || c == st.output || last_read[size_t(c)] != int(s)) continue;
      const kir::Slot& cs = plan.slots[size_t(c)];
      if (cs.kind == kir::SlotKind::Temp && cs.nbytes == os.nbytes && cs.dtype == os.dtype) {
        x = c;
        break;
      }
    }
    if (x < 0 || os.kind == kir::SlotKind::Param || first_touch[size_t(st.output)] < int(s)) continue;
    for (size_t t = size_t(first_touch[size_t(x)]); t < s; ++t) plan.steps[t].rename_slot(x, st.output);
    first_touch[size_t(st.output)] = first_touch[size_t(x)];
    if (st.kind == StepKind::Gemm) {
      st.inputs.resize(2);
      st.program.clear();
      st.accumulate = true;
    } else {
      std::replace(st.inputs.begin(), st.inputs.end(), x, st.output);
    }
    ++rewritten;
  }
  return rewritten;
}

}  // namespace tessera::compiler
