// Where a backend and a communicator meet -- the only place (docs/architecture.md
// "Parallelism"): a StepKind::Collective Step run on a host-memory backend's slots through the
// calling thread's current communicator (backends/communicator.h). It lays the buffers out the
// way the communicator's raw collectives take them (an all_gather along axis k gathers blocks
// rank-major, then interleaves them along k) and checks the group size against the Step's.
// A graph for 1 rank runs without a communicator.
//
// Also here, because it moves the backend's buffers through the communicator too: the
// collective-sequence check (docs/architecture.md "Parallelism"). Before an executable with
// collectives first runs on a communicator, the runtime has every rank compare the ordered
// collectives it compiled, so ranks that traced different programs all fail up front instead of
// at (or, without the per-call check, past) the first collective where they part.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/communicator.h"

#pragma GCC visibility push(default)  // the backend SDK: exported for plugins
namespace tessera::backends {

void run_collective_on_host(const kir::Step& st, void* const* slots);
// The same Step started, not waited for, where the communicator can (an all_reduce over two or
// more ranks: Communicator::start_all_reduce); null for every other Step, which
// run_collective_on_host runs (blocking). Until the handle completes, the Step's input slot must
// not be written nor its output slot read or written (the runtime's rule: docs/architecture.md
// "Parallelism", overlap).
std::unique_ptr<PendingCollective> start_collective_on_host(const kir::Step& st, void* const* slots);

// The collectives of a plan's Steps in launch order, as the ranks compare them.
struct CollectiveSequence {
  // Per collective: what is compared ("all_reduce sum float32[4, 8]", "all_gather(axis 0)
  // float64[2]"; every attribute, the input's dtype and shape, the group size where it is not
  // the communicator's), and the module scope it came from (reported, not compared).
  std::vector<std::string> items, scopes;
  std::vector<int64_t> group;   // each one's group size (its `ranks`, also in its item)
  std::vector<int64_t> stride;  // each one's sub-group stride (0: the whole communicator; also in its item)
  uint64_t hash = 0;  // FNV-1a over the items in order (0 for none)
  bool empty() const { return items.empty(); }
};
CollectiveSequence collective_sequence(const std::vector<kir::Step>& steps);

// "" when every rank's sequence (ranks[r], in rank order) equals rank 0's; else the error text,
// naming the first collective where they part: "the ranks compiled different collective sequences
// (every rank fails): collective 1: rank 0 all_reduce sum float32[4, 8] for 2 ranks (in scope
// 'mlp'); rank 1 all_gather(axis 0) float32[4, 8] for 2 ranks (in scope 'mlp')"; a rank that has
// no collective there reads "rank 1 none (it compiled 1 collective)".
std::string compare_collective_sequences(const std::vector<const CollectiveSequence*>& ranks);

// The check on one rank, through `comm` (every rank of it calls this at the same point, before
// its executable's first Step): one all_gather of {marker, hash, count, text size} (4 int64), and only
// when those differ a second of every rank's items (its text, padded to the longest), so that
// every rank throws the same "[spmd] ..." message of compare_collective_sequences. The buffers
// are the backend's memory (be.allocate on `device`), like the collective Steps' slots: the
// communicator serves what the backend that runs the collectives holds.
void check_collective_sequence(const CollectiveSequence& mine, Communicator& comm, Backend& be, int device);

}  // namespace tessera::backends
#pragma GCC visibility pop
