// Element types, their sizes and PyTorch-style type promotion.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera {

// float16 and bfloat16 are storage types: they are computed in float32 and rounded on store.
enum class DType : uint8_t { Bool, Int32, Int64, Float16, BFloat16, Float32, Float64 };

size_t itemsize(DType t);
const char* dtype_name(DType t);  // "float32", "int64", ...
const char* dtype_short(DType t); // "f32", "i64", ... (IR printer)
bool is_floating(DType t);
bool is_integral(DType t);  // int32/int64 (not bool)
// The dtype arithmetic runs in: float16/bfloat16 -> float32, everything else itself.
inline DType compute_dtype(DType t) {
  return (t == DType::Float16 || t == DType::BFloat16) ? DType::Float32 : t;
}
// PyTorch promotion of two tensor dtypes (bool < int < float; float16 + bfloat16 -> float32).
DType promote(DType a, DType b);
// Promotion of a tensor dtype with a weakly typed C++ scalar: the tensor keeps its dtype unless
// the scalar is of a higher category (an int tensor times 0.5 becomes float32).
DType promote_scalar(DType t, double value);

}  // namespace tessera
#pragma GCC visibility pop
