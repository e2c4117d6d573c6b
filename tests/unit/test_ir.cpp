// IR: hash-consing, the printer, the verifier, structural keys and cost rules.
#include <gtest/gtest.h>

#include "tensor/tensor_impl.h"
#include "ir/graph.h"
#include "tessera/tessera.h"

namespace ts = tessera;
using ts::DType;
using ts::detail::node_of;

TEST(IR, NodesAreInternedWhileAlive) {
  auto x = ts::from_vector<float>({1, 2, 3}, {3});
  auto a = x * 2 + 1, b = x * 2 + 1;
  EXPECT_EQ(node_of(a).get(), node_of(b).get());  // same op, inputs, attrs, scope
  auto c = x * 3 + 1;
  EXPECT_NE(node_of(a).get(), node_of(c).get());
  {
    ts::Scope s("other");
    auto d = x * 2 + 1;
    EXPECT_NE(node_of(a).get(), node_of(d).get());  // scopes are part of a node
  }
  // However make() is called (shape and dtype inferred, or given as autodiff's rebuild does),
  // an equal node is the same node.
  ts::ir::NodePtr n = node_of(a);
  EXPECT_EQ(ts::ir::make(n->op, n->inputs, n->attrs, &n->shape, n->dtype, n->device).get(), n.get());
  int64_t before = ts::ir::live_node_count();
  { auto tmp = (x + 7.5).exp(); }
  EXPECT_EQ(ts::ir::live_node_count(), before);  // weakly interned: dead nodes leave the table
}

// A realized buffer's leaf: one node per (buffer, shape, dtype) while it is alive, found again
// by every later read (leaf() looks it up before making a candidate), a new one once it died.
TEST(IR, LeavesAreInternedPerBufferShapeAndDtype) {
  auto x = ts::from_vector<float>({1, 2, 3, 4, 5, 6}, {6});
  std::shared_ptr<ts::Buffer> buf = ts::detail::impl_of(x)->buffer;  // host data: realized
  ASSERT_TRUE(buf);
  ts::ir::NodePtr a = node_of(x), b = node_of(x);
  EXPECT_EQ(a->op, ts::ir::Op::Leaf);
  EXPECT_EQ(a.get(), b.get());
  EXPECT_EQ(ts::ir::leaf(buf, {6}, DType::Float32).get(), a.get());
  const int64_t live = ts::ir::live_node_count();
  ts::ir::NodePtr other_shape = ts::ir::leaf(buf, {2, 3}, DType::Float32);
  ts::ir::NodePtr other_dtype = ts::ir::leaf(buf, {6}, DType::Int32);
  EXPECT_NE(other_shape.get(), a.get());
  EXPECT_NE(other_dtype.get(), a.get());
  EXPECT_NE(other_shape.get(), other_dtype.get());
  EXPECT_EQ(other_shape->shape, (ts::Shape{2, 3}));
  EXPECT_EQ(other_dtype->dtype, DType::Int32);
  EXPECT_EQ(ts::ir::live_node_count(), live + 2);
  EXPECT_EQ(ts::ir::leaf(buf, {2, 3}, DType::Float32).get(), other_shape.get());
  other_shape.reset();
  EXPECT_EQ(ts::ir::live_node_count(), live + 1);
  ts::ir::NodePtr again = ts::ir::leaf(buf, {2, 3}, DType::Float32);  // made anew
  EXPECT_EQ(again->shape, (ts::Shape{2, 3}));
  EXPECT_EQ(again->buffer, buf);
  EXPECT_EQ(ts::ir::live_node_count(), live + 2);
}

// The intern table under churn: thousands of nodes (growing it several times), every other one
// dropped (deletions shift probe runs back), then all traced again: the survivors are found,
// the dropped ones made anew, and the table empties back to where it started.
TEST(IR, InternTableFindsSurvivorsAfterDeletions) {
  auto x = ts::from_vector<float>({1, 2, 3}, {3});
  const int64_t before = ts::ir::live_node_count();
  {
    std::vector<ts::Tensor> first, kept;
    for (int i = 0; i < 6000; ++i) first.push_back(x + double(i));
    for (int i = 0; i < 6000; i += 2) kept.push_back(first[size_t(i)]);
    std::vector<const ts::ir::Node*> kept_nodes;
    for (auto& t : kept) kept_nodes.push_back(node_of(t).get());
    first.clear();
    const int64_t live = ts::ir::live_node_count();
    EXPECT_GT(live, before + 3000);
    int64_t fresh = -1;  // nodes one dropped expression makes anew
    for (int i = 0; i < 6000; ++i) {
      ts::Tensor again = x + double(i);
      if (i % 2 == 0) {
        EXPECT_EQ(node_of(again).get(), kept_nodes[size_t(i / 2)]) << i;
        EXPECT_EQ(ts::ir::live_node_count(), live) << i;  // every node found, none made
      } else {
        if (fresh < 0) fresh = ts::ir::live_node_count() - live;
        EXPECT_EQ(ts::ir::live_node_count(), live + fresh) << i;
      }
    }
    EXPECT_GE(fresh, 1);
  }
  EXPECT_EQ(ts::ir::live_node_count(), before);
}

TEST(IR, RandomNodesAreNeverMerged) {
  auto a = ts::rand({4}), b = ts::rand({4});
  EXPECT_NE(node_of(a).get(), node_of(b).get());
  auto va = a.to_vector<float>(), vb = b.to_vector<float>();
  EXPECT_NE(va, vb);
}

TEST(IR, ManualSeedFixesTheNumbersOfPendingDraws) {
  ts::manual_seed(0);
  auto a = ts::rand({4});  // still pending: manual_seed realizes it under seed 0
  ts::manual_seed(0);
  auto b = ts::rand({4});
  ts::manual_seed(1);
  auto c = ts::rand({4});
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  EXPECT_NE(a.to_vector<float>(), c.to_vector<float>());
}

// Inputs the IR fuzzer (tests/fuzz/fuzz_ir.cpp) found: each a tessera::Error, not UB or std::out_of_range.
TEST(IR, MalformedAttributesAndOverflowingExtentsAreErrors) {
  using ts::ir::Op;
  auto x = node_of(ts::zeros({2, 3}));
  EXPECT_THROW(ts::ir::make(Op::Concat, {x, x}, {}), ts::Error);  // no axis attribute
  const int64_t big = int64_t(1) << 62;
  EXPECT_THROW(ts::ir::make(Op::Pad, {x}, {{big, big, 0, 0, 0, 0}}), ts::Error);  // 2^63 + 2 rows
  EXPECT_THROW(ts::ir::make(Op::Pad, {x}, {{0, 0, big, 0, 0, 0}}), ts::Error);   // interior padding
  ts::Shape huge{big, 4};
  EXPECT_THROW(ts::ir::make(Op::Full, {}, {{}, 0}, &huge, DType::Float32), ts::Error);  // 2^64 elements
  // A slice whose stop - start + step would overflow is still the right length: one element.
  auto one = ts::ir::make(Op::Slice, {x}, {{0, 2, INT64_MAX, 0, 3, 1}});
  EXPECT_EQ(one->shape, (ts::Shape{1, 3}));
}

TEST(IR, PrinterIsOneLinePerNode) {
  auto x = ts::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  ts::Tensor y;
  {
    ts::Scope s("mlp");
    y = (x.matmul(x.transpose(0, 1)) + 1).sum({1});
  }
  ts::ir::Graph g = ts::ir::build_graph({node_of(y)});
  std::string text = ts::ir::to_text(g);
  EXPECT_NE(text.find("%0 = f32[2, 3] parameter(0)"), std::string::npos) << text;
  EXPECT_NE(text.find("permute(%0) ints={1,0}  # mlp"), std::string::npos) << text;
  EXPECT_NE(text.find("matmul(%0, %1)"), std::string::npos) << text;
  EXPECT_NE(text.find("reduce_sum("), std::string::npos) << text;
  EXPECT_NE(text.find("ROOT ("), std::string::npos) << text;
  size_t lines = std::count(text.begin(), text.end(), '\n');
  EXPECT_EQ(lines, g.nodes.size() + 3);  // header, nodes, ROOT, closing brace
  ts::ir::verify(g);
}

TEST(IR, VerifierRejectsABrokenNode) {
  auto x = ts::from_vector<float>({1, 2, 3}, {3});
  auto y = x + 1;
  ts::ir::Graph g = ts::ir::build_graph({node_of(y)});
  auto broken = std::make_shared<ts::ir::Node>(*g.nodes.back());
  broken->shape = {4};  // lies about its shape
  broken->interned = false;
  g.nodes.back() = broken;
  g.index.emplace(broken.get(), int(g.nodes.size()) - 1);
  EXPECT_THROW(ts::ir::verify(g), ts::Error);
}

TEST(IR, StructuralKeyNumbersLeavesOnly) {
  auto x1 = ts::from_vector<float>({1, 2, 3}, {3}), x2 = ts::from_vector<float>({4, 5, 6}, {3});
  auto g1 = ts::ir::build_graph({node_of(x1 * 2 + 1)});
  auto g2 = ts::ir::build_graph({node_of(x2 * 2 + 1)});
  EXPECT_EQ(g1.key, g2.key);  // different buffers and contents, same structure
  auto g3 = ts::ir::build_graph({node_of(x1 * 3 - 1)});
  EXPECT_NE(g1.key, g3.key);  // one op and one constant differ
  auto x3 = ts::from_vector<float>({1, 2, 3, 4}, {4});
  EXPECT_NE(g1.key, ts::ir::build_graph({node_of(x3 * 2 + 1)}).key);  // shape differs
  auto x4 = ts::from_vector<double>({1, 2, 3}, {3}, {DType::Float64});
  EXPECT_NE(g1.key, ts::ir::build_graph({node_of(x4 * 2 + 1)}).key);  // dtype differs
}

TEST(IR, CostRulesMatchHandCounts) {
  auto a = ts::zeros({8, 16, 32}), b = ts::zeros({8, 32, 4});
  auto mm = node_of(a.matmul(b));
  auto c = ts::ir::info(mm->op).cost(*mm);
  EXPECT_EQ(c.flops, 2.0 * 8 * 16 * 4 * 32);
  EXPECT_EQ(c.bytes, 4.0 * (8 * 16 * 32 + 8 * 32 * 4 + 8 * 16 * 4));

  auto x = ts::zeros({100, 10}), y = ts::zeros({100, 10});
  auto add = node_of(x + y);
  c = ts::ir::info(add->op).cost(*add);
  EXPECT_EQ(c.flops, 1000);
  EXPECT_EQ(c.bytes, 3 * 4000);

  auto red = node_of(x.sum({1}, true));
  c = ts::ir::info(red->op).cost(*red);
  EXPECT_EQ(c.flops, 1000);
  EXPECT_EQ(c.bytes, 4000 + 400);

  auto idx = ts::zeros({100, 3}, {DType::Int64});
  auto gat = node_of(ts::gather(x, 1, idx));
  c = ts::ir::info(gat->op).cost(*gat);
  EXPECT_EQ(c.flops, 0);
  EXPECT_EQ(c.bytes, 300 * 8 + 2 * 300 * 4);  // indices, values read, values written
}
