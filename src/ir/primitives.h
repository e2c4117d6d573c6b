// The primitive table: every op the IR knows, with its shape/dtype rule, cost rule and whether it
// is differentiable, declared together in primitives.cpp. Everything else is a decomposition.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "tessera/dtype.h"
#include "tessera/shape.h"

#pragma GCC visibility push(default)  // the backend SDK: exported for plugins
namespace tessera::ir {

struct Node;
struct Attrs;

// Attribute layouts (Attrs::ints / Attrs::f) are given per op.
enum class Op : uint8_t {
  Leaf,     // a realized buffer; no inputs
  Full,     // constant; f = value; shape/dtype given
  Iota,     // int64 index along ints[0] of the given shape
  Rng,      // ints = {draw index, distribution (0 uniform [0,1), 1 standard normal)}; float
            // values from the counter-based generator at the graph's runtime (seed, offset)
  Cast,     // to the given dtype
  // unary, same dtype: neg/abs/sign/floor/ceil/round also on integers, the rest floating only
  // (round: half to even, like PyTorch)
  Neg, Exp, Log, Tanh, Abs, Sign, Sqrt, Sin, Cos, Erf, Floor, Ceil, Round,
  Add, Sub, Mul, Div, Maximum, Minimum, Pow,  // binary, equal shapes and dtypes (div, pow: floating)
  Eq, Ne, Lt, Le, Gt, Ge,                    // binary compare -> bool
  Where,    // (bool cond, a, b), equal shapes, a/b equal dtypes
  ReduceSum, ReduceMax,  // ints = sorted axes; reduced axes kept with extent 1
  Reshape,  // to the given shape (same numel)
  Permute,  // ints = permutation
  Expand,   // to the given shape; only extent-1 dims grow
  Slice,    // ints = {start, stop, step} per dim (0 <= start <= stop <= n, step >= 1)
  Pad,      // ints = {lo, hi, interior} per dim (all >= 0); f = pad value
  Concat,   // ints = {axis}; inputs agree except along axis
  Matmul,   // [..., M, K] x [..., K, N] -> [..., M, N]; batch dims equal
  Gather,   // ints = {axis}; (src, int index) -> index shape; out[i] = src[i with i_axis := index[i]]
  ScatterAdd,  // ints = {axis}; (base, int index, src): out = base; out[i with i_axis := index[i]] += src[i]
  DynamicUpdateSlice,  // (base, update, int64 offsets[rank]): base with update written at the
                       // offsets, each clamped to [0, base_d - update_d] (XLA semantics)
  Reverse,  // ints = sorted axes to reverse (out[i] = x[i with i_d := n_d - 1 - i_d])
  Conv,     // (lhs [B, F, X...], rhs [O, F/groups, K...]) -> [B, O, P...] over S >= 1 spatial dims;
            // ints = {groups, then per spatial dim: stride, pad_lo, pad_hi, lhs_dilation,
            // rhs_dilation}. lhs is dilated (lhs_dilation - 1 zeros between elements), then
            // padded (negative padding crops); out[b, o, p] = sum over f, k of
            // lhs'[b, g*F/groups + f, p*stride + k*rhs_dilation] * rhs[o, f, k], g = o / (O/groups)
  // Collectives (docs/architecture.md "Parallelism"): a graph is one rank's program (SPMD), run
  // by `ranks` ranks together; ints[0] = ranks (>= 1), so every shape rule is static. x_s is the
  // input on rank s, y_r the output on rank r.
  AllReduce,      // ints = {ranks, kind: 0 sum, 1 mean, 2 max}; y_r = reduce over s of x_s
  AllGather,      // ints = {ranks, axis}; y_r = concat over s of x_s along axis
  ReduceScatter,  // ints = {ranks, axis}; y_r = block r (along axis) of sum over s of x_s
  AllToAll,       // ints = {ranks, split axis, concat axis}; y_r = concat over s (along the concat
                  // axis) of block r of x_s (split along the split axis)
  Broadcast,      // ints = {ranks, root}; y_r = x_root
  Reduce,         // ints = {ranks, root}; y_root = sum over s of x_s, y_r = 0 elsewhere
  CollectivePermute,  // ints = {ranks, src0, dst0, src1, dst1, ...}: y_dst = x_src per pair;
                      // a rank no pair sends to gets zeros (each rank sends and receives at most once)
  Count_
};
constexpr int kNumOps = static_cast<int>(Op::Count_);

struct TypeShape {
  Shape shape;
  DType dtype;
};
struct Cost {
  double flops = 0;
  double bytes = 0;  // bytes read from inputs plus bytes written
  // Collectives: bytes this rank sends over the interconnect (ring algorithms: an all-reduce
  // sends 2 (N-1)/N of its buffer, an all-gather (N-1)/N of its output, ...).
  double comm_bytes = 0;
};

struct InferArgs {
  const std::vector<std::shared_ptr<const Node>>& inputs;
  const Attrs& attrs;
  const Shape* shape;           // the requested shape, for ops that take one
  std::optional<DType> dtype;   // the requested dtype, for ops that take one
};

enum class Category : uint8_t { Source, Elementwise, Reduce, Movement, Contraction, Indexing, Collective };

// Cotangents of a node's inputs given the cotangent `g` of its output, as new IR (nullptr where
// no gradient flows). `self` is the node itself, so rules can reuse its value.
using VjpRule = std::vector<std::shared_ptr<const Node>> (*)(const Node& n, const std::shared_ptr<const Node>& self,
                                                            const std::shared_ptr<const Node>& g);

struct PrimitiveInfo {
  const char* name;
  int arity;  // number of inputs; -1 = one or more
  Category category;
  bool differentiable;
  TypeShape (*infer)(const InferArgs&);  // throws tessera::Error on bad input
  Cost (*cost)(const Node&);
  VjpRule vjp;  // null for non-differentiable primitives (their inputs get zero gradient)
};

const PrimitiveInfo& info(Op op);
// Replaces a primitive's VJP rule and returns the old one (tests plant wrong rules with it).
VjpRule replace_vjp_for_testing(Op op, VjpRule rule);
inline const char* op_name(Op op) { return info(op).name; }
bool is_compare(Op op);
inline bool is_collective(Op op) { return op >= Op::AllReduce && op <= Op::CollectivePermute; }
// all_reduce's kinds (ints[1]).
enum class ReduceKind : int64_t { Sum = 0, Mean = 1, Max = 2 };
const char* reduce_kind_name(ReduceKind k);

}  // namespace tessera::ir
#pragma GCC visibility pop
