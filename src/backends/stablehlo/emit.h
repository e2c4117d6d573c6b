// The StableHLO emitter: one Tessera graph -> one MLIR module whose `func.func public @main`
// computes the graph, in the textual form PJRT plugins accept with format "mlir" (and jax's
// compile_and_load). Part of the backend SDK (cmake/sdk.txt): the pjrt backend plugin uses it.
//
// @main's arguments, in order:
//   - the realized leaves, ir::Graph::params in order (one tensor each, the leaf's dtype/shape);
//   - when Program::rng: one more, tensor<2xui64> = {seed, offset}, the graph's runtime RNG state
//     (the same (seed, offset) the cpu backend receives; Rng nodes draw philox(seed, offset, d, i)).
// @main's results, in order:
//   - 0..outputs-1: ir::Graph::outputs in order (dtypes and shapes of the output nodes);
//   - outputs + k: tensor<2xi64> for index_checks[k]: {the lowest row-major position in the
//     bounds-checked op's index tensor holding an out-of-range index, or -1 when none; the index
//     value there}. XLA clamps such indices; Tessera raises, naming the value (cpu backend).
// A graph with collectives is one rank's program of an SPMD group (docs/architecture.md
// "Parallelism"): the module is one replica's, for Program::replicas replicas (mhlo.num_replicas),
// replica r being rank r; compile it with num_replicas = replicas and run it on that many devices.
// Scopes (module paths) travel as MLIR locations, loc("blocks.0.mlp"), on the ops they produced.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"

#pragma GCC visibility push(default)  // the backend SDK: exported for plugins
namespace tessera::stablehlo {

struct EmitOptions {
  std::vector<std::pair<int, int>> aliases;  // (parameter number, output number): donated buffers,
                                             // marked on @main's arguments as aliased outputs
                                             // (tf.aliasing_output); shapes and dtypes must match
};

// One bounds-checked op (Gather, ScatterAdd): what the cpu backend's error names.
struct IndexCheck {
  std::string op;          // the primitive's name ("gather", "scatter_add")
  std::string scope;       // the node's scope ("" at top level)
  std::string shape_text;  // the indexed tensor's shape, as the cpu error names it ("[4, 8]")
  int64_t axis = 0;        // the indexed axis
  int64_t extent = 0;      // its extent (valid indices are 0..extent-1)
};

struct Program {
  std::string text;  // MLIR text: one module, one `func.func public @main` (layout above)
  int outputs = 0;   // results 0..outputs-1 are ir::Graph::outputs in order
  int64_t replicas = 1;  // the replicas it is compiled for (1 without collectives): the rank count of
                         // its collectives over every rank, else the least common multiple of its
                         // sub-groups' spans (ranks x stride)
  bool rng = false;  // @main takes the trailing tensor<2xui64> {seed, offset} argument
  std::vector<IndexCheck> index_checks;  // result outputs+k: a tensor<2xi64> per bounds-checked op
};

// Throws tessera::Error ("[stablehlo] ...") for a graph it cannot emit (none expected: every
// primitive of the table is covered).
Program emit(const ir::Graph& g, const EmitOptions& o = {});
// Throws the same tessera::Error as the cpu backend for the first check whose value is not -1.
// `values` holds the results outputs.. of @main flattened: two entries per index_checks entry.
void raise_index_errors(const Program& p, const std::vector<int64_t>& values);

}  // namespace tessera::stablehlo
#pragma GCC visibility pop
