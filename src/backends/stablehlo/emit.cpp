// The StableHLO emitter's driver (emit.h): @main's signature, one lowering per node in graph
// order (lower.h), the results, and the index checks' errors.
#include "backends/stablehlo/emit.h"

#include <algorithm>

#include "backends/stablehlo/lower.h"
#include "core/fail.h"

namespace tessera::stablehlo {
namespace {

using ir::Op;

V lower_node(Lowering& L, const ir::Node& n, const std::vector<V>& in) {
  switch (ir::info(n.op).category) {
    case ir::Category::Source:
      if (n.op == Op::Rng) return lower_rng(L, n);
      return lower_elementwise(L, n, in);
    case ir::Category::Elementwise: case ir::Category::Reduce: return lower_elementwise(L, n, in);
    case ir::Category::Movement: case ir::Category::Contraction: return lower_structure(L, n, in);
    case ir::Category::Indexing: return lower_indexing(L, n, in);
  }
  fail("stablehlo", std::string("no lowering for ") + ir::op_name(n.op));
}

// @main's arguments: the params, then {seed, offset} when the graph draws random numbers.
std::string signature(const ir::Graph& g, const EmitOptions& o, bool rng, std::vector<V>& vals) {
  std::string args;
  for (size_t p = 0; p < g.params.size(); ++p) {
    const ir::Node& n = *g.nodes[size_t(g.params[p])];
    V v{"%arg" + std::to_string(p), n.shape, elem_of(n.dtype)};
    vals[size_t(g.params[p])] = v;
    args += (p ? ", " : "") + v.id + ": " + v.type();
    for (auto [param, out] : o.aliases) {
      if (param != int(p)) continue;
      if (out < 0 || out >= int(g.outputs.size())) fail("stablehlo", "alias of parameter " + std::to_string(p) + " to output " + std::to_string(out) + " of " + std::to_string(g.outputs.size()));
      const ir::Node& r = *g.nodes[size_t(g.outputs[size_t(out)])];
      if (r.shape != n.shape || r.dtype != n.dtype)
        fail("stablehlo", "parameter " + std::to_string(p) + " (" + dtype_name(n.dtype) + shape_str(n.shape) + ") cannot alias output " +
                              std::to_string(out) + " (" + dtype_name(r.dtype) + shape_str(r.shape) + ")");
      args += " {tf.aliasing_output = " + std::to_string(out) + " : i32}";
    }
  }
  for (auto [param, out] : o.aliases)
    if (param < 0 || param >= int(g.params.size())) fail("stablehlo", "alias of parameter " + std::to_string(param) + " of " + std::to_string(g.params.size()));
  if (rng) args += std::string(g.params.empty() ? "" : ", ") + "%rng: tensor<2xui64>";
  return args;
}

}  // namespace

Program emit(const ir::Graph& g, const EmitOptions& o) {
  Program prog;
  prog.rng = std::any_of(g.nodes.begin(), g.nodes.end(), [](const ir::NodePtr& n) { return n->op == Op::Rng; });
  std::vector<V> vals(g.nodes.size());
  std::string args = signature(g, o, prog.rng, vals);
  Writer w;
  std::vector<std::pair<IndexCheck, V>> checks;
  Lowering L{w, V{"%rng", {2}, "ui64"}, checks};
  std::vector<V> in;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& n = *g.nodes[i];
    if (n.op == Op::Leaf) continue;
    in.clear();
    for (const ir::NodePtr& x : n.inputs) in.push_back(vals[size_t(g.index.at(x.get()))]);
    w.loc = n.scope->empty() ? "" : " loc(" + quote(*n.scope) + ")";
    vals[i] = lower_node(L, n, in);
  }
  std::vector<V> results;
  for (int k : g.outputs) results.push_back(vals[size_t(k)]);
  prog.outputs = int(results.size());
  for (auto& [c, v] : checks) {
    prog.index_checks.push_back(c);
    results.push_back(v);
  }
  std::string types, ids;
  for (size_t k = 0; k < results.size(); ++k) {
    types += (k ? ", " : "") + results[k].type();
    ids += (k ? ", " : "") + results[k].id;
  }
  prog.text = "module @tessera attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {\n"
              "  func.func public @main(" + args + ") -> (" + types + ") {\n" + w.text() +
              "    func.return" + (results.empty() ? "" : " " + ids + " : " + types) + "\n  }\n}\n";
  return prog;
}

void raise_index_errors(const Program& p, const std::vector<int64_t>& values) {
  if (values.size() != 2 * p.index_checks.size())
    fail("stablehlo", std::to_string(values.size()) + " index check values for " + std::to_string(p.index_checks.size()) + " checks");
  for (size_t k = 0; k < p.index_checks.size(); ++k) {
    if (values[2 * k] < 0) continue;
    const IndexCheck& c = p.index_checks[k];
    fail(c.op, "index " + std::to_string(values[2 * k + 1]) + " out of range [0, " + std::to_string(c.extent) +
                   ") along dimension " + std::to_string(c.axis) + " of a tensor of shape " + c.shape_text,
         c.scope);
  }
}

}  // namespace tessera::stablehlo
