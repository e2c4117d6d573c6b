// Helpers shared by the tests: normalized comparisons against the float64 reference, running
// pending tensors through both the reference evaluator and the runtime, random inputs.
#pragma once
#include <algorithm>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <functional>
#include <string>
#include <vector>

#include "reference/evaluator.h"
#include "runtime/compile_options.h"
#include "tessera/tessera.h"

namespace tessera::testing {

// The sanitized build (ASan + UBSan, coverage guards; about 10x slower) runs long training
// comparisons over fewer steps: memory safety is its job, the Release run checks the numbers.
#ifdef TESSERA_SANITIZED
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
// n steps, or a few under the sanitizers.
constexpr int steps_or_few(int n, int few = 3) { return kSanitized ? std::min(n, few) : n; }

// max|a - b| / max|b| over the elements (DESIGN.md "Testing"); max|a - b| when max|b| == 0.
// NaN-aware: a NaN (or infinity) in `b` must sit at the same place, with the same value, in
// `a`, and is then excluded; any other NaN/infinity mismatch, or a size mismatch, gives +inf.
double normalized_error(const std::vector<double>& a, const std::vector<double>& b);

// Passes when normalized_error(got, want) <= tol; the failure message names the worst element.
::testing::AssertionResult all_close(const std::vector<double>& got, const std::vector<double>& want, double tol);

// Default tolerance for comparing a backend's `dtype` result with the float64 reference.
// `reduction_size` is the number of elements summed into one output (float32: 1e-4 past 1000).
double tolerance(DType dtype, int64_t reduction_size = 1);

// The reference values and the runtime's values of the same pending tensors.
struct Evaluated {
  std::vector<reference::Value> ref;     // float64 reference, one per output
  std::vector<std::vector<double>> got;  // the realized tensors' to_vector<double>()
};

// Captures the outputs' nodes, evaluates them with the reference at the current RNG state, then
// calls tessera::sync() and reads the realized tensors back.
Evaluated evaluate_both(const std::vector<Tensor>& outputs);

// evaluate_both + checks that each output's shape and dtype match the reference and its values
// are within `tol` (tol < 0: tolerance(dtype) per output).
::testing::AssertionResult matches_reference(const std::vector<Tensor>& outputs, double tol = -1);
inline ::testing::AssertionResult matches_reference(const Tensor& output, double tol = -1) {
  return matches_reference(std::vector<Tensor>{output}, tol);
}

// Deterministic random host data (std::mt19937 seeded with `seed`), rounded to `dtype`.
std::vector<double> random_values(int64_t n, DType dtype, uint32_t seed, double lo = -1, double hi = 1);

// Realized tensors made with from_vector of deterministic random data.
// Floating dtypes: uniform in [lo, hi); integer dtypes: integers in [lo, hi]; bool: 0/1.
Tensor random_tensor(const Shape& s, DType dtype = DType::Float32, uint32_t seed = 1, double lo = -1, double hi = 1,
                     Device device = Device("cpu"));
// Integers uniform in [lo, hi] (inclusive), of an integer dtype.
Tensor random_int(const Shape& s, int64_t lo, int64_t hi, DType dtype = DType::Int64, uint32_t seed = 1);
// Positive floating values in [lo, hi) (for log, division).
Tensor random_positive(const Shape& s, DType dtype = DType::Float32, uint32_t seed = 1, double lo = 0.5,
                       double hi = 2);

// A realized tensor of `dtype` holding `values` (converted through from_vector of the right C++ type).
Tensor make_tensor(const std::vector<double>& values, const Shape& s, DType dtype = DType::Float32,
                   Device device = Device("cpu"));

std::string values_str(const std::vector<double>& v, size_t max_items = 16);

// The message of the tessera::Error f throws, or "(no error)".
std::string error_message(const std::function<void()>& f);

// Comparisons with PyTorch: whether CI=true (a missing torch then fails instead of skipping),
// the repository root, and a fresh scratch directory under the system temp dir.
bool in_ci();
std::string repo_root();
std::string scratch_dir(const std::string& name);
// Runs a shell command; returns its standard output (add 2>&1 for the errors too) and sets
// *status to its exit code (-1 when it could not start or did not exit).
std::string run_command(const std::string& cmd, int* status);
// The benchmark GPT (bench/bench_common.h) with dropout 0.1 on `dev` from seed 0: the loss of
// each of `steps` AdamW steps (what a backend's losses are compared with the cpu's on).
std::vector<double> bench_gpt_losses(const Device& dev, int steps);

// Runs `/usr/bin/python3 SCRIPT DIR` with its output in DIR/log.txt. Exit codes 77/126/127
// mean PyTorch (or Python) is not available.
struct ScriptRun {
  int rc;
  std::string log;
  bool torch_missing() const { return rc == 77 || rc == 126 || rc == 127; }
};
ScriptRun run_python(const std::string& script, const std::string& dir);

}  // namespace tessera::testing

namespace tessera::testing {

// Switches passes off (a comma-separated list) for its lifetime; the settings in force before come
// back after.
struct PassesOff {
  compiler::Options saved = runtime::compile_options();
  explicit PassesOff(const std::string& list) {
    compiler::Options o = saved;
    for (size_t b = 0, e; b < list.size(); b = e + 1) {
      e = list.find(',', b);
      if (e == std::string::npos) e = list.size();
      o.disabled.insert(list.substr(b, e - b));
    }
    runtime::set_compile_options(o);
  }
  ~PassesOff() { runtime::set_compile_options(saved); }
  PassesOff(const PassesOff&) = delete;
  PassesOff& operator=(const PassesOff&) = delete;
};

// ---- finite-difference gradient checks (float64) ----

// A function of several tensors whose gradient is checked; the output may have any shape.
using TensorFn = std::function<Tensor(const std::vector<Tensor>&)>;

struct GradCheckOptions {
  double eps = 1e-6;            // central-difference step
  double tol = 1e-6;            // normalized error allowed per input
  uint32_t weight_seed = 4242;  // the fixed random weights w of loss = sum(f(x) * w)
  // Which inputs to differentiate (empty: every floating input). Differentiated inputs must be
  // float64; the others (indices, masks, offsets) are passed through unchanged.
  std::vector<bool> differentiate;
};

struct GradCheckResult {
  std::vector<std::vector<double>> analytic;  // per differentiated input (empty for the others)
  std::vector<std::vector<double>> numeric;
  std::vector<double> error;  // normalized error per input (0 for the others)
  double worst = 0;
};

// Makes float64 leaves with requires_grad_() from `inputs`' values, computes
// loss = sum(f(x) * w) for fixed random weights w, calls backward() and compares each input's
// grad() (an undefined grad counts as zeros) with central differences of the loss, evaluated
// under NoGradGuard on fresh from_vector inputs. Fails when any input's normalized error > tol.
::testing::AssertionResult grad_check(const TensorFn& f, const std::vector<Tensor>& inputs,
                                      const GradCheckOptions& opt = {}, GradCheckResult* result = nullptr);

// Uniform float64 values in [lo, hi) moved at least `margin` away from each of `avoid` (for
// checks near kinks: abs at 0, clamp at its bounds, relu at 0).
Tensor random_away(const Shape& s, uint32_t seed, double lo, double hi, const std::vector<double>& avoid,
                   double margin = 1e-2);

}  // namespace tessera::testing
