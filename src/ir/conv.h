// The attributes of Op::Conv as a struct: feature groups, then per spatial dimension the window
// stride, low/high padding (negative crops) and lhs/rhs dilation. Shared by the shape rule, the
// VJP rules, the frontend and the lowering (the reference evaluator reads Attrs itself).
#pragma once
#include <cstdint>
#include <vector>

#include "ir/node.h"

#pragma GCC visibility push(default)  // the backend SDK: exported for plugins
namespace tessera::ir {

struct ConvAxis {
  int64_t stride = 1, lo = 0, hi = 0, lhs_dilation = 1, rhs_dilation = 1;
};

struct ConvAttrs {
  int64_t groups = 1;
  std::vector<ConvAxis> axes;  // one per spatial dimension

  Attrs to_attrs() const;
  static ConvAttrs from(const Attrs& a);  // the layout only; the shape rule validates values
};

// Extent of an input of extent n after lhs dilation and padding ((n-1)*dilation + 1 + lo + hi).
int64_t conv_padded_extent(int64_t n, const ConvAxis& a);
// Extent of a kernel of extent k after rhs dilation.
inline int64_t conv_kernel_extent(int64_t k, const ConvAxis& a) { return (k - 1) * a.rhs_dilation + 1; }
// Output extent along one axis (floor((padded - kernel) / stride) + 1); < 1 when the kernel
// does not fit.
int64_t conv_output_extent(int64_t n, int64_t k, const ConvAxis& a);

}  // namespace tessera::ir
#pragma GCC visibility pop
