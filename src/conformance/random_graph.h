// The compiler's random graphs, shared by its property test (tests/unit/test_fusion_property.cpp:
// passes on vs off) and the conformance suite (a fixed set of them on every backend).
//
// Graph i is drawn from std::mt19937(kRandomGraphSeed + i). Each starts from 1-3
// realized inputs (rank 1-3, extents 1-4, float32 or, one graph in five, float64; values in
// [-2, 2] with exact 0, -0 and 1 mixed in), then applies 3-12 ops, each reading random earlier
// values and drawn with these weights:
//
//   weight  kind           ops
//   ------  -------------  -----------------------------------------------------------------
//     16    unary          neg abs exp tanh sqrt sign floor sin relu square
//     18    binary         add sub mul div maximum minimum; second operand broadcast against
//                          the first (an earlier value if compatible, else a new input or full
//                          of a broadcastable shape)
//     10    scalar         x+s x-s x*s x/s s-x with s in {0, -0, 1, 2, 0.5, -1} (identities)
//      8    compare/where  lt gt le eq -> where(cond, a, b) with broadcasts, or cast to float
//     10    reduce         sum / max over a random non-empty set of axes, keepdim random
//     22    movement       reshape (random factorization), permute, transpose, expand
//                          (unit dims, or a new leading one), slice (random start/stop/step),
//                          pad (lo/hi 0-2, value 0/1/-1.5), concat (with itself or a new input)
//      6    constants      full of the value's shape (0, 1, -0, 2) combined with it, movement
//                          of a full, full op full
//      4    cast           to float64 and back, to float16 and back, bool -> float
//      3    matmul         [.., M, K] x new input [K, N]
//      5    scoped copy    the previous op traced again in another Scope, added to its first
//                          result (cse merges the two)
//
// Outputs: the last value and up to two other random values.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "ir/node.h"
#include "tessera/tensor.h"

namespace tessera::conformance {

constexpr uint32_t kRandomGraphSeed = 20240611;

// Makes a realized input tensor holding `values` (the default: from_vector on the device).
using LeafMaker = std::function<Tensor(const std::vector<double>& values, const Shape& s, DType t)>;

// The output nodes of random graph i, traced on `device`; its inputs are made by `leaf`.
std::vector<ir::NodePtr> random_graph(int i, const Device& device, const LeafMaker& leaf = nullptr);

// Random training graphs, for the memory budget's property test: a small MLP traced with its
// backward pass, where activations (not parameters) make the natural figure. Graph i is drawn from
// std::mt19937(kRandomTrainingGraphSeed + i): a float32 input of [B, d] or [B, T, d] (B in 32-256,
// T in 2-8, d in 2-16), 1-3 layers each a matmul by a [d, out] weight (out in 4-48), maybe a bias,
// one of relu tanh gelu sigmoid silu square, maybe layer_norm, maybe dropout(0.1) by rand_like,
// maybe a residual where the widths agree; a head of 2-64 classes; the loss cross_entropy over
// integer targets or mse_loss against float ones; then backward().
// Outputs: the loss, then every parameter's gradient.
constexpr uint32_t kRandomTrainingGraphSeed = 20261206;
std::vector<ir::NodePtr> random_training_graph(int i, const Device& device);

}  // namespace tessera::conformance
