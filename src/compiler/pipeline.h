// The compile pipeline: IR passes, lowering, Step passes, donation and the memory plan
// (passes/passes.h lists the passes; each can be switched off by name).
#pragma once
#include <vector>

#include "compiler/lower.h"
#include "kernel_ir/target.h"

namespace tessera::compiler {

// donate: as for compiler::donate (per output, a parameter number of g or -1); target: the
// device's properties (dtypes, buffer layout, the arena's alignment; see kernel_ir/target.h);
// optimized: when given, receives the graph after the IR passes (what the Steps compute).
Plan compile_graph(const ir::Graph& g, const std::vector<int>& donate, const kir::Target& target = {},
                   ir::Graph* optimized = nullptr);

}  // namespace tessera::compiler
