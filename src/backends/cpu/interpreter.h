// The CPU backend's interpreter: a Step's program evaluated over a tile of its domain (up to
// kTile positions, or whole rows), one instruction at a time across the tile, each value in a
// register of the tile's length (in memory). Every Step kind with a program runs through it where
// the native loops (native_loops.h) do not.
#pragma once
#include "backends/cpu/common.h"

namespace tessera::backends::cpu {

constexpr int64_t kRowConstMin = 32;  // Row Steps with rows this long keep row-constant values once per row

// out[i] = a[i] op b[i] over n lanes, for one op and dtype; a scalar operand (sa, sb) is its lane 0.
using BinaryFn = void (*)(const void* a, const void* b, bool sa, bool sb, void* out, int64_t n);

// How a Load reads its input: a dense run of the compute type in place, through one strided
// view (load_strided), or per element through a stack of views.
enum LoadPath : uint8_t { kInPlace, kStrided, kStacked };

// How a program uses registers, planned once per Step when it is compiled: an instruction's
// register is reused once its last reader has run (reg_alloc.h), so a long program's live values
// stay within L1; a Const read only by binary ops and where's value operands is a scalar (one
// lane, never filled). An instruction never writes a register one of its operands is in.
struct RegPlan {
  std::vector<int> reg;          // per instruction (-1: a scalar constant)
  std::vector<uint8_t> scalar;   // per instruction: a scalar constant
  int nregs = 0;
  std::vector<uint8_t> load;     // per instruction: how a Load reads (LoadPath), fixed per Step
  // Row Steps (empty otherwise): per instruction, whether its value is constant along each row;
  // such values are computed and kept once per row (lane r: the tile's row r), see
  // plan_row_constants. Registers spare .. spare + 2 (counted in nregs) spell them out for
  // per-position readers.
  std::vector<uint8_t> rowc;
  int spare = -1;
  // Resolved once per Step, so a tile's instruction dispatch is one indirect call: each binary
  // instruction's loop for its op and dtype, and each scalar constant's value in its compute type.
  std::vector<BinaryFn> binary;
  std::vector<double> cval;
};

// `keep`: instructions whose values are read after the program (results).
RegPlan plan_registers(const std::vector<Instr>& prog, const std::vector<int>& keep);
// The results a Step's program leaves in registers: its further outputs' and its own (last).
std::vector<int> results_of(const Step& st);
std::vector<uint8_t> load_paths(const std::vector<Instr>& prog);
// A Row Step's values constant along each row (RegPlan::rowc, spare) when its rows are long.
void plan_row_constants(RegPlan& rp, const Step& st);

// Per-thread registers and offset buffers for a tile.
struct Scratch {
  std::vector<double, LineAligned<double>> regs;  // `lanes` 8-byte lanes per register
  std::vector<double> consts;  // one 8-byte lane per instruction: scalar constants
  // Where each instruction's values are: its register, or for a load of a dense run of the
  // same type, the source memory itself (no copy).
  std::vector<const void*> at;
  int64_t lanes = kTile;
  std::vector<int64_t> off;
  std::vector<uint8_t> valid;
};
// This thread's registers of `lanes` elements (Row Steps hold whole rows, so more) for a program
// of ninstr instructions using nregs registers.
Scratch& scratch(size_t ninstr, size_t nregs, int64_t lanes = kTile);

template <class T> T* reg(Scratch& sc, int i) { return reinterpret_cast<T*>(sc.regs.data() + size_t(i) * size_t(sc.lanes)); }
// The values of instruction i (after run_program).
template <class T> const T* val(const Scratch& sc, int i) { return static_cast<const T*>(sc.at[size_t(i)]); }

// Evaluates `prog` for domain positions [start, start + n) (n <= kTile); results in registers.
// Row Steps pass `row`: then start and n are multiples of it and RowSum/RowMax reduce each run.
// `direct` (optional, per instruction): an output whose element `start` instruction k writes
// instead of its register (the output itself: no copy out of a register).
void run_program(const std::vector<Instr>& prog, const RegPlan& rp, const std::vector<const void*>& in,
                 const Shape& domain, int64_t start, int64_t n, const LaunchArgs& args, Scratch& sc, int64_t row = 0,
                 char* const* direct = nullptr);

// Stores the values of instruction r (of dtype t) into out[start, start + n), or, given `view` (a
// domain walked in a permuted order), at the view's offsets of those positions, run by run along
// its last dimension.
void store_reg(DType t, int r, void* out, int64_t start, int64_t n, Scratch& sc, const kir::View* view = nullptr);
// Stores the Step's result (the last instruction's values).
inline void store_tile(const Step& st, void* out, int64_t start, int64_t n, Scratch& sc) {
  store_reg(st.dtype, int(st.program.size()) - 1, out, start, n, sc);
}

// dst[r * row + j] = src[r] for rows r < rows (dst may be src: rows are filled from the last one
// down, so each row's value is read before its lanes are written).
template <class T>
void expand_rows(T* dst, const T* src, int64_t rows, int64_t row) {
  for (int64_t r = rows - 1; r >= 0; --r) std::fill_n(dst + r * row, row, T(src[r]));
}

}  // namespace tessera::backends::cpu
