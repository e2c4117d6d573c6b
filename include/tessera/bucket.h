// Bucketing for dynamic lengths. A graph is compiled per distinct input shape, so a loop over
// batches of varying length T would compile one graph per T. Padding each batch up to one of a
// few bucket lengths (and masking the padding out of the loss) compiles one graph per bucket:
//
//   data::Padded p = data::pad_to_bucket(tokens /*[B, T]*/, 1, {16, 32, 64});
//   Tensor nll = per_token_loss(model(p.values), targets_padded);      // [B, bucket]
//   Tensor loss = (nll * p.mask).sum() / p.mask.sum();                 // mean over valid tokens
//
// Padding happens on the host and both results are realized tensors (graph inputs), so neither
// the length nor the amount of padding appears in any graph; only the bucket does.
#pragma once
#include <cstdint>
#include <vector>

#include "tessera/tensor.h"

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera::data {

// The smallest bucket >= n. `buckets` must be positive and strictly increasing; empty means
// powers of two (1, 2, 4, ...). Throws tessera::Error when n is negative or exceeds the largest
// bucket.
int64_t bucket_length(int64_t n, const std::vector<int64_t>& buckets = {});
// Powers of two from the smallest >= lo up to the largest <= hi, e.g. (16, 64) -> {16, 32, 64}.
std::vector<int64_t> power_of_two_buckets(int64_t lo, int64_t hi);

struct Padded {
  Tensor values;   // the input with dimension `dim` padded to `bucket` (same dtype and device)
  // 1 at valid positions, 0 at padding: shape values.shape()[0..dim] (e.g. [B, bucket] for
  // [B, T] or [B, T, D] inputs padded along 1), dtype as asked (float32 by default).
  Tensor mask;
  int64_t length = 0;            // the longest valid extent along dim (the input's extent)
  int64_t bucket = 0;            // the padded extent
  std::vector<int64_t> lengths;  // valid extent per mask row (pad_sequences; else all `length`)
};

// Pads t along dim (negative counts from the end) to bucket_length(t.size(dim), buckets) with
// pad_value after the valid positions. Reads t's values (one host sync when t is pending) and
// uploads the padded copy and the mask to t's device: nothing shape-dependent is traced.
Padded pad_to_bucket(const Tensor& t, int64_t dim, const std::vector<int64_t>& buckets = {}, double pad_value = 0,
                     DType mask_dtype = DType::Float32);

// A ragged batch of token rows -> values int64 [rows, bucket] padded with pad_value, mask
// [rows, bucket], lengths per row; the bucket is that of the longest row.
Padded pad_sequences(const std::vector<std::vector<int64_t>>& rows, const std::vector<int64_t>& buckets = {},
                     int64_t pad_value = 0, const Device& device = Device("cpu"), DType mask_dtype = DType::Float32);

}  // namespace tessera::data
#pragma GCC visibility pop
