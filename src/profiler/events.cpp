// Profiler::events(): the records (runtime/profiler_records.h) as a list of events in time order,
// each executed Step described with its source ops (export.h).
#include <algorithm>

#include "profiler/export.h"
#include "runtime/profiler_records.h"

namespace tessera {

std::vector<ProfileEvent> Profiler::events() const {
  namespace prof = runtime::prof;
  const Data d = prof::snapshot(*d_);
  profiler::Described desc;
  std::vector<std::pair<int64_t, ProfileEvent>> ev;  // (sort key, event)
  auto rel = [&](int64_t t) { return double(t - d.t_start) / 1e3; };
  for (auto& s : d.syncs) {
    ProfileEvent e;
    e.type = "sync", e.name = s.what, e.device = "host";
    e.start_us = rel(s.t0), e.dur_us = double(s.t1 - s.t0) / 1e3;
    ev.push_back({s.t0 * 4 + 0, std::move(e)});
  }
  for (auto& r : d.regions) {
    ProfileEvent e;
    e.type = r.r == prof::Region::Compile ? "compile" : "runtime";
    e.name = prof::region_name(r.r), e.device = "host";
    if (r.compile >= 0) e.detail = d.compiles[size_t(r.compile)].why;
    e.start_us = rel(r.t0), e.dur_us = double(r.t1 - r.t0) / 1e3;
    ev.push_back({r.t0 * 4 + 1, std::move(e)});
  }
  for (auto& s : d.steps) {
    const auto& run = d.runs[size_t(s.run)];
    const profiler::StepInfo& si = desc.at(run.plan.get(), s.index);
    ProfileEvent e;
    e.type = "step", e.name = si.name, e.device = run.device, e.kind = si.kind, e.shape = si.shape, e.scope = si.scope;
    e.graph = s.run, e.step = s.index;
    e.start_us = rel(s.t0), e.dur_us = double(s.t1 - s.t0) / 1e3;
    e.flops = si.flops, e.bytes = si.bytes, e.ops = si.ops;
    ev.push_back({s.t0 * 4 + 2, std::move(e)});
  }
  std::stable_sort(ev.begin(), ev.end(), [](auto& a, auto& b) { return a.first < b.first; });
  std::vector<ProfileEvent> out;
  for (auto& [k, e] : ev) out.push_back(std::move(e));
  return out;
}

}  // namespace tessera
