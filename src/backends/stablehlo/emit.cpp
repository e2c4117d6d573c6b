// The StableHLO emitter's driver (emit.h): @main's signature, one lowering per node in graph
// order (lower.h), the results, and the index checks' errors.
#include "backends/stablehlo/emit.h"

#include <algorithm>
#include <numeric>

#include "backends/stablehlo/lower.h"
#include "core/fail.h"
#include "ir/collectives.h"

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
    case ir::Category::Collective: return lower_collective(L, n, in);
  }
  fail("stablehlo", std::string("no lowering for ") + ir::op_name(n.op));
}

// The replicas the module runs on (1 without collectives). A collective over every rank (stride
// 0) fixes them: its rank count, the same for every such collective. A sub-group collective of r
// ranks at stride s needs a world that its groups tile, a multiple of r x s: without a collective
// over every rank, the module is for the least common multiple of those spans (on a larger world
// of such multiples each block of that many ranks would run the same program independently).
int64_t replicas_of(const ir::Graph& g) {
  const ir::Node* first = nullptr;
  std::vector<const ir::Node*> sub;  // the sub-group collectives
  int64_t world = 1;
  for (const ir::NodePtr& n : g.nodes) {
    if (!ir::is_collective(n->op)) continue;
    const ir::CollectiveAttrs c = ir::CollectiveAttrs::from(n->op, n->attrs);
    if (c.stride > 0) {
      sub.push_back(n.get());
      world = std::lcm(world, c.ranks * c.stride);
    } else if (!first) {
      first = n.get();
    } else if (c.ranks != first->attrs.ints.at(0)) {
      fail(ir::op_name(n->op),
           "a StableHLO module runs on one set of replicas: this collective is for " + std::to_string(c.ranks) +
               " ranks, an earlier " + ir::op_name(first->op) + " for " + std::to_string(first->attrs.ints[0]),
           *n->scope);
    }
  }
  if (!first) return world;
  for (const ir::Node* n : sub)  // each must tile the collective's ranks: the runtime's error otherwise
    ir::CollectiveAttrs::from(n->op, n->attrs).group_of(0, first->attrs.ints[0], ir::op_name(n->op));
  return first->attrs.ints[0];
}

// Each (parameter, output) pair names existing ones of equal shape and dtype, each at most once.
void check_aliases(const ir::Graph& g, const EmitOptions& o) {
  for (size_t i = 0; i < o.aliases.size(); ++i) {
    auto [p, out] = o.aliases[i];
    for (size_t j = 0; j < i; ++j)
      if (o.aliases[j].first == p || o.aliases[j].second == out)
        fail("stablehlo", "parameter " + std::to_string(p) + " or output " + std::to_string(out) + " is aliased twice");
    if (p < 0 || p >= int(g.params.size()) || out < 0 || out >= int(g.outputs.size()))
      fail("stablehlo", "alias of parameter " + std::to_string(p) + " to output " + std::to_string(out) + ": the graph has " +
                            std::to_string(g.params.size()) + " parameters and " + std::to_string(g.outputs.size()) + " outputs");
    const ir::Node& a = *g.nodes[size_t(g.params[size_t(p)])];
    const ir::Node& r = *g.nodes[size_t(g.outputs[size_t(out)])];
    if (r.shape != a.shape || r.dtype != a.dtype)
      fail("stablehlo", "parameter " + std::to_string(p) + " (" + dtype_name(a.dtype) + shape_str(a.shape) +
                            ") cannot alias output " + std::to_string(out) + " (" + dtype_name(r.dtype) + shape_str(r.shape) + ")");
  }
}

// @main's arguments: the params (donated ones marked), then {seed, offset} when the graph draws
// random numbers. Binds each param's value.
std::string signature(const ir::Graph& g, const EmitOptions& o, bool rng, std::vector<V>& vals) {
  check_aliases(g, o);
  std::vector<std::string> args;
  for (size_t p = 0; p < g.params.size(); ++p) {
    const ir::Node& n = *g.nodes[size_t(g.params[p])];
    V v{"%arg" + std::to_string(p), n.shape, elem_of(n.dtype)};
    vals[size_t(g.params[p])] = v;
    std::string a = v.id + ": " + v.type();
    for (auto [param, out] : o.aliases)
      if (param == int(p)) a += " {tf.aliasing_output = " + std::to_string(out) + " : i32}";
    args.push_back(a);
  }
  if (rng) args.push_back("%rng: tensor<2xui64>");
  std::string s;
  for (size_t i = 0; i < args.size(); ++i) s += (i ? ", " : "") + args[i];
  return s;
}

}  // namespace

Program emit(const ir::Graph& g, const EmitOptions& o) {
  Program prog;
  prog.replicas = replicas_of(g);
  prog.rng = std::any_of(g.nodes.begin(), g.nodes.end(), [](const ir::NodePtr& n) { return n->op == Op::Rng; });
  std::vector<V> vals(g.nodes.size());
  std::string args = signature(g, o, prog.rng, vals);
  Writer w;
  std::vector<std::pair<IndexCheck, V>> checks;
  Lowering L{w, V{"%rng", {2}, "ui64"}, checks, prog.replicas};
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
  prog.text = "module @tessera attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = " + std::to_string(prog.replicas) +
              " : i32} {\n"
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
