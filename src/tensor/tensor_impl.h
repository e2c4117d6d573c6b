// The mutable object behind a Tensor handle: either pending (an IR node) or realized (a buffer).
// Every change of that state (becoming pending, realized, rebound in place, moved to another
// device, reverted) is a method here, written once; the layers above call them.
#pragma once
#include <atomic>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/buffer.h"
#include "ir/node.h"
#include "ir/partition.h"
#include "runtime/realize.h"
#include "tessera/tensor.h"

namespace tessera {

namespace autodiff {
struct Meta;
}

struct TensorImpl {
  ir::NodePtr node;                // pending value; null once realized
  std::shared_ptr<Buffer> buffer;  // realized value (contiguous, row-major)
  Shape shape;
  DType dtype;
  Device device;
  // The buffer this impl owned before an in-place op rebound it; the runtime writes the new
  // value back into it (donation) when nothing else can still read it.
  std::weak_ptr<Buffer> donor;
  std::weak_ptr<TensorImpl> self;  // set by the owning Tensor handle
  bool is_view = false;            // made by a movement op: in-place ops on it are refused
  std::shared_ptr<autodiff::Meta> grad_meta;   // autodiff state; null when it needs no gradient
  std::weak_ptr<const ir::Node> realized_from;  // the node whose value `buffer` holds
  // Links in the list of pending impls, in the order they last became pending (tensor.cpp).
  TensorImpl* pending_prev = nullptr;
  TensorImpl* pending_next = nullptr;
  bool pending = false;
  // Set when the graph computing this value failed (sync(), "failure isolation" in
  // docs/architecture.md): the error every later use or read of it raises.
  std::shared_ptr<const std::string> error;
  std::atomic<bool> errored{false};  // error != nullptr, readable without the registry's mutex
  int64_t version = 0, donor_version = 0;  // Tensor::version(); the version the donor buffer holds
  // The order of creation (detail::impl_serial()): a StepCapture tells the tensors that existed
  // before its step (state) from those the step made.
  uint64_t serial;

  TensorImpl(ir::NodePtr n);                                      // pending
  TensorImpl(std::shared_ptr<Buffer> b, Shape s, DType t);        // realized
  ~TensorImpl();
  TensorImpl(const TensorImpl&) = delete;
  TensorImpl& operator=(const TensorImpl&) = delete;

  // In place: becomes pending on n (same shape and dtype); the old buffer becomes the donor.
  void rebind(ir::NodePtr n);
  // Pending -> realized on b (what sync() does with each result).
  void realize_to(std::shared_ptr<Buffer> b);
  // Takes other's value (pending node or buffer, shape, dtype, device), keeping this impl's
  // identity and autodiff state (Tensor::set_data, Module::to).
  void adopt_value(const TensorImpl& other);
  // Undoes the pending in-place value: back on the donor buffer it was rebound from (the advisor
  // traces a step and puts the model back). Throws when that buffer is gone.
  void revert_to_donor();
  // Pending -> errored: no value; using or reading it throws tessera::Error(msg).
  void set_error(std::string msg);
};

namespace detail {
// The internal side of a Tensor handle (its private impl), for the library's own layers.
struct TensorAccess {
  static const std::shared_ptr<TensorImpl>& impl(const Tensor& t) { return t.impl_; }
  static Tensor make(std::shared_ptr<TensorImpl> impl) {
    impl->self = impl;
    return Tensor(std::move(impl));
  }
};
inline const std::shared_ptr<TensorImpl>& impl_of(const Tensor& t) { return TensorAccess::impl(t); }

// ---- Step capture (frontend/capture.cpp, include/tessera/capture.h) ----
// While a recorder is set on the calling thread, the tensor layer notes every realized tensor
// whose buffer a trace reads (the buffer's leaf) and the version of every tensor the step touches
// (read, rebound in place or given another value) before its first touch.
struct CaptureRecorder {
  struct Read {
    std::weak_ptr<TensorImpl> impl;
    uint64_t serial;
  };
  std::unordered_map<const Buffer*, Read> leaves;  // buffer -> the tensor it was read from
  bool shared_leaf = false;  // one buffer read through two live tensors
  std::unordered_map<const TensorImpl*, int64_t> first_version;
  std::unordered_set<const TensorImpl*> assigned;  // given a value by adopt_value (set_data)
  void note_read(const std::shared_ptr<TensorImpl>& impl, const Buffer* b);
  void note_touch(const TensorImpl& impl) { first_version.emplace(&impl, impl.version); }
};
void set_capture_recorder(CaptureRecorder* r);
CaptureRecorder* capture_recorder();
// The serial the next TensorImpl gets (every impl made before has a smaller one).
uint64_t impl_serial();
size_t pending_count();
// Makes the calling thread the lazy graph's owner (or throws, naming `what`, as ops do).
void claim_graph(const char* what);
// sync() that reports what it realized, for a capture's recording: `realized` gets the pending
// tensors of the one graph in request order; `leaf_rebinds` counts pending tensors that were only
// rebound to a realized value, `devices` the graphs run (one per device).
struct SyncReport {
  std::vector<std::shared_ptr<TensorImpl>> realized;
  int leaf_rebinds = 0, devices = 0;
};
void sync_reported(SyncReport& report);
// A replayed step's result for a tensor that existed before it: b becomes its value (as
// realize_to, on a realized tensor) and its version moves on by `versions` (the in-place updates
// the traced step made).
void set_replayed_value(TensorImpl& impl, std::shared_ptr<Buffer> b, int64_t versions);

// The node standing for a tensor's value: its pending node, or the leaf of its buffer.
ir::NodePtr node_of(const Tensor& t);
Tensor from_node(ir::NodePtr n);
Tensor from_buffer(std::shared_ptr<Buffer> b, Shape s, DType t);
// Live pending impls (the runtime realizes all of them on sync). Claims the graph for the calling
// thread (docs/architecture.md, Threading); for sync(), also marks it as running until
// reset_draws().
std::vector<std::shared_ptr<TensorImpl>> pending_impls(bool for_sync = false);
// What sync() would request to compute `outputs` (every pending tensor when empty), in its
// order and with its donors, so the graph and its cache key are the ones sync() would run.
std::vector<runtime::Request> pending_requests(const std::vector<Tensor>& outputs = {});
// Realizes everything pending and returns t's bytes on the host; counts one host sync.
std::vector<char> host_bytes(const Tensor& t, const char* op);
// The generator state the next executed graph will use.
using tessera::RngState;
RngState rng_state();
// Reserves a draw index for an RNG node of the graph being traced (reset after each sync).
uint32_t next_draw();
// The batch slice in force (BatchSliceScope; rows 0: none).
struct BatchSlice {
  int64_t start = 0, rows = 0;
};
BatchSlice batch_slice();
// After each sync: advances the offset past the draws traced and restarts their numbering.
void reset_draws();
// sync() as one SPMD graph on `ranks` in-process rank threads (runtime::realize_spmd): every
// pending tensor (all on one device) is computed by every rank; the tensors get rank 0's values.
// rank_inputs[r - 1] maps tensors of the graph (realized: rank 0's values) to rank r's tensors of
// the same shape and dtype (realized); what is not named is shared read only. No donation (every
// rank reads the leaves). When the graph fails, in-place updates go back to their values before
// it, other pending tensors become errored, and the error is thrown. With rows > 0 (the graph was
// traced as rank 0's rows [0, rows) of a batch split evenly over the ranks), a random draw whose
// leading extent is `rows` draws, on rank r, the numbers of rows [r * rows, (r + 1) * rows) of
// the whole batch's draw (BatchSliceScope's rule): rank r runs its own copy of the graph.
// rank_outputs: pending tensors whose every rank's value is wanted (per-rank state: ZeRO's
// moment shards); returned as [rank - 1][k], realized tensors of their own.
std::vector<std::vector<Tensor>> sync_spmd(int ranks, const std::vector<std::vector<std::pair<Tensor, Tensor>>>& rank_inputs,
                                           int64_t rows = 0, const std::vector<Tensor>& rank_outputs = {});
// sync() partitioned over a mesh (ir::partition, docs/architecture.md "Sharding and the
// partitioner"): every pending tensor (one device) is computed by ONE per-rank graph on the mesh's
// ranks (in-process rank threads). `annotated` gives some realized tensors' layouts (a tensor
// updated in place and pending is found through the buffer it was rebound from); every rank gets
// its block of them, cut on the host; a replicated leaf that meets a split value is cut the same
// way. Results: replicated ones take rank 0's value, split ones are gathered back into the full
// tensor on the host. What the per-rank graph held is returned.
struct PartitionReport {
  int64_t ranks = 1;
  std::map<std::string, int> collectives;  // of the per-rank graph, by kind
  int64_t leaf_bytes = 0, rank_leaf_bytes = 0;  // the inputs of the whole graph, of one rank's
  int64_t rank_peak_bytes = 0;                  // the per-rank graph's planned peak (MemoryPlan::peak_bytes)
  // What each rank's collectives moved in the run (runtime::CommTraffic; MPI: this process's only).
  std::vector<int64_t> rank_comm_calls, rank_comm_bytes;
  std::vector<ir::Sharding> output_shardings;  // of the pending tensors, in the order they were synced
};
PartitionReport sync_partitioned(const ir::MeshAxes& mesh, const std::vector<std::pair<Tensor, ir::Sharding>>& annotated);
}  // namespace detail

}  // namespace tessera
