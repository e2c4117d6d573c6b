// Which BLAS build should Tessera's CPU backend call? Loads one libopenblas.so.0 (path in argv[1])
// and times, with the process's OpenMP pool also busy as Tessera's tiles keep it:
//   gemm    sgemm 512^3 and 2048^3 on 2 threads (serial builds: split by rows over our OpenMP pool)
//   mixed   50 x [an OpenMP elementwise pass over 4 Mi floats, then sgemm 256^3]: two pools
//           spinning against each other show up here.
//   concurrent  whether calls from two threads at once give stable results. Debian's serial
//           build is not built for it: once seen here, 3 of 300 concurrent 1024x384x128 runs
//           differed; the race is rare, so a clean line here proves nothing.
// Run through bench/blas_choice.sh, which tries the openmp, pthread and serial builds.
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

using sgemm_t = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
using threads_t = void (*)(int);
enum { RowMajor = 101, NoTrans = 111 };

static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: blas_choice /path/to/libopenblas.so.0 [serial]\n");
    return 2;
  }
  bool serial = argc > 2 && std::string(argv[2]) == "serial";
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
    return 2;
  }
  auto sgemm = reinterpret_cast<sgemm_t>(dlsym(h, "cblas_sgemm"));
  auto set_threads = reinterpret_cast<threads_t>(dlsym(h, "openblas_set_num_threads"));
  if (set_threads) set_threads(serial ? 1 : 2);
  auto gemm = [&](int n, const float* a, const float* b, float* c) {
    if (!serial) return sgemm(RowMajor, NoTrans, NoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
#pragma omp parallel num_threads(2)
    {  // our own pool splits the rows
      int t = omp_get_thread_num(), nt = omp_get_num_threads();
      int r0 = n * t / nt, r1 = n * (t + 1) / nt;
      sgemm(RowMajor, NoTrans, NoTrans, r1 - r0, n, n, 1, a + size_t(r0) * n, n, b, n, 0, c + size_t(r0) * n, n);
    }
  };
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  for (int n : {512, 2048}) {
    std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
    gemm(n, a.data(), b.data(), c.data());
    std::vector<double> ts;
    for (int r = 0; r < (n == 512 ? 9 : 5); ++r) {
      double t0 = now();
      gemm(n, a.data(), b.data(), c.data());
      ts.push_back(now() - t0);
    }
    std::printf("gemm %4d^3: %7.1f GFLOP/s\n", n, 2.0 * n * n * n / median(ts) / 1e9);
  }
  std::vector<float> x(size_t(4) << 20, 1.0f), a(256 * 256, 0.5f), b(256 * 256, 0.25f), c(256 * 256);
  std::vector<double> ts;
  for (int r = 0; r < 5; ++r) {
    double t0 = now();
    for (int i = 0; i < 50; ++i) {
#pragma omp parallel for schedule(static)
      for (size_t k = 0; k < x.size(); ++k) x[k] = x[k] * 0.999f + 0.001f;
      gemm(256, a.data(), b.data(), c.data());
    }
    ts.push_back(now() - t0);
  }
  std::printf("mixed     : %7.1f ms\n", median(ts) * 1e3);
  // Thread safety: two row blocks computed concurrently, 200 times; any run differing from the
  // first means the library shares state between calling threads.
  {
    int m = 512, nn = 384, k = 128, unstable = 0;
    std::vector<float> a(size_t(m) * k), b(size_t(k) * nn), c(size_t(m) * nn), first;
    for (size_t i = 0; i < a.size(); ++i) a[i] = float((i * 7919) % 1000) / 1000.f - 0.5f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = float((i * 104729) % 1000) / 1000.f - 0.5f;
    if (set_threads) set_threads(1);
    for (int rep = 0; rep < 200; ++rep) {
#pragma omp parallel for num_threads(2)
      for (int t = 0; t < 2; ++t)
        sgemm(RowMajor, NoTrans, NoTrans, m / 2, nn, k, 1, a.data() + size_t(t) * (m / 2) * k, k, b.data(), nn, 0,
              c.data() + size_t(t) * (m / 2) * nn, nn);
      if (rep == 0) first = c;
      else unstable += c != first;
    }
    std::printf("concurrent: %d of 199 runs differ from the first\n", unstable);
  }
  return 0;
}
