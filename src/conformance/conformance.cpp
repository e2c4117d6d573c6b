// The conformance runner: each case of each row on each backend, passes off then on, checked
// against the float64 reference (conformance/conformance.h lists the checks).
//
// Tolerances (normalized: max|got - ref| / max|ref| over a result, ref = float64 reference of
// the same graph on the same stored inputs). Integer and bool results are exact. Floating
// results, unless a case says otherwise:
//   dtype      forward  gradient   why
//   float64    1e-12    1e-10      rounding only (a few ulp per op, sums of thousands)
//   float32    1e-5     1e-4       OpenCL's float32 builtins are allowed 3-16 ulp (exp, pow, erf);
//                                  16 ulp = 1e-6, sums and gradient chains add a few times that
//   float16    2e-3     1e-2       the stored result is rounded to 11 bits (4.9e-4)
//   bfloat16   1.6e-2   5e-2       8 bits (3.9e-3), and unfused chains round every intermediate
// Movement, selection and exact arithmetic cases ask for 0.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

#include "backends/backend.h"
#include "backends/communicator.h"
#include "conformance/random_graph.h"
#include "conformance/suite.h"
#include "core/half.h"
#include "tensor/tensor_impl.h"
#include "reference/evaluator.h"
#include "runtime/allocator.h"
#include "runtime/compile_options.h"
#include "runtime/realize.h"
#include "conformance/conformance.h"
#include "core/fail.h"
#include "tessera/metrics.h"

namespace tessera::conformance {

double default_tolerance(DType t, bool gradient) {
  switch (t) {
    case DType::Float64: return gradient ? 1e-10 : 1e-12;
    case DType::Float32: return gradient ? 1e-4 : 1e-5;
    case DType::Float16: return gradient ? 1e-2 : 2e-3;
    case DType::BFloat16: return gradient ? 5e-2 : 1.6e-2;
    default: return 0;
  }
}

// ---- generators ----
Gen uniform(double lo, double hi) {
  return [lo, hi](Rng& r) { return std::uniform_real_distribution<double>(lo, hi)(r); };
}
Gen integers(int64_t lo, int64_t hi) {
  return [lo, hi](Rng& r) { return double(std::uniform_int_distribution<int64_t>(lo, hi)(r)); };
}
Gen off_grid(double lo, double hi) {
  return [lo, hi](Rng& r) {
    double k = std::floor(std::uniform_real_distribution<double>(lo, hi)(r));
    double f = std::uniform_real_distribution<double>(0.1, 0.4)(r);
    return k + (std::uniform_int_distribution<int>(0, 1)(r) ? f : 1 - f);
  };
}
Gen with_specials(Gen base) {
  return [base](Rng& r) {
    static const double special[] = {0.0, -0.0, INFINITY, -INFINITY, NAN};
    if (std::uniform_int_distribution<int>(0, 3)(r)) return base(r);
    return special[std::uniform_int_distribution<int>(0, 4)(r)];
  };
}
Gen away_from_zero(double lo, double hi) {
  return [lo, hi](Rng& r) {
    double v = std::uniform_real_distribution<double>(lo, hi)(r);
    return std::fabs(v) < 0.05 ? (v < 0 ? -0.05 : 0.05) : v;
  };
}

// ---- layouts ----
const char* layout_name(Layout l) {
  switch (l) {
    case Layout::Contiguous: return "contiguous";
    case Layout::Permuted: return "permuted";
    case Layout::Strided: return "strided";
    case Layout::Expanded: return "expanded";
  }
  return "?";
}

Inputs make_inputs(const Case& c, const Context& ctx, Rng& rng) {
  Inputs r;
  for (const Input& in : c.inputs) {
    std::vector<double> v = in.fixed;
    if (v.empty()) {
      v.resize(size_t(numel(in.shape)));
      for (double& x : v) x = in.gen(rng);
    }
    Tensor leaf = ctx.leaf(v, in.shape, in.dtype);
    if (in.grad) leaf.requires_grad_();
    r.leaves.push_back(leaf);
    r.viewed.push_back(in.view ? in.view(leaf) : leaf);
  }
  return r;
}

Input input(const Shape& s, DType t, Gen g, Layout l, bool grad) {
  Input in{s, t, std::move(g), nullptr, grad};
  const int64_t rank = int64_t(s.size());
  switch (l) {
    case Layout::Contiguous: break;
    case Layout::Permuted: {  // the leaf holds the dims reversed
      std::vector<int64_t> perm(static_cast<size_t>(rank));
      for (int64_t d = 0; d < rank; ++d) perm[size_t(d)] = rank - 1 - d;
      in.shape.assign(s.rbegin(), s.rend());
      in.view = [perm](const Tensor& x) { return x.permute(perm); };
      break;
    }
    case Layout::Strided: {  // every 2nd element of the first dim from 1, every 3rd of the last from 2
      if (rank == 0) break;
      in.shape[0] = 2 * s[0] + 1;
      if (rank > 1) in.shape[size_t(rank - 1)] = 3 * s[size_t(rank - 1)] + 2;
      in.view = [s, rank](const Tensor& x) {
        Tensor y = x.slice(0, 1, 1 + 2 * s[0], 2);
        return rank > 1 ? y.slice(rank - 1, 2, 2 + 3 * s[size_t(rank - 1)], 3) : y;
      };
      break;
    }
    case Layout::Expanded: {  // even dims broadcast from extent 1
      for (int64_t d = 0; d < rank; d += 2) in.shape[size_t(d)] = 1;
      in.view = [s](const Tensor& x) { return x.expand(s); };
      break;
    }
  }
  return in;
}

std::string variant_name(DType t, const Shape& s, const std::string& what) {
  return std::string(dtype_short(t)) + shape_str(s) + (what.empty() ? "" : " " + what);
}

namespace {

using Clock = std::chrono::steady_clock;

// Host bytes of `values` stored as `t`, as from_vector stores them.
std::vector<char> encode(const std::vector<double>& v, DType t) {
  std::vector<char> bytes(v.size() * itemsize(t));
  auto put = [&](size_t i, auto x) { std::memcpy(bytes.data() + i * sizeof(x), &x, sizeof(x)); };
  for (size_t i = 0; i < v.size(); ++i) {
    double x = v[i];
    switch (t) {
      case DType::Bool: put(i, uint8_t(x != 0)); break;
      case DType::Int32: put(i, int32_t(x)); break;
      case DType::Int64: put(i, int64_t(x)); break;
      case DType::Float16: put(i, half::float_to_f16(float(x))); break;
      case DType::BFloat16: put(i, half::float_to_bf16(float(x))); break;
      case DType::Float32: put(i, float(x)); break;
      case DType::Float64: put(i, x); break;
    }
  }
  return bytes;
}

uint32_t seed_of(const std::string& row, const std::string& variant) {
  uint32_t h = 2166136261u;  // FNV-1a: a stable seed per case, whatever the order cases run in
  for (char c : row + "/" + variant) h = (h ^ uint8_t(c)) * 16777619u;
  return h;
}

std::string fmt(double x) {
  std::ostringstream os;
  os.precision(9);
  os << x;
  return os.str();
}

// "" when got matches the reference within tol; else what differs, at the worst element.
std::string compare(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  if (got.size() != want.size()) return std::to_string(got.size()) + " values, want " + std::to_string(want.size());
  double max_diff = 0, max_ref = 0;
  size_t worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double a = got[i], b = want[i];
    if (!std::isfinite(a) || !std::isfinite(b)) {
      bool same = std::isnan(b) ? std::isnan(a) : a == b;
      if (!same) return "element " + std::to_string(i) + " is " + fmt(a) + ", the reference has " + fmt(b);
      continue;
    }
    if (std::fabs(a - b) > max_diff) max_diff = std::fabs(a - b), worst = i;
    max_ref = std::max(max_ref, std::fabs(b));
  }
  double err = max_ref == 0 ? max_diff : max_diff / max_ref;
  if (err <= tol) return "";
  return "normalized error " + fmt(err) + " > " + fmt(tol) + "; worst element " + std::to_string(worst) + ": got " +
         fmt(got[worst]) + ", want " + fmt(want[worst]);
}

struct Snapshot {
  std::map<std::string, DeviceMetrics> devices;
  static Snapshot now() { return {metrics().devices}; }
  DeviceMetrics of(const std::string& kind) const {
    auto it = devices.find(kind);
    return it == devices.end() ? DeviceMetrics{} : it->second;
  }
};

// Checks that what ran between two snapshots ran on `kind` only, with no host traffic.
std::string check_launches(const Snapshot& a, const Snapshot& b, const std::string& kind) {
  DeviceMetrics x = a.of(kind), y = b.of(kind);
  if (y.steps_launched <= x.steps_launched) return "no Step was launched on " + kind;
  if (y.bytes_moved_in_graphs != x.bytes_moved_in_graphs)
    return "the backend moved " + std::to_string(y.bytes_moved_in_graphs - x.bytes_moved_in_graphs) +
           " bytes between host and device while the graph ran (a host fallback)";
  if (y.bytes_to_host != x.bytes_to_host || y.bytes_to_device != x.bytes_to_device)
    return "the runtime copied between host and " + kind + " while the graph ran";
  for (auto& [k, m] : b.devices)
    if (k != kind && m.steps_launched != a.of(k).steps_launched)
      return std::to_string(m.steps_launched - a.of(k).steps_launched) + " Step(s) ran on " + k + " instead of " + kind;
  return "";
}

struct Target {
  Device device;
  bool executes;  // false: compile only (the null device, or run_cell's compile pass)
};

// An SPMD case (Case::ranks > 0): each rank's inputs (and output cotangents) drawn from its own
// generator, the case traced once on rank 0's, run on in-process ranks (runtime::realize_spmd),
// every rank's outputs and gradients compared with reference::evaluate_ranks.
CaseResult run_spmd_case(const Case& c, const std::string& row, const Target& tg, bool passes_on) {
  CaseResult r{row, c.variant, tg.device.kind, passes_on ? "on" : "off", Status::Pass, ""};
  auto fail_with = [&](std::string why) {
    r.status = Status::Fail;
    r.detail = std::move(why);
    return r;
  };
  if (std::string why = collective_skip_reason(tg.device.kind); !why.empty()) {
    r.status = Status::Skip;
    r.detail = why;
    return r;
  }
  runtime::set_disabled_passes(passes_on ? "" : "all");
  const size_t N = size_t(c.ranks);
  // Per rank 0 buffer: every rank's values (rank 0's first) and every rank's buffer.
  std::unordered_map<const Buffer*, std::vector<std::vector<double>>> known;
  std::unordered_map<const Buffer*, std::vector<std::shared_ptr<Buffer>>> bufs;
  auto upload = [&](const std::vector<double>& v, const Shape& s, DType t) {
    std::vector<char> bytes = encode(v, t);
    return tg.executes ? runtime::upload(tg.device, bytes.data(), bytes.size())
                       : std::make_shared<Buffer>(tg.device, nullptr, bytes.size(), nullptr);
  };
  try {
    std::vector<Rng> rngs;
    for (size_t k = 0; k < N; ++k) rngs.emplace_back(seed_of(row, c.variant) + uint32_t(k) * 7919u);
    // Rank 0's inputs are the traced ones; rank k's values come from its own generator.
    size_t made = 0;
    std::vector<Tensor> leaves;
    auto rank_values = [&](const Input& in, size_t k) {
      std::vector<double> v(size_t(numel(in.shape)));
      for (double& x : v) x = in.fixed.empty() ? in.gen(rngs[k]) : 0;
      if (!in.fixed.empty()) v = in.fixed;
      std::vector<char> bytes = encode(v, in.dtype);
      return reference::read_host(bytes.data(), in.dtype, numel(in.shape));  // as the dtype holds them
    };
    auto add_leaf = [&](std::vector<std::vector<double>> per_rank, const Shape& s, DType t) {
      std::shared_ptr<Buffer> b0 = upload(per_rank[0], s, t);
      for (size_t k = 0; k < N; ++k) bufs[b0.get()].push_back(k == 0 ? b0 : upload(per_rank[k], s, t));
      known[b0.get()] = std::move(per_rank);
      made++;
      return detail::from_buffer(b0, s, t);
    };
    std::vector<Tensor> viewed;
    for (const Input& in : c.inputs) {
      std::vector<std::vector<double>> v;
      for (size_t k = 0; k < N; ++k) v.push_back(rank_values(in, k));
      Tensor t = add_leaf(std::move(v), in.shape, in.dtype);
      if (in.grad) t.requires_grad_();
      leaves.push_back(t);
      viewed.push_back(in.view ? in.view(t) : t);
    }
    Context ctx{tg.device, [&](const std::vector<double>& v, const Shape& s, DType t) {
                  return add_leaf(std::vector<std::vector<double>>(N, v), s, t);
                }};
    std::vector<Tensor> results = c.fn(viewed, ctx);
    viewed.clear();
    std::vector<std::string> labels;
    for (size_t k = 0; k < results.size(); ++k) labels.push_back("output " + std::to_string(k));
    const size_t n_out = results.size();
    bool any_grad = false;
    for (const Input& in : c.inputs) any_grad |= in.grad;
    if (any_grad) {
      for (const Tensor& o : results)
        if (o.requires_grad()) {
          std::vector<std::vector<double>> w(N, std::vector<double>(size_t(o.numel())));
          for (size_t k = 0; k < N; ++k)
            for (double& x : w[k]) x = std::uniform_real_distribution<double>(-1, 1)(rngs[k]);
          o.backward(add_leaf(std::move(w), o.shape(), o.dtype()));
        }
      for (size_t k = 0; k < c.inputs.size(); ++k) {
        if (!c.inputs[k].grad) continue;
        Tensor g = leaves[k].grad();
        if (!g.defined()) return fail_with("no gradient reached input " + std::to_string(k));
        results.push_back(g);
        labels.push_back("gradient of input " + std::to_string(k));
      }
    }
    std::vector<ir::NodePtr> nodes;
    for (const Tensor& t : results) nodes.push_back(detail::node_of(t));
    ir::Graph g = ir::build_graph(nodes);
    bool found = false;
    for (auto& n : g.nodes) found |= c.primitive && n->op == *c.primitive;
    if (c.primitive && !found) return fail_with(std::string("the traced graph has no ") + ir::op_name(*c.primitive) + " node");
    for (auto& n : g.nodes)
      if (std::string why = skip_reason(tg.device.kind, n->dtype); !why.empty()) {
        r.status = Status::Skip;
        r.detail = why;
        return r;
      }
    std::vector<runtime::Request> req;
    for (auto& n : nodes) req.push_back({n, {}});
    if (!tg.executes) {
      runtime::compile_only(req);
      detail::reset_draws();
      r.status = Status::Compiled;
      return r;
    }
    std::vector<std::vector<reference::Value>> params(N);
    std::vector<runtime::RankInputs> inputs(N);
    for (int p : g.params) {
      const ir::Node& n = *g.nodes[size_t(p)];
      auto it = known.find(n.buffer.get());
      if (it == known.end()) return fail_with("a leaf the case did not make (" + std::string(dtype_name(n.dtype)) + shape_str(n.shape) + ")");
      for (size_t k = 0; k < N; ++k) {
        params[k].push_back({n.shape, n.dtype, it->second[k]});
        inputs[k].push_back({n.buffer.get(), bufs[n.buffer.get()][k]});
      }
    }
    std::vector<const ir::Graph*> graphs(N, &g);
    RngState rs = detail::rng_state();
    std::vector<std::vector<reference::Value>> ref = reference::evaluate_ranks(graphs, rs.seed, rs.offset, params);
    Snapshot before = Snapshot::now();
    auto got = runtime::realize_spmd(req, {rs.seed, rs.offset}, inputs, backends::make_inprocess_group(int(N)));
    detail::reset_draws();
    if (std::string why = check_launches(before, Snapshot::now(), tg.device.kind); !why.empty()) return fail_with(why);
    for (size_t k = 0; k < N; ++k)
      for (size_t o = 0; o < results.size(); ++o) {
        const reference::Value& want = ref[k][o];
        std::vector<char> bytes(size_t(numel(want.shape)) * itemsize(want.dtype));
        runtime::download(*got[k][o], bytes.data(), bytes.size());
        double tol = !is_floating(want.dtype) ? 0
                     : o >= n_out             ? (c.grad_tol >= 0 ? c.grad_tol : default_tolerance(want.dtype, true))
                                              : (c.tol >= 0 ? c.tol : default_tolerance(want.dtype, false));
        if (std::string why = compare(reference::read_host(bytes.data(), want.dtype, numel(want.shape)), want.data, tol); !why.empty())
          return fail_with("rank " + std::to_string(k) + " " + labels[o] + " (" + dtype_name(want.dtype) + shape_str(want.shape) + "): " + why);
      }
  } catch (const std::exception& e) {
    detail::reset_draws();
    return fail_with(e.what());
  }
  return r;
}

// Runs one case once (passes off or on). Every tensor it makes dies before it returns.
CaseResult run_once(const Case& c, const std::string& row, const Target& tg, bool passes_on) {
  if (c.ranks > 0) return run_spmd_case(c, row, tg, passes_on);
  CaseResult r{row, c.variant, tg.device.kind, passes_on ? "on" : "off", Status::Pass, ""};
  runtime::set_disabled_passes(passes_on ? "" : "all");
  std::unordered_map<const Buffer*, std::vector<double>> known;  // what the reference reads for each leaf
  Context ctx{tg.device, nullptr};
  ctx.leaf = [&](const std::vector<double>& values, const Shape& s, DType t) {
    if (int64_t(values.size()) != numel(s)) fail("conformance", "case input of " + shape_str(s) + " given " + std::to_string(values.size()) + " values");
    std::vector<char> bytes = encode(values, t);
    std::shared_ptr<Buffer> buf =
        tg.executes ? runtime::upload(tg.device, bytes.data(), bytes.size())
                    : std::make_shared<Buffer>(tg.device, nullptr, bytes.size(), nullptr);  // compile-only: no memory
    if (tg.executes) known[buf.get()] = reference::read_host(bytes.data(), t, numel(s));
    return detail::from_buffer(std::move(buf), s, t);
  };
  auto fail_with = [&](std::string why) {
    r.status = Status::Fail;
    r.detail = std::move(why);
    return r;
  };
  try {
    Rng rng(seed_of(row, c.variant));
    auto [leaves, viewed] = make_inputs(c, ctx, rng);
    const int64_t syncs = metrics().host_syncs;
    std::vector<Tensor> results = c.fn(viewed, ctx);
    viewed.clear();
    const size_t n_out = results.size();  // then the gradients
    std::vector<std::string> labels;
    for (size_t k = 0; k < n_out; ++k) labels.push_back("output " + std::to_string(k));
    bool any_grad = false;
    for (const Input& in : c.inputs) any_grad |= in.grad;
    if (any_grad) {
      for (const Tensor& o : results)
        if (o.requires_grad()) {
          std::vector<double> w(size_t(o.numel()));
          for (double& x : w) x = std::uniform_real_distribution<double>(-1, 1)(rng);
          o.backward(ctx.leaf(w, o.shape(), o.dtype()));
        }
      for (size_t k = 0; k < c.inputs.size(); ++k) {
        if (!c.inputs[k].grad) continue;
        Tensor g = leaves[k].grad();
        if (!g.defined()) return fail_with("no gradient reached input " + std::to_string(k));
        results.push_back(g);
        labels.push_back("gradient of input " + std::to_string(k));
      }
    }

    if (metrics().host_syncs != syncs)
      return fail_with("the op (or its backward) synced with the host while it was traced");
    std::vector<ir::NodePtr> nodes;
    for (const Tensor& t : results) nodes.push_back(detail::node_of(t));
    ir::Graph g = ir::build_graph(nodes);
    if (c.primitive) {
      bool found = false;
      for (auto& n : g.nodes) found |= n->op == *c.primitive;
      if (!found) return fail_with(std::string("the traced graph has no ") + ir::op_name(*c.primitive) + " node");
    }
    for (auto& n : g.nodes)
      if (std::string why = skip_reason(tg.device.kind, n->dtype); !why.empty()) {
        r.status = Status::Skip;
        r.detail = why;
        return r;
      }
    if (!tg.executes) {  // compile-only device, or the compile pass of run_cell
      std::vector<runtime::Request> req;
      for (auto& n : nodes) req.push_back({n, {}});
      runtime::compile_only(req);
      detail::reset_draws();  // as a sync would: the run traces the same draw numbers
      r.status = Status::Compiled;
      return r;
    }
    // The reference reads what each leaf holds: the case's inputs from their host values, a
    // tensor an op made itself (a constant table) from the device.
    std::vector<reference::Value> params;
    for (int p : g.params) {
      const ir::Node& n = *g.nodes[size_t(p)];
      auto it = known.find(n.buffer.get());
      std::vector<double> v;
      if (it != known.end()) {
        v = it->second;
      } else {
        std::vector<char> bytes(size_t(n.numel()) * itemsize(n.dtype));
        runtime::download(*n.buffer, bytes.data(), bytes.size());
        v = reference::read_host(bytes.data(), n.dtype, n.numel());
      }
      params.push_back({n.shape, n.dtype, std::move(v)});
    }
    RngState rs = detail::rng_state();
    std::vector<reference::Value> ref = reference::evaluate(g, rs.seed, rs.offset, params);
    g = ir::Graph{};
    nodes.clear();
    Snapshot before = Snapshot::now();
    sync();
    if (std::string why = check_launches(before, Snapshot::now(), tg.device.kind); !why.empty()) return fail_with(why);
    for (size_t k = 0; k < results.size(); ++k) {
      const Tensor& t = results[k];
      const reference::Value& want = ref[k];
      std::string what = labels[k] + " (" + dtype_name(want.dtype) + shape_str(want.shape) + ")";
      if (t.shape() != want.shape || t.dtype() != want.dtype)
        return fail_with(what + ": got " + dtype_name(t.dtype()) + shape_str(t.shape()));
      double tol = !is_floating(want.dtype) ? 0
                   : k >= n_out             ? (c.grad_tol >= 0 ? c.grad_tol : default_tolerance(want.dtype, true))
                                            : (c.tol >= 0 ? c.tol : default_tolerance(want.dtype, false));
      if (std::string why = compare(t.to_vector<double>(), want.data, tol); !why.empty()) return fail_with(what + ": " + why);
    }
  } catch (const std::exception& e) {
    return fail_with(e.what());
  }
  return r;
}

CaseResult run_case(const Case& c, const std::string& row, const Target& tg, bool passes_on) {
  CaseResult r = run_once(c, row, tg, passes_on);
  // Buffers of the case are freed by now; their sentinels were checked as they went.
  std::vector<std::string> bad = runtime::check_sentinels();
  if (!bad.empty() && r.status != Status::Fail) {
    r.status = Status::Fail;
    r.detail = "out-of-bounds write: " + bad.front() + (bad.size() > 1 ? " (and " + std::to_string(bad.size() - 1) + " more)" : "");
  }
  return r;
}

std::vector<Case> cases_of(const std::string& row) {
  for (int i = 0; i < ir::kNumOps; ++i)
    if (row == ir::op_name(ir::Op(i))) return primitive_cases(ir::Op(i));
  for (const Row& cr : composite_rows())
    if (cr.name == row) return cr.cases();
  if (row == kRandomGraphsRow) return random_graph_cases();
  std::string all;
  for (auto& n : rows()) all += (all.empty() ? "" : ", ") + n;
  fail("conformance", "unknown op '" + row + "'; ops are: " + all);
}

// Restores the compile options and the allocator's debug settings when the run ends, however it
// ends.
struct DebugSettings {
  compiler::Options saved = runtime::compile_options();
  DebugSettings() {
    runtime::set_sentinels(64);
    runtime::set_arena_guard(64);
  }
  ~DebugSettings() {
    runtime::set_sentinels(0);
    runtime::set_compile_options(saved);
  }
};

}  // namespace

// Graphs whose float64 reference moves by less than 1e-5 (normalized) when every input moves by
// up to 2^-20 relative, either way: a float32 backend's rounding (2^-24 per op) cannot flip a
// comparison, floor or sign in them, so a mismatch is the backend's. Chosen on the host with the
// reference alone, the same set for every backend.
std::vector<Case> random_graph_cases() {
  struct Pick {
    int index;
    bool f32;
  };
  static const std::vector<Pick> picks = [] {
    std::vector<Pick> p;
    for (int i = 0; int(p.size()) < kRandomGraphCount && i < 1000; ++i) {
      ir::Graph g = ir::build_graph(random_graph(i, Device("cpu")));
      std::vector<reference::Value> params;
      for (int q : g.params) {
        const ir::Node& n = *g.nodes[size_t(q)];
        params.push_back({n.shape, n.dtype, reference::read_host(n.buffer->data, n.dtype, n.numel())});
      }
      std::vector<reference::Value> base = reference::evaluate(g, 0, 0, params);
      bool stable = true;
      for (double sign : {1.0, -1.0}) {
        std::vector<reference::Value> moved = params;
        Rng r{uint32_t(i)};
        for (auto& v : moved)
          for (double& x : v.data) x *= 1 + sign * std::ldexp(std::uniform_real_distribution<double>(0.5, 1)(r), -20);
        std::vector<reference::Value> out = reference::evaluate(g, 0, 0, moved);
        for (size_t k = 0; k < out.size(); ++k) stable = stable && compare(out[k].data, base[k].data, 1e-5).empty();
      }
      bool f32 = false;
      for (auto& n : g.nodes) f32 |= n->dtype == DType::Float32;
      if (stable) p.push_back({i, f32});
    }
    return p;
  }();
  std::vector<Case> c;
  for (const Pick& p : picks) {
    int i = p.index;
    c.push_back({"graph " + std::to_string(i) + (p.f32 ? " f32" : " f64") + " (std::mt19937 seed " +
                     std::to_string(kRandomGraphSeed + uint32_t(i)) + ")",
                 {},
                 [i](const std::vector<Tensor>&, const Context& ctx) {
                   std::vector<Tensor> out;
                   for (auto& n : random_graph(i, ctx.device, ctx.leaf)) out.push_back(detail::from_node(n));
                   return out;
                 },
                 p.f32 ? 1e-4 : 1e-10});
  }
  return c;
}

std::vector<std::string> rows() {
  std::vector<std::string> r;
  for (int i = 0; i < ir::kNumOps; ++i) r.push_back(ir::op_name(ir::Op(i)));
  for (const Row& cr : composite_rows()) r.push_back(cr.name);
  r.push_back(kRandomGraphsRow);
  return r;
}

bool is_primitive(const std::string& row) {
  for (int i = 0; i < ir::kNumOps; ++i)
    if (row == ir::op_name(ir::Op(i))) return true;
  return false;
}

std::string skip_reason(const std::string& backend, DType t) {
  for (auto& b : backends::all_backends())
    if (b->name() == backend && b->device_count() > 0 && !b->properties(0).computes(t))
      return std::string(dtype_name(t)) + ": " + backend + " does not compute it (its Target's compute_dtypes)";
  return "";
}

std::string collective_skip_reason(const std::string& backend) {
  for (auto& b : backends::all_backends())
    if (b->name() == backend && b->device_count() > 0 && b->can_execute() && !b->properties(0).collectives)
      return "collectives: " + backend + " does not run them (its Target's collectives; docs/architecture.md \"Parallelism\")";
  return "";
}

std::string Cell::text() const {
  int total = passed + failed + skipped + compiled;
  if (total == 0) return "no cases";
  if (failed) return "FAIL " + std::to_string(failed) + "/" + std::to_string(total);
  if (compiled) return "compiles " + std::to_string(compiled);
  if (!passed) return "skip";
  return "ok " + std::to_string(passed) + (skipped ? ", " + std::to_string(skipped) + " skip" : "");
}

const Cell& Report::at(const std::string& op, const std::string& backend) const {
  for (const Cell& c : cells)
    if (c.op == op && c.backend == backend) return c;
  fail("conformance", "no cell for op '" + op + "' on '" + backend + "'");
}

bool Report::ok() const {
  return std::all_of(cells.begin(), cells.end(), [](const Cell& c) { return c.ok(); });
}

std::string Report::matrix() const {
  size_t w0 = 8;
  for (auto& o : ops) w0 = std::max(w0, o.size() + 4);
  std::vector<size_t> w(backends.size());
  for (size_t b = 0; b < backends.size(); ++b) {
    w[b] = backends[b].size();
    for (size_t o = 0; o < ops.size(); ++o) w[b] = std::max(w[b], cells[o * backends.size() + b].text().size());
  }
  std::ostringstream os;
  auto pad = [&](const std::string& s, size_t n) { os << s << std::string(n > s.size() ? n - s.size() : 0, ' '); };
  pad("op", w0);
  for (size_t b = 0; b < backends.size(); ++b) pad("  " + backends[b], w[b] + 2);
  os << "\n";
  int passed = 0, failed = 0, skipped = 0, compiled = 0;
  std::set<std::string> skips;
  for (size_t o = 0; o < ops.size(); ++o) {
    pad(ops[o] + (is_primitive(ops[o]) ? " (P)" : ""), w0);
    for (size_t b = 0; b < backends.size(); ++b) {
      const Cell& c = cells[o * backends.size() + b];
      pad("  " + c.text(), w[b] + 2);
      passed += c.passed, failed += c.failed, skipped += c.skipped, compiled += c.compiled;
      for (auto& s : c.skip_reasons) skips.insert(c.backend + ": " + s);
    }
    os << "\n";
  }
  os << "\n" << passed << " passed, " << failed << " failed, " << skipped << " skipped, " << compiled
     << " compiled only (cases x passes off/on); (P) = primitive\n";
  os.setf(std::ios::fixed);
  os.precision(1);
  for (const std::string& b : backends) {
    double s = 0;
    for (const Cell& c : cells) s += c.backend == b ? c.seconds : 0;
    os << "time on " << b << ": " << s << " s\n";
  }
  for (auto& s : skips) os << "skipped: " << s << "\n";
  for (const Cell& c : cells)
    for (const CaseResult& f : c.failures)
      os << "FAIL " << f.op << " on " << f.backend << " [" << f.variant << ", passes " << f.passes << "]: " << f.detail << "\n";
  return os.str();
}

namespace {

Cell run_cell(const std::string& op, const std::vector<Case>& cases, const Target& tg, const std::vector<bool>& passes) {
  Cell cell{op, tg.device.kind};
  auto c0 = Clock::now();
  if (cases.empty()) {
    cell.failures.push_back({op, "-", tg.device.kind, "-", Status::Fail, "no test case for this op"});
    cell.failed = 1;
  }
  // Every case is compiled first, nothing run, so a backend that builds device code at the first
  // launch (OpenCL) builds the whole cell's kernels as one program: per program, PoCL's fixed
  // cost is several times a kernel's. Failures show in the run below.
  if (tg.executes)
    for (const Case& c : cases)
      for (bool on : passes) run_once(c, op, {tg.device, false}, on);
  for (const Case& c : cases)
    for (bool on : passes) {
      CaseResult r = run_case(c, op, tg, on);
      switch (r.status) {
        case Status::Pass: cell.passed++; break;
        case Status::Compiled: cell.compiled++; break;
        case Status::Skip:
          cell.skipped++;
          if (std::find(cell.skip_reasons.begin(), cell.skip_reasons.end(), r.detail) == cell.skip_reasons.end())
            cell.skip_reasons.push_back(r.detail);
          break;
        case Status::Fail:
          cell.failed++;
          cell.failures.push_back(r);
          break;
      }
    }
  cell.seconds = std::chrono::duration<double>(Clock::now() - c0).count();
  return cell;
}

Target target_of(const std::string& kind) {
  Device d(kind);
  return {d, backends::backend_for(d).can_execute()};  // throws for unknown names
}

}  // namespace

Cell run_cases(const std::string& row, const std::vector<Case>& cases, const std::string& backend) {
  Target tg = target_of(backend);
  DebugSettings debug;
  return run_cell(row, cases, tg, {false, true});
}

Report run(const Options& o) {
  Report rep;
  rep.ops = o.ops.empty() ? rows() : o.ops;
  if (o.backends.empty()) {
    for (auto& b : backends::all_backends())
      if (b->device_count() > 0) rep.backends.push_back(b->name());
  } else {
    rep.backends = o.backends;
  }
  std::vector<Target> targets;
  for (const std::string& b : rep.backends) targets.push_back(target_of(b));
  auto t0 = Clock::now();
  DebugSettings debug;
  for (const std::string& op : rep.ops) {
    std::vector<Case> cases = cases_of(op);  // throws for unknown rows
    for (const Target& tg : targets) {
      rep.cells.push_back(run_cell(op, cases, tg, o.passes_off ? std::vector<bool>{false, true} : std::vector<bool>{true}));
      if (o.on_cell) o.on_cell(rep.cells.back());
    }
  }
  rep.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return rep;
}

}  // namespace tessera::conformance
