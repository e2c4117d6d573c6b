// The collective primitives (primitives.h, Op::AllReduce .. Op::CollectivePermute): their
// attribute layout as a struct, builders, and the rules the primitive table holds.
// docs/architecture.md "Parallelism" says how graphs with collectives run.
#pragma once
#include <utility>
#include <vector>

#include "ir/node.h"
#include "ir/primitives.h"

namespace tessera::ir {

// A collective's attributes, decoded (Attrs::ints of each op, primitives.h).
struct CollectiveAttrs {
  int64_t ranks = 1;
  ReduceKind kind = ReduceKind::Sum;  // AllReduce
  int64_t axis = 0;                   // AllGather, ReduceScatter; AllToAll: the split axis
  int64_t concat_axis = 0;            // AllToAll
  int64_t root = 0;                   // Broadcast, Reduce
  std::vector<std::pair<int64_t, int64_t>> pairs;  // CollectivePermute: (source, destination)
  static CollectiveAttrs from(Op op, const Attrs& a);  // no checks: of a node already built
  // For CollectivePermute: the rank rank `r` receives from (-1: none) and sends to (-1: none).
  int64_t source_of(int64_t r) const;
  int64_t destination_of(int64_t r) const;
};

namespace build {
NodePtr all_reduce(const NodePtr& x, int64_t ranks, ReduceKind kind);
NodePtr all_gather(const NodePtr& x, int64_t ranks, int64_t axis);
NodePtr reduce_scatter(const NodePtr& x, int64_t ranks, int64_t axis);
NodePtr all_to_all(const NodePtr& x, int64_t ranks, int64_t split_axis, int64_t concat_axis);
NodePtr broadcast(const NodePtr& x, int64_t ranks, int64_t root);
NodePtr reduce_to_root(const NodePtr& x, int64_t ranks, int64_t root);
NodePtr collective_permute(const NodePtr& x, int64_t ranks, const std::vector<std::pair<int64_t, int64_t>>& pairs);
}  // namespace build

// The table's rules (primitives.cpp).
TypeShape infer_collective(Op op, const InferArgs& a);
Cost cost_collective(const Node& n);
VjpRule collective_vjp_rule(Op op);

}  // namespace tessera::ir
