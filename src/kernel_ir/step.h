// Kernel IR: what one Step of an Executable computes. The compiler produces Steps; every backend
// runs them. A Step reads and writes numbered buffer slots; loads go through index maps.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/conv.h"
#include "ir/primitives.h"
#include "kernel_ir/index_map.h"
#include "tessera/dtype.h"

#pragma GCC visibility push(default)  // the backend SDK: exported for plugins
namespace tessera::kir {

// Instructions of an elementwise program, evaluated per element of the program's domain.
enum class Code : uint8_t {
  Load,   // input = index into Step::inputs, map = domain index -> element; value = pad value
  Const,  // value
  Iota,   // int64 index along axis i0 of the domain
  Rng,    // draw i0, distribution i1 (see core/philox.h), at the launch's (seed, offset); element
          // indices start at `value` (a batch slice draws its rows of the whole tensor's numbers)
  Cast,   // a -> dtype
  Neg, Exp, Log, Tanh, Abs, Sign, Sqrt, Sin, Cos, Erf, Floor, Ceil, Round,
  Add, Sub, Mul, Div, Max, Min, Pow,
  Eq, Ne, Lt, Le, Gt, Ge,  // -> bool
  Where,                   // a ? b : c
  RowSum, RowMax,          // Row Steps: a reduced over the row holding this position, at every position of the row
};

struct Instr {
  Code code;
  DType dtype;           // result dtype (computed in compute_dtype(dtype))
  int a = -1, b = -1, c = -1;
  int input = -1;
  IndexMap map;
  double value = 0;
  int64_t i0 = 0, i1 = 0;

  // A Load of `input` through `map` (masked positions read 0).
  static Instr load(int input, DType t, IndexMap map) {
    Instr I;
    I.code = Code::Load, I.dtype = t;
    I.input = input;
    I.map = std::move(map);
    return I;
  }
};

// The most outputs (the main one and more_outputs) of a Reduce Step.
constexpr int kMaxReduceOutputs = 8;

enum class StepKind : uint8_t {
  Elementwise,  // out[i] = program(i) over the output shape
  Copy,         // an elementwise program that only moves data (one load)
  Reduce,       // row kernel: out[o] = reduce over the `axes` of `domain` of program(i); with
                // more_outputs (Target::multi_reduce), each further output the same reduction
                // of its instruction's value (sibling sums over one input in one pass)
  Gemm,         // out = inputs[0] @ inputs[1]; A is a single strided view, B one or a
                // plain reshape over one (a conv's im2col window), which a backend packs or reads in place
  Gather,       // out[i] = src[i with axis := index[i]]   (inputs: src, index)
  ScatterAdd,   // out = base; out[i with axis := index[i]] += src[i]   (inputs: base, index, src)
  DynamicUpdateSlice,  // out = base with update at clamped runtime offsets (inputs: base, update, offsets)
  Row,          // program over `domain` whose RowSum/RowMax reduce each run of `row` consecutive
                // positions; out = the program (shape == domain) or one value per row (the
                // program is constant along rows; numel(shape) == numel(domain) / row)
  Collective,   // a collective (Step::collective) over the ranks of the current communicator:
                // inputs[0] dense row-major, the output dense (backends/collective.h runs it)
  Attention,    // softmax(scale * Q K^T, masked) V without the scores in memory (Step::attention);
                // only for a device that declares Target::attention
};
const char* step_kind_name(StepKind k);

// Where a Step came from: the IR nodes it computes (op name and scope), for errors and profiles.
struct Source {
  std::string op;
  std::string scope;
  double flops = 0;  // the node's flops by its cost rule; a Step's sources sum to its cost.flops
};

struct Step {
  StepKind kind;
  Shape shape;   // of the output
  DType dtype;   // of the output
  std::vector<int> inputs;  // slots read
  int output = -1;          // slot written (contiguous, row-major)
  // Elementwise/Copy (domain = shape), Reduce and Row (domain = `domain`); Gemm: an epilogue
  // over the product's positions, whose loads of the output slot read the product (empty: none).
  std::vector<Instr> program;
  // Gemm: the product is added to what the output slot holds (C += A @ B, BLAS's beta = 1)
  // before the epilogue, whose loads of the output slot then read that sum. Only for a device
  // that declares Target::gemm_accumulate (compiler/passes/accumulate.cpp makes such Steps).
  bool accumulate = false;
  // Gemm: where the product's position [batch..., i, j] lies in the output slot, as element
  // strides per dimension of `shape` (the last one 1); empty: dense row-major. The slot holds
  // the product permuted (its shape is the permuted one): a batched product whose only reader
  // moves its batch and row dimensions (attention's dQ and dV, [B, H, T, D] read as [B, T, H, D])
  // is written in that reader's layout. No epilogue, no accumulation with it. Only for a device
  // that declares Target::gemm_out_strides.
  std::vector<int64_t> out_strides;
  // Gemm with out_strides: the element of the output slot holding position 0. Several Gemm Steps
  // may then write disjoint parts of one slot (a concatenation of their products: attention's dQ,
  // dK and dV written into the qkv product's gradient, compiler/passes/place.cpp); a Step reading
  // the slot comes after all of them. Only for a device that declares Target::gemm_out_offset.
  int64_t out_offset = 0;
  // Reduce: domain, sorted reduced axes, Op::ReduceSum or Op::ReduceMax.
  Shape domain;
  int64_t row = 0;  // Row
  std::vector<int64_t> axes;
  ir::Op reduce_op = ir::Op::ReduceSum;
  // Gemm/Gather/ScatterAdd/DynamicUpdateSlice: one map per input (domain: that input's shape).
  std::vector<IndexMap> maps;
  std::vector<DType> input_dtypes;
  // Gemm: bit i set: input i is a float32 slot that the product reads rounded to input_dtypes[i]
  // (bfloat16, to nearest even: a cast Step folded into the product by passes/fold_casts.cpp,
  // the same bits). Only for a device that declares Target::gemm_rounds_operands. Attention
  // with Attention::bf16: the same for its q, k, v and do (autocast's casts of them).
  uint8_t rounded = 0;
  int64_t axis = 0;  // Gather/ScatterAdd
  // Elementwise: further slots written (dense, the Step's shape), each with the instruction
  // whose value it holds (the merge pass gives one Step several outputs). Row: further slots of
  // one value per row, each the value its instruction has along the row (constant there).
  // Reduce: further slots of the Step's shape and dtype, each its instruction's value reduced
  // like the main one (at most kMaxReduceOutputs outputs in all).
  std::vector<int> more_outputs, more_results;
  std::vector<Source> sources;
  ir::Cost cost;
  // Gemm lowered from a conv whose product is the conv's output [B, O, P...]: the conv as such,
  // for backends that claim conv products for a library (cuDNN). inputs[1] holds its input and
  // inputs[0] its kernel, both dense; the input is padded and dilated already when the lowering
  // copied it so (attrs then have no padding or input dilation). Absent when the product reads
  // an im2col copy or a strided view, or folds the batch into its columns (kernel gradients).
  struct Conv {
    ir::ConvAttrs attrs;
    Shape lhs, rhs;  // the input [B, F, X...] as inputs[1] holds it, the kernel [O, F/groups, K...]
  };
  std::optional<Conv> conv;
  // Attention: out [batch..., tq, dv] (dense) = softmax over the keys of scale * q . k, masked,
  // times v, per batch element (batch = the product of the leading dimensions: batch x heads).
  // inputs q, k, v through maps[0..2], plain strided views of shapes [batch..., tq, d],
  // [batch..., tk, d] and [batch..., tk, dv]. causal: key j is masked for query i where
  // j - i > causal_offset (no other mask). The lowering makes it from the traced pattern
  // (matmul, scale, causal where, softmax, matmul) for a device that declares Target::attention.
  // Forward with more_outputs = {lse}: also each row's log-sum-exp of its masked, scaled scores
  // (dense [batch..., tq]), for the backward. backward: the gradients instead, from inputs
  // q, k, v, the forward's output o, its cotangent do (maps[0..4], o and do [batch..., tq, dv])
  // and lse (dense); output dq [batch..., tq, d], more_outputs {dk^T [batch..., d, tk], dv
  // [batch..., tk, dv]} (dense).
  // bf16 (autocast's form, only for a device that declares Target::attention_bf16): the
  // products' operands are bfloat16 values and the products accumulate in float32, as autocast's
  // decomposition computes them: q, k, v (and the backward's do) are bfloat16 slots
  // (input_dtypes) or float32 slots read rounded to bfloat16 (Step::rounded); the normalised
  // probabilities are rounded to bfloat16 before P V and P^T dO, dP = dO V^T is rounded to
  // bfloat16 before the softmax's backward (float32, as the softmax), dS is rounded to bfloat16
  // before dS K and dS^T Q. Results (out, lse, dq, dk^T, dv) are float32 (Step::dtype).
  struct Attention {
    int64_t batch = 0, tq = 0, tk = 0, d = 0, dv = 0;
    double scale = 1;
    bool causal = false;
    int64_t causal_offset = 0;
    bool backward = false;
    bool bf16 = false;
  };
  std::optional<Attention> attention;
  // Attention: where its results lie, each a plain strided view over the result's shape into
  // its slot; empty: dense. Forward: one map, the output's (written in the layout of a permute
  // that is its one reader, [B, T, H, D]; the log-sum-exp stays dense). Backward: three, dq,
  // dk^T and dv in outputs() order; the lowering writes them into their parts of one slot (the
  // qkv product's gradient, compiler/passes/place.cpp: output and more_outputs are then that one
  // slot, which the Step writes whole). Only for a device that declares
  // Target::attention_out_maps.
  std::vector<IndexMap> out_maps;
  // Collective: the op (ir::Op::AllReduce ..) and its node's attributes (Attrs::ints), e.g.
  // {ranks, kind} of an all_reduce; input_dtypes[0] the input's dtype.
  ir::Op collective = ir::Op::Count_;
  std::vector<int64_t> collective_attrs;
  // Elementwise (v16): several independent Elementwise Steps run as one launch, one task grid
  // over all their positions (an optimizer's updates of every parameter: one Step, not one per
  // parameter shape). Only for a device that declares Target::elementwise_parts
  // (compiler/passes/group_updates.cpp makes such Steps). Each part is a whole Elementwise Step
  // (no parts of its own, no random draws) computing what it would alone; no part reads or writes
  // a slot another part writes. The Step itself has no program: shape [the parts' positions in
  // all], dtype the first part's, inputs every part's inputs and output + more_outputs every
  // part's outputs, in part order (what the memory plan and the runtime see; more_results stays
  // empty), sources and cost the parts' together.
  std::vector<Step> parts;

  // Every slot written: output, then more_outputs.
  std::vector<int> outputs() const {
    std::vector<int> o{output};
    o.insert(o.end(), more_outputs.begin(), more_outputs.end());
    return o;
  }

  std::string str() const;  // one line, for dumps and errors

  // Slot `from` becomes `to` wherever this Step reads it (reads) or also writes it (reads and
  // writes), in its parts too: passes that rename slots after `group` (remat, accumulate) must
  // reach the slots the parts' kernels load and store.
  void rename_reads(int from, int to);
  void rename_slot(int from, int to);
};

// A Gemm Step with an epilogue as two Steps: the product alone into the output slot, then an
// Elementwise Step over the epilogue's domain applying the program in place (its loads of the
// output slot read the product there). For backends whose library runs the product but cannot
// fuse the epilogue (Backend::claim); the memory plan is unchanged.
std::pair<Step, Step> split_epilogue(const Step& gemm);

enum class SlotKind : uint8_t { Param, Output, Temp };
struct Slot {
  SlotKind kind;
  int index = 0;       // Param: parameter number; Output: output number
  size_t offset = 0;   // Temp: byte offset in the arena
  size_t nbytes = 0;
  Shape shape;
  DType dtype;
  Source source;       // the node whose value it holds (op and scope); "parameter" for params
};

}  // namespace tessera::kir
#pragma GCC visibility pop
