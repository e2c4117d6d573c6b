// What the compiler plans for: the properties of a device that change a plan. Backends report
// them (Backend::properties); the null backend can pose as any target, so the advisor plans for
// devices that are not here with the same pipeline.
#pragma once
#include <cstddef>
#include <vector>

#include "tessera/dtype.h"

namespace tessera::kir {

struct Target {
  size_t alignment = 64;              // bytes; every arena temporary starts at a multiple of it
  std::vector<DType> compute_dtypes;  // dtypes the device computes natively; empty = all

  bool computes(DType t) const {
    if (compute_dtypes.empty()) return true;
    for (DType d : compute_dtypes)
      if (d == t) return true;
    return false;
  }
};

}  // namespace tessera::kir
