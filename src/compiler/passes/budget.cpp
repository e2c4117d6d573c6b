// The memory budget (Options::memory_budget, memory_budget_fraction): after the memory plan, the
// plan's step bytes (parameters + outputs + arena) must fit the budget. The budget passes that
// lower them run here, cheapest first, each re-planning memory, until the budget is met
// (rematerialization, remat.cpp: elementwise and normalization outputs, then GEMMs); when
// none is left the compile fails before anything runs, naming the smallest figure reached, the
// Step at the peak and the largest buffers live there with their module paths.
#include <algorithm>
#include <cstdio>

#include "compiler/passes/passes.h"
#include "core/fail.h"

namespace tessera::compiler {
namespace {

std::string slot_text(const kir::Slot& sl) {
  static const char* kinds[] = {"param", "output", "temp"};
  std::string t = std::string(kinds[int(sl.kind)]) + " " + dtype_short(sl.dtype) + shape_str(sl.shape) + " " + mib(sl.nbytes) +
                  " " + sl.source.op;
  if (!sl.source.scope.empty()) t += " in " + sl.source.scope;
  return t;
}

std::string step_sources(const kir::Step& st) {
  std::string t = std::string(kir::step_kind_name(st.kind)) + " " + dtype_short(st.dtype) + shape_str(st.shape);
  if (!st.sources.empty()) {
    t += ": " + st.sources.front().op;
    if (!st.sources.front().scope.empty()) t += " in " + st.sources.front().scope;
  }
  return t;
}

[[noreturn]] void unreachable(const Plan& plan, size_t budget, const std::string& tried) {
  const MemoryInfo& m = plan.memory;
  fail("memory", "the budget of " + mib(budget) + " cannot be met: the smallest step this compiler reaches needs " +
                     mib(m.step_bytes) + " (peak " + mib(m.peak_bytes) + ", arena " + mib(plan.arena_bytes) + "; " + tried + "), " +
                     describe_peak(plan),
       "");
}

}  // namespace

std::string mib(size_t b) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f MiB", double(b) / (1024.0 * 1024.0));
  return buf;
}

std::string describe_peak(const Plan& plan, size_t max_buffers) {
  const MemoryInfo& m = plan.memory;
  std::vector<int> live = m.live_at_peak;
  std::stable_sort(live.begin(), live.end(), [&](int a, int b) { return plan.slots[a].nbytes > plan.slots[b].nbytes; });
  std::string msg;
  if (m.peak_step >= 0) msg += "its peak at step " + std::to_string(m.peak_step) + " (" + step_sources(plan.steps[size_t(m.peak_step)]) + "); ";
  msg += "largest buffers live there:";
  for (size_t i = 0; i < live.size() && i < max_buffers; ++i) msg += (i ? "; " : " ") + slot_text(plan.slots[size_t(live[i])]);
  if (live.size() > max_buffers) msg += "; and " + std::to_string(live.size() - max_buffers) + " more";
  return msg;
}

size_t resolve_budget(const Options& opts, size_t natural) {
  if (opts.memory_budget) return opts.memory_budget;
  if (opts.memory_budget_fraction > 0) return size_t(opts.memory_budget_fraction * double(natural));
  return 0;
}

void meet_budget(Plan& plan, const Options& opts) {
  const size_t natural = plan.memory.step_bytes;
  const size_t budget = resolve_budget(opts, natural);
  if (!budget) return;
  plan.memory.natural_step_bytes = natural;
  plan.memory.budget_bytes = budget;
  if (plan.memory.step_bytes <= budget) return;
  std::string tried = "no budget pass applies";
  if (opts.enabled("remat")) {
    rematerialize(plan, opts, budget, false);  // elementwise and normalization outputs first
    if (plan.memory.step_bytes > budget) rematerialize(plan, opts, budget, true);  // then GEMMs too
    plan.memory.natural_step_bytes = natural;
    plan.memory.budget_bytes = budget;
    tried = "after recomputing " + std::to_string(plan.memory.recomputed_steps) + " Steps";
  }
  if (plan.memory.step_bytes <= budget) return;
  unreachable(plan, budget, tried);
}

}  // namespace tessera::compiler
