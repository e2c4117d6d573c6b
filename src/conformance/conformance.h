// The conformance suite, in the spirit of ggml's test-backend-ops: every primitive of the IR and
// every composite op of ops.h, forward and gradient, on random shapes and layouts (broadcasts,
// permuted, strided and expanded views, odd and zero-size extents), on each backend against
// the float64 reference evaluator with the compiler's passes off and on, plus a fixed set of
// the compiler's random fused graphs.
//
// Each case runs with sentinel bytes around every buffer (runtime allocator) and guard bytes
// around every arena temporary, and fails on: a result off the reference by more than its
// normalized tolerance, a NaN or infinity where the reference has none (or the reverse), a
// changed sentinel, no Step launched on the device under test, a Step launched on another
// device kind, host <-> device bytes moved while the graph ran (a silent host fallback), or a
// host sync while the case was traced (an op that runs a graph to build itself).
// The only skips are per dtype: a dtype the backend's Target does not compute.
//
// `tessera conformance` prints run(...).matrix(); tests/conformance asserts the same cells.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "tessera/dtype.h"

namespace tessera::conformance {

enum class Status { Pass, Fail, Skip, Compiled };  // Compiled: a compile-only device (null)

struct CaseResult {
  std::string op, variant, backend;
  std::string passes;  // "off" (every pass disabled) or "on"
  Status status = Status::Pass;
  std::string detail;  // why it failed or was skipped
};

// One op on one backend.
struct Cell {
  std::string op, backend;
  int passed = 0, failed = 0, skipped = 0, compiled = 0;
  std::vector<CaseResult> failures{};
  std::vector<std::string> skip_reasons{};  // distinct
  double seconds = 0;
  bool ok() const { return failed == 0 && passed + compiled + skipped > 0; }
  std::string text() const;  // "ok 24", "FAIL 2/24", "skip (float64)", "compiles 24", ...
};

struct Options {
  std::vector<std::string> backends;  // device kinds; empty: every registered backend
  std::vector<std::string> ops;       // rows; empty: every row
  std::function<void(const Cell&)> on_cell;  // called as each cell finishes (progress)
  // Each case runs with the compiler's passes off, then on; false: on only (for a backend whose
  // compiles are slow, as pjrt's XLA compiles: every case is a compile).
  bool passes_off = true;
};

struct Report {
  std::vector<std::string> ops, backends;
  std::vector<Cell> cells;  // ops x backends, row-major
  double seconds = 0;
  const Cell& at(const std::string& op, const std::string& backend) const;
  bool ok() const;
  // The op x backend support matrix, then every skip rule that applied and every failure.
  std::string matrix() const;
};

// Every row: the primitives in table order, the composite ops of ops.h, then "random_graphs".
std::vector<std::string> rows();
bool is_primitive(const std::string& row);
// Runs the rows on the backends. Unknown rows or backends throw tessera::Error.
Report run(const Options& o = {});
// The documented exceptions: why `backend` skips cases that compute `t` ("" when it runs them).
std::string skip_reason(const std::string& backend, DType t);

}  // namespace tessera::conformance
