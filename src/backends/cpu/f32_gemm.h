// float32 products through the project's own AVX-512 kernel: B packed into panels of 64 columns
// (zeros past N; a batched element's dense B read in place), A read in place where its rows are
// contiguous and packed per K block where its columns are, register tiles of 6 rows x 64 columns
// (24 accumulators), K in 256-deep blocks, one task per C tile over the whole K in a fixed order,
// so results do not depend on the thread count. A single product whose A is stored transposed
// (a weight gradient, dY^T X) runs as blocks of up to 192 x 256 whose tasks pack both operands
// per K block themselves. Which products take it rather than OpenBLAS:
// `chosen` (the measured rule; docs/architecture.md, "float32 products").
#pragma once
#include <cstdint>

namespace tessera::backends::f32_gemm {

// Whether this machine runs the kernel: x86-64 with AVX-512F and AVX-512VL, and TESSERA_CPU_GEMM
// is not "blas" (which sends every float32 product to OpenBLAS; "own" sends every product here
// that it can address and the window kernel does not take).
bool available();
// TESSERA_CPU_GEMM=own: every product this kernel can address takes it, whatever the rule says
// (a conv window the window kernel reads still goes there first).
bool forced();

// One float32 product per batch element b < batch:
//   C_b[i, j] (+)= sum over k < K, in order, of A_b(i, k) * B_b(k, j),   i < M, j < N
// A_b(i, k) = a[a_off[b] + i * ars + k * acs] with ars == 1 or acs == 1; B_b(k, j) =
// b[b_off[b] + k * brs + j * bcs] with brs == 1 or bcs == 1; C_b at c + b * M * N, rows N apart.
struct Problem {
  int64_t batch = 1, M = 0, N = 0, K = 0;
  const float* a = nullptr;
  const int64_t* a_off = nullptr;
  int64_t ars = 0, acs = 0;
  const float* b = nullptr;
  const int64_t* b_off = nullptr;
  int64_t brs = 0, bcs = 0;
  float* c = nullptr;
  bool accumulate = false;
  // An epilogue applied in registers: each register tile's final values (after its last K
  // block) become C_b(i, j) = value op x[(b * M + i) * x_rs + j] as they are stored (op: Add or
  // Mul; x_rs 0 broadcasts one row down every C_b, a bias). The same bits as storing C and
  // applying the op to what C holds, since the same single float operation runs on each element.
  enum class Epi : uint8_t { None, Add, Mul } epi = Epi::None;
  const float* x = nullptr;
  int64_t x_rs = 0;
};

// Called once per finished C tile (batch b, rows [m0, m1), columns [n0, n1)) by the task that
// computed it, while the tile is in cache: the Step's epilogue.
using TileDone = void (*)(void* ctx, int64_t b, int64_t m0, int64_t m1, int64_t n0, int64_t n1);

// Runs the product over a task grid fixed by the shape alone (OpenMP, the caller's pool).
void gemm(const Problem& p, TileDone done = nullptr, void* ctx = nullptr);

// The measured rule: whether this kernel beats OpenBLAS's (run in the backend's fixed blocks) on
// a product of this shape (the operands' layouts did not change the measured choice).
bool chosen(int64_t batch, int64_t M, int64_t N, int64_t K);

}  // namespace tessera::backends::f32_gemm
