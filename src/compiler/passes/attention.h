// The "attention" pass (decided while lowering): finds the traced attention pattern
//   P = softmax(where(mask, -inf, Q K^T * scale), last axis);  Y = P V
// (matmul, an optional multiply by a constant, an optional causal mask, the softmax's
// reduce_max / sub / exp / reduce_sum / div, matmul) whose intermediate values nothing else reads,
// so the lowering emits one StepKind::Attention for it (only for a Target declaring `attention`,
// and only over at least kAttentionMinKeys keys: fuse.h). Under bfloat16 autocast the products'
// operands are casts to bfloat16 (P's too) and their results float32: that form is matched for a
// Target declaring `attention_bf16`.
#pragma once
#include <cstdint>
#include <vector>

#include "ir/graph.h"

namespace tessera::compiler {

struct AttentionMatch {
  int root = -1;          // the P @ V matmul: its value is the Step's output
  int q = -1, kt = -1;    // the scores matmul's operands: Q [..., Tq, D] and K^T [..., D, Tk]
  int v = -1;             // V [..., Tk, Dv]
  double scale = 1;
  bool causal = false;
  int64_t causal_offset = 0;       // key j masked for query i where j - i > causal_offset
  std::vector<int> absorbed;       // forward nodes computed only for it (never lowered on their own), sorted
  // Its backward, when the graph holds it (else -1): the cotangent dY of the output, and the
  // gradient nodes dV [..., Tk, Dv], dK^T [..., D, Tk] and dQ [..., Tq, D] the backward Step writes.
  int g_dy = -1, g_dv = -1, g_dkt = -1, g_dq = -1;
  std::vector<int> absorbed_backward;  // the backward's nodes only it computes, sorted
  // g_dkt holds dK [..., Tk, D] = dS^T Q rather than dK^T (autocast's backward, where simplify
  // moved the transpose into the product): written through its map transposed.
  bool dk_rows = false;
  // bfloat16 autocast's form (kir::Step::Attention::bf16): float32 products of bfloat16 operands
  // q, kt, v (nodes of dtype bf16, usually casts), P rounded to bfloat16 for P V, and in the
  // backward dY bfloat16, dP = dY V^T rounded to bfloat16 and back before the softmax's backward,
  // dS rounded to bfloat16 before its products. The products and the softmax are float32.
  bool bf16 = false;
  bool has_backward() const { return g_dq >= 0; }
};

// Every match in g (float32 and float64; with bf16, bfloat16 autocast's form too).
std::vector<AttentionMatch> find_attention(const ir::Graph& g, bool bf16 = false);

}  // namespace tessera::compiler
