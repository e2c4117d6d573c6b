// The lowering's state, shared by its files (internal to the compiler): lower.cpp lowers every
// node but convolutions, lower_conv.cpp lowers those. lower() (lower.h) is the entry point.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <unordered_map>
#include <vector>

#include "compiler/lower.h"
#include "compiler/passes/attention.h"
#include "compiler/passes/fuse.h"

namespace tessera::compiler::lowering {

// How a node's value is reached while lowering.
struct Val {
  enum Kind { None, Slot, Const, Expr } kind = None;
  int slot = -1;
  kir::IndexMap map;  // Slot: node index -> element of the slot's buffer
  double value = 0;   // Const: the value; Slot: what masked positions of `map` read
  // Expr (a pending fused expression, result last): evaluated over the positions of `eval`,
  // which is the node's shape unless `rowconst`: then the node's shape is `eval` with the row
  // dimensions at 1, and the expression is constant along each row of `row` positions.
  Frag frag;
  Shape eval;
  int64_t row = 0;          // run length of the RowSum/RowMax inside (0: none)
  bool rowconst = false;
  bool positional = false;  // holds Iota or Rng: valid over its own positions only
  std::vector<int> nodes;   // graph nodes it computes (Step sources and cost)
};

class Lowerer {
 public:
  Lowerer(const ir::Graph& graph, const std::vector<ir::NodePtr>& params, const Options& opts);
  // Lowers every node in order, then gives each graph output its slot.
  Plan run();
  // Stores node i's value as soon as it is lowered (never fused into a later consumer).
  void store(int i) { store_early[size_t(i)] = 1; }

 private:
  const ir::Graph& g;
  const bool fuse;  // the "fuse" switch: pending expressions are pasted into their consumers
  // The "saved" switch: values saved for a custom VJP's backward (ir/saved.h) are stored where
  // computed; off, they fuse into their readers like any other expression.
  const bool store_saved;
  const bool gemm_out_strides;  // Target::gemm_out_strides
  const bool gemm_out_offset;   // Target::gemm_out_offset (with gemm_out_strides)
  const bool place;             // the "place" switch: products written into their concatenation's slot
  const bool attention_out_maps;  // Target::attention_out_maps (with gemm_out_offset)
  Plan plan;
  std::vector<Val> vals;
  std::vector<int> param_slot;
  std::unordered_map<const ir::Node*, int> param_of;  // leaf -> parameter number
  std::map<int, int> output_of_node;  // node index -> output number (first)
  std::vector<int> users;             // distinct consumer nodes (+1 per output request)
  // Expressions stored as soon as they are lowered: read by a BLAS or indexing Step (which
  // stores its operands) through reshapes and permutes, and by other nodes too, which then read
  // the stored values instead of recomputing them.
  std::vector<uint8_t> store_early;
  // The "attention" pass (a Target declaring Target::attention): each match's root lowers to
  // one Attention Step; the nodes it absorbed are never lowered (nothing else reads them).
  std::vector<AttentionMatch> attn;
  std::vector<int> attn_at;         // node -> index into attn (its root), or -1
  std::vector<int> attn_bwd_at;     // node -> index into attn (one of its gradients dV, dK^T, dQ), or -1
  std::vector<int> attn_lse;        // per match with a backward: the forward's log-sum-exp slot
  std::map<int, Val> attn_bwd_vals; // gradient nodes already written by their backward Step
  // Per match: the concatenation its three gradients alone make (each read only there, through
  // reshapes and permutes: the qkv gradient after the place pass), which its backward Step writes
  // in place through Step::out_maps; -1: none (the gradients dense in slots of their own).
  std::vector<int> attn_concat;
  std::map<int, int> placed_concat;  // such a concatenation -> the slot its backward Step wrote
  std::vector<uint8_t> absorbed;
  // Slots of products written in a permuted reader's layout: the permutation (the slot's
  // dimension j holds the product's dimension perm[j]).
  std::map<int, std::vector<int64_t>> permuted_slot;

  // ---- slots and Steps (lower.cpp) ----
  int new_slot(kir::SlotKind kind, int index, const Shape& s, DType t, kir::Source src = {"parameter", ""});
  // The slot a node's Step writes: its output slot if it is a graph output, else a temp.
  int slot_for(int node);
  kir::Step begin(kir::StepKind kind, int node);
  int input_index(kir::Step& st, int slot);
  // A frag's instructions as a Step's program: loads renumbered to the Step's inputs.
  void set_program(kir::Step& st, const Frag& f);
  // The sources and cost of a Step computing the nodes of an expression.
  void attribute(kir::Step& st, const std::vector<int>& nodes, int self);
  // Appends st and returns its output slot's value over `shape`.
  Val push(kir::Step st, const Shape& shape);

  // ---- values ----
  static Val slot_val(int slot, const Shape& s);
  // A value as a fused expression over its node's shape.
  static Val as_expr(const Val& v, DType t, const Shape& shape);
  // Emits the Step computing a pending expression into the node's slot; the node becomes a slot.
  void materialize(int node);
  // A Copy Step writing node's value densely into a new slot (attributed to `producer`).
  Val copy_to_slot(int node, int producer, kir::SlotKind kind, int index);
  // A Copy Step writing `map` (over slot `src`, masked positions read 0) densely into a temp.
  int copy_map(int src, const kir::IndexMap& map, DType t, int producer);
  // A value as a plain strided view (for BLAS and indexing Steps): stores it when it is not one.
  Val strided(int node, int producer);
  // The value of input node k as a consumer sees it: a pending expression read by several
  // nodes is stored first unless it is cheap enough to recompute in each.
  const Val& operand(int node);
  // For an expression made only of loads, adds and subtractions: how many distinct slots it loads
  // at full size (one element per position or more); else 0.
  int summed_inputs(const Val& v) const;
  // Applies a movement to every load of an expression (positions of the new shape -> old).
  static Val move_expr(const Val& v, const Shape& shape, const std::function<kir::IndexMap(const kir::IndexMap&)>& f);
  // A pending per-position Row expression's row statistics (row-constant values from its row
  // reductions) stored once per row by one Row Step; every pending expression over those rows
  // then loads them (lower_rows.cpp). False when it has none to store.
  bool store_row_stats(int node);
  // Brings operand v (of node shape `s`) to a row-constant expression over `eval`.
  Val to_rowconst(int node, Val v, const Shape& eval, int64_t row);

  // ---- nodes ----
  Val lower_node(int i);
  Val lower_positional(int i);  // iota, rng
  Val lower_movement(int i);
  Val lower_elementwise(int i);
  Val lower_reduce(int i);
  Val lower_concat(int i);
  // A concatenation of products, each read whole in its slot's row-major order: the products
  // write their parts of the concatenation's slot (Step::out_strides, out_offset), no Step
  // concatenates. False (nothing changed) when an operand is not such a product.
  bool place_concat(int i, Val* out);
  Val lower_addressed(int i);  // matmul and the indexing ops: Steps reading plain strided views
  // A batched product whose one reader is a permute of its batch and row dimensions (columns
  // stay last): the permutation, else empty. The product is then written in that layout.
  std::vector<int64_t> permuted_product(int i) const;
  Val lower_collective(int i);
  Val lower_attention(int i, const AttentionMatch& m);
  Val lower_attention_backward(int i, int match);
  Val attention_operand(kir::Step& st, const AttentionMatch& m, int k, int bit, int reader);
  // The concatenation that gradient node x alone reaches through reshapes and permutes each read
  // once (none an output), or -1.
  int concat_of_gradient(int x, const std::vector<int>& sole_reader) const;
  // Outputs whose value is a view, a constant or a parameter get a Copy Step into their slot.
  void copy_out(int node, int out);

  // ---- convolutions (lower_conv.cpp) ----
  Val lower_conv(int i);
  // The conv's input as the window reads it: dilated and padded (stored densely when that grows
  // it), or cropped through a view. Returns the slot; `map` is its view over the padded extent.
  int conv_input(int i, kir::IndexMap& map);
};

}  // namespace tessera::compiler::lowering
