#include <algorithm>

#include "compiler/passes/passes.h"

namespace tessera::compiler {
namespace {
constexpr size_t kAlign = 64;
size_t padded(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

// Best-fit placement of temporaries in one arena by lifetime (first write to last read). With
// the pass disabled each temporary gets bytes of its own.
void plan_memory(Plan& plan) {
  size_t ns = plan.slots.size();
  std::vector<int> first(ns, -1), last(ns, -1);
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const kir::Step& st = plan.steps[s];
    for (int o : st.outputs()) {
      if (first[o] < 0) first[o] = int(s);
      last[o] = std::max(last[o], int(s));
    }
    for (int x : st.inputs) last[x] = std::max(last[x], int(s));
  }
  bool reuse = pass_enabled("memplan");
  std::vector<std::pair<size_t, size_t>> free_list;  // (offset, size), sorted by offset
  size_t end = 0;
  auto release = [&](size_t off, size_t sz) {
    free_list.push_back({off, sz});
    std::sort(free_list.begin(), free_list.end());
    std::vector<std::pair<size_t, size_t>> merged;
    for (auto& f : free_list) {
      if (!merged.empty() && merged.back().first + merged.back().second == f.first) merged.back().second += f.second;
      else merged.push_back(f);
    }
    free_list = merged;
  };
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    for (int out : plan.steps[s].outputs()) {
    kir::Slot& sl = plan.slots[out];
    if (sl.kind == kir::SlotKind::Temp && first[out] == int(s)) {
      size_t need = padded(sl.nbytes);
      int best = -1;
      for (size_t f = 0; f < free_list.size(); ++f)
        if (free_list[f].second >= need && (best < 0 || free_list[f].second < free_list[best].second)) best = int(f);
      if (best >= 0) {
        sl.offset = free_list[best].first;
        free_list[best].first += need;
        free_list[best].second -= need;
      } else {
        sl.offset = end;
        end += need;
      }
    }
    }
    if (reuse)
      for (size_t k = 0; k < ns; ++k)
        if (plan.slots[k].kind == kir::SlotKind::Temp && last[k] == int(s) && first[k] >= 0)
          release(plan.slots[k].offset, padded(plan.slots[k].nbytes));
  }
  plan.arena_bytes = end;

  // Peak of live bytes over the program: parameters throughout, outputs from their first
  // write, temporaries between first write and last read.
  MemoryInfo& m = plan.memory;
  m = {};
  size_t params = 0;
  for (auto& sl : plan.slots)
    if (sl.kind == kir::SlotKind::Param) params += sl.nbytes;
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    size_t live = params, temps = 0;
    for (size_t k = 0; k < ns; ++k) {
      const kir::Slot& sl = plan.slots[k];
      if (sl.kind == kir::SlotKind::Output && first[k] >= 0 && first[k] <= int(s)) live += sl.nbytes;
      if (sl.kind == kir::SlotKind::Temp && first[k] >= 0 && first[k] <= int(s) && last[k] >= int(s)) temps += sl.nbytes;
    }
    live += temps;
    m.max_live_temp_bytes = std::max(m.max_live_temp_bytes, temps);
    if (live > m.peak_bytes || m.peak_step < 0) {
      m.peak_bytes = live;
      m.peak_step = int(s);
    }
  }
  if (m.peak_step >= 0)
    for (size_t k = 0; k < ns; ++k) {
      const kir::Slot& sl = plan.slots[k];
      bool live = sl.kind == kir::SlotKind::Param ||
                  (first[k] >= 0 && first[k] <= m.peak_step && (sl.kind == kir::SlotKind::Output || last[k] >= m.peak_step));
      if (live) m.live_at_peak.push_back(int(k));
    }
}

}  // namespace tessera::compiler
