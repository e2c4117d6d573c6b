#include "ir/conv.h"

#include "core/fail.h"

namespace tessera::ir {

Attrs ConvAttrs::to_attrs() const {
  Attrs a;
  a.ints.push_back(groups);
  for (const ConvAxis& x : axes) a.ints.insert(a.ints.end(), {x.stride, x.lo, x.hi, x.lhs_dilation, x.rhs_dilation});
  return a;
}

ConvAttrs ConvAttrs::from(const Attrs& a) {
  if (a.ints.empty() || (a.ints.size() - 1) % 5 != 0)
    fail("conv", "attributes must be {groups, then stride, pad_lo, pad_hi, lhs_dilation, rhs_dilation per spatial dim}");
  ConvAttrs c;
  c.groups = a.ints[0];
  for (size_t i = 1; i < a.ints.size(); i += 5)
    c.axes.push_back({a.ints[i], a.ints[i + 1], a.ints[i + 2], a.ints[i + 3], a.ints[i + 4]});
  return c;
}

int64_t conv_padded_extent(int64_t n, const ConvAxis& a) { return (n - 1) * a.lhs_dilation + 1 + a.lo + a.hi; }

int64_t conv_output_extent(int64_t n, int64_t k, const ConvAxis& a) {
  int64_t span = conv_padded_extent(n, a) - conv_kernel_extent(k, a);
  return span < 0 ? 0 : span / a.stride + 1;
}

}  // namespace tessera::ir
