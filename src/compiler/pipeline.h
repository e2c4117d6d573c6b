// The compile pipeline: IR passes, lowering, Step passes, donation and the memory plan
// (passes/passes.h lists the passes; each can be switched off by name in the options).
#pragma once
#include <vector>

#include "compiler/lower.h"
#include "compiler/options.h"

namespace tessera::compiler {

// donate: as for compiler::donate (per output, a parameter number of g or -1). opts: which
// passes run, the target, debug guards and dumps (options.h); everything the compile depends on.
// optimized: when given, receives the graph after the IR passes (what the Steps compute).
Plan compile_graph(const ir::Graph& g, const std::vector<int>& donate, const Options& opts = {},
                   ir::Graph* optimized = nullptr);

}  // namespace tessera::compiler
