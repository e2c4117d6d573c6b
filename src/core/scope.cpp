#include "tessera/scope.h"

#include <vector>

namespace tessera {
namespace {
thread_local std::vector<size_t> t_marks;  // length of the path before each push
thread_local std::string t_path;
}  // namespace

Scope::Scope(const std::string& name) {
  t_marks.push_back(t_path.size());
  if (!t_path.empty()) t_path += '.';
  t_path += name;
}

Scope::~Scope() {
  t_path.resize(t_marks.back());
  t_marks.pop_back();
}

const std::string& current_scope() { return t_path; }

}  // namespace tessera
