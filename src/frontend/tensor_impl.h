// The mutable object behind a Tensor handle: either pending (an IR node) or realized (a buffer).
#pragma once
#include <memory>

#include "core/buffer.h"
#include "ir/node.h"
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

  TensorImpl(ir::NodePtr n);                                      // pending
  TensorImpl(std::shared_ptr<Buffer> b, Shape s, DType t);        // realized
  ~TensorImpl();
  void rebind(ir::NodePtr n);                  // in-place: becomes pending on n
  void realize_to(std::shared_ptr<Buffer> b);  // pending -> realized
};

namespace detail {
// The node standing for a tensor's value: its pending node, or the leaf of its buffer.
ir::NodePtr node_of(const Tensor& t);
Tensor from_node(ir::NodePtr n);
// Live pending impls (the runtime realizes all of them on sync).
std::vector<std::shared_ptr<TensorImpl>> pending_impls();
// The generator state the next executed graph will use.
using tessera::RngState;
RngState rng_state();
// Reserves a draw index for an RNG node of the graph being traced (reset after each sync).
uint32_t next_draw();
// After each sync: advances the offset past the draws traced and restarts their numbering.
void reset_draws();
}  // namespace detail

}  // namespace tessera
