#include "compiler/passes/passes.h"

namespace tessera::compiler {

// For now the lowering order (a depth-first topological order of the graph).
void schedule(Plan& plan) { (void)plan; }

}  // namespace tessera::compiler
