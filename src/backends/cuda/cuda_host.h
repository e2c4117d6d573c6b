// The CUDA backend's host-side logic, apart from the driver so that it is tested on machines
// without a GPU (tests/unit/test_cuda_host.cpp): the launch configuration, the device-memory
// block pool, and the on-disk cache of compiled kernels.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "kernel_ir/step.h"

namespace tessera::backends::cuda {

// ---- launch configuration ----
// A 1-D launch of `work_items` threads in blocks of `block` (the renderer's GID is
// blockIdx.x * blockDim.x + threadIdx.x, computed in 64 bits). grid 0: nothing to launch.
struct LaunchConfig {
  unsigned grid = 0, block = 0;
};
constexpr unsigned kBlock = 256;
// Throws "[cuda] ..." when the grid would exceed the device's 2^31 - 1 blocks.
LaunchConfig launch_config(int64_t work_items, unsigned block = kBlock);

// ---- GEMMs through cuBLASLt ----
// A row-major product out[..., M, N] = lhs[..., M, K] rhs[..., K, N] over strided views, as
// cuBLASLt's column-major D[m, n] = op(A) op(B) with m = N, n = M (D is out^T, A holds rhs^T,
// B holds lhs^T): each operand is a column-major matrix of rows x cols with leading dimension
// ld, transposed or not, at `offset` elements from its slot, its batches batch_stride apart.
struct GemmOperand {
  bool transpose = false;
  int64_t rows = 0, cols = 0, ld = 0, batch_stride = 0, offset = 0;
};
struct GemmPlan {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  GemmOperand a, b;  // a: from rhs, b: from lhs
};
// nullopt when a view is masked, has negative or non-collapsible batch strides, or neither of
// its matrix dimensions is contiguous; also for empty products (the renderer takes those).
std::optional<GemmPlan> plan_gemm(const Shape& out, const kir::View& lhs, const kir::View& rhs);
// A Gemm Step's epilogue that cuBLASLt applies itself (CUBLASLT_EPILOGUE_BIAS): exactly
// out = product + bias[n], the bias a vector of the output's last dimension (contiguous, the
// Step's dtype, broadcast over every other dimension, more than 8 bytes and at a 16-byte
// aligned offset, so never a staged scalar). Which of st.inputs is the bias, and its offset in
// elements; nullopt for any other epilogue (or none).
struct FusedBias {
  int input = -1;
  int64_t offset = 0;
};
std::optional<FusedBias> fused_bias(const kir::Step& st);
// The largest power of two up to 256 that divides an address `base_align`-aligned plus
// `offset` bytes, and every batch `stride` bytes after it.
size_t alignment(size_t base_align, int64_t offset, int64_t stride);

// ---- device memory ----
// Hands out device addresses carved from chunks that `grab` provides (cuMemAlloc), so that small
// buffers (a bias, a scalar, a parameter buffer) do not each cost a driver allocation: requests
// of at most chunk/2 bytes come first-fit from shared chunks, freed ranges merge with their
// neighbours; larger ones get a chunk of their own (the memory plan's arena is one such), and
// `release` (cuMemFree) returns it when freed. Every address is a multiple of `align`; a request
// of 0 bytes still gets a distinct address. The runtime's caching allocator sits on top.
class BlockPool {
 public:
  using Grab = std::function<uint64_t(size_t)>;  // 0: out of memory
  using Release = std::function<void(uint64_t, size_t)>;
  BlockPool(Grab grab, Release release, size_t chunk = size_t(2) << 20, size_t align = 256);
  ~BlockPool();

  // 0 when `grab` fails even after trim().
  uint64_t allocate(size_t nbytes);
  void free(uint64_t addr);
  // Returns every wholly free shared chunk to the driver; the bytes returned.
  size_t trim();
  bool owns(uint64_t addr) const;  // inside a chunk of this pool
  size_t reserved() const { return reserved_; }  // bytes held from the driver
  size_t in_use() const { return in_use_; }      // bytes handed out (rounded)

 private:
  struct Chunk {
    size_t size;
    bool shared;  // carved into blocks (else one large block)
  };
  uint64_t grab_chunk(size_t size, bool shared);
  Grab grab_;
  Release release_;
  size_t chunk_, align_, reserved_ = 0, in_use_ = 0;
  std::map<uint64_t, Chunk> chunks_;      // by base address
  std::map<uint64_t, size_t> free_;       // free ranges of shared chunks, by address
  std::map<uint64_t, size_t> used_;       // handed out: address -> rounded size
};

// ---- the on-disk kernel cache ----
// Where compiled kernels are kept: $TESSERA_CUDA_CACHE, else $XDG_CACHE_HOME/tessera/cuda, else
// $HOME/.cache/tessera/cuda ("" when none of them is set: no disk cache).
std::string cache_dir();
// The file <dir>/<key>.cubin holds a header naming the payload's size and FNV-1a hash, then the
// payload. read_cached returns false for a missing file and for one whose payload does not match
// its header (a torn or corrupt entry, which it deletes, so the caller compiles again).
bool read_cached(const std::string& dir, const std::string& key, std::string* payload);
// Best effort (a read-only cache folder only costs the next process a compile): written to a
// temporary file, then renamed, so a reader never sees half an entry.
void write_cached(const std::string& dir, const std::string& key, const std::string& payload);

}  // namespace tessera::backends::cuda
