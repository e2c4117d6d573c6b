// Named scopes: every op traced while a Scope is alive records its name; nested scopes join
// with '.' ("blocks.2.attn"). Modules push their path automatically; users add their own.
#pragma once
#include <string>

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera {

class Scope {
 public:
  explicit Scope(const std::string& name);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};

// The calling thread's current scope path ("" at top level).
const std::string& current_scope();

}  // namespace tessera
#pragma GCC visibility pop
