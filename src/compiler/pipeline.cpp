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
  if (opts.enabled("place") && opts.enabled("fuse") && opts.target.gemm_out_strides && opts.target.gemm_out_offset) h = join_pads(h, opts.enabled("attention") && opts.target.attention, opts.target.attention_out_maps);
  dump_graph(opts.dump, "ir-opt", h);
  auto build = [&](const ir::Graph& x, const std::vector<int>& store, const Options& o) {
    Plan p = lower(x, params, o, store);  // fusion ("fuse") is decided while lowering
    apply_target(p, o.target);
    // Scheduling sees single-output Steps; the merges after it keep its order valid.
    if (o.enabled("schedule")) schedule(p);
    if (o.enabled("epilogue")) fuse_epilogues(p);
    if (o.enabled("merge")) {
      merge_rows(p), merge_elementwise(p);
      if (o.target.multi_reduce) merge_reduces(p);
    }
    if (o.enabled("fold_casts") && o.target.gemm_rounds_operands) fold_casts(p);
    donate(p, o.enabled("donate") ? donate_to : std::vector<int>{});  // off: nothing written in place
    if (o.enabled("inplace_last")) inplace_last(p);
    if (o.enabled("group") && o.target.elementwise_parts) group_updates(p);
    plan_memory(p, o);  // "memplan" off: every temporary gets its own bytes
    return p;
  };
  Plan plan = build(h, {}, opts);
  std::optional<ir::Graph> unstacked;
  try {
    meet_budget(plan, h, opts, build, &unstacked);  // the memory budget, when there is one: met or an error
  } catch (...) {
    dump_plan(opts.dump, h, plan);  // the smallest plan reached, to read beside the error
    throw;
  }
  if (unstacked) {
    h = std::move(*unstacked);
    dump_graph(opts.dump, "ir-unstack", h);
  }
  dump_plan(opts.dump, h, plan);
  if (optimized) *optimized = std::move(h);
  return plan;
}

}  // namespace tessera::compiler
