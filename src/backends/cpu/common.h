// What the CPU backend's engines share: tile sizes, dispatch on a dtype's storage and compute
// types, row-major index arithmetic, cache-line-aligned buffers and run reductions.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>
#include <vector>

#include "backends/backend.h"
#include "core/half.h"
#include "kernel_ir/step.h"

namespace tessera::backends::cpu {

using kir::Code;
using kir::IndexMap;
using kir::Instr;
using kir::Step;
using kir::StepKind;

constexpr int64_t kTile = 1024;             // elements per tile: a few tiles fit in L1
constexpr int64_t kParallelMin = 1 << 16;   // below this many elements, one thread
constexpr int64_t kStreamMin = 8 << 20;     // outputs of at least this many bytes bypass the caches

struct F16 { uint16_t v; };
struct BF16 { uint16_t v; };

// Calls f with a typed null pointer of the storage type of dtype t.
template <class F>
void with_storage(DType t, F&& f) {
  switch (t) {
    case DType::Bool: f((uint8_t*)nullptr); break;
    case DType::Int32: f((int32_t*)nullptr); break;
    case DType::Int64: f((int64_t*)nullptr); break;
    case DType::Float16: f((F16*)nullptr); break;
    case DType::BFloat16: f((BF16*)nullptr); break;
    case DType::Float32: f((float*)nullptr); break;
    case DType::Float64: f((double*)nullptr); break;
  }
}
// Calls f with a typed null pointer of the compute type of dtype t.
template <class F>
void with_compute(DType t, F&& f) {
  switch (compute_dtype(t)) {
    case DType::Bool: f((uint8_t*)nullptr); break;
    case DType::Int32: f((int32_t*)nullptr); break;
    case DType::Int64: f((int64_t*)nullptr); break;
    case DType::Float64: f((double*)nullptr); break;
    default: f((float*)nullptr); break;
  }
}

template <class T> inline T to_c(uint8_t s) { return T(s); }
template <class T> inline T to_c(int32_t s) { return T(s); }
template <class T> inline T to_c(int64_t s) { return T(s); }
template <class T> inline T to_c(float s) { return T(s); }
template <class T> inline T to_c(double s) { return T(s); }
template <class T> inline T to_c(F16 s) { return T(half::f16_to_float(s.v)); }
template <class T> inline T to_c(BF16 s) { return T(half::bf16_to_float(s.v)); }

template <class S> inline S from_c(double v);  // compute value -> storage
template <> inline uint8_t from_c<uint8_t>(double v) { return v != 0; }
// NaN and values out of range give the type's minimum, as x86's truncating conversions
// (cvttsd2si) do and the native loops therefore do too; in C++ such a conversion is undefined.
template <> inline int32_t from_c<int32_t>(double v) {
  return v >= -2147483648.0 && v < 2147483648.0 ? int32_t(v) : std::numeric_limits<int32_t>::min();
}
template <> inline int64_t from_c<int64_t>(double v) {
  return v >= -9223372036854775808.0 && v < 9223372036854775808.0 ? int64_t(v) : std::numeric_limits<int64_t>::min();
}
template <> inline float from_c<float>(double v) { return float(v); }
template <> inline double from_c<double>(double v) { return v; }
template <> inline F16 from_c<F16>(double v) { return F16{half::float_to_f16(float(v))}; }
template <> inline BF16 from_c<BF16>(double v) { return BF16{half::float_to_bf16(float(v))}; }

// Converting stores keep integer values exact (no detour through double for int64).
template <class S, class T> inline S store_as(T v) {
  if constexpr (std::is_same_v<S, T>) return v;
  else if constexpr (std::is_same_v<S, uint8_t>) return v != T(0);
  else if constexpr (std::is_integral_v<S> && std::is_integral_v<T>) return S(v);
  else return from_c<S>(double(v));
}

// Advances a row-major multi-index by one.
inline void bump(int64_t* idx, const Shape& s) {
  for (size_t d = s.size(); d-- > 0;) {
    if (++idx[d] < s[d]) return;
    idx[d] = 0;
  }
}
// Advances the multi-index idx over the first `dims` dims of view v by one (row-major), keeping
// `off` the view's offset of it: the next row (dims = rank - 1) or block of rows (rank - 2).
inline void next_outer(int64_t* idx, int64_t& off, const kir::View& v, size_t dims) {
  for (size_t d = dims; d-- > 0;) {
    off += v.strides[d];
    if (++idx[d] < v.shape[d]) return;
    off -= v.strides[d] * v.shape[d];
    idx[d] = 0;
  }
}
inline void unravel(int64_t lin, const Shape& s, int64_t* idx) {
  for (size_t d = s.size(); d-- > 0;) {
    int64_t e = s[d] == 0 ? 1 : s[d];
    idx[d] = lin % e;
    lin /= e;
  }
}

// Registers start on cache lines: a vector load or store that straddles two lines costs two (a
// plain vector<double> from a large malloc starts 16 bytes into a page, which made every other
// 32-byte access of the register loops a split one, ~30% of their time).
template <class T> struct LineAligned {
  using value_type = T;
  LineAligned() = default;
  template <class U> LineAligned(const LineAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  bool operator==(const LineAligned&) const = default;
};

// A launch's packing buffer, kept by the launching thread between launches: at least n elements,
// line-aligned, its contents whatever the last launch left (the caller writes every element it
// reads). Tag: one buffer per use (buffers live at once need distinct tags). A fresh zeroed
// vector per launch cost the GPT step ~0.45 ms of serial memset, malloc and page faults
// (docs/architecture.md, "Per-Step overhead"). The largest launch's size stays allocated per
// thread, as the per-thread buffers of the kernels' tasks do.
template <class Tag, class T>
T* launch_buffer(size_t n) {
  thread_local std::vector<T, LineAligned<T>> buf;
  if (buf.size() < n) {
    buf = {};  // no copy of the old contents
    buf.resize(n);
  }
  return buf.data();
}

inline std::vector<const void*> inputs_of(const Step& st, const LaunchArgs& a) {
  std::vector<const void*> in;
  for (int s : st.inputs) in.push_back(a.slots[s]);
  return in;
}

// An int32 or int64 element (an index, an integer GEMM operand) as int64.
inline int64_t read_index(const void* base, DType t, int64_t off) {
  return t == DType::Int32 ? static_cast<const int32_t*>(base)[off] : static_cast<const int64_t*>(base)[off];
}

template <class T> inline T nan_max(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  }
  return a > b ? a : b;
}
template <class T> inline T nan_min(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  }
  return a < b ? a : b;
}

// Reductions of a run of values with 8 independent accumulators, so they vectorize; the order
// is fixed by the run alone, so results are the same for any thread count. Sums of floats
// accumulate in double, of integers in int64; a NaN anywhere makes the maximum NaN.
template <class T> inline auto run_sum(const T* a, int64_t n) {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
  Acc acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += Acc(a[i + j]);
  for (int j = 0; i < n; ++i, ++j) acc[j] += Acc(a[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
template <class T> inline T run_max(const T* a, int64_t n, T init) {
  T m[8];
  std::fill_n(m, 8, init);
  bool nan = false;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) {
      T x = a[i + j];
      m[j] = x > m[j] ? x : m[j];
      if constexpr (std::is_floating_point_v<T>) nan |= x != x;
    }
  for (int j = 0; i < n; ++i, ++j) {
    T x = a[i];
    m[j] = x > m[j] ? x : m[j];
    if constexpr (std::is_floating_point_v<T>) nan |= x != x;
  }
  if (nan) return std::numeric_limits<T>::quiet_NaN();
  T r = m[0];
  for (int j = 1; j < 8; ++j) r = m[j] > r ? m[j] : r;
  return r;
}

}  // namespace tessera::backends::cpu
