#include "ir/saved.h"

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
  if (t.size() > 4096)  // drop the entries of dead nodes now and then
    for (auto it = t.begin(); it != t.end();) it = it->second.expired() ? t.erase(it) : std::next(it);
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
