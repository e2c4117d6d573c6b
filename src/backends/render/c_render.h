// The shared C-style renderer: Kernel-IR Steps -> C kernel source for devices that compile
// source (OpenCL C now, CUDA C next). A Step renders to one or more kernels whose text depends
// only on the Step's structure (kind, program, dtypes, ranks, which views are masked); shapes,
// strides, offsets, masks and constants travel in a small int64 parameter buffer, so one
// compiled kernel serves every shape. Dialects differ only in their preamble (types, qualifiers,
// bit casts, atomics) and in how a kernel finds its work-item number.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernel_ir/step.h"

#pragma GCC visibility push(default)  // the backend SDK: exported for plugins
namespace tessera::render {

// Per-dialect hooks. Kernel bodies use only the names the preamble defines: the types
// i8/u8/u16/i32/u32/i64/u64, KERNEL, GLOBAL, FN (helper functions), GID (this work-item's
// linear number, i64), F32_BITS/F64_BITS/BITS_F32 (bit casts), ATOMIC_MIN(p, v) on a GLOBAL int,
// FACC (float accumulator: double where the device has it), HAS_FP64, and RNG_ARGS / RNG_INIT
// (how a kernel receives the random state `seed`, `roff`: OpenCL by value; CUDA by value or,
// when its pointer rng_ptr is not null, from rng_ptr[0] and [1], so that a replayed CUDA graph
// reads each run's).
struct Dialect {
  std::string name;      // "opencl", "cuda"
  std::string preamble;  // prepended once to every program (before the shared helpers)
  std::vector<std::string> options;  // compiler options the kernels assume (none for OpenCL)
  // Work-items per row of a Row Step: 0 = one work-item per row; n > 0 = a group (CUDA block) of
  // up to n work-items per row (a multiple of 32; fewer for a short row: KernelCode::group_size),
  // combining partial results with BLOCK_REDUCE(v, is_max) in a fixed order; the preamble then
  // defines LOCAL_ID, LOCAL_SIZE, GROUP_ID and BLOCK_REDUCE too.
  int row_block = 0;
};
const Dialect& opencl_c();  // OpenCL C 1.2 (cl_khr_fp64 where the device has it)
const Dialect& cuda_c();    // CUDA C++ for NVRTC (no headers); compile with `options`

// Every kernel takes (GLOBAL const i64* P, GLOBAL int* E, RNG_ARGS (OpenCL: i64 seed, i64 offset;
// CUDA: i64 seed, i64 offset, const u64* rng_ptr), then for each
// buffer argument GLOBAL char* b<k>, i64 o<k> (a byte offset)). E[0] is the lowest failing
// position of a bounds-checked kernel (INT_MAX when none).
struct KernelCode {
  std::string name;             // "t" + hash of the source: equal sources, equal names
  std::string source;           // the kernel function alone (see program_source)
  std::vector<int64_t> params;  // the P buffer
  int64_t work_items = 0;       // 1-D global size (before rounding up to a work-group)
  std::vector<int> slots;       // the Step's slots bound to b0, b1, ...
  bool checks_index = false;    // sets E[0] on an out-of-range index (Gather, ScatterAdd)
  bool uses_f64 = false;        // needs a device with float64 (cl_khr_fp64)
  int64_t scratch_bytes = 0;    // bytes of the scratch slot this kernel writes (see kScratchSlot)
  int group_size = 0;           // > 0: launch in groups of exactly this many work-items (a
                                // multiple of 32; work_items is a multiple of it); 0: any size
};

// A slot number standing for a device scratch buffer the backend provides (at least the largest
// scratch_bytes of the Step's kernels), valid from one kernel of a Step to the next.
constexpr int kScratchSlot = -1;

// The kernels that run a Step, in launch order, for dialect d (render(step): one work-item per
// row, as every dialect can run). Throws tessera::Error for Steps it cannot render.
std::vector<KernelCode> render(const kir::Step& step, const Dialect& d);
std::vector<KernelCode> render(const kir::Step& step);

// A whole program: the dialect's preamble, the shared helpers, then the kernels.
std::string program_source(const Dialect& d, const std::vector<const KernelCode*>& kernels);

}  // namespace tessera::render
#pragma GCC visibility pop
