// float16 / bfloat16 <-> float32 conversions (round to nearest even), shared by every layer.
#pragma once
#include <cstdint>
#include <cstring>

namespace tessera::half {

inline uint32_t bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline uint16_t float_to_bf16(float f) {
  uint32_t u = bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf16_to_float(uint16_t h) { return from_bits(uint32_t(h) << 16); }
// The bits of bf16_to_float(float_to_bf16(f)) from f's bits, branch-free: loops of it vectorize
// (the cpu backend rounds autocast's operands and gradients so).
inline uint32_t bf16_round_bits(uint32_t u) {
  return ((u & 0x7fffffffu) > 0x7f800000u ? u | 0x400000u : u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
}

inline uint16_t float_to_f16(float f) {
  uint32_t u = bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);         // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);        // overflow -> inf (rounds up)
  if (a < 0x38800000u) {                                        // subnormal or zero in f16
    if (a < 0x33000000u) return uint16_t(sign);                 // below half the smallest subnormal
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - int(a >> 23);                             // 14..24
    uint32_t r = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = ((a - 0x38000000u) >> 13);                       // rebias exponent 127 -> 15
  uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return uint16_t(sign | r);
}
inline float f16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    if (m == 0) return from_bits(sign);
    float f = float(m) * (1.0f / 16777216.0f);  // m * 2^-24
    return sign ? -f : f;
  }
  if (e == 31) return from_bits(sign | 0x7f800000u | (m << 13));
  return from_bits(sign | ((e + 112) << 23) | (m << 13));
}

}  // namespace tessera::half
