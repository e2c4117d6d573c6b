// The static memory plan of a compiled graph: every buffer with its lifetime over the Steps, the
// arena that holds the temporaries, and the peak of live bytes with what is live there.
//
//   tessera::MemoryPlan p = tessera::plan_memory({loss});  // compiles, does not run
//   std::cout << p.report();   // "peak 12.1 MiB at step 187 of 1400 (reduce ... in blocks.3.attn) ..."
//   loss.item();
//   tessera::last_memory_plan().peak_bytes;                // the graph that just ran
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "tessera/dtype.h"
#include "tessera/shape.h"

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera {

class Tensor;  // tessera/tensor.h

struct PlannedBuffer {
  std::string kind;               // "param" (a graph input), "output" or "temp" (in the arena)
  Shape shape;
  DType dtype = DType::Float32;
  size_t bytes = 0;
  size_t offset = 0;              // temp: byte offset in the arena; 0 for the others
  int first_step = -1;            // the Step that first writes it (-1: a param, live from the start)
  int last_step = -1;             // the last Step that reads or writes it (-1: none)
  std::string op, scope;          // the op and module scope of the value it holds ("parameter" for params)
};

struct MemoryPlan {
  // Live bytes at a Step: the params, the outputs (allocated before the first Step) and the
  // temporaries between their first write and last use. The peak is the largest over the Steps
  // (the first Step reaching it): params + outputs + max_live_temp_bytes.
  size_t peak_bytes = 0;
  int peak_step = -1;
  std::string peak_step_text;               // "reduce f32[4, 16, 1]: reduce_max+exp in blocks.3.attn"
  std::vector<PlannedBuffer> live_at_peak;  // largest first
  std::vector<PlannedBuffer> buffers;       // every buffer the plan uses
  size_t arena_bytes = 0;                   // one allocation holding every temporary
  size_t max_live_temp_bytes = 0;           // most temporary bytes live at once (the arena's lower bound)
  size_t param_bytes = 0;                   // graph inputs (already allocated before the run)
  size_t output_bytes = 0;                  // outputs the run allocates (not those written into a donated input)
  int num_steps = 0;
  // Parameters + outputs + arena, each as allocated (rounded up to the allocator's 256 bytes):
  // what the allocator's high-water mark rises by over the bytes not read by the graph; the
  // memory budget bounds it. With a budget in force (MemoryBudgetScope):
  // the budget in bytes and this figure before the budget passes (both 0 without one).
  size_t step_bytes = 0;
  size_t budget_bytes = 0;
  size_t natural_step_bytes = 0;
  // What the budget passes rewrote: Steps recomputed (their sources read "recompute:<op>") and
  // the flops they add.
  int recomputed_steps = 0;
  double recompute_flops = 0;
  // Batch unstacking inside the step: the slices the region was run in (0: none), its IR nodes,
  // and what it was ("<op> <shape> in <scope> along axis A into K slices (...)").
  int unstacked_slices = 0;
  int unstacked_nodes = 0;
  std::string unstacked;
  // In-place accumulation: Steps that add into their running sum's own buffer (a weight
  // gradient summed over the slices, in its output buffer) instead of a fresh one.
  int accumulated_in_place = 0;
  // A backend that compiles the whole program itself (pjrt: XLA) and so owns its temporaries:
  // its own figures ("XLA: peak ..."); empty for the others.
  std::string device_report;
  // What the device holds when the run ends, beyond what was live before it: the arena plus the
  // new outputs. The allocator's high-water mark over a run is live-before + this (each
  // allocation rounded up to the allocator's 256 bytes).
  size_t run_bytes() const { return arena_bytes + output_bytes; }
  // A few lines: the peak, the Step at it, the largest live buffers, the arena.
  std::string report(size_t max_buffers = 5) const;
};

// A memory budget for what the compiler plans: a graph's step bytes (MemoryPlan::step_bytes) must
// fit `bytes`, or `fraction` of its natural figure (what it plans without a budget), or compiling
// it throws tessera::Error before anything runs, naming the smallest figure reached and the
// buffers (with module paths) live at its peak. A training step traced as one graph (forward,
// backward, update) is bounded whole: parameters, optimizer state, inputs, activations, temporaries.
struct MemoryBudget {
  size_t bytes = 0;
  double fraction = 0;  // in (0, 1]
  bool none() const { return bytes == 0 && fraction <= 0; }
  // "200MB" (B, KB, MB, GB: powers of 1000; KiB, MiB, GiB: of 1024; no unit: bytes), "0.5" (a
  // number up to 1: a fraction), "none" or "" (no budget). Throws "[memory] ..." otherwise.
  static MemoryBudget parse(const std::string& text);
  std::string str() const;  // "209715200 B", "0.5 of the natural peak", "none"
};
// The budget in force for the current compiles (none by default).
MemoryBudget memory_budget();
// Puts a budget in force for its lifetime (then the previous one again). Part of the
// compile-cache key, so a graph compiled without the budget is compiled again under it.
class MemoryBudgetScope {
 public:
  explicit MemoryBudgetScope(const MemoryBudget& budget);
  ~MemoryBudgetScope();
  MemoryBudgetScope(const MemoryBudgetScope&) = delete;
  MemoryBudgetScope& operator=(const MemoryBudgetScope&) = delete;

 private:
  MemoryBudget previous_;
};

// The memory limit: the bytes live buffers may hold on one device (as the allocator counts them,
// each rounded up to 256 bytes; its cache of freed blocks not included). A graph whose new
// buffers (outputs and arena) would cross it beside what is live is refused before anything runs:
// tessera::Error "[memory] out of memory on <device>: ...", naming the plan's peak and the largest
// buffers there with their module paths, and suggesting a memory budget or micro-batches. Any
// other allocation that would cross it fails the same way, as does a backend that cannot allocate
// even after the allocator returned its cached blocks; the tensors stay pending and computable
// once memory is freed. Set by set_memory_limit (0: back to the default) or TESSERA_MEMORY_LIMIT
// ("200MB", "1.5GiB", bytes; read once); by default none (a host that overcommits memory may then
// kill the process instead: set one to get the error).
void set_memory_limit(size_t bytes);
size_t memory_limit();

// Compiles (through the compile cache: counted as a compile or a cache hit) the graph that
// sync() would run to compute these pending tensors, with the same in-place donations, without
// running it. Realized tensors contribute nothing; all pending ones must be on one device.
MemoryPlan plan_memory(const std::vector<Tensor>& outputs);
// The plan of the graph the next sync() would run: every pending tensor (all on one device).
MemoryPlan pending_memory_plan();
// The plan of the graph that ran most recently (empty before any ran), e.g. a training step's.
MemoryPlan last_memory_plan();

}  // namespace tessera
#pragma GCC visibility pop
