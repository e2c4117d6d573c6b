// Debug dumps of the compile pipeline, as DumpOptions (options.h) ask: the graph before ("ir")
// and after ("ir-opt") the IR passes, every Step of the plan ("fused"), and its slots, arena
// offsets and memory peak ("plan"); to standard error, or with a directory into files
// graph-NNNN.<stage>.txt (NNNN: DumpOptions::graph), created when missing; a failed write throws
// tessera::Error naming the path. The runtime fills DumpOptions from TESSERA_DUMP and
// TESSERA_DUMP_DIR (runtime/compile_options.h). With no stage asked a dump call is one test.
#pragma once
#include <string>

#include "compiler/lower.h"
#include "compiler/options.h"
#include "ir/graph.h"

namespace tessera::compiler {

// stage: "ir" or "ir-opt".
void dump_graph(const DumpOptions& opts, const char* stage, const ir::Graph& g);
// The "fused" and "plan" stages (g: the graph the plan was lowered from).
void dump_plan(const DumpOptions& opts, const ir::Graph& g, const Plan& plan);

// The text of the fused and plan stages (g: the graph the plan was lowered from).
std::string steps_text(const Plan& plan);
std::string plan_text(const ir::Graph& g, const Plan& plan);
std::string step_text(const kir::Step& st);  // multi-line
std::string instr_text(const kir::Instr& in);  // one line

}  // namespace tessera::compiler
