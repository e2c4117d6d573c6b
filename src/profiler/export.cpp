// What the exports share: a Step described (attribution of a fused Step to its source ops) and
// file output.
#include "profiler/export.h"

#include <algorithm>
#include <fstream>
#include <set>

#include "core/fail.h"

namespace tessera::profiler {

StepInfo describe(const kir::Step& st) {
  StepInfo si;
  si.kind = kir::step_kind_name(st.kind);
  si.shape = std::string(dtype_short(st.dtype)) + shape_str(st.shape);
  si.flops = st.cost.flops;
  si.bytes = st.cost.bytes;
  // Each source op's share is its flops by its own cost rule (Source::flops, summing to the
  // Step's flops): exact as far as the cost rules are; equal shares when no source has flops.
  std::vector<double> w(st.sources.size(), 0);
  double total = 0;
  for (size_t i = 0; i < st.sources.size(); ++i) total += (w[i] = st.sources[i].flops);
  for (size_t i = 0; i < st.sources.size(); ++i)
    si.ops.push_back({st.sources[i].op, st.sources[i].scope, total > 0 ? w[i] / total : 1.0 / double(st.sources.size())});
  // Dominant module path: the largest share (ties: the first seen).
  std::vector<std::pair<std::string, double>> by_scope;
  for (auto& o : si.ops) {
    auto it = std::find_if(by_scope.begin(), by_scope.end(), [&](auto& p) { return p.first == o.scope; });
    if (it == by_scope.end()) by_scope.push_back({o.scope, o.share});
    else it->second += o.share;
  }
  double best = -1;
  for (auto& [s, x] : by_scope)
    if (x > best + 1e-12) best = x, si.scope = s;
  std::string ops;
  std::set<std::string> seen;
  bool any_weight = total > 0;
  for (size_t i = 0; i < si.ops.size(); ++i)
    if (si.ops[i].scope == si.scope && (!any_weight || w[i] > 0) && seen.insert(si.ops[i].op).second)
      ops += (ops.empty() ? "" : "+") + si.ops[i].op;
  si.name = (si.scope.empty() ? std::string("<top>") : si.scope) + ": " + ops;
  if (!st.parts.empty()) si.name += " (" + std::to_string(st.parts.size()) + " parts, one launch)";  // Step::parts
  return si;
}

const StepInfo& Described::at(const compiler::Plan* plan, int index) {
  auto it = plans_.find(plan);
  if (it == plans_.end()) {
    std::vector<StepInfo> v;
    for (const kir::Step& st : plan->steps) v.push_back(describe(st));
    it = plans_.emplace(plan, std::move(v)).first;
  }
  return it->second[size_t(index)];
}

void write_file(const std::string& path, const std::string& text, const char* what) {
  std::ofstream f(path, std::ios::binary);
  if (!f) fail("profiler", std::string("cannot write the ") + what + " to '" + path + "'", "");
  f << text;
  f.close();
  if (!f) fail("profiler", std::string("writing the ") + what + " to '" + path + "' failed", "");
}

}  // namespace tessera::profiler
