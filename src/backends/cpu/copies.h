// Copies: Copy Steps of one strided view written row by row (run_view_copy, run_box_copy), and the
// helpers other engines copy with: a map's positions packed densely (GEMM operands, the base of a
// scatter-add or dynamic_update_slice), non-temporal stores for outputs far larger than the caches.
#pragma once
#include "backends/cpu/common.h"

namespace tessera::backends::cpu {

// Copies n consecutive row-major positions of map m's domain, from position `start`, densely into
// dst; masked positions read 0.
void copy_positions(const IndexMap& m, const void* src, int64_t start, int64_t n, void* dst, size_t elem);
// The whole of map m's domain, densely; large copies in fixed chunks over the pool.
void copy_map(const IndexMap& m, const void* src, void* dst, size_t elem);
// memcpy with non-temporal stores (no read-for-ownership of the destination, no cache
// pollution), for outputs far larger than the caches; 16-byte aligned pointers, else memcpy.
void stream_copy(void* dst, const void* src, size_t bytes);

}  // namespace tessera::backends::cpu
