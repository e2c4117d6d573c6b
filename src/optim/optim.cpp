#include "tessera/optim.h"

#include <cmath>

#include "core/fail.h"
#include "tessera/ops.h"

namespace tessera::optim {

Optimizer::Optimizer(std::vector<Tensor> params, double lr) : params_(std::move(params)), state_(params_.size()), lr_(lr) {
  if (lr < 0) fail("optimizer", "learning rate must be non-negative, got " + std::to_string(lr), "");
  for (auto& p : params_)
    if (!p.defined() || !p.requires_grad()) fail("optimizer", "every parameter must be a defined tensor that requires grad", "");
}

void Optimizer::zero_grad() {
  for (auto& p : params_) p.set_grad(Tensor());
}

Tensor Optimizer::runtime_scalar(double v) const {
  Device d = params_.empty() ? Device("cpu") : params_[0].device();
  return from_vector<double>({v}, {}, {DType::Float32, d});
}

std::map<std::string, Tensor> Optimizer::state_dict() const {
  std::map<std::string, Tensor> r;
  r["step"] = from_vector<int64_t>({steps_}, {}, {DType::Int64, Device("cpu")});
  for (size_t i = 0; i < state_.size(); ++i)
    for (auto& [name, t] : state_[i]) r[std::to_string(i) + "." + name] = t;
  return r;
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& sd) {
  auto it = sd.find("step");
  if (it == sd.end()) fail("optimizer", "state has no 'step' entry", "");
  steps_ = int64_t(it->second.item());
  for (auto& s : state_) s.clear();
  for (auto& [key, t] : sd) {
    if (key == "step") continue;
    auto dot = key.find('.');
    size_t i = dot == std::string::npos ? state_.size() : size_t(std::stoul(key.substr(0, dot)));
    if (i >= state_.size()) fail("optimizer", "state entry '" + key + "' names no parameter of this optimizer", "");
    if (t.shape() != params_[i].shape())
      fail("optimizer", "state entry '" + key + "' has shape " + shape_str(t.shape()) + ", parameter " + shape_str(params_[i].shape()), "");
    state_[i][key.substr(dot + 1)] = t.device() == params_[i].device() ? t : t.to(params_[i].device());
  }
}

// ---- SGD ----
SGD::SGD(std::vector<Tensor> params, SGDOptions o) : Optimizer(std::move(params), o.lr), o_(o) {
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
    fail("SGD", "Nesterov momentum needs momentum > 0 and zero dampening", "");
}

void SGD::step() {
  NoGradGuard ng;
  Tensor lr = runtime_scalar(lr_);
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (o_.weight_decay != 0) g = g + p * o_.weight_decay;
    if (o_.momentum != 0) {
      auto it = state_[i].find("momentum_buffer");
      if (it == state_[i].end()) {
        state_[i]["momentum_buffer"] = g * 1.0;  // first step: the buffer is the gradient
      } else {
        it->second.mul_(o_.momentum).add_(g * (1 - o_.dampening));
      }
      Tensor buf = state_[i]["momentum_buffer"];
      g = o_.nesterov ? g + buf * o_.momentum : buf;
    }
    p.sub_(g * lr);
  }
  ++steps_;
}

// ---- Adam / AdamW ----
Adam::Adam(std::vector<Tensor> params, AdamOptions o, bool decoupled)
    : Optimizer(std::move(params), o.lr), o_(o), decoupled_(decoupled) {
  if (o.beta1 < 0 || o.beta1 >= 1 || o.beta2 < 0 || o.beta2 >= 1)
    fail(decoupled ? "AdamW" : "Adam", "betas must be in [0, 1)", "");
}

void Adam::step() {
  NoGradGuard ng;
  ++steps_;
  double bc1 = 1 - std::pow(o_.beta1, double(steps_)), bc2 = 1 - std::pow(o_.beta2, double(steps_));
  // Step-dependent factors are runtime scalars: the graph is the same at every step.
  Tensor step_size = runtime_scalar(lr_ / bc1), inv_sqrt_bc2 = runtime_scalar(1 / std::sqrt(bc2));
  Tensor decay = runtime_scalar(1 - lr_ * o_.weight_decay);
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (o_.weight_decay != 0) {
      if (decoupled_) p.mul_(decay);
      else g = g + p * o_.weight_decay;
    }
    auto& st = state_[i];
    if (!st.count("exp_avg")) {
      st["exp_avg"] = zeros_like(p);
      st["exp_avg_sq"] = zeros_like(p);
    }
    Tensor& m = st["exp_avg"];
    Tensor& v = st["exp_avg_sq"];
    m.mul_(o_.beta1).add_(g * (1 - o_.beta1));
    v.mul_(o_.beta2).add_(g * g * (1 - o_.beta2));
    Tensor denom = sqrt(v) * inv_sqrt_bc2 + o_.eps;  // PyTorch's formulation
    p.sub_(m / denom * step_size);
  }
}

Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  NoGradGuard ng;
  Tensor total;
  for (auto& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor s = (g * g).sum().to(DType::Float32);
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
