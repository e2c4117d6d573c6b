// Row Steps (softmax, layer norm and their backwards) through the native loops (jit_x86.h). The
// program is split at its row reductions (RowSum, RowMax): per row, each reduction's operand is
// computed by a native loop into a row buffer (or read in place when it is a dense float32 load)
// and reduced in C++ by the interpreter's own run_sum / run_max (same order, so the same bits);
// a later loop reads each reduction's value as a broadcast load. The last loop computes the
// Step's results, storing per-position ones in place and per-row ones (further outputs, a
// per-row main result) through a row buffer. Float32 values one part computes and a later one
// reads (a softmax's exp) are stored in a row buffer and read back (comparisons are recomputed). A Step any part of which the loops do
// not build (casts other than a final rounding or a load's round trip, log, iota, masked or stacked loads, 16-bit values, int64 values other than
// compared ones within int32's range) stays with the interpreter.
#pragma once
#include <memory>

#include "backends/cpu/common.h"
#include "backends/cpu/jit_x86.h"

namespace tessera::backends::cpu {

// One part of the program: a loop (null: the reduction reads load `in_place` of the Step's
// program in place) whose pointers come from `srcs` in its loads() order (>= 0: the Step's load
// instruction of that index; < 0: reduction -1 - s's value; from 1 << 24: a stored value's row
// buffer), then its results.
struct RowPart {
  std::unique_ptr<jit::Loop> loop;
  std::vector<Instr> prog;  // the loop's program
  std::vector<int> srcs;
  std::vector<int> stores;  // after its results: the row buffers it stores values into, for later parts
  int in_place = -1;
  bool max = false;  // the reduction: RowMax, else RowSum (the last part reduces nothing)
};

struct RowLoops {
  Shape outer;    // the domain's dims before the row
  int64_t row = 0;
  std::vector<RowPart> parts;  // one per reduction, in program order, then the results' part
  // The last part's results: per result, a reduction's value (>= 0) or the loop's next result (-1).
  std::vector<int> result_red;
  // Per load instruction of the Step's program: its outer dims' strides (elements).
  std::vector<std::vector<int64_t>> outer_strides;
  // Per instruction: an int64 load or constant run as int32 lanes (only compared by ==, <, >: 1),
  // a bool load (a mask) read as int32 lanes of 0/1 compared > 0 (2).
  std::vector<uint8_t> wide;
  int nstash = 0;       // row buffers of values computed by one part and read by a later one
  bool narrow = false;  // the main result: the last part's float32 value rounded to the Step's 16-bit dtype
  // Float32 loads rounded to bfloat16 (else float16) and back: the load instruction, its
  // elements between a row's positions.
  struct Round {
    int load = -1;
    bool bf16 = true;
    int64_t per = 1;
  };
  std::vector<Round> rounds;
};

// The Step's row loops, or null when the interpreter runs it.
std::unique_ptr<RowLoops> build_row_loops(const Step& st);

// Runs the Step; false (nothing written) when this launch must use the interpreter (an output
// overlapping an input).
bool run_row_loops(const RowLoops& rl, const Step& st, const LaunchArgs& args);

// Row Step launches the loops have run in this process (tests: that a Step took them).
uint64_t row_loop_launches();
// Calls of the parts' native loops (each over a run of rows) in this process.
uint64_t row_loop_calls();
// Rows shorter than 8 whose reductions ran 8 rows at a time, a row per lane (per reduction).
uint64_t row_loop_lane_rows();

}  // namespace tessera::backends::cpu
