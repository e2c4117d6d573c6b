// runtime::export_stablehlo (stablehlo_export.h).
#include "runtime/stablehlo_export.h"

#include "backends/stablehlo/emit.h"
#include "ir/graph.h"

namespace tessera::runtime {

StableHLOExport export_stablehlo(const std::vector<Request>& requests) {
  std::vector<ir::NodePtr> nodes;
  for (const Request& r : requests) nodes.push_back(r.node);
  ir::Graph g = ir::build_graph(nodes);
  StableHLOExport e;
  for (int p : g.params) e.arguments.push_back(g.nodes[size_t(p)]);
  for (size_t k = 0; k < requests.size(); ++k) {
    std::shared_ptr<Buffer> donor = requests[k].donor.lock();
    if (!donor) continue;
    for (size_t p = 0; p < e.arguments.size(); ++p) {
      const ir::Node& leaf = *e.arguments[p];
      bool taken = false;
      for (auto [a, o] : e.aliases) taken |= a == int(p);
      if (leaf.buffer == donor && !taken && leaf.shape == nodes[k]->shape && leaf.dtype == nodes[k]->dtype) {
        e.aliases.emplace_back(int(p), int(k));
        break;
      }
    }
  }
  stablehlo::Program p = stablehlo::emit(g, {e.aliases});
  e.text = std::move(p.text);
  e.rng = p.rng;
  e.replicas = int(p.replicas);
  e.outputs = p.outputs;
  e.index_checks = int(p.index_checks.size());
  return e;
}

}  // namespace tessera::runtime
