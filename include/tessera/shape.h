// Shapes are plain vectors of extents; these helpers are shared by every layer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera {

using Shape = std::vector<int64_t>;

int64_t numel(const Shape& s);
std::string shape_str(const Shape& s);                 // "[2, 3]"
std::vector<int64_t> contiguous_strides(const Shape& s);  // row-major, in elements
// NumPy broadcasting of two shapes; throws tessera::Error naming `op` when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Wraps a possibly negative dimension index; throws naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t rank, const char* op);
// The same for a tensor of shape s, naming the shape; one_more allows rank(s) (a new dimension).
int64_t wrap_dim(int64_t dim, const Shape& s, const char* op, bool one_more = false);

}  // namespace tessera
#pragma GCC visibility pop
