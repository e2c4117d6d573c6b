// The compiler's passes, in pipeline order. Each lives in its own file here and can be switched
// off by name (TESSERA_DISABLE_PASSES=fuse,cse or "all"; tests use set_disabled_passes).
//
//   simplify  IR -> IR   algebraic identities and constant folding
//   cse       IR -> IR   merges nodes equal but for their scope (interning merges the rest)
//   dce       IR -> IR   drops nodes no output needs
//   fuse      lowering   elementwise chains, maps and same-axis row reductions into one Step
//   schedule  Steps      a topological order chosen to lower the peak of live bytes
//   epilogue  Steps      elementwise consumers of a GEMM applied per row block inside it
//   merge     Steps      elementwise Steps over the same positions that share inputs, or where one
//                        reads the other's result element for element, become one multi-output Step;
//                        a Row Step's per-row result joins the later Row Step that recomputes it
//   memplan   Steps      temporaries share one arena by lifetime (off: each gets its own bytes)
#pragma once
#include <string>
#include <vector>

#include "compiler/lower.h"
#include "kernel_ir/target.h"
#include "ir/graph.h"

namespace tessera::compiler {

// Names of all passes, in pipeline order.
const std::vector<std::string>& pass_names();
// False when the pass is disabled (by TESSERA_DISABLE_PASSES or set_disabled_passes).
bool pass_enabled(const char* name);
// Overrides TESSERA_DISABLE_PASSES for this process: a comma list of pass names, or "all".
// Throws tessera::Error naming an unknown pass.
void set_disabled_passes(const std::string& list);
// The disabled set as a string, for the compile cache key.
std::string disabled_passes_key();

// IR passes return a graph over the same leaves (parameters are matched by node, not number).
ir::Graph simplify(const ir::Graph& g);
ir::Graph cse(const ir::Graph& g);
ir::Graph dce(const ir::Graph& g);

// Step passes rewrite plan.steps in place (before donation and memory planning).
void fuse_epilogues(Plan& plan);
void merge_elementwise(Plan& plan);
void merge_rows(Plan& plan);
void schedule(Plan& plan);
// Lays the lowered plan out for a target (target.cpp; always on, a no-op for a host target):
// refuses dtypes it does not compute, stores float32 as target.float32_as, sizes every buffer
// by its tiled layout and scales each Step's bytes with its buffers.
void apply_target(Plan& plan, const kir::Target& target);
// Places temporaries in the arena and fills plan.memory (peak, the Step at the peak, what is live).
void plan_memory(Plan& plan, size_t alignment = 64);
// Debug: guard bytes (rounded up to 64) before and after each arena temporary, which the runtime
// fills and checks around the Steps writing it; 0 (default) is off. TESSERA_ARENA_GUARD=<bytes>.
void set_arena_guard_bytes(size_t bytes);
size_t arena_guard_bytes();

}  // namespace tessera::compiler
