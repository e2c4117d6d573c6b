#include "tessera/optim.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <optional>
#include <utility>

#include "core/fail.h"
#include "tessera/capture.h"
#include "tessera/ops.h"

namespace tessera::optim {

// ---- Optimizer: groups, rates, checkpoints ----
Optimizer::Optimizer(const char* name, double default_lr) : name_(name), default_lr_(default_lr), lr_(default_lr) {}

void Optimizer::register_group(const std::vector<Tensor>& params, double lr) {
  if (lr < 0) fail(name_, "learning rate must be non-negative, got " + std::to_string(lr), "");
  std::vector<Tensor> known = this->params();
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    if (!p.defined() || !p.requires_grad()) fail(name_, "every parameter must be a defined tensor that requires grad", "");
    auto same = [&](const Tensor& q) { return q.is_same(p); };
    if (std::any_of(known.begin(), known.end(), same) || std::any_of(params.begin(), params.begin() + i, same))
      fail(name_, "a parameter " + shape_str(p.shape()) + " appears twice (in one group or in two groups)", "");
  }
  state_.resize(state_.size() + params.size());
  initial_lr_.push_back(lr);
}

std::vector<Tensor> Optimizer::params() const {
  std::vector<Tensor> r;
  for (size_t g = 0; g < num_param_groups(); ++g) r.insert(r.end(), group_params(g).begin(), group_params(g).end());
  return r;
}

void Optimizer::zero_grad() {
  for (size_t g = 0; g < num_param_groups(); ++g)
    for (Tensor p : group_params(g)) p.set_grad(Tensor());
}

void Optimizer::set_lr(double lr) {
  lr_ = lr;
  // The ratio first: a group at the defaults' rate gets exactly lr.
  for (size_t g = 0; g < num_param_groups(); ++g) set_group_lr(g, default_lr_ > 0 ? lr * (initial_lr_[g] / default_lr_) : lr);
}
double Optimizer::lr(size_t group) const {
  if (group >= num_param_groups()) fail(name_, "no parameter group " + std::to_string(group), "");
  return group_lr(group);
}
void Optimizer::set_lr(size_t group, double lr) {
  if (group >= num_param_groups()) fail(name_, "no parameter group " + std::to_string(group), "");
  set_group_lr(group, lr);
}

namespace {
Tensor host_scalar(double v, DType t) { return from_vector<double>({v}, {}, {t, Device("cpu")}); }
// Splits "<index>.<name>" (a decimal index); nullopt for any other key.
std::optional<std::pair<size_t, std::string>> indexed(const std::string& key) {
  size_t dot = key.find('.');
  if (dot == 0 || dot == std::string::npos || dot > 9 || key.find_first_not_of("0123456789") != dot) return std::nullopt;
  return std::pair{size_t(std::stoul(key.substr(0, dot))), key.substr(dot + 1)};
}
}  // namespace

std::map<std::string, Tensor> Optimizer::state_dict() const {
  std::map<std::string, Tensor> r;
  r["step"] = host_scalar(double(steps_), DType::Int64);
  r["lr"] = host_scalar(lr_, DType::Float64);
  for (size_t g = 0; g < num_param_groups(); ++g) {
    r["param_groups." + std::to_string(g) + ".lr"] = host_scalar(group_lr(g), DType::Float64);
    r["param_groups." + std::to_string(g) + ".params"] = host_scalar(double(group_params(g).size()), DType::Int64);
  }
  for (size_t i = 0; i < state_.size(); ++i)
    for (auto& [name, t] : state_[i]) r[std::to_string(i) + "." + name] = t;
  return r;
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& sd) {
  auto it = sd.find("step");
  if (it == sd.end()) fail(name_, "state has no 'step' entry", "");
  // Groups first: their layout must be this optimizer's before any state is taken.
  std::map<size_t, std::pair<double, int64_t>> groups;  // g -> (lr, parameter count)
  for (auto& [key, t] : sd) {
    if (key.rfind("param_groups.", 0) != 0) continue;
    auto g = indexed(key.substr(13));
    if (g && g->second == "lr") groups[g->first].first = t.item();
    else if (g && g->second == "params") groups[g->first].second = t.item<int64_t>();
    else fail(name_, "state entry '" + key + "' is not a group's lr or params", "");
  }
  if (!groups.empty()) {
    std::string want, have;
    for (size_t g = 0; g < num_param_groups(); ++g) have += (g ? ", " : "") + std::to_string(group_params(g).size());
    for (auto& [g, v] : groups) want += (want.empty() ? "" : ", ") + std::to_string(v.second);
    bool same = groups.size() == num_param_groups();
    for (size_t g = 0; same && g < num_param_groups(); ++g)
      same = groups.count(g) && groups[g].second == int64_t(group_params(g).size());
    if (!same) fail(name_, "the state's parameter groups have sizes [" + want + "], this optimizer's [" + have + "]", "");
  }
  std::vector<Tensor> ps = params();
  std::vector<std::map<std::string, Tensor>> state(state_.size());
  for (auto& [key, t] : sd) {
    if (key == "step" || key == "lr" || key.rfind("param_groups.", 0) == 0) continue;
    auto entry = indexed(key);
    if (!entry || entry->first >= state.size()) fail(name_, "state entry '" + key + "' names no parameter of this optimizer", "");
    const Tensor& p = ps[entry->first];
    if (t.shape() != p.shape())
      fail(name_, "state entry '" + key + "' has shape " + shape_str(t.shape()) + ", parameter " + shape_str(p.shape()), "");
    state[entry->first][entry->second] = t.device() == p.device() ? t : t.to(p.device());
  }
  state_ = std::move(state);
  steps_ = it->second.item<int64_t>();
  versions_after_step_ = -1;
  for (auto& [g, v] : groups) set_group_lr(g, v.first);
  if (auto l = sd.find("lr"); l != sd.end()) lr_ = l->second.item();
}

// Each optimizer's own checks of its options.
static void check_options(const SGDOptions& o, const char* name) {
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0)) fail(name, "Nesterov momentum needs momentum > 0 and zero dampening", "");
}
static void check_options(const AdamOptions& o, const char* name) {
  if (o.beta1 < 0 || o.beta1 >= 1 || o.beta2 < 0 || o.beta2 >= 1) fail(name, "betas must be in [0, 1)", "");
}

template <class Options>
OptimizerBase<Options>::OptimizerBase(const char* name, std::vector<Group> groups, Options defaults)
    : Optimizer(name, defaults.lr), defaults_(defaults) {
  for (auto& g : groups) add_param_group(std::move(g));
}

template <class Options>
void OptimizerBase<Options>::add_param_group(Group g) {
  if (!g.options) g.options = defaults_;
  check_options(*g.options, name_);
  register_group(g.params, g.options->lr);
  groups_.push_back(std::move(g));
}

// ---- SGD ----
SGD::SGD(std::vector<Tensor> params, SGDOptions o) : SGD(std::vector<Group>{{std::move(params)}}, o) {}
int64_t Optimizer::param_versions() const {
  int64_t v = 0;
  for (const Tensor& p : params()) v += p.version();
  return v;
}

Optimizer::StepScope::StepScope(Optimizer& o) : o_(o) {
  if (o.in_step_.exchange(true))
    fail(std::string(o.name_) + ".step",
         "another thread is inside this optimizer's step; one thread at a time steps an optimizer (docs/architecture.md, Threading)");
  try {
    if (o.versions_after_step_ >= 0 && o.steps_ > 0 && o.param_versions() < o.versions_after_step_) --o.steps_;  // taken back
    for (auto& st : o.state_)
      for (auto it = st.begin(); it != st.end();) it = it->second.failed() ? st.erase(it) : std::next(it);
  } catch (...) {
    o.in_step_ = false;
    throw;
  }
}
Optimizer::StepScope::~StepScope() { o_.in_step_ = false; }
void Optimizer::StepScope::done() { o_.versions_after_step_ = o_.param_versions(); }

SGD::SGD(std::vector<Group> groups, SGDOptions defaults) : OptimizerBase("SGD", std::move(groups), defaults) {}

namespace {
Tensor runtime_scalar_on(const std::vector<Tensor>& params, double v);
std::vector<Tensor> sgd_update_with(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                                    const std::vector<Tensor>& momentum_buffers, const Tensor& lr, const SGDOptions& o);
void adam_update_with(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avg,
                      const std::vector<Tensor>& exp_avg_sq, const Tensor& step_size, const Tensor& inv_sqrt_bc2,
                      const Tensor& decay, const AdamOptions& o, bool decoupled);
}  // namespace

const Tensor& Optimizer::scalar(size_t g, size_t k, double v) {
  if (scalars_.size() <= g) scalars_.resize(g + 1);
  std::vector<Tensor>& s = scalars_[g];
  if (s.size() <= k) s.resize(k + 1);
  if (s[k].defined()) {
    // The old value's buffer goes first, so the new one is allocated where it was: the step's
    // allocations recur at the same addresses, as when every step made fresh scalars (a backend
    // replaying whole executables, such as CUDA graphs, needs its pointers to recur).
    s[k].set_data(zeros({}, {DType::Float32, s[k].device()}));
  }
  Tensor fresh = runtime_scalar_on(group_params(g), v);
  if (!s[k].defined() || s[k].device() != fresh.device()) s[k] = fresh;
  else s[k].set_data(fresh);
  return s[k];
}

void Optimizer::capture_replay(std::function<void()> refresh) {
  if (!StepCapture::recording()) return;
  std::vector<Tensor> all;
  for (const auto& g : scalars_) all.insert(all.end(), g.begin(), g.end());
  StepCapture::on_replay(
      [this, refresh = std::move(refresh)] {
        StepScope scope(*this);
        refresh();
      },
      [this] { versions_after_step_ = param_versions(); }, all);
}

void SGD::set_step_scalars() {
  for (size_t g = 0; g < groups_.size(); ++g) scalar(g, 0, groups_[g].options->lr);
}

void SGD::step() {
  StepScope scope(*this);
  set_step_scalars();
  size_t i = 0;  // the parameter's index in state_
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    Group& group = groups_[gi];
    std::vector<Tensor> grads, bufs;
    for (size_t k = 0; k < group.params.size(); ++k) {
      grads.push_back(group.params[k].grad());
      auto it = state_[i + k].find("momentum_buffer");
      bufs.push_back(it == state_[i + k].end() ? Tensor() : it->second);
    }
    check_options(*group.options, "sgd_update");
    bufs = sgd_update_with(group.params, grads, bufs, scalars_[gi][0], *group.options);
    for (size_t k = 0; k < group.params.size(); ++k, ++i)
      if (bufs[k].defined()) state_[i]["momentum_buffer"] = bufs[k];
  }
  ++steps_;
  scope.done();
  capture_replay([this] {
    set_step_scalars();
    ++steps_;
  });
}

// ---- Adam / AdamW ----
Adam::Adam(std::vector<Tensor> params, AdamOptions o, bool decoupled) : Adam(std::vector<Group>{{std::move(params)}}, o, decoupled) {}
Adam::Adam(std::vector<Group> groups, AdamOptions defaults, bool decoupled)
    : OptimizerBase(decoupled ? "AdamW" : "Adam", std::move(groups), defaults), decoupled_(decoupled) {}

void Adam::set_step_scalars() {
  // Step-dependent factors are runtime scalars: the graph is the same at every step.
  for (size_t g = 0; g < groups_.size(); ++g) {
    const AdamOptions& o = *groups_[g].options;
    double bc1 = 1 - std::pow(o.beta1, double(steps_)), bc2 = 1 - std::pow(o.beta2, double(steps_));
    scalar(g, 0, o.lr / bc1);
    scalar(g, 1, 1 / std::sqrt(bc2));
    scalar(g, 2, 1 - o.lr * o.weight_decay);
  }
}

void Adam::step() {
  StepScope scope(*this);
  ++steps_;
  set_step_scalars();
  size_t i = 0;  // the parameter's index in state_
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    Group& group = groups_[gi];
    std::vector<Tensor> grads, m, v;
    for (Tensor& p : group.params) {
      auto& st = state_[i++];
      grads.push_back(p.grad());
      if (grads.back().defined() && !st.count("exp_avg")) {
        st["exp_avg"] = zeros_like(p);
        st["exp_avg_sq"] = zeros_like(p);
      }
      m.push_back(st.count("exp_avg") ? st["exp_avg"] : Tensor());
      v.push_back(st.count("exp_avg_sq") ? st["exp_avg_sq"] : Tensor());
    }
    check_options(*group.options, decoupled_ ? "adamw_update" : "adam_update");
    const auto& sc = scalars_[gi];
    adam_update_with(group.params, grads, m, v, sc[0], sc[1], sc[2], *group.options, decoupled_);
  }
  scope.done();
  capture_replay([this] {
    ++steps_;
    set_step_scalars();
  });
}

// ---- the update kernels ----
namespace {
// A realized float32 scalar on the parameters' device: a graph input, not a constant.
Tensor runtime_scalar_on(const std::vector<Tensor>& params, double v) {
  for (auto& p : params)
    if (p.defined()) return from_vector<double>({v}, {}, {DType::Float32, p.device()});
  return from_vector<double>({v}, {}, {DType::Float32, Device("cpu")});
}
void check_lists(const char* op, size_t n, std::initializer_list<size_t> sizes) {
  for (size_t s : sizes)
    if (s != n) fail(op, "every list must have one entry per parameter (" + std::to_string(n) + "), got " + std::to_string(s), "");
}

std::vector<Tensor> sgd_update_with(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                                    const std::vector<Tensor>& momentum_buffers, const Tensor& lr, const SGDOptions& o) {
  check_lists("sgd_update", params.size(), {grads.size(), momentum_buffers.size()});
  NoGradGuard ng;
  std::vector<Tensor> bufs = momentum_buffers;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor g = grads[i], p = params[i];
    if (!g.defined()) continue;
    if (o.weight_decay != 0) g = g + p * o.weight_decay;
    if (o.momentum != 0) {
      if (!bufs[i].defined()) bufs[i] = g * 1.0;  // first step: the buffer is the gradient
      else bufs[i].mul_(o.momentum).add_(g * (1 - o.dampening));
      g = o.nesterov ? g + bufs[i] * o.momentum : bufs[i];
    }
    p.sub_(g * lr);
  }
  return bufs;
}

void adam_update_with(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avg,
                      const std::vector<Tensor>& exp_avg_sq, const Tensor& step_size, const Tensor& inv_sqrt_bc2,
                      const Tensor& decay, const AdamOptions& o, bool decoupled) {
  const char* op = decoupled ? "adamw_update" : "adam_update";
  check_lists(op, params.size(), {grads.size(), exp_avg.size(), exp_avg_sq.size()});
  NoGradGuard ng;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor g = grads[i], p = params[i], m = exp_avg[i], v = exp_avg_sq[i];
    if (!g.defined()) continue;
    if (!m.defined() || !v.defined()) fail(op, "parameter " + std::to_string(i) + " has no moment buffers", "");
    if (o.weight_decay != 0) {
      if (decoupled) p.mul_(decay);
      else g = g + p * o.weight_decay;
    }
    m.mul_(o.beta1).add_(g * (1 - o.beta1));
    v.mul_(o.beta2).add_(g * g * (1 - o.beta2));
    Tensor denom = sqrt(v) * inv_sqrt_bc2 + o.eps;  // PyTorch's formulation
    p.sub_(m / denom * step_size);
  }
}
}  // namespace

std::vector<Tensor> sgd_update(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                               const std::vector<Tensor>& momentum_buffers, const SGDOptions& o) {
  check_options(o, "sgd_update");
  return sgd_update_with(params, grads, momentum_buffers, runtime_scalar_on(params, o.lr), o);
}

void adam_update(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avg,
                 const std::vector<Tensor>& exp_avg_sq, int64_t step, const AdamOptions& o, bool decoupled) {
  const char* op = decoupled ? "adamw_update" : "adam_update";
  check_options(o, op);
  if (step < 1) fail(op, "step must be at least 1, got " + std::to_string(step), "");
  double bc1 = 1 - std::pow(o.beta1, double(step)), bc2 = 1 - std::pow(o.beta2, double(step));
  // Step-dependent factors are runtime scalars: the graph is the same at every step.
  adam_update_with(params, grads, exp_avg, exp_avg_sq, runtime_scalar_on(params, o.lr / bc1),
                   runtime_scalar_on(params, 1 / std::sqrt(bc2)), runtime_scalar_on(params, 1 - o.lr * o.weight_decay), o,
                   decoupled);
}

template class OptimizerBase<SGDOptions>;
template class OptimizerBase<AdamOptions>;

Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  NoGradGuard ng;
  // The squares of the gradients of one shape, dtype and device are added element by element
  // first, then summed once: one reduction per shape (9 in the benchmark GPT), not one per
  // parameter (29), each of which was its own small Step.
  std::vector<Tensor> squares;  // per group, in order of first appearance
  for (auto& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (g.dtype() == DType::Float16 || g.dtype() == DType::BFloat16) g = g.to(DType::Float32);  // the sums unrounded
    auto same = std::find_if(squares.begin(), squares.end(), [&](const Tensor& s) {
      return s.shape() == g.shape() && s.dtype() == g.dtype() && s.device() == g.device();
    });
    if (same == squares.end()) squares.push_back(g * g);
    else *same = *same + g * g;
  }
  Tensor total;
  for (const Tensor& sq : squares) {
    Tensor s = sq.sum().to(DType::Float32);
    total = total.defined() ? total + s : s;
  }
  if (!total.defined()) return zeros({});
  Tensor norm = sqrt(total);
  Tensor coef = clamp(max_norm / (norm + 1e-6), std::nullopt, 1.0);
  for (auto& p : params) {
    Tensor g = p.grad();
    if (g.defined()) {
      Tensor q = p;
      q.set_grad(g * coef.to(g.dtype()));
    }
  }
  return norm;
}

double WarmupCosine::operator()(int64_t step) const {
  if (warmup > 0 && step < warmup) return lr * double(step + 1) / double(warmup);
  if (step >= total) return min_lr;
  double progress = double(step - warmup) / double(std::max<int64_t>(1, total - warmup));
  return min_lr + 0.5 * (1 + std::cos(M_PI * progress)) * (lr - min_lr);
}

}  // namespace tessera::optim
