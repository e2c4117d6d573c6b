// Profiler::chrome_trace(): the records as Chrome Trace Event JSON (Perfetto, chrome://tracing):
// complete ("X") slices in microseconds on one process with a track for the host (runtime
// regions, compiles with their reason, host syncs), one per device (graph runs and their Steps,
// each with its kind, shape, cost and source ops) and one for module scopes (nested slices over
// the runs of consecutive Steps whose dominant module path lies inside them).
#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "profiler/export.h"
#include "runtime/profiler_records.h"

namespace tessera {
namespace {

namespace prof = runtime::prof;
using json = nlohmann::ordered_json;  // keys in the order written, as trace viewers print them

constexpr int kHost = 1, kModules = 2, kDevice0 = 10;  // track ids

// Nanoseconds as microseconds (printed exactly with up to three decimals: n / 1000 is the nearest
// double to itself and prints as its shortest form).
double us(int64_t ns) { return double(std::max<int64_t>(ns, 0)) / 1000; }
double finite(double x) { return std::isfinite(x) ? x : 0.0; }

class TraceWriter {
 public:
  explicit TraceWriter(const Profiler::Data& d) : d_(d) {}

  std::string write() {
    metadata();
    host();
    runs();
    steps_and_scopes();
    json out;
    out["displayTimeUnit"] = "ms";
    out["otherData"] = {{"producer", "tessera profiler"}, {"wall_ms", double(d_.t_stop - d_.t_start) / 1e6}};
    out["traceEvents"] = std::move(events_);
    return out.dump() + "\n";
  }

 private:
  const Profiler::Data& d_;
  json events_ = json::array();
  std::vector<std::string> devices_;  // in order of first run
  profiler::Described desc_;

  void slice(const std::string& name, const char* cat, int tid, int64_t t0, int64_t t1, json args = nullptr) {
    json e = {{"name", name}, {"cat", cat}, {"ph", "X"}, {"pid", 1}, {"tid", tid}, {"ts", us(t0 - d_.t_start)}, {"dur", us(t1 - t0)}};
    if (!args.is_null()) e["args"] = std::move(args);
    events_.push_back(std::move(e));
  }

  void meta(const char* what, int tid, json args) {
    events_.push_back({{"name", what}, {"ph", "M"}, {"pid", 1}, {"tid", tid}, {"args", std::move(args)}});
  }

  void thread_name(int tid, const std::string& name, int order) {
    meta("thread_name", tid, {{"name", name}});
    meta("thread_sort_index", tid, {{"sort_index", order}});
  }

  int tid_of(const std::string& device) const {
    return kDevice0 + int(std::find(devices_.begin(), devices_.end(), device) - devices_.begin());
  }

  void metadata() {
    meta("process_name", 0, {{"name", "tessera"}});
    thread_name(kHost, "host (runtime, compiles, syncs)", 0);
    for (auto& r : d_.runs)
      if (std::find(devices_.begin(), devices_.end(), r.device) == devices_.end()) devices_.push_back(r.device);
    for (size_t i = 0; i < devices_.size(); ++i) thread_name(kDevice0 + int(i), "device " + devices_[i] + " (Steps)", 1 + int(i));
    thread_name(kModules, "module scopes", 100);
  }

  void host() {
    for (auto& s : d_.syncs) slice(s.what + "()", "sync", kHost, s.t0, s.t1);
    for (auto& r : d_.regions) {
      const bool compile = r.r == prof::Region::Compile;
      json args = nullptr;
      if (r.compile >= 0) args = {{"reason", d_.compiles[size_t(r.compile)].why}, {"nodes", d_.compiles[size_t(r.compile)].nodes}};
      slice(compile ? "compile" : std::string("<runtime> ") + prof::region_name(r.r), compile ? "compile" : "runtime", kHost,
            r.t0, r.t1, std::move(args));
    }
  }

  void runs() {
    for (size_t k = 0; k < d_.runs.size(); ++k) {
      auto& r = d_.runs[k];
      slice("graph " + std::to_string(k) + " (" + std::to_string(r.plan->steps.size()) + " Steps)", "graph", tid_of(r.device),
            r.t0, std::max(r.t1, r.t0), {{"graph", k}});
    }
  }

  // Each Step's slice; module scopes as nested slices, one per run of consecutive Steps whose
  // dominant module path has it.
  void steps_and_scopes() {
    struct Open {
      std::string path;
      int64_t t0, t1;
    };
    std::vector<Open> stack;
    auto close_to = [&](size_t depth) {
      for (; stack.size() > depth; stack.pop_back()) slice(stack.back().path, "module", kModules, stack.back().t0, stack.back().t1);
    };
    int last_run = -1;
    for (auto& s : d_.steps) {
      auto& run = d_.runs[size_t(s.run)];
      const profiler::StepInfo& si = desc_.at(run.plan.get(), s.index);
      slice(si.name, "step", tid_of(run.device), s.t0, s.t1, step_args(si, s.run, s.index));
      if (s.run != last_run) close_to(0);
      last_run = s.run;
      std::vector<std::string> comps;  // "a", "a.b", "a.b.c"
      for (size_t p = 0; !si.scope.empty(); p = si.scope.find('.', p) + 1) {
        size_t dot = si.scope.find('.', p);
        comps.push_back(si.scope.substr(0, dot));
        if (dot == std::string::npos) break;
      }
      size_t common = 0;
      while (common < stack.size() && common < comps.size() && stack[common].path == comps[common]) ++common;
      close_to(common);
      for (size_t i = common; i < comps.size(); ++i) stack.push_back({comps[i], s.t0, s.t1});
      for (auto& o : stack) o.t1 = s.t1;
    }
    close_to(0);
  }

  static json step_args(const profiler::StepInfo& si, int run, int index) {
    json ops = json::array();
    for (auto& o : si.ops) ops.push_back({{"op", o.op}, {"scope", o.scope}, {"share", finite(o.share)}});
    return {{"kind", si.kind}, {"shape", si.shape}, {"graph", run}, {"step", index},
            {"flops", finite(si.flops)}, {"bytes", finite(si.bytes)}, {"ops", std::move(ops)}};
  }
};

}  // namespace

std::string Profiler::chrome_trace() const { return TraceWriter(prof::snapshot(*d_)).write(); }

void Profiler::write_chrome_trace(const std::string& path) const { profiler::write_file(path, chrome_trace(), "Chrome trace"); }

}  // namespace tessera
