// The CUDA dialect's block-per-row Row kernels (Dialect::row_block) compute what the one
// work-item-per-row kernels compute (those are checked on OpenCL by the conformance suite),
// without a GPU: both forms of every float32 Row Step the conformance suite plans are rendered
// with the CUDA dialect, compiled as host C++ under a small emulation of the CUDA built-ins they
// use (threads of a block as std::threads, __syncthreads as a barrier, __shfl_down_sync through
// a block-wide array), run on the same random inputs, and compared. A GPU runs the real thing in
// scripts/gpu-check's conformance section.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <barrier>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "backends/backend.h"
#include "backends/render/c_render.h"
#include "conformance/conformance.h"
#include "step_collector.h"

namespace tessera {
namespace {

// Host stand-ins for what the cuda dialect's kernels use; one block runs at a time, so the
// block's __shared__ arrays are plain statics.
const char* kEmulation = R"(#include <math.h>
#include <string.h>
#include <algorithm>
#include <barrier>
using std::min;
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
struct Dim3 { unsigned x; };
thread_local Dim3 threadIdx, blockIdx;
Dim3 blockDim;
std::barrier<>* g_block_barrier;
static inline void __syncthreads() { g_block_barrier->arrive_and_wait(); }
template <typename T> static T __shfl_down_sync(unsigned, T v, unsigned o) {
  static T lanes[1024];
  lanes[threadIdx.x] = v;
  __syncthreads();
  T r = (threadIdx.x & 31) + o < 32 ? lanes[threadIdx.x + o] : v;
  __syncthreads();
  return r;
}
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline double __longlong_as_double(long long u) { double f; memcpy(&f, &u, 8); return f; }
static inline int atomicMin(int* p, int v) { int o = *p; *p = std::min(o, v); return o; }
)";

struct RowKernels {
  kir::Step step;
  render::KernelCode rows, blocks;  // one work-item per row; one block per row
};

// Both forms of every float32 Row Step planned, each distinct one once.
struct RowSteps {
  std::vector<RowKernels> found;
  std::set<std::string> seen;
  void step(const kir::Step& st) {
    bool f32 = st.kind == kir::StepKind::Row && st.dtype == DType::Float32;
    for (const kir::Instr& I : st.program) f32 = f32 && I.dtype == DType::Float32;
    if (!f32) return;
    render::KernelCode b = render::render(st, render::cuda_c()).front();
    if (seen.insert(b.name).second) found.push_back({st, render::render(st).front(), b});
  }
};

// Elements each slot needs: the furthest element any load reads, or the output's size.
std::map<int, int64_t> slot_sizes(const kir::Step& st) {
  std::map<int, int64_t> n;
  for (const kir::Instr& I : st.program) {
    if (I.code != kir::Code::Load) continue;
    const kir::View& v = I.map.views.front();
    int64_t last = v.offset;
    for (size_t d = 0; d < v.shape.size(); ++d) last += std::max<int64_t>(0, (v.shape[d] - 1) * v.strides[d]);
    int s = st.inputs[size_t(I.input)];
    n[s] = std::max(n[s], last + 1);
  }
  for (int o : st.outputs()) n[o] = std::max(n[o], numel(st.domain));
  return n;
}

using Entry = void (*)(void**);

// Runs a kernel over its work_items in blocks of group_size (1 when it has none), on `buf`.
void launch(Entry fn, const render::KernelCode& k, std::map<int, std::vector<float>>& buf, void* dim, void* tid, void* bid,
            std::barrier<>** bar) {
  std::vector<int64_t> P = k.params;
  int E = INT_MAX;
  int64_t seed = 7, roff = 3, zero = 0;
  int64_t* p = P.data();
  int* e = &E;
  const uint64_t* rng = nullptr;  // RNG_ARGS' pointer to the state (null: seed and roff themselves)
  std::vector<void*> args{&p, &e, &seed, &roff, &rng};  // each argument's address
  std::vector<char*> ptrs;
  for (int s : k.slots) ptrs.push_back(reinterpret_cast<char*>(buf.at(s).data()));
  for (size_t a = 0; a < ptrs.size(); ++a) args.push_back(&ptrs[a]), args.push_back(&zero);
  const unsigned g = k.group_size > 0 ? unsigned(k.group_size) : 1u;
  *static_cast<unsigned*>(dim) = g;
  using Get = unsigned* (*)();
  for (int64_t b = 0; b < k.work_items / int64_t(g); ++b) {
    std::barrier<> block(g);
    *bar = &block;
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < g; ++t)
      threads.emplace_back([&, t] {
        *reinterpret_cast<Get>(tid)() = t;
        *reinterpret_cast<Get>(bid)() = unsigned(b);
        fn(args.data());
      });
    for (auto& t : threads) t.join();
  }
}

TEST(RenderRowBlocks, BlockPerRowKernelsComputeWhatRowKernelsCompute) {
  static RowSteps collector;  // registered once per process
  static bool registered = (backends::register_backend(std::make_shared<testing::StepCollector>(
                                "rowcollect", kir::Target{}, [](const kir::Step& st) { collector.step(st); })),
                            true);
  ASSERT_TRUE(registered);
  conformance::Options o;
  o.backends = {"rowcollect"};
  conformance::run(o);
  auto& found = collector.found;
  ASSERT_GE(found.size(), 5u) << "too few float32 Row Steps planned";

  // One program: the emulation, the dialect, both forms of every kernel, and an entry per kernel
  // taking its arguments as an array.
  std::vector<const render::KernelCode*> ks;
  for (auto& f : found) ks.push_back(&f.rows), ks.push_back(&f.blocks);
  std::string src = kEmulation + render::program_source(render::cuda_c(), ks);
  for (const render::KernelCode* k : ks) {
    src += "extern \"C\" void call_" + k->name + "(void** a) { " + k->name +
           "(*(const i64**)a[0], *(int**)a[1], *(i64*)a[2], *(i64*)a[3], *(const u64**)a[4]";
    for (size_t s = 0; s < k->slots.size(); ++s)
      src += ", *(char**)a[" + std::to_string(5 + 2 * s) + "], *(i64*)a[" + std::to_string(6 + 2 * s) + "]";
    src += "); }\n";
  }
  src += "extern \"C\" unsigned* tid() { return &threadIdx.x; }\nextern \"C\" unsigned* bid() { return &blockIdx.x; }\n";
  const std::string dir = ::testing::TempDir(), cpp = dir + "/row_blocks.cpp", so = dir + "/row_blocks.so";
  std::ofstream(cpp) << src;
  std::string cmd = std::string(TESSERA_CXX) + " -std=c++20 -O1 -shared -fPIC -ffp-contract=off -w -o " + so + " " + cpp;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  void* lib = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  void *dim = dlsym(lib, "blockDim"), *tid = dlsym(lib, "tid"), *bid = dlsym(lib, "bid");
  auto** bar = static_cast<std::barrier<>**>(dlsym(lib, "g_block_barrier"));
  ASSERT_TRUE(dim && tid && bid && bar);

  std::mt19937 rng(5);
  int compared = 0;
  for (auto& f : found) {
    std::map<int, std::vector<float>> in;
    for (auto [slot, n] : slot_sizes(f.step)) {
      std::vector<float>& v = in[slot];
      v.resize(size_t(n));
      for (float& x : v) x = std::uniform_real_distribution<float>(-2, 2)(rng);
    }
    auto a = in, b = in;
    launch(Entry(dlsym(lib, ("call_" + f.rows.name).c_str())), f.rows, a, dim, tid, bid, bar);
    launch(Entry(dlsym(lib, ("call_" + f.blocks.name).c_str())), f.blocks, b, dim, tid, bid, bar);
    for (int out : f.step.outputs()) {
      const std::vector<float>&x = a.at(out), &y = b.at(out);
      double worst = 0, scale = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_EQ(std::isnan(x[i]), std::isnan(y[i])) << "element " << i << " of slot " << out << ", " << f.step.str();
        if (std::isnan(x[i])) continue;
        worst = std::max(worst, std::fabs(double(x[i]) - y[i]));
        scale = std::max(scale, std::fabs(double(x[i])));
      }
      EXPECT_LE(worst, 1e-5 * std::max(scale, 1.0)) << "slot " << out << " of " << f.step.str() << "\n" << f.blocks.source;
    }
    ++compared;
  }
  std::printf("%d Row Steps: block-per-row kernels equal to row kernels (group sizes up to %d)\n", compared,
              render::cuda_c().row_block);
  dlclose(lib);
}

}  // namespace
}  // namespace tessera
