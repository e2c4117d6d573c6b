// Values saved for the backward: nodes whose value a custom VJP (autodiff::record_custom) reads
// in the backward, which the lowering stores where the forward computes them instead of fusing
// them into their reader (which would recompute them there, from inputs kept alive as long).
// GELU's derivative is the one so far: the forward's Step computes it beside GELU's value
// (sharing erf), and the backward's GEMM epilogue multiplies by it instead of evaluating erf and
// exp again. A hint only: any node is computed correctly either way.
#pragma once
#include "ir/node.h"

namespace tessera::ir {

// Marks n (while it lives; a node later allocated at the same address is not marked).
void mark_saved(const NodePtr& n);
bool is_saved(const Node* n);

}  // namespace tessera::ir
