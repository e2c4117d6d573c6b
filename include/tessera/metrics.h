// Process-wide counters: compilation, cache behaviour, host syncs and the allocator.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera {

// Counters of one device kind: what ran there and what crossed between it and the host.
struct DeviceMetrics {
  int64_t steps_launched = 0;    // Steps launched on a device of this kind
  int64_t kernels_compiled = 0;  // Steps compiled for it (Backend::compile calls)
  int64_t bytes_to_device = 0;   // host -> device copies made by the runtime
  int64_t bytes_to_host = 0;     // device -> host copies made by the runtime
  // Host <-> device bytes the backend itself moved while launching a graph's Steps (a host
  // fallback would show here; see backends::report_host_transfer).
  int64_t bytes_moved_in_graphs = 0;
  // Graph runs the backend executed as a whole program (Backend::run_executable), not Step by Step.
  int64_t executables_run = 0;
  int64_t library_calls_compiled = 0;  // Steps a backend claimed for a library (Backend::claim)
};

struct Metrics {
  int64_t graphs_compiled = 0;   // cache misses that compiled a graph
  int64_t cache_hits = 0;        // realizations served by a compiled graph
  int64_t host_syncs = 0;        // item(), to_vector(), printing
  int64_t steps_launched = 0;    // Kernel-IR Steps executed
  int64_t live_bytes = 0;        // bytes allocated on all devices and not yet freed
  int64_t peak_bytes = 0;        // high-water mark of live_bytes (see reset_peak_bytes)
  int64_t bytes_to_device = 0;   // host -> device copies (from_vector, to(device), loading checkpoints)
  int64_t bytes_to_host = 0;     // device -> host copies (item, to_vector, printing, saving, to(device))
  int64_t bf16_flops = 0;        // matrix-product flops run in bfloat16 dot-product instructions
                                 // (the cpu's vdpbf16ps under Autocast; tessera/autocast.h)
  // The memory budget's rewrites (tessera/memory.h): graphs compiled under a budget, and the Steps
  // rematerialization added to them (recomputing activations).
  int64_t budget_graphs = 0;
  int64_t recomputed_steps = 0;
  int64_t unstacked_graphs = 0;  // graphs the budget ran partly in slices (batch unstacking)
  int64_t accumulated_in_place = 0;  // Steps the budget made add into their dying addend's buffer
  double compile_ms = 0;         // total time spent compiling
  double execute_ms = 0;         // total time spent running compiled graphs
  std::map<std::string, DeviceMetrics> devices;  // per device kind ("cpu", "opencl"), once used
  // Why each recent graph was compiled: a new structure, or which input's shape/dtype changed.
  std::vector<std::string> compile_reasons;
  // Every field, one per line, then the compile reasons; for logs and the CLI's --metrics.
  std::string report() const;
};

Metrics metrics();
// Sets the high-water mark to the current live bytes, so a later peak measures one region.
void reset_peak_bytes();

}  // namespace tessera
#pragma GCC visibility pop
