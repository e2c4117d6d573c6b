#include "runtime/realize.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "backends/backend.h"
#include "backends/collective.h"
#include "backends/communicator.h"
#include "compiler/lower.h"
#include "compiler/pipeline.h"
#include "runtime/allocator.h"
#include "runtime/compile_options.h"
#include "runtime/metrics_impl.h"
#include "runtime/overlap.h"
#include "runtime/profiler_impl.h"
#include "core/fail.h"

namespace tessera::runtime {
namespace {

struct Executable {
  compiler::Plan plan;
  std::vector<std::unique_ptr<backends::Kernel>> kernels;
  // The backend's whole program (Backend::compile_executable), when it took one, with its
  // scalars buffer (RunScalars, then the staged parameters: scalar_params[k] at 16 + 8k).
  std::unique_ptr<backends::Executable> whole;
  std::shared_ptr<Buffer> scalars;
  std::vector<int> scalar_params;  // slots of parameters staged into the scalars buffer
  // Its collectives in launch order (empty: none), which the ranks compare before its first run
  // on a communicator (check_collectives).
  backends::CollectiveSequence collectives;
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

// Library calls (Backend::claim): each Gemm Step the backend claims is compiled with
// compile_library; when the library cannot apply its epilogue, the epilogue becomes an
// Elementwise Step right after it. Returns, per Step, whether it is a claimed library call.
std::vector<bool> claim_library_calls(compiler::Plan& plan, backends::Backend& be, int device) {
  std::vector<kir::Step> steps;
  std::vector<bool> claimed;
  int peak_shift = 0;
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    kir::Step& st = plan.steps[s];
    backends::Claim c = st.kind == kir::StepKind::Gemm ? be.claim(st, device) : backends::Claim{};
    if (c.claimed && !c.fuses_epilogue && !st.program.empty()) {
      auto [product, epilogue] = kir::split_epilogue(st);
      steps.push_back(std::move(product));
      claimed.push_back(true);
      steps.push_back(std::move(epilogue));
      claimed.push_back(false);
      if (int(s) < plan.memory.peak_step) ++peak_shift;  // the memory plan's Step numbers move
      continue;
    }
    steps.push_back(std::move(st));
    claimed.push_back(c.claimed);
  }
  plan.steps = std::move(steps);
  if (plan.memory.peak_step >= 0) plan.memory.peak_step += peak_shift;
  return claimed;
}

// Parameters of at most 8 bytes that no Step writes (a learning rate, a step count; donated ones
// keep their own, fixed buffer): a whole executable reads them from its scalars buffer.
std::vector<int> staged_scalar_params(const compiler::Plan& plan) {
  std::vector<bool> written(plan.slots.size(), false);
  for (const kir::Step& st : plan.steps)
    for (int o : st.outputs()) written[size_t(o)] = true;
  std::vector<int> out;
  for (size_t s = 0; s < plan.slots.size(); ++s)
    if (plan.slots[s].kind == kir::SlotKind::Param && plan.slots[s].nbytes <= 8 && !written[s]) out.push_back(int(s));
  return out;
}

// Offers the compiled program to the backend as a whole (Backend::compile_executable).
// g: the graph the plan numbers parameters by; optimized: after the IR passes, which may drop or
// reorder its leaves.
void compile_whole(Executable& exe, const ir::Graph& g, const ir::Graph& optimized, backends::Backend& be, const Device& dev) {
  const compiler::Plan& plan = exe.plan;
  backends::ExecutableSpec spec;
  spec.graph = &optimized;
  std::unordered_map<const ir::Node*, int> param_of;  // leaf -> parameter number of g
  for (size_t p = 0; p < g.params.size(); ++p) param_of[g.nodes[g.params[p]].get()] = int(p);
  std::vector<int> optimized_param(g.params.size(), -1);  // g's parameter -> optimized's
  for (size_t j = 0; j < optimized.params.size(); ++j) {
    int p = param_of.at(optimized.nodes[optimized.params[j]].get());
    optimized_param[size_t(p)] = int(j);
    spec.param_slots.push_back(plan.slots_of_params[size_t(p)]);
  }
  spec.output_slots = plan.output_slot;
  for (int p : plan.donated) spec.donated.push_back(p < 0 ? -1 : optimized_param[size_t(p)]);
  spec.steps = &plan.steps;
  spec.slots = &plan.slots;
  for (auto& k : exe.kernels) spec.kernels.push_back(k.get());
  spec.arena_bytes = plan.arena_bytes;
  exe.scalar_params = staged_scalar_params(plan);
  spec.scalars_bytes = sizeof(backends::RunScalars) + 8 * exe.scalar_params.size();
  spec.device = dev.index;
  spec.memory_report = &exe.plan.device_memory;
  exe.whole = be.compile_executable(spec);
  // Straight from the backend, not the caching allocator: it lives with the executable (in the
  // compile cache), so it would only make every sentinel check of the live buffers longer.
  if (exe.whole) {
    void* p = be.allocate(dev.index, spec.scalars_bytes);
    size_t n = spec.scalars_bytes;
    exe.scalars = std::make_shared<Buffer>(dev, p, n, [&be, index = dev.index, n](void* q, size_t) { be.free(index, q, n); });
  }
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
  ir::Graph optimized;
  exe->plan = compiler::compile_graph(g, donate, opts, &optimized);
  if (exe->plan.memory.budget_bytes) {
    counters().budget_graphs++;
    counters().recomputed_steps += exe->plan.memory.recomputed_steps;
    counters().unstacked_graphs += exe->plan.memory.unstacked_slices > 0;
    counters().accumulated_in_place += exe->plan.memory.accumulated_in_place;
  }
  // Collectives run only where the device declares them (Target::collectives); a device that
  // only compiles (null) plans them like any Step.
  if (be.can_execute() && !opts.target.collectives)
    for (const kir::Step& st : exe->plan.steps)
      if (st.kind == kir::StepKind::Collective)
        fail(ir::op_name(st.collective), "device '" + dev.str() + "' does not run collectives (its Target's collectives; " +
                                             "the cpu backend does: docs/architecture.md \"Parallelism\")",
             st.sources.empty() ? "" : st.sources[0].scope);
  std::vector<bool> library = claim_library_calls(exe->plan, be, dev.index);
  exe->collectives = backends::collective_sequence(exe->plan.steps);
  for (size_t s = 0; s < exe->plan.steps.size(); ++s)
    exe->kernels.push_back(library[s] ? be.compile_library(exe->plan.steps[s]) : be.compile(exe->plan.steps[s]));
  compile_whole(*exe, g, optimized, be, dev);
  device_counters(dev.kind).kernels_compiled += int64_t(exe->plan.steps.size());
  device_counters(dev.kind).library_calls_compiled += std::count(library.begin(), library.end(), true);
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

// The collective-sequence check (docs/architecture.md "Parallelism"). Per communicator (its
// serial), the sequences (hashes) its ranks have agreed on: a later launch of any executable
// with one of them on that communicator checks nothing. Keyed by sequence rather than by
// executable, so that a rank that compiled the same graph twice (a cleared cache, other
// donations) does not exchange where the others do not.
std::mutex g_agreed_mu;
std::unordered_map<uint64_t, std::unordered_set<uint64_t>>& agreed() {
  static auto* m = new std::unordered_map<uint64_t, std::unordered_set<uint64_t>>();
  return *m;
}
std::atomic<int64_t> g_sequence_checks{0};

// Before `exe`'s first Step on the calling thread's communicator: every rank compares its
// collectives with the others' (backends::check_collective_sequence), throwing on every rank
// when they differ. Nothing to do without collectives or with one rank.
void check_collectives(const Executable& exe, backends::Backend& be, const Device& dev) {
  if (exe.collectives.empty()) return;
  backends::Communicator* comm = backends::current_communicator();
  if (!comm || comm->size() < 2) return;
  const uint64_t serial = comm->serial(), hash = exe.collectives.hash;
  {
    std::lock_guard<std::mutex> lock(g_agreed_mu);
    auto it = agreed().find(serial);
    if (it != agreed().end() && it->second.count(hash)) return;
  }
  g_sequence_checks++;
  backends::check_collective_sequence(exe.collectives, *comm, be, dev.index);
  std::lock_guard<std::mutex> lock(g_agreed_mu);
  agreed()[serial].insert(hash);
}

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
int64_t collective_sequence_checks() { return g_sequence_checks; }
void set_after_step_hook(StepHook hook) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_hook = std::move(hook);
}

namespace {

// One run of an executable: its slot pointers, arena and guard state.
struct Run {
  const compiler::Plan& plan;
  backends::Backend& be;
  const Device& dev;
  std::vector<void*> slots;
  std::shared_ptr<Buffer> arena;
  size_t guard = 0;  // arena guard bytes (0: off)
  std::vector<unsigned char> pattern, seen;

  char* arena_at(size_t offset) const { return static_cast<char*>(arena->data) + offset; }

  struct Guard {
    int slot;
    size_t begin, end;  // arena offsets
  };
  // The guard bytes around the arena temporaries Step s writes.
  std::vector<Guard> step_guards(size_t s) const {
    std::vector<Guard> out;
    if (!guard) return out;
    for (int o : plan.steps[s].outputs())
      if (plan.slots[size_t(o)].kind == kir::SlotKind::Temp)
        for (auto [b, e] : guard_ranges(plan.slots[size_t(o)], guard, plan.alignment)) out.push_back({o, b, e});
    return out;
  }
  // For a whole executable, checked only after it ran: the guard bytes no temporary's data ever
  // covers (temporaries that live at different times share arena bytes).
  std::vector<Guard> program_guards() const {
    std::vector<Guard> out;
    if (!guard) return out;
    std::vector<bool> placed(plan.slots.size(), false);  // temporaries some Step writes (others have no place)
    for (const kir::Step& st : plan.steps)
      for (int o : st.outputs()) placed[size_t(o)] = plan.slots[size_t(o)].kind == kir::SlotKind::Temp;
    for (size_t k = 0; k < plan.slots.size(); ++k) {
      if (!placed[k]) continue;
      for (auto [b, e] : guard_ranges(plan.slots[k], guard, plan.alignment)) {
        bool covered = false;
        for (size_t t = 0; t < plan.slots.size(); ++t)
          covered |= placed[t] && plan.slots[t].offset < e && b < plan.slots[t].offset + plan.slots[t].nbytes;
        if (!covered) out.push_back({int(k), b, e});
      }
    }
    return out;
  }
  void fill_guards(const std::vector<Guard>& guards) {
    for (const Guard& g : guards) be.copy_in(arena_at(g.begin), pattern.data(), g.end - g.begin);
  }
  // Throws naming the Step (or the whole executable, s < 0) when a guard byte changed.
  void check_guards(const std::vector<Guard>& guards, int s) {
    if (guards.empty()) return;
    be.synchronize();
    for (const Guard& g : guards) {
      const kir::Slot& sl = plan.slots[size_t(g.slot)];
      be.copy_out(seen.data(), arena_at(g.begin), g.end - g.begin);
      g_guard_checked += int64_t(g.end - g.begin);
      for (size_t i = 0; i < g.end - g.begin; ++i)
        if (seen[i] != kGuardByte) {
          int64_t at = int64_t(g.begin + i) - int64_t(sl.offset);  // relative to the buffer's start
          char what[96];
          std::snprintf(what, sizeof what, "the arena guard byte at offset %lld %s changed (0x%02x, expected 0x%02x)",
                        (long long)at, at < 0 ? "before its start" : "after its end", seen[i], kGuardByte);
          std::string who = s >= 0 ? step_label(plan, size_t(s)) : "the whole executable (" + be.name() + ")";
          fail("sync", who + " wrote outside its " + std::to_string(sl.nbytes) + "-byte buffer (slot " + std::to_string(g.slot) +
                           "): " + what,
               s >= 0 && !plan.steps[size_t(s)].sources.empty() ? plan.steps[size_t(s)].sources[0].scope : sl.source.scope);
        }
    }
  }
};

// TESSERA_STEP_TIMES=1: every Step launched alone, waited for and its time printed.
bool step_times() {
  static const bool on = std::getenv("TESSERA_STEP_TIMES") != nullptr;
  return on;
}

// The memory limit (tessera/memory.h): a graph whose new buffers would cross it is refused before
// anything is allocated or run.
void check_fits(const compiler::Plan& plan, const Device& dev) {
  const size_t limit = memory_limit();
  if (!limit) return;
  size_t outputs = 0;
  for (size_t k = 0; k < plan.output_slot.size(); ++k)
    if (plan.donated[k] < 0) outputs += allocated_size(plan.slots[size_t(plan.output_slot[k])].nbytes);
  const size_t more = outputs + allocated_size(plan.arena_bytes), live = live_bytes_on(dev);
  if (live + more <= limit) return;
  using compiler::mib;
  fail("memory", "out of memory on " + dev.str() + ": this graph needs " + mib(more) + " (outputs " + mib(outputs) + ", arena " +
                     mib(plan.arena_bytes) + ") beside the " + mib(live) + " live there, over the memory limit of " + mib(limit) +
                     " (" + memory_limit_source() + "); " + compiler::describe_peak(plan, 5) +
                     ". A memory budget (--memory-budget, tessera::MemoryBudgetScope) or micro-batches (--micro-batches auto) "
                     "lower what a step needs",
       "");
}

// Slot pointers: parameters' buffers, arena temporaries and the outputs (allocated here unless
// written into a donated parameter), which become the results.
// params: the graph's parameters' buffers, in parameter order.
void bind_slots(Run& run, const std::vector<std::shared_ptr<Buffer>>& params, size_t nreq, std::vector<std::shared_ptr<Buffer>>& results) {
  const compiler::Plan& plan = run.plan;
  run.slots.assign(plan.slots.size(), nullptr);
  for (size_t s = 0; s < plan.slots.size(); ++s) {
    const kir::Slot& sl = plan.slots[s];
    if (sl.kind == kir::SlotKind::Param) run.slots[s] = params[size_t(sl.index)]->data;
    if (sl.kind == kir::SlotKind::Temp && run.arena) run.slots[s] = run.arena_at(sl.offset);
  }
  results.resize(nreq);
  for (size_t k = 0; k < nreq; ++k) {
    int s = plan.output_slot[k];
    if (plan.donated[k] >= 0) {
      results[k] = params[size_t(plan.donated[k])];
    } else {
      results[k] = allocate(run.dev, plan.slots[s].nbytes);
      run.slots[s] = results[k]->data;
    }
  }
}
std::vector<std::shared_ptr<Buffer>> graph_params(const ir::Graph& g) {
  std::vector<std::shared_ptr<Buffer>> params;
  params.reserve(g.params.size());
  for (int p : g.params) params.push_back(g.nodes[size_t(p)]->buffer);
  return params;
}
void bind_slots(Run& run, const ir::Graph& g, size_t nreq, std::vector<std::shared_ptr<Buffer>>& results) {
  bind_slots(run, graph_params(g), nreq, results);
}

// Step by Step: each launched, timed when profiling or TESSERA_STEP_TIMES asks, its guards
// checked; a collective the backend starts stays in flight until a Step touches its buffers
// (runtime/overlap.h). Returns the host <-> device bytes the backend reported while launching.
// `at`: the Step being launched or completed; `ran`: the last Step launched.
int64_t launch_steps(Run& run, const Executable& exe, const backends::LaunchArgs& args, int prof_run, const StepHook& hook,
                     int& at, int& ran) {
  const bool time_steps = step_times();
  const compiler::Plan& plan = run.plan;
  backends::Backend& be = run.be;
  int64_t moved = 0;
  const std::atomic<int64_t>& reported = backends::reported_host_transfers(run.dev.kind);
  InFlight inflight(plan, run.slots.data(), prof_run);
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    inflight.before(s, at);
    at = ran = int(s);
    const kir::Step& st = plan.steps[s];
    // A Step with guard bytes runs blocking: they are checked right after it, where a started
    // collective would not have written yet.
    std::vector<Run::Guard> guards = run.step_guards(s);
    run.fill_guards(guards);
    const int64_t moved_before = reported.load();
    if (prof_run >= 0) {
      int64_t ts0 = prof::now_ns();
      if (!(guards.empty() && inflight.start(s, be, *exe.kernels[s], args))) be.launch(*exe.kernels[s], st, args);
      be.synchronize();
      prof::step(prof_run, int(s), ts0, prof::now_ns());
    } else if (!time_steps) {
      if (!(guards.empty() && inflight.start(s, be, *exe.kernels[s], args))) be.launch(*exe.kernels[s], st, args);
    } else {
      auto ts0 = std::chrono::steady_clock::now();
      be.launch(*exe.kernels[s], st, args);  // each Step's own time: blocking
      be.synchronize();  // asynchronous devices: the Step's own time
      std::fprintf(stderr, "step %zu %s %s%s %.3f ms %s@%s\n", s, kir::step_kind_name(st.kind), dtype_short(st.dtype),
                   shape_str(st.shape).c_str(), double(since_ns(ts0)) / 1e6, st.sources[0].op.c_str(), st.sources[0].scope.c_str());
    }
    moved += reported.load() - moved_before;
    if (hook) hook(int(s), run.slots.data());
    run.check_guards(guards, int(s));
  }
  inflight.finish(at);
  return moved;
}

// What a graph that failed at Step `failed` (-1: unknown) leaves (GraphFailure, realize.h): the
// Steps that ran before it are complete, the failed one and every Step reading what it wrote
// (transitively) are tainted, the rest never ran. ran (>= failed: a collective completed late,
// runtime/overlap.h): Steps up to it were launched, so donated buffers they wrote are written.
GraphFailure failure(const std::string& what, const compiler::Plan& plan, int failed,
                     const std::vector<std::shared_ptr<Buffer>>& results, int ran = -1) {
  ran = std::max(ran, failed);
  GraphFailure f(what);
  f.failed_step = failed;
  const size_t n = plan.output_slot.size();
  f.done.assign(n, nullptr);
  f.tainted.assign(n, true);
  f.donor_written.assign(n, false);
  if (failed < 0) {
    for (size_t k = 0; k < n; ++k) f.donor_written[k] = plan.donated[k] >= 0;
    return f;
  }
  std::vector<char> taint(plan.slots.size(), 0);
  std::vector<int> first_writer(plan.slots.size(), -1), last_writer(plan.slots.size(), -1);
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const bool t = int(s) == failed || (int(s) > failed && std::any_of(plan.steps[s].inputs.begin(), plan.steps[s].inputs.end(),
                                                                       [&](int in) { return taint[size_t(in)] != 0; }));
    for (int o : plan.steps[s].outputs()) {
      if (first_writer[size_t(o)] < 0) first_writer[size_t(o)] = int(s);
      last_writer[size_t(o)] = int(s);
      if (t) taint[size_t(o)] = 1;
    }
  }
  for (size_t k = 0; k < n; ++k) {
    const size_t slot = size_t(plan.output_slot[k]);
    f.tainted[k] = taint[slot] != 0;
    if (!f.tainted[k] && last_writer[slot] < failed) f.done[k] = results[k];
    f.donor_written[k] = plan.donated[k] >= 0 && first_writer[slot] >= 0 && first_writer[slot] <= ran;
    if (!f.done[k] && f.donor_written[k]) f.tainted[k] = true;  // half written: it cannot simply run again
  }
  return f;
}

// The backend's whole program: this run's random state and small parameters go into the
// executable's scalars buffer (fixed addresses), then one run_executable call.
int64_t run_whole(Run& run, Executable& exe, RngArgs rng) {
  backends::Backend& be = run.be;
  const int64_t moved_before = backends::reported_host_transfers(run.dev.kind).load();
  char* scalars = static_cast<char*>(exe.scalars->data);
  backends::RunScalars head{rng.seed, rng.offset};
  be.copy_in(scalars, &head, sizeof head);
  for (size_t k = 0; k < exe.scalar_params.size(); ++k) {
    int s = exe.scalar_params[k];
    char* at = scalars + sizeof head + 8 * k;
    be.copy_device(at, run.dev.index, run.slots[s], run.dev.index, run.plan.slots[s].nbytes);
    run.slots[s] = at;
  }
  std::vector<Run::Guard> guards = run.program_guards();
  run.fill_guards(guards);
  be.run_executable(*exe.whole, backends::RunArgs{run.slots.data(), scalars, run.dev.index});
  run.check_guards(guards, -1);
  return backends::reported_host_transfers(run.dev.kind).load() - moved_before;
}


thread_local CaptureSlot* t_capture_slot = nullptr;

// Runs `exe` on `params` (the graph's parameters' buffers): what realize() does after the lookup.
std::vector<std::shared_ptr<Buffer>> execute(const std::shared_ptr<Executable>& exe, const Device& dev,
                                             const std::vector<std::shared_ptr<Buffer>>& params, size_t nreq, RngArgs rng,
                                             size_t graph_nodes) {
  StepHook hook;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_last = exe;
    hook = g_hook;
  }
  backends::Backend& be = backends::backend_for(dev);
  if (!be.can_execute())
    fail("sync", "device '" + dev.str() + "' compiles graphs but cannot run them (graph of " +
                     std::to_string(graph_nodes) + " nodes compiled to " + std::to_string(exe->plan.steps.size()) +
                     " steps)", "");
  // Before anything is allocated or run: the ranks agree on the collectives they will call.
  check_collectives(*exe, be, dev);

  auto t0 = std::chrono::steady_clock::now();
  const compiler::Plan& plan = exe->plan;
  // Profiling: each Step is waited for and timed; the bookkeeping around it is Launch time.
  const int prof_run = prof::on() ? prof::begin_run(std::shared_ptr<const compiler::Plan>(exe, &exe->plan), dev.str()) : -1;
  check_fits(plan, dev);
  std::shared_ptr<Buffer> arena = plan.arena_bytes ? allocate(dev, plan.arena_bytes) : nullptr;
  const size_t guard = arena ? plan.arena_guard : 0;
  std::vector<unsigned char> pattern(guard ? guard + plan.alignment : 0, kGuardByte);
  Run run{plan, be, dev, {}, std::move(arena), guard, pattern, pattern};  // `seen`: read back into
  std::vector<std::shared_ptr<Buffer>> results;
  bind_slots(run, params, nreq, results);
  // A whole executable runs as one call, unless profiling or a Step hook needs the Steps one by one.
  const bool whole = exe->whole && prof_run < 0 && !hook && !step_times();
  int64_t moved = 0;
  int at = -1, ran = -1;  // the Step being launched or completed (-1: unknown); the last launched
  try {
    moved = whole ? run_whole(run, *exe, rng)
                  : launch_steps(run, *exe, backends::LaunchArgs{run.slots.data(), rng.seed, rng.offset, dev.index}, prof_run, hook,
                                 at, ran);
    at = -1;  // an asynchronous device reports a failure at synchronize: of some Step
    be.synchronize();
  } catch (const std::exception& e) {
    throw failure(e.what(), plan, at, results, ran);
  }
  counters().steps_launched += int64_t(plan.steps.size());
  DeviceCounters& dc = device_counters(dev.kind);
  dc.steps_launched += int64_t(plan.steps.size());
  dc.bytes_moved_in_graphs += moved;
  if (whole) dc.executables_run++;
  counters().execute_ns += since_ns(t0);
  if (prof_run >= 0) {
    prof::end_run(prof_run);
    prof::mark(prof::Region::Copy);  // the caller rebinding the results
  }
  return results;
}

}  // namespace

struct CapturedGraph {
  std::shared_ptr<Executable> exe;
  Device dev;
  size_t nreq = 0, nodes = 0;
  std::vector<size_t> param_bytes;
};

void set_capture_slot(CaptureSlot* slot) { t_capture_slot = slot; }

std::vector<std::shared_ptr<Buffer>> realize(const std::vector<Request>& req, RngArgs rng) {
  Prepared prep = prepare(req);
  std::vector<std::shared_ptr<Buffer>> params = graph_params(prep.g);
  if (CaptureSlot* slot = t_capture_slot) {
    auto cg = std::make_shared<CapturedGraph>();
    cg->exe = prep.exe;
    cg->dev = prep.dev;
    cg->nreq = req.size();
    cg->nodes = prep.g.nodes.size();
    for (auto& b : params) cg->param_bytes.push_back(b->nbytes);
    slot->graph = std::move(cg);
    slot->params = params;
    slot->donated = prep.exe->plan.donated;
  }
  const size_t nodes = prep.g.nodes.size();
  return execute(prep.exe, prep.dev, params, req.size(), rng, nodes);
}

std::vector<std::shared_ptr<Buffer>> run_captured(const CapturedGraph& cg, const std::vector<std::shared_ptr<Buffer>>& params,
                                                  RngArgs rng) {
  if (params.size() != cg.param_bytes.size())
    fail("StepCapture", "internal: " + std::to_string(params.size()) + " parameters for a graph of " + std::to_string(cg.param_bytes.size()), "");
  for (size_t p = 0; p < params.size(); ++p)
    if (!params[p] || params[p]->nbytes < cg.param_bytes[p] || !(params[p]->device == cg.dev))
      fail("StepCapture", "internal: parameter " + std::to_string(p) + " is missing, too small or on another device", "");
  counters().cache_hits++;
  return execute(cg.exe, cg.dev, params, cg.nreq, rng, cg.nodes);
}

std::shared_ptr<const std::string> compile_settings_key() {
  auto s = detail::compile_settings();
  return std::shared_ptr<const std::string>(s, &s->key);
}

bool same_captured(const CapturedGraph& a, const CapturedGraph& b) { return a.exe == b.exe && a.dev == b.dev; }


std::vector<std::vector<std::shared_ptr<Buffer>>> realize_spmd(const std::vector<Request>& requests, RngArgs rng,
                                                               const std::vector<RankInputs>& rank_inputs,
                                                               const std::vector<std::shared_ptr<backends::Communicator>>& ranks,
                                                               const std::vector<std::vector<Request>>& rank_requests) {
  const size_t N = ranks.size();
  if (N == 0 || rank_inputs.size() != N)
    fail("spmd", "inputs for " + std::to_string(rank_inputs.size()) + " ranks, " + std::to_string(N) + " communicators", "");
  if (!rank_requests.empty() && rank_requests.size() != N)
    fail("spmd", "requests for " + std::to_string(rank_requests.size()) + " ranks, " + std::to_string(N) + " communicators", "");
  std::vector<Request> req;
  for (const Request& r : requests) req.push_back({r.node, {}});  // no donation: every rank reads the leaves
  Prepared prep = prepare(req);
  // Ranks with graphs of their own (random draws at their rows of the batch): compiled here too.
  std::vector<std::optional<Prepared>> own(N);
  for (size_t r = 0; r < rank_requests.size(); ++r) {
    if (rank_requests[r].empty()) continue;
    if (rank_requests[r].size() != requests.size())
      fail("spmd", "rank " + std::to_string(r) + " requests " + std::to_string(rank_requests[r].size()) + " values, rank 0 " +
                       std::to_string(requests.size()), "");
    std::vector<Request> mine;
    for (const Request& q : rank_requests[r]) mine.push_back({q.node, {}});
    own[r] = prepare(mine);
  }
  const Device& dev = prep.dev;
  backends::Backend& be = backends::backend_for(dev);
  if (!be.can_execute()) fail("spmd", "device '" + dev.str() + "' compiles graphs but cannot run them", "");
  // Several rank threads launch at once: only a backend declaring collectives promises that.
  if (N > 1 && !be.properties(dev.index).collectives)
    fail("spmd", "device '" + dev.str() + "' does not run launches from several ranks at once (no collectives)", "");
  for (size_t r = 0; r < N; ++r)
    if (ranks[r]->rank() != int(r) || ranks[r]->size() != int(N))
      fail("spmd", "communicator " + std::to_string(r) + " is rank " + std::to_string(ranks[r]->rank()) + " of " +
                       std::to_string(ranks[r]->size()) + ", not rank " + std::to_string(r) + " of " + std::to_string(N), "");
  // The collective-sequence check: ranks running one executable agree by construction; ranks with
  // graphs of their own are compared here, before anything is allocated or any rank starts (each
  // executable's sequence was made when it was compiled: no communication). Then every collective
  // must be for this group.
  {
    std::vector<const backends::CollectiveSequence*> seqs;
    bool differ = false;
    for (size_t r = 0; r < N; ++r) {
      const Prepared& p = own[r] ? *own[r] : prep;
      seqs.push_back(&p.exe->collectives);
      // Their hashes first (the per-rank dropout copies of a data-parallel step meet here every step).
      differ |= p.exe != prep.exe && (p.exe->collectives.hash != prep.exe->collectives.hash ||
                                      p.exe->collectives.items.size() != prep.exe->collectives.items.size());
    }
    const std::string why = differ ? backends::compare_collective_sequences(seqs) : "";
    if (!why.empty()) fail("spmd", why, "");
    const backends::CollectiveSequence& q = prep.exe->collectives;
    for (size_t i = 0; i < q.items.size(); ++i)
      if (q.stride[i] == 0 ? q.group[i] != int64_t(N) : int64_t(N) % (q.group[i] * q.stride[i]) != 0)
        fail("spmd", "collective " + std::to_string(i) + " (" + q.items[i] + ") is not for the " + std::to_string(N) +
                         " ranks it runs on" + (q.stride[i] ? " (its sub-groups do not tile them)" : "") + " (every rank fails)",
             q.scopes[i]);
  }
  {  // last_executed_plan(): rank 0's (the per-rank graph's plan: what one rank holds)
    std::lock_guard<std::mutex> lock(g_mu);
    g_last = own[0] ? own[0]->exe : prep.exe;
  }
  // Every rank's buffers are allocated here, on the calling thread; the rank threads only launch.
  std::vector<std::unique_ptr<Run>> runs;
  std::vector<std::shared_ptr<Executable>> exes;
  std::vector<std::vector<std::shared_ptr<Buffer>>> results(N);
  for (size_t r = 0; r < N; ++r) {
    const Prepared& p = own[r] ? *own[r] : prep;
    if (!(p.dev == dev)) fail("spmd", "rank " + std::to_string(r) + "'s graph is on " + p.dev.str() + ", rank 0's on " + dev.str(), "");
    const ir::Graph& g = p.g;
    exes.push_back(p.exe);
    const compiler::Plan& plan = p.exe->plan;
    std::shared_ptr<Buffer> arena = plan.arena_bytes ? allocate(dev, plan.arena_bytes) : nullptr;
    runs.push_back(std::make_unique<Run>(Run{plan, be, dev, {}, std::move(arena), 0, {}, {}}));
    bind_slots(*runs.back(), g, req.size(), results[r]);
    for (size_t s = 0; s < plan.slots.size(); ++s) {
      const kir::Slot& sl = plan.slots[s];
      if (sl.kind != kir::SlotKind::Param) continue;
      const Buffer* leaf = g.nodes[g.params[sl.index]]->buffer.get();
      for (const auto& [from, to] : rank_inputs[r])
        if (from == leaf) {
          if (!to || to->nbytes < sl.nbytes)
            fail("spmd", "rank " + std::to_string(r) + "'s input for parameter " + std::to_string(sl.index) + " (" +
                             dtype_name(sl.dtype) + shape_str(sl.shape) + ") is missing or too small", "");
          runs.back()->slots[s] = to->data;
        }
    }
  }
  std::mutex mu;
  std::string first_error;
  std::vector<std::thread> threads;
  for (size_t r = 0; r < N; ++r)
    threads.emplace_back([&, r] {
      backends::CommunicatorScope scope(ranks[r].get());
      backends::share_host_threads(int(N));  // the ranks split the host's threads: T / N each
      const Executable& exe = *exes[r];
      // Destroyed after the catch below has broken the group: a failed rank's pending
      // collectives then end at once instead of waiting for the others.
      InFlight inflight(exe.plan, runs[r]->slots.data(), -1);
      try {
        const backends::LaunchArgs args{runs[r]->slots.data(), rng.seed, rng.offset, dev.index};
        int at = -1;
        for (size_t s = 0; s < exe.plan.steps.size(); ++s) {
          inflight.before(s, at);
          if (!inflight.start(s, be, *exe.kernels[s], args)) be.launch(*exe.kernels[s], exe.plan.steps[s], args);
        }
        inflight.finish(at);
        be.synchronize();
      } catch (const std::exception& e) {
        const std::string why = "rank " + std::to_string(r) + " of " + std::to_string(N) + " failed: " + e.what();
        {
          std::lock_guard<std::mutex> lock(mu);
          if (first_error.empty()) first_error = why;
        }
        backends::abort_inprocess_group(*ranks[r], why);
      }
    });
  for (std::thread& t : threads) t.join();
  if (!first_error.empty()) fail("spmd", first_error, "");
  int64_t steps = 0;
  for (const auto& e : exes) steps += int64_t(e->plan.steps.size());
  counters().steps_launched += steps;
  device_counters(dev.kind).steps_launched += steps;
  return results;
}

}  // namespace tessera::runtime

namespace tessera::runtime {

std::vector<std::vector<std::shared_ptr<Buffer>>> realize_spmd_inprocess(const std::vector<Request>& requests, RngArgs rng,
                                                                         const std::vector<RankInputs>& rank_inputs, int ranks,
                                                                         const std::vector<std::vector<Request>>& rank_requests,
                                                                         std::vector<CommTraffic>* traffic) {
  if (ranks < 1) fail("spmd", "needs at least one rank, got " + std::to_string(ranks), "");
  auto group = backends::make_inprocess_group(ranks);
  auto out = realize_spmd(requests, rng, rank_inputs, group, rank_requests);
  if (traffic) {
    traffic->clear();
    for (const auto& c : group) traffic->push_back({c->traffic().calls, c->traffic().bytes});
  }
  return out;
}

CommTraffic process_traffic() {
  backends::Communicator* c = backends::current_communicator();
  return c ? CommTraffic{c->traffic().calls, c->traffic().bytes} : CommTraffic{};
}

std::pair<int, int> init_mpi_group() {
  static std::mutex mu;  // two threads initialising at once make one communicator
  std::lock_guard<std::mutex> lock(mu);
  static std::shared_ptr<backends::Communicator> c;  // once per process: later calls return it
  if (c) return {c->rank(), c->size()};
  c = backends::make_mpi_communicator();
  backends::set_process_communicator(c);
  // Ranks on one host split its threads, unless OMP_NUM_THREADS says how many each takes.
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (local && !std::getenv("OMP_NUM_THREADS")) backends::share_host_threads(std::atoi(local));
  return {c->rank(), c->size()};
}

std::pair<int, int> process_group() {
  backends::Communicator* c = backends::current_communicator();
  return c ? std::pair<int, int>{c->rank(), c->size()} : std::pair<int, int>{0, 1};
}

}  // namespace tessera::runtime
