// The memory budget (Options::memory_budget, memory_budget_fraction): after the memory plan, the
// plan's step bytes (parameters + outputs + arena) must fit the budget. The budget passes that
// lower them run here, each re-planning memory: rematerialization (remat.cpp: elementwise and
// normalization outputs, then GEMMs) on the plan, and batch unstacking (unstack.cpp: the graph
// rewritten into k sequential slices and built again), followed by rematerialization when the
// slices alone fall short. Of the plans that meet the budget the cheapest by the cost rules (the
// Steps' flops + bytes) wins; when none does, the compile fails before anything runs, naming the
// smallest figure reached, the Step at the peak and the largest buffers live there with their
// module paths.
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

// What a plan costs to run by the cost rules: every Step's flops plus the bytes it moves.
double plan_cost(const Plan& plan) {
  double c = 0;
  for (const kir::Step& st : plan.steps) c += st.cost.flops + st.cost.bytes;
  return c;
}

void meet_budget(Plan& plan, const ir::Graph& g, const Options& opts, const OptionsPlanBuilder& build, std::optional<ir::Graph>* rewritten) {
  const size_t natural = plan.memory.step_bytes;
  const size_t budget = resolve_budget(opts, natural);
  if (!budget) return;
  plan.memory.natural_step_bytes = natural;
  plan.memory.budget_bytes = budget;
  if (plan.memory.step_bytes <= budget) return;
  const double base_cost = plan_cost(plan);
  // Saved values (GELU's derivative, ir/saved.h) are a speed choice that costs live bytes: over
  // the budget they are fused into their readers again (the backward recomputes them from the
  // op's input), which leaves rematerialization and unstacking their usual candidates.
  Options recomputing = opts;
  recomputing.disabled.insert("saved");
  const PlanBuilder build_recomputing = [&](const ir::Graph& x, const std::vector<int>& store) { return build(x, store, recomputing); };
  if (opts.enabled("saved")) {
    plan = build_recomputing(g, {});
    if (plan.memory.step_bytes <= budget) {
      plan.memory.natural_step_bytes = natural;
      plan.memory.budget_bytes = budget;
      plan.memory.extra_cost = plan_cost(plan) - base_cost;
      return;
    }
  }
  // In-place accumulation costs nothing (the same Steps), so every candidate starts from it.
  auto in_place = [&](Plan& p) {
    if (!opts.enabled("accumulate")) return;
    if (const int n = accumulate_in_place(p, opts.target)) {
      plan_memory(p, opts);
      p.memory.accumulated_in_place = n;
    }
  };
  const PlanBuilder build_in_place = [&](const ir::Graph& x, const std::vector<int>& store) {
    Plan p = build_recomputing(x, store);
    in_place(p);
    return p;
  };
  // Candidates, each a plan and (for unstacking) its graph: in-place accumulation alone;
  // rematerialization on the plan; unstacking, then rematerialization on its plan when the
  // slices alone fall short. Of those meeting the budget the one whose Steps cost least (flops +
  // bytes by the cost rules) wins; none meeting it: the smallest step bytes, for the error.
  struct Candidate {
    Plan plan;
    std::optional<ir::Graph> graph;
    Unstacked* un = nullptr;
  };
  auto remat = [&](Plan& p) {
    const int accumulated = p.memory.accumulated_in_place;  // re-planning resets the memory info
    rematerialize(p, opts, budget, false);  // elementwise and normalization outputs first
    if (p.memory.step_bytes > budget) rematerialize(p, opts, budget, true);  // then GEMMs too
    p.memory.accumulated_in_place = accumulated;
  };
  std::vector<Candidate> cands;
  std::optional<Unstacked> un;
  Plan accumulated = plan;
  in_place(accumulated);
  if (accumulated.memory.accumulated_in_place) cands.push_back({accumulated, std::nullopt, nullptr});
  if (opts.enabled("remat")) {
    cands.push_back({accumulated, std::nullopt, nullptr});
    remat(cands.back().plan);
  }
  if (opts.enabled("unstack")) un = unstack(g, budget, natural, build_in_place);
  if (un) {
    Plan p = un->plan;
    if (p.memory.step_bytes > budget && opts.enabled("remat")) remat(p);
    cands.push_back({std::move(p), un->graph, &*un});
  }
  std::string tried = "no budget pass applies";
  if (cands.empty()) unreachable(plan, budget, tried);
  const Candidate* best = nullptr;
  for (const Candidate& c : cands) {
    const bool fits = c.plan.memory.step_bytes <= budget;
    if (!best) best = &c;
    else if (fits && (best->plan.memory.step_bytes > budget || plan_cost(c.plan) < plan_cost(best->plan))) best = &c;
    else if (!fits && best->plan.memory.step_bytes > budget && c.plan.memory.step_bytes < best->plan.memory.step_bytes) best = &c;
  }
  plan = best->plan;
  plan.memory.natural_step_bytes = natural;
  plan.memory.budget_bytes = budget;
  plan.memory.extra_cost = plan_cost(plan) - base_cost;
  if (best->un) {
    plan.memory.unstacked_slices = best->un->slices;
    plan.memory.unstacked_nodes = best->un->nodes;
    plan.memory.unstacked = best->un->what;
    *rewritten = best->graph;
  }
  tried.clear();
  if (un) tried = "after unstacking " + un->what;
  if (opts.enabled("remat"))
    tried += (tried.empty() ? "" : " and ") + std::string("after recomputing ") + std::to_string(plan.memory.recomputed_steps) + " Steps";
  if (tried.empty()) tried = "no budget pass applies";
  if (plan.memory.step_bytes <= budget) return;
  unreachable(plan, budget, tried);
}

}  // namespace tessera::compiler
