// The backend interface (version 1). A backend owns device memory and runs Kernel-IR Steps.
// Every function reports failure by throwing tessera::Error with the op or step it was running.
// The runtime calls a backend from one thread at a time.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "kernel_ir/step.h"
#include "kernel_ir/target.h"
#include "tessera/device.h"

namespace tessera::backends {

constexpr int kInterfaceVersion = 1;

// A compiled Step, opaque to the runtime.
struct Kernel {
  virtual ~Kernel() = default;
};

// Runtime values of one execution.
struct LaunchArgs {
  void* const* slots;  // base pointer of every slot of the executable
  uint64_t seed = 0;   // random generator state for Rng instructions
  uint64_t offset = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;   // device kind, e.g. "cpu"
  virtual int device_count() const { return 1; }
  virtual DeviceInfo info(int index) const = 0;
  // False for backends that compile but never run (null).
  virtual bool can_execute() const { return true; }
  // What the compiler plans for on this device (alignment, native dtypes); the defaults suit a
  // host-memory device.
  virtual kir::Target properties(int /*index*/) const { return {}; }

  // Raw device memory (the runtime's caching allocator sits on top). nbytes may be 0.
  virtual void* allocate(int index, size_t nbytes) = 0;
  virtual void free(int index, void* ptr, size_t nbytes) = 0;
  // Host <-> device copies of nbytes at a byte offset into the device pointer.
  virtual void copy_in(void* dst, const void* host, size_t nbytes) = 0;
  virtual void copy_out(void* host, const void* src, size_t nbytes) = 0;

  // Prepares a Step for launching; may throw for unsupported Steps (the message names why).
  virtual std::unique_ptr<Kernel> compile(const kir::Step& step) = 0;
  // Runs a compiled Step on the slots in args. Errors found while running (an out-of-range
  // gather index) throw tessera::Error naming the step's source op and scope.
  virtual void launch(const Kernel& k, const kir::Step& step, const LaunchArgs& args) = 0;
  // Waits for all launched work (no-op for synchronous backends).
  virtual void synchronize() {}
};

// Host <-> device bytes a backend moves by itself (anything besides the runtime's copy_in /
// copy_out calls: a flag read back, data staged through the host by a fallback) must be
// reported here. The runtime counts the bytes reported while a graph runs per device kind
// (Metrics::devices, bytes_moved_in_graphs); the conformance suite fails a Step that moves any.
void report_host_transfer(const std::string& kind, int64_t bytes);
int64_t reported_host_transfers(const std::string& kind);  // bytes reported so far

// The registry: backends add themselves at start-up; lookups throw for unknown devices.
void register_backend(std::shared_ptr<Backend> b);
Backend& backend_for(const Device& d);  // throws "[device] unknown device 'x'; available: ..."
std::vector<std::shared_ptr<Backend>> all_backends();

}  // namespace tessera::backends
