// SPMD building blocks on tensors (docs/architecture.md "Parallelism"): the program traced is ONE
// rank's, run by every rank of a group at once, each on its own inputs; collectives are where the
// ranks meet. Ranks are either processes (one per rank, under mpirun: init_mpi()) or threads of
// this process (sync_ranks(): the graph traced once by this thread, run on N rank threads).
// optim::DataParallel (optim.h) is data parallelism built from these.
#pragma once
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

}  // namespace tessera::dist
#pragma GCC visibility pop
