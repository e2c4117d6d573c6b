// Links against the installed Tessera and checks one computed value, on the cpu and on a backend
// plugin built against the installed SDK (plugin.cpp).
#include <cmath>
#include <cstdio>

#include <tessera/tessera.h>

int main() {
  try {
    // (ones(2, 3) * 2 + arange(3)) @ ones(3, 1), summed: 2 * (6 + 3) = 18.
    tessera::Tensor a = tessera::ones({2, 3}) * 2 + tessera::arange(3).to(tessera::DType::Float32);
    double got = a.matmul(tessera::ones({3, 1})).sum().item();
    if (std::fabs(got - 18.0) > 1e-6) {
      std::fprintf(stderr, "consumer: expected 18, got %g\n", got);
      return 1;
    }
    std::printf("consumer: tessera %s computed %g as expected\n", tessera::version(), got);
    // The same on the plugin built beside this program (TESSERA_PLUGIN_PATH points at it).
    tessera::Device mirror("mirror");
    tessera::Tensor b = tessera::ones({2, 3}, {tessera::DType::Float32, mirror}) * 2 +
                        tessera::arange(3).to(tessera::DType::Float32).to(mirror);
    double on_plugin = b.matmul(tessera::ones({3, 1}, {tessera::DType::Float32, mirror})).sum().item();
    if (on_plugin != got) {
      std::fprintf(stderr, "consumer: the mirror plugin computed %g, the cpu %g\n", on_plugin, got);
      return 1;
    }
    std::printf("consumer: the plugin built against the installed SDK computed %g too\n", on_plugin);
    return 0;
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
