// "group": the in-place updates at the end of a step (an optimizer's update of every parameter,
// which inplace_last moved after everything else) as one Step of parts (kir::Step::parts), for a
// target that runs such Steps (Target::elementwise_parts). AdamW over the benchmark GPT's 29
// parameters was 11 Elementwise Steps (one per parameter shape, the merge pass having joined the
// updates of equal shape), each a launch; the small ones cost mostly their launch.
//
// Which Steps: consecutive Elementwise Steps that each write a donated buffer (a parameter
// updated in place), draw no random numbers, and are independent of one another: none reads a
// slot an earlier one of the run writes, none writes a slot another one reads or writes. Steps
// are never moved (only consecutive ones join, at their place), so every read-after-write,
// write-after-read and write-after-write between the run and the rest of the plan is kept; each
// part computes what it computed alone.
#include <algorithm>
#include <unordered_set>

#include "compiler/passes/passes.h"

namespace tessera::compiler {
namespace {

kir::Step joined(std::vector<kir::Step>&& parts) {
  kir::Step M;
  M.kind = kir::StepKind::Elementwise;
  M.dtype = parts[0].dtype;
  int64_t n = 0;
  for (kir::Step& p : parts) {
    n += numel(p.shape);
    M.inputs.insert(M.inputs.end(), p.inputs.begin(), p.inputs.end());
    for (int o : p.outputs()) {
      if (M.output < 0) M.output = o;
      else M.more_outputs.push_back(o);
    }
    M.sources.insert(M.sources.end(), p.sources.begin(), p.sources.end());
    M.cost.flops += p.cost.flops;
    M.cost.bytes += p.cost.bytes;
    M.cost.comm_bytes += p.cost.comm_bytes;
  }
  M.shape = {n};
  M.parts = std::move(parts);
  return M;
}

}  // namespace

void group_updates(Plan& plan) {
  std::vector<bool> donated(plan.slots.size(), false);
  for (size_t k = 0; k < plan.donated.size(); ++k)
    if (plan.donated[k] >= 0) donated[size_t(plan.output_slot[k])] = true;
  auto candidate = [&](const kir::Step& st) {
    if (st.kind != kir::StepKind::Elementwise || !st.parts.empty() || st.program.empty()) return false;
    for (const kir::Instr& in : st.program)
      if (in.code == kir::Code::Rng) return false;
    for (int o : st.outputs())
      if (donated[size_t(o)]) return true;
    return false;
  };
  std::vector<kir::Step> out, run;
  std::unordered_set<int> written, read;
  auto close = [&] {
    if (run.size() >= 2) out.push_back(joined(std::move(run)));
    else
      for (kir::Step& s : run) out.push_back(std::move(s));
    run.clear(), written.clear(), read.clear();
  };
  for (kir::Step& st : plan.steps) {
    if (!candidate(st)) {
      close();
      out.push_back(std::move(st));
      continue;
    }
    bool independent = true;
    for (int x : st.inputs) independent &= !written.count(x);
    for (int o : st.outputs()) independent &= !written.count(o) && !read.count(o);
    if (!independent) close();
    for (int x : st.inputs) read.insert(x);
    for (int o : st.outputs()) written.insert(o);
    run.push_back(std::move(st));
  }
  close();
  plan.steps = std::move(out);
}

}  // namespace tessera::compiler
