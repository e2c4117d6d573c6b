// The profiler module's shared pieces: a Step described for export (name, kind, shape and its
// source ops with their shares: the attribution rule in tessera/profiler.h), and file output.
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "compiler/lower.h"
#include "tessera/profiler.h"

namespace tessera::profiler {

struct StepInfo {
  std::string name;   // "blocks.1.mlp: matmul+gelu": the dominant module path, then its compute ops
  std::string kind;   // "gemm", "row", ...
  std::string shape;  // "f32[16, 64]"
  std::string scope;  // the dominant module path (largest share)
  std::vector<ProfiledOp> ops;
  double flops = 0, bytes = 0;
};

StepInfo describe(const kir::Step& st);

// Step descriptions of every plan a profile ran, computed once per plan.
class Described {
 public:
  const StepInfo& at(const compiler::Plan* plan, int index);

 private:
  std::unordered_map<const compiler::Plan*, std::vector<StepInfo>> plans_;
};

// Writes text to path, throwing tessera::Error ("[profiler] ...") naming `what` and the path.
void write_file(const std::string& path, const std::string& text, const char* what);

}  // namespace tessera::profiler
