// Fusion (the "fuse" pass): while lowering, elementwise nodes, the index maps that read them and
// reductions over trailing axes stay pending expressions (Frags) instead of becoming Steps; the
// consumer pastes them into its own program. This header holds the expression type and the
// policy: when a pending expression may be duplicated into several consumers, how large it may
// grow, and which rows a Row Step may reduce.
#pragma once
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "kernel_ir/step.h"

namespace tessera::compiler {

// An expression being fused: instructions over row-major positions of some domain, with
// common subexpressions merged as they are added. Load instructions name buffer slots directly
// in `input`; they become Step input numbers when the expression is emitted as a Step.
struct Frag {
  std::vector<kir::Instr> ins;

  // Appends an instruction (operands a/b/c index ins), or returns an equal one's index.
  int add(const kir::Instr& in);
  // Appends all of other's instructions (deduplicated) and returns the index of its result.
  int paste(const Frag& other);
  // A copy with `edit` applied to every instruction (e.g. to move its loads' maps).
  Frag rebuilt(const std::function<void(kir::Instr&)>& edit) const;
  // Rough cost of recomputing it: non-load instructions, reductions counted heavier.
  int weight() const;
  bool has(kir::Code c) const;

 private:
  std::unordered_multimap<size_t, int> seen_;
};

// Whether two instructions compute the same value (same operands, attributes and map).
bool same_instr(const kir::Instr& x, const kir::Instr& y);

// Policy.
constexpr size_t kMaxFragInstrs = 96;   // larger expressions are cut: their operands become Steps
constexpr int kMaxDuplicateWeight = 12; // a pending expression read by several nodes is
                                        // recomputed in each when at most this heavy
// A pending sum (loads, adds and subtractions only) read by several nodes is stored once when it
// adds more than this many distinct full-size buffers (one element per position or more): the
// GPT's residual stream, a sum of products and biases, read by a layer norm's forward, its
// backward, its weight gradient and the next residual add. Measured on bench_gpt_step (float32,
// 2 threads, captured, fast state; the Steps other than products, per-Step medians summed):
// never stored 7.9-8.4 ms, more than 3 inputs 7.8-8.3, more than 2 7.6-7.7, more than 1 7.4
// (docs/architecture.md, "The residual stream stored once").
constexpr int kMaxSummedInputs = 1;
constexpr int64_t kMaxRow = 1 << 14;    // longest row a Row Step reduces (else a Reduce Step)
constexpr int kExpandRecomputeWeight = 2;  // heavier expressions are stored before a broadcast
// The attention pass fuses only attention over at least this many keys: below it the cpu's fused
// Step measured slower than the decomposition (bench_attention, 1 thread: T = 16 1.87x, 32
// 1.33-1.44x, 48 1.07x, 64 0.94-1.03x, 128 0.80x, 1024 0.39-0.51x; docs/architecture.md).
constexpr int64_t kAttentionMinKeys = 64;
// With its backward (training): forward and backward fuse together or not at all, from this many
// keys (bench_attention --backward with the 8-row-block backward, 1 thread: T = 64 1.14-1.22x
// (d 32) and 1.20x (d 64), T = 128 0.88-0.90x, 256-1024 0.42-0.81x, so 128 while the fused pair's
// results were dense; since its Steps write them in place (Step::out_maps: no add assembling the
// qkv gradient, no permute copies) the benchmark GPT's training step fused at 64 keys measures
// faster than its decomposition, per layer 1.12 vs 1.23 ms: docs/architecture.md "Fused
// attention").
constexpr int64_t kAttentionMinKeysWithBackward = 64;

}  // namespace tessera::compiler
