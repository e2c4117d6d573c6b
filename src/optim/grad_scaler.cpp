// Dynamic loss scaling (tessera/optim.h, GradScaler).
#include <cmath>

#include "core/fail.h"
#include "tessera/ops.h"
#include "tessera/optim.h"

namespace tessera::optim {
namespace {
// A realized float32 scalar on d: a graph input, so each new value reuses the compiled graph.
Tensor scalar_on(double v, const Device& d) { return from_vector<double>({v}, {}, {DType::Float32, d}); }
}  // namespace

GradScaler::GradScaler(GradScalerOptions o) : o_(o), scale_(o.init_scale) {
  if (!(o.init_scale > 0) || !(o.growth_factor > 1) || !(o.backoff_factor > 0 && o.backoff_factor < 1) || o.growth_interval < 1)
    fail("GradScaler", "needs init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and growth_interval >= 1");
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!loss.defined()) fail("GradScaler", "scale() of an undefined tensor");
  return loss * scalar_on(scale_, loss.device()).to(loss.dtype());
}

void GradScaler::unscale(Optimizer& opt) {
  NoGradGuard ng;
  Tensor bad;  // the sum of every gradient times zero: NaN exactly when one holds an inf or NaN
  for (Tensor& p : opt.params()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    g = g * scalar_on(1.0 / scale_, g.device()).to(g.dtype());
    p.set_grad(g);
    Tensor z = (g * 0.0).sum().to(DType::Float32);
    bad = bad.defined() ? bad + z.to(bad.device()) : z;
  }
  nonfinite_ = bad.defined() ? bad : scalar_on(0, Device("cpu"));
}

bool GradScaler::step(Optimizer& opt) {
  if (!nonfinite_.defined()) unscale(opt);
  found_inf_ = !std::isfinite(nonfinite_.item<double>());
  nonfinite_ = Tensor();
  if (found_inf_) {
    ++skipped_;
    return false;
  }
  opt.step();
  return true;
}

void GradScaler::update() {
  if (found_inf_) {
    scale_ *= o_.backoff_factor;
    good_steps_ = 0;
  } else if (++good_steps_ == o_.growth_interval) {
    scale_ *= o_.growth_factor;
    good_steps_ = 0;
  }
  found_inf_ = false;
}

}  // namespace tessera::optim
