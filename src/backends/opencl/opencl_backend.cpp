// The OpenCL backend, a plugin (libtessera-backend-opencl.so, built against the backend SDK only,
// so a machine without an OpenCL loader runs everything else): Steps rendered to OpenCL C by the shared renderer (backends/render/),
// built with clBuildProgram once per batch of new kernels (every new kernel of an executable
// goes into one program) and cached in-process by kernel name (a hash of its source); PoCL
// keeps its own disk cache (POCL_CACHE_DIR). Shapes travel in a parameter buffer made once per
// compiled Step, so one built kernel serves every shape of the same structure.
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <unordered_map>

#include "backends/backend.h"
#include "backends/plugin.h"
#include "backends/render/c_render.h"
#include "core/fail.h"

namespace tessera::backends {
namespace {

constexpr size_t kLocal = 64;  // one work-group size for every kernel: PoCL compiles per size

void check(cl_int e, const std::string& what) {
  if (e != CL_SUCCESS) fail("opencl", what + " failed (OpenCL error " + std::to_string(e) + ")", "");
}

template <class T>
T device_value(cl_device_id d, cl_device_info what) {
  T v{};
  clGetDeviceInfo(d, what, sizeof v, &v, nullptr);
  return v;
}
std::string device_string(cl_device_id d, cl_device_info what) {
  size_t n = 0;
  clGetDeviceInfo(d, what, 0, nullptr, &n);
  std::string s(n, '\0');
  clGetDeviceInfo(d, what, n, s.data(), nullptr);
  while (!s.empty() && (s.back() == '\0' || s.back() == ' ')) s.pop_back();
  return s;
}

struct Dev {
  cl_device_id id = nullptr;
  std::string platform, name, version;
  cl_device_type type = 0;
  cl_uint units = 0;
  cl_ulong memory = 0;
  bool fp64 = false;
  size_t align = 128;  // CL_DEVICE_MEM_BASE_ADDR_ALIGN, in bytes
  cl_context ctx = nullptr;
  cl_command_queue queue = nullptr;
  cl_mem err = nullptr;                                 // E[0] of bounds-checked kernels
  cl_mem scratch = nullptr;                             // render::kScratchSlot (packed operands)
  size_t scratch_bytes = 0;
  std::unordered_map<std::string, cl_program> programs;  // kernel name -> program holding it
};

struct Alloc {
  cl_mem mem;
  size_t nbytes;
  int device;
};

// A compiled Step: its rendered kernels, and per device the built kernels and parameter buffers.
struct OclKernel : Kernel {
  std::vector<render::KernelCode> code;
  struct Built {
    cl_kernel kernel = nullptr;
    cl_mem params = nullptr;
  };
  mutable std::map<int, std::vector<Built>> built;
  ~OclKernel() override {
    for (auto& [d, v] : built)
      for (Built& b : v) {
        if (b.kernel) clReleaseKernel(b.kernel);
        if (b.params) clReleaseMemObject(b.params);
      }
  }
};

class OpenCLBackend : public Backend {
 public:
  std::string name() const override { return "opencl"; }
  int device_count() const override { return int(devices().size()); }
  std::string no_device_message() const override {
    return "no OpenCL device found; install pocl-opencl-icd (OpenCL on the host CPU) or a vendor's OpenCL driver, "
           "and check with clinfo";
  }

  DeviceInfo info(int index) const override {
    const Dev& d = devices().at(size_t(index));
    const char* type = d.type & CL_DEVICE_TYPE_GPU ? "GPU" : d.type & CL_DEVICE_TYPE_CPU ? "CPU" : "accelerator";
    char buf[512];
    std::snprintf(buf, sizeof buf, "%s: %s (%s), %u compute units, %.1f GiB, fp64 %s, %s", d.platform.c_str(),
                  d.name.c_str(), type, d.units, double(d.memory) / double(1ull << 30), d.fp64 ? "yes" : "no",
                  d.version.c_str());
    DeviceInfo i{Device("opencl", index), buf, true};
    i.accelerator = !(d.type & CL_DEVICE_TYPE_CPU);
    return i;
  }

  kir::Target properties(int index) const override {
    const Dev& d = devices().at(size_t(index));
    kir::Target t;
    t.alignment = std::max<size_t>(64, d.align);
    if (!d.fp64)
      t.compute_dtypes = {DType::Bool, DType::Int32, DType::Int64, DType::Float16, DType::BFloat16, DType::Float32};
    return t;
  }

  void* allocate(int index, size_t nbytes) override {
    Dev& d = ready(index);
    cl_int e;
    cl_mem m = clCreateBuffer(d.ctx, CL_MEM_READ_WRITE, std::max<size_t>(nbytes, 1), nullptr, &e);
    if (e == CL_MEM_OBJECT_ALLOCATION_FAILURE || e == CL_OUT_OF_RESOURCES || e == CL_INVALID_BUFFER_SIZE)
      fail("allocate", "out of memory on opencl:" + std::to_string(index) + " allocating " + std::to_string(nbytes) + " bytes", "");
    check(e, "clCreateBuffer");
    // Handles, not host addresses: spaced apart so that base + offset finds its allocation.
    uintptr_t h = next_handle_;
    next_handle_ += (std::max<size_t>(nbytes, 1) + 2 * 4096 - 1) / 4096 * 4096;
    allocs_[h] = {m, nbytes, index};
    return reinterpret_cast<void*>(h);
  }
  void free(int, void* p, size_t) override {
    auto it = allocs_.find(reinterpret_cast<uintptr_t>(p));
    if (it == allocs_.end()) return;
    clReleaseMemObject(it->second.mem);
    allocs_.erase(it);
  }
  void copy_in(void* dst, const void* host, size_t n) override {
    if (!n) return;
    auto [a, off] = resolve(dst);
    check(clEnqueueWriteBuffer(ready(a->device).queue, a->mem, CL_TRUE, off, n, host, 0, nullptr, nullptr), "clEnqueueWriteBuffer");
  }
  void copy_out(void* host, const void* src, size_t n) override {
    if (!n) return;
    auto [a, off] = resolve(src);
    check(clEnqueueReadBuffer(ready(a->device).queue, a->mem, CL_TRUE, off, n, host, 0, nullptr, nullptr), "clEnqueueReadBuffer");
  }

  std::unique_ptr<Kernel> compile(const kir::Step& st) override {
    auto k = std::make_unique<OclKernel>();
    k->code = render::render(st);
    for (const render::KernelCode& c : k->code) pending_.emplace(c.name, c);
    return k;
  }

  void launch(const Kernel& kk, const kir::Step& st, const LaunchArgs& args) override {
    const auto& k = static_cast<const OclKernel&>(kk);
    Dev& d = ready(args.device);
    std::vector<OclKernel::Built>& built = k.built[args.device];
    if (built.empty()) build(d, args.device, k, st);
    for (size_t i = 0; i < k.code.size(); ++i) {
      const render::KernelCode& c = k.code[i];
      if (c.work_items == 0) continue;
      cl_kernel kern = built[i].kernel;
      cl_long seed = cl_long(args.seed), off = cl_long(args.offset);
      clSetKernelArg(kern, 0, sizeof(cl_mem), &built[i].params);
      clSetKernelArg(kern, 1, sizeof(cl_mem), &d.err);
      clSetKernelArg(kern, 2, sizeof seed, &seed);
      clSetKernelArg(kern, 3, sizeof off, &off);
      if (size_t(c.scratch_bytes) > d.scratch_bytes) {  // released once the queued kernels finish
        if (d.scratch) clReleaseMemObject(d.scratch);
        cl_int e;
        d.scratch = clCreateBuffer(d.ctx, CL_MEM_READ_WRITE, size_t(c.scratch_bytes), nullptr, &e);
        check(e, "clCreateBuffer (scratch)");
        d.scratch_bytes = size_t(c.scratch_bytes);
      }
      for (size_t a = 0; a < c.slots.size(); ++a) {
        cl_mem mem = d.scratch;
        cl_long o = 0;
        if (c.slots[a] != render::kScratchSlot) {
          auto [al, boff] = resolve(args.slots[c.slots[a]]);
          mem = al->mem;
          o = cl_long(boff);
        }
        clSetKernelArg(kern, cl_uint(4 + 2 * a), sizeof(cl_mem), &mem);
        clSetKernelArg(kern, cl_uint(5 + 2 * a), sizeof o, &o);
      }
      size_t global = (size_t(c.work_items) + kLocal - 1) / kLocal * kLocal, local = kLocal;
      check(clEnqueueNDRangeKernel(d.queue, kern, 1, nullptr, &global, &local, 0, nullptr, nullptr),
            "launching " + std::string(kir::step_kind_name(st.kind)) + " kernel");
      if (c.checks_index) check_index(d, st, args);
    }
  }

  void synchronize() override {
    for (Dev& d : devices())
      if (d.queue) check(clFinish(d.queue), "clFinish");
  }

 private:
  std::vector<Dev>& devices() const {
    if (!enumerated_) {
      enumerated_ = true;
      cl_uint np = 0;
      if (clGetPlatformIDs(0, nullptr, &np) != CL_SUCCESS) np = 0;
      std::vector<cl_platform_id> ps(np);
      if (np) clGetPlatformIDs(np, ps.data(), nullptr);
      for (cl_platform_id p : ps) {
        size_t n = 0;
        clGetPlatformInfo(p, CL_PLATFORM_NAME, 0, nullptr, &n);
        std::string pname(n, '\0');
        clGetPlatformInfo(p, CL_PLATFORM_NAME, n, pname.data(), nullptr);
        while (!pname.empty() && pname.back() == '\0') pname.pop_back();
        cl_uint nd = 0;
        if (clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, nullptr, &nd) != CL_SUCCESS) continue;
        std::vector<cl_device_id> ds(nd);
        clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, nd, ds.data(), nullptr);
        for (cl_device_id id : ds) {
          Dev d;
          d.id = id;
          d.platform = pname;
          d.name = device_string(id, CL_DEVICE_NAME);
          d.version = device_string(id, CL_DEVICE_VERSION);
          d.type = device_value<cl_device_type>(id, CL_DEVICE_TYPE);
          d.units = device_value<cl_uint>(id, CL_DEVICE_MAX_COMPUTE_UNITS);
          d.memory = device_value<cl_ulong>(id, CL_DEVICE_GLOBAL_MEM_SIZE);
          d.fp64 = device_string(id, CL_DEVICE_EXTENSIONS).find("cl_khr_fp64") != std::string::npos;
          d.align = device_value<cl_uint>(id, CL_DEVICE_MEM_BASE_ADDR_ALIGN) / 8;
          devs_.push_back(std::move(d));
        }
      }
    }
    return devs_;
  }

  // The device with its context, queue and error word, made on first use.
  Dev& ready(int index) {
    std::vector<Dev>& ds = devices();
    if (index < 0 || size_t(index) >= ds.size()) fail("device", no_device_message(), "");
    Dev& d = ds[size_t(index)];
    if (d.ctx) return d;
    cl_int e;
    d.ctx = clCreateContext(nullptr, 1, &d.id, nullptr, nullptr, &e);
    check(e, "clCreateContext");
    d.queue = clCreateCommandQueue(d.ctx, d.id, 0, &e);
    check(e, "clCreateCommandQueue");
    int none = INT_MAX;
    d.err = clCreateBuffer(d.ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof none, &none, &e);
    check(e, "clCreateBuffer");
    return d;
  }

  std::pair<const Alloc*, size_t> resolve(const void* p) const {
    uintptr_t x = reinterpret_cast<uintptr_t>(p);
    auto it = allocs_.upper_bound(x);
    if (it == allocs_.begin() || x > std::prev(it)->first + std::prev(it)->second.nbytes)
      fail("opencl", "pointer is not in any OpenCL allocation", "");
    --it;
    return {&it->second, size_t(x - it->first)};
  }

  // Builds every kernel rendered since the last build that this device lacks, as one program,
  // then makes this Step's kernels and parameter buffers.
  void build(Dev& d, int index, const OclKernel& k, const kir::Step& st) {
    for (const render::KernelCode& c : k.code) {
      if (c.uses_f64 && !d.fp64)
        fail(st.sources.front().op, "float64 is not supported by opencl:" + std::to_string(index) + " (" + d.name +
                                        " has no cl_khr_fp64); step " + st.str(), st.sources.front().scope);
      pending_.emplace(c.name, c);
    }
    std::vector<const render::KernelCode*> batch;
    for (auto& [name, c] : pending_)
      if (!d.programs.count(name) && (d.fp64 || !c.uses_f64)) batch.push_back(&c);
    if (!batch.empty()) {
      std::string src = render::program_source(render::opencl_c(), batch);
      const char* s = src.c_str();
      cl_int e;
      cl_program prog = clCreateProgramWithSource(d.ctx, 1, &s, nullptr, &e);
      check(e, "clCreateProgramWithSource");
      // No fast-math options: results must match the CPU's rounding.
      e = clBuildProgram(prog, 1, &d.id, "-cl-std=CL1.2", nullptr, nullptr);
      if (e != CL_SUCCESS) {
        size_t n = 0;
        clGetProgramBuildInfo(prog, d.id, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n);
        std::string log(n, '\0');
        clGetProgramBuildInfo(prog, d.id, CL_PROGRAM_BUILD_LOG, n, log.data(), nullptr);
        fail("opencl", "building " + std::to_string(batch.size()) + " kernels failed (error " + std::to_string(e) +
                           "):\n" + log.substr(0, 4000), "");
      }
      for (const render::KernelCode* c : batch) d.programs[c->name] = prog;
      // TESSERA_OPENCL_BUILD_LOG=<file>: one line per kernel built (to count a test run's builds).
      static const char* log_path = std::getenv("TESSERA_OPENCL_BUILD_LOG");
      if (log_path)
        if (FILE* f = std::fopen(log_path, "a")) {
          for (const render::KernelCode* c : batch) std::fprintf(f, "%s %zu\n", c->name.c_str(), batch.size());
          std::fclose(f);
        }
    }
    pending_.clear();
    std::vector<OclKernel::Built>& out = k.built[index];
    for (const render::KernelCode& c : k.code) {
      cl_int e;
      OclKernel::Built b;
      b.kernel = clCreateKernel(d.programs.at(c.name), c.name.c_str(), &e);
      check(e, "clCreateKernel");
      size_t bytes = std::max<size_t>(1, c.params.size()) * sizeof(int64_t);
      b.params = clCreateBuffer(d.ctx, CL_MEM_READ_ONLY | (c.params.empty() ? 0 : CL_MEM_COPY_HOST_PTR), bytes,
                                c.params.empty() ? nullptr : const_cast<int64_t*>(c.params.data()), &e);
      check(e, "clCreateBuffer");
      out.push_back(b);
    }
  }

  // After a bounds-checked kernel: the lowest failing position, if any, as the CPU reports it.
  void check_index(Dev& d, const kir::Step& st, const LaunchArgs& args) {
    int pos = INT_MAX;
    check(clEnqueueReadBuffer(d.queue, d.err, CL_TRUE, 0, sizeof pos, &pos, 0, nullptr, nullptr), "reading the index check");
    if (pos == INT_MAX) return;
    int none = INT_MAX;
    check(clEnqueueWriteBuffer(d.queue, d.err, CL_TRUE, 0, sizeof none, &none, 0, nullptr, nullptr), "resetting the index check");
    const kir::View& iv = st.maps[1].views[0];
    int64_t off = iv.offset, lin = pos;
    for (size_t dd = iv.shape.size(); dd-- > 0;) {
      int64_t e = std::max<int64_t>(iv.shape[dd], 1);
      off += (lin % e) * iv.strides[dd];
      lin /= e;
    }
    DType it = st.input_dtypes.at(1);
    int64_t v = 0;
    auto [a, boff] = resolve(args.slots[st.inputs[1]]);
    if (it == DType::Int32) {
      int32_t x;
      check(clEnqueueReadBuffer(d.queue, a->mem, CL_TRUE, boff + size_t(off) * 4, 4, &x, 0, nullptr, nullptr), "read");
      v = x;
    } else {
      check(clEnqueueReadBuffer(d.queue, a->mem, CL_TRUE, boff + size_t(off) * 8, 8, &v, 0, nullptr, nullptr), "read");
    }
    const Shape& src = st.kind == kir::StepKind::Gather ? st.maps[0].views[0].shape : st.shape;
    const kir::Source& s = st.sources.front();
    fail(s.op, "index " + std::to_string(v) + " out of range [0, " + std::to_string(src[size_t(st.axis)]) +
                   ") along dimension " + std::to_string(st.axis) + " of a tensor of shape " + shape_str(src),
         s.scope);
  }

  mutable bool enumerated_ = false;
  mutable std::vector<Dev> devs_;
  std::map<uintptr_t, Alloc> allocs_;
  uintptr_t next_handle_ = uintptr_t(1) << 40;
  std::map<std::string, render::KernelCode> pending_;  // rendered, not yet built
};

std::shared_ptr<Backend> make_opencl_backend(std::string*) { return std::make_shared<OpenCLBackend>(); }

}  // namespace
}  // namespace tessera::backends

// Devices are enumerated lazily (the first device_count()), so loading the plugin costs no
// driver start-up; without any device, backend_for names the packages to install.
TESSERA_BACKEND_PLUGIN(tessera::backends::make_opencl_backend)
