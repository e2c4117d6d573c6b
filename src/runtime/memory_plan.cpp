// The compiler's memory plan in public terms (tessera/memory.h's MemoryPlan) and its report.
#include <algorithm>
#include <cstdio>
#include <set>
#include <sstream>

#include "runtime/memory_plan.h"

#include "compiler/lower.h"
#include "core/fail.h"
#include "runtime/compile_options.h"
#include "tessera/memory.h"

namespace tessera {
namespace {

std::string human(size_t b) {
  if (b < 1024) return std::to_string(b) + " B";
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = double(b) / 1024;
  int u = 0;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

std::string step_text(const kir::Step& st) {
  std::string ops, scopes;
  std::set<std::string> seen_ops, seen_scopes;
  for (auto& s : st.sources) {
    if (seen_ops.insert(s.op).second) ops += (ops.empty() ? "" : "+") + s.op;
    if (!s.scope.empty() && seen_scopes.insert(s.scope).second) scopes += (scopes.empty() ? "" : ", ") + s.scope;
  }
  std::string t = std::string(kir::step_kind_name(st.kind)) + " " + dtype_short(st.dtype) + shape_str(st.shape) + ": " + ops;
  if (!scopes.empty()) t += " in " + scopes;
  return t;
}

}  // namespace

MemoryPlan runtime::memory_plan_of(const compiler::Plan& plan) {
  MemoryPlan m;
  const size_t ns = plan.slots.size();
  std::vector<int> first(ns, -1), last(ns, -1);
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const kir::Step& st = plan.steps[s];
    for (int o : st.outputs()) {
      if (first[o] < 0) first[o] = int(s);
      last[o] = int(s);
    }
    for (int x : st.inputs) last[x] = int(s);
  }
  static const char* kinds[] = {"param", "output", "temp"};
  std::vector<int> index(ns, -1);  // slot -> buffers
  for (size_t k = 0; k < ns; ++k) {
    const kir::Slot& sl = plan.slots[k];
    if (sl.kind != kir::SlotKind::Param && first[k] < 0) continue;  // an output slot donation left unused
    PlannedBuffer b;
    b.kind = kinds[int(sl.kind)];
    b.shape = sl.shape;
    b.dtype = sl.dtype;
    b.bytes = sl.nbytes;
    b.offset = sl.kind == kir::SlotKind::Temp ? sl.offset : 0;
    b.first_step = sl.kind == kir::SlotKind::Param ? -1 : first[k];
    b.last_step = last[k];
    b.op = sl.source.op;
    b.scope = sl.source.scope;
    if (sl.kind == kir::SlotKind::Param) m.param_bytes += sl.nbytes;
    if (sl.kind == kir::SlotKind::Output) m.output_bytes += sl.nbytes;
    index[k] = int(m.buffers.size());
    m.buffers.push_back(std::move(b));
  }
  m.peak_bytes = plan.memory.peak_bytes;
  m.peak_step = plan.memory.peak_step;
  if (m.peak_step >= 0) m.peak_step_text = step_text(plan.steps[size_t(m.peak_step)]);
  std::vector<int> live = plan.memory.live_at_peak;
  std::stable_sort(live.begin(), live.end(), [&](int a, int b) { return plan.slots[a].nbytes > plan.slots[b].nbytes; });
  for (int k : live) m.live_at_peak.push_back(m.buffers[size_t(index[k])]);
  m.arena_bytes = plan.arena_bytes;
  m.max_live_temp_bytes = plan.memory.max_live_temp_bytes;
  m.num_steps = int(plan.steps.size());
  m.step_bytes = plan.memory.step_bytes;
  m.budget_bytes = plan.memory.budget_bytes;
  m.natural_step_bytes = plan.memory.natural_step_bytes;
  m.recomputed_steps = plan.memory.recomputed_steps;
  m.recompute_flops = plan.memory.recompute_flops;
  m.unstacked_slices = plan.memory.unstacked_slices;
  m.unstacked_nodes = plan.memory.unstacked_nodes;
  m.unstacked = plan.memory.unstacked;
  m.accumulated_in_place = plan.memory.accumulated_in_place;
  m.device_report = plan.device_memory;
  return m;
}

std::string MemoryPlan::report(size_t max_buffers) const {
  if (num_steps == 0) return "memory plan: nothing to compute\n";
  std::ostringstream os;
  os << "peak " << human(peak_bytes) << " at step " << peak_step << " of " << num_steps << " (" << peak_step_text << ")\n";
  size_t by_kind[3] = {0, 0, 0};
  for (auto& b : live_at_peak) by_kind[b.kind == "param" ? 0 : b.kind == "output" ? 1 : 2] += b.bytes;
  os << live_at_peak.size() << " live buffers: params " << human(by_kind[0]) << ", outputs " << human(by_kind[1])
     << ", temps " << human(by_kind[2]) << (live_at_peak.empty() ? "" : "; largest:") << "\n";
  for (size_t i = 0; i < live_at_peak.size() && i < max_buffers; ++i) {
    const PlannedBuffer& b = live_at_peak[i];
    os << "  " << b.kind << " " << dtype_short(b.dtype) << shape_str(b.shape) << " " << human(b.bytes) << " " << b.op;
    if (!b.scope.empty()) os << " in " << b.scope;
    if (b.kind != "param") os << ", steps " << b.first_step << "-" << b.last_step;
    os << "\n";
  }
  os << "arena " << human(arena_bytes) << " for temporaries (at most " << human(max_live_temp_bytes)
     << " live at once); the run allocates " << human(run_bytes()) << "\n";
  if (budget_bytes)
    os << "budget " << human(budget_bytes) << ": the step needs " << human(step_bytes) << " (" << human(natural_step_bytes)
       << " before the budget passes); " << recomputed_steps << " Steps recomputed (" << recompute_flops / 1e6
       << " Mflop more)\n";
  if (unstacked_slices) os << "unstacked: " << unstacked << "\n";
  if (accumulated_in_place) os << "accumulated in place: " << accumulated_in_place << " Steps add into their running sum's buffer\n";
  if (!device_report.empty()) os << "on the device: " << device_report << "\n";
  return os.str();
}

MemoryBudget MemoryBudget::parse(const std::string& text) {
  MemoryBudget b;
  if (text.empty() || text == "none") return b;
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  static const std::pair<const char*, double> units[] = {{"", 1},           {"B", 1},           {"KB", 1e3},
                                                         {"MB", 1e6},       {"GB", 1e9},        {"KiB", 1024.0},
                                                         {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
  const double* scale = nullptr;
  for (auto& [name, f] : units)
    if (unit == name) scale = &f;
  if (used == 0 || !scale || !(v > 0))
    fail("memory", "cannot read the memory budget '" + text + "': give bytes (200MB, 1.5GiB, 1048576) or a fraction of the natural peak (0.5)", "");
  if (unit.empty() && v <= 1) b.fraction = v;
  else b.bytes = size_t(v * *scale);
  if (b.none()) fail("memory", "the memory budget '" + text + "' is zero bytes", "");
  return b;
}

std::string MemoryBudget::str() const {
  if (bytes) return std::to_string(bytes) + " B";
  if (fraction > 0) return std::to_string(fraction) + " of the natural peak";
  return "none";
}

MemoryBudget memory_budget() {
  compiler::Options o = runtime::compile_options();
  return {o.memory_budget, o.memory_budget_fraction};
}

MemoryBudgetScope::MemoryBudgetScope(const MemoryBudget& budget) : previous_(memory_budget()) {
  runtime::set_memory_budget(budget.bytes, budget.fraction);
}

MemoryBudgetScope::~MemoryBudgetScope() { runtime::set_memory_budget(previous_.bytes, previous_.fraction); }

}  // namespace tessera
