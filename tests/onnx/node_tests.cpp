// ONNX's backend node tests (Debian's libonnx-testdata: one folder per test, a model.onnx and
// test_data_set_*/{input,output}_*.pb) run through tessera::onnx on one device. Counts the tests
// whose every node is in the importer's supported list, prints the failing ones and the pass
// rate, and exits 1 when the rate is below --min-pass-rate. A test whose tensors use a dtype
// Tessera lacks counts as a failure.
//   onnx_node_tests [--data DIR] [--device cpu] [--min-pass-rate 0.9] [--filter SUBSTRING] [-v]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tessera/onnx.h"
#include "tessera/tensor.h"

namespace fs = std::filesystem;
using namespace tessera;

namespace {

std::vector<fs::path> sorted(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> v;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(prefix, 0) == 0) v.push_back(e.path());
  // input_10.pb after input_9.pb
  std::sort(v.begin(), v.end(), [](const fs::path& a, const fs::path& b) {
    std::string x = a.filename().string(), y = b.filename().string();
    return x.size() != y.size() ? x.size() < y.size() : x < y;
  });
  return v;
}

// ONNX's own tolerance for its backend tests: |got - want| <= atol + rtol * |want|.
int64_t g_compared = 0;  // values compared, printed at the end

std::string compare(const Tensor& got, const Tensor& want, const std::string& name) {
  if (got.shape() != want.shape()) return name + ": shape " + shape_str(got.shape()) + ", expected " + shape_str(want.shape());
  if (got.dtype() != want.dtype()) return name + ": dtype " + dtype_name(got.dtype()) + ", expected " + dtype_name(want.dtype());
  std::vector<double> g = got.to(Device("cpu")).to(DType::Float64).to_vector<double>();
  std::vector<double> w = want.to(DType::Float64).to_vector<double>();
  const double rtol = 1e-3, atol = 1e-7;
  g_compared += int64_t(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(w[i]) && std::isnan(g[i])) continue;
    if (g[i] == w[i]) continue;
    if (!(std::abs(g[i] - w[i]) <= atol + rtol * std::abs(w[i])))
      return name + ": element " + std::to_string(i) + " is " + std::to_string(g[i]) + ", expected " + std::to_string(w[i]);
  }
  return "";
}

// "" when every data set of the test matches.
std::string run_test(const fs::path& dir, const Device& device) {
  auto model = onnx::load((dir / "model.onnx").string(), {device});
  model->eval();
  NoGradGuard no_grad;
  std::vector<fs::path> sets = sorted(dir, "test_data_set_");
  if (sets.empty()) return "no test_data_set_* folder";
  for (const fs::path& set : sets) {
    std::vector<Tensor> inputs;
    for (const fs::path& p : sorted(set, "input_")) inputs.push_back(onnx::load_tensor(p.string(), nullptr, device));
    std::vector<fs::path> outs = sorted(set, "output_");
    if (outs.empty()) return set.filename().string() + " holds no expected output";
    std::vector<Tensor> expected;
    for (const fs::path& p : outs) expected.push_back(onnx::load_tensor(p.string()));
    std::vector<Tensor> got = model->run(inputs);
    if (got.size() != expected.size()) return "produced " + std::to_string(got.size()) + " outputs, expected " + std::to_string(expected.size());
    for (size_t k = 0; k < got.size(); ++k)
      if (std::string e = compare(got[k], expected[k], set.filename().string() + " output " + std::to_string(k)); !e.empty()) return e;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  std::string data = "/usr/share/libonnx-testdata/data/node", device = "cpu", filter;
  double min_rate = 0;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "onnx_node_tests: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--data") data = next();
    else if (a == "--device") device = next();
    else if (a == "--min-pass-rate") min_rate = std::stod(next());
    else if (a == "--filter") filter = next();
    else if (a == "-v") verbose = true;
    else {
      std::fprintf(stderr, "onnx_node_tests: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  if (!fs::is_directory(data)) {
    std::fprintf(stderr, "onnx_node_tests: no node tests at %s (Debian package libonnx-testdata)\n", data.c_str());
    return 1;
  }
  auto t0 = std::chrono::steady_clock::now();
  int counted = 0, passed = 0, skipped = 0;
  std::vector<std::string> failures;
  std::map<std::string, int> missing;  // unsupported op -> tests it keeps out
  for (const fs::path& dir : sorted(data, "test_")) {
    std::string name = dir.filename().string();
    if (!filter.empty() && name.find(filter) == std::string::npos) continue;
    try {
      if (auto bad = onnx::unsupported_ops((dir / "model.onnx").string()); !bad.empty()) {
        ++skipped;
        std::map<std::string, int> ops;
        for (const auto& u : bad) ops[u.op_type] = 1;
        for (const auto& [op, one] : ops) missing[op] += one;
        if (verbose) std::printf("skip %s\n", name.c_str());
        continue;
      }
    } catch (const std::exception& e) {
      ++skipped;  // a model this ONNX's opset range does not cover
      if (verbose) std::printf("skip %s: %s\n", name.c_str(), e.what());
      continue;
    }
    ++counted;
    std::string err;
    try {
      err = run_test(dir, Device(device));
    } catch (const std::exception& e) {
      err = e.what();
    }
    if (err.empty()) ++passed;
    else failures.push_back(name + ": " + err);
    if (verbose) std::printf("%s %s%s\n", err.empty() ? "pass" : "FAIL", name.c_str(), err.empty() ? "" : (": " + err).c_str());
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const std::string& f : failures) std::printf("FAIL %s\n", f.c_str());
  std::string not_covered;
  for (const auto& [op, n] : missing) not_covered += " " + op + "(" + std::to_string(n) + ")";
  std::printf("ops keeping node tests out (tests):%s\n", not_covered.c_str());
  double rate = counted ? double(passed) / counted : 0;
  std::printf("supported ops: %zu\n", onnx::supported_ops().size());
  std::printf("node tests on %s: %d of %d with supported ops pass (%.1f%%), %lld values compared; %d skipped (unsupported ops); %.1f s\n",
              device.c_str(), passed, counted, 100 * rate, (long long)g_compared, skipped, secs);
  if (rate < min_rate) {
    std::printf("pass rate %.1f%% is below the required %.1f%%\n", 100 * rate, 100 * min_rate);
    return 1;
  }
  return 0;
}
