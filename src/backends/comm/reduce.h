// Host-side helpers of the communicators: elementwise reductions of raw buffers of any dtype
// (16-bit floats through float32, like the backends compute them) and the signature every rank
// compares before a collective.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "backends/communicator.h"

namespace tessera::backends::comm {

// acc[i] = acc[i] (+ or max) x[i]; max propagates NaN.
void accumulate(void* acc, const void* x, size_t count, DType t, ir::ReduceKind kind);
// x[i] /= n (mean after a sum).
void divide(void* x, size_t count, DType t, int n);

// What each rank says about a collective call; equal on every rank or the call fails everywhere.
struct Signature {
  int64_t op = 0;     // ir::Op
  int64_t count = 0;
  int64_t dtype = 0;
  int64_t extra = 0;  // the reduce kind, root, or for permute (send_to + 1) * 65536 + recv_from + 1
  bool operator==(const Signature&) const = default;
  std::string str() const;  // "all_reduce sum of 6 float32"
};
// Permute signatures differ by rank (each its own pair): ranks compare only op, count and dtype,
// and the pairs are checked for matching sends and receives.
bool same_call(const Signature& a, const Signature& b);

// The default timeout: TESSERA_COLLECTIVE_TIMEOUT_S (seconds) or 30 s.
std::chrono::milliseconds default_timeout();

}  // namespace tessera::backends::comm
