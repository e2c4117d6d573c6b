// The CPU backend's compiled Steps: one kernel type per Step kind, each defined by the engine that
// runs it (elementwise.cpp, reduce.cpp, gemm.cpp, indexing.cpp, copies.cpp); the backend
// (cpu_backend.cpp) compiles a Step with its kind's function below and launches what it returns.
#pragma once
#include <memory>

#include "backends/backend.h"
#include "kernel_ir/step.h"

namespace tessera::backends::cpu {

struct CpuKernel : Kernel {
  // Runs the Step this kernel was compiled from on one launch's slots.
  virtual void run(const kir::Step& st, const LaunchArgs& args) const = 0;
};

std::unique_ptr<CpuKernel> compile_elementwise(const kir::Step& st);  // also a Copy that is not a plain view copy
// A Step of parts (Step::parts): one task grid over the parts' positions (elementwise.cpp).
std::unique_ptr<CpuKernel> compile_parts(const kir::Step& st);
std::unique_ptr<CpuKernel> compile_copy(const kir::Step& st);
std::unique_ptr<CpuKernel> compile_row(const kir::Step& st);
std::unique_ptr<CpuKernel> compile_reduce(const kir::Step& st);
std::unique_ptr<CpuKernel> compile_gemm(const kir::Step& st);
std::unique_ptr<CpuKernel> compile_gather(const kir::Step& st);
std::unique_ptr<CpuKernel> compile_scatter_add(const kir::Step& st);
std::unique_ptr<CpuKernel> compile_dynamic_update_slice(const kir::Step& st);
std::unique_ptr<CpuKernel> compile_attention(const kir::Step& st);  // attention.cpp

// Gemm Step launches whose epilogue ran in f32_gemm's registers (gemm.cpp, RegisterEpilogue) in
// this process (tests: that a Step took that path).
uint64_t gemm_register_epilogue_launches();

}  // namespace tessera::backends::cpu
