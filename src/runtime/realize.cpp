#include "runtime/realize.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "backends/backend.h"
#include "compiler/pipeline.h"
#include "runtime/allocator.h"
#include "runtime/compile_options.h"
#include "runtime/metrics_impl.h"
#include "runtime/profiler_impl.h"
#include "tessera/error.h"

namespace tessera::runtime {
namespace {

struct Executable {
  compiler::Plan plan;
  std::vector<std::unique_ptr<backends::Kernel>> kernels;
};

std::mutex g_mu;
std::unordered_map<std::string, std::shared_ptr<Executable>>& cache() {
  static auto* c = new std::unordered_map<std::string, std::shared_ptr<Executable>>();
  return *c;
}

// Why a graph missed the cache: for each op sequence seen before (ignoring shapes), the
// parameter signature it last compiled with, so a recompile can name the input that changed.
std::unordered_map<std::string, std::vector<std::pair<Shape, DType>>>& seen_structures() {
  static auto* m = new std::unordered_map<std::string, std::vector<std::pair<Shape, DType>>>();
  return *m;
}

std::string miss_reason(const ir::Graph& g, const Device& dev) {
  std::string ops = dev.str();
  for (auto& n : g.nodes) {
    ops += char(n->op);
    for (auto& i : n->inputs) ops += std::to_string(g.index.at(i.get())) + ",";
  }
  std::vector<std::pair<Shape, DType>> sig;
  for (int p : g.params) sig.push_back({g.nodes[p]->shape, g.nodes[p]->dtype});
  auto [it, fresh] = seen_structures().emplace(ops, sig);
  if (fresh) return "new graph structure (" + std::to_string(g.nodes.size()) + " nodes)";
  std::string why;
  for (size_t p = 0; p < sig.size() && p < it->second.size(); ++p) {
    auto& [s0, t0] = it->second[p];
    auto& [s1, t1] = sig[p];
    if (s0 != s1 || t0 != t1)
      why += (why.empty() ? "" : "; ") + std::string("input ") + std::to_string(p) + " changed from " + dtype_name(t0) +
             shape_str(s0) + " to " + dtype_name(t1) + shape_str(s1);
  }
  it->second = sig;
  return why.empty() ? "same ops with other shapes, constants or scopes" : why;
}

int64_t since_ns(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

// settings: the options in force (compile_options.h), completed here with the device's target.
std::shared_ptr<Executable> compile(const ir::Graph& g, const Device& dev, const std::vector<int>& donate,
                                    const compiler::Options& settings) {
  auto t0 = std::chrono::steady_clock::now();
  auto exe = std::make_shared<Executable>();
  backends::Backend& be = backends::backend_for(dev);
  compiler::Options opts = settings;
  opts.target = be.properties(dev.index);
  if (opts.dump.any()) opts.dump.graph = detail::next_dump_graph();
  exe->plan = compiler::compile_graph(g, donate, opts);
  for (const kir::Step& st : exe->plan.steps) exe->kernels.push_back(be.compile(st));
  device_counters(dev.kind).kernels_compiled += int64_t(exe->plan.steps.size());
  counters().graphs_compiled++;
  counters().compile_ns += since_ns(t0);
  return exe;
}

// Cache key: graph structure (g.key, moved: nothing reads it after the lookup) + device + which
// outputs may overwrite which parameters + the compile options that change the plan (the passes
// switched off, the arena guard: CompileSettings::key).
std::string cache_key(ir::Graph& g, const Device& dev, const std::vector<int>& donate, const std::string& options_key) {
  std::string k = std::move(g.key);
  k += '|';
  k += dev.str();
  k += '|';
  k += options_key;
  for (int d : donate) {
    k += '|';
    k += std::to_string(d);
  }
  return k;
}

struct Prepared {
  ir::Graph g;
  Device dev;
  std::shared_ptr<Executable> exe;
};

std::shared_ptr<Executable> g_last;  // the executable realize() ran last (under g_mu)
StepHook g_hook;
std::atomic<int64_t> g_guard_checked{0};

// Builds the graph, decides donations and finds or compiles its executable (for `target`
// instead of the nodes' device when given).
Prepared prepare(const std::vector<Request>& req, const Device* target = nullptr) {
  std::vector<ir::NodePtr> outs;
  for (auto& r : req) outs.push_back(r.node);
  if (prof::on()) prof::mark(prof::Region::Graph);
  Prepared p{ir::build_graph(outs), target ? *target : outs.front()->device, nullptr};
  if (prof::on()) prof::mark(prof::Region::Lookup);
  ir::Graph& g = p.g;
  const Device& dev = p.dev;

  // Donation: a request's old buffer whose only remaining owner is its leaf node in this graph.
  std::vector<int> donate(req.size(), -1);
  std::vector<bool> taken(g.params.size(), false);
  for (size_t k = 0; k < req.size(); ++k) {
    std::shared_ptr<Buffer> b = req[k].donor.lock();
    if (!b || b.use_count() != 2) continue;  // 2: the leaf node and `b`
    for (size_t p = 0; p < g.params.size(); ++p)
      if (!taken[p] && g.nodes[g.params[p]]->buffer == b && b->nbytes == size_t(outs[k]->numel()) * itemsize(outs[k]->dtype)) {
        donate[k] = int(p);
        taken[p] = true;
      }
  }

  std::shared_ptr<Executable>& exe = p.exe;
  const std::shared_ptr<const detail::CompileSettings> settings = detail::compile_settings();
  std::string key = cache_key(g, dev, donate, settings->key);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = cache().find(key);
    if (it != cache().end()) exe = it->second;
  }
  if (exe) {
    counters().cache_hits++;
  } else {
    std::string why;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      why = miss_reason(g, dev);
    }
    if (prof::on()) prof::compile_begin(why, int64_t(g.nodes.size()));
    exe = compile(g, dev, donate, settings->opts);
    if (prof::on()) prof::mark(prof::Region::Lookup);
    std::lock_guard<std::mutex> lock(g_mu);
    cache()[key] = exe;
    record_compile(why);
  }
  return p;
}

// Guard mode: the guard byte ranges [begin, end) around temporary slot s, in arena offsets.
std::vector<std::pair<size_t, size_t>> guard_ranges(const kir::Slot& sl, size_t guard, size_t align) {
  size_t padded_end = sl.offset + (sl.nbytes + align - 1) / align * align;
  return {{sl.offset - guard, sl.offset}, {sl.offset + sl.nbytes, padded_end + guard}};
}

std::string step_label(const compiler::Plan& plan, size_t s) {
  return "step " + std::to_string(s) + " of " + std::to_string(plan.steps.size()) + " (" + plan.steps[s].str() + ")";
}

}  // namespace

std::shared_ptr<const compiler::Plan> compile_only(const std::vector<Request>& req, const Device* target) {
  if (req.empty()) return nullptr;
  Prepared p = prepare(req, target);
  if (prof::on()) prof::mark(prof::Region::Trace);
  return std::shared_ptr<const compiler::Plan>(p.exe, &p.exe->plan);
}

std::shared_ptr<const compiler::Plan> last_executed_plan() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_last) return nullptr;
  return std::shared_ptr<const compiler::Plan>(g_last, &g_last->plan);
}

void clear_compile_cache() {
  std::lock_guard<std::mutex> lock(g_mu);
  cache().clear();
  seen_structures().clear();
}

int64_t guard_bytes_checked() { return g_guard_checked; }
void set_after_step_hook(StepHook hook) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_hook = std::move(hook);
}

std::vector<std::shared_ptr<Buffer>> realize(const std::vector<Request>& req, RngArgs rng) {
  Prepared prep = prepare(req);
  const ir::Graph& g = prep.g;
  const Device& dev = prep.dev;
  std::shared_ptr<Executable> exe = prep.exe;
  StepHook hook;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_last = exe;
    hook = g_hook;
  }
  backends::Backend& be = backends::backend_for(dev);
  if (!be.can_execute())
    fail("sync", "device '" + dev.str() + "' compiles graphs but cannot run them (graph of " +
                     std::to_string(g.nodes.size()) + " nodes compiled to " + std::to_string(exe->plan.steps.size()) +
                     " steps)", "");

  auto t0 = std::chrono::steady_clock::now();
  const compiler::Plan& plan = exe->plan;
  // Profiling: each Step is waited for and timed; the bookkeeping around it is Launch time.
  const int prof_run = prof::on() ? prof::begin_run(std::shared_ptr<const compiler::Plan>(exe, &exe->plan), dev.str()) : -1;
  std::vector<std::shared_ptr<Buffer>> results(req.size());
  std::vector<void*> slots(plan.slots.size(), nullptr);
  std::shared_ptr<Buffer> arena = plan.arena_bytes ? allocate(dev, plan.arena_bytes) : nullptr;
  for (size_t s = 0; s < plan.slots.size(); ++s) {
    const kir::Slot& sl = plan.slots[s];
    if (sl.kind == kir::SlotKind::Param) slots[s] = g.nodes[g.params[sl.index]]->buffer->data;
    if (sl.kind == kir::SlotKind::Temp && arena) slots[s] = static_cast<char*>(arena->data) + sl.offset;
  }
  for (size_t k = 0; k < req.size(); ++k) {
    int s = plan.output_slot[k];
    if (plan.donated[k] >= 0) {
      results[k] = g.nodes[g.params[plan.donated[k]]]->buffer;
    } else {
      results[k] = allocate(dev, plan.slots[s].nbytes);
      slots[s] = results[k]->data;
    }
  }
  backends::LaunchArgs args{slots.data(), rng.seed, rng.offset, dev.index};
  static const bool time_steps = std::getenv("TESSERA_STEP_TIMES") != nullptr;
  const size_t guard = arena ? plan.arena_guard : 0;
  std::vector<unsigned char> pattern(guard ? guard + plan.alignment : 0, kGuardByte), seen(pattern.size());
  int64_t moved = 0;  // host <-> device bytes the backend reported while launching Steps
  const std::atomic<int64_t>& reported = backends::reported_host_transfers(dev.kind);
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const kir::Step& st = plan.steps[s];
    std::vector<int> guarded;  // temporaries this Step writes
    if (guard)
      for (int o : st.outputs())
        if (plan.slots[o].kind == kir::SlotKind::Temp) guarded.push_back(o);
    for (int o : guarded)
      for (auto [b, e] : guard_ranges(plan.slots[o], guard, plan.alignment))
        be.copy_in(static_cast<char*>(arena->data) + b, pattern.data(), e - b);
    const int64_t moved_before = reported.load();
    if (prof_run >= 0) {
      int64_t ts0 = prof::now_ns();
      be.launch(*exe->kernels[s], st, args);
      be.synchronize();
      prof::step(prof_run, int(s), ts0, prof::now_ns());
    } else if (!time_steps) {
      be.launch(*exe->kernels[s], st, args);
    } else {
      auto ts0 = std::chrono::steady_clock::now();
      be.launch(*exe->kernels[s], st, args);
      be.synchronize();  // asynchronous devices: the Step's own time
      std::fprintf(stderr, "step %zu %s %s%s %.3f ms %s@%s\n", s, kir::step_kind_name(st.kind), dtype_short(st.dtype),
                   shape_str(st.shape).c_str(), double(since_ns(ts0)) / 1e6, st.sources[0].op.c_str(), st.sources[0].scope.c_str());
    }
    moved += reported.load() - moved_before;
    if (hook) hook(int(s), slots.data());
    if (guarded.empty()) continue;
    be.synchronize();
    for (int o : guarded) {
    const kir::Slot& sl = plan.slots[o];
    for (auto [b, e] : guard_ranges(sl, guard, plan.alignment)) {
      be.copy_out(seen.data(), static_cast<char*>(arena->data) + b, e - b);
      g_guard_checked += int64_t(e - b);
      for (size_t i = 0; i < e - b; ++i)
        if (seen[i] != kGuardByte) {
          int64_t at = int64_t(b + i) - int64_t(sl.offset);  // relative to the buffer's start
          char what[96];
          std::snprintf(what, sizeof what, "the arena guard byte at offset %lld %s changed (0x%02x, expected 0x%02x)",
                        (long long)at, at < 0 ? "before its start" : "after its end", seen[i], kGuardByte);
          fail("sync", step_label(plan, s) + " wrote outside its " + std::to_string(sl.nbytes) + "-byte buffer (slot " +
                           std::to_string(o) + "): " + what,
               st.sources.empty() ? "" : st.sources[0].scope);
        }
    }
    }
  }
  be.synchronize();
  counters().steps_launched += int64_t(plan.steps.size());
  DeviceCounters& dc = device_counters(dev.kind);
  dc.steps_launched += int64_t(plan.steps.size());
  dc.bytes_moved_in_graphs += moved;
  counters().execute_ns += since_ns(t0);
  if (prof_run >= 0) {
    prof::end_run(prof_run);
    prof::mark(prof::Region::Copy);  // the caller rebinding the results
  }
  return results;
}

}  // namespace tessera::runtime
