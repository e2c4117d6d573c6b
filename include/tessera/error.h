// The one exception type of the public API. Messages start with the op in brackets, then the
// shapes/dtypes involved, then the scope (module path) where the op was traced:
//   [matmul] shapes [2, 3] and [4, 5]: inner dimensions differ (3 vs 4) (in scope 'blocks.0.mlp')
#pragma once
#include <stdexcept>
#include <string>

namespace tessera {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// Builds the message in the documented order; `scope` may be empty (then the current scope of
// the calling thread is used when `use_current_scope` is true).
[[noreturn]] void fail(const std::string& op, const std::string& detail, const std::string& scope);
[[noreturn]] void fail(const std::string& op, const std::string& detail);  // current scope

}  // namespace tessera
