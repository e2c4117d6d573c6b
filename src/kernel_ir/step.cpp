#include "kernel_ir/step.h"

#include <algorithm>
#include <sstream>

namespace tessera::kir {

const char* step_kind_name(StepKind k) {
  static const char* names[] = {"elementwise", "copy", "reduce", "gemm", "gather", "scatter_add",
                                "dynamic_update_slice", "row"};
  return names[static_cast<int>(k)];
}

std::string Step::str() const {
  std::ostringstream os;
  os << step_kind_name(kind) << " " << dtype_short(dtype) << shape_str(shape) << " -> slot " << output;
  for (int o : more_outputs) os << ", slot " << o;
  os << " <- (";
  for (size_t i = 0; i < inputs.size(); ++i) os << (i ? ", " : "") << "slot " << inputs[i];
  os << ")";
  if (!program.empty()) {
    size_t deepest = 0;
    for (auto& in : program) deepest = std::max(deepest, in.map.views.size());
    os << " [" << program.size() << " instrs, maps " << deepest << " deep]";
  }
  os << " from";
  for (auto& s : sources) os << " " << s.op << (s.scope.empty() ? "" : "@" + s.scope);
  return os.str();
}

}  // namespace tessera::kir
