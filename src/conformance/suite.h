// The conformance suite's cases (conformance/conformance.h runs them). A Case is a function of
// realized inputs, traced on the backend under test; the runner compares every output and every
// requested gradient with the float64 reference evaluating the same graph.
//
// Coverage rules (what the case lists below follow):
// - every dtype an op takes, on a contiguous input of a random odd shape;
// - float32 on every layout: permuted, strided (slices with steps 2 and 3), expanded, broadcast
//   between operands; zero-size and rank-0 shapes; one shape past 4 Ki elements (several tiles
//   and work-groups);
// - NaN, infinities and signed zeros in float32 and float64 inputs of elementwise ops;
// - gradients (a random cotangent through backward()) in float32 on a strided or broadcast
//   layout and in float64, for every differentiable op.
#pragma once
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "conformance/random_graph.h"
#include "ir/primitives.h"
#include "conformance/conformance.h"
#include "tessera/ops.h"
#include "tessera/tensor.h"

namespace tessera::conformance {

using Rng = std::mt19937;
using Gen = std::function<double(Rng&)>;  // draws one input value

// Context::leaf makes a realized input on the device under test whose values the reference
// knows (cases that make inputs of their own, like the random graphs, use it).
struct Context {
  Device device;
  LeafMaker leaf;
  TensorOptions opts(DType t) const { return {t, device}; }
};

// One input: a leaf of `shape` filled from `gen`, read by the case through `view` (a movement
// traced into the graph, so the backend reads a non-contiguous layout).
struct Input {
  Shape shape;
  DType dtype;
  Gen gen;
  std::function<Tensor(const Tensor&)> view;  // null: the leaf itself
  bool grad = false;                          // check the gradient reaching this leaf
  std::vector<double> fixed{};                // given values instead of `gen` (offsets, indices)
};

using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs, const Context& ctx)>;

struct Case {
  std::string variant;  // what distinguishes it within its row ("f32 [3,5,7] permuted")
  std::vector<Input> inputs;
  Fn fn;
  // Normalized error allowed (max|got - ref| / max|ref|) for floating outputs and gradients;
  // < 0: the default for the result's dtype (default_tolerance). Integer and bool results are
  // always exact.
  double tol = -1, grad_tol = -1;
  std::optional<ir::Op> primitive{};  // primitive rows: the traced graph must contain it
  // Collectives (SPMD cases): > 0 runs the case on that many in-process ranks, each with its own
  // inputs (and cotangents), traced once on rank 0's; every rank's outputs and gradients are
  // checked against reference::evaluate_ranks. Backends whose Target has no collectives skip.
  int ranks = 0;
};

// A case's leaves, filled from its inputs' generators (or fixed values) in order, and what the
// case reads: each leaf through its input's view.
struct Inputs {
  std::vector<Tensor> leaves, viewed;
};
Inputs make_inputs(const Case& c, const Context& ctx, Rng& rng);

// The cases of a collective primitive (collective_cases.cpp).
std::vector<Case> collective_cases(ir::Op op);
// Why `backend` skips collective cases ("" when it runs them).
std::string collective_skip_reason(const std::string& backend);

// Default normalized tolerances against the float64 reference (see conformance.cpp).
double default_tolerance(DType t, bool gradient);

// ---- value generators ----
Gen uniform(double lo, double hi);
Gen integers(int64_t lo, int64_t hi);
// Values k + f with |f| in [0.1, 0.4] or [0.6, 0.9]: away from floor/ceil/round's jumps.
Gen off_grid(double lo, double hi);
// One value in four is 0, -0, +inf, -inf or NaN; the rest from `base`.
Gen with_specials(Gen base);
// Uniform values at least 0.05 away from zero (divisors, kinks).
Gen away_from_zero(double lo, double hi);

// ---- layouts: a leaf and the view that turns it into `target` ----
enum class Layout { Contiguous, Permuted, Strided, Expanded };
const char* layout_name(Layout l);
Input input(const Shape& target, DType t, Gen g, Layout l = Layout::Contiguous, bool grad = false);

std::string variant_name(DType t, const Shape& s, const std::string& what = "");

// ---- the rows ----
// Cases of one primitive (empty: the primitive has no case, which fails its row).
std::vector<Case> primitive_cases(ir::Op op);
// The composite ops of tessera/ops.h, each with its cases, in declaration order.
struct Row {
  std::string name;
  std::function<std::vector<Case>()> cases;
};
const std::vector<Row>& composite_rows();
// The fixed set of the compiler's random graphs (well-conditioned ones, chosen on the host).
std::vector<Case> random_graph_cases();
constexpr const char* kRandomGraphsRow = "random_graphs";
constexpr int kRandomGraphCount = 50;

// Runs cases (passes off, then on) on one backend with the suite's checks and debug settings,
// as run() does for each cell; for tests of the suite itself.
Cell run_cases(const std::string& row, const std::vector<Case>& cases, const std::string& backend);

}  // namespace tessera::conformance
