// The public MemoryPlan (tessera/memory.h) of a compiled plan, for the layers above that compile
// through runtime::compile_only (plan_memory, the advisor).
#pragma once
#include "tessera/memory.h"

namespace tessera::compiler {
struct Plan;
}

namespace tessera::runtime {

MemoryPlan memory_plan_of(const compiler::Plan& plan);

}  // namespace tessera::runtime
