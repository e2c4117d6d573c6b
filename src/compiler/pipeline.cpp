#include "compiler/pipeline.h"

#include "compiler/dump.h"
#include "compiler/passes/passes.h"

namespace tessera::compiler {

Plan compile_graph(const ir::Graph& g, const std::vector<int>& donate_to, const kir::Target& target, ir::Graph* optimized) {
  std::vector<ir::NodePtr> params;
  for (int p : g.params) params.push_back(g.nodes[p]);
  dump_graph("ir", g);
  ir::Graph h = g;
  if (pass_enabled("simplify")) h = simplify(h);
  if (pass_enabled("cse")) h = cse(h);
  if (pass_enabled("dce")) h = dce(h);
  dump_graph("ir-opt", h);
  Plan plan = lower(h, params);
  apply_target(plan, target);
  // Scheduling sees single-output Steps; the merges after it keep its order valid.
  if (pass_enabled("schedule")) schedule(plan);
  if (pass_enabled("epilogue")) fuse_epilogues(plan);
  if (pass_enabled("merge")) merge_elementwise(plan), merge_rows(plan);
  donate(plan, donate_to);
  plan_memory(plan, target.alignment);
  dump_plan(h, plan);
  if (optimized) *optimized = std::move(h);
  return plan;
}

}  // namespace tessera::compiler
