// Internal counters behind tessera::metrics(); updated by the runtime and the frontend.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>

namespace tessera::runtime {

struct Counters {
  std::atomic<int64_t> graphs_compiled{0}, cache_hits{0}, host_syncs{0}, steps_launched{0};
  std::atomic<int64_t> live_bytes{0}, peak_bytes{0};
  std::atomic<int64_t> compile_ns{0}, execute_ns{0};
  std::atomic<int64_t> bytes_to_device{0}, bytes_to_host{0};  // counted by runtime::upload/download
  std::atomic<int64_t> budget_graphs{0}, recomputed_steps{0}, unstacked_graphs{0}, accumulated_in_place{0};  // the memory budget's rewrites (realize.cpp)
};
Counters& counters();
// Per device kind ("cpu", "opencl"); see tessera::DeviceMetrics.
struct DeviceCounters {
  std::atomic<int64_t> steps_launched{0}, kernels_compiled{0};
  std::atomic<int64_t> bytes_to_device{0}, bytes_to_host{0}, bytes_moved_in_graphs{0};
  std::atomic<int64_t> executables_run{0}, library_calls_compiled{0};
};
DeviceCounters& device_counters(const std::string& kind);  // a stable reference
void add_live_bytes(int64_t delta);
// Notes why a graph was compiled (the cache missed); the last reasons show in metrics().
void record_compile(const std::string& reason);

}  // namespace tessera::runtime
