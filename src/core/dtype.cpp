#include "tessera/dtype.h"

#include <cmath>

namespace tessera {

size_t itemsize(DType t) {
  switch (t) {
    case DType::Bool: return 1;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
    case DType::Float16: return 2;
    case DType::BFloat16: return 2;
    case DType::Float32: return 4;
    case DType::Float64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::Bool: return "bool";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
  }
  return "?";
}

const char* dtype_short(DType t) {
  switch (t) {
    case DType::Bool: return "pred";
    case DType::Int32: return "s32";
    case DType::Int64: return "s64";
    case DType::Float16: return "f16";
    case DType::BFloat16: return "bf16";
    case DType::Float32: return "f32";
    case DType::Float64: return "f64";
  }
  return "?";
}

bool is_floating(DType t) {
  return t == DType::Float16 || t == DType::BFloat16 || t == DType::Float32 || t == DType::Float64;
}
bool is_integral(DType t) { return t == DType::Int32 || t == DType::Int64; }

static int category(DType t) { return t == DType::Bool ? 0 : is_integral(t) ? 1 : 2; }

DType promote(DType a, DType b) {
  if (a == b) return a;
  int ca = category(a), cb = category(b);
  if (ca != cb) return ca > cb ? a : b;
  if (ca == 2) {
    if ((a == DType::Float16 && b == DType::BFloat16) || (a == DType::BFloat16 && b == DType::Float16))
      return DType::Float32;
  }
  return itemsize(a) >= itemsize(b) ? a : b;
}

DType promote_scalar(DType t, double value) {
  bool integral_value = std::isfinite(value) && std::floor(value) == value;
  int cs = integral_value ? 1 : 2;
  if (category(t) >= cs) return t;
  return cs == 2 ? DType::Float32 : DType::Int64;
}

}  // namespace tessera
