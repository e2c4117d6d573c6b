// The CPU backend's native loops for float32 elementwise programs (backends/cpu/jit_x86): what
// they cover, and that they compute exactly what the interpreter computes. ctest also runs this
// binary with TESSERA_CPU_JIT=0, so the same exact references hold for the interpreter.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <omp.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cpu/jit_x86.h"
#include "backends/cpu/native_loops.h"
#include "backends/cpu/row_loops.h"
#include "backends/cpu/vmath.h"
#include "core/half.h"
#include "kernel_ir/step.h"
#include "tessera/tessera.h"
#include "test_util.h"
#include "cpu_jit_util.h"

extern char** environ;

using namespace tessera;
using kir::Code;
using kir::Instr;
using namespace cpu_jit_test;

namespace {

// The interpreter's rules: max/min are (x > y ? x : y) / (x < y ? x : y) with any NaN giving
// the default NaN, abs is (x < 0 ? -x : x), round is half to even.
float ref_max(float x, float y) { return std::isnan(x) || std::isnan(y) ? std::numeric_limits<float>::quiet_NaN() : x > y ? x : y; }
float ref_min(float x, float y) { return std::isnan(x) || std::isnan(y) ? std::numeric_limits<float>::quiet_NaN() : x < y ? x : y; }
float ref_abs(float x) { return x < 0.0f ? -x : x; }
// One rounding per op, as the backend computes: kept out of line, so that the compiler cannot
// contract a product and a sum of the reference into one fused multiply-add.
[[gnu::noinline]] float mul(float x, float y) { return x * y; }
[[gnu::noinline]] float add(float x, float y) { return x + y; }
float vexp(float x) {
  float r;
  vmath::vexp(&x, &r, 1);
  return r;
}
float bf16(float x) { return half::bf16_to_float(half::float_to_bf16(x)); }
float verf(float x) {
  float r;
  vmath::verf(&x, &r, 1);
  return r;
}

// What build_loops asks for when every load is dense and results are stored at the end.
std::unique_ptr<backends::jit::Loop> build(const std::vector<Instr>& prog, const std::vector<int>& results,
                                           bool stream = false) {
  backends::jit::Spec spec;
  spec.prog = &prog;
  spec.stride.assign(prog.size(), 1);
  spec.results = results;
  spec.early.assign(results.size(), 0);
  spec.stream = stream;
  return backends::jit::build(spec);
}

// Runs this binary's test `test` in a child process with `set` in its environment (and this one's,
// less variables starting with `drop` or GTEST_), its gtest report kept out of this one's; pid:
// the child's. Fails unless the child exits 0.
void run_child(const std::string& test, std::vector<std::string> set, const char* drop, pid_t& pid) {
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, drop, std::strlen(drop)) != 0 && std::strncmp(*e, "GTEST_", 6) != 0) set.push_back(*e);
  std::vector<char*> envp;
  for (std::string& e : set) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe", filter = "--gtest_filter=" + test;
  char* argv[] = {exe.data(), filter.data(), nullptr};
  posix_spawn_file_actions_t quiet;
  posix_spawn_file_actions_init(&quiet);
  posix_spawn_file_actions_addopen(&quiet, 1, "/dev/null", O_WRONLY, 0);
  ASSERT_EQ(posix_spawn(&pid, exe.c_str(), &quiet, nullptr, argv, envp.data()), 0);
  posix_spawn_file_actions_destroy(&quiet);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child run failed (status " << status << ")";
}

}  // namespace

TEST(CpuJit, EveryOpMatchesFloat32ArithmeticExactly) {
  // Sizes around the loop's 8 (AVX2) and 16 (AVX-512) positions and the backend's 1024-position tiles, and one large
  // enough for both threads.
  for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 1000, 1031, 70001}) {
    std::vector<float> xv = special_values(n), yv = special_values(n + 3);
    yv.erase(yv.begin(), yv.begin() + 3);  // y's special values meet x's ordinary ones and others
    for (int64_t i = 0; i < n; i += 5) yv[size_t(i)] = xv[size_t(i)];  // and equal ones
    Tensor x = from_vector<float>(xv, {n}), y = from_vector<float>(yv, {n});
    std::vector<int32_t> iv(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) iv[size_t(i)] = int32_t(i % 7) - 1;
    Tensor xi = from_vector<int32_t>(iv, {n}, {.dtype = DType::Int32});
    auto fs = [](double v) { return scalar_tensor(v); };
    auto is = [](double v) { return scalar_tensor(v, {.dtype = DType::Int32}); };
    // Each case one graph, fused into one Step over contiguous inputs: what the loops cover. Read
    // back once the case's temporaries are gone, so the Step's only output is the result.
    auto values = [](const std::function<Tensor()>& make) {
      Tensor t = make();
      return t.to_vector<float>();
    };
    std::vector<std::vector<float>> vals = {
        values([&] { return ((x * 1.5 + 0.25) - y) / (y + 3.0); }),
        values([&] { return maximum(x, y) + minimum(x * 2.0, y); }),
        values([&] { return abs(x) - neg(y); }),
        values([&] { return sqrt(abs(x) + 1.0) * sqrt(x); }),
        values([&] { return floor(x * 3.0) + ceil(y * 3.0) + round(x * 2.0); }),
        // every comparison's outcome visible (sums of +-1, +-2, +-4), NaNs included
        values([&] { return where(x > y, fs(1), fs(-1)) + where(x <= 0.5, fs(2), fs(-2)) + where(x != y, fs(4), fs(-4)); }),
        values([&] { return where(x == y, fs(1), fs(-1)) + where(x < -0.5, fs(2), fs(-2)) + where(x >= y, fs(4), fs(-4)); }),
        values([&] { return where(xi == is(2), fs(1), fs(-1)) + where(xi > is(3), fs(2), fs(-2)) + where(xi < is(1), fs(4), fs(-4)); }),
        values([&] { return where(x > y, x, y * 2.0) - where(xi == is(0), y, x); }),
        // exp and erf: vmath's functions (what the interpreter runs) to the bit, over the whole
        // range (x * 10: past exp's clamps and erf's regions), specials included
        values([&] { return exp(x * 10.0) + erf(y); }),
        values([&] { return erf(x * 0.7) * exp(neg(y)); }),
        // rounded to bfloat16 and back inside a program (autocast's gradients reaching AdamW)
        values([&] { return x.to(DType::BFloat16).to(DType::Float32) * 2.0 + (y * 3.0).to(DType::BFloat16).to(DType::Float32); }),
    };
    for (int64_t i = 0; i < n; ++i) {
      const float a = xv[size_t(i)], b = yv[size_t(i)];
      const float want[] = {
          (add(mul(a, 1.5f), 0.25f) - b) / (b + 3.0f),
          add(ref_max(a, b), ref_min(mul(a, 2.0f), b)),
          ref_abs(a) - (-b),
          mul(std::sqrt(ref_abs(a) + 1.0f), std::sqrt(a)),
          add(add(std::floor(mul(a, 3.0f)), std::ceil(mul(b, 3.0f))), std::nearbyint(mul(a, 2.0f))),
          float((a > b ? 1 : -1) + (a <= 0.5f ? 2 : -2) + (a != b ? 4 : -4)),
          float((a == b ? 1 : -1) + (a < -0.5f ? 2 : -2) + (a >= b ? 4 : -4)),
          float((iv[size_t(i)] == 2 ? 1 : -1) + (iv[size_t(i)] > 3 ? 2 : -2) + (iv[size_t(i)] < 1 ? 4 : -4)),
          (a > b ? a : mul(b, 2.0f)) - (iv[size_t(i)] == 0 ? b : a),
          add(vexp(mul(a, 10.0f)), verf(b)),
          mul(verf(mul(a, 0.7f)), vexp(-b)),
          add(mul(bf16(a), 2.0f), bf16(mul(b, 3.0f))),
      };
      for (size_t c = 0; c < vals.size(); ++c)
        ASSERT_TRUE(same(vals[c][size_t(i)], want[c]))
            << "case " << c << ", n " << n << ", i " << i << ": x " << a << ", y " << b << ": " << vals[c][size_t(i)]
            << " vs " << want[c];
    }
  }
}

TEST(CpuJit, RunsOverBroadcastAndPermutedInputsMatchFloat32Arithmetic) {
  // Loads constant along the run (a bias per row, per channel) or dense along only the last dims
  // (a transposed operand): the loop runs per run, with masked ends when a run is not a multiple
  // of 8 positions.
  for (Shape s : {Shape{5, 13}, Shape{3, 4, 7, 7}, Shape{2, 3, 16, 8}}) {
    const int64_t n = numel(s), c = s[1];
    std::vector<float> xv = special_values(n), bv = special_values(c + 5);
    bv.erase(bv.begin(), bv.begin() + 5);
    Tensor x = from_vector<float>(xv, s);
    Shape bs(s.size(), 1);
    bs[1] = c;  // one value per channel (dim 1), broadcast over the others
    Tensor b = from_vector<float>(bv, bs);
    const std::vector<float> got = (maximum(x * 2.0 + b, b) - 1.0).to_vector<float>();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t ch = (i / (n / s[0] / c)) % c;
      const float a = xv[size_t(i)], bb = bv[size_t(ch)];
      ASSERT_TRUE(same(got[size_t(i)], ref_max(add(mul(a, 2.0f), bb), bb) - 1.0f)) << shape_str(s) << ", i " << i;
    }
    if (s.size() != 4) continue;
    // x with its first two dims swapped, plus a dense tensor: x's load is dense along the last
    // two dims only.
    Shape ps = {s[1], s[0], s[2], s[3]};
    Tensor z = from_vector<float>(xv, ps);
    const std::vector<float> got_p = (x.permute({1, 0, 2, 3}) * 0.5 + z).to_vector<float>();
    const int64_t hw = s[2] * s[3];
    for (int64_t i = 0; i < n; ++i) {
      const int64_t c0 = i / (s[0] * hw), n0 = i / hw % s[0], r = i % hw;
      const float a = xv[size_t((n0 * s[1] + c0) * hw + r)];
      ASSERT_TRUE(same(got_p[size_t(i)], add(mul(a, 0.5f), xv[size_t(i)]))) << shape_str(s) << ", i " << i;
    }
  }
}

TEST(CpuJit, ReductionsOfAProgramMatchExactSums) {
  // A float32 Reduce runs its program through a loop over its own (kept-first) domain, tile by
  // tile, each tile in pieces along the runs. Values are multiples of 1/1024 under 16, so every
  // float64 partial sum is exact and any summation order gives the reference; a value taken from
  // the wrong position changes a sum (over all but the channel, or over the batch only) or a max.
  for (Shape s : {Shape{5, 3, 7, 9}, Shape{3, 4, 30, 30}}) {
    const int64_t n = numel(s), c = s[1], hw = s[2] * s[3];
    std::vector<float> xv(static_cast<size_t>(n)), bv(static_cast<size_t>(c));
    uint32_t r = 99;
    for (float& v : xv) r = r * 1664525u + 1013904223u, v = float(int32_t(r >> 8) % 8192) / 1024.0f;
    for (int64_t k = 0; k < c; ++k) bv[size_t(k)] = float(k) - 1.5f;
    Tensor x = from_vector<float>(xv, s), b = from_vector<float>(bv, {1, c, 1, 1});
    auto value = [&](int64_t i) {  // where(x + b > 0, (x + b) * 0.5, 0) at position i
      const float h = xv[size_t(i)] + bv[size_t(i / hw % c)];
      return h > 0 ? h * 0.5f : 0.0f;
    };
    auto relu_half = [&] { return where(x + b > 0.0, (x + b) * 0.5, scalar_tensor(0.0)); };
    const std::vector<float> per_channel = relu_half().sum({0, 2, 3}).to_vector<float>();
    const std::vector<float> per_pixel = relu_half().sum({0}).to_vector<float>();
    const std::vector<float> channel_max = relu_half().amax({0, 2, 3}).to_vector<float>();
    std::vector<double> want_c(size_t(c), 0.0), want_p(size_t(c * hw), 0.0);
    std::vector<float> want_m(size_t(c), -INFINITY);
    for (int64_t i = 0; i < n; ++i) {
      const float v = value(i);
      want_c[size_t(i / hw % c)] += v;
      want_p[size_t(i % (c * hw))] += v;
      want_m[size_t(i / hw % c)] = std::max(want_m[size_t(i / hw % c)], v);
    }
    for (int64_t k = 0; k < c; ++k) {
      EXPECT_EQ(per_channel[size_t(k)], float(want_c[size_t(k)])) << shape_str(s) << ", channel " << k;
      EXPECT_EQ(channel_max[size_t(k)], want_m[size_t(k)]) << shape_str(s) << ", channel " << k;
    }
    for (int64_t i = 0; i < c * hw; ++i) ASSERT_EQ(per_pixel[size_t(i)], float(want_p[size_t(i)])) << shape_str(s) << ", i " << i;
  }
}

TEST(CpuJit, ColumnSumsSplitTheirRowsIntoFixedChunksWithTheSameBitsOnAnyThreadCount) {
  // A Reduce over leading axes (a bias gradient) cuts its rows into chunks fixed by the shape and
  // adds their partials in chunk order. Exact values (multiples of 1/1024 under 16) must give the
  // exact sums and maxima, whatever the chunks ([1024, 128]: 4 chunks of one block; [300, 1500]: 13
  // chunks of two column blocks; [9, 5]: one); arbitrary values the same bits on 1, 2 and 3
  // threads, near the float64 sum; a NaN in the last chunk its column's sum and max; integers
  // exactly. Both a lone stored input (the interpreter's path) and an expression (the native
  // loop's) are summed.
  const int before = omp_get_max_threads();
  for (Shape s : {Shape{1024, 128}, Shape{300, 1500}, Shape{9, 5}}) {
    const int64_t R = s[0], K = s[1];
    std::vector<float> exact(size_t(R * K)), noisy(size_t(R * K));
    uint32_t r = 7;
    for (size_t i = 0; i < exact.size(); ++i) {
      r = r * 1664525u + 1013904223u;
      exact[i] = float(int32_t(r >> 8) % 16384) / 1024.0f;
      noisy[i] = float(int32_t(r >> 8) % 16384) / 1000.0f + 1e-3f;
    }
    Tensor xe = from_vector<float>(exact, s), xn = from_vector<float>(noisy, s);
    const std::vector<float> sum_e = xe.sum({0}).to_vector<float>(), max_e = xe.amax({0}).to_vector<float>();
    const std::vector<float> expr_e = (xe * 2.0 + 1.0).sum({0}).to_vector<float>();
    for (int64_t k = 0; k < K; ++k) {
      double want = 0, want_expr = 0;
      float want_max = -INFINITY;
      for (int64_t i = 0; i < R; ++i) {
        const float v = exact[size_t(i * K + k)];
        want += v, want_expr += double(v) * 2 + 1, want_max = std::max(want_max, v);
      }
      ASSERT_EQ(sum_e[size_t(k)], float(want)) << shape_str(s) << ", column " << k;
      ASSERT_EQ(expr_e[size_t(k)], float(want_expr)) << shape_str(s) << ", column " << k;
      ASSERT_EQ(max_e[size_t(k)], want_max) << shape_str(s) << ", column " << k;
    }
    {  // A NaN in the last row (the last chunk) reaches its column's sum and max, no other; integers sum exactly.
      std::vector<float> with_nan = exact;
      with_nan[size_t((R - 1) * K + K / 2)] = NAN;
      Tensor xq = from_vector<float>(with_nan, s);
      const std::vector<float> sq = xq.sum({0}).to_vector<float>(), mq = xq.amax({0}).to_vector<float>();
      for (int64_t k = 0; k < K; ++k) {
        ASSERT_EQ(std::isnan(sq[size_t(k)]), k == K / 2) << shape_str(s) << ", column " << k;
        ASSERT_EQ(std::isnan(mq[size_t(k)]), k == K / 2) << shape_str(s) << ", column " << k;
      }
      std::vector<int32_t> iv(exact.size());
      for (size_t i = 0; i < iv.size(); ++i) iv[i] = int32_t(exact[i] * 1024) - 8192;
      const std::vector<int64_t> si = from_vector<int32_t>(iv, s, {.dtype = DType::Int32}).sum({0}).to_vector<int64_t>();
      for (int64_t k = 0; k < K; ++k) {
        int64_t want = 0;
        for (int64_t i = 0; i < R; ++i) want += iv[size_t(i * K + k)];
        ASSERT_EQ(si[size_t(k)], want) << shape_str(s) << ", column " << k;
      }
    }
    std::vector<std::vector<float>> runs;
    for (int th : {1, 2, 3}) {
      omp_set_num_threads(th);
      runs.push_back(xn.sum({0}).to_vector<float>());
      const std::vector<float> e = (xn * 0.5 - 3.0).sum({0}).to_vector<float>();
      runs.back().insert(runs.back().end(), e.begin(), e.end());
    }
    omp_set_num_threads(before);
    EXPECT_EQ(runs[0], runs[1]) << shape_str(s);
    EXPECT_EQ(runs[0], runs[2]) << shape_str(s);
    for (int64_t k = 0; k < K; ++k) {
      double want = 0;
      for (int64_t i = 0; i < R; ++i) want += noisy[size_t(i * K + k)];
      EXPECT_NEAR(runs[0][size_t(k)], want, 1e-6 * std::abs(want)) << shape_str(s) << ", column " << k;
    }
  }
}

TEST(CpuJit, BuildsWhatItCoversAndNothingElse) {
  REQUIRE_LOOPS();
  std::vector<Instr> chain = {load(0), cnst(2.0), op(Code::Mul, 0, 1), op(Code::Abs, 2), op(Code::Max, 3, 0)};
  EXPECT_NE(build(chain, {4}), nullptr);
  EXPECT_NE(build(chain, {4, 2}, true), nullptr);  // two outputs, non-temporal stores

  std::vector<Instr> with_exp = chain;
  with_exp.push_back(op(Code::Exp, 4));
  with_exp.push_back(op(Code::Erf, 5));
#if defined(__FMA__)
  EXPECT_NE(build(with_exp, {6}), nullptr);  // exp and erf: vmath's, in the loop
#else
  EXPECT_EQ(build(with_exp, {6}), nullptr);  // without FMA (a sanitized build): the interpreter's
#endif
  std::vector<Instr> with_tanh = chain;
  with_tanh.push_back(op(Code::Tanh, 4));
  EXPECT_EQ(build(with_tanh, {5}), nullptr);  // tanh stays with the interpreter
  std::vector<Instr> f64 = {load(0), op(Code::Neg, 0)};
  f64[0].dtype = f64[1].dtype = DType::Float64;
  EXPECT_EQ(build(f64, {1}), nullptr);
  // R - 1 distinct constants (R vector registers: 16 ymm for AVX2, 32 zmm for AVX-512): read from
  // memory as second operands, they need no registers; as first operands (of a subtraction) they
  // do, more than there are.
  const int R = backends::jit::avx512() ? 32 : 16;
  std::vector<Instr> rhs = {load(0)}, lhs = {load(0)};
  for (int c = 0; c < R - 1; ++c) {
    rhs.push_back(cnst(c + 0.5)), rhs.push_back(op(Code::Sub, int(rhs.size()) - 2, int(rhs.size()) - 1));
    lhs.push_back(cnst(c + 0.5)), lhs.push_back(op(Code::Sub, int(lhs.size()) - 1, int(lhs.size()) - 2));
  }
  EXPECT_NE(build(rhs, {int(rhs.size()) - 1}), nullptr);
  EXPECT_EQ(build(lhs, {int(lhs.size()) - 1}), nullptr);
  std::vector<Instr> loads;  // R values live at once: more than the vector registers
  for (int l = 0; l < R; ++l) loads.push_back(load(l));
  loads.push_back(op(Code::Add, 0, 1));
  for (int l = 2; l < R; ++l) loads.push_back(op(Code::Add, int(loads.size()) - 1, l));
  EXPECT_EQ(build(loads, {int(loads.size()) - 1}), nullptr);
  loads.resize(size_t(R) - 2);  // R - 2 of them fit (a register for the tail's mask in AVX2's form)
  loads.push_back(op(Code::Add, 0, 1));
  for (int l = 2; l < R - 2; ++l) loads.push_back(op(Code::Add, int(loads.size()) - 1, l));
  EXPECT_NE(build(loads, {int(loads.size()) - 1}), nullptr);
}

TEST(CpuJit, ALoopOverTwentyInputsWithABroadcastAndTwoOutputs) {
  // 20 dense inputs (more than the pointer registers: the rest are loaded where used), one input
  // broadcast along the run, a result stored as soon as it is computed and one stored at the
  // end, over lengths with and without a masked last 1-7 positions, several runs per call.
  REQUIRE_LOOPS();
  std::vector<Instr> prog = {load(0)};
  for (int l = 1; l < 20; ++l) prog.push_back(load(l)), prog.push_back(op(Code::Add, int(prog.size()) - 2, int(prog.size()) - 1));
  const int sum = int(prog.size()) - 1;
  prog.push_back(load(20));  // the broadcast value
  prog.push_back(op(Code::Mul, sum, int(prog.size()) - 1));
  const int scaled = int(prog.size()) - 1;
  prog.push_back(op(Code::Sub, scaled, 0));
  backends::jit::Spec spec;
  spec.prog = &prog;
  spec.stride.assign(prog.size(), 1);
  spec.stride[size_t(sum + 1)] = 0;
  spec.results = {int(prog.size()) - 1, scaled};
  spec.early = {0, 1};
  auto loop = backends::jit::build(spec);
  ASSERT_NE(loop, nullptr);
  // 3 runs in one call: each input and output steps by a padded row of n + 2 floats, the
  // broadcast value by one float (a scale per run, read afresh per run).
  const int64_t rows = 3;
  for (int64_t n : {1, 7, 8, 13, 40, 43}) {
    const int64_t row = n + 2;
    std::vector<std::vector<float>> in(20, std::vector<float>(size_t(rows * row)));
    for (int l = 0; l < 20; ++l)
      for (int64_t i = 0; i < rows * row; ++i) in[size_t(l)][size_t(i)] = float(l * 100 + i) * 0.5f;
    const float scale[rows] = {0.25f, -2.0f, 3.0f};
    std::vector<float> out(size_t(rows * row), -1.0f), out2(size_t(rows * row), -1.0f);
    std::vector<const void*> ptrs;
    std::vector<int64_t> steps;
    for (int l : loop->loads()) {
      const bool b = prog[size_t(l)].input == 20;
      ptrs.push_back(b ? static_cast<const void*>(scale) : in[size_t(prog[size_t(l)].input)].data());
      steps.push_back(b ? 4 : row * 4);
    }
    ptrs.push_back(out.data());
    ptrs.push_back(out2.data());
    steps.push_back(row * 4), steps.push_back(row * 4);
    (*loop)(ptrs.data(), n, rows, steps.data());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = r * row; i < r * row + n; ++i) {
        float s = in[0][size_t(i)];
        for (int l = 1; l < 20; ++l) s += in[size_t(l)][size_t(i)];
        ASSERT_EQ(out2[size_t(i)], s * scale[r]) << "n " << n << ", run " << r << ", i " << i;
        ASSERT_EQ(out[size_t(i)], s * scale[r] - in[0][size_t(i)]) << "n " << n << ", run " << r << ", i " << i;
      }
      for (int64_t i = r * row + n; i < (r + 1) * row; ++i)  // the padding: untouched
        ASSERT_TRUE(out[size_t(i)] == -1.0f && out2[size_t(i)] == -1.0f) << "n " << n << ", run " << r << ", i " << i;
    }
  }
}

TEST(CpuJit, GatheredLoadsIntLanesAndLaneMaskLogicMatchScalarArithmetic) {
  // What a max-pooling window's program needs: loads with a stride along the run (gathered),
  // int32 where's and results, or / and of comparisons; constants read from memory (second
  // operands) and from registers (a where's false value, a subtraction's first operand).
  REQUIRE_LOOPS();
  auto typed = [](Instr I, DType t) { return I.dtype = t, I; };
  std::vector<Instr> prog = {
      load(0), load(1), cnst(0.0),                                        // 0 x (stride 2), 1 y (stride 3), 2
      typed(op(Code::Gt, 0, 1), DType::Bool), typed(op(Code::Ne, 0, 0), DType::Bool),  // 3, 4
      typed(op(Code::Max, 3, 4), DType::Bool),                            // 5: x > y or x is NaN
      typed(op(Code::Lt, 1, 2), DType::Bool), typed(op(Code::Min, 5, 6), DType::Bool),  // 6, 7: 5 and y < 0
      typed(cnst(7), DType::Int32), typed(cnst(-3), DType::Int32),        // 8, 9
      typed(op(Code::Where, 5, 8), DType::Int32),                         // 10: 5 ? 7 : -3
      op(Code::Where, 7, 0),                                              // 11: 7 ? x : y
      typed(load(2), DType::Int32),                                       // 12 z (dense)
      typed(op(Code::Gt, 10, 12), DType::Bool),                           // 13
      op(Code::Where, 13, 11),                                            // 14: 13 ? 11 : 0
      cnst(1.5), op(Code::Add, 14, 15),                                   // 15, 16
      cnst(2.0), op(Code::Sub, 17, 16),                                   // 17, 18: 2 - 16
  };
  prog[10].c = 9, prog[11].c = 1, prog[14].c = 2;
  backends::jit::Spec spec;
  spec.prog = &prog;
  spec.stride.assign(prog.size(), 1);
  spec.stride[0] = 2, spec.stride[1] = 3;
  spec.results = {10, 18};
  spec.early = {1, 0};
  auto loop = backends::jit::build(spec);
  ASSERT_NE(loop, nullptr);
  const int64_t rows = 2;
  for (int64_t n : {1, 7, 8, 9, 13, 40, 43}) {
    const int64_t xr = 2 * n + 5, yr = 3 * n + 1, zr = n + 2, outr = n + 2;  // per-row strides
    std::vector<float> x = special_values(rows * xr), y = special_values(rows * yr + 7);
    y.erase(y.begin(), y.begin() + 7);
    std::vector<int32_t> z(size_t(rows * zr));
    for (size_t i = 0; i < z.size(); ++i) z[i] = int32_t(i % 5) * 3 - 4;
    std::vector<int32_t> oi(size_t(rows * outr), 99);
    std::vector<float> of(size_t(rows * outr), -9.0f);
    const void* data[] = {x.data(), y.data(), z.data()};
    const int64_t in_step[] = {xr * 4, yr * 4, zr * 4};
    std::vector<const void*> ptrs;
    std::vector<int64_t> steps;
    for (int l : loop->loads()) ptrs.push_back(data[prog[size_t(l)].input]), steps.push_back(in_step[prog[size_t(l)].input]);
    ptrs.push_back(oi.data()), ptrs.push_back(of.data());
    steps.push_back(outr * 4), steps.push_back(outr * 4);
    (*loop)(ptrs.data(), n, rows, steps.data());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < n; ++i) {
        const float a = x[size_t(r * xr + 2 * i)], b = y[size_t(r * yr + 3 * i)];
        const bool p5 = a > b || a != a, p7 = p5 && b < 0.0f;
        const int32_t want_i = p5 ? 7 : -3;
        const float v14 = want_i > z[size_t(r * zr + i)] ? (p7 ? a : b) : 0.0f;
        const float want_f = 2.0f - (v14 + 1.5f);
        ASSERT_EQ(oi[size_t(r * outr + i)], want_i) << "n " << n << ", row " << r << ", i " << i;
        ASSERT_TRUE(same(of[size_t(r * outr + i)], want_f)) << "n " << n << ", row " << r << ", i " << i << ": "
                                                            << of[size_t(r * outr + i)] << " vs " << want_f;
      }
      for (int64_t i = n; i < outr; ++i)  // past the run: untouched
        ASSERT_TRUE(oi[size_t(r * outr + i)] == 99 && of[size_t(r * outr + i)] == -9.0f) << "n " << n << ", i " << i;
    }
  }
}

TEST(CpuJit, TwoDimRunsReadEachLoadAtItsPattern) {
  // A run over two dims (jit::Spec::inner): a pooling output's rows of 2 or 4 positions, 8 / inner
  // rows per vector. x is gathered at its two-dim pattern (stride 2 along a row, rows xr apart),
  // y is one value per row (stride 0, rows 1 apart: gathered too), z walks evenly (dense, rows
  // `inner` apart) and w is broadcast; run lengths with and without a tail, and two calls' rows.
  REQUIRE_LOOPS();
  std::vector<Instr> prog = {load(0), load(1), load(2), load(3), load(0),  // x tap 0, y, z, w, x tap 1
                             op(Code::Add, 0, 1), op(Code::Mul, 5, 2), op(Code::Add, 6, 3),  // 5, 6, 7
                             op(Code::Add, 4, 1), op(Code::Mul, 8, 2), op(Code::Add, 9, 3),  // 8, 9, 10
                             op(Code::Max, 7, 10)};                                          // 11
  for (int64_t inner : {2, 4})
    for (int64_t nrows : {1, 2, 3, 4, 5, 9}) {
      SCOPED_TRACE("inner " + std::to_string(inner) + ", rows " + std::to_string(nrows));
      const int64_t xr = 2 * inner + 3, n = inner * nrows, rows = 2;
      backends::jit::Spec spec;
      spec.prog = &prog;
      spec.inner = inner;
      spec.stride.assign(prog.size(), 1);
      spec.stride2.assign(prog.size(), 0);
      spec.stride[0] = spec.stride[4] = 2, spec.stride2[0] = spec.stride2[4] = xr;
      spec.stride[1] = 0, spec.stride2[1] = 1;
      spec.stride[2] = 1, spec.stride2[2] = inner;
      spec.stride[3] = 0, spec.stride2[3] = 0;
      spec.results = {11};
      spec.early = {1};
      auto loop = backends::jit::build(spec);
      ASSERT_NE(loop, nullptr);
      // Per call row r: x from r * cx (x tap 1 one element on), y from r * nrows, z from r * n.
      const int64_t cx = nrows * xr + 1;
      std::vector<float> x = special_values(rows * cx + 2), y(size_t(rows * nrows)), z(size_t(rows * n)), w = {0.25f};
      for (size_t i = 0; i < y.size(); ++i) y[i] = float(i) * 0.5f - 1.0f;
      for (size_t i = 0; i < z.size(); ++i) z[i] = float(i % 7) - 2.5f;
      const int64_t outr = n + 3;
      std::vector<float> out(size_t(rows * outr), -7.0f);
      const void* data[] = {x.data(), y.data(), z.data(), w.data(), x.data() + 1};
      const int64_t step_of[] = {cx * 4, nrows * 4, n * 4, 0, cx * 4};
      std::vector<const void*> ptrs;
      std::vector<int64_t> steps;
      for (int l : loop->loads()) ptrs.push_back(data[l]), steps.push_back(step_of[l]);
      ptrs.push_back(out.data()), steps.push_back(outr * 4);
      (*loop)(ptrs.data(), n, rows, steps.data());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t e = 0; e < outr; ++e) {
          const float got = out[size_t(r * outr + e)];
          if (e >= n) {
            ASSERT_EQ(got, -7.0f) << "row " << r << ", element " << e << " is past the run";
            continue;
          }
          const int64_t q = e / inner, j = e % inner, xo = r * cx + q * xr + 2 * j;
          const float yv = y[size_t(r * nrows + q)], zv = z[size_t(r * n + e)];
          const float t0 = add(mul(add(x[size_t(xo)], yv), zv), 0.25f), t1 = add(mul(add(x[size_t(xo + 1)], yv), zv), 0.25f);
          const float want = ref_max(t0, t1);
          ASSERT_TRUE(same(got, want)) << "row " << r << ", position " << e << ": " << got << " vs " << want;
        }
    }
}

TEST(CpuJit, StridedResultsAreStoredLaneByLaneAndOnlyInTheRun) {
  // A pooling gradient's interleave walks its taps block by block, so each result goes to every
  // other element: stored lane by lane, under the tail's mask only the run's own lanes.
  REQUIRE_LOOPS();
  std::vector<Instr> prog = {load(0), load(1), op(Code::Add, 0, 1), cnst(0.5), op(Code::Mul, 2, 3)};
  backends::jit::Spec spec;
  spec.prog = &prog;
  spec.stride = {1, 2, 1, 1, 1};
  spec.results = {4};
  spec.early = {1};
  spec.out_stride = 3;
  auto loop = backends::jit::build(spec);
  ASSERT_NE(loop, nullptr);
  const int64_t rows = 2;
  for (int64_t n : {1, 3, 7, 8, 9, 14, 21}) {
    const int64_t xr = n + 1, yr = 2 * n + 3, outr = 3 * n + 4;
    std::vector<float> x = special_values(rows * xr), y = special_values(rows * yr + 11);
    y.erase(y.begin(), y.begin() + 11);
    std::vector<float> out(size_t(rows * outr), -7.0f);
    const void* ptrs[] = {x.data(), y.data(), out.data()};
    const int64_t steps[] = {xr * 4, yr * 4, outr * 4};
    ASSERT_EQ(loop->loads(), (std::vector<int>{0, 1}));
    (*loop)(ptrs, n, rows, steps);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t e = 0; e < outr; ++e) {
        const float got = out[size_t(r * outr + e)];
        if (e % 3 || e / 3 >= n) {
          ASSERT_EQ(got, -7.0f) << "n " << n << ", row " << r << ", element " << e << " is not the run's";
          continue;
        }
        const int64_t i = e / 3;
        const float want = add(x[size_t(r * xr + i)], y[size_t(r * yr + 2 * i)]) * 0.5f;
        ASSERT_TRUE(same(got, want)) << "n " << n << ", row " << r << ", i " << i << ": " << got << " vs " << want;
      }
  }
}

TEST(CpuJit, HeadsPermutedOutOfABiasAddRunThroughTheLoops) {
  // The transformer block's q, k and v (an imported model's attention): x [b, 6, 48] plus a bias,
  // split into 4 heads of 4 and permuted. q and v ([b, 4, 6, 4], one Step with two outputs) have
  // runs of 4 positions (each head's 4 values), walked in interleave_order by default, where two
  // outputs build no loop: their loop runs in the Step's own order, 4 positions taking the next
  // dim in. k ([b, 4, 4, 6]) has runs of 6 strided positions, 4 rows per call by itself, 16 with
  // the heads' dim merged into the rows'. Both Steps through their native loops, each value the
  // float32 sum to the bit (NaN and infinities included).
  REQUIRE_LOOPS();
  NoGradGuard no_grad;
  const int64_t b = 8, n = 6, h = 4, hd = 4, w = 3 * h * hd;
  // x a product's output (as the block's: each head's Step reads the product, the sum not kept)
  std::vector<float> av(size_t(b * n * 16)), wv(size_t(16 * w)), bv = special_values(w);
  for (size_t i = 0; i < av.size(); ++i) av[i] = float(std::sin(double(i) * 0.37));
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = float(std::cos(double(i) * 0.11));
  Tensor x = matmul(from_vector<float>(av, {b * n, 16}), from_vector<float>(wv, {16, w}));
  Tensor q, k, v;
  {  // (the sum not kept alive: sync would realize it too)
    Tensor parts = (x.reshape({b, n, w}) + from_vector<float>(bv, {w})).reshape({b, n, 3, h, hd});
    auto head = [&](int64_t p) { return parts.slice(2, p, p + 1).reshape({b, n, h, hd}); };
    q = head(0).permute({0, 2, 1, 3}), k = head(1).permute({0, 2, 3, 1}), v = head(2).permute({0, 2, 1, 3});
  }
  const uint64_t before = backends::cpu::elementwise_loop_launches();
  tessera::sync();
  EXPECT_EQ(backends::cpu::elementwise_loop_launches() - before, 2u) << "q and v's Step and k's: through their loops";
  const std::vector<float> xv = x.to_vector<float>(), qv = q.to_vector<float>(), kv = k.to_vector<float>(),
                           vv = v.to_vector<float>();
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < h; ++j)
      for (int64_t s = 0; s < n; ++s)
        for (int64_t e = 0; e < hd; ++e) {
          auto sum = [&](int64_t p) {
            const int64_t c = p * h * hd + j * hd + e;
            return add(xv[size_t((i * n + s) * w + c)], bv[size_t(c)]);
          };
          const float gq = qv[size_t(((i * h + j) * n + s) * hd + e)], gv = vv[size_t(((i * h + j) * n + s) * hd + e)];
          const float gk = kv[size_t(((i * h + j) * hd + e) * n + s)];
          ASSERT_TRUE(same(gq, sum(0))) << "q at " << i << ", " << j << ", " << s << ", " << e << ": " << gq << " vs " << sum(0);
          ASSERT_TRUE(same(gk, sum(1))) << "k at " << i << ", " << j << ", " << e << ", " << s << ": " << gk << " vs " << sum(1);
          ASSERT_TRUE(same(gv, sum(2))) << "v at " << i << ", " << j << ", " << s << ", " << e << ": " << gv << " vs " << sum(2);
        }
}

TEST(CpuJit, DumpAsmWritesEachLoopsCodeListingAndPerfMapLine) {
  // TESSERA_DUMP is read once per process, so this test runs itself again with
  // TESSERA_DUMP=asm: the child compiles one elementwise Step (through the compiler, which passes
  // the asm stage to the backend), whose loop's code, listing and perf map line the parent checks.
  REQUIRE_LOOPS();
  if (std::getenv("TESSERA_DUMP")) {  // the child
    std::vector<float> xv = special_values(1000), yv = special_values(1003);
    Tensor x = from_vector<float>(xv, {1000}), y = from_vector<float>(std::vector<float>(yv.begin() + 3, yv.end()), {1000});
    (void)(maximum(x * 2.0, y) - 1.0).to_vector<float>();
    return;
  }
  namespace fs = std::filesystem;
  const std::string dir = tessera::testing::scratch_dir("tessera_asm_dump");
  pid_t pid = 0;
  ASSERT_NO_FATAL_FAILURE(run_child("CpuJit.DumpAsmWritesEachLoopsCodeListingAndPerfMapLine",
                                    {"TESSERA_DUMP=asm", "TESSERA_DUMP_DIR=" + dir}, "TESSERA_DUMP", pid));

  auto read = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  // The perf map: one line per loop, "<address> <size> tessera_loop_NNNN" in hex, each size the
  // size of that loop's .bin.
  const fs::path map = "/tmp/perf-" + std::to_string(pid) + ".map";
  ASSERT_TRUE(fs::exists(map)) << map;
  std::istringstream lines(read(map));
  fs::remove(map);
  int loops = 0, listed = 0;
  bool found = false;  // the Step's loop: x * 2, the max of that and y (NaN-aware), minus 1
  for (std::string addr, size, name; lines >> addr >> size >> name; ++loops) {
    ASSERT_EQ(name, "tessera_loop_" + std::string(4 - std::to_string(loops + 1).size(), '0') + std::to_string(loops + 1));
    const fs::path bin = fs::path(dir) / ("loop-" + name.substr(13) + ".bin");
    ASSERT_TRUE(fs::exists(bin)) << bin;
    EXPECT_EQ(fs::file_size(bin), std::stoull(size, nullptr, 16)) << bin;
    const std::string listing = read(fs::path(bin).replace_extension(".s"));
    EXPECT_NE(listing.find("; tessera loop-" + name.substr(13)), std::string::npos) << listing;
    if (listing.find("objdump not found") != std::string::npos) {
      if (tessera::testing::in_ci()) ADD_FAILURE() << "no objdump to disassemble the loops (binutils)";
      continue;
    }
    ++listed;
    EXPECT_NE(listing.find(addr + ":"), std::string::npos) << "listed from its run-time address " << addr;
    found |= listing.find("vmulps") != std::string::npos && listing.find("vmaxps") != std::string::npos &&
             listing.find("vcmpunordps") != std::string::npos && listing.find("vsubps") != std::string::npos;
    // the form chosen: zmm registers (AVX-512) or ymm ones only (AVX2)
    EXPECT_EQ(listing.find("zmm") != std::string::npos, backends::jit::avx512()) << listing;
  }
  EXPECT_GE(loops, 1);
  EXPECT_TRUE(found || listed == 0) << "no loop listing shows the Step's vmulps, vcmpunordps, vmaxps, vsubps";
  fs::remove_all(dir);
}

namespace {

// Row Steps (softmax, layer norm, their backwards, the cross-entropy) over rows of 7, 33, 100
// and 128 positions, rows with NaN and infinities among them (special_values' first 20), a mask
// through where: every result's values, in one list; `through_loops`: per case, whether a Row
// Step of it ran through the native loops (backends/cpu/row_loops.h).
std::vector<float> row_step_results(std::vector<std::string>& names, std::vector<uint8_t>& through_loops) {
  std::vector<float> all;
  auto add = [&](const std::string& name, uint64_t before, std::initializer_list<Tensor> ts) {
    for (const Tensor& t : ts) {
      std::vector<float> v = t.to_vector<float>();
      all.insert(all.end(), v.begin(), v.end());
    }
    names.push_back(name);
    through_loops.push_back(backends::cpu::row_loop_launches() > before);
  };
  for (int64_t n : {7, 33, 100, 128}) {
    const int64_t rows = n == 128 ? 600 : 45;  // 600 x 128: over kParallelMin, several threads' tiles
    const std::string tag = " rows of " + std::to_string(n);
    std::vector<float> xv = special_values(rows * n), rv = special_values(rows * n + 7);
    rv.erase(rv.begin(), rv.begin() + 27);  // no NaN in the upstream gradient or weights
    rv.resize(size_t(rows * n), 0.5f);
    std::vector<float> wv(rv.begin(), rv.begin() + n), bv(rv.begin() + n, rv.begin() + 2 * n);
    auto X = [&] { return from_vector<float>(xv, {rows, n}).requires_grad_(); };
    Tensor r = from_vector<float>(rv, {rows, n});
    uint64_t before = backends::cpu::row_loop_launches();
    {
      Tensor x = X(), y = softmax(x, 1);
      (y * r).sum().backward();
      add("softmax and its backward" + tag, before, {y, x.grad()});
    }
    before = backends::cpu::row_loop_launches();
    {
      Tensor x = X(), y = softmax(where(x > 0.5, x, x * 0.25 - 3.0), 1);
      (y * r).sum().backward();
      add("softmax of a where" + tag, before, {y, x.grad()});
    }
    before = backends::cpu::row_loop_launches();
    {  // a causal mask as the GPT's attention makes it: int64 positions compared, -inf above the diagonal
      const int64_t m = n == 128 ? 4 : 2;
      std::vector<float> sv = special_values(m * n * n), gv = special_values(m * n * n + 27);
      gv.erase(gv.begin(), gv.begin() + 27);
      Tensor x = from_vector<float>(sv, {m, n, n}).requires_grad_();
      Tensor qpos = arange(0, double(n), 1, TensorOptions{DType::Int64, Device("cpu")}).reshape({n, 1});
      Tensor kpos = arange(0, double(n), 1, TensorOptions{DType::Int64, Device("cpu")}).reshape({1, n});
      Tensor y = softmax(masked_fill(x * 0.125, kpos > qpos, -INFINITY), -1);
      (y * from_vector<float>(gv, {m, n, n})).sum().backward();
      add("causal softmax and its backward" + tag, before, {y, x.grad()});
    }
    before = backends::cpu::row_loop_launches();
    {  // a bool mask as a tensor of its own (an imported model's attention mask); row 1 all masked
      const int64_t m = 2;
      std::vector<uint8_t> mv(size_t(n * n));
      for (int64_t i = 0; i < n * n; ++i) mv[size_t(i)] = i / n == 1 || (i * 7) % 5 == 0;
      Tensor mask = from_vector<uint8_t>(mv, {n, n}, {DType::Bool, Device("cpu")});
      Tensor x = from_vector<float>(special_values(m * n * n), {m, n, n}).requires_grad_();
      Tensor y = softmax(masked_fill(x, mask, -INFINITY), -1);
      std::vector<float> gv = special_values(m * n * n + 27);
      gv.erase(gv.begin(), gv.begin() + 27);
      (y * from_vector<float>(gv, {m, n, n})).sum().backward();
      add("softmax under a bool mask tensor" + tag, before, {y, x.grad()});
    }
    before = backends::cpu::row_loop_launches();
    {  // under bfloat16 autocast: the probabilities rounded to bfloat16 as the product's operand
       // (times the identity: the product is exactly the rounded values)
      Tensor x = X(), eye;
      std::vector<float> ev(size_t(n * n), 0.0f);
      for (int64_t i = 0; i < n; ++i) ev[size_t(i * n + i)] = 1.0f;
      eye = from_vector<float>(ev, {n, n});
      // (and a mix of neighbours for the layer norm's product, so that its gradient is no
      // bfloat16 value and its rounding on the way back into the Row Step shows)
      for (int64_t i = 0; i < n; ++i) ev[size_t(i * n + (i + 1) % n)] += 0.3f;
      Tensor mix = from_vector<float>(ev, {n, n});
      Tensor y, z;
      {
        Autocast ac{DType::BFloat16};
        y = matmul(softmax(x, 1), eye);
        Tensor w = from_vector<float>(wv, {n}), b = from_vector<float>(bv, {n});
        z = matmul(layer_norm(y, {n}, w, b), mix);
      }
      (z * r).sum().backward();  // the gradients reach the Row Steps rounded to bfloat16 and back
      add("bfloat16 autocast softmax, layer norm and their backwards" + tag, before, {y, z, x.grad()});
    }
    before = backends::cpu::row_loop_launches();
    {
      Tensor x = X(), w = from_vector<float>(wv, {n}).requires_grad_(), b = from_vector<float>(bv, {n}).requires_grad_();
      Tensor y = layer_norm(x, {n}, w, b);
      (y * r).sum().backward();
      add("layer norm and its backward" + tag, before, {y, x.grad(), w.grad(), b.grad()});
    }
    before = backends::cpu::row_loop_launches();
    {
      Tensor x = X();
      std::vector<int64_t> tv;
      for (int64_t i = 0; i < rows; ++i) tv.push_back((i * 5) % n);
      Tensor loss = cross_entropy(x, from_vector<int64_t>(tv, {rows}, {DType::Int64, Device("cpu")}));
      loss.backward();
      add("cross-entropy and its gradient" + tag, before, {loss, x.grad()});
    }
  }
  {  // rows of 6 over [3, 4, 6, 6] under a causal mask broadcast over batch and heads (the
     // imported transformer block's attention): one run of rows per tile, the mask's rows copied
    const int64_t n = 6;
    uint64_t before = backends::cpu::row_loop_launches();
    std::vector<float> sv = special_values(3 * 4 * n * n), gv = special_values(3 * 4 * n * n + 27);
    gv.erase(gv.begin(), gv.begin() + 27);
    Tensor x = from_vector<float>(sv, {3, 4, n, n}).requires_grad_();
    Tensor qpos = arange(0, double(n), 1, TensorOptions{DType::Int64, Device("cpu")}).reshape({n, 1});
    Tensor kpos = arange(0, double(n), 1, TensorOptions{DType::Int64, Device("cpu")}).reshape({1, n});
    Tensor y = softmax(masked_fill(x * 0.25, kpos > qpos, -INFINITY), -1);
    (y * from_vector<float>(gv, {3, 4, n, n})).sum().backward();
    add("causal softmax over [3, 4, 6, 6] and its backward", before, {y, x.grad()});
  }
  return all;
}

}  // namespace

// Short rows whose runs along the last outer dim are short (a softmax over [64, 4, 6, 6] under a
// causal mask broadcast over batch and heads: runs of 6 rows) run as one run of rows per tile:
// three loop calls per tile (the max's operand, the sum's, the results), not per 6 rows, and the
// rows' reductions 8 rows at a time. Values against the host's softmax; bits against the
// interpreter in the test below (rows of 6 and 7 with NaN and infinities).
TEST(CpuJit, ShortRowsUnderABroadcastMaskRunOneLoopCallPerPartPerTile) {
  REQUIRE_LOOPS();
  NoGradGuard no_grad;
  const int64_t b = 64, h = 4, n = 6, rows = b * h * n;
  std::vector<float> sv(size_t(rows * n));
  for (size_t i = 0; i < sv.size(); ++i) sv[i] = float(std::sin(double(i) * 0.37) * 3.0);
  Tensor qpos = arange(0, double(n), 1, TensorOptions{DType::Int64, Device("cpu")}).reshape({n, 1});
  Tensor kpos = arange(0, double(n), 1, TensorOptions{DType::Int64, Device("cpu")}).reshape({1, n});
  Tensor y = softmax(masked_fill(from_vector<float>(sv, {b, h, n, n}), kpos > qpos, -INFINITY), -1);
  const uint64_t launches = backends::cpu::row_loop_launches(), calls = backends::cpu::row_loop_calls(),
                 lanes = backends::cpu::row_loop_lane_rows();
  std::vector<float> got = y.to_vector<float>();
#if defined(__FMA__)  // exp: in the loops with FMA only (a sanitized build has none; the values are checked below)
  ASSERT_EQ(backends::cpu::row_loop_launches() - launches, 1u) << "the softmax's Row Step did not run through the loops";
  const int64_t tiles = (rows + (1024 / n) - 1) / (1024 / n);  // kTile = 1024 elements
  EXPECT_LE(backends::cpu::row_loop_calls() - calls, uint64_t(3 * tiles)) << "runs of 6 rows would take " << 3 * rows / n;
#else
  (void)launches, (void)calls, (void)lanes;
#endif
#if defined(__AVX2__) && defined(__FMA__)
  // Both reductions (max, sum) of every row, 8 rows at a time (a tile's rows are not all a
  // multiple of 8: at most 7 rows per tile and reduction are left to the scalar loop).
  EXPECT_GE(backends::cpu::row_loop_lane_rows() - lanes, uint64_t(2 * (rows - 7 * tiles)));
#endif
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t q = r % n;
    double m = -INFINITY, s = 0;
    for (int64_t k = 0; k <= q; ++k) m = std::max(m, double(sv[size_t(r * n + k)]));
    for (int64_t k = 0; k <= q; ++k) s += std::exp(double(sv[size_t(r * n + k)]) - m);
    for (int64_t k = 0; k < n; ++k) {
      const double want = k <= q ? std::exp(double(sv[size_t(r * n + k)]) - m) / s : 0.0;
      ASSERT_NEAR(got[size_t(r * n + k)], want, 1e-6) << "row " << r << ", position " << k;
    }
  }
}

TEST(CpuJit, RowStepsThroughTheLoopsMatchTheInterpreterBitForBit) {
  // The child (TESSERA_CPU_JIT=0, the interpreter only) writes its results' bits to a file; the
  // parent computes the same with the loops on and compares them bit for bit (NaN with NaN).
  std::vector<std::string> names;
  std::vector<uint8_t> through;
  if (const char* out = std::getenv("TESSERA_ROW_BITS_OUT")) {  // the child
    std::vector<float> v = row_step_results(names, through);
    std::ofstream f(out, std::ios::binary);
    f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * 4));
    return;
  }
  REQUIRE_LOOPS();
  const std::vector<float> mine = row_step_results(names, through);
  for (size_t c = 0; c < names.size(); ++c) {
    if (names[c].rfind("cross-entropy", 0) == 0) continue;  // its log-sum-exp Steps (log) stay with the interpreter
#if !defined(__FMA__)
    if (names[c].find("softmax") != std::string::npos) continue;  // exp: with FMA only (a sanitized build has none)
#endif
    EXPECT_TRUE(through[c]) << names[c] << ": no Row Step ran through the native loops";
  }
  const std::string file = tessera::testing::scratch_dir("tessera_row_bits") + "/bits";
  pid_t pid = 0;
  ASSERT_NO_FATAL_FAILURE(run_child("CpuJit.RowStepsThroughTheLoopsMatchTheInterpreterBitForBit",
                                    {"TESSERA_CPU_JIT=0", "TESSERA_ROW_BITS_OUT=" + file}, "TESSERA_CPU_JIT", pid));
  std::ifstream f(file, std::ios::binary);
  std::vector<float> theirs(mine.size());
  f.read(reinterpret_cast<char*>(theirs.data()), std::streamsize(theirs.size() * 4));
  ASSERT_EQ(f.gcount(), std::streamsize(mine.size() * 4)) << "the interpreter's results are not the same size";
  size_t bad = 0;
  for (size_t i = 0; i < mine.size(); ++i)
    if (!same(mine[i], theirs[i]) && bad++ < 5) ADD_FAILURE() << "value " << i << ": loops " << mine[i] << ", interpreter " << theirs[i];
  EXPECT_EQ(bad, 0u) << "of " << mine.size() << " values";
  size_t nan = 0;
  for (float v : mine) nan += std::isnan(v);
  EXPECT_GT(nan, 0u) << "the NaN rows reached the results";
  std::filesystem::remove_all(std::filesystem::path(file).parent_path());
}

namespace {

// The programs the GPT's step sends through the native loops, each read back into one list:
// elementwise chains with every op of the loops (exp, erf, where, comparisons, roundings to
// bfloat16, sqrt and div as AdamW's update has them) over sizes with tails in either form (1013:
// 16 lanes leave 5, 8 lanes 5; 70001 over several threads' tiles), GELU and its gradient (the
// product's epilogue), softmax and layer norm with their backwards (rows of 100 and 64), a
// bfloat16 autocast product of a softmax, and an AdamW step.
std::vector<float> form_results() {
  std::vector<float> all;
  auto keep = [&](std::initializer_list<Tensor> ts) {
    for (const Tensor& t : ts) {
      std::vector<float> v = t.to_vector<float>();
      all.insert(all.end(), v.begin(), v.end());
    }
  };
  auto fs = [](double v) { return scalar_tensor(v); };
  // Each elementwise case one graph read back once its temporaries are gone (one Step, its only
  // output the result), as in EveryOpMatchesFloat32ArithmeticExactly.
  auto one = [&](const std::function<Tensor()>& make) {
    std::vector<float> v = make().to_vector<float>();
    all.insert(all.end(), v.begin(), v.end());
  };
  for (int64_t n : {1013, 70001}) {
    std::vector<float> xv = special_values(n), yv = special_values(n + 3);
    yv.erase(yv.begin(), yv.begin() + 3);
    for (int64_t i = 0; i < n; i += 5) yv[size_t(i)] = xv[size_t(i)];
    Tensor x = from_vector<float>(xv, {n}), y = from_vector<float>(yv, {n});
    one([&] { return exp(x * 10.0) + erf(y); });
    one([&] { return erf(x * 0.7) * exp(neg(y)); });
    one([&] { return where(x > y, x, y * 2.0) - where(x != y, fs(4), fs(-4)) + where(x <= 0.5, abs(y), fs(2)); });
    one([&] { return where(x == y, x, minimum(x, y)) * where(x >= y, fs(1), maximum(y, fs(-3))); });
    one([&] { return floor(x * 3.0) + ceil(y * 3.0) + round(x * 2.0); });
    one([&] { return sqrt(abs(x) + 1.0) / (sqrt(abs(y)) + 1e-8); });
    one([&] { return x.to(DType::BFloat16).to(DType::Float32) * 2.0 + (y * 3.0).to(DType::BFloat16).to(DType::Float32); });
    one([&] { return gelu(x); });
  }
  {  // an output of 8 MiB and more in one run: non-temporal stores (a vector's alignment), its tail masked
    const int64_t n = (8 << 20) / 4 + 5;
    std::vector<float> xv = special_values(n);
    Tensor x = from_vector<float>(xv, {n});
    std::vector<float> v = (x * 1.5 + 0.25).to_vector<float>();
    for (int64_t i = 0; i < n; ++i)
      if (!same(v[size_t(i)], add(mul(xv[size_t(i)], 1.5f), 0.25f))) {
        ADD_FAILURE() << "a streamed result: position " << i << " of " << n;
        break;
      }
    all.insert(all.end(), v.begin(), v.end());
  }
  std::vector<float> rv = special_values(4096 + 27);
  rv.erase(rv.begin(), rv.begin() + 27);  // ordinary values
  auto ordinary = [&](int64_t count, int64_t at, float scale) {
    std::vector<float> v(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) v[size_t(i)] = rv[size_t((at + i * 7) % 4096)] * scale;
    return v;
  };
  {  // GELU's gradient: the epilogue of the product dy W2^T, and the MLP's other products
    Tensor x = from_vector<float>(ordinary(64 * 96, 1, 0.3f), {64, 96}).requires_grad_();
    Tensor w1 = from_vector<float>(ordinary(96 * 200, 2, 0.05f), {96, 200}).requires_grad_();
    Tensor b1 = from_vector<float>(ordinary(200, 3, 0.1f), {200}).requires_grad_();
    Tensor w2 = from_vector<float>(ordinary(200 * 96, 4, 0.05f), {200, 96}).requires_grad_();
    Tensor r = from_vector<float>(ordinary(64 * 96, 5, 1.0f), {64, 96});
    Tensor h = gelu(matmul(x, w1) + b1), y = matmul(h, w2);
    (y * r).sum().backward();
    keep({h, y, x.grad(), w1.grad(), b1.grad(), w2.grad()});
  }
  for (int64_t n : {100, 64}) {  // softmax and layer norm, forward and backward
    const int64_t rows = 300;
    std::vector<float> xv = special_values(rows * n);
    Tensor r = from_vector<float>(ordinary(rows * n, 6, 1.0f), {rows, n});
    Tensor x = from_vector<float>(xv, {rows, n}).requires_grad_(), s = softmax(x, 1);
    (s * r).sum().backward();
    Tensor x2 = from_vector<float>(ordinary(rows * n, 7, 2.0f), {rows, n}).requires_grad_();
    Tensor w = from_vector<float>(ordinary(n, 8, 1.0f), {n}).requires_grad_(), b = from_vector<float>(ordinary(n, 9, 1.0f), {n}).requires_grad_();
    Tensor l = layer_norm(x2, {n}, w, b);
    (l * r).sum().backward();
    keep({s, x.grad(), l, x2.grad(), w.grad(), b.grad()});
    Tensor eye = from_vector<float>(ordinary(n * n, 10, 0.2f), {n, n}), z;
    {
      Autocast ac{DType::BFloat16};
      z = matmul(softmax(from_vector<float>(ordinary(rows * n, 11, 3.0f), {rows, n}), 1), eye);
    }
    keep({z});
  }
  {  // an AdamW step: mul + add + sqrt + div + sub
    Tensor p = from_vector<float>(ordinary(384 * 129, 12, 0.1f), {384, 129}).requires_grad_();
    optim::AdamW opt({p});
    for (int s = 0; s < 2; ++s) {
      opt.zero_grad();
      (p * p * from_vector<float>(ordinary(384 * 129, 13, 1.0f), {384, 129})).sum().backward();
      opt.step();
    }
    keep({p.detach()});
  }
  return all;
}

}  // namespace

// The AVX-512 form of the loops (16 lanes, opmask tails and comparisons) against the AVX2 form
// (TESSERA_CPU_JIT=avx2) and other thread counts, bit for bit: the child processes write their
// results' bits, the parent compares them with its own (NaN with NaN). On a CPU without AVX-512
// both sides run the AVX2 form (the thread counts are still compared).
TEST(CpuJit, Avx512AndAvx2FormsAndThreadCountsGiveTheSameBits) {
  if (const char* out = std::getenv("TESSERA_FORM_BITS_OUT")) {  // a child
    const std::vector<float> v = form_results();
    std::ofstream f(out, std::ios::binary);
    f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * 4));
    return;
  }
  REQUIRE_LOOPS();
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && !std::getenv("TESSERA_CPU_JIT")) {
    ASSERT_TRUE(backends::jit::avx512()) << "a CPU with AVX-512 builds the AVX2 form";
  }
  // Abs: in the loops of every build (erf and exp need FMA, which the sanitized build lacks).
  std::vector<Instr> prog = {load(0), op(Code::Abs, 0)};
  const auto loop = build(prog, {1});
  ASSERT_NE(loop, nullptr);
  EXPECT_EQ(loop->lanes(), backends::jit::avx512() ? 16 : 8);
  const uint64_t before = backends::cpu::elementwise_loop_launches();
  const std::vector<float> mine = form_results();
  EXPECT_GT(backends::cpu::elementwise_loop_launches(), before);
  size_t nan = 0;
  for (float v : mine) nan += std::isnan(v);
  EXPECT_GT(nan, 0u) << "the NaN inputs reached the results";
  const std::string dir = tessera::testing::scratch_dir("tessera_form_bits");
  const std::vector<std::vector<std::string>> children = {
      {"TESSERA_CPU_JIT=avx2"}, {"TESSERA_CPU_JIT=avx2", "OMP_NUM_THREADS=1"}, {"OMP_NUM_THREADS=3"}};
  for (size_t c = 0; c < children.size(); ++c) {
    std::vector<std::string> env = children[c];
    const std::string file = dir + "/bits" + std::to_string(c);
    env.push_back("TESSERA_FORM_BITS_OUT=" + file);
    std::string what;
    for (const std::string& e : children[c]) what += e + " ";
    pid_t pid = 0;
    // (the child's settings come first in its environment, before the parent's: getenv finds them)
    ASSERT_NO_FATAL_FAILURE(run_child("CpuJit.Avx512AndAvx2FormsAndThreadCountsGiveTheSameBits", env, "TESSERA_FORM_BITS_OUT", pid));
    std::ifstream f(file, std::ios::binary);
    std::vector<float> theirs(mine.size());
    f.read(reinterpret_cast<char*>(theirs.data()), std::streamsize(theirs.size() * 4));
    ASSERT_EQ(f.gcount(), std::streamsize(mine.size() * 4)) << what << ": not the same number of values";
    size_t bad = 0;
    for (size_t i = 0; i < mine.size(); ++i)
      if (!same(mine[i], theirs[i]) && bad++ < 5)
        ADD_FAILURE() << what << "value " << i << ": here " << mine[i] << ", there " << theirs[i];
    EXPECT_EQ(bad, 0u) << what << ": of " << mine.size() << " values";
  }
  std::filesystem::remove_all(dir);
}

// GELU's gradient as the backward of 0.5 x (1 + erf(x / sqrt 2)) emits it (the mlp.proj input
// gradient's GEMM epilogue): g (1 + e) 0.5 + g (0.5 x) (2 / sqrt pi) exp(-u^2) / sqrt 2, u =
// x / sqrt 2, e = erf(u); then `extra` further loads kept live across it (added at the end), so
// that fewer vector registers are left for its ~35 constants.
std::vector<Instr> gelu_grad_program(int extra) {
  std::vector<Instr> p = {load(0), load(1), cnst(M_SQRT1_2), op(Code::Mul, 1, 2), op(Code::Erf, 3), cnst(1.0),
                          op(Code::Add, 4, 5), op(Code::Mul, 0, 6), cnst(0.5), op(Code::Mul, 7, 8), op(Code::Mul, 1, 8),
                          op(Code::Mul, 0, 10), op(Code::Mul, 3, 3), op(Code::Neg, 12), op(Code::Exp, 13),
                          cnst(2 / std::sqrt(M_PI)), op(Code::Mul, 15, 14), op(Code::Mul, 11, 16), op(Code::Mul, 17, 2),
                          op(Code::Add, 9, 18)};
  std::vector<int> live;
  for (int l = 0; l < extra; ++l) {  // loaded first, read last
    p.insert(p.begin(), load(2 + l));
    for (size_t k = 1; k < p.size(); ++k) {
      Instr& I = p[k];
      for (int* o : {&I.a, &I.b, &I.c})
        if (*o >= 0) ++*o;
    }
  }
  for (int l = 0; l < extra; ++l) p.push_back(op(Code::Add, int(p.size()) - 1, l));
  // the loads' inputs: g 0, x 1, the extras 2.. (inserted first: renumber in program order)
  return p;
}

TEST(CpuJit, ConstantsInFreeRegistersKeepErfAndExpBits) {
  REQUIRE_LOOPS();
#if !defined(__FMA__)
  GTEST_SKIP() << "erf and exp run in the loops only where the build has FMA";
#else
  const int64_t n = 1031;  // 64 vectors of 16 and a tail of 7 (AVX2: 128 of 8 and 7)
  const std::vector<float> x = special_values(n), g = special_values(n + 5);
  std::vector<float> xs(x);
  for (float& v : xs) v *= 0.4f;  // mostly |u| < 4: erf's both regions, exp's normal range
  int before = 1 << 30, extra = 0;
  for (;; ++extra) {
    const std::vector<Instr> prog = gelu_grad_program(extra);
    const auto loop = build(prog, {int(prog.size()) - 1});
    if (!loop) break;
    const int hoisted = loop->constants_in_registers();
    EXPECT_LE(hoisted, before) << extra << " more live values left more registers free";
    before = hoisted;
    if (extra == 0 && backends::jit::avx512()) {
      EXPECT_GE(hoisted, 16) << "the GELU gradient's constants stayed in memory (32 zmm, ~11 needed by its values)";
    }
    // inputs: the extras are zeros (the sum is then the GELU gradient itself)
    std::vector<std::vector<float>> in(size_t(2 + extra), std::vector<float>(size_t(n), 0.0f));
    in[0].assign(g.begin() + 5, g.end()), in[1] = xs;
    std::vector<const void*> ptrs;
    for (const Instr& I : prog)
      if (I.code == Code::Load) ptrs.push_back(in[size_t(I.input)].data());
    std::vector<float> out(size_t(n), -1.0f);
    ptrs.push_back(out.data());
    (*loop)(ptrs.data(), n);
    const float c = float(M_SQRT1_2), k = float(2 / std::sqrt(M_PI));
    for (int64_t i = 0; i < n; ++i) {
      const float gv = in[0][size_t(i)], xv = xs[size_t(i)], u = mul(xv, c);
      float want = add(mul(mul(gv, add(verf(u), 1.0f)), 0.5f), mul(mul(mul(gv, mul(xv, 0.5f)), mul(k, vexp(-mul(u, u)))), c));
      for (int l = 0; l < extra; ++l) want = add(want, 0.0f);
      ASSERT_TRUE(same(out[size_t(i)], want)) << "extra " << extra << ", " << hoisted << " constants in registers, i " << i
                                              << ": g " << gv << ", x " << xv << ": " << out[size_t(i)] << " vs " << want;
    }
  }
  EXPECT_GT(extra, 2);
  EXPECT_EQ(before, 0) << "with every register taken by values, no constant should have one";
#endif
}

// A GEMM epilogue's tile (rows x columns of a product row N wide) in one loop call with per-row
// pointer steps (loop_rows): the same values as one loop_range per row, and nothing outside the
// tile written; over one run (dense loads only) and over runs of a row each (a bias broadcast
// down the rows) of a [2, 12, N] domain, tiles crossing its 12-row blocks, widths off the
// vector's multiple, tiles starting mid-row.
TEST(CpuJit, AnEpiloguesTileOfRowsInOneCallMatchesARangePerRow) {
  REQUIRE_LOOPS();
  const int64_t M = 24, N = 150;
  const Shape dom = {2, M / 2, N};  // the product [M, N] seen as [2, 12, N] (batch, tokens): tiles cross the 12-row blocks
  std::vector<float> x(static_cast<size_t>(M * N)), bv(static_cast<size_t>(N));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(double(i) * 0.37) * 3.0);
  for (size_t j = 0; j < bv.size(); ++j) bv[j] = float(j) * 0.25f - 7.0f;
  for (bool with_bias : {false, true}) {
    // out = x * 1.5 + (bias or the output slot's own value): the epilogue reads its slotuct in place
    std::vector<Instr> prog = {load(0), cnst(1.5), op(Code::Mul, 0, 1), load(1), op(Code::Add, 2, 3)};
    prog[0].map = kir::IndexMap::contiguous(dom);
    prog[3].map = with_bias ? kir::IndexMap::contiguous({1, 1, N}).expand(dom) : kir::IndexMap::contiguous(dom);
    backends::cpu::NativeLoop nl;
    backends::cpu::build_loop(nl, prog, dom, {4}, {0}, false);
    ASSERT_NE(nl.loop, nullptr) << (with_bias ? "with" : "without") << " a bias";
    EXPECT_EQ(nl.run, with_bias ? N : M * N);
    for (auto [m0, m1, n0, n1] : std::vector<std::array<int64_t, 4>>{{0, 6, 0, 64}, {6, 23, 64, 150}, {3, 20, 17, 54}, {10, 14, 40, 150}, {22, 23, 0, 150}, {18, 24, 128, 150}}) {
      std::vector<float> slot(size_t(M * N));  // the slot the slotuct is in
      for (size_t i = 0; i < slot.size(); ++i) slot[i] = float(i % 97) - 40.0f;
      std::vector<float> tile_out(slot), row_out(slot);
      std::vector<char*> base = {reinterpret_cast<char*>(x.data()),
                                 reinterpret_cast<char*>(with_bias ? bv.data() : tile_out.data())};
      const int64_t p = m0 * N + n0;
      const uint64_t calls = backends::cpu::loop_rows_tile_calls();
      backends::cpu::loop_rows(nl, base, p, n1 - n0, m1 - m0, N, tile_out.data() + p);
      EXPECT_EQ(backends::cpu::loop_rows_tile_calls() - calls, m1 - m0 > 1 ? 1u : 0u) << "tile rows " << m0 << "-" << m1;
      base[1] = reinterpret_cast<char*>(with_bias ? bv.data() : row_out.data());
      for (int64_t i = m0; i < m1; ++i) backends::cpu::loop_range(nl, base, i * N + n0, n1 - n0, row_out.data() + i * N + n0);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          const size_t at = size_t(i * N + j);
          const bool in = i >= m0 && i < m1 && j >= n0 && j < n1;
          const float want = in ? add(mul(x[at], 1.5f), with_bias ? bv[size_t(j)] : slot[at]) : slot[at];
          ASSERT_TRUE(same(row_out[at], want)) << "a range per row: (" << i << ", " << j << ")";
          ASSERT_TRUE(same(tile_out[at], want)) << (with_bias ? "with" : "without") << " a bias, tile rows " << m0 << "-" << m1
                                                << ", columns " << n0 << "-" << n1 << ": (" << i << ", " << j << ")";
        }
    }
  }
}

// A layer norm's scale 1 / sqrt(s / 128 + 1e-5) from a row's broadcast sum s is the same at every
// position of the row: the loop computes it once per row (Loop::row_invariants), not once per
// vector, and each row's value from that row's s (the rows' broadcast pointer steps by one float).
// Stored as a result too (a per-row statistic). Exact float32 arithmetic per row, over a tail.
TEST(CpuJit, RowInvariantOpsAreComputedOncePerRowFromThatRowsValues) {
  REQUIRE_LOOPS();
  // %0 x, %1 s (broadcast), %3 = s / 128, %5 = %3 + 1e-5, %6 = sqrt, %8 = 1 / %6, %9 = x * %8
  std::vector<Instr> prog = {load(0), load(1), cnst(128), op(Code::Div, 1, 2), cnst(1e-5), op(Code::Add, 3, 4),
                             op(Code::Sqrt, -1, -1), cnst(1), op(Code::Div, 7, 6), op(Code::Mul, 0, 8)};
  prog[6].a = 5;
  backends::jit::Spec spec;
  spec.prog = &prog;
  spec.stride = {1, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  spec.results = {9, 6};
  spec.early = {1, 1};
  auto loop = backends::jit::build(spec);
  ASSERT_NE(loop, nullptr);
  EXPECT_EQ(loop->row_invariants(), 4);  // %3, %5, %6, %8
  const int64_t n = 37, rows = 5;        // a tail on either form (AVX2 8 lanes, AVX-512 16)
  std::vector<float> x = special_values(n * rows), s = {300.0f, 1e-3f, 0.0f, 5e4f, 77.0f};
  std::vector<float> y(size_t(n * rows), -9.0f), sd(size_t(n * rows), -9.0f);
  const void* p[] = {x.data(), s.data(), y.data(), sd.data()};
  const int64_t step[] = {n * 4, 4, n * 4, n * 4};
  (*loop)(p, n, rows, step);
  for (int64_t r = 0; r < rows; ++r) {
    const float want_sd = std::sqrt(add(s[size_t(r)] / 128.0f, 1e-5f)), scale = 1.0f / want_sd;
    for (int64_t j = 0; j < n; ++j) {
      const size_t at = size_t(r * n + j);
      ASSERT_TRUE(same(sd[at], want_sd)) << "row " << r << " position " << j;
      ASSERT_TRUE(same(y[at], mul(x[at], scale))) << "row " << r << " position " << j << ": x " << x[at];
    }
  }
}
