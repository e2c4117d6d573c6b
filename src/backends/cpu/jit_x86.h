// Native loops for float32 elementwise programs, emitted as x86-64 machine code when a Step is
// compiled, through the Xbyak assembler (Debian's libxbyak-dev, header-only; no compiler at run
// time): AVX-512 (16 lanes) where the CPU has it, else AVX2 (8 lanes; see avx512()). The
// interpreter (interpreter.h) runs a program one instruction at a time over a tile, each value
// through a register in memory; a loop built here keeps every value of a vector's positions in
// vector registers and runs the whole program per vector, so a fused chain costs about what its
// loads and stores cost. Results are bit-identical to the interpreter's: the same IEEE operations
// in the same order, with its NaN and signed-zero rules. TESSERA_DUMP=asm writes each loop's code
// and disassembly (loop_dump.h).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "kernel_ir/step.h"

namespace tessera::backends::jit {

// What to build: the program; per instruction, how a Load walks memory along the run -- its
// elements between consecutive positions: 0 (constant: one value broadcast when the run starts),
// 1 (dense: consecutive elements) or more (strided, gathered: a pooling window's tap); the
// results in output order; per result, whether it may be stored as soon as it is computed (no
// later load of the iteration reads its output), else once every load of the iteration has run.
struct Spec {
  const std::vector<kir::Instr>* prog = nullptr;
  std::vector<int64_t> stride;
  std::vector<int> results;
  std::vector<uint8_t> early;
  bool stream = false;  // non-temporal stores (outputs far larger than the caches; aligned to a vector: Loop::lanes)
  int64_t out_stride = 1;  // elements between the results of consecutive positions (more: lane by lane)
  // A run over two dims (a pooling output's rows shorter than a vector): `inner` (2 or 4) positions
  // along the last, then the next row; per instruction, a load's elements from one row to the next
  // (stride2). Position p of the run reads (p % inner) * stride + (p / inner) * stride2; a load
  // with stride2 == inner * stride walks evenly as above, any other is gathered at those offsets.
  // Results are stored densely. 0: a run over one dim.
  int64_t inner = 0;
  std::vector<int64_t> stride2;
};

class Emitter;  // jit_x86.cpp

// loop(ptrs, n, rows, steps) evaluates the program over `rows` runs of n >= 1 consecutive
// positions. ptrs: for each load in `loads` order, its first element (a broadcast load: its
// value); then for each result, its output's first element. steps: per pointer, the bytes it
// moves from one run to the next.
class Loop {
 public:
  static constexpr int kMaxPtrs = 64;
  ~Loop();
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;
  void operator()(const void* const* ptrs, int64_t n, int64_t rows = 1, const int64_t* steps = nullptr) const {
    // The code reads one array: the pointers (moved in place), the row count, the steps.
    const size_t np = loads_.size() + results_;
    int64_t a[2 * kMaxPtrs + 1];
    for (size_t i = 0; i < np; ++i) a[i] = reinterpret_cast<int64_t>(ptrs[i]), a[np + 1 + i] = steps ? steps[i] : 0;
    a[np] = rows;
    fn_(a, n);
  }
  const std::vector<int>& loads() const { return loads_; }  // instruction indices of the program's loads
  bool streams() const { return stream_; }
  // Positions per vector: 8 (AVX2) or 16 (AVX-512). A streaming loop's outputs must be aligned
  // to 4 lanes() bytes (one vector).
  int lanes() const { return lanes_; }
  // Constants read from vector registers loaded once per call rather than from memory per
  // vector: as many as the program's values leave registers free, the most read first.
  int constants_in_registers() const { return hoisted_; }
  // Ops whose value is the same at every position of a row (their operands constants, broadcast
  // loads or such ops), computed once per row rather than once per vector.
  int row_invariants() const { return invariants_; }

 private:
  friend std::unique_ptr<Loop> build(const Spec&);
  Loop() = default;
  void (*fn_)(int64_t*, int64_t) = nullptr;
  std::unique_ptr<Emitter> code_;  // the assembler, which owns the code's pages
  std::vector<int> loads_;
  size_t results_ = 0;
  bool stream_ = false;
  int lanes_ = 8;
  int hoisted_ = 0;
  int invariants_ = 0;
};

// Whether this machine runs the loops (x86-64 Linux with AVX2; TESSERA_CPU_JIT=0 turns them off).
bool available();

// Whether a loop built now is AVX-512 code (16 lanes in zmm registers, tails and comparisons
// under opmask registers): on CPUs with AVX512F and AVX512DQ, unless TESSERA_CPU_JIT=avx2 (read
// at each build) asks for the AVX2 form (8 lanes in ymm registers), which every other x86-64
// CPU with AVX2 runs. Both forms compute the same bits (the same operations per lane).
bool avx512();

// The loop for `spec`, or null when the program is outside what is built here: float32 and int32
// loads and constants; neg, abs, sqrt, floor, ceil, round, add, sub, mul, div, max, min of
// float32; exp and erf of float32 where the build has FMA (vmath.h's, operation for operation);
// casts of float32 to bfloat16 and back (the value kept rounded in float32 lanes; not loaded or
// stored as bfloat16); comparisons (of float32, or ==, <, > of int32) read by where, by each other's max
// (or) and min (and); where of float32 or int32; float32 and int32 results; strides below 2^24;
// within the vector registers (16 ymm for AVX2, 32 zmm for AVX-512).
std::unique_ptr<Loop> build(const Spec& spec);

}  // namespace tessera::backends::jit
