// The CUDA backend, a plugin (libtessera-backend-cuda.so): Steps rendered to CUDA C by the shared
// renderer (render::cuda_c()), compiled with NVRTC to cubin for each device's own compute
// capability (cached in memory and on disk, cuda_host.h), launched through the driver API on one
// stream per device; GEMM Steps through cuBLASLt (Backend::claim); whole executables captured
// once as CUDA graphs and replayed. The driver, NVRTC and cuBLASLt are opened with dlopen when
// the plugin loads, so the plugin loads on machines without them: its factory then returns null
// with the reason, which `tessera devices` prints as "cuda: not available (<reason>)".
//
// The toolkit's headers give the types and signatures only; nothing links against CUDA.
#include <cublasLt.h>
#include <cuda.h>
#include <dlfcn.h>
#include <nvrtc.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <thread>
#include <unordered_map>

#include "backends/backend.h"
#include "backends/plugin.h"
#include "backends/render/c_render.h"
#include "core/hash.h"
#include "core/fail.h"
#include "cuda_host.h"

#ifndef TESSERA_CUDA_MAJOR
#define TESSERA_CUDA_MAJOR 13
#endif
#ifndef TESSERA_CUDA_LIB_DIR
#define TESSERA_CUDA_LIB_DIR ""
#endif
#define TS_STR2(x) #x
#define TS_STR(x) TS_STR2(x)  // after expansion: the versioned symbol cuda.h maps a name to (cuMemAlloc_v2)

namespace tessera::backends::cuda {
namespace {

// ---- the entry points, found with dlsym ----
#define TS_DRIVER(X)                                                                                         \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceTotalMem) \
  X(cuDeviceGetAttribute) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent) X(cuStreamCreate)                  \
  X(cuStreamSynchronize) X(cuGetErrorName) X(cuGetErrorString) X(cuMemAlloc) X(cuMemFree) X(cuMemHostAlloc) \
  X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync) X(cuMemcpyPeerAsync) X(cuMemsetD32Async)   \
  X(cuModuleLoadData) X(cuModuleGetFunction) X(cuLaunchKernel) X(cuEventCreate) X(cuEventRecord)            \
  X(cuEventQuery) X(cuEventSynchronize) X(cuEventDestroy) X(cuStreamBeginCapture) X(cuStreamEndCapture)     \
  X(cuGraphInstantiate) X(cuGraphLaunch) X(cuGraphDestroy) X(cuGraphExecDestroy)
#define TS_NVRTC(X)                                                                                   \
  X(nvrtcVersion) X(nvrtcCreateProgram) X(nvrtcCompileProgram) X(nvrtcGetCUBINSize) X(nvrtcGetCUBIN) \
  X(nvrtcGetProgramLogSize) X(nvrtcGetProgramLog) X(nvrtcDestroyProgram) X(nvrtcGetErrorString)
#define TS_LT(X)                                                                                              \
  X(cublasLtCreate) X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescSetAttribute) X(cublasLtMatrixLayoutCreate) \
  X(cublasLtMatrixLayoutSetAttribute) X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmul)                        \
  X(cublasLtMatmulDescDestroy) X(cublasLtMatrixLayoutDestroy)

struct Api {
#define TS_MEMBER(f) decltype(&::f) f = nullptr;
  TS_DRIVER(TS_MEMBER) TS_NVRTC(TS_MEMBER) TS_LT(TS_MEMBER)
#undef TS_MEMBER
  bool lt = false;  // cuBLASLt found (else every GEMM is rendered)
  int driver_version = 0, nvrtc_major = 0, nvrtc_minor = 0;
};
Api g;  // filled once by load(); the backend exists only when it succeeded

// By soname, then (NVRTC, cuBLASLt) in the toolkit's library folder.
void* open_library(const std::string& soname, bool toolkit, std::string* error) {
  void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h && toolkit && *TESSERA_CUDA_LIB_DIR) h = dlopen((std::string(TESSERA_CUDA_LIB_DIR) + "/" + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    *error = e ? e : soname + ": not found";
  }
  return h;
}

// Opens the driver, NVRTC and cuBLASLt; false with the reason when the backend cannot run here.
bool load(std::string* why) {
  std::string err, missing;
  void* drv = open_library("libcuda.so.1", false, &err);
  if (!drv) return *why = "no NVIDIA driver: " + err, false;
  auto sym = [&](void* lib, const char* name) {
    void* p = dlsym(lib, name);
    if (!p) missing += std::string(missing.empty() ? "" : ", ") + name;
    return p;
  };
#define TS_LOAD(f) g.f = reinterpret_cast<decltype(g.f)>(sym(drv, TS_STR(f)));
  TS_DRIVER(TS_LOAD)
#undef TS_LOAD
  if (!missing.empty()) return *why = "the NVIDIA driver lacks " + missing + " (too old for CUDA " TS_STR(TESSERA_CUDA_MAJOR) ")", false;
  CUresult r = g.cuInit(0);
  if (r == CUDA_ERROR_STUB_LIBRARY) return *why = "cuInit failed: CUDA_ERROR_STUB_LIBRARY (libcuda.so.1 is the toolkit's stub, not a driver)", false;
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    g.cuGetErrorName(r, &name);
    return *why = std::string("cuInit failed: ") + (name ? name : "CUDA error " + std::to_string(int(r))), false;
  }
  g.cuDriverGetVersion(&g.driver_version);
  if (g.driver_version < TESSERA_CUDA_MAJOR * 1000)
    return *why = "the NVIDIA driver supports CUDA " + std::to_string(g.driver_version / 1000) + "." +
                  std::to_string(g.driver_version % 1000 / 10) + "; this plugin needs CUDA " TS_STR(TESSERA_CUDA_MAJOR),
           false;
  int count = 0;
  if (g.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) return *why = "the NVIDIA driver found no GPU", false;
  const std::string nvrtc_name = "libnvrtc.so." TS_STR(TESSERA_CUDA_MAJOR);
  void* nvrtc = open_library(nvrtc_name, true, &err);
  if (!nvrtc) return *why = "NVRTC of CUDA " TS_STR(TESSERA_CUDA_MAJOR) " (" + nvrtc_name + ") not found: " + err, false;
#define TS_LOAD(f) g.f = reinterpret_cast<decltype(g.f)>(sym(nvrtc, #f));
  TS_NVRTC(TS_LOAD)
#undef TS_LOAD
  if (!missing.empty()) return *why = nvrtc_name + " lacks " + missing, false;
  g.nvrtcVersion(&g.nvrtc_major, &g.nvrtc_minor);
  if (void* lt = open_library("libcublasLt.so." TS_STR(TESSERA_CUDA_MAJOR), true, &err)) {
#define TS_LOAD(f) g.f = reinterpret_cast<decltype(g.f)>(sym(lt, #f));
    TS_LT(TS_LOAD)
#undef TS_LOAD
    g.lt = missing.empty();
  }
  return true;
}

void check(CUresult r, const std::string& what) {
  if (r == CUDA_SUCCESS) return;
  const char *name = nullptr, *text = nullptr;
  g.cuGetErrorName(r, &name);
  g.cuGetErrorString(r, &text);
  fail("cuda", what + " failed: " + (name ? name : std::to_string(int(r))) + (text ? std::string(" (") + text + ")" : ""), "");
}
void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) fail("cuda", std::string(what) + " failed (cuBLASLt status " + std::to_string(int(s)) + ")", "");
}

CUdeviceptr dptr(const void* p) { return CUdeviceptr(reinterpret_cast<uintptr_t>(p)); }

// ---- per-device state ----

constexpr size_t kChecks = 4096;           // index-check words of per-Step launches between synchronizations
constexpr size_t kWorkspace = size_t(32) << 20;  // cuBLASLt's
constexpr size_t kStageMax = size_t(64) << 20;   // larger uploads go straight from pageable memory

// A bounds-checked kernel launched since the last synchronize(): its word and what the CPU's
// error would say.
struct Check {
  CUdeviceptr word;
  std::string op, scope;
  kir::View index_view;
  DType index_dtype;
  const void* index;  // the index operand (its slot's pointer at launch)
  Shape src;
  int64_t axis;
};
struct Checks {
  CUdeviceptr words = 0;
  size_t capacity = 0;
  std::vector<Check> list;
};

struct Staging {  // a pinned host buffer for uploads, free again once `done` has passed
  void* host;
  size_t size;
  CUevent done;
};

struct Dev {
  CUdevice id = 0;
  std::string name;
  int major = 0, minor = 0, sms = 0;
  size_t memory = 0;
  CUcontext ctx = nullptr;  // the primary context, retained on first use
  CUstream stream = nullptr;
  std::unique_ptr<BlockPool> pool;
  Checks checks;                 // per-Step launches
  std::vector<Check> replayed;   // the checks of graphs replayed since the last synchronize()
  CUdeviceptr scratch = 0;       // render::kScratchSlot; outgrown ones are kept (graphs hold them)
  size_t scratch_bytes = 0;
  std::unordered_map<std::string, CUfunction> functions;  // kernel name -> loaded function
  std::vector<CUmodule> modules;  // the loaded programs behind `functions`, kept for the process's life
  cublasLtHandle_t lt = nullptr;
  CUdeviceptr workspace = 0;
  std::vector<Staging> staging;
  bool built = false;  // ready() finished: context, stream, pool, check words, cuBLASLt
  bool supported() const { return major * 10 + minor >= 75; }
};

struct CudaEvent : Event {
  CUevent e = nullptr;
  CUcontext ctx = nullptr;  // made current before each call on e: the caller's thread may have another
  ~CudaEvent() override {
    if (e && g.cuCtxSetCurrent(ctx) == CUDA_SUCCESS) g.cuEventDestroy(e);
  }
};

// A rendered Step: its kernels, and per device their functions and uploaded parameter buffers.
struct CudaKernel : Kernel {
  std::vector<render::KernelCode> code;
  struct Built {
    CUfunction fn;
    CUdeviceptr params;
    BlockPool* pool;  // the device's, which lives as long as the process
  };
  mutable std::map<int, std::vector<Built>> built;
  ~CudaKernel() override {  // the runtime synchronizes after each run: no launch still reads them
    for (auto& [dev, v] : built)
      for (Built& b : v) b.pool->free(b.params);
  }
};

// A GEMM Step run by cuBLASLt, planned per device and operand alignment on first use.
using LtKey = std::pair<int, std::array<size_t, 4>>;  // device, alignment of A, B, D and the bias (0: none)
struct LtKernel : Kernel {
  GemmPlan plan;
  DType dtype;
  std::optional<FusedBias> bias;     // an epilogue out = product + bias[n]
  kir::Step epilogue;                // ... as the renderer's Step, for when cuBLASLt cannot fuse it here
  std::unique_ptr<Kernel> fallback;  // its compiled kernel
  struct Built {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool fused = false;  // the bias is cuBLASLt's epilogue
  };
  mutable std::map<LtKey, Built> built;
  ~LtKernel() override {
    for (auto& [dev, b] : built) {
      g.cublasLtMatmulDescDestroy(b.desc);
      for (auto* l : {b.a, b.b, b.d}) g.cublasLtMatrixLayoutDestroy(l);
    }
  }
};

// A whole executable: its Steps, and a CUDA graph per set of slot pointers seen (the last four).
struct Graph {
  std::vector<void*> slots;
  void* scalars;
  CUgraphExec exec = nullptr;
  Checks checks;
};
struct CudaExecutable : Executable {
  const std::vector<kir::Step>* steps;
  std::vector<const Kernel*> kernels;
  size_t nslots;
  int device;
  BlockPool* pool;  // the device's (the graphs' check words)
  std::deque<Graph> graphs;
  int64_t captures = 0, replays = 0;
  bool step_by_step = false;  // a capture failed: launched Step by Step from then on
  ~CudaExecutable() override {  // after the runtime's synchronize: no graph still runs
    for (Graph& gr : graphs) {
      g.cuGraphExecDestroy(gr.exec);
      if (gr.checks.words) pool->free(gr.checks.words);
    }
  }
};

// TESSERA_CUDA_BUILD_LOG=<file>: a line per program compiled or read from disk and per graph
// captured (to measure cold and warm compiles, and how often a step is captured).
void build_log(const std::string& line) {
  static const char* path = std::getenv("TESSERA_CUDA_BUILD_LOG");
  if (path)
    if (FILE* f = std::fopen(path, "a")) {
      std::fputs((line + "\n").c_str(), f);
      std::fclose(f);
    }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string hex(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016" PRIx64, v);
  return b;
}

class CudaBackend : public Backend {
 public:
  CudaBackend() {
    int n = 0;
    g.cuDeviceGetCount(&n);
    devs_.resize(size_t(n));
    for (int i = 0; i < n; ++i) {
      Dev& d = devs_[size_t(i)];
      check(g.cuDeviceGet(&d.id, i), "cuDeviceGet");
      char name[256] = {};
      g.cuDeviceGetName(name, sizeof name, d.id);
      d.name = name;
      g.cuDeviceTotalMem(&d.memory, d.id);
      g.cuDeviceGetAttribute(&d.major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d.id);
      g.cuDeviceGetAttribute(&d.minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d.id);
      g.cuDeviceGetAttribute(&d.sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d.id);
    }
  }

  std::string name() const override { return "cuda"; }
  int device_count() const override { return int(devs_.size()); }
  std::string no_device_message() const override { return "no CUDA GPU found"; }

  DeviceInfo info(int index) const override {
    const Dev& d = devs_.at(size_t(index));
    char buf[512];
    std::snprintf(buf, sizeof buf, "%s, compute capability %d.%d, %d SMs, %.1f GiB, driver CUDA %d.%d, NVRTC %d.%d%s%s",
                  d.name.c_str(), d.major, d.minor, d.sms, double(d.memory) / double(1ull << 30), g.driver_version / 1000,
                  g.driver_version % 1000 / 10, g.nvrtc_major, g.nvrtc_minor, g.lt ? ", cuBLASLt" : ", no cuBLASLt (GEMMs rendered)",
                  d.supported() ? "" : "; unsupported: CUDA " TS_STR(TESSERA_CUDA_MAJOR) " builds nothing below compute capability 7.5");
    DeviceInfo i{Device("cuda", index), buf, d.supported()};
    i.accelerator = d.supported();
    return i;
  }

  kir::Target properties(int) const override {
    kir::Target t;
    t.alignment = 256;  // cuMemAlloc's, and what cuBLASLt's fastest kernels want
    return t;
  }

  void* allocate(int index, size_t nbytes) override {
    Dev& d = ready(index);
    uint64_t p = d.pool->allocate(nbytes);
    if (!p)
      fail("allocate", "out of memory on cuda:" + std::to_string(index) + " allocating " + std::to_string(nbytes) + " bytes (" +
                           std::to_string(d.pool->in_use()) + " bytes in use)", "");
    return reinterpret_cast<void*>(uintptr_t(p));
  }
  void free(int index, void* p, size_t) override { ready(index).pool->free(dptr(p)); }

  void copy_in(void* dst, const void* host, size_t n) override {
    if (!n) return;
    Dev& d = owner(dst);
    check(g.cuMemcpyHtoDAsync(dptr(dst), host, n, d.stream), "cuMemcpyHtoDAsync");
    check(g.cuStreamSynchronize(d.stream), "copying to the GPU");
  }
  void copy_out(void* host, const void* src, size_t n) override {
    if (!n) return;
    Dev& d = owner(src);
    check(g.cuMemcpyDtoHAsync(host, dptr(src), n, d.stream), "cuMemcpyDtoHAsync");
    check(g.cuStreamSynchronize(d.stream), "copying from the GPU");
  }

  // ---- asynchronous copies, device copies, events ----
  bool async_copies() const override { return true; }
  void copy_in_async(void* dst, const void* host, size_t n) override {
    if (!n) return;
    Dev& d = owner(dst);
    if (n > kStageMax) {  // returns once the driver has read the pageable source
      check(g.cuMemcpyHtoDAsync(dptr(dst), host, n, d.stream), "cuMemcpyHtoDAsync");
      return;
    }
    Staging& s = staging(d, n);
    std::memcpy(s.host, host, n);
    check(g.cuMemcpyHtoDAsync(dptr(dst), s.host, n, d.stream), "cuMemcpyHtoDAsync");
    check(g.cuEventRecord(s.done, d.stream), "cuEventRecord");
  }
  void copy_out_async(void* host, const void* src, size_t n) override {
    if (!n) return;
    Dev& d = owner(src);  // into pageable memory the copy completes before the call returns
    check(g.cuMemcpyDtoHAsync(host, dptr(src), n, d.stream), "cuMemcpyDtoHAsync");
  }
  void copy_device(void* dst, int di, const void* src, int si, size_t n) override {
    if (!n) return;
    Dev &to = ready(di), &from = ready(si);
    if (di == si) {
      check(g.cuMemcpyDtoDAsync(dptr(dst), dptr(src), n, to.stream), "cuMemcpyDtoDAsync");
      return;
    }
    check(g.cuStreamSynchronize(to.stream), "cuStreamSynchronize");  // dst is no longer in use there
    check(g.cuMemcpyPeerAsync(dptr(dst), to.ctx, dptr(src), from.ctx, n, from.stream), "cuMemcpyPeerAsync");
    check(g.cuStreamSynchronize(from.stream), "copying between GPUs");
  }
  std::unique_ptr<Event> record_event(int index) override {
    Dev& d = ready(index);
    auto e = std::make_unique<CudaEvent>();
    e->ctx = d.ctx;
    check(g.cuEventCreate(&e->e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    check(g.cuEventRecord(e->e, d.stream), "cuEventRecord");
    return e;
  }
  bool event_done(const Event& e) override {
    const auto& ce = static_cast<const CudaEvent&>(e);
    check(g.cuCtxSetCurrent(ce.ctx), "cuCtxSetCurrent");
    CUresult r = g.cuEventQuery(ce.e);
    if (r == CUDA_ERROR_NOT_READY) return false;
    check(r, "cuEventQuery");
    return true;
  }
  void wait_event(const Event& e) override {
    const auto& ce = static_cast<const CudaEvent&>(e);
    check(g.cuCtxSetCurrent(ce.ctx), "cuCtxSetCurrent");
    check(g.cuEventSynchronize(ce.e), "cuEventSynchronize");
  }

  // ---- Steps ----
  std::unique_ptr<Kernel> compile(const kir::Step& st) override {
    auto k = std::make_unique<CudaKernel>();
    k->code = render::render(st, render::cuda_c());  // Row Steps: a block per row
    for (const render::KernelCode& c : k->code) pending_.emplace(c.name, c);
    return k;
  }

  void launch(const Kernel& k, const kir::Step& st, const LaunchArgs& a) override {
    Dev& d = ready(a.device);
    launch_step(d, a.device, k, st, a.slots, a.seed, a.offset, 0, d.checks);
  }

  void synchronize() override {
    for (Dev& d : devs_)
      if (d.stream) sync_device(d);
  }

  // ---- cuBLASLt ----
  Claim claim(const kir::Step& st, int device) override {
    if (!lt_on() || st.kind != kir::StepKind::Gemm || st.conv || !lt_dtype(st.dtype) || st.maps.size() != 2) return {};
    for (DType t : st.input_dtypes)
      if (t != st.dtype) return {};
    if (!st.maps[0].single() || !st.maps[1].single() || !plan_gemm(st.shape, st.maps[0].views[0], st.maps[1].views[0])) return {};
    // A bias epilogue is cuBLASLt's (TESSERA_CUDA_LT_EPILOGUE=0: never); any other runs as the
    // renderer's Elementwise Step after the product.
    static const bool fuse = !env_off("TESSERA_CUDA_LT_EPILOGUE");
    return {true, fuse && !st.program.empty() && fused_bias(st).has_value()};
  }
  std::unique_ptr<Kernel> compile_library(const kir::Step& st) override {
    auto k = std::make_unique<LtKernel>();
    k->plan = *plan_gemm(st.shape, st.maps[0].views[0], st.maps[1].views[0]);
    k->dtype = st.dtype;
    if (!st.program.empty()) {
      k->bias = fused_bias(st);
      if (!k->bias) fail("cuda", "cuBLASLt was handed an epilogue it does not fuse: " + st.str(), "");
      k->epilogue = kir::split_epilogue(st).second;
      k->fallback = compile(k->epilogue);
    }
    return k;
  }

  // ---- CUDA graphs ----
  std::unique_ptr<Executable> compile_executable(const ExecutableSpec& spec) override {
    static const bool off = env_off("TESSERA_CUDA_GRAPHS");
    if (off) return nullptr;
    Dev& d = ready(spec.device);
    // Everything a capture may not do (compile, load modules, allocate, upload) happens now.
    for (size_t s = 0; s < spec.steps->size(); ++s) prepare(d, spec.device, *spec.kernels[s], (*spec.steps)[s]);
    auto e = std::make_unique<CudaExecutable>();
    e->steps = spec.steps;
    e->kernels = spec.kernels;
    e->nslots = spec.slots->size();
    e->device = spec.device;
    e->pool = d.pool.get();
    return e;
  }

  void run_executable(Executable& ee, const RunArgs& a) override {
    auto& e = static_cast<CudaExecutable&>(ee);
    Dev& d = ready(e.device);
    std::vector<void*> now(a.slots, a.slots + e.nslots);
    auto it = std::find_if(e.graphs.begin(), e.graphs.end(), [&](const Graph& gr) { return gr.slots == now && gr.scalars == a.scalars; });
    if (it == e.graphs.end() && (e.step_by_step || (e.captures >= 8 && e.replays < e.captures))) {
      // Its pointers rarely recur (capturing would cost more than it saves), or capturing
      // failed: Step by Step, the kernels still reading the random state from the scalars buffer.
      for (size_t s = 0; s < e.steps->size(); ++s)
        launch_step(d, e.device, *e.kernels[s], (*e.steps)[s], a.slots, 0, 0, dptr(a.scalars), d.checks);
      return;
    }
    (it == e.graphs.end() ? e.captures : e.replays)++;
    if (it == e.graphs.end()) {
      if (e.graphs.size() == 4) {
        sync_device(d);  // nothing pending refers to the oldest graph's check words
        Graph& old = e.graphs.front();
        g.cuGraphExecDestroy(old.exec);
        if (old.checks.words) d.pool->free(old.checks.words);
        e.graphs.pop_front();
      }
      try {
        e.graphs.push_back(capture(d, e, now, a.scalars));
      } catch (const std::exception& x) {  // a launch that cannot be captured still runs
        std::string why = std::string("[cuda] capturing a CUDA graph failed, launching Step by Step: ") + x.what();
        std::fprintf(stderr, "%s\n", why.c_str());
        build_log(why);
        e.step_by_step = true;
        return run_executable(ee, a);
      }
      it = std::prev(e.graphs.end());
    }
    check(g.cuGraphLaunch(it->exec, d.stream), "cuGraphLaunch");
    d.replayed.insert(d.replayed.end(), it->checks.list.begin(), it->checks.list.end());
  }

 private:
  static bool env_off(const char* name) {
    const char* e = std::getenv(name);
    return e && std::string(e) == "0";
  }
  // cuBLASLt found and not switched off (TESSERA_CUDA_CUBLASLT=0: every GEMM rendered).
  static bool lt_on() {
    static const bool on = g.lt && !env_off("TESSERA_CUDA_CUBLASLT");
    return on;
  }
  static std::optional<cudaDataType_t> lt_dtype(DType t) {
    switch (t) {
      case DType::Float32: return CUDA_R_32F;
      case DType::Float64: return CUDA_R_64F;
      case DType::Float16: return CUDA_R_16F;
      case DType::BFloat16: return CUDA_R_16BF;
      default: return std::nullopt;
    }
  }

  // The device, its context current, with its stream, pool and check words made on first use.
  Dev& ready(int index) {
    if (index < 0 || size_t(index) >= devs_.size()) fail("device", "cuda:" + std::to_string(index) + " does not exist", "");
    Dev& d = devs_[size_t(index)];
    if (d.built) {
      check(g.cuCtxSetCurrent(d.ctx), "cuCtxSetCurrent");
      return d;
    }
    if (!d.supported())
      fail("cuda", "cuda:" + std::to_string(index) + " (" + d.name + ") has compute capability " + std::to_string(d.major) + "." +
                       std::to_string(d.minor) + "; CUDA " TS_STR(TESSERA_CUDA_MAJOR) " builds nothing below 7.5", "");
    // A step that fails leaves d.built false: the next call starts again from the first step not done.
    if (!d.ctx) check(g.cuDevicePrimaryCtxRetain(&d.ctx, d.id), "cuDevicePrimaryCtxRetain");
    check(g.cuCtxSetCurrent(d.ctx), "cuCtxSetCurrent");
    if (!d.stream) check(g.cuStreamCreate(&d.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    d.pool = std::make_unique<BlockPool>(
        [](size_t n) -> uint64_t {
          CUdeviceptr p = 0;
          CUresult r = g.cuMemAlloc(&p, n);
          if (r == CUDA_ERROR_OUT_OF_MEMORY) return 0;
          check(r, "cuMemAlloc");
          return p;
        },
        [&d](uint64_t p, size_t) {
          // No queued work may use it. Called from buffer deleters: never throws (after a kernel
          // fault the context is lost and both calls fail; the fault itself was reported).
          g.cuStreamSynchronize(d.stream);
          g.cuMemFree(CUdeviceptr(p));
        });
    if (!d.checks.words) d.checks = new_checks(d, kChecks);
    if (lt_on()) {
      if (!d.lt) check_lt(g.cublasLtCreate(&d.lt), "cublasLtCreate");
      if (!d.workspace) d.workspace = must(d.pool->allocate(kWorkspace), "the cuBLASLt workspace");
    }
    d.built = true;
    return d;
  }

  static CUdeviceptr must(uint64_t p, const char* what) {
    if (!p) fail("allocate", std::string("out of GPU memory for ") + what, "");
    return CUdeviceptr(p);
  }

  Checks new_checks(Dev& d, size_t n) {
    Checks c;
    c.capacity = n;
    if (!n) return c;
    c.words = must(d.pool->allocate(4 * n), "index-check words");
    check(g.cuMemsetD32Async(c.words, unsigned(INT_MAX), n, d.stream), "cuMemsetD32Async");
    return c;
  }

  // The device whose memory holds p.
  Dev& owner(const void* p) {
    for (size_t i = 0; i < devs_.size(); ++i)
      if (devs_[i].pool && devs_[i].pool->owns(dptr(p))) return ready(int(i));
    fail("cuda", "pointer is not in any CUDA allocation", "");
  }

  // A free pinned staging buffer of at least n bytes.
  Staging& staging(Dev& d, size_t n) {
    size_t total = 0;
    for (Staging& s : d.staging) {
      total += s.size;
      if (s.size >= n && g.cuEventQuery(s.done) == CUDA_SUCCESS) return s;
    }
    if (total >= (size_t(256) << 20)) {  // enough pinned memory: wait for it to come free
      check(g.cuStreamSynchronize(d.stream), "cuStreamSynchronize");
      for (Staging& s : d.staging)
        if (s.size >= n) return s;
    }
    Staging s{nullptr, std::max(n, size_t(4) << 20), nullptr};
    check(g.cuMemHostAlloc(&s.host, s.size, 0), "cuMemHostAlloc");
    check(g.cuEventCreate(&s.done, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    d.staging.push_back(s);
    return d.staging.back();
  }

  // Everything a launch of this Step on d needs, made before any launch (and before a capture).
  void prepare(Dev& d, int index, const Kernel& kk, const kir::Step& st) {
    if (auto* lk = dynamic_cast<const LtKernel*>(&kk)) {  // planned at launch, for its pointers' alignment
      if (lk->fallback) prepare(d, index, *lk->fallback, lk->epilogue);
      return;
    }
    const auto& k = static_cast<const CudaKernel&>(kk);
    if (!k.built.count(index)) build(d, index, k);
    for (const render::KernelCode& c : k.code)
      if (size_t(c.scratch_bytes) > d.scratch_bytes) {  // the old one stays: queued work and graphs use it
        d.scratch_bytes = std::max(size_t(c.scratch_bytes), 2 * d.scratch_bytes);
        d.scratch = must(d.pool->allocate(d.scratch_bytes), "the scratch buffer");
      }
  }

  void launch_step(Dev& d, int index, const Kernel& kk, const kir::Step& st, void* const* slots, uint64_t seed,
                   uint64_t offset, CUdeviceptr rng, Checks& checks) {
    prepare(d, index, kk, st);
    if (auto* lk = dynamic_cast<const LtKernel*>(&kk)) return launch_lt(d, index, *lk, st, slots, checks);
    const auto& k = static_cast<const CudaKernel&>(kk);
    const std::vector<CudaKernel::Built>& built = k.built.at(index);
    for (size_t i = 0; i < k.code.size(); ++i) {
      const render::KernelCode& c = k.code[i];
      LaunchConfig lc = c.group_size > 0 ? launch_config(c.work_items, unsigned(c.group_size)) : launch_config(c.work_items);
      if (!lc.grid) continue;
      CUdeviceptr err = checks.words;
      if (c.checks_index) {
        if (checks.list.size() == checks.capacity) sync_device(d);  // per-Step words all used: read them now
        err = checks.words + 4 * checks.list.size();
        const kir::Source& s = st.sources.front();
        checks.list.push_back({err, s.op, s.scope, st.maps[1].views[0], st.input_dtypes.at(1), slots[st.inputs[1]],
                               st.kind == kir::StepKind::Gather ? st.maps[0].views[0].shape : st.shape, st.axis});
      }
      int64_t s64 = int64_t(seed), o64 = int64_t(offset), zero = 0;
      CUdeviceptr params = built[i].params;
      std::vector<CUdeviceptr> bufs(c.slots.size());
      std::vector<void*> args = {&params, &err, &s64, &o64, &rng};
      for (size_t a = 0; a < c.slots.size(); ++a) {
        bufs[a] = c.slots[a] == render::kScratchSlot ? d.scratch : dptr(slots[c.slots[a]]);
        args.push_back(&bufs[a]);
        args.push_back(&zero);
      }
      check(g.cuLaunchKernel(built[i].fn, lc.grid, 1, 1, lc.block, 1, 1, 0, d.stream, args.data(), nullptr),
            "launching a " + std::string(kir::step_kind_name(st.kind)) + " kernel of " + std::to_string(c.work_items) + " threads");
    }
  }

  // Compiles every rendered kernel this device lacks (in practice all the new kernels of an
  // executable), then uploads this Step's parameter buffers.
  void build(Dev& d, int index, const CudaKernel& k) {
    for (const render::KernelCode& c : k.code) pending_.emplace(c.name, c);
    std::vector<const render::KernelCode*> batch;
    for (auto& [name, c] : pending_)
      if (!d.functions.count(name)) batch.push_back(&c);
    if (!batch.empty()) load_programs(d, batch);
    pending_.clear();
    std::vector<CudaKernel::Built> out;  // k.built[index] only once complete
    for (const render::KernelCode& c : k.code) {
      size_t bytes = std::max<size_t>(1, c.params.size()) * sizeof(int64_t);
      CUdeviceptr p = must(d.pool->allocate(bytes), "a parameter buffer");
      if (!c.params.empty()) {
        check(g.cuMemcpyHtoDAsync(p, c.params.data(), bytes, d.stream), "uploading parameters");
        check(g.cuStreamSynchronize(d.stream), "uploading parameters");
      }
      out.push_back({d.functions.at(c.name), p, d.pool.get()});
    }
    k.built[index] = std::move(out);
  }

  // The kernels as programs of at least 16 kernels each, one per core at most (NVRTC compiles a
  // program on one core), each program's cubin read from the disk cache or compiled by NVRTC on
  // its own thread, then loaded. The functions stay in d.functions by kernel name (a hash of the
  // source): the in-memory cache. Modules are never unloaded.
  void load_programs(Dev& d, const std::vector<const render::KernelCode*>& batch) {
    struct Program {
      std::vector<const render::KernelCode*> kernels;
      std::string src, key, bin;
      bool from_disk = false;
      double seconds = 0;
      std::exception_ptr error;
    };
    const std::string sm = "sm_" + std::to_string(d.major * 10 + d.minor);
    std::string salt = "\n" + sm + " NVRTC " + std::to_string(g.nvrtc_major) + "." + std::to_string(g.nvrtc_minor);
    for (const std::string& o : render::cuda_c().options) salt += " " + o;
    const size_t n = std::clamp<size_t>(batch.size() / 16, 1, std::max(1u, std::thread::hardware_concurrency()));
    std::vector<Program> ps(n);
    for (size_t i = 0; i < batch.size(); ++i) ps[i % n].kernels.push_back(batch[i]);
    static const std::string dir = cache_dir();
    std::vector<std::thread> threads;
    for (Program& p : ps) {
      p.src = render::program_source(render::cuda_c(), p.kernels);
      p.key = hex(fnv1a(p.src + salt));
      p.from_disk = read_cached(dir, p.key, &p.bin);
      if (!p.from_disk)
        threads.emplace_back([&p, &sm] {
          auto t0 = std::chrono::steady_clock::now();
          try {
            p.bin = nvrtc(p.src, sm, p.kernels.size());
          } catch (...) {
            p.error = std::current_exception();
          }
          p.seconds = seconds_since(t0);
        });
    }
    for (std::thread& t : threads) t.join();
    for (Program& p : ps) {
      if (p.error) std::rethrow_exception(p.error);
      if (!p.from_disk) write_cached(dir, p.key, p.bin);
      CUmodule m = nullptr;
      check(g.cuModuleLoadData(&m, p.bin.data()), "cuModuleLoadData");
      d.modules.push_back(m);
      for (const render::KernelCode* c : p.kernels) {
        CUfunction f = nullptr;
        check(g.cuModuleGetFunction(&f, m, c->name.c_str()), "cuModuleGetFunction");
        d.functions[c->name] = f;
      }
      build_log("program " + p.key + " " + sm + " " + std::to_string(p.kernels.size()) + " kernels " +
                (p.from_disk ? "disk" : "nvrtc " + std::to_string(p.seconds) + " s"));
    }
  }

  static std::string nvrtc(const std::string& src, const std::string& sm, size_t kernels) {
    nvrtcProgram p = nullptr;
    if (g.nvrtcCreateProgram(&p, src.c_str(), "tessera.cu", 0, nullptr, nullptr) != NVRTC_SUCCESS) fail("cuda", "nvrtcCreateProgram failed", "");
    std::vector<std::string> opts = render::cuda_c().options;
    opts.push_back("--gpu-architecture=" + sm);
    std::vector<const char*> argv;
    for (const std::string& o : opts) argv.push_back(o.c_str());
    nvrtcResult r = g.nvrtcCompileProgram(p, int(argv.size()), argv.data());
    std::string out;
    if (r == NVRTC_SUCCESS) {
      size_t n = 0;
      g.nvrtcGetCUBINSize(p, &n);
      out.resize(n);
      g.nvrtcGetCUBIN(p, out.data());
    } else {
      size_t n = 0;
      g.nvrtcGetProgramLogSize(p, &n);
      out.resize(n);
      g.nvrtcGetProgramLog(p, out.data());
    }
    g.nvrtcDestroyProgram(&p);
    if (r != NVRTC_SUCCESS)
      fail("cuda", "NVRTC failed to compile " + std::to_string(kernels) + " kernels for " + sm + " (" + g.nvrtcGetErrorString(r) +
                       "):\n" + out.substr(0, 4000), "");
    return out;
  }

  // Descriptors, layouts and the heuristic's first algorithm for this GEMM on device `index`.
  const LtKernel::Built& plan_lt(Dev& d, const LtKernel& k, const LtKey& key) {
    const GemmPlan& p = k.plan;
    const cudaDataType_t t = *lt_dtype(k.dtype);
    const bool f64 = k.dtype == DType::Float64;
    static const bool tf32 = [] {
      const char* e = std::getenv("TESSERA_CUDA_TF32");
      return e && std::string(e) == "1";
    }();
    LtKernel::Built b;
    cublasComputeType_t ct = f64 ? CUBLAS_COMPUTE_64F : tf32 && k.dtype == DType::Float32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    check_lt(g.cublasLtMatmulDescCreate(&b.desc, ct, f64 ? CUDA_R_64F : CUDA_R_32F), "cublasLtMatmulDescCreate");
    auto set_desc = [&](cublasLtMatmulDescAttributes_t a, int32_t v) {
      check_lt(g.cublasLtMatmulDescSetAttribute(b.desc, a, &v, sizeof v), "cublasLtMatmulDescSetAttribute");
    };
    set_desc(CUBLASLT_MATMUL_DESC_TRANSA, p.a.transpose ? CUBLAS_OP_T : CUBLAS_OP_N);
    set_desc(CUBLASLT_MATMUL_DESC_TRANSB, p.b.transpose ? CUBLAS_OP_T : CUBLAS_OP_N);
    auto layout = [&](cublasLtMatrixLayout_t* l, uint64_t rows, uint64_t cols, int64_t ld, int64_t batch_stride) {
      check_lt(g.cublasLtMatrixLayoutCreate(l, t, rows, cols, ld), "cublasLtMatrixLayoutCreate");
      int32_t count = int32_t(p.batch);
      check_lt(g.cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), "layout");
      check_lt(g.cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride, sizeof batch_stride), "layout");
    };
    layout(&b.a, uint64_t(p.a.rows), uint64_t(p.a.cols), p.a.ld, p.a.batch_stride);
    layout(&b.b, uint64_t(p.b.rows), uint64_t(p.b.cols), p.b.ld, p.b.batch_stride);
    layout(&b.d, uint64_t(p.m), uint64_t(p.n), p.m, p.m * p.n);
    cublasLtMatmulPreference_t pref = nullptr;
    check_lt(g.cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    uint64_t ws = kWorkspace;
    g.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    for (auto [attr, align] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.second[0]},
                               std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.second[1]},
                               std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.second[2]},
                               std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.second[2]}}) {
      uint32_t v = uint32_t(align);
      g.cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof v);
    }
    cublasLtMatmulHeuristicResult_t h{};
    int found = 0;
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    // With the bias epilogue if there is one and its vector is 16-byte aligned (a bias sliced out
    // of a larger parameter may not be; the key carries its alignment), else (or failing that) without.
    for (bool fuse : {true, false}) {
      if (fuse && (!k.bias || key.second[3] < 16)) continue;
      set_desc(CUBLASLT_MATMUL_DESC_EPILOGUE, fuse ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
      s = g.cublasLtMatmulAlgoGetHeuristic(d.lt, b.desc, b.a, b.b, b.d, b.d, pref, 1, &h, &found);
      b.fused = fuse;
      if (s == CUBLAS_STATUS_SUCCESS && found > 0) break;
    }
    g.cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS || found == 0)
      fail("cuda", "cuBLASLt has no algorithm for a " + std::to_string(p.m) + "x" + std::to_string(p.n) + "x" + std::to_string(p.k) +
                       " GEMM (batch " + std::to_string(p.batch) + ", status " + std::to_string(int(s)) + ")", "");
    b.algo = h.algo;
    return k.built[key] = b;
  }

  // Row-major out[M, N] = A[M, K] B[K, N] is column-major out^T = B^T A^T: cuBLASLt's A is our B.
  void launch_lt(Dev& d, int index, const LtKernel& k, const kir::Step& st, void* const* slots, Checks& checks) {
    const GemmPlan& p = k.plan;
    const int64_t item = int64_t(itemsize(k.dtype));
    const char* A = static_cast<const char*>(slots[st.inputs[1]]) + p.a.offset * item;
    const char* B = static_cast<const char*>(slots[st.inputs[0]]) + p.b.offset * item;
    void* D = slots[st.output];
    auto align = [](const void* ptr, int64_t stride) { return alignment(256, int64_t(reinterpret_cast<uintptr_t>(ptr) % 256), stride); };
    const char* bias = k.bias ? static_cast<const char*>(slots[st.inputs[size_t(k.bias->input)]]) + k.bias->offset * item : nullptr;
    const LtKey key{index,
                    {align(A, p.a.batch_stride * item), align(B, p.b.batch_stride * item), align(D, p.m * p.n * item),
                     bias ? align(bias, 0) : 0}};
    auto found = k.built.find(key);
    const LtKernel::Built& b = found != k.built.end() ? found->second : plan_lt(d, k, key);
    const float one32 = 1, zero32 = 0;
    const double one64 = 1, zero64 = 0;
    const bool f64 = k.dtype == DType::Float64;
    if (b.fused)  // the pointer is read when the call is made (or captured)
      check_lt(g.cublasLtMatmulDescSetAttribute(b.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias), "setting the bias");
    check_lt(g.cublasLtMatmul(d.lt, b.desc, f64 ? static_cast<const void*>(&one64) : &one32, A, b.a, B, b.b,
                              f64 ? static_cast<const void*>(&zero64) : &zero32, D, b.d, D, b.d, &b.algo,
                              reinterpret_cast<void*>(uintptr_t(d.workspace)), kWorkspace, d.stream),
             "cublasLtMatmul");
    if (k.bias && !b.fused) launch_step(d, index, *k.fallback, k.epilogue, slots, 0, 0, 0, checks);
  }

  // Waits for the device's stream, then raises the first index error of a checked kernel.
  void sync_device(Dev& d) {
    check(g.cuCtxSetCurrent(d.ctx), "cuCtxSetCurrent");
    check(g.cuStreamSynchronize(d.stream), "running kernels on the GPU");
    std::vector<Check> all = std::move(d.replayed);
    all.insert(all.end(), d.checks.list.begin(), d.checks.list.end());
    d.replayed.clear();
    d.checks.list.clear();
    std::vector<int> words(all.size(), INT_MAX);
    for (size_t i = 0; i < all.size(); ++i)
      check(g.cuMemcpyDtoHAsync(&words[i], all[i].word, 4, d.stream), "reading the index checks");
    check(g.cuStreamSynchronize(d.stream), "reading the index checks");
    for (size_t i = 0; i < all.size(); ++i)
      if (words[i] != INT_MAX) check(g.cuMemsetD32Async(all[i].word, unsigned(INT_MAX), 1, d.stream), "resetting an index check");
    for (size_t i = 0; i < all.size(); ++i)
      if (words[i] != INT_MAX) index_error(d, all[i], words[i]);
  }

  // The CPU's message for the index at linear position `pos` of the index operand, read now
  // (the operand is normally a parameter, so it still holds what the kernel read).
  [[noreturn]] void index_error(Dev& d, const Check& c, int pos) {
    int64_t off = c.index_view.offset, lin = pos;
    for (size_t dd = c.index_view.shape.size(); dd-- > 0;) {
      int64_t e = std::max<int64_t>(c.index_view.shape[dd], 1);
      off += (lin % e) * c.index_view.strides[dd];
      lin /= e;
    }
    int64_t v = 0;
    const size_t item = c.index_dtype == DType::Int32 ? 4 : 8;
    check(g.cuMemcpyDtoHAsync(&v, dptr(c.index) + CUdeviceptr(off * int64_t(item)), item, d.stream), "reading an index");
    check(g.cuStreamSynchronize(d.stream), "reading an index");
    if (item == 4) v = int32_t(uint32_t(v));
    fail(c.op, "index " + std::to_string(v) + " out of range [0, " + std::to_string(c.src[size_t(c.axis)]) + ") along dimension " +
                   std::to_string(c.axis) + " of a tensor of shape " + shape_str(c.src), c.scope);
  }

  // Captures every launch of the executable with these slots as one CUDA graph. The kernels read
  // the random state from the scalars buffer (RunScalars at its start), so a replay sees each run's.
  Graph capture(Dev& d, CudaExecutable& e, const std::vector<void*>& slots, void* scalars) {
    size_t checked = 0;
    for (const Kernel* k : e.kernels)
      if (auto* ck = dynamic_cast<const CudaKernel*>(k))
        for (const render::KernelCode& c : ck->code) checked += c.checks_index;
    Graph gr{slots, scalars, nullptr, new_checks(d, checked)};
    const auto t0 = std::chrono::steady_clock::now();
    check(g.cuStreamBeginCapture(d.stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture");
    CUgraph graph = nullptr;
    bool capturing = true;
    try {
      for (size_t s = 0; s < e.steps->size(); ++s)
        launch_step(d, e.device, *e.kernels[s], (*e.steps)[s], slots.data(), 0, 0, dptr(scalars), gr.checks);
      capturing = false;
      check(g.cuStreamEndCapture(d.stream, &graph), "cuStreamEndCapture");
      CUresult r = g.cuGraphInstantiate(&gr.exec, graph, 0);
      g.cuGraphDestroy(graph);
      check(r, "cuGraphInstantiate");
    } catch (...) {
      if (capturing && g.cuStreamEndCapture(d.stream, &graph) == CUDA_SUCCESS && graph) g.cuGraphDestroy(graph);
      if (gr.checks.words) d.pool->free(gr.checks.words);
      throw;
    }
    build_log("graph " + std::to_string(e.steps->size()) + " steps captured " + std::to_string(seconds_since(t0)) + " s (capture " +
              std::to_string(e.captures) + ", " + std::to_string(e.replays) + " replays)");
    return gr;
  }

  std::vector<Dev> devs_;
  std::map<std::string, render::KernelCode> pending_;  // rendered, not yet compiled
};

std::shared_ptr<Backend> make_cuda_backend(std::string* why_not) {
  if (!load(why_not)) return nullptr;
  return std::make_shared<CudaBackend>();
}

}  // namespace
}  // namespace tessera::backends::cuda

// The driver is opened when the plugin loads (the first device query that needs plugins), never
// at start-up; without it, or without a GPU, the factory says why and the plugin is not used.
TESSERA_BACKEND_PLUGIN(tessera::backends::cuda::make_cuda_backend)
