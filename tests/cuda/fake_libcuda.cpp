// A fake NVIDIA driver (libcuda.so.1) for test_cuda_host: the entry points the cuda plugin uses,
// over host memory, so that the plugin's host side (enumeration, memory, copies, events, NVRTC
// and its disk cache, module loading, launches, capture) runs on a machine without a GPU.
// Kernels do not run: a launch is only counted. Device memory is host memory (aligned_alloc), so
// copies are memcpy. cuModuleLoadData accepts only an ELF image (a real cubin from NVRTC).
// TESSERA_FAKE_CC ("90" by default) sets the compute capability; TESSERA_FAKE_LOG=<file>
// receives "launch <kernel>" and "graph-launch" lines; TESSERA_FAKE_INDEX_FAILS=<pos> makes every
// launch report position pos out of range in its error word (as a bounds-checked kernel would).
#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {
int cc() {
  const char* e = std::getenv("TESSERA_FAKE_CC");
  return e ? std::atoi(e) : 90;
}
void log_line(const std::string& s) {
  if (const char* path = std::getenv("TESSERA_FAKE_LOG"))
    if (FILE* f = std::fopen(path, "a")) {
      std::fprintf(f, "%s\n", s.c_str());
      std::fclose(f);
    }
}
template <class T>
T handle() {
  return reinterpret_cast<T>(new char[16]);
}
}  // namespace

extern "C" {
CUresult cuInit(unsigned int) { return CUDA_SUCCESS; }
// NVRTC opens libcuda.so.1 too and asks for the driver's private tables: there are none here.
CUresult cuGetExportTable(const void** table, const CUuuid*) { return *table = nullptr, CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuDriverGetVersion(int* v) { return *v = 13000, CUDA_SUCCESS; }
CUresult cuDeviceGetCount(int* n) { return *n = 1, CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice* d, int i) { return *d = i, CUDA_SUCCESS; }
CUresult cuDeviceGetName(char* name, int len, CUdevice) {
  std::snprintf(name, size_t(len), "Tessera Fake GPU");
  return CUDA_SUCCESS;
}
CUresult cuDeviceTotalMem(size_t* bytes, CUdevice) { return *bytes = size_t(8) << 30, CUDA_SUCCESS; }
CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice) {
  *v = a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ? cc() / 10 : a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR ? cc() % 10 : 4;
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice) { return *c = handle<CUcontext>(), CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext) { return CUDA_SUCCESS; }
CUresult cuStreamCreate(CUstream* s, unsigned int) { return *s = handle<CUstream>(), CUDA_SUCCESS; }
CUresult cuStreamSynchronize(CUstream) { return CUDA_SUCCESS; }
CUresult cuGetErrorName(CUresult, const char** s) { return *s = "CUDA_ERROR_FAKE", CUDA_SUCCESS; }
CUresult cuGetErrorString(CUresult, const char** s) { return *s = "the fake driver refused", CUDA_SUCCESS; }
CUresult cuMemAlloc(CUdeviceptr* p, size_t n) {
  void* m = std::aligned_alloc(256, (n + 255) / 256 * 256);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = CUdeviceptr(reinterpret_cast<uintptr_t>(m));
  return CUDA_SUCCESS;
}
CUresult cuMemFree(CUdeviceptr p) { return std::free(reinterpret_cast<void*>(uintptr_t(p))), CUDA_SUCCESS; }
CUresult cuMemHostAlloc(void** p, size_t n, unsigned int) { return *p = std::malloc(n), CUDA_SUCCESS; }
CUresult cuMemcpyHtoDAsync(CUdeviceptr d, const void* h, size_t n, CUstream) {
  return std::memcpy(reinterpret_cast<void*>(uintptr_t(d)), h, n), CUDA_SUCCESS;
}
CUresult cuMemcpyDtoHAsync(void* h, CUdeviceptr d, size_t n, CUstream) {
  return std::memcpy(h, reinterpret_cast<void*>(uintptr_t(d)), n), CUDA_SUCCESS;
}
CUresult cuMemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream) {
  return std::memmove(reinterpret_cast<void*>(uintptr_t(d)), reinterpret_cast<void*>(uintptr_t(s)), n), CUDA_SUCCESS;
}
CUresult cuMemcpyPeerAsync(CUdeviceptr d, CUcontext, CUdeviceptr s, CUcontext, size_t n, CUstream st) {
  return cuMemcpyDtoDAsync(d, s, n, st);
}
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream) {
  auto* p = reinterpret_cast<unsigned int*>(uintptr_t(d));
  for (size_t i = 0; i < n; ++i) p[i] = v;
  return CUDA_SUCCESS;
}
CUresult cuModuleLoadData(CUmodule* m, const void* image) {
  if (std::memcmp(image, "\x7f" "ELF", 4) != 0) return CUDA_ERROR_INVALID_IMAGE;
  return *m = handle<CUmodule>(), CUDA_SUCCESS;
}
CUresult cuModuleGetFunction(CUfunction* f, CUmodule, const char* name) {
  return *f = reinterpret_cast<CUfunction>(strdup(name)), CUDA_SUCCESS;
}
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int, unsigned int, unsigned int bx, unsigned int, unsigned int,
                        unsigned int, CUstream, void** params, void**) {
  if (!gx || !bx || !params) return CUDA_ERROR_INVALID_VALUE;
  log_line(std::string("launch ") + reinterpret_cast<const char*>(f) + " " + std::to_string(gx) + "x" + std::to_string(bx));
  if (const char* pos = std::getenv("TESSERA_FAKE_INDEX_FAILS"))  // params[1]: the error word E
    if (int* e = reinterpret_cast<int*>(uintptr_t(*static_cast<CUdeviceptr*>(params[1])))) *e = std::min(*e, std::atoi(pos));
  return CUDA_SUCCESS;
}
CUresult cuEventCreate(CUevent* e, unsigned int) { return *e = handle<CUevent>(), CUDA_SUCCESS; }
CUresult cuEventRecord(CUevent, CUstream) { return CUDA_SUCCESS; }
CUresult cuEventQuery(CUevent) { return CUDA_SUCCESS; }
CUresult cuEventSynchronize(CUevent) { return CUDA_SUCCESS; }
CUresult cuEventDestroy(CUevent e) { return delete[] reinterpret_cast<char*>(e), CUDA_SUCCESS; }
CUresult cuStreamBeginCapture(CUstream, CUstreamCaptureMode) { return log_line("capture"), CUDA_SUCCESS; }
CUresult cuStreamEndCapture(CUstream, CUgraph* g) { return *g = handle<CUgraph>(), CUDA_SUCCESS; }
CUresult cuGraphInstantiate(CUgraphExec* e, CUgraph, unsigned long long) { return *e = handle<CUgraphExec>(), CUDA_SUCCESS; }
CUresult cuGraphLaunch(CUgraphExec, CUstream) { return log_line("graph-launch"), CUDA_SUCCESS; }
CUresult cuGraphDestroy(CUgraph g) { return delete[] reinterpret_cast<char*>(g), CUDA_SUCCESS; }
CUresult cuGraphExecDestroy(CUgraphExec e) { return delete[] reinterpret_cast<char*>(e), CUDA_SUCCESS; }
}
