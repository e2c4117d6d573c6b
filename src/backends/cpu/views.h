// Walking a Step's index maps: element offsets of a run of domain positions, and views merged
// into fewer, longer rows.
#pragma once
#include "backends/cpu/common.h"

namespace tessera::backends::cpu {

// Element offsets (and validity under masks) of n consecutive domain positions from `start`.
// Plain-reshape views on top are skipped (they keep the row-major order); a single strided view,
// masked or not, is walked incrementally; deeper stacks are evaluated per element.
void tile_offsets(const IndexMap& m, int64_t start, int64_t n, int64_t* off, uint8_t* valid);

// The view with adjacent dims merged where they walk memory as one (stride[d] = stride[d + 1] *
// extent[d + 1], neither masked) and unmasked extent-1 dims dropped: the same row-major positions
// in fewer, longer rows for load_strided and store_reg.
kir::View coalesced(const kir::View& v);

}  // namespace tessera::backends::cpu
