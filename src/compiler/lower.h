// Lowering: an IR graph -> Kernel-IR Steps over numbered buffer slots, plus the arena plan for
// intermediates. For now one Step per compute primitive; movement primitives become index maps
// of the loads that read them, and constants become instructions (no Step, no buffer).
#pragma once
#include <vector>

#include "ir/graph.h"
#include "kernel_ir/step.h"

namespace tessera::compiler {

struct Plan {
  std::vector<kir::Step> steps;
  std::vector<kir::Slot> slots;
  size_t arena_bytes = 0;
  std::vector<int> output_slot;  // per graph output (g.outputs order)
  std::vector<int> donated;      // per graph output: parameter whose buffer it is written into, or -1
  std::string str() const;       // the plan, one line per step and slot
};

// donate[k] names a parameter that output k may overwrite (-1: none); it is honoured only when
// no Step reads the parameter's old value after the output is written.
Plan lower(const ir::Graph& g, const std::vector<int>& donate);

}  // namespace tessera::compiler
