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
// A sub-group (stride s >= 1; 0: the group is every rank of the communicator, ranks == its size):
// the communicator's ranks fall into groups of `ranks`, rank r's being base + i * s (i < ranks,
// base = r - ((r / s) % ranks) * s): the ranks that differ from r only along one axis of a
// row-major mesh, s the product of the sizes after that axis. Roots and permute pairs are
// positions in the group. Encoded as one integer after the op's own (an even count for a permute).
struct CollectiveAttrs {
  int64_t ranks = 1;
  int64_t stride = 0;
  ReduceKind kind = ReduceKind::Sum;  // AllReduce
  int64_t axis = 0;                   // AllGather, ReduceScatter; AllToAll: the split axis
  int64_t concat_axis = 0;            // AllToAll
  int64_t root = 0;                   // Broadcast, Reduce
  std::vector<std::pair<int64_t, int64_t>> pairs;  // CollectivePermute: (source, destination)
  static CollectiveAttrs from(Op op, const Attrs& a);  // no checks: of a node already built
  // For CollectivePermute: the rank rank `r` receives from (-1: none) and sends to (-1: none).
  int64_t source_of(int64_t r) const;
  int64_t destination_of(int64_t r) const;
  // The members of rank r's group (in group order) on a communicator of `world` ranks; throws
  // naming `op` where the groups do not tile the world (world % (ranks * stride) != 0).
  std::vector<int64_t> group_of(int64_t r, int64_t world, const char* op) const;
};

// stride: the sub-group's (CollectiveAttrs::stride; 0: every rank of the communicator).
namespace build {
NodePtr all_reduce(const NodePtr& x, int64_t ranks, ReduceKind kind, int64_t stride = 0);
NodePtr all_gather(const NodePtr& x, int64_t ranks, int64_t axis, int64_t stride = 0);
NodePtr reduce_scatter(const NodePtr& x, int64_t ranks, int64_t axis, int64_t stride = 0);
NodePtr all_to_all(const NodePtr& x, int64_t ranks, int64_t split_axis, int64_t concat_axis, int64_t stride = 0);
NodePtr broadcast(const NodePtr& x, int64_t ranks, int64_t root, int64_t stride = 0);
NodePtr reduce_to_root(const NodePtr& x, int64_t ranks, int64_t root, int64_t stride = 0);
NodePtr collective_permute(const NodePtr& x, int64_t ranks, const std::vector<std::pair<int64_t, int64_t>>& pairs, int64_t stride = 0);
}  // namespace build

// The table's rules (primitives.cpp).
TypeShape infer_collective(Op op, const InferArgs& a);
Cost cost_collective(const Node& n);
VjpRule collective_vjp_rule(Op op);

}  // namespace tessera::ir
