// What the compiler plans for: the properties of a device that change a plan. Backends report
// them (Backend::properties); the null backend can pose as any target (backends::null_device_for),
// so the advisor plans for devices that are not here with the same pipeline
// (compiler/passes/target.cpp applies everything but the alignment, which the memory plan uses).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "tessera/dtype.h"
#include "tessera/shape.h"

#pragma GCC visibility push(default)  // the backend SDK: exported for plugins
namespace tessera::kir {

struct Target {
  // Bytes; every arena temporary starts at a multiple of it (a power-of-two multiple of 64).
  // CUDA allocations are 256-byte aligned.
  size_t alignment = 64;
  // Dtypes the device computes; empty = all. A plan with a buffer or an instruction of another
  // dtype is refused, naming the op (a TPU has no float64).
  std::vector<DType> compute_dtypes;
  // Tiled buffer layout (a TPU's): the last dimension of every buffer is padded to a multiple of
  // tile_cols and the one before it to tile_rows x (4 / itemsize) for items narrower than 4 bytes
  // (two bfloat16 rows share a 32-bit row); rank <= 1 buffers to a multiple of the whole tile.
  // 1 x 1 = untiled. Step bytes grow with their buffers.
  int64_t tile_rows = 1, tile_cols = 1;
  // float32 values are stored, moved and matrix-multiplied as this dtype (the advisor's
  // --dtype bfloat16: pure bfloat16 training). Unset: as traced.
  std::optional<DType> float32_as;
  // The device runs StepKind::Collective Steps (through the current communicator,
  // backends/collective.h) and takes launches from several in-process rank threads at once
  // (runtime::realize_spmd); a plan with a collective for a device that does not is refused,
  // naming the collective.
  bool collectives = false;
  // The device runs Gemm Steps with Step::accumulate (the product added into the output slot's
  // contents). The memory budget's in-place accumulation uses it (compiler/passes/accumulate.cpp).
  bool gemm_accumulate = false;
  // The device runs StepKind::Attention Steps (Step::attention). The lowering fuses the traced
  // attention pattern into one only for such a device; others get the decomposition.
  bool attention = false;
  // The device runs Gemm Steps with Step::out_strides (the product written through strides,
  // columns contiguous). The lowering writes a product read only through a permute of its batch
  // and row dimensions in the permuted layout for such a device; others get the product dense and
  // a copy for the permute where a reshape follows.
  bool gemm_out_strides = false;
  // With gemm_out_strides: the device's Gemm Steps also honour Step::out_offset, so products
  // concatenated into parts of one slot write there (compiler/passes/place.cpp); others get the
  // sum of pads. Its own flag, so a backend that wrote strides before interface 14 is not handed
  // offsets it would ignore.
  bool gemm_out_offset = false;
  // With attention and gemm_out_offset: the device's attention Steps honour Step::out_maps (the
  // forward's output written in its permuted reader's layout; the backward's dQ, dK^T and dV
  // through strides into parts of one slot, so the qkv gradient is assembled in place around a
  // fused attention too); others get dense results, a copy and the sum of pads.
  bool attention_out_maps = false;
  // With attention and attention_out_maps: the device runs attention Steps of bfloat16 autocast
  // (Step::Attention::bf16: bfloat16 operands or float32 ones rounded as read, float32
  // accumulation and softmax), so the attention pass fuses autocast's decomposition too; others
  // keep that decomposition.
  bool attention_bf16 = false;
  // The device's Gemm Steps read a float32 operand rounded to bfloat16 as they pack it
  // (Step::rounded): compiler/passes/fold_casts.cpp folds autocast's cast Steps into them.
  bool gemm_rounds_operands = false;
  // The device runs Reduce Steps with more_outputs (several sums, or maxima, of one domain over
  // the same axes in one pass): the merge pass joins sibling Reduce Steps for it.
  bool multi_reduce = false;
  // The device runs Elementwise Steps made of parts (Step::parts: independent Elementwise Steps
  // in one launch): compiler/passes/group_updates.cpp joins an optimizer's in-place updates
  // into one for it; others get the parts as separate Steps.
  bool elementwise_parts = false;

  bool computes(DType t) const {
    if (compute_dtypes.empty()) return true;
    for (DType d : compute_dtypes)
      if (d == t) return true;
    return false;
  }
  DType stored(DType t) const { return t == DType::Float32 && float32_as ? *float32_as : t; }
  bool tiled() const { return tile_rows > 1 || tile_cols > 1; }
  // Bytes of a buffer of `shape` and traced dtype `t` on this target.
  size_t buffer_bytes(const Shape& shape, DType t) const {
    const DType s = stored(t);
    const size_t item = itemsize(s);
    if (!tiled()) return size_t(numel(shape)) * item;
    auto up = [](int64_t x, int64_t m) { return m <= 1 ? x : (x + m - 1) / m * m; };
    const int64_t rows = tile_rows * (item < 4 ? int64_t(4 / item) : 1);
    if (shape.size() <= 1) return size_t(up(numel(shape), rows * tile_cols)) * item;
    int64_t n = up(shape.back(), tile_cols) * up(shape[shape.size() - 2], rows);
    for (size_t i = 0; i + 2 < shape.size(); ++i) n *= shape[i];
    return size_t(n) * item;
  }
  bool operator==(const Target&) const = default;
};

}  // namespace tessera::kir
#pragma GCC visibility pop
