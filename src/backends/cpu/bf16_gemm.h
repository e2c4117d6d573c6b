// bfloat16 products with float32 accumulation on AVX512-BF16 (`vdpbf16ps`: per float32 lane,
// acc += a0 * b0 + a1 * b1 over a pair of bfloat16 depths, each product exact in float32). The
// products of autocast (docs/architecture.md, "Autocast"): B packed in pairs of depths, A read
// in place (rows of an even K) or packed, register tiles of up to 6 rows x 64 columns.
#pragma once
#include <cstdint>

namespace tessera::backends::bf16_gemm {

// Whether this machine runs the kernel: x86-64 with AVX512-BF16, and TESSERA_CPU_BF16 is not 0
// (which sends bfloat16 products through float32 and the BLAS, as on a machine without it).
bool available();

// Elements of B packed by pack_b: K rounded up to even times N rounded up to 16.
int64_t packed_size(int64_t K, int64_t N);

// Packs B (bfloat16 bits; element (k, n) at b[k * rs + n * cs]) for product(): per block of 16
// columns, per pair of depths, the 16 columns' two values interleaved (zeros past K and N).
void pack_b(const uint16_t* b, int64_t rs, int64_t cs, int64_t K, int64_t N, uint16_t* out);

// pack_b from float32 values, each rounded to bfloat16 (to nearest even, as half::float_to_bf16:
// the bits of a cast Step's) as it is packed: an operand whose cast the compiler folded into the
// product (Step::rounded, compiler/passes/fold_casts.cpp).
void pack_b_f32(const float* b, int64_t rs, int64_t cs, int64_t K, int64_t N, uint16_t* out);

// Packs A (element (m, k) at a[m * rs + k * cs]) as M rows of K rounded up to even (a zero past an
// odd K): an A that product() cannot read in place.
void pack_a(const uint16_t* a, int64_t rs, int64_t cs, int64_t M, int64_t K, uint16_t* out);

// pack_a from float32 values, each rounded to bfloat16 as pack_b_f32 rounds.
void pack_a_f32(const float* a, int64_t rs, int64_t cs, int64_t M, int64_t K, uint16_t* out);

// Packs an A stored by columns (element (m, k) at a[m + k * ld]: a transposed operand, the weight
// gradient's dY^T) as pairs of depths: word p * ldo + m holds A(m, 2p) in its low and A(m, 2p + 1)
// in its high 16 bits (zero past K), for p < (K + 1) / 2, m < M. Each pair is two rows of the
// source interleaved: read and written in runs, where pack_a reads one element per column stride.
void pack_a_pairs(const uint16_t* a, int64_t ld, int64_t M, int64_t K, uint32_t* out, int64_t ldo);

// pack_a_pairs from float32 values, each rounded to bfloat16 as pack_b_f32 rounds.
void pack_a_pairs_f32(const float* a, int64_t ld, int64_t M, int64_t K, uint32_t* out, int64_t ldo);

// c[m * ldc + n] = sum over k of A(m, k) * B(k, n), accumulated in float32 in pairs of depths in
// order, for m < M, n < N: A's rows lda elements apart, each K (even) long; B as pack_b wrote it.
void product(const uint16_t* a, int64_t lda, int64_t K, const uint16_t* bp, int64_t M, int64_t N, float* c, int64_t ldc);

// The same product with A as pack_a_pairs wrote it (row m's pair p at ap[p * lda + m], P pairs):
// the same instructions on the same pairs in the same order, so the same bits as product().
void product_pairs(const uint32_t* ap, int64_t lda, int64_t P, const uint16_t* bp, int64_t M, int64_t N, float* c, int64_t ldc);

}  // namespace tessera::backends::bf16_gemm
