// The per-primitive lowerings of the StableHLO emitter (internal to src/backends/stablehlo):
// each writes the ops computing one IR node from its inputs' values and returns its value.
// float16/bfloat16 are storage types (tessera/dtype.h): arithmetic on them converts to float32,
// computes, and rounds back, as the cpu backend does.
#pragma once
#include <vector>

#include "backends/stablehlo/emit.h"
#include "backends/stablehlo/writer.h"
#include "ir/node.h"

namespace tessera::stablehlo {

// What a lowering may need besides its inputs.
struct Lowering {
  Writer& w;
  V rng_state;  // tensor<2xui64> {seed, offset} (when the graph draws random numbers)
  std::vector<std::pair<IndexCheck, V>>& checks;  // bounds checks, in graph order
  int64_t replicas = 1;  // the module's (Program::replicas): the world sub-group collectives tile
};

// x in the dtype arithmetic on it runs in (float16/bfloat16 -> float32).
V compute(Writer& w, const V& x);
// x (of dtype `from`) converted to `to` as a Tessera cast converts (cpu backend, reference).
V cast(Writer& w, const V& x, DType from, DType to);

// Full, Iota, Cast, unary, binary, compare, Where, ReduceSum, ReduceMax (elementwise.cpp).
V lower_elementwise(Lowering& L, const ir::Node& n, const std::vector<V>& in);
// Reshape, Permute, Expand, Slice, Pad, Concat, Reverse, Matmul, Conv (structure.cpp).
V lower_structure(Lowering& L, const ir::Node& n, const std::vector<V>& in);
// Gather, ScatterAdd, DynamicUpdateSlice (indexing.cpp).
V lower_indexing(Lowering& L, const ir::Node& n, const std::vector<V>& in);
// AllReduce .. CollectivePermute, for the module's replicas (collective.cpp).
V lower_collective(Lowering& L, const ir::Node& n, const std::vector<V>& in);
// Rng: Philox4x32-10 written out in integer ops, bit-identical to core/philox.h (rng.cpp).
V lower_rng(Lowering& L, const ir::Node& n);

}  // namespace tessera::stablehlo
