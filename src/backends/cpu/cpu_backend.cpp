// The CPU backend: memory is host memory; each Step compiles to the kernel of its kind's engine
// (kernel.h): programs run over L1-sized tiles by the interpreter (interpreter.h) or as native
// loops (native_loops.h, jit_x86.h); matmul through OpenBLAS (its OpenMP build, sharing our
// OpenMP pool) or window_gemm.h; indexing and copies by their own engines.
#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backends/backend.h"
#include "backends/collective.h"
#include "backends/communicator.h"
#include "backends/cpu/kernel.h"
#include "core/fail.h"

namespace tessera::backends {
namespace {

using kir::Step;
using kir::StepKind;

// A collective Step: run through the calling thread's communicator (backends/collective.h).
struct CollectiveKernel : cpu::CpuKernel {
  void run(const Step& st, const LaunchArgs& args) const override { run_collective_on_host(st, args.slots); }
};

class CpuBackend : public Backend {
 public:
  // Parallelism comes from our pool only. In OpenBLAS's OpenMP build this call also shrinks
  // the calling thread's OpenMP team, so the team size is put back.
  CpuBackend() {
    int n = omp_get_max_threads();
    openblas_set_num_threads(1);
    omp_set_num_threads(n);
  }
  std::string name() const override { return "cpu"; }
  DeviceInfo info(int index) const override {
    double gib = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE)) / double(1ull << 30);
    char buf[320];
    std::snprintf(buf, sizeof buf, "host CPU, %d threads (OpenMP), %.1f GiB memory, BLAS: %s (one thread per call)",
                  omp_get_max_threads(), gib, openblas_get_config());
    return {Device("cpu", index), buf, true};
  }
  kir::Target properties(int) const override {
    kir::Target t;
    t.collectives = true;  // through the current communicator
    t.gemm_accumulate = true;  // every product path adds into its output (gemm.cpp)
    t.attention = true;  // the fused attention Step (attention.cpp)
    t.gemm_out_strides = true;  // the BLAS path writes C through them (gemm.cpp)
    t.gemm_out_offset = true;   // and from Step::out_offset
    t.attention_out_maps = true;  // attention Steps write through Step::out_maps (attention.cpp)
    t.attention_bf16 = true;      // and run autocast's bfloat16 attention (attention.cpp)
    t.gemm_rounds_operands = true;  // bf16 products round float32 operands as they pack them (gemm.cpp)
    t.multi_reduce = true;  // sibling Reduce Steps as one with several outputs (reduce.cpp)
    t.elementwise_parts = true;  // an optimizer's updates as one task grid (elementwise.cpp)
    return t;
  }
  void* allocate(int, size_t nbytes) override {
    size_t n = (std::max<size_t>(nbytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, n);
    if (!p) fail("allocate", "out of host memory allocating " + std::to_string(nbytes) + " bytes", "");
    return p;
  }
  void free(int, void* p, size_t) override { std::free(p); }
  void copy_in(void* dst, const void* host, size_t n) override { if (n) std::memcpy(dst, host, n); }
  void copy_out(void* host, const void* src, size_t n) override { if (n) std::memcpy(host, src, n); }
  void copy_device(void* dst, int, const void* src, int, size_t n) override { if (n) std::memcpy(dst, src, n); }

  std::unique_ptr<Kernel> compile(const Step& st) override {
    switch (st.kind) {
      case StepKind::Elementwise: return st.parts.empty() ? cpu::compile_elementwise(st) : cpu::compile_parts(st);
      case StepKind::Copy: return cpu::compile_copy(st);
      case StepKind::Row: return cpu::compile_row(st);
      case StepKind::Reduce: return cpu::compile_reduce(st);
      case StepKind::Gemm: return cpu::compile_gemm(st);
      case StepKind::Gather: return cpu::compile_gather(st);
      case StepKind::ScatterAdd: return cpu::compile_scatter_add(st);
      case StepKind::DynamicUpdateSlice: return cpu::compile_dynamic_update_slice(st);
      case StepKind::Collective: return std::make_unique<CollectiveKernel>();
      case StepKind::Attention: return cpu::compile_attention(st);
    }
    fail("cpu", "internal: a Step of unknown kind (step " + st.str() + ")", "");
  }

  std::unique_ptr<PendingCollective> start_collective(const Kernel&, const Step& st, const LaunchArgs& args) override {
    return start_collective_on_host(st, args.slots);
  }
  void launch(const Kernel& kernel, const Step& st, const LaunchArgs& args) override {
    static_cast<const cpu::CpuKernel&>(kernel).run(st, args);
  }
};

}  // namespace

std::shared_ptr<Backend> make_cpu_backend() { return std::make_shared<CpuBackend>(); }

void share_host_threads(int ranks_on_host) {
  if (ranks_on_host > 1) omp_set_num_threads(std::max(1, omp_get_max_threads() / ranks_on_host));
}
int host_threads() { return omp_get_max_threads(); }

}  // namespace tessera::backends
