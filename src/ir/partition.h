// The partitioner (docs/architecture.md "Parallelism", "Sharding and the partitioner"): a bounded
// GSPMD pass. From a single-device graph's outputs (the whole training step: forward, backward,
// update, traced on full shapes) and the shardings of some of its leaves, it propagates shardings
// forward through the ops and builds ONE per-rank graph (the same on every rank, SPMD) with local
// shapes and collectives where shardings meet. Rank-dependent data enters only as leaves that the
// caller makes per rank (a leaf's block, or a block's global indices), through PartitionHooks.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ir/node.h"

namespace tessera::ir {

// How one dimension of a tensor is laid out over the mesh: replicated (axis -1), or split into
// blocks over mesh axis `axis`. With groups g > 1 the dimension is g equal groups, each split
// over the axis (rank r holds block r of every group, concatenated): the layout of a fused
// [q; k; v] weight split Megatron style, so slicing whole groups needs no communication.
struct DimSharding {
  int axis = -1;
  int64_t groups = 1;
  bool sharded() const { return axis >= 0; }
  bool operator==(const DimSharding& o) const { return axis == o.axis && (axis < 0 || groups == o.groups); }
  bool operator!=(const DimSharding& o) const { return !(*this == o); }
};
using Sharding = std::vector<DimSharding>;  // one per dimension

struct MeshAxes {
  std::vector<std::string> names;
  std::vector<int64_t> sizes;
  int64_t ranks() const {  // the product of the sizes
    int64_t n = 1;
    for (int64_t z : sizes) n *= z;
    return n;
  }
  std::vector<int64_t> coords(int64_t rank) const {  // row-major over the axes
    std::vector<int64_t> c(sizes.size());
    for (size_t i = c.size(); i-- > 0; rank /= sizes[i]) c[i] = rank % sizes[i];
    return c;
  }
  int64_t rank_of(const std::vector<int64_t>& c) const {
    int64_t r = 0;
    for (size_t i = 0; i < c.size(); ++i) r = r * sizes[i] + c[i];
    return r;
  }
};

// "{none, model}", "{model/3, none}" (groups after a slash).
std::string sharding_str(const Sharding& s, const MeshAxes& mesh);

struct PartitionHooks {
  // Rank 0's leaf holding its block of `leaf` laid out as `s` (the caller slices every rank's
  // block and gives rank r's as that rank's value of the returned leaf).
  std::function<NodePtr(const Node& leaf, const Sharding& s)> shard_leaf;
  // Rank 0's int64 [extent / N] leaf holding the global indices of its block of a dimension of
  // `extent` laid out as `d` (each rank gets its own): how a replicated value that is neither a
  // leaf nor a constant is cut to the local block (a gather, no communication).
  std::function<NodePtr(int64_t extent, const DimSharding& d)> block_index;
};

struct Partitioned {
  std::vector<NodePtr> outputs;     // the per-rank graph's outputs, local shapes
  std::vector<Sharding> shardings;  // each output's layout (replicated: every rank's same value)
  int64_t ranks = 1;
};

// Throws tessera::Error "[partition] <op> in '<scope>': <operands and shardings> ..." where a
// combination is not supported. A collective over one mesh axis is over that axis' sub-group
// (CollectiveAttrs::stride) where the mesh has several axes, else over every rank.
// gather_outputs: every output all-gathered in the graph (replicated), for ranks that cannot
// gather on one host (MPI processes).
Partitioned partition(const std::vector<NodePtr>& outputs, const std::function<const Sharding*(const Node& leaf)>& leaf_sharding,
                      const MeshAxes& mesh, const PartitionHooks& hooks, bool gather_outputs = false);

// The collectives of a graph by kind ("all_reduce" -> 3, ...).
std::map<std::string, int> count_collectives(const std::vector<NodePtr>& outputs);

}  // namespace tessera::ir
