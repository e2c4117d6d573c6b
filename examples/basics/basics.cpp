// Tessera basics: tensors are lazy handles; ops only trace, and values are computed when read.
#include <iostream>
#include <vector>

#include <tessera/tessera.h>

namespace ts = tessera;

int main() {
  try {
    std::cout << "tessera " << ts::version() << " on " << ts::Device::best().str() << "\n\n";

    // Broadcasting arithmetic: [2, 3] with [3], and weakly typed C++ scalars (stays float32).
    ts::Tensor a = ts::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
    ts::Tensor b = ts::arange(3).to(ts::DType::Float32);  // [0, 1, 2]
    ts::Tensor c;
    ts::Tensor total;
    {
      ts::Scope scope{"demo"};  // every node traced in here records the scope "demo"
      c = (a + b) * 0.5 - 1;     // [2, 3]
      ts::Tensor w = ts::ones({3, 4});
      ts::Tensor m = c.matmul(w);  // [2, 4]
      total = m.sum({1});           // [2]
    }

    // Nothing has run yet: tracing compiled nothing and read nothing.
    std::cout << "after tracing, c is realized: " << std::boolalpha << c.is_realized() << "\n";
    std::cout << "metrics before reading:\n" << ts::metrics().report() << "\n";

    // Reading one value realizes every pending tensor in one graph (one host sync).
    std::cout << "c =\n" << c << "\n";
    std::cout << "row sums of c @ ones(3, 4) = " << total << "\n";
    std::cout << "metrics after reading:\n" << ts::metrics().report() << "\n";

    // A loop whose shapes repeat compiles once; every later step is a cache hit.
    ts::Tensor x = ts::zeros({1024});
    ts::sync();  // realize x first, so each step sees a leaf of the same shape
    const ts::Metrics before = ts::metrics();
    for (int step = 0; step < 20; ++step) {
      x = x * 2 + 1;
      ts::sync();
    }
    const ts::Metrics after = ts::metrics();
    std::cout << "x = x * 2 + 1, 20 steps: x[0] = " << static_cast<long long>(x.slice(0, 0, 1).item())
              << " (expected " << (1 << 20) - 1 << "), graphs compiled: "
              << after.graphs_compiled - before.graphs_compiled
              << ", cache hits: " << after.cache_hits - before.cache_hits << "\n\n";

    std::cout << "final metrics:\n" << ts::metrics().report() << "\n";
    return 0;
  } catch (const ts::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
