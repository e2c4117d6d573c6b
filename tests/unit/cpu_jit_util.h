// Helpers of the cpu backend's native-loop tests (test_cpu_jit, test_cpu_jit_rows): special float
// values, bit equality, Kernel-IR instructions, and whether the loops are on here.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "backends/cpu/jit_x86.h"
#include "kernel_ir/step.h"

namespace cpu_jit_test {

using tessera::kir::Code;
using tessera::kir::Instr;
using tessera::DType;

// float32 values with every special case the ops treat differently, then ordinary ones.
inline std::vector<float> special_values(int64_t n) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, -0.5f, 1.5f, -1.5f, 2.5f, -2.5f, inf, -inf, nan, -nan,
                          1e-40f, -1e-40f, 3.4e38f, -3.4e38f, 0.125f, 7.0f,
                          1.00390625f, 1.01171875f, -1.00390625f};  // bfloat16 ties: to even (1), up, to even
  uint32_t s = 12345;
  while (int64_t(v.size()) < n) {
    s = s * 1664525u + 1013904223u;
    v.push_back(float(int32_t(s >> 8) % 20000) / 997.0f - 10.0f);
  }
  v.resize(size_t(n));
  return v;
}

// Equal bits, or both NaN (which NaN an IEEE op returns for two NaN operands is the hardware's
// choice of operand order, not something the program fixes).
inline bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

inline Instr instr(Code c) {
  Instr I;
  I.code = c, I.dtype = DType::Float32;
  return I;
}
inline Instr load(int input) {
  Instr I = instr(Code::Load);
  I.input = input;
  return I;
}
inline Instr cnst(double v) {
  Instr I = instr(Code::Const);
  I.value = v;
  return I;
}
inline Instr op(Code c, int a, int b = -1) {
  Instr I = instr(c);
  I.a = a, I.b = b;
  return I;
}

// Why the native loops are off here, or null when they are on: only a CPU without AVX2 or
// TESSERA_CPU_JIT=0 (ctest's test_cpu_jit_interpreter) may turn them off.
inline const char* loops_off() {
  if (tessera::backends::jit::available()) return nullptr;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2")) return "this CPU has no AVX2: no native loops";
  const char* e = std::getenv("TESSERA_CPU_JIT");
  if (e && std::string(e) == "0") return "TESSERA_CPU_JIT=0: the interpreter only";
  return "";  // a CPU with AVX2 whose loops are off: a failure
}

}  // namespace cpu_jit_test

// Skips a test that needs the native loops where they are off for a reason, fails it otherwise.
#define REQUIRE_LOOPS()                                                             \
  do {                                                                              \
    if (const char* why = cpu_jit_test::loops_off()) {                                            \
      if (!*why) FAIL() << "this CPU has AVX2 but jit::available() says no loops";  \
      GTEST_SKIP() << why;                                                          \
    }                                                                               \
  } while (0)

