#include "kernel_ir/step.h"

#include <algorithm>
#include <sstream>

namespace tessera::kir {

const char* step_kind_name(StepKind k) {
  static const char* names[] = {"elementwise", "copy", "reduce", "gemm", "gather", "scatter_add",
                                "dynamic_update_slice", "row", "collective", "attention"};
  return names[static_cast<int>(k)];
}

std::string Step::str() const {
  std::ostringstream os;
  os << step_kind_name(kind);
  if (kind == StepKind::Collective) os << " " << ir::op_name(collective);
  os << " " << dtype_short(dtype) << shape_str(shape) << " -> slot " << output;
  for (int o : more_outputs) os << ", slot " << o;
  if (accumulate) os << " (+=)";
  if (!out_strides.empty()) {
    os << " strides [";
    for (size_t i = 0; i < out_strides.size(); ++i) os << (i ? ", " : "") << out_strides[i];
    os << "]";
    if (out_offset) os << " at " << out_offset;
  }
  if (attention) {
    os << " [" << (attention->backward ? "backward, " : "") << attention->batch << " x " << attention->tq << "x" << attention->tk << ", d " << attention->d;
    if (attention->dv != attention->d) os << "/" << attention->dv;
    os << ", scale " << attention->scale;
    if (attention->causal) os << ", causal" << (attention->causal_offset ? " +" + std::to_string(attention->causal_offset) : "");
    if (attention->bf16) os << ", bf16 operands";
    os << "]";
    if (!out_maps.empty()) os << " written through maps";
    for (const IndexMap& m : out_maps) os << " " << m.str();
  }
  os << " <- (";
  for (size_t i = 0; i < inputs.size(); ++i) os << (i ? ", " : "") << "slot " << inputs[i];
  os << ")";
  if (!parts.empty()) os << " [" << parts.size() << " parts]";
  if (!program.empty()) {
    size_t deepest = 0;
    for (auto& in : program) deepest = std::max(deepest, in.map.views.size());
    os << " [" << program.size() << " instrs, maps " << deepest << " deep]";
  }
  os << " from";
  for (auto& s : sources) os << " " << s.op << (s.scope.empty() ? "" : "@" + s.scope);
  return os.str();
}

std::pair<Step, Step> split_epilogue(const Step& g) {
  Step product = g, epi;
  product.program.clear();
  product.more_outputs.clear();
  product.more_results.clear();
  product.inputs.resize(2);  // an epilogue's further inputs come after A and B
  product.sources.clear();
  epi.kind = StepKind::Elementwise;
  epi.dtype = g.dtype;
  epi.output = g.output;
  epi.more_outputs = g.more_outputs;
  epi.more_results = g.more_results;
  epi.program = g.program;
  epi.shape = g.shape;
  for (Instr& in : epi.program) {  // only the slots the program loads, renumbered
    if (in.code != Code::Load) continue;
    int slot = g.inputs[size_t(in.input)];
    if (slot == g.output) epi.shape = in.map.shape();  // the epilogue's own domain (the product's positions, maybe reshaped)
    auto it = std::find(epi.inputs.begin(), epi.inputs.end(), slot);
    in.input = int(it - epi.inputs.begin());
    if (it == epi.inputs.end()) epi.inputs.push_back(slot);
  }
  // The product's flops and bytes stay with the product; the rest is the epilogue's.
  for (const Source& s : g.sources) (s.op == "matmul" || s.op == "conv" ? product : epi).sources.push_back(s);
  if (product.sources.empty()) product.sources.push_back(g.sources.front());
  double product_flops = 0;
  for (const Source& s : product.sources) product_flops += s.flops;
  product.cost.flops = product_flops;
  epi.cost.flops = g.cost.flops - product_flops;
  double out_bytes = double(numel(g.shape)) * double(itemsize(g.dtype));
  epi.cost.bytes = 2 * out_bytes;
  product.cost.bytes = g.cost.bytes;
  return {std::move(product), std::move(epi)};
}

void Step::rename_reads(int from, int to) {
  std::replace(inputs.begin(), inputs.end(), from, to);
  for (Step& p : parts) p.rename_reads(from, to);
}

void Step::rename_slot(int from, int to) {
  std::replace(inputs.begin(), inputs.end(), from, to);
  if (output == from) output = to;
  std::replace(more_outputs.begin(), more_outputs.end(), from, to);
  for (Step& p : parts) p.rename_slot(from, to);
}

}  // namespace tessera::kir
