#include "test_util.h"
#include "../../bench/bench_common.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <sys/wait.h>
#include <fstream>

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

#include "tensor/tensor_impl.h"
#include "ir/graph.h"

namespace tessera::testing {
namespace {

bool same_special(double a, double b) {
  if (std::isnan(b)) return std::isnan(a);
  return a == b;  // infinities must match exactly
}

double round_to(double x, DType t) {
  // Host data is made of values each dtype holds exactly; conversion happens in from_vector.
  switch (t) {
    case DType::Bool: return x != 0 ? 1.0 : 0.0;
    case DType::Int32:
    case DType::Int64: return std::trunc(x);
    case DType::Float32: return double(float(x));
    default: return x;  // float16/bfloat16: from_vector rounds; the reference reads the buffer
  }
}

}  // namespace

double normalized_error(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    bool special = !std::isfinite(a[i]) || !std::isfinite(b[i]);
    if (special) {
      if (!same_special(a[i], b[i])) return INFINITY;
      continue;
    }
    max_diff = std::max(max_diff, std::abs(a[i] - b[i]));
    max_ref = std::max(max_ref, std::abs(b[i]));
  }
  return max_ref == 0 ? max_diff : max_diff / max_ref;
}

std::string values_str(const std::vector<double>& v, size_t max_items) {
  std::ostringstream os;
  os.precision(10);
  os << "[";
  for (size_t i = 0; i < v.size() && i < max_items; ++i) os << (i ? ", " : "") << v[i];
  if (v.size() > max_items) os << ", ... (" << v.size() << " values)";
  os << "]";
  return os.str();
}

::testing::AssertionResult all_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  double err = normalized_error(got, want);
  if (err <= tol) return ::testing::AssertionSuccess();
  auto r = ::testing::AssertionFailure();
  if (got.size() != want.size()) {
    return r << "size mismatch: got " << got.size() << " values, want " << want.size();
  }
  size_t worst = 0;
  double worst_d = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    double d = same_special(got[i], want[i]) ? 0 : std::isfinite(got[i] - want[i]) ? std::abs(got[i] - want[i]) : INFINITY;
    if (d > worst_d) worst_d = d, worst = i;
  }
  std::ostringstream os;
  os.precision(10);
  os << "normalized error " << err << " > " << tol << "; worst element " << worst << ": got " << got[worst]
     << ", want " << want[worst] << "\n  got:  " << values_str(got) << "\n  want: " << values_str(want);
  return r << os.str();
}

double tolerance(DType dtype, int64_t reduction_size) {
  switch (dtype) {
    case DType::Bool:
    case DType::Int32:
    case DType::Int64: return 0;
    case DType::Float16: return 2e-3;
    case DType::BFloat16: return 1.6e-2;
    case DType::Float32: return reduction_size > 1000 ? 1e-4 : 1e-5;
    case DType::Float64: return 1e-12;
  }
  return 0;
}

Evaluated evaluate_both(const std::vector<Tensor>& outputs) {
  std::vector<ir::NodePtr> nodes;
  for (const Tensor& t : outputs) nodes.push_back(detail::node_of(t));
  ir::Graph g = ir::build_graph(nodes);
  detail::RngState rs = detail::rng_state();  // before sync, which advances it
  Evaluated e;
  e.ref = reference::evaluate(g, rs.seed, rs.offset);
  g = ir::Graph{};
  nodes.clear();
  sync();
  for (const Tensor& t : outputs) e.got.push_back(t.to_vector<double>());
  return e;
}

::testing::AssertionResult matches_reference(const std::vector<Tensor>& outputs, double tol) {
  Evaluated e = evaluate_both(outputs);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& t = outputs[i];
    const reference::Value& r = e.ref[i];
    if (t.shape() != r.shape || t.dtype() != r.dtype)
      return ::testing::AssertionFailure() << "output " << i << ": got " << dtype_name(t.dtype()) << shape_str(t.shape())
                                           << ", reference " << dtype_name(r.dtype) << shape_str(r.shape);
    double tl = tol >= 0 ? tol : tolerance(r.dtype);
    auto res = all_close(e.got[i], r.data, tl);
    if (!res) return ::testing::AssertionFailure() << "output " << i << " (" << dtype_name(r.dtype) << shape_str(r.shape) << "): " << res.message();
  }
  return ::testing::AssertionSuccess();
}

std::vector<double> random_values(int64_t n, DType dtype, uint32_t seed, double lo, double hi) {
  std::mt19937 gen(seed);
  std::vector<double> v(size_t(std::max<int64_t>(n, 0)));
  if (dtype == DType::Bool) {
    std::uniform_int_distribution<int> d(0, 1);
    for (double& x : v) x = d(gen);
  } else if (is_integral(dtype)) {
    std::uniform_int_distribution<int64_t> d(int64_t(std::ceil(lo)), int64_t(std::floor(hi)));
    for (double& x : v) x = double(d(gen));
  } else {
    std::uniform_real_distribution<double> d(lo, hi);
    for (double& x : v) x = round_to(d(gen), dtype);
  }
  return v;
}

Tensor make_tensor(const std::vector<double>& values, const Shape& s, DType dtype, Device device) {
  TensorOptions o;
  o.dtype = dtype;
  o.device = device;
  return from_vector<double>(values, s, o);
}

Tensor random_tensor(const Shape& s, DType dtype, uint32_t seed, double lo, double hi, Device device) {
  return make_tensor(random_values(numel(s), dtype, seed, lo, hi), s, dtype, device);
}

Tensor random_int(const Shape& s, int64_t lo, int64_t hi, DType dtype, uint32_t seed) {
  return make_tensor(random_values(numel(s), dtype, seed, double(lo), double(hi)), s, dtype);
}

Tensor random_positive(const Shape& s, DType dtype, uint32_t seed, double lo, double hi) {
  return random_tensor(s, dtype, seed, lo, hi);
}

ScriptRun run_python(const std::string& script, const std::string& dir) {
  std::string log = dir + "/log.txt";
  std::string cmd = "/usr/bin/python3 '" + script + "' '" + dir + "' > '" + log + "' 2>&1";
  int st = std::system(cmd.c_str());
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, text.str()};
}

}  // namespace tessera::testing

namespace tessera::testing {

namespace {

std::vector<Tensor> fresh_inputs(const std::vector<std::vector<double>>& vals, const std::vector<Shape>& shapes,
                                 const std::vector<DType>& dtypes) {
  std::vector<Tensor> r;
  for (size_t i = 0; i < vals.size(); ++i) r.push_back(make_tensor(vals[i], shapes[i], dtypes[i]));
  return r;
}

double eval_loss(const TensorFn& f, const std::vector<Tensor>& xs, const std::vector<double>& w) {
  Tensor out = f(xs);
  Tensor wt = make_tensor(w, out.shape(), DType::Float64);
  return (out * wt).sum().item();
}

}  // namespace

::testing::AssertionResult grad_check(const TensorFn& f, const std::vector<Tensor>& inputs,
                                      const GradCheckOptions& opt, GradCheckResult* result) {
  size_t n = inputs.size();
  std::vector<std::vector<double>> vals(n);
  std::vector<Shape> shapes(n);
  std::vector<DType> dtypes(n);
  std::vector<bool> diff(n);
  for (size_t i = 0; i < n; ++i) {
    vals[i] = inputs[i].to_vector<double>();
    shapes[i] = inputs[i].shape();
    dtypes[i] = inputs[i].dtype();
    diff[i] = opt.differentiate.empty() ? is_floating(dtypes[i]) : (i < opt.differentiate.size() && opt.differentiate[i]);
    if (diff[i] && dtypes[i] != DType::Float64)
      return ::testing::AssertionFailure() << "grad_check: input " << i << " is " << dtype_name(dtypes[i])
                                           << "; differentiated inputs must be float64";
  }

  // Analytic gradients.
  GradCheckResult res;
  res.analytic.resize(n);
  res.numeric.resize(n);
  res.error.assign(n, 0);
  std::vector<double> w;
  {
    std::vector<Tensor> xs = fresh_inputs(vals, shapes, dtypes);
    for (size_t i = 0; i < n; ++i)
      if (diff[i]) xs[i].requires_grad_();
    Tensor out = f(xs);
    if (!out.defined()) return ::testing::AssertionFailure() << "grad_check: f returned an undefined tensor";
    if (out.dtype() != DType::Float64)
      return ::testing::AssertionFailure() << "grad_check: f returned " << dtype_name(out.dtype()) << ", want float64";
    w = random_values(out.numel(), DType::Float64, opt.weight_seed, -1, 1);
    Tensor loss = (out * make_tensor(w, out.shape(), DType::Float64)).sum();
    loss.backward();
    for (size_t i = 0; i < n; ++i) {
      if (!diff[i]) continue;
      Tensor g = xs[i].grad();
      if (!g.defined()) {
        res.analytic[i].assign(vals[i].size(), 0.0);
        continue;
      }
      if (g.shape() != shapes[i])
        return ::testing::AssertionFailure() << "grad_check: grad of input " << i << " has shape " << shape_str(g.shape())
                                             << ", the input " << shape_str(shapes[i]);
      res.analytic[i] = g.to_vector<double>();
    }
  }

  // Central differences, without autodiff, on fresh inputs.
  {
    NoGradGuard ng;
    for (size_t i = 0; i < n; ++i) {
      if (!diff[i]) continue;
      res.numeric[i].resize(vals[i].size());
      for (size_t j = 0; j < vals[i].size(); ++j) {
        double x0 = vals[i][j];
        vals[i][j] = x0 + opt.eps;
        double lp = eval_loss(f, fresh_inputs(vals, shapes, dtypes), w);
        vals[i][j] = x0 - opt.eps;
        double lm = eval_loss(f, fresh_inputs(vals, shapes, dtypes), w);
        vals[i][j] = x0;
        res.numeric[i][j] = (lp - lm) / (2 * opt.eps);
      }
    }
  }

  ::testing::AssertionResult ok = ::testing::AssertionSuccess();
  bool failed = false;
  std::ostringstream msg;
  for (size_t i = 0; i < n; ++i) {
    if (!diff[i]) continue;
    res.error[i] = normalized_error(res.analytic[i], res.numeric[i]);
    res.worst = std::max(res.worst, res.error[i]);
    if (!(res.error[i] <= opt.tol)) {
      failed = true;
      msg << "input " << i << " " << shape_str(shapes[i]) << ": analytic vs finite-difference gradient: "
          << all_close(res.analytic[i], res.numeric[i], opt.tol).message() << "\n";
    }
  }
  if (result) *result = res;
  if (failed) return ::testing::AssertionFailure() << msg.str();
  return ok;
}

Tensor random_away(const Shape& s, uint32_t seed, double lo, double hi, const std::vector<double>& avoid, double margin) {
  std::vector<double> v = random_values(numel(s), DType::Float64, seed, lo, hi);
  for (double& x : v)
    for (double p : avoid)
      if (std::abs(x - p) < margin) x = x < p ? p - 2 * margin : p + 2 * margin;
  return make_tensor(v, s, DType::Float64);
}

std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool in_ci() {
  const char* c = std::getenv("CI");
  return c && std::string(c) == "true";
}

std::string repo_root() { return TESSERA_SOURCE_DIR; }

std::string scratch_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::string run_command(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    *status = -1;
    return out;
  }
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int st = pclose(p);
  *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

std::vector<double> bench_gpt_losses(const Device& dev, int steps) {
  using namespace bench;
  manual_seed(0);
  nn::GPTConfig cfg{.vocab = kVocab, .block = kBlock, .embd = kEmbd, .heads = kHeads, .layers = kLayers,
                    .dropout = 0.1, .bias = true, .tied_head = false};
  nn::GPT model(cfg);
  model.to(dev);
  model.train();
  optim::AdamW opt(model.parameters(), {.lr = 3e-3, .weight_decay = 0.1});
  auto batches = make_batches();
  std::vector<double> losses;
  TensorOptions o{DType::Int64, dev};
  for (int step = 0; step < steps; ++step) {
    auto& [x, y] = batches[size_t(step) % batches.size()];
    opt.zero_grad();
    Tensor loss = model.loss(from_vector<int64_t>(x, {kBatch, kBlock}, o), from_vector<int64_t>(y, {kBatch, kBlock}, o));
    loss.backward();
    opt.step();
    losses.push_back(loss.item());
  }
  return losses;
}

}  // namespace tessera::testing
