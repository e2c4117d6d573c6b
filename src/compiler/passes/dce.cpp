// dce: keeps only the nodes some output needs. Graphs from ir::build_graph (and so the output of
// every IR pass) hold reachable nodes only, so this is the explicit check of that invariant: one
// reverse sweep marking what the outputs read; a graph with nothing dead is returned as it is,
// anything else is rebuilt from its outputs (same outputs, same order, leaves untouched).
#include "compiler/passes/passes.h"

namespace tessera::compiler {

ir::Graph dce(const ir::Graph& g) {
  std::vector<char> live(g.nodes.size(), 0);
  for (int o : g.outputs) live[size_t(o)] = 1;
  size_t n_live = 0;
  for (size_t i = g.nodes.size(); i-- > 0;) {
    if (!live[i]) continue;
    ++n_live;
    for (const ir::NodePtr& in : g.nodes[i]->inputs) live[size_t(g.index.at(in.get()))] = 1;
  }
  if (n_live == g.nodes.size()) return g;
  std::vector<ir::NodePtr> outs;
  outs.reserve(g.outputs.size());
  for (int o : g.outputs) outs.push_back(g.nodes[size_t(o)]);
  return ir::build_graph(outs);
}

}  // namespace tessera::compiler
