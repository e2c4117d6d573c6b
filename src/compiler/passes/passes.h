// The compiler's passes, in pipeline order. Each lives in its own file here and can be switched
// off by name (Options::disabled; the runtime fills it from TESSERA_DISABLE_PASSES=fuse,cse or
// "all", and runtime::set_disabled_passes).
//
//   simplify  IR -> IR   algebraic identities and constant folding
//   cse       IR -> IR   merges nodes equal but for their scope (interning merges the rest)
//   dce       IR -> IR   drops nodes no output needs
//   place     IR -> IR   only for a target declaring Target::gemm_out_offset, with "fuse" on: sums
//                        of zero pads of products become concatenations, which the lowering has
//                        the products write straight into (place.cpp, Lowerer::place_concat)
//   fuse      lowering   elementwise chains, maps and same-axis row reductions into one Step
//   schedule  Steps      a topological order chosen to lower the peak of live bytes
//   epilogue  Steps      elementwise consumers of a GEMM applied per row block inside it
//   merge     Steps      elementwise Steps over the same positions that share inputs, or where one
//                        reads the other's result element for element, become one multi-output Step;
//                        a Row Step's per-row result joins the later Row Step that recomputes it;
//                        sibling Reduce Steps sharing an input become one of several outputs
//                        (for a target declaring Target::multi_reduce)
//   group     Steps      only for a target declaring Target::elementwise_parts: the consecutive
//                        independent in-place updates at the end (an optimizer's, of every
//                        parameter) as one Step of parts, one launch (group_updates.cpp)
//   memplan   Steps      temporaries share one arena by lifetime (off: each gets its own bytes)
//   unstack   IR -> IR   under a memory budget: a region of the graph independent along a batch-like
//                        dimension run in k sequential slices in the one step, row outputs
//                        concatenated, sums over that dimension accumulated (unstack.cpp)
//   remat     Steps      under a memory budget: activations live across the peak recomputed where
//                        they are read again (budget.cpp runs both, cheapest plan first; remat.cpp)
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "compiler/lower.h"
#include "compiler/options.h"
#include "ir/graph.h"
#include "kernel_ir/target.h"

namespace tessera::compiler {

// IR passes return a graph over the same leaves (parameters are matched by node, not number).
ir::Graph simplify(const ir::Graph& g);
ir::Graph cse(const ir::Graph& g);
ir::Graph dce(const ir::Graph& g);
// The IR half of "place" (place.cpp), for a target declaring Target::gemm_out_offset: a sum of
// zero pads of products along adjacent ranges of one axis becomes their concatenation (which the
// lowering has the products write into), and a batched product read through a permute moving its
// rows last computes the transposed product instead. attention: the target fuses attention
// (Target::attention, the pass on): gradients a fused attention backward writes are left alone,
// except that attention_in_place (Target::attention_out_maps) lets their pads join too.
ir::Graph join_pads(const ir::Graph& g, bool attention, bool attention_in_place);

// Step passes rewrite plan.steps in place (before donation and memory planning).
void fuse_epilogues(Plan& plan);
void merge_elementwise(Plan& plan);
void merge_rows(Plan& plan);
void merge_reduces(Plan& plan);  // only for a target declaring Target::multi_reduce
// Casts to bfloat16 read only by products folded into them (Step::rounded), for a device that
// declares Target::gemm_rounds_operands (fold_casts.cpp).
void fold_casts(Plan& plan);
void schedule(Plan& plan);
// "group" (group_updates.cpp), after donation and inplace_last, only for a target declaring
// Target::elementwise_parts: consecutive independent Elementwise Steps writing donated buffers
// (an optimizer's in-place updates) become one Step of parts (kir::Step::parts), one launch.
void group_updates(Plan& plan);
// Lays the lowered plan out for a target (target.cpp; always on, a no-op for a host target):
// refuses dtypes it does not compute, stores float32 as target.float32_as, sizes every buffer
// by its tiled layout and scales each Step's bytes with its buffers.
void apply_target(Plan& plan, const kir::Target& target);
// Places temporaries in the arena at multiples of opts.target.alignment, each with
// opts.arena_guard bytes before and after it (plan.arena_guard: rounded up to the alignment),
// sharing bytes by lifetime unless "memplan" is disabled, and fills plan.memory (peak, the Step at
// the peak, what is live).
void plan_memory(Plan& plan, const Options& opts = {});
// The memory budget (budget.cpp): the bytes opts asks for given the plan's natural step bytes (0:
// none), and, after plan_memory, the budget passes until plan.memory.step_bytes fits it; throws
// tessera::Error ("[memory] ...") naming the smallest figure reached and the buffers at its peak.
size_t resolve_budget(const Options& opts, size_t natural);
// Lowers a graph and runs the Step passes and the memory plan on it (the pipeline's; `store`: nodes
// whose values are stored as soon as they are computed).
using PlanBuilder = std::function<Plan(const ir::Graph& g, const std::vector<int>& store)>;
// g: the graph plan was built from. When unstacking wins, *rewritten is the sliced graph (else
// untouched) and plan is built from it. Over the budget, the budget passes start from
// build(g, {}) again with values saved for custom VJPs recomputed instead (Options "saved" off:
// plan has them stored, which rematerialization cannot undo), and build so for their plans.
using OptionsPlanBuilder = std::function<Plan(const ir::Graph& g, const std::vector<int>& store, const Options& opts)>;
void meet_budget(Plan& plan, const ir::Graph& g, const Options& opts, const OptionsPlanBuilder& build, std::optional<ir::Graph>* rewritten);
// Batch unstacking (unstack.cpp): the graph with the region around its largest computed value
// that is independent along one of its axes run in k = 2, 4, ..., 64 sequential slices, with the
// smallest k whose plan fits `budget` (else the smallest step bytes seen); nothing when no
// rewrite plans fewer step bytes than `current`.
struct Unstacked {
  Plan plan;
  ir::Graph graph;
  int slices = 0, nodes = 0;
  std::string what;  // "<op> <shape> in <scope> along axis A into K slices (...)"
};
std::optional<Unstacked> unstack(const ir::Graph& g, size_t budget, size_t current, const PlanBuilder& build);
// In-place accumulation (accumulate.cpp): a Gemm Step adding a temporary that dies there to its
// product accumulates into its output instead (Step::accumulate, where target.gemm_accumulate),
// and an Elementwise Step reading such a temporary only at the element it writes writes over it;
// the temporary's slot becomes the output's. Returns how many Steps it rewrote (memory not
// re-planned).
int accumulate_in_place(Plan& plan, const kir::Target& target);
// Recomputes temporaries live across the peak Step, cheapest per byte first (remat.cpp), until
// plan.memory.step_bytes fits `budget` or no candidate is left; GEMMs only with allow_gemm.
// Leaves the plan with the smallest step bytes it saw, memory planned.
void rematerialize(Plan& plan, const Options& opts, size_t budget, bool allow_gemm);

}  // namespace tessera::compiler
