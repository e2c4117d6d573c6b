// Optimizers. Updates are in place under NoGradGuard, so parameters and moments keep their
// buffers (donation); the learning rate and step-dependent factors enter each step's graph as
// runtime scalars, so a schedule never changes the graph or recompiles it.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "tessera/tensor.h"

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera::optim {

class Optimizer {
 public:
  Optimizer(std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;
  void zero_grad();  // clears every parameter's gradient
  virtual void step() = 0;
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  int64_t steps() const { return steps_; }
  const std::vector<Tensor>& params() const { return params_; }
  // State for checkpoints: per-parameter tensors as "<param index>.<name>", and "step".
  virtual std::map<std::string, Tensor> state_dict() const;
  virtual void load_state_dict(const std::map<std::string, Tensor>& sd);

 protected:
  // A realized float32 scalar holding v: a graph input, not a constant.
  Tensor runtime_scalar(double v) const;
  std::vector<Tensor> params_;
  std::vector<std::map<std::string, Tensor>> state_;  // per parameter
  double lr_;
  int64_t steps_ = 0;
};

struct SGDOptions {
  double lr = 1e-2, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
};
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions o);
  void step() override;

 private:
  SGDOptions o_;
};

struct AdamOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
};
// Adam (L2 weight decay added to the gradient); AdamW decouples it (p -= lr * wd * p).
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions o, bool decoupled_weight_decay = false);
  void step() override;

 private:
  AdamOptions o_;
  bool decoupled_;
};
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamOptions o = {.lr = 1e-3, .weight_decay = 1e-2}) : Adam(std::move(params), o, true) {}
};

// Scales gradients in place so their global L2 norm is at most max_norm; returns the norm
// before clipping (lazy: reading it is a host sync).
Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

// Linear warmup from 0 to lr over `warmup` steps, then cosine decay to min_lr at `total`.
struct WarmupCosine {
  double lr, min_lr;
  int64_t warmup, total;
  double operator()(int64_t step) const;
};

}  // namespace tessera::optim
#pragma GCC visibility pop
