// The CPU backend's window product kernel (backends/cpu/window_gemm) against a float64 sum of the
// same terms: offsets split into row and column parts, every column width from one vector to
// several passes, partial row tiles, transposed and accumulating stores; and its transposing pack.
// The tests skip only on a CPU without AVX-512F; on one with it the kernel must also be the one
// the backend runs (under CI=true even TESSERA_CPU_GEMM=blas is a failure here).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/cpu/window_gemm.h"
#include "test_util.h"

namespace {

namespace wg = tessera::backends::window_gemm;

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") != 0;
}
#define REQUIRE_AVX512() \
  if (!cpu_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512F"

TEST(WindowGemm, RunsWhereTheCpuHasAvx512) {
  REQUIRE_AVX512();
  const char* e = std::getenv("TESSERA_CPU_GEMM");
  if (e && std::string(e) == "blas" && !tessera::testing::in_ci()) GTEST_SKIP() << "TESSERA_CPU_GEMM=blas";
  EXPECT_TRUE(wg::available()) << "the CPU has AVX-512F but conv products would go to the BLAS";
}

std::vector<float> values(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  for (float& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = float(int32_t(seed >> 9) % 2001) / 1000.0f - 1.0f;
  }
  return v;
}

TEST(WindowGemm, ProductsMatchAFloat64Sum) {
  REQUIRE_AVX512();
  // x: a padded 2-channel 9x10 image; rows = output positions of a 3x2 window, K = channel x tap.
  const int64_t H = 9, W = 10, C = 2;
  const std::vector<float> x = values(size_t(C * H * W), 1);
  std::vector<int64_t> xk, xi;
  for (int64_t c = 0; c < C; ++c)
    for (int64_t ky = 0; ky < 3; ++ky)
      for (int64_t kx = 0; kx < 2; ++kx) xk.push_back(c * H * W + ky * W + kx);
  for (int64_t oy = 0; oy < H - 2; ++oy)
    for (int64_t ox = 0; ox < W - 1; ++ox) xi.push_back(oy * W + ox);
  const int64_t K = int64_t(xk.size());
  for (int64_t cols : {1, 5, 16, 33, 48, 64, 70, 130})
    for (int64_t rows : {int64_t(1), int64_t(7), int64_t(13), int64_t(xi.size())})
      for (bool transposed : {false, true})
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE("cols " + std::to_string(cols) + " rows " + std::to_string(rows) + (transposed ? " transposed" : "") +
                       (accumulate ? " accumulate" : ""));
          const int64_t ldy = (cols + 15) / 16 * 16 + 3;
          const std::vector<float> y = values(size_t(K * ldy), uint32_t(cols * 31 + rows));
          const int64_t ldc = (transposed ? rows : cols) + 2;
          const int64_t crow = transposed ? cols : rows;
          std::vector<float> c = values(size_t(crow * ldc), 7), before = c;
          wg::product(x.data(), xi.data(), rows, xk.data(), K, y.data(), ldy, cols, c.data(), ldc, transposed, accumulate);
          int bad = 0;
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < cols; ++j) {
              double want = 0;
              for (int64_t k = 0; k < K; ++k) want += double(x[size_t(xi[size_t(i)] + xk[size_t(k)])]) * y[size_t(k * ldy + j)];
              const size_t at = size_t(transposed ? j * ldc + i : i * ldc + j);
              if (accumulate) want += before[at];
              if (std::fabs(c[at] - want) > 1e-5 * (1 + std::fabs(want)) && bad++ < 3)
                ADD_FAILURE() << "(" << i << ", " << j << "): " << c[at] << " want " << want;
              c[at] = before[at];  // what is left must be untouched
            }
          EXPECT_EQ(c, before) << "an element outside the product was written";
        }
}

// The shallow form: positions as lanes, pieces of one run or of two runs (two output rows of a
// conv in one vector), every row count from one to several tiles of 16, against the float64 sum.
TEST(WindowGemm, LanesProductsMatchAFloat64Sum) {
  REQUIRE_AVX512();
  // x: a padded 1-channel 9x12 image, 3x3 taps (K = 9), positions of output rows 10 wide.
  const int64_t W = 12;
  const std::vector<float> x = values(size_t(9 * W + 16), 3);
  std::vector<int64_t> xk;
  for (int64_t ky = 0; ky < 3; ++ky)
    for (int64_t kx = 0; kx < 3; ++kx) xk.push_back(ky * W + kx);
  const int64_t K = int64_t(xk.size());
  struct Piece { int64_t split, len; };  // lanes from output row 0 (at x), the rest from row 1
  for (Piece pc : {Piece{10, 10}, Piece{1, 1}, Piece{7, 7}, Piece{10, 16}, Piece{4, 9}})
    for (int64_t rows : {1, 4, 15, 16, 21, 37}) {
      SCOPED_TRACE("split " + std::to_string(pc.split) + " len " + std::to_string(pc.len) + " rows " + std::to_string(rows));
      const int64_t ldat = rows + 3, ldc = 19;
      const std::vector<float> at = values(size_t(K * ldat), uint32_t(rows * 7 + pc.len));
      std::vector<float> c = values(size_t(rows * ldc), 11), before = c;
      const int64_t off1 = W - pc.split;  // row 1's first position lies W past row 0's
      wg::lanes_product(x.data(), pc.split, off1, xk.data(), K, at.data(), ldat, rows, pc.len, c.data(), ldc);
      int bad = 0;
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < pc.len; ++j) {
          const int64_t pos = j < pc.split ? j : W + (j - pc.split);
          double want = 0;
          for (int64_t k = 0; k < K; ++k) want += double(at[size_t(k * ldat + i)]) * x[size_t(pos + xk[size_t(k)])];
          const size_t idx = size_t(i * ldc + j);
          if (std::fabs(c[idx] - want) > 1e-5 * (1 + std::fabs(want)) && bad++ < 3)
            ADD_FAILURE() << "(" << i << ", " << j << "): " << c[idx] << " want " << want;
          c[idx] = before[idx];
        }
      EXPECT_EQ(c, before) << "an element outside the product was written";
    }
}

TEST(WindowGemm, PackTransposedZeroesThePadding) {
  REQUIRE_AVX512();
  for (int64_t m : {1, 16, 21, 64})
    for (int64_t k : {1, 15, 16, 37}) {
      SCOPED_TRACE("m " + std::to_string(m) + " k " + std::to_string(k));
      const int64_t rs = k + 5, ldt = (m + 15) / 16 * 16;
      const std::vector<float> a = values(size_t(m * rs), uint32_t(m + 100 * k));
      std::vector<float> at(size_t(k * ldt), 99.0f);
      wg::pack_transposed(a.data(), rs, m, k, at.data(), ldt);
      for (int64_t q = 0; q < k; ++q)
        for (int64_t i = 0; i < ldt; ++i)
          ASSERT_EQ(at[size_t(q * ldt + i)], i < m ? a[size_t(i * rs + q)] : 0.0f) << "(" << q << ", " << i << ")";
    }
}

}  // namespace
