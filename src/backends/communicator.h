// The communicator interface, beside the backend interface (backend.h): how ranks that each run
// one copy of a program (SPMD) exchange buffers. A backend runs the Kernel-IR Steps of one rank;
// a communicator moves that rank's buffers to and from the other ranks. The two meet in one
// place only: backends/collective.h runs a StepKind::Collective Step on a backend's buffers
// through the calling thread's current communicator.
//
// Contract, for every collective below:
// - Every rank of the group calls the same collectives in the same order with the same count and
//   dtype (and root / kind). Each call first checks that against the other ranks: a rank that
//   disagrees makes the call throw on EVERY rank, naming the collective and each rank's side.
// - Errors: tessera::Error whose message starts with the collective ("[all_reduce] ...").
//   Never a hang: a call that waits longer than timeout() for the other ranks throws, naming the
//   collective and the communicator; the group is then broken and every later call on any of its
//   ranks throws at once. (MPI: a pending call cannot be cancelled, so past the timeout the rank
//   prints that error and aborts the job, MPI_Abort; mpirun ends the others.)
// - Buffers: `count` elements of `dtype`, contiguous, in the memory the communicator serves
//   (host memory: inprocess, mpi; the CUDA device's: nccl). send and recv may be the same
//   buffer where their sizes are equal (all_reduce, broadcast, reduce, permute).
// - Threads: one rank's calls come from one thread at a time. The communicator of a launch is
//   the launching thread's current one (current_communicator()): a backend that runs launches on
//   a thread of its own would have to carry it there. A backend declaring Target::collectives
//   also takes launches from several rank threads at once (runtime::realize_spmd): the cpu
//   backend does; a backend with one stream for all callers (tests/plugins/v3test) does not.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ir/primitives.h"
#include "tessera/dtype.h"

#pragma GCC visibility push(default)  // the backend SDK: exported for plugins
namespace tessera::backends {

// A collective started and not yet complete (Communicator::start_all_reduce). Until wait()
// returns (or test() returned true) the caller leaves its buffers alone: the send buffer is not
// written, the receive buffer neither read nor written. Every started collective must be waited
// for (destroying one that is pending waits for it, swallowing its errors).
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  // Moves it on where that needs the caller (MPI: a transfer progresses only inside MPI calls)
  // and says whether it is complete (then its results are in the receive buffer). Throws the
  // blocking call's errors (a disagreement, a broken group).
  virtual bool test() = 0;
  // Returns when complete: the blocking call's timeout and errors (the timeout counted from here).
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string name() const = 0;  // "inprocess", "mpi", "nccl"
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // recv[i] = reduce over ranks of send[i] (sum, mean or max; max propagates NaN).
  virtual void all_reduce(const void* send, void* recv, size_t count, DType t, ir::ReduceKind kind) = 0;
  // all_reduce started, not waited for: the collective is posted (after the ranks' calls are
  // compared, where that is how the communicator checks them: mpi) and completes in the
  // background or in the handle's test()/wait(). The results equal all_reduce's bit for bit.
  // Started and blocking collectives keep one order: every rank starts or calls the same
  // collectives in the same order (several may be pending at once); they may complete in any.
  // The default runs all_reduce and returns a complete handle (nccl, and max on mpi: its NaN
  // flags are a second collective).
  virtual std::unique_ptr<PendingCollective> start_all_reduce(const void* send, void* recv, size_t count, DType t,
                                                              ir::ReduceKind kind);
  // recv = the ranks' send buffers in rank order: size() * count elements.
  virtual void all_gather(const void* send, void* recv, size_t count, DType t) = 0;
  // send holds size() blocks of `count`; recv = the sum over ranks of block rank().
  virtual void reduce_scatter(const void* send, void* recv, size_t count, DType t) = 0;
  // send holds size() blocks of `count`, block r for rank r; recv gets size() blocks, block s from rank s.
  virtual void all_to_all(const void* send, void* recv, size_t count, DType t) = 0;
  // recv = root's send on every rank.
  virtual void broadcast(const void* send, void* recv, size_t count, DType t, int root) = 0;
  // On root, recv = the sum over ranks of send; other ranks' recv is not written.
  virtual void reduce(const void* send, void* recv, size_t count, DType t, int root) = 0;
  // Sends `send` to rank send_to and receives into recv from rank recv_from (-1: neither); the
  // pairs of all ranks must match (rank a sends to b exactly when b receives from a).
  virtual void permute(const void* send, void* recv, size_t count, DType t, int send_to, int recv_from) = 0;

  // How long a call waits for the other ranks (default 30 s; TESSERA_COLLECTIVE_TIMEOUT_S).
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }
  // A number no other communicator of this process has or will have (never reused, unlike an
  // address): what a cache of checks made on a communicator keys by (runtime's sequence check).
  uint64_t serial() const { return serial_; }

  // A sub-group's communicator (docs/architecture.md "Parallelism", sub-groups): `members` are
  // ranks of this communicator in group order, this rank among them; its rank() is this rank's
  // position there. Made at a group's first call and cached by the member list (the timeout is
  // this one's): every member calls it for the same groups in the same order (the collective
  // Steps do, checked by the sequence check). In-process: the members' own meeting table; MPI:
  // MPI_Comm_create_group, which only the members call. Throws "[<name>] ..." for a bad list or
  // a communicator without sub-groups (nccl).
  Communicator& group(const std::vector<int>& members);

  // What this rank's collective Steps moved through this communicator (run_collective_on_host
  // counts them, a sub-group's on the communicator it came from): calls, and bytes this rank
  // sends under ring algorithms ((n-1)/n of the buffer per pass: all_reduce 2 passes of the
  // buffer, all_gather / reduce_scatter / all_to_all one of the whole, broadcast and reduce the
  // buffer once, permute the buffer where it sends). The sequence check's exchanges are not counted.
  struct Traffic {
    int64_t calls = 0, bytes = 0;
  };
  Traffic traffic() const { return traffic_; }
  void count_traffic(int64_t bytes) { traffic_.calls++, traffic_.bytes += bytes; }

 protected:
  Communicator();
  // The sub-group's communicator, members checked (sorted or not, distinct, in range, this rank
  // among them); the default throws: no sub-groups.
  virtual std::shared_ptr<Communicator> make_group(const std::vector<int>& members);

 private:
  std::chrono::milliseconds timeout_;
  uint64_t serial_;
  Traffic traffic_;
  std::map<std::vector<int>, std::shared_ptr<Communicator>> groups_;
};

// The calling thread's communicator: the innermost CommunicatorScope's, else the process's
// (set_process_communicator), else null.
Communicator* current_communicator();
void set_process_communicator(std::shared_ptr<Communicator> c);
class CommunicatorScope {
 public:
  explicit CommunicatorScope(Communicator* c);
  ~CommunicatorScope();
  CommunicatorScope(const CommunicatorScope&) = delete;
  CommunicatorScope& operator=(const CommunicatorScope&) = delete;

 private:
  Communicator* saved_;
};

// ---- the implementations ----
// In-process: n ranks as threads of this process (rank r is group[r]), meeting at each
// collective on a condition variable. abort_inprocess_group() breaks the group: every rank
// waiting in or later calling a collective throws `why` (a rank that failed says so).
std::vector<std::shared_ptr<Communicator>> make_inprocess_group(int n);
void abort_inprocess_group(Communicator& member, const std::string& why);

// Host threads (the cpu backend's OpenMP pool) shared by ranks on one host, so that nobody
// oversubscribes: share_host_threads(n) sets the calling thread's team to max(1, T / n), T its
// team before the call (a thread's own setting: for an in-process rank thread, for its life;
// for the main thread of an MPI rank, the process's). host_threads() is the calling thread's.
void share_host_threads(int ranks_on_host);
int host_threads();

// MPI (OpenMPI: one process per rank, started by mpirun): MPI_COMM_WORLD, MPI initialized on
// first use and finalized at exit. Throws "[mpi] ..." where libtessera was built without MPI.
bool mpi_built();
std::shared_ptr<Communicator> make_mpi_communicator();

// NCCL (GPU ranks; buffers are CUDA device memory of the calling thread's current device):
// libnccl.so.2 and the driver are opened with dlopen at the first call, like the cuda plugin's
// libraries. make_nccl_group(n): one process driving CUDA devices 0..n-1 (ncclCommInitAll).
// Throws "[nccl] ..." where it was not built or the library or a device is missing.
bool nccl_built();
std::vector<std::shared_ptr<Communicator>> make_nccl_group(int n);

}  // namespace tessera::backends
#pragma GCC visibility pop
