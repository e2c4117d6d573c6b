#include "tessera/scope.h"

#include "core/scope_impl.h"

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

ScopeAs::ScopeAs(const std::string& full_path) : saved_path_(t_path), saved_marks_(t_marks) {
  t_path = full_path;
  t_marks.clear();
}

ScopeAs::~ScopeAs() {
  t_path = saved_path_;  // copied, not moved: t_path keeps its capacity for the next ScopeAs
  t_marks = saved_marks_;
}

}  // namespace tessera
