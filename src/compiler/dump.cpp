#include "compiler/dump.h"

#include <cstdio>
#include <cstdlib>

namespace tessera::compiler {

void dump_graph(const char* stage, const ir::Graph& g) {
  if (std::getenv("TESSERA_DUMP") && std::string(stage) == "ir") std::fprintf(stderr, "%s", ir::to_text(g).c_str());
}
void dump_plan(const ir::Graph& g, const Plan& plan) {
  if (std::getenv("TESSERA_DUMP")) std::fprintf(stderr, "%s", plan.str().c_str());
}

}  // namespace tessera::compiler
