// Native loops for float32 elementwise programs, emitted as x86-64 AVX machine code at compile
// time (no compiler at run time). The interpreter (cpu_backend.cpp) runs a program one
// instruction at a time over a tile, each value through a register in memory; a loop built here
// keeps every value of eight positions in vector registers and runs the whole program per eight,
// so a fused chain costs what its loads and stores cost. Results are bit-identical to the
// interpreter's: the same IEEE operations in the same order, with its NaN and signed-zero rules.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "kernel_ir/step.h"

namespace tessera::backends::jit {

// fn(ptrs, bytes) evaluates the program at `bytes / 4` consecutive positions (bytes: a positive
// multiple of 32). ptrs: for each load in `loads` order, the input at the first position; then
// for each result, the output at the first position (32-byte aligned when built with stream).
class Loop {
 public:
  ~Loop();
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;
  void operator()(const void* const* ptrs, int64_t bytes) const { fn_(ptrs, bytes); }
  const std::vector<int>& loads() const { return loads_; }  // instruction indices of the program's loads
  bool streams() const { return stream_; }

 private:
  friend std::unique_ptr<Loop> build(const std::vector<kir::Instr>&, const std::vector<int>&, bool);
  Loop() = default;
  void (*fn_)(const void* const*, int64_t) = nullptr;
  void* code_ = nullptr;
  size_t code_bytes_ = 0;
  std::vector<int> loads_;
  bool stream_ = false;
};

// Whether this machine runs the loops (x86-64 with AVX; TESSERA_CPU_JIT=0 turns them off).
bool available();

// The loop for `prog` storing `results` (instruction indices, in output order; non-temporal
// stores when `stream`), or null when the program is outside what is built here: only float32
// loads (each a dense run: the caller checks), scalar constants, neg, abs, sqrt, floor, ceil,
// round, add, sub, mul, div, max and min, at most 13 pointers and 16 vector registers.
std::unique_ptr<Loop> build(const std::vector<kir::Instr>& prog, const std::vector<int>& results, bool stream);

}  // namespace tessera::backends::jit
