// realize(): nodes -> graph -> compile-cache lookup -> compile on a miss -> run on the device.
#pragma once
#include <memory>
#include <vector>

#include "compiler/lower.h"
#include "ir/graph.h"

namespace tessera::runtime {

struct Request {
  ir::NodePtr node;
  // A buffer the value may be written into, when nothing but this graph can still read it.
  std::weak_ptr<Buffer> donor;
};

struct RngArgs {
  uint64_t seed = 0, offset = 0;
};

// Computes every requested node (all on one device) in one graph; returns one buffer per
// request (contiguous, row-major). Sets *drew_random when the graph contains RNG nodes.
std::vector<std::shared_ptr<Buffer>> realize(const std::vector<Request>& requests, RngArgs rng, bool* drew_random);

}  // namespace tessera::runtime
