// Reverse-mode autodiff. History lives beside the IR: each op that reads a tensor needing a
// gradient records a GradFn (its output node and the input nodes it read, with the inputs'
// Meta). backward() walks GradFns in reverse and, for each, differentiates the op's own IR
// region with the primitives' VJP rules, emitting new lazy IR. Values realized since the
// forward pass are reused instead of recomputed.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "tensor/tensor_impl.h"

namespace tessera::autodiff {

struct GradFn;

struct Meta {
  bool requires_grad = false;
  std::shared_ptr<GradFn> grad_fn;  // null for leaves
  Tensor grad;                      // leaves: the accumulated gradient (lazy)
};

struct Edge {
  ir::NodePtr node;                // the input's node as the op read it
  std::shared_ptr<Meta> meta;      // null when this input needs no gradient
  std::weak_ptr<TensorImpl> tensor;
};

// A custom VJP: the inputs' cotangents from the output's cotangent g and the op's saved nodes
// (each over the values realized since, where any are).
using CustomVjp = std::function<std::vector<ir::NodePtr>(const ir::NodePtr& g, const std::vector<ir::NodePtr>& saved)>;

struct GradFn {
  ir::NodePtr out;
  std::weak_ptr<TensorImpl> out_tensor;
  std::vector<Edge> inputs;
  CustomVjp vjp;                   // empty: the op's IR region is differentiated
  std::vector<ir::NodePtr> saved;  // what vjp reads (marked ir::mark_saved)
};

bool grad_enabled();
void set_grad_enabled(bool on);
bool requires_grad(const Tensor& t);
// Records that `out` was computed from `inputs` by one frontend op (no-op when no input needs a
// gradient, grad mode is off, or out is not floating).
void record(const Tensor& out, const std::vector<const Tensor*>& inputs);
// The same with the op's VJP given: out's backward is vjp(g, saved), not its IR region's. The
// saved nodes are stored by the forward's Steps where they are computed (ir/saved.h).
void record_custom(const Tensor& out, const std::vector<const Tensor*>& inputs, std::vector<ir::NodePtr> saved, CustomVjp vjp);
// Accumulates d(root)/d(leaf) into every leaf reachable from root; `grad` seeds the cotangent
// (undefined: ones, allowed only for one-element roots).
void backward(const Tensor& root, const Tensor& grad);

// Cotangents of `boundary` nodes given cotangent g of `out`, differentiating the IR between them;
// `values` maps nodes to realized leaves to read instead of recomputing. Exposed for tests.
std::vector<ir::NodePtr> vjp_region(const ir::NodePtr& out, const std::vector<ir::NodePtr>& boundary,
                                    const ir::NodePtr& g,
                                    const std::vector<std::pair<ir::NodePtr, ir::NodePtr>>& values = {});

}  // namespace tessera::autodiff
