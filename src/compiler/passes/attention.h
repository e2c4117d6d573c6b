// The "attention" pass (decided while lowering): finds the traced attention pattern
//   P = softmax(where(mask, -inf, Q K^T * scale), last axis);  Y = P V
// (matmul, an optional multiply by a constant, an optional causal mask, the softmax's
// reduce_max / sub / exp / reduce_sum / div, matmul) whose intermediate values nothing else reads,
// so the lowering emits one StepKind::Attention for it (only for a Target declaring `attention`,
// and only over at least kAttentionMinKeys keys: fuse.h).
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
  bool has_backward() const { return g_dq >= 0; }
};

// Every match in g (float32 and float64 only).
std::vector<AttentionMatch> find_attention(const ir::Graph& g);

}  // namespace tessera::compiler
