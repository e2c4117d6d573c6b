#include <algorithm>

#include "compiler/passes/passes.h"

namespace tessera::compiler {

// A GEMM whose temporary product is read by exactly one Step, an elementwise program over the
// same positions reading the product only element for element, takes that program as its
// epilogue: the GEMM writes the consumer's output and applies the program per row block while
// the block is in cache. The merged Step sits where the consumer was (its other inputs are
// ready there, and the GEMM's were ready earlier).
void fuse_epilogues(Plan& plan) {
  std::vector<int> readers(plan.slots.size(), 0), writer(plan.slots.size(), -1);
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    for (int x : plan.steps[s].inputs) readers[x]++;
    writer[plan.steps[s].output] = int(s);
  }
  std::vector<bool> gone(plan.steps.size(), false);
  for (size_t e = 0; e < plan.steps.size(); ++e) {
    kir::Step& E = plan.steps[e];
    if (E.kind != kir::StepKind::Elementwise) continue;
    for (int x : E.inputs) {
      int g = writer[x];
      if (g < 0 || gone[g] || plan.steps[g].kind != kir::StepKind::Gemm || !plan.steps[g].program.empty() ||
          !plan.steps[g].out_strides.empty())
        continue;
      const kir::Step& G = plan.steps[g];
      // Same positions in the same order (shapes may differ by a reshape; then no Iota, which
      // reads the domain's shape).
      if (plan.slots[x].kind != kir::SlotKind::Temp || readers[x] != 1 || numel(G.shape) != numel(E.shape) ||
          G.dtype != E.dtype)
        continue;
      bool elementwise = true;
      if (G.shape != E.shape)
        for (const kir::Instr& in : E.program) elementwise &= in.code != kir::Code::Iota;
      for (const kir::Instr& in : E.program)
        if (in.code == kir::Code::Load && E.inputs[in.input] == x)
          elementwise &= in.map.is_contiguous() && in.map.views[0].offset == 0 && in.map.shape() == E.shape;
      if (!elementwise) continue;
      kir::Step M = G;
      M.output = E.output;
      M.program = E.program;
      for (kir::Instr& in : M.program) {
        if (in.code != kir::Code::Load) continue;
        int slot = E.inputs[in.input];
        if (slot == x) slot = E.output;
        auto it = std::find(M.inputs.begin(), M.inputs.end(), slot);
        in.input = int(it - M.inputs.begin());
        if (it == M.inputs.end()) M.inputs.push_back(slot);
      }
      M.sources.insert(M.sources.end(), E.sources.begin(), E.sources.end());
      M.cost.flops += E.cost.flops;
      M.cost.bytes = G.cost.bytes - double(plan.slots[x].nbytes) + E.cost.bytes - double(plan.slots[x].nbytes);
      gone[g] = true;
      E = std::move(M);
      break;
    }
  }
  std::vector<kir::Step> kept;
  for (size_t s = 0; s < plan.steps.size(); ++s)
    if (!gone[s]) kept.push_back(std::move(plan.steps[s]));
  plan.steps = std::move(kept);
}

}  // namespace tessera::compiler
