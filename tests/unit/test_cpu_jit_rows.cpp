// The cpu backend's row-wise machinery against references that fix its bits: values hoisted to a
// row's start (jit_x86's row invariants) against the same program without hoisting, and column
// sums (reduce.cpp) against sums in their documented order, with one output or several.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/jit_x86.h"
#include "backends/cpu/kernel.h"
#include "cpu_jit_util.h"
#include "kernel_ir/step.h"
#include "tessera/tessera.h"
#include "test_util.h"

using namespace tessera;
using namespace cpu_jit_test;

// Row-invariant hoisting against no hoisting: the same random program built twice, A with the row
// values as broadcast loads (stride 0: what is computed from them alone is hoisted to the row's
// start), B with them as dense loads of the values replicated along the row (never hoisted).
// Every output must have the same bits, on every op kind, bool values, bfloat16 casts, early and
// late results, rows of 1-70 positions.
TEST(CpuJitRows, RowInvariantHoistingMatchesDenseReplicatedLoads) {
  REQUIRE_LOOPS();
  uint32_t seed = 4242;
  auto rnd = [&](uint32_t m) { seed = seed * 1664525u + 1013904223u; return (seed >> 8) % m; };
  int hoisted_programs = 0, fallback_programs = 0, skipped = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int nrow = 1 + int(rnd(3));  // row-value loads
    std::vector<Instr> prog = {load(0)};
    for (int i = 0; i < nrow; ++i) prog.push_back(load(1 + i));
    std::vector<int> fl, bl;  // float values, bool values
    for (int i = 0; i <= nrow; ++i) fl.push_back(i);
    const int nops = 3 + int(rnd(trial % 10 == 0 ? 60 : 25));
    // bias towards row values so that long invariant chains form
    auto pickf = [&] { return (rnd(3) != 0 && fl.size() > 1) ? fl[size_t(fl.size() - 1 - rnd(uint32_t(std::min<size_t>(fl.size(), 6))))] : fl[rnd(uint32_t(fl.size()))]; };
    for (int k = 0; k < nops; ++k) {
      const int kind = int(rnd(20));
      const int at = int(prog.size());
      if (kind == 0) { prog.push_back(cnst(double(int(rnd(9)) - 4) * 0.75)); fl.push_back(at); continue; }
      if (kind == 1) { prog.push_back(op(Code::Lt, pickf(), pickf())); prog.back().dtype = DType::Bool; bl.push_back(at); continue; }
      if (kind == 2) { prog.push_back(op(Code::Ge, pickf(), pickf())); prog.back().dtype = DType::Bool; bl.push_back(at); continue; }
      if (kind == 3 && !bl.empty()) {
        Instr I = op(Code::Where, bl[rnd(uint32_t(bl.size()))], pickf());
        I.c = pickf();
        prog.push_back(I); fl.push_back(at); continue;
      }
      if (kind == 4 && bl.size() >= 2) {
        prog.push_back(op(rnd(2) ? Code::Max : Code::Min, bl[rnd(uint32_t(bl.size()))], bl[rnd(uint32_t(bl.size()))]));
        prog.back().dtype = DType::Bool; bl.push_back(at); continue;
      }
      if (kind == 5) {
        Instr I = op(Code::Cast, pickf()); I.dtype = DType::BFloat16; prog.push_back(I);
        Instr J = op(Code::Cast, at); prog.push_back(J); fl.push_back(at + 1); continue;
      }
      const Code un[] = {Code::Neg, Code::Abs, Code::Sqrt, Code::Floor, Code::Ceil, Code::Round, Code::Exp, Code::Erf};
      const Code bin[] = {Code::Add, Code::Sub, Code::Mul, Code::Div, Code::Max, Code::Min};
      if (kind < 10) prog.push_back(op(un[rnd(8)], pickf()));
      else prog.push_back(op(bin[rnd(6)], pickf(), pickf()));
      fl.push_back(at);
    }
    // results: the last value plus up to 3 others (float, not a Const)
    std::vector<int> results;
    std::vector<uint8_t> early;
    for (int t = 0; t < 4; ++t) {
      int r = t == 0 ? fl.back() : fl[rnd(uint32_t(fl.size()))];
      if (prog[size_t(r)].code == Code::Const || std::find(results.begin(), results.end(), r) != results.end()) continue;
      if (t > 0 && rnd(2)) continue;
      results.push_back(r), early.push_back(uint8_t(rnd(2)));
    }
    if (results.empty()) continue;
    const int64_t n = 1 + int64_t(rnd(70)), rows = 1 + int64_t(rnd(6));
    std::vector<float> x = special_values(n * rows + 40);
    std::rotate(x.begin(), x.begin() + rnd(40), x.end());
    x.resize(size_t(n * rows));
    std::vector<std::vector<float>> rv(static_cast<size_t>(nrow)), rep(static_cast<size_t>(nrow));
    for (int i = 0; i < nrow; ++i) {
      std::vector<float> sv = special_values(60);
      for (int64_t r = 0; r < rows; ++r) rv[size_t(i)].push_back(sv[rnd(60)]);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < n; ++j) rep[size_t(i)].push_back(rv[size_t(i)][size_t(r)]);
    }
    backends::jit::Spec a, b;
    a.prog = b.prog = &prog;
    a.stride.assign(prog.size(), 0), b.stride.assign(prog.size(), 0);
    a.stride[0] = b.stride[0] = 1;
    for (int i = 0; i < nrow; ++i) b.stride[size_t(1 + i)] = 1;
    a.results = b.results = results;
    a.early = b.early = early;
    auto la = backends::jit::build(a), lb = backends::jit::build(b);
    if (!la || !lb) { ++skipped; continue; }

    (la->row_invariants() > lb->row_invariants() ? hoisted_programs : fallback_programs)++;
    const size_t nres = results.size();
    std::vector<std::vector<float>> oa(nres, std::vector<float>(size_t(n * rows), -9.f)), ob = oa;
    std::vector<const void*> pa, pb;
    std::vector<int64_t> sa, sb;
    pa.push_back(x.data()), pb.push_back(x.data()), sa.push_back(n * 4), sb.push_back(n * 4);
    for (int i = 0; i < nrow; ++i) pa.push_back(rv[size_t(i)].data()), sa.push_back(4), pb.push_back(rep[size_t(i)].data()), sb.push_back(n * 4);
    for (size_t r = 0; r < nres; ++r) pa.push_back(oa[r].data()), pb.push_back(ob[r].data()), sa.push_back(n * 4), sb.push_back(n * 4);
    (*la)(pa.data(), n, rows, sa.data());
    (*lb)(pb.data(), n, rows, sb.data());
    for (size_t r = 0; r < nres; ++r)
      for (int64_t i = 0; i < n * rows; ++i)
        ASSERT_TRUE(same(oa[r][size_t(i)], ob[r][size_t(i)]))
            << "trial " << trial << " result " << r << " (instr " << results[r] << ") at " << i << ": " << oa[r][size_t(i)]
            << " vs " << ob[r][size_t(i)] << " n " << n << " rows " << rows << " invariants " << la->row_invariants();
  }
  EXPECT_GT(hoisted_programs, 100) << fallback_programs << " not hoisted, " << skipped << " skipped";
}

// Column sums, bit for bit against a double sum in row order per chunk of rows, the chunks'
// partials added in chunk order (reduce.cpp's order: the chunks fixed by the shape alone), on 1, 2
// and 3 threads: lone loads (summed straight from the input up to 128 columns), expressions,
// sliced and 3-D inputs.
TEST(CpuJitRows, ColumnSumsMatchChunkedRowOrderSums) {
  const int before = omp_get_max_threads();
  struct Case { int64_t R, K; int kind; };  // kind 0 lone load, 1 expression, 2 sliced lone load (cols 1..K), 3 3-D [R/4,4,K] lone load of a row-sliced tensor
  const Case cases[] = {{1031, 37, 0}, {2053, 128, 0}, {517, 129, 0}, {77, 3, 0}, {1000, 200, 1}, {300, 1500, 1},
                        {4099, 33, 1}, {1031, 37, 2}, {2053, 127, 2}, {999, 8, 1}, {1024, 128, 3}, {4096, 120, 3}, {13, 1, 0}, {9, 31, 1}};
  for (const Case& cs : cases) {
    const int64_t R = cs.R, K = cs.K, W = cs.kind == 2 ? K + 3 : K;
    std::vector<float> xv(static_cast<size_t>(R * W + (cs.kind == 3 ? 64 * W : 0)));
    uint32_t r = 11;
    for (float& v : xv) {
      r = r * 1664525u + 1013904223u;
      v = (float(int32_t(r >> 8) % 20001) / 997.0f - 10.0f) * std::ldexp(1.0f, int((r >> 3) % 24) - 12);
    }
    std::vector<float> val(static_cast<size_t>(R * K));
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < K; ++j) {
        const float x = cs.kind == 2 ? xv[size_t(i * W + 1 + j)] : xv[size_t(i * W + j)];
        val[size_t(i * K + j)] = cs.kind == 1 ? x * 2.0f + 1.0f : x;
      }
    const int64_t nblocks = (K + 1023) / 1024;
    const int64_t chunks = std::max<int64_t>(1, std::min({K * R / (int64_t(1) << 15), 16 / nblocks, R}));
    const int64_t cr = (R + chunks - 1) / chunks;
    std::vector<float> want(static_cast<size_t>(K));
    for (int64_t j = 0; j < K; ++j) {
      double s = 0;
      for (int64_t c = 0; c < chunks; ++c) {
        double p = 0;
        for (int64_t i = c * cr; i < std::min(R, (c + 1) * cr); ++i) p += double(val[size_t(i * K + j)]);
        if (chunks == 1) s = p;
        else s += p;
      }
      want[size_t(j)] = float(s);
    }
    for (int th : {1, 2, 3}) {
      omp_set_num_threads(th);
      Tensor x = from_vector<float>(xv, cs.kind == 3 ? Shape{R + 64, W} : Shape{R, W});
      std::vector<float> got;
      if (cs.kind == 0) got = x.sum({0}).to_vector<float>();
      else if (cs.kind == 1) got = (x * 2.0 + 1.0).sum({0}).to_vector<float>();
      else if (cs.kind == 2) got = x.slice(1, 1, K + 1).sum({0}).to_vector<float>();
      else got = x.slice(0, 0, R).reshape({R / 4, 4, K}).sum({0, 1}).to_vector<float>();
      ASSERT_EQ(got.size(), size_t(K));
      for (int64_t j = 0; j < K; ++j)
        ASSERT_TRUE(same(got[size_t(j)], want[size_t(j)])) << "R " << R << " K " << K << " kind " << cs.kind << " threads " << th
                                                           << " column " << j << ": " << got[size_t(j)] << " vs " << want[size_t(j)];
    }
  }
  omp_set_num_threads(before);
}

// A Reduce Step whose program is one load with a second output reducing the same instruction (what
// merge_reduces' absorb leaves for two sibling sums of one stored tensor: the shared load
// deduplicated, result_last a no-op). The direct column-sum path filled the first output only (the
// second was 0 up to 128 columns).
TEST(CpuJitRows, OneLoadTwoOutputsColumnSum) {
  for (int64_t K : {64, 128, 129}) {
    const int64_t R = 50;
    kir::Step st;
    st.kind = kir::StepKind::Reduce;
    st.domain = {R, K};
    st.axes = {0};
    st.shape = {1, K};
    st.dtype = DType::Float32;
    st.reduce_op = ir::Op::ReduceSum;
    Instr I = load(0);
    I.map.views.push_back(kir::View{{R, K}, {K, 1}, 0, {}, {}});
    st.program = {I};
    st.inputs = {0};
    st.output = 1;
    st.more_outputs = {2};
    st.more_results = {0};
    auto kern = backends::cpu::compile_reduce(st);
    std::vector<float> x(static_cast<size_t>(R * K), 1.0f), o1(static_cast<size_t>(K), -1.f), o2(static_cast<size_t>(K), -1.f);
    void* slots[] = {x.data(), o1.data(), o2.data()};
    backends::LaunchArgs args{slots};
    kern->run(st, args);
    for (int64_t j = 0; j < K; ++j) {
      ASSERT_EQ(o1[size_t(j)], float(R)) << "K " << K << " column " << j;
      ASSERT_EQ(o2[size_t(j)], float(R)) << "K " << K << " column " << j;
    }
  }
}
