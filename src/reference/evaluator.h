// The float64 reference evaluator: plain scalar loops over the IR, one per primitive. It defines
// Tessera's semantics and shares no code with the Kernel IR or any backend.
#pragma once
#include <cstdint>
#include <vector>

#include "ir/graph.h"

namespace tessera::reference {

struct Value {
  Shape shape;
  DType dtype;               // the dtype the IR gives the value
  std::vector<double> data;  // row-major
};

// Evaluates every output of `g`. Leaves are read from their buffers (host-memory devices:
// "cpu"); `params`, when non-empty, supplies them instead (one per g.params, in order).
// RNG nodes draw with (seed, offset). Gather/scatter indices out of range throw tessera::Error.
std::vector<Value> evaluate(const ir::Graph& g, uint64_t seed, uint64_t offset,
                            const std::vector<Value>& params = {});

// Reads a host buffer of `dtype` into doubles.
std::vector<double> read_host(const void* data, DType dtype, int64_t n);

}  // namespace tessera::reference
