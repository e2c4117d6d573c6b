// Debug dumps of the compile pipeline, chosen by TESSERA_DUMP: a comma list of stages
// (ir = the graph before and after the IR passes, fused = each Step with its source nodes,
// plan = the memory plan), or 1/all for every stage; TESSERA_DUMP_DIR names a directory to
// write files into (default: standard error).
#pragma once
#include <string>

#include "compiler/lower.h"
#include "ir/graph.h"

namespace tessera::compiler {

void dump_graph(const char* stage, const ir::Graph& g);
void dump_plan(const ir::Graph& g, const Plan& plan);

}  // namespace tessera::compiler
