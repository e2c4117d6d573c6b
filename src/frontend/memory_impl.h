// The public MemoryPlan of a compiled plan (memory_api.cpp), for side modules that compile
// through runtime::compile_only themselves (the advisor, for a target device).
#pragma once
#include "compiler/lower.h"
#include "tessera/memory.h"

namespace tessera::detail {

MemoryPlan memory_plan_of(const compiler::Plan& plan);

}  // namespace tessera::detail
