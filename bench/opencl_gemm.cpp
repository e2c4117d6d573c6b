// GEMM on the OpenCL device (PoCL here): the shared renderer's tiled kernel, through
// tessera::matmul, against CLBlast's SGEMM on the same device where CLBlast was found at
// configure time (Debian's libclblast-dev; not a dependency of Tessera). Shapes are the
// benchmark GPT's largest; each figure is the median of 7 runs after one warm-up (which builds).
//
//   POCL_CACHE_DIR=build/pocl-cache build/bench/bench_opencl_gemm
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "bench_common.h"
#include "tessera/tensor.h"
#ifdef TESSERA_BENCH_CLBLAST
#define CL_TARGET_OPENCL_VERSION 120
#include <clblast_c.h>
#endif

using namespace tessera;
using clk = std::chrono::steady_clock;

template <class F>
double median_ms(F&& f) {
  f();
  std::vector<double> ms;
  for (int r = 0; r < 7; ++r) {
    auto t0 = clk::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(clk::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[3];
}

int main() {
  struct Case {
    int64_t m, n, k;
    bool bt;  // B read transposed (a Linear layer's weight)
  };
  std::printf("GEMM float32 on opencl:0, load average %.1f; GFLOP/s (median of 7)\n", bench::load_average());
  std::printf("%18s %10s %10s\n", "M x N x K", "tessera", "clblast");
  for (Case c : {Case{1024, 512, 128, false}, Case{1024, 512, 128, true}, Case{1024, 128, 512, true}, Case{128, 512, 1024, false}}) {
    Device cl("opencl");
    Tensor a = randn({c.m, c.k}, {DType::Float32, cl});
    Tensor b = c.bt ? randn({c.n, c.k}, {DType::Float32, cl}) : randn({c.k, c.n}, {DType::Float32, cl});
    tessera::sync();
    double flop = 2.0 * double(c.m * c.n * c.k);
    double ours = median_ms([&] {
      Tensor y = matmul(a, c.bt ? b.permute({1, 0}) : b);
      tessera::sync();
    });
    double theirs = 0;
#ifdef TESSERA_BENCH_CLBLAST
    {
      cl_platform_id p;
      cl_device_id d;
      clGetPlatformIDs(1, &p, nullptr);
      clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, nullptr);
      cl_context ctx = clCreateContext(nullptr, 1, &d, nullptr, nullptr, nullptr);
      cl_command_queue q = clCreateCommandQueue(ctx, d, 0, nullptr);
      std::vector<float> ha = a.to(Device("cpu")).to_vector<float>(), hb = b.to(Device("cpu")).to_vector<float>();
      cl_mem A = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, ha.size() * 4, ha.data(), nullptr);
      cl_mem B = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, hb.size() * 4, hb.data(), nullptr);
      cl_mem C = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size_t(c.m * c.n) * 4, nullptr, nullptr);
      theirs = median_ms([&] {
        cl_event e;
        CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, c.bt ? CLBlastTransposeYes : CLBlastTransposeNo, size_t(c.m),
                     size_t(c.n), size_t(c.k), 1.0f, A, 0, size_t(c.k), B, 0, size_t(c.bt ? c.k : c.n), 0.0f, C, 0,
                     size_t(c.n), &q, &e);
        clWaitForEvents(1, &e);
        clReleaseEvent(e);
      });
      for (cl_mem m : {A, B, C}) clReleaseMemObject(m);
      clReleaseCommandQueue(q);
      clReleaseContext(ctx);
    }
#endif
    char shape[32];
    std::snprintf(shape, sizeof shape, "%lldx%lldx%lld%s", (long long)c.m, (long long)c.n, (long long)c.k, c.bt ? " (Bt)" : "");
    std::printf("%18s %10.2f %10s\n", shape, flop / ours / 1e6,
                theirs > 0 ? std::to_string(flop / theirs / 1e6).substr(0, 5).c_str() : "-");
  }
  return 0;
}
