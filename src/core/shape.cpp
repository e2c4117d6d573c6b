#include "tessera/shape.h"

#include "core/fail.h"

namespace tessera {

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape r(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      fail(op, "shapes " + shape_str(a) + " and " + shape_str(b) + " cannot be broadcast (dimension " +
                   std::to_string(i) + ": " + std::to_string(da) + " vs " + std::to_string(db) + ")");
    r[i] = da == 1 ? db : da;
  }
  return r;
}

int64_t wrap_dim(int64_t dim, int64_t rank, const char* op) {
  int64_t r = dim < 0 ? dim + rank : dim;
  if (r < 0 || r >= rank)
    fail(op, "dimension " + std::to_string(dim) + " out of range for a tensor of rank " + std::to_string(rank));
  return r;
}

int64_t wrap_dim(int64_t dim, const Shape& s, const char* op, bool one_more) {
  int64_t rank = int64_t(s.size()) + (one_more ? 1 : 0);
  int64_t r = dim < 0 ? dim + rank : dim;
  if (r < 0 || r >= rank)
    fail(op, "dimension " + std::to_string(dim) + " out of range for a tensor of shape " + shape_str(s) +
                 (one_more ? " (a new dimension may be inserted)" : ""));
  return r;
}

}  // namespace tessera
