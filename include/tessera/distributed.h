// SPMD building blocks on tensors (docs/architecture.md "Parallelism"): the program traced is ONE
// rank's, run by every rank of a group at once, each on its own inputs; collectives are where the
// ranks meet. Ranks are either processes (one per rank, under mpirun: init_mpi()) or threads of
// this process (sync_ranks(): the graph traced once by this thread, run on N rank threads).
// optim::DataParallel (optim.h) is data parallelism built from these.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tessera/tensor.h"

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera::dist {

enum class Reduce { Sum, Mean, Max };

// Collectives over a group of `ranks` (traced like any op, differentiable: the VJP of all_reduce
// (sum) is all_reduce (sum), of all_gather is reduce_scatter, ...). A graph for ranks > 1 runs
// under a communicator: MPI ranks after init_mpi(), or in-process ranks through sync_ranks().
Tensor all_reduce(const Tensor& x, int64_t ranks, Reduce op = Reduce::Sum);
Tensor all_gather(const Tensor& x, int64_t ranks, int64_t dim = 0);      // concatenated along dim, rank-major
Tensor reduce_scatter(const Tensor& x, int64_t ranks, int64_t dim = 0);  // the sum, cut along dim: rank r keeps block r
// x cut into `ranks` blocks along split_dim: block c goes to rank c, which concatenates the blocks
// it receives along concat_dim in rank order (MPI_Alltoall; the VJP is the all_to_all back).
Tensor all_to_all(const Tensor& x, int64_t ranks, int64_t split_dim = 0, int64_t concat_dim = 0);
// Every rank gets rank `root`'s x (the VJP: the ranks' cotangents summed on the root, zeros elsewhere).
Tensor broadcast(const Tensor& x, int64_t ranks, int64_t root = 0);
// Send/recv by (source, destination) pairs, each rank at most once a source and once a
// destination: a destination gets its source's x, a rank that receives nothing gets zeros (JAX's
// ppermute; the VJP sends the cotangents back along the reversed pairs).
Tensor collective_permute(const Tensor& x, int64_t ranks, const std::vector<std::pair<int64_t, int64_t>>& pairs);

// This process as one rank of MPI_COMM_WORLD (under mpirun): its communicator becomes the
// process's; returns {rank, size} (again on later calls). Throws "[mpi] ..." where libtessera was
// built without MPI.
std::pair<int, int> init_mpi();
// {rank, size} of the process's communicator ({0, 1} before init_mpi()).
int rank();
int world_size();

// Realizes every pending tensor (all on one device) as ONE graph run by `ranks` in-process rank
// threads; the tensors get rank 0's values. inputs[r - 1] names, for rank r, its own value of
// some realized tensors of the graph: pairs (the tensor rank 0 reads, rank r's tensor of the same
// shape and dtype). Everything else is shared, read only. A failing rank ends every rank; the
// error names it. With batch_rows > 0 (the graph traced on rank 0's rows [0, batch_rows) of a
// batch split evenly over the ranks), a random draw whose leading extent is batch_rows draws on
// rank r rows [r * batch_rows, (r + 1) * batch_rows) of the whole batch's numbers (as under
// BatchSliceScope), so dropout masks are those of one device on the whole batch.
// outputs: pending tensors whose every rank's value the caller keeps (per-rank state), returned
// as [r - 1][k]: rank r's value of outputs[k].
std::vector<std::vector<Tensor>> sync_ranks(int ranks, const std::vector<std::vector<std::pair<Tensor, Tensor>>>& inputs,
                                            int64_t batch_rows = 0, const std::vector<Tensor>& outputs = {});

// ---- A device mesh, sharding annotations and the partitioner (bounded GSPMD) ----
// The program is traced on FULL shapes, as for one device (forward, backward and the update);
// some realized tensors (parameters, batches) are annotated with how they are laid out over a
// mesh of ranks; sync_partitioned() then propagates the layouts through the graph and runs ONE
// per-rank graph with local shapes on the mesh's ranks, with collectives where layouts meet.

// Named axes with their sizes; rank = row-major over the axes (the last axis varies fastest).
class Mesh {
 public:
  Mesh(std::vector<std::pair<std::string, int64_t>> axes);
  int64_t ranks() const;                      // the product of the sizes
  int64_t size(const std::string& axis) const;  // throws naming the mesh's axes for another name
  int index(const std::string& axis) const;     // the axis' position; throws likewise
  std::vector<int64_t> coords(int64_t rank) const;
  const std::vector<std::pair<std::string, int64_t>>& axes() const { return axes_; }
  std::string str() const;  // "{data: 2, model: 2}"

 private:
  std::vector<std::pair<std::string, int64_t>> axes_;
};

// One dimension's layout: replicated (no axis: `none`), or split into blocks over a mesh axis.
// groups > 1: the dimension is that many equal groups, each split over the axis (rank r holds
// block r of every group): a fused [q; k; v] projection split Megatron style.
struct Split {
  std::string axis;  // empty: replicated
  int64_t groups = 1;
  Split() = default;
  Split(const char* a) : axis(a ? a : "") {}
  Split(std::string a, int64_t g = 1) : axis(std::move(a)), groups(g) {}
};
inline const Split none{};
using Spec = std::vector<Split>;  // one per dimension

// Annotates a realized tensor (a parameter, a batch; in-place updates keep the annotation) with
// its layout over `mesh`: each dimension split over an axis or none. Checked here: one entry per
// dimension, axes of the mesh, an axis at most once, extents that divide into size x groups.
void shard(const Tensor& t, const Mesh& mesh, const Spec& spec);
// Forgets every annotation (of every tensor).
void clear_shardings();

// What sync_partitioned() ran: the ranks, the per-rank graph's collectives by kind
// ("all_reduce" -> 4), the bytes of the whole graph's inputs and of one rank's, and one rank's
// planned peak (MemoryPlan::peak_bytes of its graph: inputs, outputs and temporaries).
// rank_comm_calls / rank_comm_bytes: per rank, the collectives its communicator ran and the bytes
// it sent (counted by the communicators, as under ring algorithms: an all-reduce of B bytes over
// n ranks sends 2 (n - 1) / n B, an all-gather of B-byte blocks (n - 1) B); in-process ranks: one
// entry per rank; under MPI: this process's only.
struct PartitionStats {
  int64_t ranks = 1;
  std::map<std::string, int> collectives;
  int64_t input_bytes = 0, rank_input_bytes = 0;
  int64_t rank_peak_bytes = 0;
  std::vector<int64_t> rank_comm_calls, rank_comm_bytes;
};
// Realizes every pending tensor (one device) partitioned over `mesh`: each rank (an in-process
// rank thread) takes its block of the annotated tensors (cut on the host; an unannotated
// realized tensor that meets a split value is cut the same way) and runs the per-rank graph.
// Every result gets its full value: a replicated one rank 0's, a split one gathered from the
// ranks' blocks on the host. Refused with a clear "[partition] <op> in '<scope>': ..." error
// naming the op, its operands' shapes and layouts where the layouts meet unsupported. On a mesh
// of several axes (data x model) a collective over one axis runs over that axis' sub-group (the
// ranks that differ only along it: a communicator of their own, made at its first use).
PartitionStats sync_partitioned(const Mesh& mesh);

}  // namespace tessera::dist
#pragma GCC visibility pop
