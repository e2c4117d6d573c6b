// A target's properties change its plan as expected (compiler/passes/target.cpp): tiled buffer
// sizes by hand, Step bytes scaled with their buffers, float32 stored as bfloat16 in every
// buffer and Step, dtypes a target does not compute refused with the op named; and the null
// device posing as a target compiles a graph into that target's plan.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "compiler/pipeline.h"
#include "tensor/tensor_impl.h"
#include "ir/graph.h"
#include "kernel_ir/target.h"
#include "compiler/lower.h"
#include "runtime/realize.h"
#include "tessera/metrics.h"
#include "tessera/nn.h"
#include "tessera/tessera.h"
#include "test_util.h"

namespace tessera {
namespace {

kir::Target tpu_like() {
  kir::Target t;
  t.tile_rows = 8, t.tile_cols = 128;
  return t;
}

compiler::Options for_target(const kir::Target& t) {
  compiler::Options o;
  o.target = t;
  return o;
}

compiler::Plan compile_for(const Tensor& out, const kir::Target& t) {
  ir::Graph g = ir::build_graph({detail::node_of(out)});
  return compiler::compile_graph(g, std::vector<int>(g.outputs.size(), -1), for_target(t));
}

TEST(Target, BufferBytesFollowTheTiledLayout) {
  kir::Target t = tpu_like();
  EXPECT_EQ(t.buffer_bytes({3, 5}, DType::Float32), 8u * 128 * 4);         // one 8 x 128 tile
  EXPECT_EQ(t.buffer_bytes({2, 130}, DType::Float32), 8u * 256 * 4);        // two tiles wide
  EXPECT_EQ(t.buffer_bytes({9, 128}, DType::Float32), 16u * 128 * 4);       // two tiles tall
  EXPECT_EQ(t.buffer_bytes({4, 3, 5}, DType::Float32), 4u * 8 * 128 * 4);   // leading dims multiply
  EXPECT_EQ(t.buffer_bytes({3, 5}, DType::BFloat16), 16u * 128 * 2);        // 16-bit: 16-row tiles
  EXPECT_EQ(t.buffer_bytes({3, 5}, DType::Int64), 8u * 128 * 8);
  EXPECT_EQ(t.buffer_bytes({10}, DType::Float32), 1024u * 4);               // vectors: whole tiles
  EXPECT_EQ(t.buffer_bytes({}, DType::Float32), 1024u * 4);
  EXPECT_EQ(t.buffer_bytes({16, 256}, DType::Float32), 16u * 256 * 4) << "aligned shapes are not padded";
  kir::Target plain;
  EXPECT_EQ(plain.buffer_bytes({3, 5}, DType::Float32), 60u);
  plain.float32_as = DType::BFloat16;
  EXPECT_EQ(plain.buffer_bytes({3, 5}, DType::Float32), 30u);
  EXPECT_EQ(plain.buffer_bytes({3, 5}, DType::Int64), 120u) << "only float32 is substituted";
}

TEST(Target, TiledPlanSizesEveryBufferAndScalesStepBytes) {
  Tensor a = testing::random_tensor({3, 5}, DType::Float32, 1);
  sync();
  Tensor b = a * 2.0 + 1.0;
  compiler::Plan host = compile_for(b, {});
  compiler::Plan tiled = compile_for(b, tpu_like());
  ASSERT_EQ(host.steps.size(), 1u);
  ASSERT_EQ(tiled.steps.size(), 1u);
  EXPECT_DOUBLE_EQ(host.steps[0].cost.bytes, 120.0);  // read 60 B, write 60 B
  EXPECT_DOUBLE_EQ(tiled.steps[0].cost.bytes, 2.0 * 4096);
  EXPECT_DOUBLE_EQ(tiled.steps[0].cost.flops, host.steps[0].cost.flops);
  for (const kir::Slot& sl : tiled.slots) EXPECT_EQ(sl.nbytes, 4096u);
  EXPECT_EQ(tiled.memory.peak_bytes, 2u * 4096);
  EXPECT_EQ(host.memory.peak_bytes, 2u * 60);
}

TEST(Target, Float32AsBfloat16SubstitutesEveryFloat32BufferAndStep) {
  nn::GPT model({.vocab = 20, .block = 8, .embd = 16, .heads = 2, .layers = 1, .dropout = 0.0, .bias = true, .tied_head = false});
  Tensor x = testing::random_tensor({2, 8}, DType::Int64, 3, 0, 20), y = testing::random_tensor({2, 8}, DType::Int64, 4, 0, 20);
  sync();
  Tensor loss = model.loss(x, y);
  loss.backward();
  std::vector<ir::NodePtr> outs{detail::node_of(loss)};
  for (auto& p : model.parameters()) outs.push_back(detail::node_of(p.grad()));
  ir::Graph g = ir::build_graph(outs);
  std::vector<int> none(g.outputs.size(), -1);
  compiler::Plan f32 = compiler::compile_graph(g, none, {});
  kir::Target half;
  half.float32_as = DType::BFloat16;
  compiler::Plan bf16 = compiler::compile_graph(g, none, for_target(half));
  ASSERT_EQ(f32.slots.size(), bf16.slots.size());
  int substituted = 0, kept = 0;
  for (size_t k = 0; k < f32.slots.size(); ++k) {
    const kir::Slot &a = f32.slots[k], &b = bf16.slots[k];
    if (a.dtype == DType::Float32) {
      EXPECT_EQ(b.dtype, DType::BFloat16);
      EXPECT_EQ(2 * b.nbytes, a.nbytes);
      ++substituted;
    } else {
      EXPECT_EQ(b.dtype, a.dtype);
      EXPECT_EQ(b.nbytes, a.nbytes);
      ++kept;
    }
  }
  EXPECT_GT(substituted, 20);
  EXPECT_GT(kept, 0) << "the int64 tokens stay int64";
  // The schedule may order the Steps differently (other sizes); the slots are the same, so match
  // Steps by the slot they write.
  ASSERT_EQ(f32.steps.size(), bf16.steps.size());
  std::map<int, const kir::Step*> by_output;
  for (const kir::Step& st : bf16.steps) by_output[st.output] = &st;
  for (const kir::Step& a : f32.steps) {
    ASSERT_TRUE(by_output.count(a.output));
    const kir::Step& b = *by_output[a.output];
    ASSERT_EQ(b.sources.size(), a.sources.size());
    EXPECT_EQ(b.dtype, a.dtype == DType::Float32 ? DType::BFloat16 : a.dtype);
    for (const kir::Instr& in : b.program) EXPECT_NE(in.dtype, DType::Float32) << b.str();
    bool all_float = true;
    for (int x : a.inputs) all_float &= f32.slots[size_t(x)].dtype == DType::Float32;
    for (int o : a.outputs()) all_float &= f32.slots[size_t(o)].dtype == DType::Float32;
    if (all_float) {
      EXPECT_DOUBLE_EQ(b.cost.bytes, a.cost.bytes / 2) << b.str();
    }
    EXPECT_DOUBLE_EQ(b.cost.flops, a.cost.flops);
  }
  EXPECT_LT(bf16.memory.peak_bytes, f32.memory.peak_bytes);
  EXPECT_GT(2 * bf16.memory.peak_bytes, f32.memory.peak_bytes) << "the int64 tokens do not halve";
}

TEST(Target, RefusesDtypesItDoesNotComputeNamingTheOp) {
  kir::Target no_f64;
  no_f64.compute_dtypes = {DType::Bool, DType::Int64, DType::Float32};
  Tensor a = testing::random_tensor({4}, DType::Float64, 1);
  Tensor f = testing::random_tensor({4}, DType::Float32, 2);
  sync();
  std::string msg = testing::error_message([&] { compile_for(exp(a), no_f64); });
  EXPECT_EQ(msg.rfind("[exp] float64 is not computed by the target device (it computes bool, int64, float32)", 0), 0u) << msg;
  EXPECT_EQ(compile_for(exp(f), no_f64).steps.size(), 1u);
  // float32 stored as a dtype the target lacks is refused too.
  no_f64.float32_as = DType::BFloat16;
  EXPECT_NE(testing::error_message([&] { compile_for(exp(f), no_f64); }).find("bfloat16 is not computed"), std::string::npos);
}

TEST(NullDevice, PosesAsATargetAndCompilesItsPlan) {
  kir::Target t = tpu_like();
  t.alignment = 256;
  Device dev = backends::null_device_for(t);
  EXPECT_EQ(dev.kind, "null");
  EXPECT_GT(dev.index, 0) << "null:0 is the plain null device";
  EXPECT_EQ(backends::null_device_for(t).index, dev.index) << "equal targets share one index";
  EXPECT_EQ(backends::backend_for(dev).properties(dev.index), t);
  kir::Target other = t;
  other.alignment = 512;
  EXPECT_NE(backends::null_device_for(other).index, dev.index);

  Tensor a = testing::random_tensor({3, 5}, DType::Float32, 1);
  sync();
  Tensor b = exp(a) + a;
  int64_t compiled = metrics().graphs_compiled, launched = metrics().steps_launched;
  auto host = runtime::compile_only({{detail::node_of(b), {}}});
  auto posed = runtime::compile_only({{detail::node_of(b), {}}}, &dev);
  EXPECT_EQ(metrics().graphs_compiled, compiled + 2) << "the target's plan is its own cache entry";
  EXPECT_EQ(metrics().steps_launched, launched);
  EXPECT_EQ(host->alignment, 64u);
  EXPECT_EQ(posed->alignment, 256u);
  EXPECT_EQ(posed->memory.peak_bytes, 2u * 4096);
  EXPECT_EQ(host->memory.peak_bytes, 2u * 60);
  EXPECT_EQ(b.to_vector<float>().size(), 15u) << "the tensor itself still runs on the cpu";
}

}  // namespace
}  // namespace tessera
