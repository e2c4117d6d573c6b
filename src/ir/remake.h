// Rebuilding a node that make() gave before (a replayed trace: tensor/replay.cpp).
#pragma once
#include <string>
#include <vector>

#include "ir/node.h"

namespace tessera::ir {

// A node equal to one make() gave before, on new inputs of the same shapes and dtypes as that
// node's inputs (so its shape rule is not run again): the given op, attributes, shape, dtype,
// device and (interned) scope, interned like make()'s nodes.
NodePtr remake(Op op, std::vector<NodePtr> inputs, const Attrs& attrs, const Shape& shape, DType dtype, const Device& device,
               const std::string* scope);

}  // namespace tessera::ir
