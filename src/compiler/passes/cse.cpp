// cse: merges nodes that are equal except for their scope. Interning (ir::make) already makes
// nodes equal in every field one node, so what remains are copies traced in different scopes
// (a forward value recomputed under "<scope>.backward", the same expand of a constant in two
// modules). Walking the graph in topological order, each node is keyed by op, dtype, shape,
// device, attributes and its (already merged) inputs; a node whose key was seen before is
// replaced by that first node, keeping the first node's scope. A merge makes users equal too, so
// they are rebuilt over the merged input and looked up in turn.
//
// Leaves are never merged (each stands for its own buffer). Rng nodes merge only when their
// attributes (draw index, distribution) match, that is when they draw the very same numbers.
#include <cstring>
#include <unordered_set>

#include "compiler/passes/passes.h"
#include "compiler/passes/rewrite.h"

namespace tessera::compiler {
namespace {

using ir::Node;
using ir::NodePtr;

inline size_t mix(size_t h, size_t v) { return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2)); }

// Hash and equality of everything but the scope (and the buffer: leaves are not keyed).
struct NoScopeHash {
  size_t operator()(const Node* n) const {
    size_t h = mix(size_t(n->op), size_t(n->dtype));
    for (int64_t d : n->shape) h = mix(h, size_t(d));
    h = mix(h, std::hash<std::string>()(n->device.kind));
    h = mix(h, size_t(n->device.index));
    for (auto& i : n->inputs) h = mix(h, reinterpret_cast<size_t>(i.get()));
    for (int64_t v : n->attrs.ints) h = mix(h, size_t(v));
    uint64_t fb;
    std::memcpy(&fb, &n->attrs.f, 8);
    return mix(h, size_t(fb));
  }
};
struct NoScopeEq {
  bool operator()(const Node* a, const Node* b) const {
    return a->op == b->op && a->dtype == b->dtype && a->shape == b->shape && a->device == b->device &&
           a->inputs == b->inputs && a->attrs.ints == b->attrs.ints && std::memcmp(&a->attrs.f, &b->attrs.f, 8) == 0;
  }
};

}  // namespace

ir::Graph cse(const ir::Graph& g) {
  rewrite::Rewriter rw(g);
  std::unordered_set<const Node*, NoScopeHash, NoScopeEq> seen;
  seen.reserve(g.nodes.size());
  for (const NodePtr& np : g.nodes) {
    const Node& n = *np;
    if (n.op == ir::Op::Leaf) {
      rw.out.push_back(np);
      continue;
    }
    bool changed = false;
    std::vector<NodePtr> in = rw.inputs(n, &changed);
    NodePtr r = changed ? rw.remake(n, std::move(in)) : np;
    auto [it, fresh] = seen.insert(r.get());
    if (!fresh) {
      // The first node with this key is in rw.out (a replacement), which keeps it alive.
      r = (*it)->shared_from_this();
    }
    rw.out.push_back(std::move(r));
  }
  return rw.finish();
}

}  // namespace tessera::compiler
