// Exporting a traced computation as a StableHLO module (docs/architecture.md, "StableHLO"), the
// portable program XLA's PJRT plugins compile: `tessera export --stablehlo` writes one.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "tessera/tensor.h"

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera {

struct StableHLOModule {
  std::string text;                // MLIR text: one `func.func public @main`
  std::vector<Tensor> arguments;   // the realized tensors @main takes first, in order
  bool rng = false;                // then a tensor<2xui64> {seed, offset}: the random state
  RngState rng_state;              // the {seed, offset} sync() would run the graph with
  int outputs = 0;                 // @main's first results: `outputs` of export_stablehlo, in order
  int index_checks = 0;            // then one tensor<2xi64> per bounds-checked gather/scatter:
                                   // {lowest out-of-range position or -1, the index there}
  std::vector<std::pair<int, int>> aliases;  // (argument, output): donated buffers (tf.aliasing_output)
  // The replicas it runs on, 1 without collectives: the rank count of its collectives
  // (tessera/distributed.h); with only a mesh axis' sub-groups, the least ranks they tile.
  // The module is one rank's program (mhlo.num_replicas = replicas): compile it with num_replicas =
  // replicas and give replica r rank r's arguments (the tensors in `arguments` are this process's).
  int replicas = 1;
};

// The module computing `outputs` as sync() would (the same graph; an in-place update's old
// buffer is donated to its new value), without running anything: the tensors stay pending.
StableHLOModule export_stablehlo(const std::vector<Tensor>& outputs);

}  // namespace tessera
#pragma GCC visibility pop
