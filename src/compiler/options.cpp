#include "compiler/options.h"

namespace tessera::compiler {

const std::vector<std::string>& pass_names() {
  static const std::vector<std::string> names = {"simplify", "cse", "dce", "place", "fuse", "saved", "attention", "schedule", "epilogue", "merge", "fold_casts", "donate", "inplace_last", "group", "memplan", "unstack", "remat", "accumulate"};
  return names;
}

std::string Options::key() const {
  std::string k;
  for (const std::string& n : disabled) k += n + ",";
  if (arena_guard) k += "|guard" + std::to_string(arena_guard);
  if (memory_budget) k += "|budget" + std::to_string(memory_budget);
  if (memory_budget_fraction > 0) k += "|budget*" + std::to_string(memory_budget_fraction);
  return k;
}

}  // namespace tessera::compiler
