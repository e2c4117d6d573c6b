// Convolution, pooling and batch norm. The conv primitive on the CPU backend against the float64
// reference and finite differences for every option (stride, padding including negative, lhs
// and rhs dilation, groups; 1-, 2- and 3-d), hand-computed values, the transposed convolution,
// max/avg/adaptive pooling (ties: the first maximum takes the gradient) and batch norm in
// training and eval mode with its running statistics.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>

#include "runtime/compile_options.h"
#include "test_util.h"
#include "tessera/nn.h"
#include "tessera/profiler.h"
#include "tessera/tessera.h"

namespace tessera {
namespace {

using testing::grad_check;
using testing::make_tensor;
using testing::matches_reference;
using testing::random_tensor;
using V = std::vector<double>;
using Ts = std::vector<Tensor>;
constexpr DType F32 = DType::Float32, F64 = DType::Float64;

struct ConvCase {
  const char* name;
  Shape x, w;
  ConvGeneralOptions o;
};

using I = std::vector<int64_t>;
ConvGeneralOptions O(I stride = {}, I lo = {}, I hi = {}, I lhs_dilation = {}, I rhs_dilation = {}, int64_t groups = 1) {
  return {stride, lo, hi, lhs_dilation, rhs_dilation, groups};
}

std::vector<ConvCase> conv_cases() {
  return {
      {"1d plain", {2, 3, 9}, {4, 3, 3}, O()},
      {"1d stride", {2, 3, 10}, {4, 3, 3}, O({3})},
      {"1d padding", {1, 2, 5}, {3, 2, 4}, O({1}, {2}, {1})},
      {"1d negative padding", {1, 2, 8}, {3, 2, 2}, O({1}, {-1}, {-2})},
      {"1d lhs dilation", {2, 2, 4}, {3, 2, 3}, O({1}, {2}, {2}, {3})},
      {"1d rhs dilation", {1, 3, 11}, {2, 3, 3}, O({2}, {0}, {0}, {1}, {3})},
      {"1d groups", {2, 6, 7}, {9, 2, 3}, O({1}, {1}, {1}, {1}, {1}, 3)},
      {"2d plain", {2, 3, 5, 5}, {2, 3, 3, 2}, O()},
      {"2d stride and padding", {2, 2, 7, 7}, {3, 2, 3, 3}, O({2, 1}, {1}, {1})},
      {"2d asymmetric padding", {1, 2, 6, 5}, {2, 2, 2, 3}, O({1, 2}, {0, 2}, {1, 0})},
      {"2d lhs dilation", {1, 2, 4, 3}, {3, 2, 3, 3}, O({1}, {2}, {2}, {2, 3})},
      {"2d rhs dilation", {1, 2, 9, 8}, {2, 2, 3, 3}, O({1}, {1}, {1}, {1}, {2, 3})},
      {"2d depthwise", {1, 4, 6, 6}, {4, 1, 3, 3}, O({1}, {1}, {1}, {1}, {1}, 4)},
      {"2d every option", {2, 4, 7, 6}, {6, 2, 3, 2}, O({2, 1}, {1, 2}, {2, -1}, {2, 1}, {1, 2}, 2)},
      {"2d 1x1", {2, 4, 4, 5}, {3, 4, 1, 1}, O()},
      {"2d 1x1 stride 2", {2, 4, 5, 5}, {3, 4, 1, 1}, O({2})},
      {"3d", {1, 2, 4, 4, 3}, {2, 2, 2, 2, 2}, O({1}, {1}, {0})},
      // Strided convs, whose input gradient runs by phases (one conv per residue of the stride):
      // the ResNet's 3x3 stride 2 on even and odd sizes, groups, a stride past the kernel (some
      // residues reached by no tap), negative and asymmetric padding, 3d.
      {"2d 3x3 stride 2 even", {2, 3, 8, 8}, {4, 3, 3, 3}, O({2}, {1}, {1})},
      {"2d 3x3 stride 2 odd, groups", {2, 4, 7, 9}, {6, 2, 3, 3}, O({2}, {1}, {1}, {}, {}, 2)},
      {"1d stride 3 past the kernel", {2, 2, 11}, {3, 2, 2}, O({3}, {1}, {2})},
      {"1d stride 2 kernel 5 negative padding", {1, 2, 13}, {2, 2, 5}, O({2}, {-1}, {3})},
      {"2d strides 3 and 2, asymmetric padding", {1, 2, 10, 7}, {3, 2, 4, 3}, O({3, 2}, {2, 0}, {0, 2})},
      {"3d stride 2", {1, 2, 5, 4, 6}, {2, 2, 3, 2, 3}, O({2}, {1}, {1})},
  };
}

TEST(Conv, ForwardMatchesReferenceForEveryOption) {
  uint32_t seed = 1;
  for (const ConvCase& c : conv_cases())
    for (DType t : {F32, F64}) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(t));
      Tensor x = random_tensor(c.x, t, seed++), w = random_tensor(c.w, t, seed++);
      EXPECT_TRUE(matches_reference(conv_general(x, w, c.o)));
    }
}

// Columns larger than a pool chunk (64 Ki elements): one image's are packed as a whole, in chunks
// spread over the threads; a batch's per image, inside each GEMM task.
TEST(Conv, LargeColumnsMatchReference) {
  uint32_t seed = 50;
  for (Shape xs : {Shape{1, 3, 130, 130}, Shape{3, 3, 70, 70}}) {
    SCOPED_TRACE(shape_str(xs));
    Tensor x = random_tensor(xs, F32, seed++), w = random_tensor({2, 3, 3, 3}, F32, seed++);
    EXPECT_TRUE(matches_reference(conv_general(x, w, O({1}, {1}, {1}))));
  }
}

// Products for the CPU backend's window kernel (backends/cpu/window_gemm) in each of its forms:
// outputs in several passes of 64 with a partial last one, groups, strides and dilation; one
// image whose positions are split over tasks; a kernel longer than the output (the
// kernel-gradient form: the batch folded into the columns, K in summed chunks); shallow products
// (K < 32) with the positions as vector lanes. ctest also
// runs this binary with TESSERA_CPU_GEMM=blas, so the same references hold for the BLAS path.
TEST(Conv, WindowProductsMatchReference) {
  uint32_t seed = 70;
  const std::vector<ConvCase> cases = {
      {"70 outputs, groups, stride, dilation", {3, 20, 9, 11}, {70, 10, 3, 2}, O({1, 2}, {1}, {2}, {1}, {2, 1}, 2)},
      {"one image, positions in chunks", {1, 8, 40, 40}, {20, 8, 3, 3}, O({1}, {1}, {1})},
      {"33 outputs, 1-d", {5, 16, 30}, {33, 16, 5}, O({1}, {2}, {2})},
      {"kernel longer than the output", {3, 8, 20, 20}, {5, 8, 17, 17}, O()},
      {"kernel gradient shape", {2, 64, 16, 16}, {32, 64, 14, 14}, O()},
      // The shallow form (K < 32, positions as lanes): two 8-wide output rows per vector (the
      // small CNN's conv1); rows of 9 split over pieces, 20 outputs in tiles of 16 and 4; groups
      // (a distinct A each); 1-d rows of 30.
      {"shallow, one channel, 8x8", {5, 1, 8, 8}, {4, 1, 3, 3}, O({1}, {1}, {1})},
      {"shallow, rows of 9, 20 outputs", {3, 2, 11, 11}, {20, 2, 3, 3}, O()},
      {"shallow, groups", {2, 4, 12, 12}, {6, 2, 3, 3}, O({1}, {1}, {1}, {1}, {1}, 2)},
      {"shallow, 1-d", {3, 3, 32}, {5, 3, 3}, O()},
  };
  for (const ConvCase& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor x = random_tensor(c.x, F32, seed++), w = random_tensor(c.w, F32, seed++);
    EXPECT_TRUE(matches_reference(conv_general(x, w, c.o)));
  }
}

// The CPU backend's products are fixed by the shape (blocks, K chunks, their order), not by the
// thread count: the same bits with 1 and 3 threads.
TEST(Conv, ResultsDoNotDependOnTheThreadCount) {
  const int threads = omp_get_max_threads();
  const std::vector<ConvCase> cases = {
      {"per image", {9, 20, 9, 11}, {70, 20, 3, 2}, O({1}, {1}, {1})},
      {"one image, positions in chunks", {1, 8, 40, 40}, {20, 8, 3, 3}, O({1}, {1}, {1})},
      {"kernel gradient shape", {2, 64, 16, 16}, {32, 64, 14, 14}, O()},
      {"kernel gradient shape, 4 groups", {2, 64, 16, 16}, {32, 16, 14, 14}, O({1}, {0}, {0}, {1}, {1}, 4)},
      {"shallow, one channel", {9, 1, 28, 28}, {32, 1, 3, 3}, O({1}, {1}, {1})},
  };
  uint32_t seed = 90;
  for (const ConvCase& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor x = random_tensor(c.x, F32, seed++), w = random_tensor(c.w, F32, seed++);
    std::vector<std::vector<float>> got;
    for (int t : {1, 3}) {
      omp_set_num_threads(t);
      got.push_back(conv_general(x, w, c.o).to_vector<float>());
    }
    omp_set_num_threads(threads);
    EXPECT_EQ(got[0], got[1]);
  }
}

TEST(Conv, GradientsMatchFiniteDifferences) {
  uint32_t seed = 100;
  for (const ConvCase& c : conv_cases()) {
    SCOPED_TRACE(c.name);
    Tensor x = random_tensor(c.x, F64, seed++), w = random_tensor(c.w, F64, seed++);
    ConvGeneralOptions o = c.o;
    EXPECT_TRUE(grad_check([o](const Ts& a) { return conv_general(a[0], a[1], o); }, {x, w}));
  }
}

TEST(Conv, HandComputedValues) {
  Tensor x = make_tensor({1, 2, 3, 4}, {1, 1, 4}, F64);
  Tensor w = make_tensor({1, 0, -1}, {1, 1, 3}, F64);
  EXPECT_EQ(conv1d(x, w).to_vector<double>(), (V{-2, -2}));
  EXPECT_EQ(conv1d(x, w, Tensor(), 1, 1).to_vector<double>(), (V{-2, -2, -2, 3}));
  // lhs dilation 2: [1, 0, 2, 0, 3, 0, 4] correlated with [1, 1].
  Tensor ones2 = make_tensor({1, 1}, {1, 1, 2}, F64);
  EXPECT_EQ(conv_general(x, ones2, O({1}, {0}, {0}, {2})).to_vector<double>(), (V{1, 2, 2, 3, 3, 4}));
  // A stride-2 transposed convolution spreads each pixel over a 2x2 block.
  Tensor img = make_tensor({1, 2, 3, 4}, {1, 1, 2, 2}, F64);
  Tensor k = make_tensor({1, 1, 1, 1}, {1, 1, 2, 2}, F64);
  EXPECT_EQ(conv_transpose2d(img, k, Tensor(), {2}).to_vector<double>(),
            (V{1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}));
  // Bias: one per output channel.
  Tensor w2 = make_tensor({1, 2}, {2, 1, 1}, F64);
  Tensor b = make_tensor({10, 20}, {2}, F64);
  EXPECT_EQ(conv1d(make_tensor({1, 2}, {1, 1, 2}, F64), w2, b).to_vector<double>(), (V{11, 12, 22, 24}));
}

// conv_transpose2d is the input gradient of conv2d: <conv2d(x, w), y> == <x, conv_transpose2d(y, w)>.
TEST(Conv, TransposeIsTheAdjointOfConv2d) {
  struct T {
    Shape x, w;
    std::vector<int64_t> stride, padding, dilation;
    int64_t groups;
  };
  for (const T& c : {T{{2, 4, 9, 8}, {6, 2, 3, 3}, {2, 1}, {1, 0}, {1, 2}, 2}, T{{1, 3, 7, 7}, {2, 3, 2, 3}, {3}, {1}, {1}, 1}}) {
    Tensor x = random_tensor(c.x, F64, 7), w = random_tensor(c.w, F64, 8);
    Tensor y = conv2d(x, w, Tensor(), c.stride, c.padding, c.dilation, c.groups);
    Tensor g = random_tensor(y.shape(), F64, 9);
    // output_padding recovers the input extent lost to the stride's floor.
    std::vector<int64_t> op;
    for (int d = 0; d < 2; ++d) {
      int64_t s = c.stride.size() > 1 ? c.stride[d] : c.stride[0], p = c.padding.size() > 1 ? c.padding[d] : c.padding[0];
      int64_t dl = c.dilation.size() > 1 ? c.dilation[d] : c.dilation[0];
      op.push_back(c.x[2 + d] - ((y.shape()[2 + d] - 1) * s - 2 * p + dl * (c.w[2 + d] - 1) + 1));
    }
    Tensor xt = conv_transpose2d(g, w, Tensor(), c.stride, c.padding, op, c.groups, c.dilation);
    ASSERT_EQ(xt.shape(), x.shape());
    double lhs = (y * g).sum().item(), rhs = (x * xt).sum().item();
    EXPECT_NEAR(lhs, rhs, 1e-9 * std::fabs(lhs));
  }
  Tensor x = random_tensor({2, 4, 5, 5}, F64, 10), w = random_tensor({4, 3, 3, 2}, F64, 11);
  EXPECT_TRUE(matches_reference(conv_transpose2d(x, w, Tensor(), {2, 1}, {1, 0}, {1, 0}, 2, {1, 2})));
  EXPECT_TRUE(grad_check([](const Ts& a) { return conv_transpose2d(a[0], a[1], Tensor(), {2, 1}, {1, 0}, {1, 0}, 2, {1, 2}); },
                         {x, w}));
}

TEST(Conv, BadInputIsAClearError) {
  Tensor x = zeros({2, 3, 8, 8}), w = zeros({4, 2, 3, 3});
  std::string m = testing::error_message([&] { conv2d(x, w); });
  EXPECT_EQ(m.rfind("[conv2d] input float32[2, 3, 8, 8] has 3 channels", 0), 0u) << m;
  m = testing::error_message([&] { conv2d(x, zeros({4, 3, 9, 3})); });
  EXPECT_NE(m.find("larger than the padded input"), std::string::npos) << m;
  m = testing::error_message([&] { conv2d(zeros({3, 8, 8}), zeros({4, 3, 3, 3})); });
  EXPECT_EQ(m.rfind("[conv2d] expects input [N, C, H, W]", 0), 0u) << m;
  m = testing::error_message([&] { conv2d(zeros({2, 2, 8, 8}), zeros({3, 1, 3, 3}), Tensor(), {1}, {1}, {1}, 2); });
  EXPECT_NE(m.find("not divisible by groups=2"), std::string::npos) << m;
  m = testing::error_message([&] { conv2d(x, zeros({4, 3, 3, 3}), zeros({3})); });
  EXPECT_EQ(m.rfind("[conv2d] bias float32[3] must be [4]", 0), 0u) << m;
  {
    Scope s("net.conv1");
    m = testing::error_message([&] { conv2d(x, zeros({4, 3, 3, 3}), Tensor(), {0}); });
    EXPECT_NE(m.find("(in scope 'net.conv1')"), std::string::npos) << m;
  }
  m = testing::error_message([&] { max_pool2d(zeros({1, 1, 4, 4}), {2}, {2}, {2}); });
  EXPECT_EQ(m.rfind("[max_pool2d] padding must be between 0 and half the kernel", 0), 0u) << m;
}

TEST(Pool, MaxPoolMatchesReferenceAndFiniteDifferences) {
  struct P {
    Shape x;
    std::vector<int64_t> k, s, p;
  };
  uint32_t seed = 300;
  for (const P& c : {P{{2, 3, 6, 6}, {2}, {}, {0}}, P{{1, 2, 7, 7}, {2}, {}, {0}}, P{{2, 2, 7, 6}, {3}, {2}, {1}},
                     P{{1, 3, 5, 8}, {2, 3}, {1, 2}, {1, 1}}}) {
    SCOPED_TRACE(shape_str(c.x) + " k" + shape_str(c.k));
    Tensor x = random_tensor(c.x, F64, seed++);
    EXPECT_TRUE(matches_reference(max_pool2d(x, c.k, c.s, c.p)));
    P k = c;
    EXPECT_TRUE(grad_check([k](const Ts& a) { return max_pool2d(a[0], k.k, k.s, k.p); }, {x}));
  }
  Tensor x = make_tensor({1, 5, 2, 0, 3, 4, 9, 8, -1, 6, 7, 7, 2, 2, 2, 3}, {1, 1, 4, 4}, F32);
  EXPECT_EQ(max_pool2d(x, {2}).to_vector<double>(), (V{5, 9, 6, 7}));
  EXPECT_EQ(max_pool2d(x.reshape({1, 4, 4}), {2}).shape(), (Shape{1, 2, 2}));
}

// With ties the gradient goes to the first maximum of each window (row-major), as PyTorch's.
TEST(Pool, MaxPoolTiesSendTheGradientToTheFirstIndex) {
  Tensor x = ones({1, 1, 2, 4}, {F64}).requires_grad_();
  max_pool2d(x, {2}).sum().backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (V{1, 0, 1, 0, 0, 0, 0, 0}));
  Tensor y = ones({1, 1, 2, 3}, {F64}).requires_grad_();
  max_pool2d(y, {2}, {1}).sum().backward();  // overlapping windows: each takes its own first element
  EXPECT_EQ(y.grad().to_vector<double>(), (V{1, 1, 0, 0, 0, 0}));
}

TEST(Pool, AveragePooling) {
  Tensor x = make_tensor({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3}, F64);
  EXPECT_EQ(avg_pool2d(x, {2}, {1}).to_vector<double>(), (V{3, 4, 6, 7}));
  // Padding 1, stride 2: corners see one element (of 4 counted, or of 1 without the pad).
  EXPECT_EQ(avg_pool2d(x, {2}, {2}, {1}).to_vector<double>(), (V{0.25, 1.25, 2.75, 7}));
  EXPECT_EQ(avg_pool2d(x, {2}, {2}, {1}, false).to_vector<double>(), (V{1, 2.5, 5.5, 7}));
  Tensor r = random_tensor({2, 3, 7, 6}, F64, 400);
  EXPECT_TRUE(matches_reference(avg_pool2d(r, {3, 2}, {2, 1}, {1, 1}, false)));
  EXPECT_TRUE(grad_check([](const Ts& a) { return avg_pool2d(a[0], {3, 2}, {2, 1}, {1, 1}, false); }, {r}));
}

TEST(Pool, AdaptiveAveragePoolingUsesPyTorchWindows) {
  Tensor x = random_tensor({2, 3, 5, 7}, F64, 500);
  Tensor y = adaptive_avg_pool2d(x, {3, 2});
  ASSERT_EQ(y.shape(), (Shape{2, 3, 3, 2}));
  V xv = x.to_vector<double>(), yv = y.to_vector<double>(), want;
  for (int64_t nc = 0; nc < 6; ++nc)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        int64_t h0 = i * 5 / 3, h1 = ((i + 1) * 5 + 2) / 3, w0 = j * 7 / 2, w1 = ((j + 1) * 7 + 1) / 2;
        double s = 0;
        for (int64_t h = h0; h < h1; ++h)
          for (int64_t w = w0; w < w1; ++w) s += xv[size_t(nc * 35 + h * 7 + w)];
        want.push_back(s / double((h1 - h0) * (w1 - w0)));
      }
  EXPECT_TRUE(testing::all_close(yv, want, 1e-12));
  EXPECT_TRUE(grad_check([](const Ts& a) { return adaptive_avg_pool2d(a[0], {3, 2}); }, {x}));
  EXPECT_TRUE(testing::all_close(adaptive_avg_pool2d(x, {1}).to_vector<double>(), mean(x, {2, 3}).to_vector<double>(), 1e-12));
}

TEST(BatchNorm, TrainingNormalizesWithBatchStatisticsAndUpdatesRunningOnes) {
  Tensor x = random_tensor({4, 3, 2, 2}, F64, 600, -2, 3);
  Tensor rm = zeros({3}, {F64}), rv = ones({3}, {F64});
  Tensor w = make_tensor({1, 2, 3}, {3}, F64), b = make_tensor({0, 1, -1}, {3}, F64);
  Tensor y = batch_norm(x, rm, rv, w, b, true, 0.1, 1e-5);
  V xv = x.to_vector<double>(), yv = y.to_vector<double>();
  for (int64_t c = 0; c < 3; ++c) {
    double s = 0, ss = 0;
    for (int64_t n = 0; n < 4; ++n)
      for (int64_t k = 0; k < 4; ++k) s += xv[size_t(n * 12 + c * 4 + k)];
    double mu = s / 16;
    for (int64_t n = 0; n < 4; ++n)
      for (int64_t k = 0; k < 4; ++k) ss += std::pow(xv[size_t(n * 12 + c * 4 + k)] - mu, 2);
    double var = ss / 16;
    for (int64_t n = 0; n < 4; ++n)
      for (int64_t k = 0; k < 4; ++k) {
        size_t i = size_t(n * 12 + c * 4 + k);
        EXPECT_NEAR(yv[i], (xv[i] - mu) / std::sqrt(var + 1e-5) * double(c + 1) + double(c == 0 ? 0 : c == 1 ? 1 : -1), 1e-12);
      }
    EXPECT_NEAR(rm.to_vector<double>()[size_t(c)], 0.1 * mu, 1e-12);
    EXPECT_NEAR(rv.to_vector<double>()[size_t(c)], 0.9 + 0.1 * var * 16 / 15, 1e-12);
  }
  EXPECT_TRUE(grad_check([](const Ts& a) { return batch_norm(a[0], Tensor(), Tensor(), a[1], a[2], true); }, {x, w, b}));
}

TEST(BatchNorm, EvalUsesRunningStatistics) {
  Tensor x = random_tensor({5, 2, 3}, F64, 700);
  Tensor rm = make_tensor({0.5, -1}, {2}, F64), rv = make_tensor({4, 0.25}, {2}, F64);
  Tensor y = batch_norm(x, rm, rv, Tensor(), Tensor(), false, 0.1, 0);
  V xv = x.to_vector<double>(), yv = y.to_vector<double>();
  for (size_t i = 0; i < xv.size(); ++i) {
    size_t c = (i / 3) % 2;
    EXPECT_NEAR(yv[i], c == 0 ? (xv[i] - 0.5) / 2 : (xv[i] + 1) / 0.5, 1e-12);
  }
  EXPECT_EQ(rm.to_vector<double>(), (V{0.5, -1}));  // eval never updates them
  EXPECT_TRUE(grad_check([rm, rv](const Ts& a) { return batch_norm(a[0], rm, rv, Tensor(), Tensor(), false); }, {x}));
}

// A batch norm's training forward and backward against closed forms in float64 written here:
// y = xhat w + b with xhat = (x - mu) / sqrt(var + eps), and for the loss sum(y r): db = sum r,
// dw = sum r xhat, dx = w / sqrt(var + eps) (r - mean r - xhat mean(r xhat)), the running
// statistics after one update. The input's mean is ~100 times its spread (statistics formed as
// E[x^2] - E[x]^2 would lose about four digits). On the cpu the statistics are one Reduce Step
// (two sums over the input) and the backward's per-channel sums one more (two sums over the
// gradient and the input; 7 Reduce Steps before: the two-pass statistics and a backward whose
// five sums chained), 4 with the merge pass off; the same bits at 1, 2 and 3 threads.
TEST(BatchNorm, TrainingStatisticsAndGradientsAreOneReducePassEachAndMatchFloat64) {
  const int64_t N = 6, C = 5, H = 7, W = 9, P = N * H * W;
  const double eps = 1e-5;
  auto run = [&](int64_t* reduces) {
    Tensor x = random_tensor({N, C, H, W}, F32, 800, 99, 101).requires_grad_();
    Tensor w = random_tensor({C}, F32, 801, 0.5, 1.5).requires_grad_(), b = random_tensor({C}, F32, 802).requires_grad_();
    Tensor r = random_tensor({N, C, H, W}, F32, 803);
    Tensor rm = zeros({C}), rv = ones({C});
    Profiler prof;
    Tensor y = batch_norm(x, rm, rv, w, b, true, 0.1, eps);
    (y * r).sum().backward();
    std::vector<Tensor> outs{y, x.grad(), w.grad(), b.grad(), rm, rv};
    tessera::sync();
    prof.stop();
    *reduces = 0;
    for (const ProfileEvent& e : prof.events()) *reduces += e.type == "step" && e.kind == "reduce";
    std::vector<std::vector<double>> v;
    for (const Tensor& t : outs) v.push_back(t.to_vector<double>());
    return v;
  };
  const V xv = random_tensor({N, C, H, W}, F32, 800, 99, 101).to_vector<double>();
  const V wv = random_tensor({C}, F32, 801, 0.5, 1.5).to_vector<double>(), bv = random_tensor({C}, F32, 802).to_vector<double>();
  const V rv = random_tensor({N, C, H, W}, F32, 803).to_vector<double>();
  V y(xv.size()), dx(xv.size()), dw(size_t(C), 0.0), db(size_t(C), 0.0), rmean(size_t(C), 0.0), rvar(size_t(C), 0.0);
  for (int64_t c = 0; c < C; ++c) {
    auto at = [&](int64_t p) { return size_t((p / (H * W) * C + c) * H * W + p % (H * W)); };
    double mu = 0, var = 0, mr = 0, mrx = 0;
    for (int64_t p = 0; p < P; ++p) mu += xv[at(p)] / double(P);
    for (int64_t p = 0; p < P; ++p) var += (xv[at(p)] - mu) * (xv[at(p)] - mu) / double(P);
    const double is = 1 / std::sqrt(var + eps);
    for (int64_t p = 0; p < P; ++p) {
      const double xh = (xv[at(p)] - mu) * is;
      y[at(p)] = xh * wv[size_t(c)] + bv[size_t(c)];
      db[size_t(c)] += rv[at(p)], dw[size_t(c)] += rv[at(p)] * xh;
      mr += rv[at(p)] / double(P), mrx += rv[at(p)] * xh / double(P);
    }
    for (int64_t p = 0; p < P; ++p) dx[at(p)] = wv[size_t(c)] * is * (rv[at(p)] - mr - (xv[at(p)] - mu) * is * mrx);
    rmean[size_t(c)] = 0.1 * mu, rvar[size_t(c)] = 0.9 + 0.1 * var * double(P) / double(P - 1);
  }
  const int threads = omp_get_max_threads();
  std::vector<std::vector<std::vector<double>>> got;
  int64_t reduces = 0;
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    got.push_back(run(&reduces));
    EXPECT_EQ(reduces, 2) << t << " threads";
  }
  omp_set_num_threads(threads);
  EXPECT_EQ(got[0], got[1]);
  EXPECT_EQ(got[0], got[2]);
  const std::vector<V> want{y, dx, dw, db, rmean, rvar};
  const char* names[] = {"y", "dx", "dw", "db", "running_mean", "running_var"};
  for (size_t k = 0; k < want.size(); ++k) EXPECT_TRUE(testing::all_close(got[0][k], want[k], 2e-5)) << names[k];
  runtime::set_disabled_passes("merge");
  std::vector<std::vector<double>> unmerged = run(&reduces);
  runtime::set_disabled_passes("");
  EXPECT_EQ(reduces, 4);
  for (size_t k = 0; k < want.size(); ++k) EXPECT_TRUE(testing::all_close(unmerged[k], want[k], 2e-5)) << names[k];
}

}  // namespace
}  // namespace tessera
