#include "compiler/pipeline.h"

#include "compiler/dump.h"
#include "compiler/passes/passes.h"

namespace tessera::compiler {

Plan compile_graph(const ir::Graph& g, const std::vector<int>& donate_to, const Options& opts, ir::Graph* optimized) {
  std::vector<ir::NodePtr> params;
  for (int p : g.params) params.push_back(g.nodes[p]);
  dump_graph(opts.dump, "ir", g);
  ir::Graph h = g;
  if (opts.enabled("simplify")) h = simplify(h);
  if (opts.enabled("cse")) h = cse(h);
  if (opts.enabled("dce")) h = dce(h);
  dump_graph(opts.dump, "ir-opt", h);
  Plan plan = lower(h, params, opts);  // fusion ("fuse") is decided while lowering
  apply_target(plan, opts.target);
  // Scheduling sees single-output Steps; the merges after it keep its order valid.
  if (opts.enabled("schedule")) schedule(plan);
  if (opts.enabled("epilogue")) fuse_epilogues(plan);
  if (opts.enabled("merge")) merge_elementwise(plan), merge_rows(plan);
  donate(plan, opts.enabled("donate") ? donate_to : std::vector<int>{});  // off: nothing written in place
  if (opts.enabled("inplace_last")) inplace_last(plan);
  plan_memory(plan, opts);  // "memplan" off: every temporary gets its own bytes
  try {
    meet_budget(plan, opts);  // the memory budget, when there is one: met or an error
  } catch (...) {
    dump_plan(opts.dump, h, plan);  // the smallest plan reached, to read beside the error
    throw;
  }
  dump_plan(opts.dump, h, plan);
  if (optimized) *optimized = std::move(h);
  return plan;
}

}  // namespace tessera::compiler
