// What one compile is asked to do. The caller fills an Options (the runtime does, from its
// settings and the environment: runtime/compile_options.h) and passes it to compile_graph, which
// hands it to lowering and to each pass. Nothing in the compiler reads the environment or any
// process-wide setting, so two compiles with different options can run side by side.
#pragma once
#include <cstddef>
#include <set>
#include <string>
#include <vector>

#include "kernel_ir/target.h"

namespace tessera::compiler {

// Names of all passes, in pipeline order (passes/passes.h says what each does).
const std::vector<std::string>& pass_names();

// Debug dumps of the pipeline's stages (dump.h writes them).
struct DumpOptions {
  bool ir = false;     // the graph before ("ir") and after ("ir-opt") the IR passes
  bool fused = false;  // every Step of the plan: kind, slots, sources, program, cost
  bool plan = false;   // slots, arena offsets, the memory peak
  std::string dir;     // empty: standard error; else files graph-NNNN.<stage>.txt in it (created)
  int graph = 0;       // NNNN: the compiled graph's number, chosen by the caller
  bool any() const { return ir || fused || plan; }
};

struct Options {
  // Passes switched off by name (pass_names()). "fuse" and "memplan" are modes of stages that
  // always run: lowering then gives every node its own Step; the memory plan gives every
  // temporary its own bytes.
  std::set<std::string> disabled;
  // The device's properties (dtypes, buffer layout, the arena's alignment; kernel_ir/target.h).
  kir::Target target;
  // Debug: guard bytes before and after each arena temporary (rounded up to the alignment), which
  // the runtime fills and checks around the Steps writing it; 0 is off.
  size_t arena_guard = 0;
  // The memory budget: the plan's step bytes (MemoryInfo::step_bytes: parameters, outputs and the
  // arena, what the allocator's high-water mark rises by over what the graph reads) must fit in
  // memory_budget bytes, or in memory_budget_fraction of what the plan needs without the budget
  // passes (its natural figure), or compile_graph throws before anything runs, naming the
  // smallest figure it reached and the buffers live there. 0 and 0.0: no budget.
  size_t memory_budget = 0;
  double memory_budget_fraction = 0;
  // The allocator's granularity (the runtime's; 1 here): the step bytes count each parameter,
  // output and the arena as allocated, rounded up to it, so that a budget bounds what the
  // allocator's high-water mark measures.
  size_t allocation_round = 1;
  // Dumps change nothing compiled, so they are not part of key().
  DumpOptions dump;

  bool enabled(const std::string& pass) const { return !disabled.count(pass); }
  // Everything above that changes the compiled plan except the target (which the caller keys by
  // its device), as a string for a compile-cache key. Equal for equal options.
  std::string key() const;
};

}  // namespace tessera::compiler
