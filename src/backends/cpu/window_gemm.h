// float32 products whose one operand is read in place through element offsets that split into a
// row part and a column part: a conv's im2col window (row: the input feature and kernel tap,
// column: the output position), which the BLAS path must first pack into a dense buffer. An
// AVX-512 register-tiled kernel (up to 24 accumulators of 16 lanes) broadcasts that operand's elements
// and multiplies them with rows of a dense operand. On the small CNN's conv shapes (M = 32 or 64
// outputs, K = 288 or 576, ~200 positions per image) it runs at ~90% of the core's peak against
// 60-77% for OpenBLAS plus the packing (docs/architecture.md, "Conv products").
#pragma once
#include <cstdint>

namespace tessera::backends::window_gemm {

// Whether this machine runs the kernel (x86-64 with AVX-512F; TESSERA_CPU_GEMM=blas turns it off,
// leaving every product to the BLAS).
bool available();

// For rows i < rows and columns j < cols:
//   p(i, j) = sum over k < K, in order, of x[xi[i] + xk[k]] * y[k * ldy + j]
// stored to c[i * ldc + j], or to c[j * ldc + i] when `transposed`; added to what c holds there
// when `accumulate`. y's rows are read in whole vectors of 16: ldy >= cols rounded up to 16, and
// every row readable that far (what lies past cols is read but never stored).
void product(const float* x, const int64_t* xi, int64_t rows, const int64_t* xk, int64_t K, const float* y, int64_t ldy,
             int64_t cols, float* c, int64_t ldc, bool transposed, bool accumulate);

// The shallow form (K < 32: a conv over one or a few channels, whose K is too short for the
// tile above to pay): the output positions are the vector lanes. For rows i < rows and the
// positions j < len (len <= 16) of a piece whose first `split` positions lie densely from x and
// the rest densely from x + off1 + split (two output rows of a conv in one vector):
//   c[i * ldc + j] = sum over k < K, in order, of at[k * ldat + i] * x[(j < split ? 0 : off1) + xk[k] + j]
// (at: the dense operand transposed, A^T; the same fused multiply-adds in the same order as
// `product`, so either form gives the same bits). Positions past len are neither read nor written.
void lanes_product(const float* x, int64_t split, int64_t off1, const int64_t* xk, int64_t K, const float* at, int64_t ldat,
                   int64_t rows, int64_t len, float* c, int64_t ldc);

// at[q * ldt + i] = a[i * rs + q] for i < m, q < k, and 0 for m <= i < m rounded up to 16
// (ldt >= that): the dense operand y of `product` from a matrix stored the other way round.
void pack_transposed(const float* a, int64_t rs, int64_t m, int64_t k, float* at, int64_t ldt);

}  // namespace tessera::backends::window_gemm
