// Every kernel the conformance suite renders for CUDA compiles with NVRTC to cubin for sm_75,
// sm_80 and sm_90 (NVRTC needs no GPU). The suite's cases (every primitive and composite op,
// forward and gradient, every dtype, the random fused graphs) are compiled, not run, for
// "cudarender", a compile-only backend posing as a CUDA device (256-byte alignment, every dtype)
// whose Steps are rendered with the shared renderer's CUDA dialect, as the cuda plugin does.
// Gemm Steps are rendered whole and with their epilogue split off (kir::split_epilogue: what runs
// after a cuBLASLt product that cannot fuse it). Each distinct kernel is compiled once per
// architecture, in batches (one NVRTC program each, batches on parallel threads); a batch that
// fails is recompiled kernel by kernel, and the test fails on the first kernel that does not
// compile, naming its Step (kind, source op, scope) and the conformance row that planned it.
#include <gtest/gtest.h>
#include <nvrtc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "backends/backend.h"
#include "backends/render/c_render.h"
#include "conformance/conformance.h"
#include "step_collector.h"

namespace tessera {
namespace {

struct Rendered {
  render::KernelCode code;
  std::string step;  // "Elementwise step from 'add' in scope 'mlp.fc', conformance row 'add': <Step::str()>"
};

// The kernels of every Step planned for "cudarender" (a compile-only backend posing as a CUDA
// device: 256-byte alignment, every dtype), each distinct kernel once, with its Step's description.
struct Collected {
  std::string row;  // the conformance row being compiled
  std::vector<Rendered> kernels;
  std::set<std::string> seen;
  std::set<kir::StepKind> kinds;

  void step(const kir::Step& st) {
    if (st.kind == kir::StepKind::Collective) return;  // a communicator's call (NCCL on a GPU), not a rendered kernel
    add(st);
    if (st.kind == kir::StepKind::Gemm && !st.program.empty()) {
      auto [product, epilogue] = kir::split_epilogue(st);
      add(product);
      add(epilogue);
    }
  }
  void add(const kir::Step& st) {
    kinds.insert(st.kind);
    const kir::Source* s = st.sources.empty() ? nullptr : &st.sources.front();
    std::string where = std::string(kir::step_kind_name(st.kind)) + " step from '" + (s ? s->op : "?") + "'" +
                        (s && !s->scope.empty() ? " in scope '" + s->scope + "'" : "") + ", conformance row '" + row + "': " +
                        st.str();
    for (render::KernelCode& k : render::render(st, render::cuda_c()))
      if (seen.insert(k.name).second) kernels.push_back({std::move(k), where});
  }
};

struct Failure {
  size_t index;
  std::string log;
};

// Compiles the kernels as one program for sm_<arch>; "" on success, else NVRTC's log.
std::string nvrtc_compile(const std::vector<const render::KernelCode*>& ks, int arch) {
  std::string src = render::program_source(render::cuda_c(), ks);
  nvrtcProgram prog;
  if (nvrtcCreateProgram(&prog, src.c_str(), "tessera.cu", 0, nullptr, nullptr) != NVRTC_SUCCESS) return "nvrtcCreateProgram failed";
  std::vector<std::string> opts = render::cuda_c().options;
  opts.push_back("--gpu-architecture=sm_" + std::to_string(arch));
  std::vector<const char*> argv;
  for (auto& o : opts) argv.push_back(o.c_str());
  nvrtcResult r = nvrtcCompileProgram(prog, int(argv.size()), argv.data());
  std::string out;
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::string log(n, '\0');
    nvrtcGetProgramLog(prog, log.data());
    out = std::string(nvrtcGetErrorString(r)) + "\n" + log.substr(0, 4000);
  } else {
    size_t n = 0;
    nvrtcGetCUBINSize(prog, &n);
    if (n == 0) out = "NVRTC returned an empty cubin";
  }
  nvrtcDestroyProgram(&prog);
  return out;
}

// The first kernel (in the order given) that fails to compile for sm_<arch>, if any.
std::optional<Failure> first_failure(const std::vector<Rendered>& ks, int arch, size_t batch) {
  std::vector<std::pair<size_t, size_t>> ranges;
  for (size_t b = 0; b < ks.size(); b += batch) ranges.push_back({b, std::min(ks.size(), b + batch)});
  std::mutex mu;
  std::optional<Failure> first;
  size_t next = 0;
  auto worker = [&] {
    for (;;) {
      size_t r;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (next == ranges.size()) return;
        r = next++;
      }
      std::vector<const render::KernelCode*> v;
      for (size_t i = ranges[r].first; i < ranges[r].second; ++i) v.push_back(&ks[i].code);
      if (nvrtc_compile(v, arch).empty()) continue;
      for (size_t i = ranges[r].first; i < ranges[r].second; ++i)  // which one: kernel by kernel
        if (std::string log = nvrtc_compile({&ks[i].code}, arch); !log.empty()) {
          std::lock_guard<std::mutex> lock(mu);
          if (!first || i < first->index) first = Failure{i, log};
          break;
        }
    }
  };
  std::vector<std::thread> pool;
  unsigned n = std::max(1u, std::min(std::thread::hardware_concurrency(), unsigned(ranges.size())));
  for (unsigned t = 0; t < n; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  return first;
}

std::string describe(const std::vector<Rendered>& ks, const Failure& f, int arch) {
  return "sm_" + std::to_string(arch) + ": kernel " + ks[f.index].code.name + " of the " + ks[f.index].step +
         "\ndoes not compile:\n" + f.log + "\nkernel source:\n" + ks[f.index].code.source;
}

Collected& collected() {
  static Collected* c = [] {
    auto* p = new Collected;
    kir::Target t;
    t.alignment = 256;  // cudaMalloc's
    t.collectives = true;  // the SPMD rows' other Steps are rendered too; their Collective Steps are not kernels
    backends::register_backend(
        std::make_shared<testing::StepCollector>("cudarender", t, [p](const kir::Step& st) { p->step(st); }));
    return p;
  }();
  return *c;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(CudaNvrtc, EveryConformanceKernelCompilesForSm75Sm80Sm90) {
  auto t0 = std::chrono::steady_clock::now();
  Collected& be = collected();
  for (const std::string& row : conformance::rows()) {
    be.row = row;
    conformance::Options o;
    o.backends = {"cudarender"};
    o.ops = {row};
    conformance::Report r = conformance::run(o);
    const conformance::Cell& c = r.at(row, "cudarender");
    for (auto& f : c.failures) ADD_FAILURE() << row << " [" << f.variant << "]: " << f.detail;
    EXPECT_GT(c.compiled, 0) << row << ": no case was compiled (" << c.text() << ")";
  }
  const double t_render = seconds_since(t0);
  // Every kind of Step and the dtypes' code paths were reached (the test is not vacuous).
  for (auto k : {kir::StepKind::Elementwise, kir::StepKind::Copy, kir::StepKind::Row, kir::StepKind::Reduce,
                 kir::StepKind::Gemm, kir::StepKind::Gather, kir::StepKind::ScatterAdd, kir::StepKind::DynamicUpdateSlice})
    EXPECT_TRUE(be.kinds.count(k)) << "no " << kir::step_kind_name(k) << " Step was planned";
  std::map<std::string, int> uses;
  for (auto& k : be.kernels)
    for (const char* s : {"double", "f32_to_f16", "f32_to_bf16", "rng_normal", "ATOMIC_MIN", "BLOCK_REDUCE", "i64*", "u8*", "i32*"})
      uses[s] += k.code.source.find(s) != std::string::npos;
  for (auto& [s, n] : uses) EXPECT_GT(n, 0) << "no kernel uses " << s;
  // Block-per-row kernels launch whole warps, at most the dialect's row_block per row.
  for (auto& k : be.kernels) {
    bool block = k.code.source.find("BLOCK_REDUCE") != std::string::npos;
    EXPECT_EQ(block, k.code.group_size > 0) << k.step;
    if (k.code.group_size > 0) {
      EXPECT_TRUE(k.code.group_size % 32 == 0 && k.code.group_size <= render::cuda_c().row_block &&
                  k.code.work_items % k.code.group_size == 0)
          << k.code.group_size << " x " << k.code.work_items << ": " << k.step;
    }
  }
  ASSERT_GT(be.kernels.size(), 200u);

  for (int arch : {75, 80, 90}) {
    auto t1 = std::chrono::steady_clock::now();
    std::optional<Failure> f = first_failure(be.kernels, arch, 64);
    if (f) FAIL() << describe(be.kernels, *f, arch);
    std::printf("sm_%d: %zu kernels compiled in %.1f s\n", arch, be.kernels.size(), seconds_since(t1));
  }
  std::printf("%zu distinct kernels rendered in %.1f s; %.1f s in all\n", be.kernels.size(), t_render, seconds_since(t0));
}

// The failure names the kernel's Step and shows NVRTC's log: a kernel that cannot compile,
// among good ones, is found and reported.
TEST(CudaNvrtc, AFailingKernelIsNamedWithItsStep) {
  std::vector<Rendered> ks(3);
  for (int i = 0; i < 3; ++i) {
    ks[size_t(i)].code.name = "k" + std::to_string(i);
    ks[size_t(i)].code.source = "KERNEL void k" + std::to_string(i) + "(GLOBAL float* x) { x[GID] = 1.0f; }\n";
    ks[size_t(i)].step = "Elementwise step from 'op" + std::to_string(i) + "'";
  }
  ks[1].code.source = "KERNEL void k1(GLOBAL float* x) { x[GID] = undeclared_name; }\n";
  std::optional<Failure> f = first_failure(ks, 75, 2);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->index, 1u);
  std::string d = describe(ks, *f, 75);
  EXPECT_NE(d.find("sm_75: kernel k1 of the Elementwise step from 'op1'"), std::string::npos) << d;
  EXPECT_NE(d.find("undeclared_name"), std::string::npos) << d;
  ks[1].code.source = "KERNEL void k1(GLOBAL float* x) { x[GID] = 2.0f; }\n";
  EXPECT_FALSE(first_failure(ks, 90, 2).has_value());
}

}  // namespace
}  // namespace tessera
