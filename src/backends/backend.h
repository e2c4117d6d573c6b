// The backend interface (version 2). A backend owns the memory of its devices and runs
// Kernel-IR Steps (kernel_ir/step.h) on them; docs/backend-guide.md walks through adding one.
//
// Contract, for every function below:
// - Errors: throw tessera::Error whose message starts with the op or subsystem ("[opencl] ...",
//   or for a failing Step its first source op and scope: "[gather] index 7 out of range ...
//   (in scope 'wte')"). Never abort, never return an error code.
// - Threads: the runtime calls a backend from one thread at a time.
// - Memory: pointers handed out by allocate() are opaque to the runtime: it only adds byte
//   offsets inside an allocation (arena temporaries, at multiples of properties().alignment) and
//   passes them back in LaunchArgs::slots, copy_in/copy_out and free. They need not be host
//   addresses (the OpenCL backend returns handles it maps to cl_mem + offset).
// - Ordering: launches and copies on one device take effect in the order they are made; copy_out
//   returns after the data is on the host.
// Required: name, info, allocate, free, copy_in, copy_out, compile, launch. The rest have
// defaults and are optional.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "kernel_ir/step.h"
#include "kernel_ir/target.h"
#include "tessera/device.h"

namespace tessera::backends {

// 2: LaunchArgs::device, Backend::no_device_message, DeviceInfo::accelerator.
constexpr int kInterfaceVersion = 2;

// A compiled Step, opaque to the runtime; destroyed with the Executable that holds it.
struct Kernel {
  virtual ~Kernel() = default;
};

// Runtime values of one execution of a Step.
struct LaunchArgs {
  void* const* slots;  // base pointer of every slot of the executable (from allocate(), plus offsets)
  uint64_t seed = 0;   // random generator state for Rng instructions (core/philox.h)
  uint64_t offset = 0;
  int device = 0;      // index of the device the executable was compiled for
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Device kind as users name it ("cpu", "opencl"): devices are "<name>:<index>".
  virtual std::string name() const = 0;
  // Optional: devices present (0 is allowed: then no_device_message() says why).
  virtual int device_count() const { return 1; }
  // One line about device `index` for `tessera devices` (what it is, memory, features).
  virtual DeviceInfo info(int index) const = 0;
  // Optional: false for backends that compile but never run (null).
  virtual bool can_execute() const { return true; }
  // Optional: what the compiler plans for on device `index` (arena alignment, dtypes computed
  // natively); the defaults suit a host-memory device.
  virtual kir::Target properties(int /*index*/) const { return {}; }
  // Optional: the error text when a program names a device of this kind and none exists.
  virtual std::string no_device_message() const { return ""; }

  // Raw memory on device `index` (the runtime's caching allocator sits on top and reuses freed
  // blocks of equal size). nbytes may be 0; the result must still be a distinct pointer.
  virtual void* allocate(int index, size_t nbytes) = 0;
  virtual void free(int index, void* ptr, size_t nbytes) = 0;
  // Host <-> device copies of nbytes; dst/src may point inside an allocation. Called by the
  // runtime's upload/download (which count the bytes in the metrics) and by guard checks.
  virtual void copy_in(void* dst, const void* host, size_t nbytes) = 0;
  virtual void copy_out(void* host, const void* src, size_t nbytes) = 0;

  // Prepares a Step for launching (any device of this backend). Throws for Steps it cannot run,
  // naming why. May defer real work (building device code) to the first launch, so that all the
  // Steps of one executable are built together.
  virtual std::unique_ptr<Kernel> compile(const kir::Step& step) = 0;
  // Runs a compiled Step on the slots in args, asynchronously if the device allows. Errors found
  // while running (an out-of-range gather index) throw tessera::Error naming the step's source
  // op and scope, by the time synchronize() returns at the latest.
  virtual void launch(const Kernel& k, const kir::Step& step, const LaunchArgs& args) = 0;
  // Optional: waits for all launched work (no-op for synchronous backends).
  virtual void synchronize() {}
};

// Host <-> device bytes a backend moves by itself (anything besides the runtime's copy_in /
// copy_out calls: a flag read back, data staged through the host by a fallback) must be
// reported here. The runtime counts the bytes reported during launch() calls per device kind
// (Metrics::devices, bytes_moved_in_graphs; synchronize() may read back a status word
// uncounted); the conformance suite fails a case whose Steps move any.
void report_host_transfer(const std::string& kind, int64_t bytes);
// Bytes reported so far for a device kind (a stable counter: look it up once, read it often).
std::atomic<int64_t>& reported_host_transfers(const std::string& kind);

// The registry: backends add themselves at start-up; lookups throw for unknown devices.
void register_backend(std::shared_ptr<Backend> b);
Backend& backend_for(const Device& d);  // throws "[device] unknown device 'x'; available: ..."
std::vector<std::shared_ptr<Backend>> all_backends();
// The null device posing as `target` ("null:K", whose properties() are `target`; equal targets
// share one index, and indices are never reused, so compile-cache keys stay valid).
Device null_device_for(const kir::Target& target);

}  // namespace tessera::backends
