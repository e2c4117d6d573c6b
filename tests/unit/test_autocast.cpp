// Autocast (tessera/autocast.h): which op runs in which dtype, read from the traced IR and the
// compiled Steps' dump; the bfloat16 products (vdpbf16ps on AVX512-BF16, or float32 and the BLAS)
// against the float64 reference over the same bfloat16-rounded operands; the bf16 flops counter;
// gradients reaching float32 parameters; dynamic loss scaling (optim::GradScaler).
#include <algorithm>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <thread>

#include "backends/backend.h"
#include "backends/cpu/bf16_gemm.h"
#include "compiler/pipeline.h"
#include "core/half.h"
#include "ir/graph.h"
#include "ir/node.h"
#include "runtime/compile_options.h"
#include "tensor/tensor_impl.h"
#include "test_util.h"

namespace tessera {
namespace {

using testing::matches_reference;
using testing::random_tensor;
constexpr DType F32 = DType::Float32, BF16 = DType::BFloat16, F16 = DType::Float16;

// Every node of t's pending graph, once (alive while t is).
std::vector<const ir::Node*> nodes_of(const Tensor& t) {
  std::vector<const ir::Node*> out, stack{detail::node_of(t).get()};
  std::set<const ir::Node*> seen;
  while (!stack.empty()) {
    const ir::Node* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    out.push_back(n);
    for (const ir::NodePtr& i : n->inputs) stack.push_back(i.get());
  }
  return out;
}

bool is_product(ir::Op op) { return op == ir::Op::Matmul || op == ir::Op::Conv; }
bool moves_or_casts(ir::Op op) {
  using ir::Op;
  return op == Op::Leaf || op == Op::Cast || op == Op::Reshape || op == Op::Permute || op == Op::Expand || op == Op::Slice ||
         op == Op::Pad || op == Op::Concat || op == Op::Full || op == Op::Iota;
}

// What the rule table says of one traced expression: the dtype of every product's operands and
// result, and of every other computing node (movement, casts and constants aside).
struct Dtypes {
  std::set<DType> product_operands, product_results, others;
  int products = 0;
};
Dtypes dtypes_in(const Tensor& t) {
  Dtypes d;
  for (const ir::Node* n : nodes_of(t)) {
    if (is_product(n->op)) {
      ++d.products;
      for (const ir::NodePtr& i : n->inputs) d.product_operands.insert(i->dtype);
      d.product_results.insert(n->dtype);
    } else if (!moves_or_casts(n->op) && is_floating(n->dtype)) {
      d.others.insert(n->dtype);
    }
  }
  return d;
}

struct Rule {
  const char* op;
  std::function<Tensor()> trace;
  bool product;  // a product under autocast (its operands in the autocast dtype) or float32 throughout
};

std::vector<Rule> rule_table() {
  Tensor x = random_tensor({4, 6, 8}, F32, 1), w = random_tensor({5, 8}, F32, 2), img = random_tensor({2, 3, 9, 9}, F32, 3);
  Tensor k = random_tensor({4, 3, 3, 3}, F32, 4), tgt = testing::random_int({4}, 0, 4, DType::Int64, 5);
  Tensor q = random_tensor({2, 3, 7, 4}, F32, 6), kk = random_tensor({2, 3, 7, 4}, F32, 7);
  return {
      {"matmul", [=] { return matmul(x, w.transpose(0, 1)); }, true},
      {"bmm", [=] { return matmul(q, kk.transpose(-2, -1)); }, true},
      {"linear", [=] { nn::Linear l(8, 5); return l(x); }, true},
      {"conv2d", [=] { return conv2d(img, k); }, true},
      {"conv_transpose2d", [=] { return conv_transpose2d(img, k.transpose(0, 1)); }, true},
      {"attention", [=] { return matmul(softmax(matmul(q, kk.transpose(-2, -1)), -1), kk); }, true},
      {"softmax", [=] { return softmax(x, -1); }, false},
      {"log_softmax", [=] { return log_softmax(x, -1); }, false},
      {"layer_norm", [=] { return layer_norm(x, {8}); }, false},
      {"sum", [=] { return x.sum(); }, false},
      {"mean", [=] { return x.mean({1}); }, false},
      {"gelu", [=] { return gelu(x); }, false},
      {"exp", [=] { return exp(x); }, false},
      {"cross_entropy", [=] { return cross_entropy(x.reshape({24, 8}).slice(0, 0, 4), tgt); }, false},
      {"mse_loss", [=] { return mse_loss(x, x * 0.5); }, false},
      {"max_pool2d", [=] { return max_pool2d(img, {2, 2}); }, false},
      {"adaptive_avg_pool2d", [=] { return adaptive_avg_pool2d(img, {4, 4}); }, false},
      {"batch_norm", [=] { return batch_norm(img, Tensor(), Tensor(), Tensor(), Tensor(), true); }, false},
  };
}

// Each rule under bfloat16 and float16 autocast: products take 16-bit operands and return
// float32; every other computation stays float32; outside autocast nothing is 16-bit.
TEST(Autocast, RuleTable) {
  for (DType t : {BF16, F16})
    for (const Rule& r : rule_table()) {
      SCOPED_TRACE(std::string(r.op) + " under " + dtype_name(t));
      Tensor y;
      {
        Autocast ac{t};
        y = r.trace();
      }
      EXPECT_EQ(y.dtype(), F32);
      Dtypes d = dtypes_in(y);
      if (r.product) {
        EXPECT_GT(d.products, 0);
        EXPECT_EQ(d.product_operands, std::set<DType>{t});
        EXPECT_EQ(d.product_results, std::set<DType>{F32});
      } else {
        EXPECT_TRUE(d.product_operands.empty() || d.product_operands == std::set<DType>{F32}) << "a product went 16-bit";
      }
      EXPECT_TRUE(d.others.empty() || d.others == std::set<DType>{F32});
      Dtypes plain = dtypes_in(r.trace());
      EXPECT_TRUE(plain.product_operands.empty() || plain.product_operands == std::set<DType>{F32});
    }
}

// The rule table's products compute what the reference computes from their rounded operands.
TEST(Autocast, RuleTableValuesMatchTheReference) {
  Autocast ac{BF16};
  for (const Rule& r : rule_table()) {
    SCOPED_TRACE(r.op);
    EXPECT_TRUE(matches_reference(r.trace(), 1e-4));
  }
}

TEST(Autocast, NestingNoAutocastScopesAndThreads) {
  Tensor a = random_tensor({3, 4}, F32, 1), b = random_tensor({4, 2}, F32, 2);
  auto operand = [&] {
    Tensor y = matmul(a, b);
    for (const ir::Node* n : nodes_of(y))
      if (n->op == ir::Op::Matmul) return n->inputs[0]->dtype;
    return DType::Bool;
  };
  EXPECT_FALSE(autocast_dtype());
  EXPECT_EQ(operand(), F32);
  {
    Autocast ac{BF16};
    EXPECT_EQ(operand(), BF16);
    {
      Autocast off{BF16, false};
      EXPECT_FALSE(autocast_dtype());
      EXPECT_EQ(operand(), F32);
      Autocast half{F16};
      EXPECT_EQ(operand(), F16);
    }
    EXPECT_EQ(operand(), BF16);
    std::optional<DType> other = BF16;
    std::thread([&] { other = autocast_dtype(); }).join();
    EXPECT_FALSE(other) << "autocast is per thread";
  }
  EXPECT_EQ(operand(), F32);
  EXPECT_THROW(Autocast{F32}, Error);
  // float64 and integer products are never cast; 16-bit tensors keep PyTorch's result dtype.
  Autocast ac{BF16};
  EXPECT_EQ(matmul(a.to(DType::Float64), b.to(DType::Float64)).dtype(), DType::Float64);
  EXPECT_EQ(matmul(a.to(DType::Int32), b.to(DType::Int32)).dtype(), DType::Int32);
  Autocast off{BF16, false};
  Tensor h = matmul(a.to(BF16), b.to(BF16));
  EXPECT_EQ(h.dtype(), BF16);
  EXPECT_TRUE(matches_reference(h));
}

// Parameters stay float32 and get float32 gradients through their bfloat16 copies, equal to the
// reference's derivative of the same graph (the products of the backward pass in bf16 too).
TEST(Autocast, GradientsReachFloat32Parameters) {
  nn::Linear l(24, 20);
  Tensor x = random_tensor({9, 24}, F32, 3).requires_grad_();
  Tensor loss;
  {
    Autocast ac{BF16};
    loss = (gelu(l(x)) * random_tensor({9, 20}, F32, 4)).sum();
  }
  loss.backward();
  for (const Tensor& p : l.parameters()) {
    EXPECT_EQ(p.dtype(), F32);
    EXPECT_EQ(p.grad().dtype(), F32);
  }
  EXPECT_EQ(x.grad().dtype(), F32);
  // The weight's gradient is a bf16 product (traced, before it runs): its operands are x and the output's cotangent.
  int bf16_products = 0;
  Tensor gw = l.weight.grad();
  for (const ir::Node* n : nodes_of(gw))
    if (n->op == ir::Op::Matmul) bf16_products += n->inputs[0]->dtype == BF16;
  EXPECT_GE(bf16_products, 1);
  EXPECT_TRUE(matches_reference({l.weight.grad(), l.bias.grad(), x.grad()}, 1e-4));
}

// ---- The products ----
// The matmul primitive on bfloat16 operands as they lie (views, not copies): float32 results.
Tensor product(const Tensor& a, const Tensor& b) {
  return detail::from_node(ir::make(ir::Op::Matmul, {detail::node_of(a), detail::node_of(b)}));
}

// C = A @ B with bfloat16 operands over the shapes the kernel chooses between: partial row tiles
// (M mod 6), partial and several column vectors (N around 16 and 64), odd and tiny K (A packed),
// transposed operands (A packed, B packed across its rows), batches and strided rows, against
// the float64 reference over the same operands.
TEST(Autocast, ProductsMatchTheReference) {
  struct Shape3 { int64_t m, n, k; };
  std::vector<Shape3> shapes{{1, 1, 1}, {5, 15, 2}, {6, 16, 3}, {7, 17, 31}, {13, 63, 128}, {12, 64, 129}, {37, 65, 64},
                             {128, 200, 96}, {130, 130, 257}};
  uint32_t seed = 10;
  for (const auto& s : shapes)
    for (int layout = 0; layout < 4; ++layout) {
      SCOPED_TRACE(std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) + " layout " + std::to_string(layout));
      Tensor a = (layout & 1) ? random_tensor({s.k, s.m}, BF16, ++seed).transpose(0, 1) : random_tensor({s.m, s.k}, BF16, ++seed);
      Tensor b = (layout & 2) ? random_tensor({s.n, s.k}, BF16, ++seed).transpose(0, 1) : random_tensor({s.k, s.n}, BF16, ++seed);
      Tensor c = product(a, b);
      EXPECT_EQ(c.dtype(), F32);
      EXPECT_TRUE(matches_reference(c, testing::tolerance(F32, s.k)));
    }
  Tensor q = random_tensor({3, 2, 9, 6}, BF16, 40), k = random_tensor({3, 2, 9, 6}, BF16, 41);
  EXPECT_TRUE(matches_reference(product(q, k.transpose(-2, -1))));
  EXPECT_TRUE(matches_reference(product(q.slice(2, 0, 9, 2), k.slice(2, 0, 9, 2).transpose(-2, -1))));  // strided rows
  EXPECT_TRUE(matches_reference(product(q.slice(3, 0, 6, 2), k.slice(3, 1, 6, 2).transpose(-2, -1))));  // strided columns
  // A read by columns in a batch (attention's P^T dO: packed as pairs of depths per element), odd
  // K, rows not a multiple of 16 (the packing's scalar tail), and an A whose columns lie further
  // apart than its rows (a slice of a wider tensor, transposed).
  Tensor p = random_tensor({3, 2, 9, 13}, BF16, 42), g = random_tensor({3, 2, 9, 20}, BF16, 43);
  EXPECT_TRUE(matches_reference(product(p.transpose(-2, -1), g)));
  EXPECT_TRUE(matches_reference(product(p.slice(3, 0, 11).transpose(-2, -1), g.slice(2, 0, 9))));
  // Few batch elements or more than one row block each (B packed once for all tasks, A by
  // columns packed once per element) against attention's form above (each task packs its own).
  Tensor u = random_tensor({2, 20, 150}, BF16, 44), v = random_tensor({2, 20, 33}, BF16, 45);
  EXPECT_TRUE(matches_reference(product(u.transpose(-2, -1), v)));
  EXPECT_TRUE(matches_reference(product(u.transpose(-2, -1), v.transpose(-2, -1).contiguous().transpose(-2, -1))));
  for (int64_t k : {1, 2, 3, 64, 127, 130})
    for (int64_t m : {5, 16, 21, 128}) {
      SCOPED_TRACE("A by columns in a wider tensor: m " + std::to_string(m) + " k " + std::to_string(k));
      Tensor wide = random_tensor({k, m + 7}, BF16, ++seed), b = random_tensor({k, 70}, BF16, ++seed);
      EXPECT_TRUE(matches_reference(product(wide.slice(1, 3, m + 3).transpose(0, 1), b), testing::tolerance(F32, k)));
    }
  // float16 goes through float32 and the BLAS.
  EXPECT_TRUE(matches_reference(product(q.to(F16), k.to(F16).transpose(-2, -1))));
}

// An operand's rounding to bfloat16 (an Elementwise Step ending in the cast: the native loop into a
// float32 tile, then rounded) gives exactly the bits of rounding the float32 value, on transposed
// and dense inputs, NaN and infinities included.
TEST(Autocast, RoundingStepsGiveExactBits) {
  std::vector<float> xs = random_tensor({70, 300}, F32, 9, -1e3, 1e3).to_vector<float>();
  xs[5] = std::numeric_limits<float>::quiet_NaN(), xs[6] = std::numeric_limits<float>::infinity(), xs[7] = 1e-40f;
  Tensor x = from_vector(xs, {70, 300});
  for (bool transposed : {false, true}) {
    Tensor v = transposed ? x.transpose(0, 1) : x;
    Tensor y = (v * 3.0).to(BF16);  // the product alone is the output: one Step, ending in the rounding
    std::vector<float> got = y.to_vector<float>(), src = v.contiguous().to_vector<float>();
    ASSERT_EQ(got.size(), src.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const float want = half::bf16_to_float(half::float_to_bf16(src[i] * 3.0f));
      ASSERT_TRUE(std::memcmp(&got[i], &want, 4) == 0 || (std::isnan(got[i]) && std::isnan(want))) << i << ": " << got[i] << " vs " << want;
    }
  }
  // Steps the interpreter runs, ending in the rounding (GELU's erf, a softmax's Row Step, and a
  // where() that an erf keeps in the interpreter but that passes x through, whose ties -- 1 + 2^-8
  // to even (1), 1 + 3 * 2^-8 up -- NaN, infinity and subnormals reach the rounding as they are):
  // the bits of the same float32 Step's result rounded on the host.
  for (float tie : {1.00390625f, 1.01171875f, -1.00390625f, -3.0117188f, 257.0f, 65664.0f}) xs.push_back(tie);
  xs.resize(70 * 301, 0.5f);
  x = from_vector(xs, {70, 301});
  auto gelu = [](const Tensor& t) { return t * 0.5 * (erf(t * 0.7071067811865476) + 1.0); };
  auto pass = [](const Tensor& t) { return where(t > 1e30, erf(t), t); };
  for (auto f : std::vector<std::function<Tensor(const Tensor&)>>{gelu, pass, [](const Tensor& t) { return softmax(t * 0.01, -1); }}) {
    std::vector<float> ref = f(x).to_vector<float>();
    std::vector<float> got = f(x).to(BF16).to_vector<float>();
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const float want = half::bf16_to_float(half::float_to_bf16(ref[i]));
      ASSERT_TRUE(std::memcmp(&got[i], &want, 4) == 0 || (std::isnan(got[i]) && std::isnan(want))) << i << ": " << got[i] << " vs " << want;
    }
  }
}

// ---- Casts folded into the products (compiler/passes/fold_casts.cpp) ----
// A two-layer MLP's loss and gradients under bf16 autocast: the weights' transposed bf16 copies
// (B of the forward products, B by rows of the input gradients' products), x's (A by rows of the
// forward product, B of the weight gradient dY^T x) and the cotangents' roundings (A by rows of
// dY W, A by columns of the weight gradient dY^T x). Shapes with
// an odd K (33), column tails (72, 40, 33) and partial row tiles (50 rows).
// Every fourth value of the weights and of r a tie between two bfloat16 values (to even: down
// for 1 + 2^-8, up for 1 + 3 * 2^-8), scaled by powers of two, and some subnormals.
Tensor with_ties(Shape s, uint32_t seed, double lo, double hi) {
  std::vector<float> v = random_tensor(s, F32, seed, lo, hi).to_vector<float>();
  const float ties[] = {1.00390625f, -1.01171875f, 0.25f * 1.00390625f, -0.125f * 1.01171875f, 1e-40f};
  for (size_t i = 0; i < v.size(); i += 4) v[i] = ties[i / 4 % 5];
  return from_vector(v, s);
}
struct Mlp {
  Tensor x = random_tensor({50, 33}, F32, 21, -2, 2).requires_grad_();
  Tensor w1 = with_ties({72, 33}, 22, -0.5, 0.5).requires_grad_();
  Tensor b1 = random_tensor({72}, F32, 23).requires_grad_();
  Tensor w2 = with_ties({40, 72}, 24, -0.5, 0.5).requires_grad_();
  Tensor r = with_ties({50, 40}, 25, -1, 1);
  std::vector<Tensor> run() {
    Tensor loss;
    {
      Autocast ac{BF16};
      Tensor h = gelu(matmul(x, w1.transpose(0, 1)) + b1);
      loss = (matmul(h, w2.transpose(0, 1)) * r).sum();
    }
    loss.backward();
    return {loss, x.grad(), w1.grad(), b1.grad(), w2.grad()};
  }
};

compiler::Plan cpu_plan(const std::vector<Tensor>& ys, const std::string& disabled) {
  std::vector<ir::NodePtr> nodes;
  for (const Tensor& y : ys) nodes.push_back(detail::node_of(y));
  compiler::Options o;
  o.target = backends::backend_for(Device("cpu")).properties(0);
  if (!disabled.empty()) o.disabled.insert(disabled);
  return compiler::compile_graph(ir::build_graph(nodes), {}, o);
}

// Steps that only round a float32 buffer to bfloat16 (a load, then the cast).
int standalone_casts(const compiler::Plan& p) {
  int n = 0;
  for (const kir::Step& st : p.steps)
    n += st.kind == kir::StepKind::Elementwise && st.dtype == BF16 && st.program.size() == 2 &&
         st.program[1].code == kir::Code::Cast && st.program[0].code == kir::Code::Load;
  return n;
}

// On the cpu the casts read only by products are gone from the plan: the products round the
// float32 values as they pack them. Without the pass they are Steps of their own.
TEST(Autocast, CastsReadOnlyByProductsAreFoldedIntoThem) {
  Mlp m;
  const std::vector<Tensor> ys = m.run();
  const compiler::Plan folded = cpu_plan(ys, ""), unfolded = cpu_plan(ys, "fold_casts");
  // x, w1^T, w2^T, the cotangents dY (= r) and dH (GELU's gradient, the epilogue of dY W2: under
  // autocast GELU does not save its derivative, the backward recomputes it)
  EXPECT_EQ(standalone_casts(unfolded), 5) << unfolded.str();
  EXPECT_EQ(standalone_casts(folded), 0) << folded.str();
  EXPECT_EQ(folded.steps.size() + 5, unfolded.steps.size());
}

// The folded products give the bits of the unfolded plan (the same rounding of the same float32
// values), for the loss and every gradient; with TESSERA_CPU_BF16=0 (test_autocast_no_bf16) the
// operands are rounded whole before the float32 products.
TEST(Autocast, FoldedCastsGiveTheBitsOfTheCastSteps) {
  std::vector<std::vector<float>> got, want;
  {
    Mlp m;
    for (const Tensor& t : m.run()) got.push_back(t.to_vector<float>());
  }
  runtime::set_disabled_passes("fold_casts");
  {
    Mlp m;
    for (const Tensor& t : m.run()) want.push_back(t.to_vector<float>());
  }
  runtime::set_disabled_passes("");
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    ASSERT_EQ(got[k].size(), want[k].size());
    EXPECT_EQ(std::memcmp(got[k].data(), want[k].data(), got[k].size() * 4), 0) << "output " << k;
  }
  // Not vacuous: the operands were rounded (the values differ from float32 products).
  Mlp f;
  Tensor ref = (matmul(gelu(matmul(f.x, f.w1.transpose(0, 1)) + f.b1), f.w2.transpose(0, 1)) * f.r).sum();
  EXPECT_NE(ref.to_vector<float>()[0], got[0][0]);
}

// Results are bit-identical for 1, 2 and 3 threads; the bf16 flops counter counts exactly the
// products run in vdpbf16ps (none where the machine or TESSERA_CPU_BF16=0 says no).
TEST(Autocast, ThreadCountsAndTheFlopsCounter) {
  Tensor a = random_tensor({300, 96}, F32, 1), b = random_tensor({96, 130}, F32, 2);
  // A weight gradient's form (A read by columns: packed as pairs of depths; K deep, few rows:
  // the columns split between tasks) and a batched one with A by columns.
  Tensor dy = random_tensor({517, 140}, BF16, 3), x = random_tensor({517, 70}, BF16, 4);
  Tensor pa = random_tensor({8, 64, 32}, BF16, 5), pb = random_tensor({8, 64, 40}, BF16, 6);
  std::vector<std::vector<float>> runs, grads, batched;
  const int before = omp_get_max_threads();
  for (int th : {1, 2, 3}) {
    omp_set_num_threads(th);
    const int64_t flops = metrics().bf16_flops;
    Autocast ac{BF16};
    runs.push_back(matmul(a, b).to_vector<float>());
    EXPECT_EQ(metrics().bf16_flops - flops, backends::bf16_gemm::available() ? 2 * 300 * 130 * 96 : 0);
    grads.push_back(product(dy.transpose(0, 1), x).to_vector<float>());
    batched.push_back(product(pa.transpose(-2, -1), pb).to_vector<float>());
  }
  omp_set_num_threads(before);
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
  EXPECT_EQ(grads[0], grads[1]);
  EXPECT_EQ(grads[0], grads[2]);
  EXPECT_EQ(batched[0], batched[1]);
  EXPECT_EQ(batched[0], batched[2]);
  // A row's result does not depend on how many rows the product has (micro-batches and batch
  // slices compute each row alike): the first 40 rows alone give the same bits, and an A packed
  // as pairs gives the bits of the same A read in place (the same pairs, in the same order). The
  // vdpbf16ps kernel's promise: the float32 fallback's BLAS blocks rows by their count.
  if (backends::bf16_gemm::available()) {
    const std::vector<float> few = product(dy.slice(1, 0, 40).transpose(0, 1), x).to_vector<float>();
    EXPECT_TRUE(std::equal(few.begin(), few.end(), grads[0].begin()));
    EXPECT_EQ(product(dy.transpose(0, 1).contiguous(), x).to_vector<float>(), grads[0]);
  }
  EXPECT_TRUE(matches_reference(product(dy.transpose(0, 1), x), testing::tolerance(F32, 517)));
  EXPECT_NE(metrics().report().find("bf16 flops"), std::string::npos);
}

// The packing buffers of the bfloat16 products (B as pairs of depths, A by columns as pairs) are
// the launching thread's, reused between launches without being cleared (cpu::launch_buffer): the
// packing writes every element the products read, the zero halves past an odd K and the zero
// columns past N included. After products whose operands were NaN had filled those buffers,
// smaller products with odd K and edge columns give the bits they gave before, on 1, 2 and 3
// threads (a packing that left the zero half past an odd K unwritten reads the NaN: 0 x NaN).
TEST(Autocast, PackingBuffersLeftWithNaNsDoNotReachLaterProducts) {
  if (!backends::bf16_gemm::available()) GTEST_SKIP() << "no AVX512-BF16: the products go through float32";
  Tensor a = random_tensor({7, 31}, BF16, 60), b = random_tensor({31, 17}, BF16, 61);  // B by rows, odd K
  Tensor bt = random_tensor({17, 31}, BF16, 62);                                          // B by columns
  Tensor dy = random_tensor({33, 21}, BF16, 63), x = random_tensor({33, 70}, BF16, 64);  // A by columns: pairs
  auto products = [&] {
    std::vector<float> all;
    for (const Tensor& t : {product(a, b), product(a, bt.transpose(0, 1)), product(dy.transpose(0, 1), x)}) {
      EXPECT_TRUE(matches_reference(t, testing::tolerance(F32, 33)));
      const std::vector<float> v = t.to_vector<float>();
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor na = full({64, 301}, nan).to(BF16), nb = full({301, 200}, nan).to(BF16), ny = full({301, 150}, nan).to(BF16);
  const int before = omp_get_max_threads();
  std::vector<std::vector<float>> runs;
  for (int th : {1, 2, 3}) {
    omp_set_num_threads(th);
    runs.push_back(products());
    const std::vector<float> poisoned = product(na, nb).to_vector<float>();  // B packed by rows: NaN
    EXPECT_TRUE(std::isnan(poisoned[0]));
    product(na, nb.transpose(0, 1).contiguous().transpose(0, 1)).to_vector<float>();  // B by columns
    product(ny.transpose(0, 1), nb).to_vector<float>();                              // A as pairs
    const std::vector<float> after = products();
    EXPECT_TRUE(after == runs.back()) << th << " threads";
  }
  omp_set_num_threads(before);
  EXPECT_TRUE(runs[1] == runs[0]);
  EXPECT_TRUE(runs[2] == runs[0]);
}

// TESSERA_DUMP=fused shows the products as bfloat16 Gemm Steps and nothing else in 16 bits
// but the casts that feed them.
TEST(Autocast, DumpShowsBfloat16Products) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("tessera_autocast_dump_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  runtime::set_dump_config("fused", dir.string());
  {
    nn::Linear l(32, 48);
    Tensor x = random_tensor({40, 32}, F32, 5);
    Autocast ac{BF16};
    Tensor y = relu(l(x));
    sync();
  }
  runtime::clear_dump_config();
  std::string text;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream in(e.path());
    text += std::string(std::istreambuf_iterator<char>(in), {});
  }
  fs::remove_all(dir);
  EXPECT_NE(text.find("gemm f32[40, 48]"), std::string::npos) << text;
  EXPECT_NE(text.find("product: bfloat16 operands, float32 accumulation"), std::string::npos) << text;
  // Each operand: a bfloat16 slot, or (the cpu: a cast folded into the product) a float32 one
  // rounded as the product reads it.
  EXPECT_TRUE(text.find("(bf16)") != std::string::npos || text.find("(f32 rounded to bf16 as read)") != std::string::npos)
      << text;
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// ---- Dynamic loss scaling ----
// A float16 autocast step with GradScaler moves the parameters exactly as the unscaled step does
// (power-of-two scales); a planted inf gradient skips the step, leaves the parameters alone and
// halves the scale; the next finite step runs; growth after growth_interval good steps.
TEST(GradScaler, SkipsStepsWithInfGradientsAndRecovers) {
  auto run = [](bool scaled, const std::vector<float>& poison) {
    manual_seed(3);
    nn::Linear l(6, 3);
    optim::SGD opt(l.parameters(), {.lr = 0.1});
    optim::GradScaler scaler({.init_scale = 1024, .growth_interval = 2});
    std::vector<std::vector<float>> weights;
    std::vector<double> scales;
    std::vector<bool> stepped;
    for (size_t i = 0; i < poison.size(); ++i) {
      std::vector<float> xs = random_tensor({4, 6}, F32, uint32_t(20 + i)).to_vector<float>();
      xs[0] = poison[i] != 0 ? poison[i] : xs[0];
      Tensor x = from_vector(xs, {4, 6});
      Tensor loss;
      {
        Autocast ac{F16};
        loss = (l(x) * l(x)).mean();
      }
      opt.zero_grad();
      if (scaled) {
        scaler.scale(loss).backward();
        stepped.push_back(scaler.step(opt));
        scaler.update();
      } else {
        loss.backward();
        opt.step();
      }
      weights.push_back(l.weight.to_vector<float>());
      scales.push_back(scaler.get_scale());
    }
    return std::make_tuple(weights, scales, stepped, scaler.skipped_steps());
  };
  const float inf = std::numeric_limits<float>::infinity();
  auto [plain, unused_scales, unused_steps, unused_skips] = run(false, {0, 0, 0});
  auto [same, s0, st0, sk0] = run(true, {0, 0, 0});
  EXPECT_EQ(plain, same) << "power-of-two scaling must not change the update";
  EXPECT_EQ(s0, (std::vector<double>{1024, 2048, 2048}));  // grown after 2 good steps
  EXPECT_EQ(sk0, 0);
  auto [w, s, st, skipped] = run(true, {0, inf, 0});
  EXPECT_EQ(st, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(skipped, 1);
  EXPECT_EQ(w[1], w[0]) << "the inf step must leave the parameters alone";
  EXPECT_NE(w[2], w[1]) << "the next finite step runs";
  for (float v : w[2]) EXPECT_TRUE(std::isfinite(v));
  EXPECT_EQ(s, (std::vector<double>{1024, 512, 512}));  // backoff, then the growth count restarts
  EXPECT_THROW(optim::GradScaler({.init_scale = 0}), Error);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Token sequences of a fixed random bigram chain over `vocab` symbols (each symbol has 3 likely
// successors): learnable, with held-out sequences from the same chain.
std::vector<int64_t> bigram_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> out(static_cast<size_t>(n));
  uint64_t s = seed, t = 7;
  auto next = [](uint64_t& x) { return (x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  int64_t cur = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint64_t table = t;  // successor k of symbol c: a fixed hash of (c, k)
    int64_t k = int64_t(next(s) % 4);
    cur = k == 3 ? int64_t(next(s) % uint64_t(vocab)) : int64_t((uint64_t(cur) * 31 + uint64_t(k) * 17 + table) % uint64_t(vocab));
    out[size_t(i)] = cur;
  }
  return out;
}

// A small GPT trained the same steps from the same weights in float32 and under bfloat16 autocast
// reaches the same held-out loss (evaluated in float32) within 2%, and learns (well under
// ln(vocab)). bench/autocast_gpt.sh runs the benchmark GPT 400 steps for the 1% figure.
TEST(Autocast, SmallGptTrainsAsInFloat32) {
  const int64_t V = 24, B = 8, T = 16, steps = 80;
  nn::GPTConfig cfg{.vocab = V, .block = T, .embd = 32, .heads = 2, .layers = 1};
  auto batch = [&](int64_t i, uint64_t base) {
    std::vector<int64_t> tok = bigram_tokens(B * (T + 1), V, base + uint64_t(i));
    std::vector<int64_t> x, y;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) x.push_back(tok[size_t(b * (T + 1) + t)]), y.push_back(tok[size_t(b * (T + 1) + t + 1)]);
    TensorOptions o{DType::Int64, Device("cpu")};
    return std::make_pair(from_vector(x, {B, T}, o), from_vector(y, {B, T}, o));
  };
  auto train = [&](std::optional<DType> dtype) {
    manual_seed(11);
    nn::GPT model(cfg);
    optim::AdamW opt(model.parameters(), {.lr = 3e-3, .weight_decay = 0.0});
    for (int64_t s = 0; s < steps; ++s) {
      auto [x, y] = batch(s, 1000);
      Tensor loss;
      {
        std::optional<Autocast> ac;
        if (dtype) ac.emplace(*dtype);
        loss = model.loss(x, y);
      }
      loss.backward();
      opt.step();
      opt.zero_grad();
      sync();
    }
    NoGradGuard ng;
    double held_out = 0;
    for (int64_t i = 0; i < 4; ++i) {
      auto [x, y] = batch(i, 900000);
      held_out += model.loss(x, y).item() / 4;
    }
    return held_out;
  };
  const int64_t graphs = metrics().graphs_compiled;
  const double f32 = train(std::nullopt), bf16 = train(BF16);
  std::printf("[autocast] held-out loss after %lld steps: float32 %.6f, bfloat16 autocast %.6f (%+.3f%%); %lld graphs compiled\n",
              (long long)steps, f32, bf16, 100 * (bf16 / f32 - 1), (long long)(metrics().graphs_compiled - graphs));
  EXPECT_LT(f32, 0.7 * std::log(double(V)));
  EXPECT_NEAR(bf16 / f32, 1.0, 0.02);
}

}  // namespace
}  // namespace tessera
