// Lowering: an IR graph -> Kernel-IR Steps over numbered buffer slots. Movement primitives become
// index maps of the loads that read them, and constants become instructions (no Step, no
// buffer). The pipeline (pipeline.h) runs the passes around it. Convolutions lower in
// lower_conv.cpp, donation is donate.cpp.
#pragma once
#include <vector>

#include "compiler/options.h"
#include "ir/graph.h"
#include "kernel_ir/step.h"

namespace tessera::compiler {

// The static memory plan of an executable (passes/memory_plan.cpp). Bytes live at a Step are the
// parameters, the outputs (the runtime allocates them before the first Step) and the temporaries
// between their first write and last use; the peak is the largest such sum over the program.
struct MemoryInfo {
  size_t peak_bytes = 0;
  int peak_step = -1;
  std::vector<int> live_at_peak;   // slots live at the peak Step
  size_t max_live_temp_bytes = 0;  // largest sum of temporaries live at once (the arena's lower bound)
  // What running the plan holds at its high-water mark: parameters + outputs + the arena (>= the
  // peak, by the arena's fragmentation). The memory budget bounds this figure.
  size_t step_bytes = 0;
  // The memory budget (passes/budget.cpp): the bytes it resolved to (0: none) and step_bytes
  // before the budget passes rewrote anything.
  size_t budget_bytes = 0;
  size_t natural_step_bytes = 0;
  // What the budget passes did: Steps recomputed ("remat") and their flops; the region unstacked
  // ("unstack": nodes, slices, what; 0 and "": none).
  int recomputed_steps = 0;
  double recompute_flops = 0;
  int unstacked_slices = 0, unstacked_nodes = 0;
  int accumulated_in_place = 0;  // Steps writing a running sum over its dying addend ("accumulate")
  double extra_cost = 0;  // the chosen plan's Steps' flops + bytes over the natural plan's
  std::string unstacked;
};

struct Plan {
  std::vector<kir::Step> steps;
  std::vector<kir::Slot> slots;
  size_t arena_bytes = 0;
  size_t alignment = 64;             // of arena offsets and sizes (the target's)
  size_t arena_guard = 0;            // debug guard bytes before and after each temporary (a multiple of alignment)
  std::vector<int> slots_of_params;  // per parameter: its slot
  std::vector<int> output_slot;      // per graph output (g.outputs order)
  std::vector<int> donated;          // per graph output: parameter whose buffer it is written into, or -1
  MemoryInfo memory;
  std::string device_memory;         // the backend's own account, when it compiled the whole program
  std::string str() const;           // the plan, one line per step and slot
};

// Lowers g; params are the leaves in parameter order (the graph the cache keyed, before any IR
// pass), so parameter numbers stay those of the original graph. Fusion is decided here, so the
// "fuse" switch is read here: with it disabled in opts every compute node gets its own Step.
Plan lower(const ir::Graph& g, const std::vector<ir::NodePtr>& params, const Options& opts = {});
// The same, storing the values of the nodes in `store` (indices into g) as soon as they are
// lowered, never fused into a later consumer (the unstack pass's slice exits).
Plan lower(const ir::Graph& g, const std::vector<ir::NodePtr>& params, const Options& opts, const std::vector<int>& store);

// donate[k] names a parameter that output k may overwrite (-1: none); it is honoured only when
// no Step reads the parameter's old value after the output is written. Run after scheduling.
void donate(Plan& plan, const std::vector<int>& donate);
// All or nothing (docs/architecture.md, Failure isolation): the Steps writing donated buffers in
// place, and what depends on them, run after every other Step, so a failure before them leaves
// every in-place tensor's old value intact. Pass "inplace_last".
void inplace_last(Plan& plan);

// Where a plan's memory peaks, for errors: "its peak at step N (<kind> <shape>: <op> in <scope>);
// largest buffers live there: <kind> <dtype/shape> <MiB> <op> in <scope>; ..." (passes/budget.cpp).
std::string describe_peak(const Plan& plan, size_t max_buffers = 8);
std::string mib(size_t bytes);  // "12.34 MiB"

}  // namespace tessera::compiler
