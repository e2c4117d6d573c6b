// Shared machinery of the IR -> IR passes (simplify, cse, dce): a bottom-up rewrite of a graph
// that maps every node to its replacement, rebuilding a node with ir::make (in the node's own
// scope) only when one of its inputs was replaced. Nodes nothing touched are reused as they are,
// so a pass that changes nothing costs one walk and returns the graph unchanged.
//
// Invariants every pass keeps: no new Leaf nodes (leaves are never rebuilt; the lowering matches
// parameters by node), one output per original output in the same order, and values unchanged
// (bit for bit on the CPU backend, see simplify.cpp for the rules).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "core/scope_impl.h"
#include "ir/graph.h"

namespace tessera::compiler::rewrite {

// Sets the thread's scope for ir::make calls, switching only when the scope changes (a ScopeAs
// copies the path, so one per rebuilt node would dominate a pass's time). Restores on destruction.
class ScopeSwitch {
 public:
  void enter(const std::string* scope) {
    if (scope == cur_) return;
    as_.reset();
    as_.emplace(*scope);
    cur_ = scope;
  }

 private:
  const std::string* cur_ = nullptr;
  std::optional<ScopeAs> as_;
};

struct Rewriter {
  const ir::Graph& g;
  std::vector<ir::NodePtr> out;  // per node of g (same index): its replacement
  ScopeSwitch scope;

  explicit Rewriter(const ir::Graph& graph) : g(graph) { out.reserve(graph.nodes.size()); }

  // The replacement of input k of g.nodes[i] (inputs always precede their users).
  const ir::NodePtr& input(const ir::Node& n, size_t k) const { return out[size_t(g.index.at(n.inputs[k].get()))]; }
  // n's inputs mapped to their replacements; *changed tells whether any differs.
  std::vector<ir::NodePtr> inputs(const ir::Node& n, bool* changed) const;

  // A node like n (op, attributes, shape, dtype, device, scope) over other inputs.
  ir::NodePtr remake(const ir::Node& n, std::vector<ir::NodePtr> ins);
  // A new node in `scope`.
  ir::NodePtr make_in(const std::string* scope, ir::Op op, std::vector<ir::NodePtr> ins, ir::Attrs attrs,
                      const Shape* shape, DType dtype, const Device& device);
  // A Full constant standing where `like` stood (its scope and device).
  ir::NodePtr full(const ir::Node& like, double value, const Shape& shape, DType dtype);

  // The rewritten graph: g itself when every node maps to itself, else the graph of the
  // replaced outputs (build_graph: reachable nodes only, deterministic order).
  ir::Graph finish();

  // Rewrites g in order: a node with inputs becomes rule(n, its inputs' replacements), or, where
  // the rule gives nullptr, n over those inputs (n itself when none changed); then finish().
  template <class Rule>
  ir::Graph apply(Rule&& rule) {
    for (const ir::NodePtr& np : g.nodes) {
      if (np->inputs.empty()) {
        out.push_back(np);
        continue;
      }
      bool changed = false;
      std::vector<ir::NodePtr> in = inputs(*np, &changed);
      ir::NodePtr r = rule(*np, in);
      if (!r) r = changed ? remake(*np, std::move(in)) : np;
      out.push_back(std::move(r));
    }
    return finish();
  }
};

}  // namespace tessera::compiler::rewrite
