// A graph as a StableHLO module (backends/stablehlo/emit.h), with the buffers its arguments
// read and the donations realize() would consider (a request's donor that is one of the graph's
// parameters, of the same shape and dtype, becomes an aliased output).
#pragma once
#include <memory>
#include <utility>
#include <vector>

#include <string>

#include "runtime/realize.h"

namespace tessera::runtime {

struct StableHLOExport {
  std::string text;      // the module (stablehlo::Program::text)
  bool rng = false;      // @main takes {seed, offset} last
  int outputs = 0;       // results: the requests' values, then index_checks check values
  int index_checks = 0;
  int replicas = 1;      // the collectives' group size (stablehlo::Program::replicas)
  std::vector<ir::NodePtr> arguments;  // ir::Graph::params (realized leaves), in order
  std::vector<std::pair<int, int>> aliases;        // (argument, output)
};

StableHLOExport export_stablehlo(const std::vector<Request>& requests);

}  // namespace tessera::runtime
