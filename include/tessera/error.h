// The one exception type of the public API. Messages start with the op in brackets, then the
// shapes/dtypes involved, then the scope (module path) where the op was traced:
//   [matmul] shapes [2, 3] and [4, 5]: inner dimensions differ (3 vs 4) (in scope 'blocks.0.mlp')
#pragma once
#include <stdexcept>
#include <string>

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

}  // namespace tessera
#pragma GCC visibility pop
