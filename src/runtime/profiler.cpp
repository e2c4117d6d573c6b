// tessera::Profiler: recording hooks (profiler_impl.h), attribution of fused Steps to their source
// ops, the op table, the Chrome trace, and the memory viewer page.
#include "tessera/profiler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>

#include "compiler/lower.h"
#include "ir/primitives.h"
#include "runtime/profiler_impl.h"
#include "core/fail.h"

namespace tessera {

namespace prof = runtime::prof;

struct Profiler::Data {
  struct RegionRec {
    prof::Region r;
    int64_t t0, t1;
    int compile;  // Compile: index into compiles
  };
  struct CompileRec {
    std::string why;
    int64_t nodes;
  };
  struct RunRec {
    std::shared_ptr<const compiler::Plan> plan;
    std::string device;
    int64_t t0, t1;
  };
  struct StepRec {
    int run, index;
    int64_t t0, t1;
  };
  struct SyncRec {
    std::string what;
    int64_t t0, t1;
  };
  bool recording = false;
  int64_t t_start = 0, t_stop = 0;
  prof::Region cur = prof::Region::Trace;
  int64_t cur_t0 = 0;
  int sync_depth = 0;
  int open_compile = -1;
  std::vector<RegionRec> regions;
  std::vector<CompileRec> compiles;
  std::vector<RunRec> runs;
  std::vector<StepRec> steps;
  std::vector<SyncRec> syncs;

  void close_region(int64_t t) {
    if (t > cur_t0) regions.push_back({cur, cur_t0, t, cur == prof::Region::Compile ? open_compile : -1});
    cur_t0 = std::max(cur_t0, t);
  }
};

namespace runtime::prof {

std::atomic<bool> g_on{false};

namespace {
std::mutex g_mu;
Profiler::Data* g_active = nullptr;  // under g_mu
}  // namespace

const char* region_name(Region r) {
  static const char* names[] = {"trace", "graph", "lookup", "compile", "launch", "copy"};
  return names[int(r)];
}

void mark_at(Region next, int64_t t) {
  std::lock_guard<std::mutex> lock(g_mu);
  Profiler::Data* d = g_active;
  if (!d) return;
  if (next == Region::Trace && d->sync_depth > 0) next = Region::Copy;  // still inside item()/to_vector()
  d->close_region(t);
  d->cur = next;
}
void mark(Region next) { mark_at(next, now_ns()); }

void compile_begin(const std::string& why, int64_t nodes) {
  int64_t t = now_ns();
  std::lock_guard<std::mutex> lock(g_mu);
  Profiler::Data* d = g_active;
  if (!d) return;
  d->close_region(t);
  d->compiles.push_back({why, nodes});
  d->open_compile = int(d->compiles.size()) - 1;
  d->cur = Region::Compile;
}

int begin_run(std::shared_ptr<const compiler::Plan> plan, const std::string& device) {
  int64_t t = now_ns();
  std::lock_guard<std::mutex> lock(g_mu);
  Profiler::Data* d = g_active;
  if (!d) return -1;
  d->close_region(t);
  d->cur = Region::Launch;
  d->runs.push_back({std::move(plan), device, t, t});
  return int(d->runs.size()) - 1;
}

void step(int run, int index, int64_t t0, int64_t t1) {
  std::lock_guard<std::mutex> lock(g_mu);
  Profiler::Data* d = g_active;
  if (!d || run >= int(d->runs.size())) return;
  d->close_region(t0);  // the bookkeeping before this Step
  d->steps.push_back({run, index, t0, t1});
  d->cur_t0 = std::max(d->cur_t0, t1);  // the region goes on after it
}

void end_run(int run) {
  int64_t t = now_ns();
  std::lock_guard<std::mutex> lock(g_mu);
  Profiler::Data* d = g_active;
  if (!d || run < 0 || run >= int(d->runs.size())) return;
  d->runs[size_t(run)].t1 = t;
}

void sync_begin(const char* what) {
  int64_t t = now_ns();
  std::lock_guard<std::mutex> lock(g_mu);
  Profiler::Data* d = g_active;
  if (!d) return;
  d->close_region(t);
  d->cur = Region::Graph;
  d->syncs.push_back({what, t, -1});
  d->sync_depth++;
}

void sync_end() {
  int64_t t = now_ns();
  std::lock_guard<std::mutex> lock(g_mu);
  Profiler::Data* d = g_active;
  if (!d) return;
  d->close_region(t);
  d->cur = Region::Trace;
  for (auto it = d->syncs.rbegin(); it != d->syncs.rend(); ++it)
    if (it->t1 < 0) {
      it->t1 = t;
      break;
    }
  if (d->sync_depth > 0) d->sync_depth--;
}

}  // namespace runtime::prof

namespace {

// ---- attribution of a Step to its source ops ----

struct StepInfo {
  std::string name, kind, shape, scope;
  std::vector<ProfiledOp> ops;
  double flops = 0, bytes = 0;
};

StepInfo describe(const kir::Step& st) {
  StepInfo si;
  si.kind = kir::step_kind_name(st.kind);
  si.shape = std::string(dtype_short(st.dtype)) + shape_str(st.shape);
  si.flops = st.cost.flops;
  si.bytes = st.cost.bytes;
  // Each source op's share is its flops by its own cost rule (Source::flops, summing to the
  // Step's flops): exact as far as the cost rules are; equal shares when no source has flops.
  std::vector<double> w(st.sources.size(), 0);
  double total = 0;
  for (size_t i = 0; i < st.sources.size(); ++i) total += (w[i] = st.sources[i].flops);
  for (size_t i = 0; i < st.sources.size(); ++i)
    si.ops.push_back({st.sources[i].op, st.sources[i].scope,
                      total > 0 ? w[i] / total : 1.0 / double(st.sources.size())});
  // Dominant module path: the largest share (ties: the first seen).
  std::vector<std::pair<std::string, double>> by_scope;
  for (auto& o : si.ops) {
    auto it = std::find_if(by_scope.begin(), by_scope.end(), [&](auto& p) { return p.first == o.scope; });
    if (it == by_scope.end()) by_scope.push_back({o.scope, o.share});
    else it->second += o.share;
  }
  double best = -1;
  for (auto& [s, x] : by_scope)
    if (x > best + 1e-12) best = x, si.scope = s;
  std::string ops;
  std::set<std::string> seen;
  bool any_weight = total > 0;
  for (size_t i = 0; i < si.ops.size(); ++i)
    if (si.ops[i].scope == si.scope && (!any_weight || w[i] > 0) && seen.insert(si.ops[i].op).second)
      ops += (ops.empty() ? "" : "+") + si.ops[i].op;
  si.name = (si.scope.empty() ? std::string("<top>") : si.scope) + ": " + ops;
  return si;
}

// Step descriptions of every plan the profile ran, computed once per plan.
struct Described {
  std::unordered_map<const compiler::Plan*, std::vector<StepInfo>> plans;
  const StepInfo& at(const compiler::Plan* p, int index) {
    auto it = plans.find(p);
    if (it == plans.end()) {
      std::vector<StepInfo> v;
      for (const kir::Step& st : p->steps) v.push_back(describe(st));
      it = plans.emplace(p, std::move(v)).first;
    }
    return it->second[size_t(index)];
  }
};

std::string json_str(const std::string& s) {
  std::string r = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': r += "\\\""; break;
      case '\\': r += "\\\\"; break;
      case '\n': r += "\\n"; break;
      case '\t': r += "\\t"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          r += b;
        } else {
          r += char(c);
        }
    }
  }
  return r + "\"";
}

// Nanoseconds as microseconds with three decimals, exactly (so nested slices stay nested).
std::string us(int64_t ns) {
  if (ns < 0) ns = 0;
  char b[32];
  std::snprintf(b, sizeof b, "%lld.%03lld", (long long)(ns / 1000), (long long)(ns % 1000));
  return b;
}

std::string num(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", std::isfinite(x) ? x : 0.0);
  return b;
}

std::string html_escape(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == '<') r += "&lt;";
    else if (c == '>') r += "&gt;";
    else if (c == '&') r += "&amp;";
    else if (c == '"') r += "&quot;";
    else r += c;
  }
  return r;
}

std::string human(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", b, units[u]);
  return buf;
}

void write_file(const std::string& path, const std::string& text, const char* what) {
  std::ofstream f(path, std::ios::binary);
  if (!f) fail("profiler", std::string("cannot write the ") + what + " to '" + path + "'", "");
  f << text;
  f.close();
  if (!f) fail("profiler", std::string("writing the ") + what + " to '" + path + "' failed", "");
}

}  // namespace

// ---- Profiler ----

Profiler::Profiler(bool start_now) : d_(std::make_shared<Data>()) {
  if (start_now) start();
}
Profiler::~Profiler() { stop(); }

void Profiler::start() {
  std::lock_guard<std::mutex> lock(prof::g_mu);
  if (prof::g_active == d_.get()) fail("profiler", "start(): this profiler is already recording", "");
  if (prof::g_active) fail("profiler", "start(): another tessera::Profiler is recording; stop it first", "");
  *d_ = Data{};
  d_->recording = true;
  d_->t_start = d_->cur_t0 = prof::now_ns();
  prof::g_active = d_.get();
  prof::g_on.store(true, std::memory_order_relaxed);
}

void Profiler::stop() {
  std::lock_guard<std::mutex> lock(prof::g_mu);
  if (prof::g_active != d_.get()) return;
  prof::g_on.store(false, std::memory_order_relaxed);
  prof::g_active = nullptr;
  int64_t t = prof::now_ns();
  d_->close_region(t);
  for (auto& s : d_->syncs)
    if (s.t1 < 0) s.t1 = t;
  d_->t_stop = t;
  d_->recording = false;
}

bool Profiler::recording() const {
  std::lock_guard<std::mutex> lock(prof::g_mu);
  return d_->recording;
}

double Profiler::wall_ms() const {
  std::lock_guard<std::mutex> lock(prof::g_mu);
  int64_t end = d_->recording ? prof::now_ns() : d_->t_stop;
  return double(end - d_->t_start) / 1e6;
}

std::vector<ProfileEvent> Profiler::events() const {
  std::lock_guard<std::mutex> lock(prof::g_mu);
  const Data& d = *d_;
  Described desc;
  std::vector<std::pair<int64_t, ProfileEvent>> ev;
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
    const StepInfo& si = desc.at(run.plan.get(), s.index);
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

std::vector<OpTableRow> Profiler::op_table(const std::string& group) const {
  if (group != "kind" && group != "module" && group != "op")
    fail("profiler", "op_table: unknown group '" + group + "' (kind, module or op)", "");
  std::vector<ProfileEvent> ev = events();
  double wall = wall_ms();
  std::map<std::string, OpTableRow> rows;
  OpTableRow rt{group, "<runtime>"}, comp{group, "<compile>"};
  for (auto& e : ev) {
    if (e.type == "runtime") rt.ms += e.dur_us / 1e3, rt.calls++;
    if (e.type == "compile") comp.ms += e.dur_us / 1e3, comp.calls++;
    if (e.type != "step") continue;
    double ms = e.dur_us / 1e3;
    if (group == "kind") {
      OpTableRow& r = rows[e.kind];
      r.ms += ms, r.calls++, r.flops += e.flops, r.bytes += e.bytes;
      continue;
    }
    std::set<std::string> counted;
    for (auto& o : e.ops) {
      std::string scope = o.scope.empty() ? "(top level)" : o.scope;
      std::string key = group == "module" ? scope : o.op + " @ " + scope;
      OpTableRow& r = rows[key];
      r.ms += ms * o.share, r.flops += e.flops * o.share, r.bytes += e.bytes * o.share;
      if (counted.insert(key).second) r.calls++;
    }
  }
  std::vector<OpTableRow> out;
  for (auto& [k, r] : rows) {
    OpTableRow x = r;
    x.group = group, x.name = k;
    out.push_back(x);
  }
  out.push_back(rt);
  out.push_back(comp);
  for (auto& r : out) r.percent = wall > 0 ? 100 * r.ms / wall : 0;
  std::stable_sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.ms > b.ms; });
  return out;
}

std::string Profiler::table_text() const {
  std::vector<ProfileEvent> ev = events();
  double wall = wall_ms();
  int64_t nsteps = 0, nsync = 0;
  std::set<int> graphs;
  std::map<std::string, std::pair<double, int64_t>> regions;
  std::vector<std::string> compiles;
  for (auto& e : ev) {
    if (e.type == "step") nsteps++, graphs.insert(e.graph);
    if (e.type == "sync") nsync++;
    if (e.type == "runtime") regions[e.name].first += e.dur_us / 1e3, regions[e.name].second++;
    if (e.type == "compile") {
      char b[64];
      std::snprintf(b, sizeof b, "%.1f ms: ", e.dur_us / 1e3);
      compiles.push_back(b + e.detail);
    }
  }
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line, "profile: %.3f ms wall, %zu graph runs, %lld Steps, %lld host syncs, %zu compiles\n", wall,
                graphs.size(), (long long)nsteps, (long long)nsync, compiles.size());
  os << line
     << "fused Steps: time, flops and bytes split over their source ops by each op's flops from its cost rule\n"
        "(matmul 2mnk; elementwise and reduction ops one per element; movement, indexing and casts zero; equal\n"
        "split when all are zero). <runtime>: host time outside Steps and compiles, timed directly between clock\n"
        "readings; rows of each table sum to the wall time.\n";
  for (const char* g : {"kind", "module", "op"}) {
    std::vector<OpTableRow> rows = op_table(g);
    size_t w = 10;
    for (auto& r : rows) w = std::max(w, r.name.size());
    os << "\nby " << (std::string(g) == "kind" ? "Step kind" : std::string(g) == "module" ? "module path" : "op and module") << "\n";
    std::snprintf(line, sizeof line, "  %-*s %11s %7s %8s %11s %10s %9s\n", int(w), "name", "time ms", "%", "calls", "GFLOP",
                  "GFLOP/s", "GB/s");
    os << line;
    double sum = 0;
    for (auto& r : rows) {
      std::snprintf(line, sizeof line, "  %-*s %11.3f %7.2f %8lld %11.4f %10.2f %9.2f\n", int(w), r.name.c_str(), r.ms, r.percent,
                    (long long)r.calls, r.flops / 1e9, r.gflops_per_s(), r.gbytes_per_s());
      os << line;
      sum += r.ms;
    }
    std::snprintf(line, sizeof line, "  %-*s %11.3f %7.2f\n", int(w), "total", sum, wall > 0 ? 100 * sum / wall : 0);
    os << line;
  }
  os << "\n<runtime> breakdown:";
  for (auto& [n, v] : regions) {
    std::snprintf(line, sizeof line, " %s %.3f ms (%lld);", n.c_str(), v.first, (long long)v.second);
    os << line;
  }
  os << "\n";
  if (!compiles.empty()) {
    os << "compiles:\n";
    for (auto& c : compiles) os << "  " << c << "\n";
  }
  return os.str();
}

std::string Profiler::table_csv() const {
  std::ostringstream os;
  os << "group,name,ms,calls,flops,bytes,gflops_per_s,gbytes_per_s,percent\n";
  auto csv = [](const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string r = "\"";
    for (char c : s) r += c == '"' ? std::string("\"\"") : std::string(1, c);
    return r + "\"";
  };
  for (const char* g : {"kind", "module", "op"})
    for (auto& r : op_table(g))
      os << r.group << "," << csv(r.name) << "," << num(r.ms) << "," << r.calls << "," << num(r.flops) << "," << num(r.bytes)
         << "," << num(r.gflops_per_s()) << "," << num(r.gbytes_per_s()) << "," << num(r.percent) << "\n";
  return os.str();
}

std::string Profiler::chrome_trace() const {
  std::lock_guard<std::mutex> lock(prof::g_mu);
  const Data& d = *d_;
  Described desc;
  std::vector<std::string> ev;
  auto rel = [&](int64_t t) { return t - d.t_start; };
  auto slice = [&](const std::string& name, const char* cat, int tid, int64_t t0, int64_t t1, const std::string& args) {
    ev.push_back("{\"name\":" + json_str(name) + ",\"cat\":\"" + cat + "\",\"ph\":\"X\",\"pid\":1,\"tid\":" + std::to_string(tid) +
                 ",\"ts\":" + us(rel(t0)) + ",\"dur\":" + us(t1 - t0) + (args.empty() ? "" : ",\"args\":{" + args + "}") + "}");
  };
  auto thread_name = [&](int tid, const std::string& name, int order) {
    ev.push_back("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":" + std::to_string(tid) + ",\"args\":{\"name\":" +
                 json_str(name) + "}}");
    ev.push_back("{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":" + std::to_string(tid) +
                 ",\"args\":{\"sort_index\":" + std::to_string(order) + "}}");
  };
  ev.push_back("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"name\":\"tessera\"}}");
  const int kHost = 1, kModules = 2, kDevice0 = 10;
  thread_name(kHost, "host (runtime, compiles, syncs)", 0);
  std::vector<std::string> devices;
  for (auto& r : d.runs)
    if (std::find(devices.begin(), devices.end(), r.device) == devices.end()) devices.push_back(r.device);
  for (size_t i = 0; i < devices.size(); ++i) thread_name(kDevice0 + int(i), "device " + devices[i] + " (Steps)", 1 + int(i));
  thread_name(kModules, "module scopes", 100);
  auto tid_of = [&](const std::string& dev) {
    return kDevice0 + int(std::find(devices.begin(), devices.end(), dev) - devices.begin());
  };

  for (auto& s : d.syncs) slice(s.what + "()", "sync", kHost, s.t0, s.t1 < 0 ? d.t_stop : s.t1, "");
  for (auto& r : d.regions) {
    std::string args;
    if (r.compile >= 0)
      args = "\"reason\":" + json_str(d.compiles[size_t(r.compile)].why) + ",\"nodes\":" + std::to_string(d.compiles[size_t(r.compile)].nodes);
    slice(r.r == prof::Region::Compile ? "compile" : std::string("<runtime> ") + prof::region_name(r.r),
          r.r == prof::Region::Compile ? "compile" : "runtime", kHost, r.t0, r.t1, args);
  }
  for (size_t k = 0; k < d.runs.size(); ++k) {
    auto& r = d.runs[k];
    slice("graph " + std::to_string(k) + " (" + std::to_string(r.plan->steps.size()) + " Steps)", "graph", tid_of(r.device), r.t0,
          std::max(r.t1, r.t0), "\"graph\":" + std::to_string(k));
  }
  // Module scopes: nested slices, one per run of consecutive Steps whose dominant path has it.
  struct Open {
    std::string path;
    int64_t t0, t1;
  };
  std::vector<Open> stack;
  auto close_to = [&](size_t depth) {
    while (stack.size() > depth) {
      slice(stack.back().path, "module", kModules, stack.back().t0, stack.back().t1, "");
      stack.pop_back();
    }
  };
  int last_run = -1;
  for (auto& s : d.steps) {
    auto& run = d.runs[size_t(s.run)];
    const StepInfo& si = desc.at(run.plan.get(), s.index);
    std::string ops;
    for (auto& o : si.ops)
      ops += std::string(ops.empty() ? "" : ",") + "{\"op\":" + json_str(o.op) + ",\"scope\":" + json_str(o.scope) +
             ",\"share\":" + num(o.share) + "}";
    slice(si.name, "step", tid_of(run.device), s.t0, s.t1,
          "\"kind\":" + json_str(si.kind) + ",\"shape\":" + json_str(si.shape) + ",\"graph\":" + std::to_string(s.run) +
              ",\"step\":" + std::to_string(s.index) + ",\"flops\":" + num(si.flops) + ",\"bytes\":" + num(si.bytes) +
              ",\"ops\":[" + ops + "]");
    if (s.run != last_run) close_to(0);
    last_run = s.run;
    std::vector<std::string> comps;
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
  std::string out = "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"tessera profiler\",\"wall_ms\":" + num(double((d.recording ? prof::now_ns() : d.t_stop) - d.t_start) / 1e6) +
                    "},\"traceEvents\":[\n";
  for (size_t i = 0; i < ev.size(); ++i) out += ev[i] + (i + 1 < ev.size() ? ",\n" : "\n");
  return out + "]}\n";
}

void Profiler::write_chrome_trace(const std::string& path) const { write_file(path, chrome_trace(), "Chrome trace"); }
void Profiler::write_table_csv(const std::string& path) const { write_file(path, table_csv(), "op table"); }

// ---- memory viewer ----

std::string memory_viewer_html(const MemoryPlan& plan, const std::string& title) {
  const auto& B = plan.buffers;
  const int n = std::max(plan.num_steps, 1);
  // Vertical placement: params then outputs stacked for the whole run, temporaries above them at
  // their arena offsets.
  std::vector<double> y0(B.size()), x0(B.size()), x1(B.size());
  double base = 0;
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < B.size(); ++i)
      if ((pass == 0 && B[i].kind == "param") || (pass == 1 && B[i].kind == "output")) {
        y0[i] = base, x0[i] = 0, x1[i] = n;
        base += double(B[i].bytes);
      }
  double top = base;
  for (size_t i = 0; i < B.size(); ++i)
    if (B[i].kind == "temp") {
      y0[i] = base + double(B[i].offset);
      x0[i] = std::max(B[i].first_step, 0);
      x1[i] = std::max(B[i].last_step, B[i].first_step) + 1;
      top = std::max(top, y0[i] + double(B[i].bytes));
    }
  std::vector<double> live(size_t(n), base);
  for (auto& b : B)
    if (b.kind == "temp")
      for (int s = std::max(b.first_step, 0); s <= b.last_step && s < n; ++s) live[size_t(s)] += double(b.bytes);
  top = std::max({top, double(plan.peak_bytes), 1.0}) * 1.05;
  const double W = 1100, H = 480, L = 80, T = 20;
  auto X = [&](double s) { return L + W * s / n; };
  auto Y = [&](double b) { return T + H - H * b / top; };
  std::ostringstream svg;
  svg.setf(std::ios::fixed);
  svg.precision(2);
  svg << "<svg id=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << L + W + 20 << "\" height=\"" << T + H + 50 << "\">\n";
  svg << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << W << "\" height=\"" << H << "\" fill=\"#fafafa\" stroke=\"#999\"/>\n";
  // Axes: ticks at round values (1, 2 or 5 times a power of ten; of MiB on the bytes axis) with
  // light grid lines.
  auto nice = [](double range, int want) {
    double raw = range / want, p = std::pow(10.0, std::floor(std::log10(raw)));
    for (double m : {1.0, 2.0, 5.0, 10.0})
      if (m * p >= raw) return m * p;
    return 10 * p;
  };
  const double MiB = 1048576.0, ystep = top >= MiB ? nice(top / MiB, 6) * MiB : nice(top, 6);
  for (double b = 0; b <= top; b += ystep) {
    svg << "<line x1=\"" << L << "\" y1=\"" << Y(b) << "\" x2=\"" << L + W << "\" y2=\"" << Y(b) << "\" stroke=\"#e4e4e4\"/>\n";
    svg << "<text class=\"ax\" x=\"" << L - 4 << "\" y=\"" << Y(b) + 4 << "\" text-anchor=\"end\">" << human(b) << "</text>\n";
  }
  const double xstep = std::max(1.0, nice(double(n), 8));
  for (double s = 0; s <= n; s += xstep)
    svg << "<text class=\"ax\" x=\"" << X(s) << "\" y=\"" << T + H + 16 << "\" text-anchor=\"middle\">" << int64_t(s) << "</text>\n";
  svg << "<text class=\"ax\" x=\"" << L + W / 2 << "\" y=\"" << T + H + 36 << "\" text-anchor=\"middle\">program order (Step)</text>\n";
  // A temporary's colour comes from its module and op (the legend below uses the same).
  auto colour = [](const PlannedBuffer& b) {
    unsigned h = 0;
    for (char c : b.scope + b.op) h = h * 31 + (unsigned char)c;
    return b.kind == "param" ? std::string("#b0b0b0") : b.kind == "output" ? std::string("#8fb3d9")
                                                                           : "hsl(" + std::to_string(h % 360) + ",60%,62%)";
  };
  svg << "<g id=\"buffers\">\n";
  for (size_t i = 0; i < B.size(); ++i) {
    const PlannedBuffer& b = B[i];
    bool peak = plan.peak_step >= 0 && (b.kind != "temp" || (b.first_step <= plan.peak_step && plan.peak_step <= b.last_step));
    std::string fill = colour(b);
    double hgt = std::max(Y(y0[i]) - Y(y0[i] + double(b.bytes)), 0.0);
    svg << "<rect class=\"buf" << (peak && b.kind == "temp" ? " peak" : "") << "\" data-i=\"" << i << "\" x=\"" << X(x0[i])
        << "\" y=\"" << Y(y0[i] + double(b.bytes)) << "\" width=\"" << std::max(X(x1[i]) - X(x0[i]), 0.5) << "\" height=\""
        << hgt << "\" fill=\"" << fill << "\"><title>" << html_escape(b.kind + " " + dtype_short(b.dtype) + shape_str(b.shape) + " " +
                                                                      b.op + (b.scope.empty() ? "" : " in " + b.scope))
        << "</title></rect>\n";
  }
  svg << "</g>\n";
  if (Y(0) - Y(base) >= 14)  // name the band of parameters and outputs when there is room
    svg << "<text class=\"ax\" x=\"" << L + 6 << "\" y=\"" << Y(base / 2) + 4 << "\">parameters and outputs, "
        << human(base) << ", live for the whole run</text>\n";
  svg << "<polyline id=\"live\" fill=\"none\" stroke=\"#222\" stroke-width=\"1.2\" points=\"";
  for (int s = 0; s < n; ++s) svg << X(s) << "," << Y(live[size_t(s)]) << " " << X(s + 1) << "," << Y(live[size_t(s)]) << " ";
  svg << "\"/>\n";
  if (plan.peak_step >= 0) {
    double px = X(plan.peak_step + 0.5), py = Y(double(plan.peak_bytes));
    svg << "<line id=\"peak\" x1=\"" << px << "\" y1=\"" << T << "\" x2=\"" << px << "\" y2=\"" << T + H
        << "\" stroke=\"#d00\" stroke-dasharray=\"4 3\"/>\n"
        << "<line x1=\"" << L << "\" y1=\"" << py << "\" x2=\"" << L + W << "\" y2=\"" << py
        << "\" stroke=\"#d00\" stroke-dasharray=\"4 3\"/>\n"
        << "<text x=\"" << std::min(px + 4, L + W - 300) << "\" y=\"" << std::max(py - 4, T + 12.0) << "\" fill=\"#d00\">peak "
        << human(double(plan.peak_bytes)) << " at step " << plan.peak_step << "</text>\n";
  }
  svg << "</svg>\n";

  // Legend: the largest temporaries live at the peak, each with its colour.
  std::ostringstream legend;
  legend << "<div id=\"legend\"><b>Largest temporaries at the peak</b>";
  int shown = 0;
  for (const PlannedBuffer& b : plan.live_at_peak) {
    if (b.kind != "temp" || shown == 8) continue;
    legend << "<div><span class=\"sw\" style=\"background:" << colour(b) << "\"></span>" << html_escape(human(double(b.bytes)))
           << " " << dtype_short(b.dtype) << html_escape(shape_str(b.shape)) << " " << html_escape(b.op)
           << (b.scope.empty() ? "" : " in " + html_escape(b.scope)) << "</div>";
    ++shown;
  }
  legend << "</div>\n";

  std::ostringstream data;
  data << "[";
  for (size_t i = 0; i < B.size(); ++i) {
    const PlannedBuffer& b = B[i];
    data << (i ? ",\n" : "") << "{\"kind\":" << json_str(b.kind) << ",\"shape\":" << json_str(shape_str(b.shape))
         << ",\"dtype\":" << json_str(dtype_name(b.dtype)) << ",\"bytes\":" << b.bytes << ",\"op\":" << json_str(b.op)
         << ",\"scope\":" << json_str(b.scope) << ",\"first\":" << b.first_step << ",\"last\":" << b.last_step
         << ",\"offset\":" << b.offset << "}";
  }
  data << "]";
  std::string data_js = data.str();
  // "</" cannot appear inside the inline script.
  for (size_t p = 0; (p = data_js.find("</", p)) != std::string::npos; p += 3) data_js.replace(p, 2, "<\\/");

  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" << html_escape(title) << "</title>\n<style>\n"
     << "body{font:13px sans-serif;margin:16px} .ax{font-size:11px;fill:#444} rect.buf{stroke:#fff;stroke-width:0.3}\n"
     << "rect.buf:hover{stroke:#000;stroke-width:1.5} rect.peak{stroke:#600;stroke-width:0.6}\n"
     << "#tip{position:fixed;display:none;background:#fff;border:1px solid #888;padding:6px;font:12px monospace;"
        "pointer-events:none;white-space:pre}\npre{background:#f4f4f4;padding:8px}\n"
        "#legend{margin:4px 0 8px 80px;font-size:12px;columns:2;max-width:1100px} #legend b{column-span:all;display:block}\n"
        ".sw{display:inline-block;width:11px;height:11px;margin-right:6px;vertical-align:-1px;border:1px solid #666}\n</style>\n"
     // Script errors are recorded on the page, so a headless check can see them.
     << "<script>window.onerror = function(m){ document.documentElement.setAttribute('data-error', String(m)); };</script>\n"
     << "</head><body>\n"
     << "<h3>" << html_escape(title) << "</h3>\n<p>" << B.size() << " buffers over " << plan.num_steps
     << " Steps: parameters (grey) and outputs (blue) for the whole run, temporaries at their arena offsets over their "
        "lifetimes (colour by module and op; dark outline: live at the peak). The black line is the live bytes. Hover a "
        "buffer for its shape, dtype, producing op and module.</p>\n"
     << svg.str() << "<div id=\"tip\"></div>\n" << legend.str() << "<pre id=\"report\">" << html_escape(plan.report(10)) << "</pre>\n"
     << "<script>\nconst buffers = " << data_js << ";\n"
     << "const tip = document.getElementById('tip');\n"
        "function human(b){const u=['B','KiB','MiB','GiB'];let i=0;while(b>=1024&&i<3){b/=1024;i++;}return b.toFixed(i?1:0)+' '+u[i];}\n"
        "document.querySelectorAll('rect.buf').forEach(function(r){\n"
        "  const b = buffers[+r.dataset.i];\n"
        "  r.addEventListener('mousemove', function(ev){\n"
        "    tip.textContent = b.kind + ' ' + b.dtype + b.shape + '  ' + human(b.bytes) + '\\nop: ' + b.op + '\\nmodule: ' +\n"
        "      (b.scope || '(top level)') + '\\nsteps: ' + (b.first < 0 ? 'start' : b.first) + ' - ' + b.last +\n"
        "      (b.kind == 'temp' ? '\\narena offset: ' + b.offset : '');\n"
        "    tip.style.display = 'block'; tip.style.left = (ev.clientX + 12) + 'px'; tip.style.top = (ev.clientY + 12) + 'px';\n"
        "  });\n"
        "  r.addEventListener('mouseleave', function(){ tip.style.display = 'none'; });\n"
        "});\n"
        "document.title = document.title + ' (' + buffers.length + ' buffers)';\n"
        "document.body.setAttribute('data-buffers', buffers.length);\n"
        "document.body.setAttribute('data-rects', document.querySelectorAll('rect.buf').length);\n</script>\n</body></html>\n";
  return os.str();
}

void write_memory_viewer(const std::string& path, const MemoryPlan& plan, const std::string& title) {
  write_file(path, memory_viewer_html(plan, title), "memory viewer");
}

}  // namespace tessera
