#include "tessera/bucket.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/fail.h"

namespace tessera::data {
namespace {

std::string list_text(const std::vector<int64_t>& v) {
  std::string s = "{";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "}";
}

// The mask [outer..., bucket] with `length` valid positions per row (or per-row lengths).
Tensor make_mask(const Shape& shape, const std::vector<int64_t>& lengths, const Device& d, DType dt) {
  int64_t bucket = shape.back(), rows = int64_t(lengths.size());
  std::vector<uint8_t> m(size_t(rows * bucket), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < lengths[size_t(r)]; ++i) m[size_t(r * bucket + i)] = 1;
  return from_vector<uint8_t>(m, shape, {dt, d});
}

// Copies t ([outer, length, inner] in row-major order) into [outer, bucket, inner] filled with pad.
template <class T>
Tensor pad_host(const Tensor& t, int64_t outer, int64_t length, int64_t inner, int64_t bucket, T pad, const Shape& s) {
  std::vector<T> in = t.to_vector<T>();
  std::vector<T> out(size_t(outer * bucket * inner), pad);
  for (int64_t o = 0; o < outer; ++o)
    std::copy(in.begin() + o * length * inner, in.begin() + (o + 1) * length * inner, out.begin() + o * bucket * inner);
  return from_vector<T>(out, s, {t.dtype(), t.device()});
}

}  // namespace

int64_t bucket_length(int64_t n, const std::vector<int64_t>& buckets) {
  if (n < 0) fail("bucket_length", "length must not be negative, got " + std::to_string(n));
  if (buckets.empty()) {
    int64_t b = 1;
    while (b < n) {
      if (b > (int64_t(1) << 61)) fail("bucket_length", "no power-of-two bucket holds length " + std::to_string(n));
      b <<= 1;
    }
    return b;
  }
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (buckets[i] <= 0) fail("bucket_length", "buckets must be positive, got " + list_text(buckets));
    if (i && buckets[i] <= buckets[i - 1]) fail("bucket_length", "buckets must be strictly increasing, got " + list_text(buckets));
  }
  for (int64_t b : buckets)
    if (b >= n) return b;
  fail("bucket_length", "length " + std::to_string(n) + " exceeds the largest bucket " + std::to_string(buckets.back()) +
                            " (buckets " + list_text(buckets) + ")");
}

std::vector<int64_t> power_of_two_buckets(int64_t lo, int64_t hi) {
  if (lo < 1 || hi < lo)
    fail("power_of_two_buckets", "needs 1 <= lo <= hi, got lo " + std::to_string(lo) + " and hi " + std::to_string(hi));
  std::vector<int64_t> r;
  for (int64_t b = bucket_length(lo); b <= hi; b <<= 1) {
    r.push_back(b);
    if (b > (int64_t(1) << 61)) break;
  }
  if (r.empty()) fail("power_of_two_buckets", "no power of two lies in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return r;
}

Padded pad_to_bucket(const Tensor& t, int64_t dim, const std::vector<int64_t>& buckets, double pad_value, DType mask_dtype) {
  if (!t.defined()) fail("pad_to_bucket", "the tensor is undefined");
  int64_t rank = t.dim();
  if (rank == 0) fail("pad_to_bucket", "needs a tensor with at least one dimension, got a scalar");
  if (dim < -rank || dim >= rank)
    fail("pad_to_bucket", "dim " + std::to_string(dim) + " is out of range for shape " + shape_str(t.shape()));
  if (dim < 0) dim += rank;
  DType dt = t.dtype();
  if (!is_floating(dt)) {
    bool ok = std::isfinite(pad_value) && pad_value == std::floor(pad_value);
    if (dt == DType::Bool) ok = pad_value == 0 || pad_value == 1;
    if (!ok) fail("pad_to_bucket", "pad value " + std::to_string(pad_value) + " does not fit dtype " + dtype_name(dt));
  }
  Padded p;
  p.length = t.size(dim);
  p.bucket = bucket_length(p.length, buckets);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= t.size(d);
  for (int64_t d = dim + 1; d < rank; ++d) inner *= t.size(d);
  Shape s = t.shape();
  s[size_t(dim)] = p.bucket;
  if (is_floating(dt)) p.values = pad_host<double>(t, outer, p.length, inner, p.bucket, pad_value, s);
  else if (dt == DType::Bool) p.values = pad_host<uint8_t>(t, outer, p.length, inner, p.bucket, uint8_t(pad_value), s);
  else p.values = pad_host<int64_t>(t, outer, p.length, inner, p.bucket, int64_t(pad_value), s);
  Shape ms(s.begin(), s.begin() + dim + 1);
  p.lengths.assign(size_t(outer), p.length);
  p.mask = make_mask(ms, p.lengths, t.device(), mask_dtype);
  return p;
}

Padded pad_sequences(const std::vector<std::vector<int64_t>>& rows, const std::vector<int64_t>& buckets,
                     int64_t pad_value, const Device& device, DType mask_dtype) {
  Padded p;
  for (auto& r : rows) {
    p.lengths.push_back(int64_t(r.size()));
    p.length = std::max(p.length, int64_t(r.size()));
  }
  p.bucket = bucket_length(p.length, buckets);
  int64_t n = int64_t(rows.size());
  std::vector<int64_t> v(size_t(n * p.bucket), pad_value);
  for (int64_t i = 0; i < n; ++i) std::copy(rows[size_t(i)].begin(), rows[size_t(i)].end(), v.begin() + i * p.bucket);
  p.values = from_vector<int64_t>(v, {n, p.bucket}, {DType::Int64, device});
  p.mask = make_mask({n, p.bucket}, p.lengths, device, mask_dtype);
  return p;
}

}  // namespace tessera::data
