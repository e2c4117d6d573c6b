// How Steps are handed to the native loops (jit_x86.h): which part of a program's domain one loop
// call covers (a run of positions along which every load walks memory evenly), where each call's
// pointers start, and when a launch must fall back to the interpreter. Elementwise Steps, float32
// Reduce programs and float32 GEMM epilogues run through them.
#pragma once
#include <memory>

#include "backends/cpu/common.h"
#include "backends/cpu/jit_x86.h"

namespace tessera::backends::cpu {

constexpr int kMaxLoopPtrs = jit::Loop::kMaxPtrs;

// A program built as a native loop over runs of `run` positions, the domain's last dims, along
// which every load walks memory evenly (dense, constant or strided); `outer` is the domain's other
// dims. `stream`: the same with non-temporal stores, for a single run far larger than the caches.
// A loop given an output view (a domain walked in a permuted order) stores through it
// (out_offset, out_outer_strides, out_stride).
struct NativeLoop {
  std::unique_ptr<jit::Loop> loop, stream;
  int64_t run = 0;
  Shape outer;
  std::vector<int64_t> out_outer_strides;
  int64_t out_offset = 0, out_stride = 1;
  bool masked_last = false;  // a load masked along the last outer dim (each run a call)
  int64_t inner = 0;         // a run over two dims (jit::Spec::inner): run_loop only
  struct Load {
    std::vector<int64_t> outer_strides;
    int64_t first = 0;   // elements from the view's offset to the first one read
    int64_t span = 0;    // elements from the first one read to the last, plus one (0: none)
    bool whole = false;  // dense over the whole domain (may be its own output, position for position)
    int64_t stride = 0;  // elements from one position of the run to the next (jit::Spec::stride)
    std::vector<int64_t> lo, hi;  // a masked view's mask over the outer dims (empty: none)
    std::vector<float> pad;       // and what its masked runs read
    bool valid(const int64_t* idx) const {
      for (size_t d = 0; d < lo.size(); ++d)
        if (idx[d] < lo[d] || idx[d] >= hi[d]) return false;
      return true;
    }
    // Elements from the load's first one to its run at outer index idx (over NativeLoop::outer).
    int64_t offset(const int64_t* idx) const {
      int64_t o = 0;
      for (size_t d = 0; d < outer_strides.size(); ++d) o += idx[d] * outer_strides[d];
      return o;
    }
  };
  std::vector<Load> loads;  // in loop->loads() order
};

// The native loop of `prog` over domain `dom`, storing `results` (see jit::Spec for `early`),
// when the program is within jit::build's reach and every load is one view that walks the
// domain's last dims evenly; `out`: where the positions' outputs lie (null: densely, in order).
// may_stream: a single run far larger than the caches also gets non-temporal stores. two_dims:
// a run shorter than a vector (2 or 4 positions) may take the next dim in too (jit::Spec::inner),
// for a loop that only run_loop runs (not loop_range). Leaves nl.loop null otherwise.
void build_loop(NativeLoop& nl, const std::vector<Instr>& prog, const Shape& dom, const std::vector<int>& results,
                const std::vector<uint8_t>& early, bool may_stream, const kir::View* out = nullptr, bool two_dims = false);

// A program's loop over positions [start, start + n) of its domain, run piece by run piece, its
// result into out (position start first): a Reduce's values, a GEMM epilogue's block.
void loop_range(const NativeLoop& nl, const std::vector<char*>& base, int64_t start, int64_t n, float* out);
// The same for a loop of several results (a Reduce Step's sums of several values), result r into
// outs[r]; nouts is the loop's result count.
void loop_range(const NativeLoop& nl, const std::vector<char*>& base, int64_t start, int64_t n, float* const* outs,
                size_t nouts);
// `rows` ranges of n positions, the first at `start`, each the next `stride` positions further
// (a GEMM epilogue's tile of rows x n columns, stride = N), results into out (`stride` floats
// per range). One loop call with per-row pointer steps where each range lies inside one run and
// every load moves by the same step from range to range; else one loop_range per range. The
// same positions, the same bits.
void loop_rows(const NativeLoop& nl, const std::vector<char*>& base, int64_t start, int64_t n, int64_t rows, int64_t stride,
               float* out);
// The same for a loop of several results (a Reduce Step's column sums of several values over a
// tile of rows), result r into outs[r] (`stride` floats per range each); nouts is the loop's
// result count.
void loop_rows(const NativeLoop& nl, const std::vector<char*>& base, int64_t start, int64_t n, int64_t rows, int64_t stride,
               float* const* outs, size_t nouts);
// loop_rows calls that ran a tile as one loop call, on this thread (tests: that a tile took it).
uint64_t loop_rows_tile_calls();

// The first element of each of the loop's loads (at its view's offset).
void load_bases(const jit::Loop& loop, const std::vector<Instr>& prog, const std::vector<const void*>& in,
                std::vector<char*>& base);

// The loop to run this launch of Step st with (its program as built: prog) and its pointers at
// position 0 (loads, then outputs), or null: when an output overlaps an input other than as the
// same slot read position for position (what early stores assume), or in any way the loop does
// not store in order.
const jit::Loop* loop_for(const NativeLoop& nl, const std::vector<Instr>& prog, const Step& st,
                          const std::vector<const void*>& in, const LaunchArgs& args, std::vector<char*>& base);

// An Elementwise Step of `total` positions through its native loop (from loop_for).
void run_loop(const NativeLoop& nl, const jit::Loop& loop, const std::vector<char*>& base, int64_t total);

// Elementwise Step launches that ran through their native loop in this process (tests: that a
// Step took it).
uint64_t elementwise_loop_launches();
// Parts of Steps of parts (Step::parts) that ran in their Step's one task grid, in this process
// (tests: that a Step's parts took it).
uint64_t parts_in_grid();

}  // namespace tessera::backends::cpu
