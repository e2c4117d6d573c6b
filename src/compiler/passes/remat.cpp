// Rematerialization (a budget pass, "remat"): a temporary live across the peak Step without being
// read there (an activation the backward pass reads) is dropped after its last read before the
// peak and recomputed by a copy of its producing Step right before its first read after it. The
// copy needs the producer's inputs unchanged and already live there (parameters, or temporaries
// whose own lifetime reaches that far), so it adds no other live bytes. Candidates are priced by
// the producer's cost (flops + bytes, the cost rules' figures) per byte taken off the peak,
// cheapest first: elementwise, copy and full-output row Steps (normalizations) first; GEMMs only
// when allow_gemm is set (no other candidate is left). Copies are marked in their sources
// ("recompute:<op>"), so dumps and the profiler show them under their module paths.
#include <algorithm>
#include <limits>

#include "compiler/passes/passes.h"

namespace tessera::compiler {
namespace {

struct Lifetimes {
  std::vector<int> first, last;          // per slot: first write, last use (-1: none)
  std::vector<std::vector<int>> readers;  // per slot: Steps reading it, in order
  std::vector<int> writes;               // per slot: how many Steps write it
};

Lifetimes lifetimes(const Plan& plan) {
  const size_t ns = plan.slots.size();
  Lifetimes L{std::vector<int>(ns, -1), std::vector<int>(ns, -1), std::vector<std::vector<int>>(ns), std::vector<int>(ns, 0)};
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const kir::Step& st = plan.steps[s];
    for (int o : st.outputs()) {
      if (L.first[o] < 0) L.first[o] = int(s);
      L.last[o] = std::max(L.last[o], int(s));
      ++L.writes[o];
    }
    for (int x : st.inputs) {
      L.last[x] = std::max(L.last[x], int(s));
      if (L.readers[x].empty() || L.readers[x].back() != int(s)) L.readers[x].push_back(int(s));
    }
  }
  return L;
}

bool recomputable(const kir::Step& st, bool allow_gemm) {
  if (!st.more_outputs.empty()) return false;
  switch (st.kind) {
    case kir::StepKind::Elementwise:
    case kir::StepKind::Copy: return true;
    case kir::StepKind::Row: return numel(st.shape) == numel(st.domain);  // a normalization's output, not per-row statistics
    case kir::StepKind::Gemm: return allow_gemm;
    default: return false;
  }
}

struct Candidate {
  int slot = -1, producer = -1, at = -1;  // the temporary, its Step, the first reader after the peak
  double price = std::numeric_limits<double>::infinity();
};

// The cheapest temporary to recompute across the peak Step, if any.
Candidate cheapest(const Plan& plan, const Lifetimes& L, int peak, bool allow_gemm) {
  Candidate best;
  for (size_t t = 0; t < plan.slots.size(); ++t) {
    const kir::Slot& sl = plan.slots[t];
    if (sl.kind != kir::SlotKind::Temp || L.first[t] < 0 || L.first[t] >= peak || L.last[t] <= peak || L.writes[t] != 1) continue;
    const std::vector<int>& rd = L.readers[t];
    if (std::find(rd.begin(), rd.end(), peak) != rd.end()) continue;  // read at the peak: needed there
    const int producer = L.first[t];
    const kir::Step& st = plan.steps[size_t(producer)];
    if (st.output != int(t) || !recomputable(st, allow_gemm)) continue;
    const int at = *std::upper_bound(rd.begin(), rd.end(), peak);
    bool inputs_live = true;  // unchanged and live at `at` without extending any lifetime
    for (int x : st.inputs) {
      const kir::SlotKind k = plan.slots[size_t(x)].kind;
      // Written once at most (a parameter: by a donated update, after its last read).
      bool rewritten = L.writes[x] > 1 || (L.first[x] > producer && L.first[x] <= at);
      if (rewritten || (k == kir::SlotKind::Temp && L.last[x] < at)) inputs_live = false;
    }
    if (!inputs_live) continue;
    const double price = (st.cost.flops + st.cost.bytes) / double(std::max<size_t>(sl.nbytes, 1));
    if (price < best.price) best = {int(t), producer, at, price};
  }
  return best;
}

// A copy of the producer into a new temporary right before `at`; readers from `at` on read it.
void recompute(Plan& plan, const Candidate& c) {
  kir::Step copy = plan.steps[size_t(c.producer)];
  kir::Slot slot = plan.slots[size_t(c.slot)];
  const int fresh = int(plan.slots.size());
  plan.slots.push_back(slot);
  copy.output = fresh;
  for (int& x : copy.inputs)  // a GEMM's epilogue reads its own product
    if (x == c.slot) x = fresh;
  for (kir::Source& s : copy.sources) s.op = "recompute:" + s.op;
  for (size_t s = size_t(c.at); s < plan.steps.size(); ++s) plan.steps[s].rename_reads(c.slot, fresh);
  plan.steps.insert(plan.steps.begin() + c.at, std::move(copy));
}

}  // namespace

void rematerialize(Plan& plan, const Options& opts, size_t budget, bool allow_gemm) {
  Plan best = plan;  // the smallest step bytes seen: a recomputation can move the peak without lowering it
  for (int round = 0; round < 1024 && plan.memory.step_bytes > budget && plan.memory.peak_step >= 0; ++round) {
    Candidate c = cheapest(plan, lifetimes(plan), plan.memory.peak_step, allow_gemm);
    if (c.slot < 0) break;
    MemoryInfo before = plan.memory;
    before.recompute_flops += plan.steps[size_t(c.producer)].cost.flops;
    ++before.recomputed_steps;
    recompute(plan, c);
    plan_memory(plan, opts);
    plan.memory.recompute_flops = before.recompute_flops;
    plan.memory.recomputed_steps = before.recomputed_steps;
    plan.memory.budget_bytes = before.budget_bytes;
    plan.memory.natural_step_bytes = before.natural_step_bytes;
    if (plan.memory.step_bytes < best.memory.step_bytes) best = plan;
  }
  if (best.memory.step_bytes < plan.memory.step_bytes) plan = std::move(best);
}

}  // namespace tessera::compiler
