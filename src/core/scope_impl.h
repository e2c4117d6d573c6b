// Internal: replaces the calling thread's scope path for a region (autodiff names VJP nodes
// "<forward scope>.backward" whatever scope backward() was called in).
#pragma once
#include <string>
#include <vector>

namespace tessera {

class ScopeAs {
 public:
  explicit ScopeAs(const std::string& full_path);
  ~ScopeAs();
  ScopeAs(const ScopeAs&) = delete;
  ScopeAs& operator=(const ScopeAs&) = delete;

 private:
  std::string saved_path_;
  std::vector<size_t> saved_marks_;
};

}  // namespace tessera
