// realize(): nodes -> graph -> compile-cache lookup -> compile on a miss -> run on the device.
#pragma once
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/buffer.h"
#include "tessera/error.h"
#include "ir/node.h"

namespace tessera::compiler {
struct Plan;  // compiler/lower.h: what side modules that read plans include themselves
}

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
// request (contiguous, row-major). Throws GraphFailure when the graph fails while running;
// errors before anything runs (compiling, memory) are plain tessera::Errors.
std::vector<std::shared_ptr<Buffer>> realize(const std::vector<Request>& requests, RngArgs rng);

// A graph that failed while running (a Step threw: an index out of range, a device error, a test
// hook), with what the tensor layer needs to confine the failure to what depended on it. Per
// request: its buffer when its value was complete before the failed Step (else null); whether it
// depends on the failed Step (`tainted`; untainted incomplete ones never ran and can run again);
// and for a donated request, whether a Step up to the failed one wrote into the donor (its old
// value is then lost). Where the failed Step is unknown (a whole program, an asynchronous
// device's synchronize), every request is tainted and every donated donor counts as written.
struct GraphFailure : Error {
  using Error::Error;
  int failed_step = -1;
  std::vector<std::shared_ptr<Buffer>> done;
  std::vector<bool> tainted, donor_written;
};

// What realize() would run for `requests`, compiled (or found in the compile cache, counted as a
// compile or a hit, with the same donation decisions) but not run. With `target`, compiled for
// that device (its backend and properties, e.g. backends::null_device_for) instead of the nodes'.
std::shared_ptr<const compiler::Plan> compile_only(const std::vector<Request>& requests, const Device* target = nullptr);
// The plan of the graph realize() ran last, or realize_spmd() (rank 0's) (null before the first).
std::shared_ptr<const compiler::Plan> last_executed_plan();
// Benchmarks: forgets every compiled graph (and the structures seen, so the next compile's reason
// reads "new graph structure"); the next realize() of any graph compiles it afresh.
void clear_compile_cache();

// Step capture (tessera/capture.h): the executable a realize() ran, kept so that the same graph
// can run again on new parameter buffers without building the graph, its key or the lookup.
struct CapturedGraph;
struct CaptureSlot {
  std::shared_ptr<const CapturedGraph> graph;
  // The graph's parameters' buffers in that run, in parameter order (what run_captured binds).
  std::vector<std::shared_ptr<Buffer>> params;
  // Per request: the parameter whose buffer its value was written into (-1: a new buffer).
  std::vector<int> donated;
};
// While `slot` is set on the calling thread, each realize() there fills it (null: off).
void set_capture_slot(CaptureSlot* slot);
// Runs a captured graph again on `params` (one buffer per parameter, of the recorded sizes; a
// donated parameter's buffer must be the caller's alone: it is overwritten). Returns one buffer
// per request, as realize() does, and throws GraphFailure likewise.
std::vector<std::shared_ptr<Buffer>> run_captured(const CapturedGraph& graph, const std::vector<std::shared_ptr<Buffer>>& params,
                                                  RngArgs rng);
// The compile settings in force (compile_options.h): their key, shared by everything compiled
// under the same settings object (so pointer equality is a cheap first test).
std::shared_ptr<const std::string> compile_settings_key();
// Whether two captures ran the same executable.
bool same_captured(const CapturedGraph& a, const CapturedGraph& b);

// Arena guards (debug; set_arena_guard in compile_options.h, part of the cache key): realize()
// fills each temporary's guards with kGuardByte before the Steps writing it and checks them after
// each such Step, throwing tessera::Error naming the Step when one changed.
// guard_bytes_checked() counts the bytes verified so far.
constexpr unsigned char kGuardByte = 0xA5;
int64_t guard_bytes_checked();
// The collective-sequence checks realize() has made through a communicator (docs/architecture.md
// "Parallelism"): one per sequence of collectives and communicator, before the first run there.
int64_t collective_sequence_checks();
// Collectives in flight across Steps (runtime/overlap.h; docs/architecture.md "Parallelism"):
// on unless TESSERA_COLLECTIVE_OVERLAP=0; set_collective_overlap switches it for the process (tests
// and A/B measurements). The stats count, over the process: collective Steps started without
// waiting, Steps launched while at least one of them was pending, and the time spent completing
// them (waiting for the other ranks and the transfer where the Steps did not hide it).
void set_collective_overlap(bool on);
struct CollectiveOverlapStats {
  int64_t started = 0, steps_overlapped = 0, wait_ns = 0;
};
CollectiveOverlapStats collective_overlap_stats();
// Testing: called after every launched Step with its number and the slot pointers (null: none).
using StepHook = std::function<void(int step, void* const* slots)>;
void set_after_step_hook(StepHook hook);

}  // namespace tessera::runtime

namespace tessera::backends {
class Communicator;
}
namespace tessera::runtime {

// SPMD on in-process ranks (docs/architecture.md "Parallelism"): the graph of `requests` is
// built and compiled ONCE by the calling thread (the lazy graph's owner), on rank 0's tensors;
// then ranks.size() threads run that same executable, rank r with ranks[r] as its current
// communicator, its own arena and outputs, and its own parameters: rank_inputs[r] maps a leaf
// buffer of the graph (rank 0's) to rank r's buffer of the same size (a leaf it does not name
// is shared, read only). Returns per rank its outputs (in the requests' order). A rank that
// fails breaks the group, so no rank waits for it; the first failure is thrown, naming its rank.
// rank_requests (optional; empty entries: rank 0's): a rank's own graph in place of rank 0's, for
// graphs that differ between ranks only in constants (random draws at the rank's rows of the
// batch); same leaves, same number of outputs; compiled here, each run by its rank.
using RankInputs = std::vector<std::pair<const Buffer*, std::shared_ptr<Buffer>>>;
std::vector<std::vector<std::shared_ptr<Buffer>>> realize_spmd(const std::vector<Request>& requests, RngArgs rng,
                                                               const std::vector<RankInputs>& rank_inputs,
                                                               const std::vector<std::shared_ptr<backends::Communicator>>& ranks,
                                                               const std::vector<std::vector<Request>>& rank_requests = {});

}  // namespace tessera::runtime

namespace tessera::runtime {

// What one rank's collective Steps moved through its communicator (backends::Communicator::Traffic):
// calls, and bytes it sent under ring algorithms.
struct CommTraffic {
  int64_t calls = 0, bytes = 0;
};
// realize_spmd on a fresh in-process group of `ranks` rank threads (backends::make_inprocess_group);
// traffic (optional): each rank's, of this run.
std::vector<std::vector<std::shared_ptr<Buffer>>> realize_spmd_inprocess(const std::vector<Request>& requests, RngArgs rng,
                                                                         const std::vector<RankInputs>& rank_inputs, int ranks,
                                                                         const std::vector<std::vector<Request>>& rank_requests = {},
                                                                         std::vector<CommTraffic>* traffic = nullptr);
// The calling thread's communicator's traffic so far (zeros without one).
CommTraffic process_traffic();

// The process group (one process per rank, under mpirun): init_mpi_group() makes MPI_COMM_WORLD's
// communicator the process's (backends::set_process_communicator) and returns {rank, size};
// process_group() is {rank, size} of the process's communicator ({0, 1} without one). A second
// init_mpi_group() returns the first's group.
// init_mpi_group throws "[mpi] ..." where libtessera was built without MPI.
std::pair<int, int> init_mpi_group();
std::pair<int, int> process_group();

}  // namespace tessera::runtime
