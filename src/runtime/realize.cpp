#include "runtime/realize.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "backends/backend.h"
#include "compiler/passes/passes.h"
#include "compiler/pipeline.h"
#include "runtime/allocator.h"
#include "runtime/metrics_impl.h"
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

std::shared_ptr<Executable> compile(const ir::Graph& g, const Device& dev, const std::vector<int>& donate) {
  auto t0 = std::chrono::steady_clock::now();
  auto exe = std::make_shared<Executable>();
  exe->plan = compiler::compile_graph(g, donate);
  backends::Backend& be = backends::backend_for(dev);
  for (const kir::Step& st : exe->plan.steps) exe->kernels.push_back(be.compile(st));
  counters().graphs_compiled++;
  counters().compile_ns += since_ns(t0);
  return exe;
}

// Cache key: graph structure + device + which outputs may overwrite which parameters + the
// passes switched off.
std::string cache_key(const ir::Graph& g, const Device& dev, const std::vector<int>& donate) {
  std::string k = g.key;
  k += '|';
  k += dev.str();
  k += '|' + compiler::disabled_passes_key();
  for (int d : donate) k += "|" + std::to_string(d);
  return k;
}

}  // namespace

std::vector<std::shared_ptr<Buffer>> realize(const std::vector<Request>& req, RngArgs rng, bool* drew_random) {
  std::vector<ir::NodePtr> outs;
  for (auto& r : req) outs.push_back(r.node);
  ir::Graph g = ir::build_graph(outs);
  const Device dev = outs.front()->device;

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

  std::shared_ptr<Executable> exe;
  std::string key = cache_key(g, dev, donate);
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
    exe = compile(g, dev, donate);
    std::lock_guard<std::mutex> lock(g_mu);
    cache()[key] = exe;
    record_compile(why);
  }
  backends::Backend& be = backends::backend_for(dev);
  if (!be.can_execute())
    fail("sync", "device '" + dev.str() + "' compiles graphs but cannot run them (graph of " +
                     std::to_string(g.nodes.size()) + " nodes compiled to " + std::to_string(exe->plan.steps.size()) +
                     " steps)", "");

  auto t0 = std::chrono::steady_clock::now();
  const compiler::Plan& plan = exe->plan;
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
  backends::LaunchArgs args{slots.data(), rng.seed, rng.offset};
  static const bool time_steps = std::getenv("TESSERA_STEP_TIMES") != nullptr;
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    if (!time_steps) {
      be.launch(*exe->kernels[s], plan.steps[s], args);
      continue;
    }
    auto ts0 = std::chrono::steady_clock::now();
    be.launch(*exe->kernels[s], plan.steps[s], args);
    {
      const kir::Step& st = plan.steps[s];
      std::fprintf(stderr, "step %zu %s %s%s %.3f ms %s@%s\n", s, kir::step_kind_name(st.kind), dtype_short(st.dtype),
                   shape_str(st.shape).c_str(), double(since_ns(ts0)) / 1e6, st.sources[0].op.c_str(), st.sources[0].scope.c_str());
    }
  }
  be.synchronize();
  counters().steps_launched += int64_t(plan.steps.size());
  counters().execute_ns += since_ns(t0);
  if (drew_random) *drew_random = g.has_rng;
  return results;
}

}  // namespace tessera::runtime
