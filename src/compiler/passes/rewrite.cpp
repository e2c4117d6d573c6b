#include "compiler/passes/rewrite.h"

#include "ir/saved.h"

namespace tessera::compiler::rewrite {

std::vector<ir::NodePtr> Rewriter::inputs(const ir::Node& n, bool* changed) const {
  std::vector<ir::NodePtr> ins;
  ins.reserve(n.inputs.size());
  *changed = false;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    ins.push_back(input(n, k));
    *changed |= ins.back() != n.inputs[k];
  }
  return ins;
}

ir::NodePtr Rewriter::make_in(const std::string* sc, ir::Op op, std::vector<ir::NodePtr> ins, ir::Attrs attrs,
                              const Shape* shape, DType dtype, const Device& device) {
  scope.enter(sc);
  return ir::make(op, std::move(ins), std::move(attrs), shape, dtype, device);
}

ir::NodePtr Rewriter::remake(const ir::Node& n, std::vector<ir::NodePtr> ins) {
  return make_in(n.scope, n.op, std::move(ins), n.attrs, &n.shape, n.dtype, n.device);
}

ir::NodePtr Rewriter::full(const ir::Node& like, double value, const Shape& shape, DType dtype) {
  return make_in(like.scope, ir::Op::Full, {}, ir::Attrs{{}, value}, &shape, dtype, like.device);
}

ir::Graph Rewriter::finish() {
  // A value saved for a custom VJP's backward stays marked in its rewritten form (ir/saved.h).
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i] != g.nodes[i] && ir::is_saved(g.nodes[i].get())) ir::mark_saved(out[i]);
  bool same = true;
  for (size_t i = 0; i < out.size() && same; ++i) same = out[i] == g.nodes[i];
  if (same) return g;
  std::vector<ir::NodePtr> outs;
  outs.reserve(g.outputs.size());
  for (int o : g.outputs) outs.push_back(out[size_t(o)]);
  return ir::build_graph(outs);
}

}  // namespace tessera::compiler::rewrite
