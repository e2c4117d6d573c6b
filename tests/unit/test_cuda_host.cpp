// The CUDA backend's host-side logic (src/backends/cuda/cuda_host.h), which needs no GPU: the
// launch configuration, the device-memory block pool (over a fake driver), the on-disk cubin
// cache, the GEMM plans for cuBLASLt (checked by evaluating cuBLASLt's column-major semantics on
// the host against a plain row-major product); and, where the plugin is built, what a machine
// without a driver shows: `tessera devices` prints "cuda: not available (<why>)" and exits 0,
// and a program naming cuda gets that reason as its error.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "backends/cuda/cuda_host.h"
#include "tessera/tessera.h"
#include "test_util.h"

namespace ts = tessera;
namespace tt = tessera::testing;
namespace cu = tessera::backends::cuda;

TEST(CudaLaunch, CoversTheWorkWithWholeBlocks) {
  EXPECT_EQ(cu::launch_config(0).grid, 0u);
  EXPECT_EQ(cu::launch_config(-3).grid, 0u);
  auto one = cu::launch_config(1);
  EXPECT_EQ(one.grid, 1u);
  EXPECT_EQ(one.block, 256u);
  EXPECT_EQ(cu::launch_config(256).grid, 1u);
  EXPECT_EQ(cu::launch_config(257).grid, 2u);
  EXPECT_EQ(cu::launch_config(50257 * 8, 128).grid, 3142u);  // 402056 / 128 rounded up
  // A grid of 2^31 - 1 blocks is the most a launch takes: 64-bit work counts beyond it fail clearly.
  const int64_t most = int64_t(0x7fffffff) * 256;
  EXPECT_EQ(cu::launch_config(most).grid, 0x7fffffffu);
  try {
    cu::launch_config(most + 1);
    FAIL() << "no error";
  } catch (const ts::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[cuda] a kernel of 549755813633 work items needs 2147483648 blocks", 0), 0u) << e.what();
  }
}

namespace {
// A fake driver: chunks handed out back to back (so neighbouring chunks are adjacent), a memory
// limit, and a record of what was returned.
struct FakeDriver {
  uint64_t next = uint64_t(1) << 32;
  size_t limit = size_t(1) << 30, held = 0;
  std::vector<std::pair<uint64_t, size_t>> released;
  cu::BlockPool pool{[this](size_t n) -> uint64_t {
                       if (held + n > limit) return 0;
                       held += n;
                       uint64_t a = next;
                       next += n;
                       return a;
                     },
                     [this](uint64_t a, size_t n) {
                       held -= n;
                       released.push_back({a, n});
                     },
                     4096, 256};
};
}  // namespace

TEST(CudaBlockPool, SmallBuffersShareChunksAlignedAndDistinct) {
  FakeDriver f;
  uint64_t a = f.pool.allocate(1), b = f.pool.allocate(0), c = f.pool.allocate(300);
  EXPECT_EQ(a, uint64_t(1) << 32);
  EXPECT_EQ(b, a + 256);  // 0 bytes: still a distinct, aligned address
  EXPECT_EQ(c, a + 512);
  EXPECT_EQ(f.pool.reserved(), 4096u);
  EXPECT_EQ(f.pool.in_use(), 256u + 256u + 512u);
  EXPECT_TRUE(f.pool.owns(c + 511));
  EXPECT_TRUE(f.pool.owns(a + 4095));
  EXPECT_FALSE(f.pool.owns(a + 4096));
  EXPECT_FALSE(f.pool.owns(a - 1));
  // Freed neighbours merge: 1,536 bytes fit where a, b and c were.
  f.pool.free(b);
  f.pool.free(a);
  f.pool.free(c);
  EXPECT_EQ(f.pool.in_use(), 0u);
  EXPECT_EQ(f.pool.allocate(1536), a);
  EXPECT_TRUE(f.released.empty());  // shared chunks are kept until trim()
  EXPECT_THROW(f.pool.free(a + 256), ts::Error);  // not handed out
}

TEST(CudaBlockPool, LargeBuffersGetTheirOwnChunkAndGoBackWhenFreed) {
  FakeDriver f;
  uint64_t small = f.pool.allocate(100);
  uint64_t arena = f.pool.allocate(10000);  // > chunk / 2: its own chunk, rounded to 256
  EXPECT_EQ(arena, small + 4096);
  EXPECT_EQ(f.pool.reserved(), 4096u + 10240u);
  f.pool.free(arena);
  ASSERT_EQ(f.released.size(), 1u);
  EXPECT_EQ(f.released[0], std::make_pair(arena, size_t(10240)));
  EXPECT_EQ(f.pool.reserved(), 4096u);
}

TEST(CudaBlockPool, FreeRangesNeverMergeAcrossAdjacentChunks) {
  FakeDriver f;
  std::vector<uint64_t> got;
  for (int i = 0; i < 24; ++i) got.push_back(f.pool.allocate(512));  // 8 per chunk: 3 adjacent chunks
  EXPECT_EQ(f.pool.reserved(), 3u * 4096u);
  std::set<uint64_t> distinct(got.begin(), got.end());
  EXPECT_EQ(distinct.size(), 24u);
  for (int i = 0; i < 16; ++i) f.pool.free(got[size_t(i)]);  // the first two chunks wholly free
  // A request of a whole chunk's size is large (own chunk); one of 2,048 fits in a free chunk.
  EXPECT_EQ(f.pool.allocate(2048), got[0]);
  f.pool.free(got[0]);
  EXPECT_EQ(f.pool.trim(), 2u * 4096u);  // each chunk returned whole, with its own size
  ASSERT_EQ(f.released.size(), 2u);
  EXPECT_EQ(f.released[0], std::make_pair(got[0], size_t(4096)));
  EXPECT_EQ(f.released[1], std::make_pair(got[8], size_t(4096)));
  EXPECT_EQ(f.pool.in_use(), 8u * 512u);
}

TEST(CudaBlockPool, OutOfMemoryTrimsThenReportsZero) {
  FakeDriver f;
  f.limit = 3 * 4096;
  uint64_t a = f.pool.allocate(2048), b = f.pool.allocate(2048);  // one full chunk
  uint64_t c = f.pool.allocate(512);                               // a second chunk
  ASSERT_NE(c, 0u);
  f.pool.free(c);  // the second chunk is wholly free but held
  EXPECT_EQ(f.pool.reserved(), 2u * 4096u);
  // 8,192 bytes need the driver: it has 4,096 left, so the pool trims the free chunk and retries.
  uint64_t big = f.pool.allocate(8192);
  EXPECT_NE(big, 0u);
  EXPECT_EQ(f.released.size(), 1u);
  EXPECT_EQ(f.pool.allocate(4096), 0u);  // nothing left to trim: 0, which the backend reports
  f.pool.free(a);
  f.pool.free(b);
  f.pool.free(big);
  EXPECT_EQ(f.pool.in_use(), 0u);
}

TEST(CudaBlockPool, RandomAllocationsNeverOverlap) {
  FakeDriver f;
  std::mt19937 rng(3);
  std::map<uint64_t, size_t> live;  // address -> requested bytes
  for (int step = 0; step < 4000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      size_t n = rng() % 3000;
      uint64_t a = f.pool.allocate(n);
      ASSERT_NE(a, 0u);
      ASSERT_EQ(a % 256, 0u);
      auto next = live.lower_bound(a);
      if (next != live.end()) {
        ASSERT_LE(a + std::max<size_t>(n, 1), next->first) << "overlaps the next block";
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + std::max<size_t>(prev->second, 1), a) << "overlaps the previous block";
      }
      live[a] = n;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      f.pool.free(it->first);
      live.erase(it);
    }
  }
  for (auto& [a, n] : live) f.pool.free(a);
  EXPECT_EQ(f.pool.in_use(), 0u);
  f.pool.trim();
  EXPECT_EQ(f.pool.reserved(), 0u);
  EXPECT_EQ(f.held, 0u);  // every chunk went back to the driver
}

// ---- the disk cache ----

namespace {
struct TempDir {
  std::string path;
  TempDir() {
    char t[] = "/tmp/tessera-cuda-cache-XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};
}  // namespace

TEST(CudaDiskCache, ReadsWhatItWroteAndRecompilesCorruptEntries) {
  TempDir t;
  const std::string dir = t.path + "/nested/cuda";  // created on write
  std::string payload(5000, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = char(i * 7 + 1);
  std::string got;
  EXPECT_FALSE(cu::read_cached(dir, "00ab", &got));  // missing
  cu::write_cached(dir, "00ab", payload);
  ASSERT_TRUE(cu::read_cached(dir, "00ab", &got));
  EXPECT_EQ(got, payload);
  // One flipped byte of the payload: refused and deleted, so the caller compiles again.
  const std::string file = dir + "/00ab.cubin";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-100, std::ios::end);
    f.put('\x55');
  }
  EXPECT_FALSE(cu::read_cached(dir, "00ab", &got));
  EXPECT_FALSE(std::filesystem::exists(file));
  // A torn write (the payload cut short), and a file without a header.
  cu::write_cached(dir, "00ab", payload);
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 1);
  EXPECT_FALSE(cu::read_cached(dir, "00ab", &got));
  std::ofstream(file) << "not a cubin";
  EXPECT_FALSE(cu::read_cached(dir, "00ab", &got));
  // No folder, no cache; an unwritable one costs nothing.
  cu::write_cached("", "00ab", payload);
  EXPECT_FALSE(cu::read_cached("", "00ab", &got));
  cu::write_cached("/proc/tessera-cannot-write-here", "00ab", payload);
  EXPECT_FALSE(cu::read_cached("/proc/tessera-cannot-write-here", "00ab", &got));
}

TEST(CudaDiskCache, FolderFromTheEnvironment) {
  auto keep = [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  auto restore = [](const char* name, const std::optional<std::string>& v) {
    if (v) setenv(name, v->c_str(), 1);
    else unsetenv(name);
  };
  auto own = keep("TESSERA_CUDA_CACHE"), xdg = keep("XDG_CACHE_HOME"), home = keep("HOME");
  setenv("TESSERA_CUDA_CACHE", "/a/b", 1);
  setenv("XDG_CACHE_HOME", "/x", 1);
  setenv("HOME", "/h", 1);
  EXPECT_EQ(cu::cache_dir(), "/a/b");
  unsetenv("TESSERA_CUDA_CACHE");
  EXPECT_EQ(cu::cache_dir(), "/x/tessera/cuda");
  unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(cu::cache_dir(), "/h/.cache/tessera/cuda");
  unsetenv("HOME");
  EXPECT_EQ(cu::cache_dir(), "");
  restore("TESSERA_CUDA_CACHE", own);
  restore("XDG_CACHE_HOME", xdg);
  restore("HOME", home);
}

// ---- GEMM plans ----

namespace {
using ts::kir::View;

View strided(ts::Shape shape, std::vector<int64_t> strides, int64_t offset = 0) {
  View v;
  v.shape = std::move(shape);
  v.strides = std::move(strides);
  v.offset = offset;
  return v;
}

// What cuBLASLt computes for the plan (column-major D = op(A) op(B) per batch), written out as
// row-major out[..., M, N], next to the product read through the views directly.
void check_plan(const ts::Shape& out, const View& lhs, const View& rhs, size_t lhs_elems, size_t rhs_elems) {
  auto plan = cu::plan_gemm(out, lhs, rhs);
  ASSERT_TRUE(plan.has_value());
  std::vector<double> L(lhs_elems), R(rhs_elems);
  for (size_t i = 0; i < L.size(); ++i) L[i] = double(i % 13) - 6;
  for (size_t i = 0; i < R.size(); ++i) R[i] = double(i % 7) - 3;
  const size_t r = out.size();
  const int64_t M = out[r - 2], N = out[r - 1], K = lhs.shape[r - 1];
  // Column-major element (i, j) of op(X) for an operand stored column-major with leading dimension ld.
  auto op = [](const cu::GemmOperand& o, const std::vector<double>& mem, int64_t batch, int64_t i, int64_t j) {
    int64_t row = o.transpose ? j : i, col = o.transpose ? i : j;
    return mem[size_t(o.offset + batch * o.batch_stride + row + col * o.ld)];
  };
  std::vector<int64_t> idx(r);
  for (int64_t b = 0; b < plan->batch; ++b) {
    int64_t rest = b;
    for (size_t d = r - 2; d-- > 0;) idx[d] = rest % out[d], rest /= out[d];
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double want = 0, got = 0;
        for (int64_t k = 0; k < K; ++k) {
          int64_t lo = lhs.offset, ro = rhs.offset;
          for (size_t d = 0; d + 2 < r; ++d) lo += idx[d] * lhs.strides[d], ro += idx[d] * rhs.strides[d];
          want += L[size_t(lo + m * lhs.strides[r - 2] + k * lhs.strides[r - 1])] * R[size_t(ro + k * rhs.strides[r - 2] + n * rhs.strides[r - 1])];
          // D[i = n, j = m] = sum_k A[n, k] B[k, m]: A from rhs, B from lhs.
          got += op(plan->a, R, b, n, k) * op(plan->b, L, b, k, m);
        }
        ASSERT_EQ(got, want) << "batch " << b << " m " << m << " n " << n;
      }
  }
}
}  // namespace

TEST(CudaGemmPlan, RowMajorTransposedBatchedAndBroadcastOperands) {
  // x[5, 3] @ w[3, 4], both dense.
  check_plan({5, 4}, strided({5, 3}, {3, 1}), strided({3, 4}, {4, 1}), 15, 12);
  auto p = cu::plan_gemm({5, 4}, strided({5, 3}, {3, 1}), strided({3, 4}, {4, 1}));
  EXPECT_EQ(p->m, 4);
  EXPECT_EQ(p->n, 5);
  EXPECT_EQ(p->k, 3);
  EXPECT_FALSE(p->a.transpose);
  EXPECT_EQ(p->a.ld, 4);
  // A Linear layer: x[5, 3] @ W^T with W[4, 3] dense (the rhs view has strides (1, 3)).
  check_plan({5, 4}, strided({5, 3}, {3, 1}), strided({3, 4}, {1, 3}), 15, 12);
  EXPECT_TRUE(cu::plan_gemm({5, 4}, strided({5, 3}, {3, 1}), strided({3, 4}, {1, 3}))->a.transpose);
  // A transposed lhs at an offset, with padded rows (ld 8 > 5).
  check_plan({5, 4}, strided({5, 3}, {1, 8}, 2), strided({3, 4}, {4, 1}), 2 + 3 * 8, 12);
  // Batched attention scores q[2, 3, 4, 6] @ k^T, k dense [2, 3, 5, 6]: two batch dims collapse.
  check_plan({2, 3, 4, 5}, strided({2, 3, 4, 6}, {72, 24, 6, 1}), strided({2, 3, 6, 5}, {90, 30, 1, 6}), 144, 180);
  // A weight broadcast over the batch (stride 0), and batch dims of extent 1.
  check_plan({3, 4, 2}, strided({3, 4, 5}, {20, 5, 1}), strided({3, 5, 2}, {0, 2, 1}), 60, 10);
  check_plan({1, 4, 1, 2}, strided({1, 4, 1, 5}, {99, 5, 7, 1}), strided({1, 4, 5, 2}, {0, 10, 2, 1}), 20, 40);
  // Vectors: one row, one column.
  check_plan({1, 4}, strided({1, 3}, {0, 1}), strided({3, 4}, {4, 1}), 3, 12);
  check_plan({5, 1}, strided({5, 3}, {3, 1}), strided({3, 1}, {1, 0}), 15, 3);
}

TEST(CudaGemmPlan, DeclinesWhatCuBlasLtCannotExpress) {
  View dense_l = strided({5, 3}, {3, 1}), dense_r = strided({3, 4}, {4, 1});
  EXPECT_FALSE(cu::plan_gemm({5, 4}, strided({5, 3}, {6, 2}), dense_r));          // neither dimension contiguous
  EXPECT_FALSE(cu::plan_gemm({5, 4}, strided({5, 3}, {0, 1}), dense_r));          // rows broadcast
  EXPECT_FALSE(cu::plan_gemm({5, 4}, strided({5, 3}, {1, 1}), dense_r));          // overlapping rows
  EXPECT_FALSE(cu::plan_gemm({5, 4}, dense_l, strided({3, 4}, {-4, 1}, 8)));     // reversed
  View masked = dense_l;
  masked.lo = {0, 0}, masked.hi = {4, 3};
  EXPECT_FALSE(cu::plan_gemm({5, 4}, masked, dense_r));                            // padded
  // Batch dims in another order than the output's (a permuted batch) cannot share one stride.
  EXPECT_FALSE(cu::plan_gemm({2, 3, 5, 4}, strided({2, 3, 5, 3}, {15, 30, 3, 1}), strided({2, 3, 3, 4}, {36, 12, 4, 1})));
  EXPECT_FALSE(cu::plan_gemm({0, 4}, strided({0, 3}, {3, 1}), dense_r));         // empty
  EXPECT_FALSE(cu::plan_gemm({5, 4}, strided({5, 0}, {0, 1}), strided({0, 4}, {4, 1})));
  EXPECT_TRUE(cu::plan_gemm({5, 4}, dense_l, dense_r));
}

TEST(CudaGemmPlan, AlignmentOfOperands) {
  EXPECT_EQ(cu::alignment(256, 0, 0), 256u);
  EXPECT_EQ(cu::alignment(256, 4, 0), 4u);       // one float in
  EXPECT_EQ(cu::alignment(256, 0, 3 * 4), 4u);   // batches 12 bytes apart
  EXPECT_EQ(cu::alignment(256, 64, 128), 64u);
  EXPECT_EQ(cu::alignment(8, 0, 0), 8u);         // a staged scalar slot
  EXPECT_EQ(cu::alignment(256, 2, 0), 2u);       // float16
}

namespace {
// A Gemm Step out[4, 6] = A @ B (slots 10, 11) with the epilogue `program` over the product (the
// output slot 12, which inputs[2] names) and a bias (slot 13, inputs[3]).
ts::kir::Step gemm_with(std::vector<ts::kir::Instr> program, ts::Shape shape = {4, 6}) {
  ts::kir::Step st;
  st.kind = ts::kir::StepKind::Gemm;
  st.shape = shape;
  st.dtype = ts::DType::Float32;
  st.inputs = {10, 11, 12, 13};
  st.input_dtypes = {ts::DType::Float32, ts::DType::Float32, ts::DType::Float32, ts::DType::Float32};
  st.output = 12;
  st.program = std::move(program);
  return st;
}
ts::kir::Instr load(int input, const View& v) {
  ts::kir::IndexMap m;
  m.views = {v};
  return ts::kir::Instr::load(input, ts::DType::Float32, m);
}
ts::kir::Instr op(ts::kir::Code c, int a, int b) {
  ts::kir::Instr I;
  I.code = c, I.dtype = ts::DType::Float32, I.a = a, I.b = b;
  return I;
}
}  // namespace

TEST(CudaGemmPlan, OnlyABiasOverTheLastDimensionIsFused) {
  using ts::kir::Code;
  const View product = strided({4, 6}, {6, 1}), bias = strided({4, 6}, {0, 1});
  auto b = cu::fused_bias(gemm_with({load(2, product), load(3, bias), op(Code::Add, 0, 1)}));
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->input, 3);
  EXPECT_EQ(b->offset, 0);
  b = cu::fused_bias(gemm_with({load(3, strided({4, 6}, {0, 1}, 8)), load(2, product), op(Code::Add, 1, 0)}));
  ASSERT_TRUE(b.has_value());  // either order; an offset of 32 bytes
  EXPECT_EQ(b->offset, 8);
  EXPECT_TRUE(cu::fused_bias(gemm_with({load(2, strided({2, 4, 6}, {24, 6, 1})), load(3, strided({2, 4, 6}, {0, 0, 1})),
                                        op(Code::Add, 0, 1)}, {2, 4, 6})));  // batched, broadcast over the batch too
  auto refused = [&](std::vector<ts::kir::Instr> program, ts::Shape shape = {4, 6}) { return !cu::fused_bias(gemm_with(std::move(program), shape)); };
  EXPECT_TRUE(refused({}));                                                                    // no epilogue
  EXPECT_TRUE(refused({load(2, product), load(3, strided({4, 6}, {1, 0})), op(Code::Add, 0, 1)}));  // a bias per row
  EXPECT_TRUE(refused({load(2, product), load(3, bias), op(Code::Mul, 0, 1)}));                   // a scale
  EXPECT_TRUE(refused({load(2, product), load(2, product), op(Code::Add, 0, 1)}));                // no bias
  EXPECT_TRUE(refused({load(2, product), load(3, strided({4, 6}, {6, 1})), op(Code::Add, 0, 1)}));  // a residual, not a bias
  EXPECT_TRUE(refused({load(2, product), load(3, strided({4, 6}, {0, 1}, 3)), op(Code::Add, 0, 1)}));  // 12 bytes in
  EXPECT_TRUE(refused({load(2, product), load(3, bias), op(Code::Add, 0, 1), op(Code::Tanh, 2, -1)}));  // an activation after
  EXPECT_TRUE(refused({load(2, strided({2, 6}, {6, 1})), load(3, bias), op(Code::Add, 0, 1)}));   // the product reshaped
  EXPECT_TRUE(refused({load(2, strided({4, 2}, {2, 1})), load(3, strided({4, 2}, {0, 1})), op(Code::Add, 0, 1)}, {4, 2}));  // 8 bytes: maybe a staged scalar
  auto half_bias = gemm_with({load(2, product), load(3, bias), op(Code::Add, 0, 1)});
  half_bias.input_dtypes[3] = ts::DType::Float16;
  EXPECT_FALSE(cu::fused_bias(half_bias));
}

// ---- a machine without a driver ----

namespace {
bool driver_present() {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (!h) h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  return h != nullptr;
}
}  // namespace

TEST(CudaNoDriver, DevicesPrintsWhyAndExitsZero) {
#ifndef TESSERA_CUDA_PLUGIN
  if (tt::in_ci()) FAIL() << "CI=true but the cuda plugin was not built (no CUDA toolkit found at configure time)";
  GTEST_SKIP() << "the cuda plugin is not built here (no CUDA toolkit)";
#else
  if (driver_present()) GTEST_SKIP() << "this machine has an NVIDIA driver (scripts/gpu-check covers it)";
  std::string cmd = std::string(TESSERA_CLI) + " devices 2>&1";
  int status = 0;
  std::string out = tt::run_command(cmd, &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("\ncuda: not available (no NVIDIA driver: libcuda.so.1: cannot open shared object file: No such file or "
                     "directory)\n"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("plugin not loaded: "), std::string::npos) << out;  // the cuda plugin itself loaded fine
  EXPECT_NE(out.find("\ncpu:0 "), std::string::npos) << out;
#endif
}

// The toolkit's stub libcuda.so as libcuda.so.1: every driver entry point the plugin uses is
// found by its versioned name, and cuInit's refusal is the reason.
TEST(CudaNoDriver, TheToolkitsStubIsNoDriver) {
#if !defined(TESSERA_CUDA_PLUGIN) || !defined(TESSERA_CUDA_STUB)
  GTEST_SKIP() << "the cuda plugin or the toolkit's stub driver is not here";
#else
  if (driver_present()) GTEST_SKIP() << "this machine has an NVIDIA driver";
  char dir[] = "/tmp/tessera-stub-driver-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::filesystem::create_symlink(TESSERA_CUDA_STUB, std::string(dir) + "/libcuda.so.1");
  std::string cmd = std::string("LD_LIBRARY_PATH=") + dir + " " + TESSERA_CLI + " devices 2>&1";
  int status = 0;
  std::string out = tt::run_command(cmd, &status);
  EXPECT_EQ(status, 0) << out;
  std::filesystem::remove_all(dir);
  EXPECT_NE(out.find("\ncuda: not available (cuInit failed: CUDA_ERROR_STUB_LIBRARY (libcuda.so.1 is the toolkit's stub, not a "
                     "driver))\n"),
            std::string::npos)
      << out;
#endif
}

TEST(CudaNoDriver, AProgramNamingCudaSaysWhy) {
#ifndef TESSERA_CUDA_PLUGIN
  GTEST_SKIP() << "the cuda plugin is not built here (no CUDA toolkit)";
#else
  if (driver_present()) GTEST_SKIP() << "this machine has an NVIDIA driver";
  try {
    ts::ones({2}, {ts::DType::Float32, ts::Device("cuda")}).sum().item();
    FAIL() << "no error";
  } catch (const ts::Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[device] cuda: not available (no NVIDIA driver: libcuda.so.1: cannot open shared object file", 0), 0u) << msg;
    EXPECT_NE(msg.find("libtessera-backend-cuda.so); available: cpu, "), std::string::npos) << msg;
  }
  // Everything else still runs, and best() picks the cpu.
  EXPECT_EQ(ts::Device::best(), ts::Device("cpu"));
  EXPECT_EQ((ts::ones({3}) * 2).sum().item(), 6.0);
#endif
}

// ---- the plugin over a fake driver (tests/cuda/fake_libcuda.cpp) ----
// The host side of everything the driver is called for, without a GPU: kernels do not run there
// (a launch is counted), so no value computed on "the GPU" is checked, only what moves through
// the backend's own code: enumeration, memory and copies, NVRTC to a real cubin and the disk
// cache, module loading, launches and CUDA-graph capture and replay. Each case runs in a child
// process (this binary, filtered), since the driver is found through LD_LIBRARY_PATH.

namespace {
std::string read_all(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}
bool fake_child() { return std::getenv("TESSERA_FAKE_CHILD") != nullptr; }
}  // namespace

TEST(CudaFakeDriverChild, EnumeratesCopiesCompilesAndLaunches) {
  if (!fake_child()) GTEST_SKIP() << "runs as the child of CudaFakeDriver.*";
  bool listed = false;
  for (const ts::DeviceInfo& d : ts::devices())
    if (d.device == ts::Device("cuda:0")) {
      listed = true;
      EXPECT_EQ(d.description.rfind("Tessera Fake GPU, compute capability 9.0, 4 SMs, 8.0 GiB, driver CUDA 13.0, NVRTC 13.", 0), 0u)
          << d.description;
      EXPECT_TRUE(d.can_execute && d.accelerator);
    }
  EXPECT_TRUE(listed);
  EXPECT_EQ(ts::Device::best(), ts::Device("cuda:0"));
  // Memory and copies: an upload read back, through the block pool, pinned staging and events.
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.5f;
  ts::Tensor x = ts::from_vector<float>(v, {10, 100}, {ts::DType::Float32, ts::Device("cuda")});
  EXPECT_EQ(x.to_vector<float>(), v);
  EXPECT_EQ(x.to(ts::Device("cpu")).to_vector<float>(), v);
  // Kernels: rendered, compiled by NVRTC for sm_90 (the fake driver loads only ELF images),
  // launched (not run), twice, so the second run replays its graph.
  for (int run = 0; run < 3; ++run) (x * 2.0 + 1.0).sum().item();
  ts::softmax(x, 1).to_vector<float>();  // Row Steps: a block per row, 10 rows
}

TEST(CudaFakeDriverChild, AnOldGpuIsListedButNotUsed) {
  if (!fake_child()) GTEST_SKIP() << "runs as the child of CudaFakeDriver.*";
  for (const ts::DeviceInfo& d : ts::devices())
    if (d.device == ts::Device("cuda:0")) {
      EXPECT_FALSE(d.can_execute || d.accelerator);
      EXPECT_NE(d.description.find("compute capability 7.0, 4 SMs, 8.0 GiB, driver CUDA 13.0, NVRTC 13."), std::string::npos);
      EXPECT_NE(d.description.find("; unsupported: CUDA 13 builds nothing below compute capability 7.5"), std::string::npos)
          << d.description;
    }
  EXPECT_EQ(ts::Device::best(), ts::Device("cpu"));
  try {
    ts::ones({2}, {ts::DType::Float32, ts::Device("cuda")}).sum().item();
    FAIL() << "no error";
  } catch (const ts::Error& e) {
    EXPECT_STREQ(e.what(), "[cuda] cuda:0 (Tessera Fake GPU) has compute capability 7.0; CUDA 13 builds nothing below 7.5");
  }
}

// The error word of a bounds-checked kernel (the fake driver sets output position 6, row 2 of
// the [4, 3] gather, whose index is 7) becomes the CPU's message at synchronize(), with the
// offending index read from the GPU's memory.
TEST(CudaFakeDriverChild, AnIndexErrorNamesTheValueOpAndScope) {
  if (!fake_child()) GTEST_SKIP() << "runs as the child of CudaFakeDriver.*";
  const ts::Device cuda("cuda");
  ts::Tensor w = ts::from_vector<float>(std::vector<float>(12, 1.0f), {4, 3}, {ts::DType::Float32, cuda});
  ts::Tensor idx = ts::from_vector<int64_t>({1, 2, 7, 9}, {4}, {ts::DType::Int64, cuda});
  std::string msg;
  {
    ts::Scope s{"lookup"};
    try {
      ts::index_select(w, 0, idx).to_vector<float>();
    } catch (const ts::Error& e) {
      msg = e.what();
    }
  }
  EXPECT_NE(msg.find("] index 7 out of range [0, 4) along dimension 0 of a tensor of shape [4, 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lookup"), std::string::npos) << msg;
}

#if defined(TESSERA_CUDA_PLUGIN) && defined(TESSERA_FAKE_DRIVER_DIR)
namespace {
// Runs the child test `name` over the fake driver with `env` (VAR=value ...); true when it passed.
bool run_child(const std::string& name, const std::string& env) {
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string cmd = "TESSERA_FAKE_CHILD=1 TESSERA_CUDA_CUBLASLT=0 LD_LIBRARY_PATH=" TESSERA_FAKE_DRIVER_DIR " " + env + " '" + self +
                    "' --gtest_filter=CudaFakeDriverChild." + name + " > /dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}
}  // namespace
#endif

TEST(CudaFakeDriver, CompilesIntoTheDiskCacheThenReadsIt) {
#if !defined(TESSERA_CUDA_PLUGIN) || !defined(TESSERA_FAKE_DRIVER_DIR)
  GTEST_SKIP() << "the cuda plugin is not built here (no CUDA toolkit)";
#else
  TempDir t;
  const std::string env = "TESSERA_CUDA_CACHE=" + t.path + "/cache TESSERA_CUDA_BUILD_LOG=" + t.path + "/build.log TESSERA_FAKE_LOG=" +
                          t.path + "/driver.log";
  ASSERT_TRUE(run_child("EnumeratesCopiesCompilesAndLaunches", env)) << "the child failed: rerun it with " << env;
  std::string build = read_all(t.path + "/build.log"), driver = read_all(t.path + "/driver.log");
  const size_t programs = count(build, "program ");
  EXPECT_GE(programs, 1u) << build;
  EXPECT_EQ(count(build, " sm_90 "), programs) << build;
  EXPECT_EQ(count(build, " nvrtc "), programs) << build;  // cold: every program compiled
  size_t files = 0;
  for (auto& f : std::filesystem::directory_iterator(t.path + "/cache")) files += f.path().extension() == ".cubin";
  EXPECT_EQ(files, programs);
  EXPECT_GE(count(driver, "launch t"), 1u) << driver;     // kernels launched by name, in whole blocks
  EXPECT_GE(count(driver, " 10x"), 1u) << driver;         // the softmax's rows, a block each
  EXPECT_GE(count(driver, "capture"), 1u) << driver;      // the program captured as a graph ...
  EXPECT_GT(count(driver, "graph-launch"), count(driver, "capture")) << driver;  // ... and replayed
  // A second process: every program from the disk cache.
  std::filesystem::remove(t.path + "/build.log");
  ASSERT_TRUE(run_child("EnumeratesCopiesCompilesAndLaunches", env));
  build = read_all(t.path + "/build.log");
  EXPECT_EQ(count(build, " disk"), programs) << build;
  EXPECT_EQ(count(build, " nvrtc"), 0u) << build;
  // With replay off, no capture.
  std::filesystem::remove(t.path + "/driver.log");
  ASSERT_TRUE(run_child("EnumeratesCopiesCompilesAndLaunches", env + " TESSERA_CUDA_GRAPHS=0"));
  driver = read_all(t.path + "/driver.log");
  EXPECT_EQ(count(driver, "capture"), 0u) << driver;
  EXPECT_GE(count(driver, "launch t"), 1u) << driver;
#endif
}

TEST(CudaFakeDriver, IndexErrorsAreReadBackAtSynchronize) {
#if !defined(TESSERA_CUDA_PLUGIN) || !defined(TESSERA_FAKE_DRIVER_DIR)
  GTEST_SKIP() << "the cuda plugin is not built here (no CUDA toolkit)";
#else
  TempDir t;
  for (const char* graphs : {"1", "0"})
    EXPECT_TRUE(run_child("AnIndexErrorNamesTheValueOpAndScope", "TESSERA_FAKE_INDEX_FAILS=6 TESSERA_CUDA_CACHE=" + t.path +
                                                                     " TESSERA_CUDA_GRAPHS=" + graphs))
        << "graphs " << graphs;
#endif
}

TEST(CudaFakeDriver, AGpuBelowComputeCapability75IsUnsupported) {
#if !defined(TESSERA_CUDA_PLUGIN) || !defined(TESSERA_FAKE_DRIVER_DIR)
  GTEST_SKIP() << "the cuda plugin is not built here (no CUDA toolkit)";
#else
  EXPECT_TRUE(run_child("AnOldGpuIsListedButNotUsed", "TESSERA_FAKE_CC=70"));
#endif
}

