// The backend interface (version kInterfaceVersion below). A backend owns the memory of its devices and runs
// Kernel-IR Steps (kernel_ir/step.h) on them; docs/backend-guide.md walks through adding one.
// It is part of the backend SDK: a backend may be built into libtessera (cpu, null) or live in a
// plugin, a shared library exporting one C function (backends/plugin.h).
//
// Contract, for every function below:
// - Errors: throw tessera::Error whose message starts with the op or subsystem ("[opencl] ...",
//   or for a failing Step its first source op and scope: "[gather] index 7 out of range ...
//   (in scope 'wte')"). Never abort, never return an error code. (A plugin's errors cross the
//   library boundary as a status and a message; backends/plugin.h does that for you.)
// - Threads: the runtime calls a backend from one thread at a time.
// - Memory: pointers handed out by allocate() are opaque to the runtime: it only adds byte
//   offsets inside an allocation (arena temporaries, at multiples of properties().alignment) and
//   passes them back in LaunchArgs::slots, the copies and free. They need not be host addresses
//   (the OpenCL backend returns handles it maps to cl_mem + offset).
// - Ordering: launches and copies on one device take effect in the order they are made (a
//   stream); copy_out returns after the data is on the host.
// Required: name, info, allocate, free, copy_in, copy_out, compile, launch. Everything else
// has a default and is optional: the per-Step level alone runs every program.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/communicator.h"
#include "core/buffer.h"
#include "kernel_ir/step.h"
#include "kernel_ir/target.h"
#include "tessera/device.h"

#pragma GCC visibility push(default)  // the backend SDK: exported for plugins
namespace tessera::ir {
struct Graph;  // ir/graph.h
}

namespace tessera::backends {

// 2: LaunchArgs::device, Backend::no_device_message, DeviceInfo::accelerator.
// 3: library calls, whole executables, asynchronous copies, device-to-device copies and events;
//    plugins (backends/plugin.h), whose version the loader checks.
// 4: the shared renderer's dialects (render::Dialect::options, row_block; KernelCode::group_size;
//    RNG_ARGS/RNG_INIT), so a plugin built against an older SDK is refused, not crashed.
// 5: ExecutableSpec::param_slots, output_slots, donated and memory_report (a backend that
//    compiles spec.graph itself: pjrt).
// 6: StepKind::Collective (Step::collective, collective_attrs), the collectives a backend runs
//    through the current communicator (backends/collective.h); a backend that does not refuses
//    them in compile().
// 7: Step::accumulate (a Gemm Step adding its product into its output slot's contents) and
//    Target::gemm_accumulate, which a backend sets to be given such Steps (the cpu does).
// 8: StepKind::Attention (Step::attention) and Target::attention, which a backend sets to be
//    given such Steps (the cpu does); a backend that does not never receives one.
// 9: sub-group collectives (CollectiveAttrs::stride, CollectiveSequence::stride) and the SDK's
//    Communicator gaining group()/make_group() and traffic counts: its layout changed.
// 10: Step::out_strides (a Gemm writing its product through strides) and
//    Target::gemm_out_strides, which a backend sets to be given such Steps (the cpu does).
// 11: Backend::start_collective (a collective Step started, completed later: the runtime overlaps
//    data parallelism's all-reduces with the Steps after them) and Communicator::start_all_reduce.
// 12: Step::rounded (a Gemm Step's float32 operands rounded to bfloat16 as the product reads them)
//    and Target::gemm_rounds_operands, which a backend sets to be given such Steps (the cpu does).
// 13: Target::multi_reduce (Reduce Steps with more_outputs), which a backend sets to be given
//    such Steps (the cpu does).
// 14: Step::out_offset (a Gemm with out_strides writing from that element of its slot: several
//    such Steps write disjoint parts of one slot), for a backend declaring Target::gemm_out_offset.
// 15: Step::out_maps (an attention backward Step writing dQ, dK^T and dV through strides into
//    parts of one slot; a forward Step its output in its reader's layout), for a backend
//    declaring Target::attention_out_maps.
// 16: Step::parts (independent Elementwise Steps run as one launch: an optimizer's updates of
//    every parameter), for a backend declaring Target::elementwise_parts.
// 17: Step::Attention::bf16 (autocast's attention: bfloat16 operands, or float32 ones rounded as
//    read through Step::rounded, float32 accumulation) and Target::attention_bf16, which a backend
//    sets to be given such Steps (the cpu does).
constexpr int kInterfaceVersion = 17;

// A compiled Step, opaque to the runtime; destroyed with the executable that holds it.
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

// A library call a backend may take over instead of rendering the Step (Backend::claim).
struct Claim {
  bool claimed = false;
  // The library applies the Step's epilogue program itself. When false and the Step has one,
  // the runtime splits it off (kir::split_epilogue) into an Elementwise Step after the call,
  // compiled with compile() like any other.
  bool fuses_epilogue = false;
};

// Per-run values of a whole executable, at the start of its scalars buffer (RunArgs::scalars):
// a buffer that lives as long as the executable, so a replayed program reads this run's values
// from the addresses it captured.
struct RunScalars {
  uint64_t seed = 0, offset = 0;  // the random generator state (LaunchArgs::seed, offset)
};

// What compile_executable() receives: the whole program, both as IR and as planned Steps.
struct ExecutableSpec {
  const ir::Graph* graph = nullptr;              // the optimized IR (after the IR passes): e.g. for StableHLO
  const std::vector<kir::Step>* steps = nullptr; // the planned Steps, in order
  const std::vector<kir::Slot>* slots = nullptr; // every slot (params, outputs, arena temporaries)
  std::vector<const Kernel*> kernels;            // per Step: what compile() / compile_library() returned
  size_t arena_bytes = 0;                        // temporaries live at arena base + Slot::offset
  size_t scalars_bytes = 0;                      // RunScalars, then staged parameters (see RunArgs)
  int device = 0;
  // For backends that compile `graph` itself (StableHLO): per parameter of `graph` (its params
  // order) the slot holding it; per output (its outputs order) the slot it is written to; per
  // output the parameter of `graph` whose buffer it is written into (donation), or -1.
  std::vector<int> param_slots, output_slots, donated;
  // Optional out: the device's own account of the program's memory (XLA's compiled memory stats),
  // shown by tessera::MemoryPlan::report() beside the planner's figures.
  std::string* memory_report = nullptr;
};

// One run of a whole executable. slots: every slot's pointer for this run. Small parameters
// (at most 8 bytes: a learning rate, a step count) that the run does not write are copied into
// the scalars buffer first and their slots point there, so they too sit at fixed addresses.
struct RunArgs {
  void* const* slots = nullptr;
  void* scalars = nullptr;  // device memory: RunScalars, then the staged parameters
  int device = 0;
};

// A compiled whole program (compile_executable), opaque to the runtime.
struct Executable {
  virtual ~Executable() = default;
};

// A point in a device's stream (record_event).
struct Event {
  virtual ~Event() = default;
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
  // Optional, v11: a StepKind::Collective Step started and not waited for (the runtime completes
  // the handle before the first later Step that touches the Step's input or output slot, or at
  // the end of the executable, and tests it between Steps). Null (the default): the backend
  // does not start this one; the runtime launch()es it. The cpu backend starts all-reduces
  // (backends/collective.h, start_collective_on_host).
  virtual std::unique_ptr<PendingCollective> start_collective(const Kernel& /*k*/, const kir::Step& /*step*/,
                                                              const LaunchArgs& /*args*/) {
    return nullptr;
  }

  // ---- optional, v3: library calls ----
  // Whether the backend runs this Step with a library (a GEMM through cuBLASLt; a conv product,
  // kir::Step::conv set, through cuDNN) rather than compile(). Asked of Gemm Steps before they
  // are compiled; a claimed Step is compiled with compile_library().
  virtual Claim claim(const kir::Step& /*step*/, int /*device*/) { return {}; }
  virtual std::unique_ptr<Kernel> compile_library(const kir::Step& step) { return compile(step); }

  // ---- optional, v3: whole executables ----
  // Compiles the whole program after its Steps were compiled (a CUDA graph to replay, a
  // StableHLO module for a PJRT plugin); null declines, and the runtime launches Step by Step.
  // run_executable() then replaces the per-Step launches of each run (the runtime still checks
  // arena guards after the run and synchronizes). Such a backend should implement copy_device:
  // the runtime stages small parameters into the scalars buffer with it before each run.
  virtual std::unique_ptr<Executable> compile_executable(const ExecutableSpec& /*spec*/) { return nullptr; }
  virtual void run_executable(Executable& /*exe*/, const RunArgs& /*args*/) {}

  // ---- optional, v3: asynchronous and device-to-device copies, events ----
  // True when copy_in_async/copy_out_async return before the copy is done (then the runtime
  // keeps the host memory alive until an event recorded after the copy has completed).
  virtual bool async_copies() const { return false; }
  virtual void copy_in_async(void* dst, const void* host, size_t nbytes) { copy_in(dst, host, nbytes); }
  virtual void copy_out_async(void* host, const void* src, size_t nbytes) { copy_out(host, src, nbytes); }
  // dst on device dst_index, src on src_index, both of this backend. The default goes through
  // the host (and reports it with report_host_transfer).
  virtual void copy_device(void* dst, int dst_index, const void* src, int src_index, size_t nbytes);
  // A point after everything issued so far on device `index`; null for synchronous backends,
  // for which every point has passed.
  virtual std::unique_ptr<Event> record_event(int /*index*/) { return nullptr; }
  virtual bool event_done(const Event& /*e*/) { return true; }  // polls
  virtual void wait_event(const Event& /*e*/) {}                 // the host waits
};

// Host <-> device bytes a backend moves by itself (anything besides the runtime's copy_in /
// copy_out calls: a flag read back, data staged through the host by a fallback) must be
// reported here. The runtime counts the bytes reported during launch() calls per device kind
// (Metrics::devices, bytes_moved_in_graphs; synchronize() may read back a status word
// uncounted); the conformance suite fails a case whose Steps move any.
void report_host_transfer(const std::string& kind, int64_t bytes);
// Bytes reported so far for a device kind (a stable counter: look it up once, read it often).
std::atomic<int64_t>& reported_host_transfers(const std::string& kind);
// Flops a backend ran in bfloat16 dot-product instructions (the cpu's vdpbf16ps; products of
// autocast): reported per launch, read by the runtime into Metrics::bf16_flops.
void report_bf16_flops(int64_t flops);
int64_t bf16_flops_reported();

// The registry: cpu and null are built in; plugins (backends/plugin.h) are loaded at the first
// lookup of a device kind that is not built in, or of all devices (never at start-up).
void register_backend(std::shared_ptr<Backend> b);
Backend& backend_for(const Device& d);  // throws "[device] unknown device 'x'; available: ..."
std::vector<std::shared_ptr<Backend>> all_backends();  // loads the plugins first
// A plugin that failed to load: its file and why (a version mismatch, a missing library ...).
// `unavailable` is set when the plugin itself is fine but its backend cannot run on this machine
// (no driver, no GPU): the backend's own reason, listed as "<kind>: not available (<reason>)".
struct PluginFailure {
  std::string path, reason, kind, unavailable;
};
std::vector<PluginFailure> plugin_failures();  // loads the plugins first
// The null device posing as `target` ("null:K", whose properties() are `target`; equal targets
// share one index, and indices are never reused, so compile-cache keys stay valid).
Device null_device_for(const kir::Target& target);

}  // namespace tessera::backends
#pragma GCC visibility pop
