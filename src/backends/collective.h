// Where a backend and a communicator meet -- the only place (docs/architecture.md
// "Parallelism"): a StepKind::Collective Step run on a host-memory backend's slots through the
// calling thread's current communicator (backends/communicator.h). It lays the buffers out the
// way the communicator's raw collectives take them (an all_gather along axis k gathers blocks
// rank-major, then interleaves them along k) and checks the group size against the Step's.
// A graph for 1 rank runs without a communicator.
#pragma once
#include "backends/backend.h"
#include "backends/communicator.h"

#pragma GCC visibility push(default)  // the backend SDK: exported for plugins
namespace tessera::backends {

void run_collective_on_host(const kir::Step& st, void* const* slots);

}  // namespace tessera::backends
#pragma GCC visibility pop
