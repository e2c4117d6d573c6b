// The VJP rule of each differentiable primitive (IR builders), referenced by the primitive table.
#pragma once
#include "ir/primitives.h"

namespace tessera::ir {

VjpRule vjp_rule(Op op);

}  // namespace tessera::ir
