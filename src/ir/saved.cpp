#include "ir/saved.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>

namespace tessera::ir {
namespace {
std::mutex mu;
std::unordered_map<const Node*, std::weak_ptr<const Node>>& table() {
  static std::unordered_map<const Node*, std::weak_ptr<const Node>> t;
  return t;
}
}  // namespace

void mark_saved(const NodePtr& n) {
  std::lock_guard<std::mutex> lock(mu);
  auto& t = table();
  // Drop the entries of dead nodes whenever the table has doubled since the last sweep: each
  // training step marks new nodes and the old ones die, so it stays about twice the live marks
  // (a long run's memory flat: tests/e2e/test_soak.cpp) at an amortized constant cost a mark.
  static size_t sweep_at = 64;
  if (t.size() >= sweep_at) {
    for (auto it = t.begin(); it != t.end();) it = it->second.expired() ? t.erase(it) : std::next(it);
    sweep_at = std::max<size_t>(64, 2 * t.size());
  }
  t[n.get()] = n;
}

bool is_saved(const Node* n) {
  std::lock_guard<std::mutex> lock(mu);
  auto& t = table();
  auto it = t.find(n);
  if (it == t.end()) return false;
  NodePtr live = it->second.lock();
  return live && live.get() == n;
}

}  // namespace tessera::ir
