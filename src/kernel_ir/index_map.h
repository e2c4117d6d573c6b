// Index maps: how a Step's loop index reaches an element of a buffer. A map is a stack of strided
// views; each view may mask dimensions (positions outside the mask read the pad value). Movement
// primitives (reshape, permute, expand, slice, pad) compose into maps instead of copying.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/shape.h"

#pragma GCC visibility push(default)  // the backend SDK: exported for plugins
namespace tessera::kir {

struct View {
  Shape shape;
  std::vector<int64_t> strides;     // in elements
  int64_t offset = 0;               // in elements
  std::vector<int64_t> lo, hi;      // mask per dimension (valid where lo <= i < hi); empty = none

  bool masked() const { return !lo.empty(); }
  bool operator==(const View& o) const = default;
};

struct IndexMap {
  std::vector<View> views;  // views[0] addresses memory; views.back() is the loop domain

  static IndexMap contiguous(const Shape& s);
  const Shape& shape() const { return views.back().shape; }
  bool single() const { return views.size() == 1 && !views[0].masked(); }  // plain strided
  bool is_contiguous() const;  // single, dense row-major (offset may be non-zero)

  IndexMap reshape(const Shape& s) const;
  IndexMap permute(const std::vector<int64_t>& perm) const;
  IndexMap expand(const Shape& s) const;
  IndexMap slice(const std::vector<int64_t>& start_stop_step) const;
  IndexMap pad(const std::vector<int64_t>& lo_hi_interior) const;
  IndexMap reverse(const std::vector<int64_t>& axes) const;
  // A window over this map's domain: new dimension j (extent shape[j]) moves dimension dims[j]
  // of the domain by steps[j] per index (several new dimensions may move one old dimension, as
  // a convolution's kernel and output positions do); the caller keeps the sums in bounds.
  // Composed into the top view when it is unmasked, else stacked over it.
  IndexMap window(const Shape& shape, const std::vector<int64_t>& dims, const std::vector<int64_t>& steps) const;

  // Element offset of multi-index idx (in shape()); false where a mask hides it.
  bool offset(const int64_t* idx, int64_t* off) const { return offset_from(views.size() - 1, idx, off); }
  // The same, with idx given in the shape of views[top] (the views above it are skipped).
  bool offset_from(size_t top, const int64_t* idx, int64_t* off) const;
  // The lowest view whose row-major order equals the loop domain's: views above it that are
  // plain reshapes (dense, unmasked, offset 0) only renumber positions.
  size_t effective_top() const;
  std::string str() const;
  bool operator==(const IndexMap& o) const;
  size_t hash() const;
};

}  // namespace tessera::kir
#pragma GCC visibility pop
