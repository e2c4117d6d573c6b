// Hooks the runtime and the frontend call so an active tessera::Profiler sees every Step, compile,
// host sync and the runtime's own time. With no profiler active each hook site costs one relaxed
// atomic load (`prof::on()`), and nothing else runs.
//
// Time on the host is split into consecutive regions by marks: mark(next) closes the current
// region at the clock's reading and opens `next`, so every interval between Profiler::start()
// and stop() is timed directly between two clock readings and belongs to exactly one region or
// one Step (a Step's interval is taken out of the Launch region around it).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace tessera::compiler {
struct Plan;
}

namespace tessera::runtime::prof {

extern std::atomic<bool> g_on;
inline bool on() { return g_on.load(std::memory_order_relaxed); }
inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Host regions outside Steps. Compile is reported as its own row; the others form `<runtime>`.
enum class Region : uint8_t {
  Trace,    // host code between syncs: tracing the lazy graph (and the caller's own code)
  Graph,    // sync(): gathering pending tensors, building the graph and its structural key
  Lookup,   // donation decisions, the cache key, the compile-cache lookup
  Compile,  // a cache miss: the pass pipeline and the backend's kernels
  Launch,   // allocation, slot setup, per-Step bookkeeping between launches, the final wait
  Copy,     // device -> host copies of a host sync, rebinding realized tensors
  Count_
};
const char* region_name(Region r);

void mark(Region next);
void mark_at(Region next, int64_t t);
// A cache miss about to compile: why (the miss reason) and the graph's size in nodes.
void compile_begin(const std::string& why, int64_t nodes);
// realize() starting to launch a plan: returns a run id for step(); keeps the plan alive.
int begin_run(std::shared_ptr<const compiler::Plan> plan, const std::string& device);
// One executed Step of run `run`, timed [t0, t1) (after the device finished it).
void step(int run, int index, int64_t t0, int64_t t1);
void end_run(int run);
// A host sync (item(), to_vector(), printing): a slice enclosing its regions.
void sync_begin(const char* what);
void sync_end();

}  // namespace tessera::runtime::prof
