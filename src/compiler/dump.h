// Debug dumps of the compile pipeline, chosen by environment variables read once per process:
//   TESSERA_DUMP      a comma list of stages: ir (the graph before the IR passes, stage "ir", and
//                     after them, "ir-opt"), fused (every Step of the plan: kind, dtype/shape,
//                     slots, source nodes, program with index maps), plan (slots, arena offsets,
//                     memory peak); 1 or all = those three; unset, empty or 0 = none. asm (the CPU
//                     backend's native loops) is read by backends/cpu/loop_dump.h, skipped here.
//   TESSERA_DUMP_DIR  a directory to write files into instead of standard error, one set per
//                     compiled graph numbered in compile order: graph-0001.ir.txt,
//                     graph-0001.ir-opt.txt, graph-0001.fused.txt, graph-0001.plan.txt. Created
//                     when missing; a failed write throws tessera::Error naming the path.
// With TESSERA_DUMP unset a dump call is one test of a flag.
#pragma once
#include <string>

#include "compiler/lower.h"
#include "ir/graph.h"

namespace tessera::compiler {

// stage: "ir" (starts a new compiled graph's numbering) or "ir-opt".
void dump_graph(const char* stage, const ir::Graph& g);
// Writes the "fused" and "plan" stages of the graph last started on this thread.
void dump_plan(const ir::Graph& g, const Plan& plan);

// The text of the fused and plan stages (g: the graph the plan was lowered from).
std::string steps_text(const Plan& plan);
std::string plan_text(const ir::Graph& g, const Plan& plan);
std::string step_text(const kir::Step& st);  // multi-line
std::string instr_text(const kir::Instr& in);  // one line

// Replaces the configuration read from the environment (the same syntax); the graph numbering
// restarts at 1. For tests: not safe while another thread compiles. Throws tessera::Error on an
// unknown stage name.
void set_dump_config(const std::string& stages, const std::string& dir);
// Goes back to the configuration read from the environment (numbering restarts at 1).
void clear_dump_config();

}  // namespace tessera::compiler
