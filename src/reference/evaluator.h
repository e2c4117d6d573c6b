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

// SPMD: N ranks evaluated in lockstep, rank r running graphs[r] (usually one graph for all) on
// its own parameters params[r] (empty: the leaves' buffers). Each rank runs until its next
// collective; there every rank must be at a collective of the same kind, attributes, shape and
// dtype (ir/collectives.h gives their semantics), else tessera::Error names the collective and
// every rank's side of it -- the error every rank gets. Returns per rank its outputs.
// evaluate() above is this on one rank (collectives for ranks = 1).
std::vector<std::vector<Value>> evaluate_ranks(const std::vector<const ir::Graph*>& graphs, uint64_t seed, uint64_t offset,
                                               const std::vector<std::vector<Value>>& params = {});
// One collective node on every rank at once: x[r] is rank r's input.
std::vector<Value> evaluate_collective(const ir::Node& n, const std::vector<const Value*>& x);

// Reads a host buffer of `dtype` into doubles.
std::vector<double> read_host(const void* data, DType dtype, int64_t n);

// Row-major position arithmetic of the evaluators (evaluator.cpp, collectives.cpp).
using Index = std::vector<int64_t>;
// The multi-index of linear position `lin` in shape s (a zero extent gives index 0 there).
inline void unravel(int64_t lin, const Shape& s, Index& idx) {
  idx.resize(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    idx[d] = s[d] == 0 ? 0 : lin % s[d];
    lin = s[d] == 0 ? 0 : lin / s[d];
  }
}
inline int64_t ravel(const Index& idx, const Shape& s) {
  int64_t lin = 0;
  for (size_t d = 0; d < s.size(); ++d) lin = lin * s[d] + idx[d];
  return lin;
}

}  // namespace tessera::reference
