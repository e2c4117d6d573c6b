// Optimizers against hand-computed updates (PyTorch's formulas, in plain double arithmetic) for
// two steps; zero_grad, clipping by global norm, the warmup-cosine schedule, optimizer state
// round trips, and the compile cache: a fixed-shape training loop compiles at most two graphs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tessera/metrics.h"
#include "tessera/nn.h"
#include "tessera/optim.h"
#include "tessera/tessera.h"
#include "test_util.h"

namespace tessera {
namespace {

using testing::all_close;
using testing::make_tensor;
using V = std::vector<double>;

// The tiny problem: loss = sum(c * p^2 + d * p), so grad = 2 c p + d.
const V kP0{1.0, -0.5, 2.0, 0.25};
const V kC{0.5, 1.0, -0.25, 2.0};
const V kD{0.1, -0.2, 0.3, 0.0};

V grad_by_hand(const V& p) {
  V g(p.size());
  for (size_t i = 0; i < p.size(); ++i) g[i] = 2 * kC[i] * p[i] + kD[i];
  return g;
}

void backward_tiny(const Tensor& p) {
  Tensor c = make_tensor(kC, {4}, p.dtype()), d = make_tensor(kD, {4}, p.dtype());
  (c * p * p + d * p).sum().backward();
}

// ---- reference optimizers (torch.optim's update rules) ----
struct RefSGD {
  double lr, momentum = 0, dampening = 0, wd = 0;
  bool nesterov = false;
  V buf = {};
  void step(V& p, V g) {
    for (size_t i = 0; i < p.size(); ++i) g[i] += wd * p[i];
    if (momentum != 0) {
      if (buf.empty()) {
        buf = g;
      } else {
        for (size_t i = 0; i < p.size(); ++i) buf[i] = momentum * buf[i] + (1 - dampening) * g[i];
      }
      for (size_t i = 0; i < p.size(); ++i) g[i] = nesterov ? g[i] + momentum * buf[i] : buf[i];
    }
    for (size_t i = 0; i < p.size(); ++i) p[i] -= lr * g[i];
  }
};

struct RefAdam {
  double lr, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0;
  bool decoupled = false;
  V m = {}, v = {};
  int t = 0;
  void step(V& p, V g) {
    if (m.empty()) m.assign(p.size(), 0), v.assign(p.size(), 0);
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      if (decoupled) p[i] *= 1 - lr * wd;
      else g[i] += wd * p[i];
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
      double denom = std::sqrt(v[i]) / std::sqrt(bc2) + eps;
      p[i] -= lr / bc1 * m[i] / denom;
    }
  }
};

// Runs `steps` steps of an optimizer on the tiny problem and compares with the reference after
// each. `lrs` gives the learning rate of each step (set through set_lr).
template <class Ref>
void check_two_steps(DType dtype, const std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>& make,
                     Ref ref, const V& lrs, double tol = 1e-6) {
  Tensor p = make_tensor(kP0, {4}, dtype);
  p.requires_grad_();
  auto opt = make({p});
  V want = kP0;
  for (size_t s = 0; s < lrs.size(); ++s) {
    SCOPED_TRACE("step " + std::to_string(s + 1));
    opt->set_lr(lrs[s]);
    ref.lr = lrs[s];
    opt->zero_grad();
    backward_tiny(p);
    opt->step();
    sync();
    ref.step(want, grad_by_hand(want));
    EXPECT_TRUE(p.is_realized());
    EXPECT_TRUE(all_close(p.to_vector<double>(), want, tol));
  }
  EXPECT_EQ(opt->steps(), int64_t(lrs.size()));
  // Still a leaf that needs a gradient, updated in place.
  EXPECT_TRUE(p.requires_grad());
  EXPECT_TRUE(p.is_leaf());
}

class OptimDtype : public ::testing::TestWithParam<DType> {};

TEST_P(OptimDtype, SGDPlain) {
  check_two_steps(GetParam(), [](auto ps) { return std::make_unique<optim::SGD>(ps, optim::SGDOptions{.lr = 0.1}); },
                  RefSGD{.lr = 0.1}, {0.1, 0.1});
}

TEST_P(OptimDtype, SGDMomentum) {
  optim::SGDOptions o{.lr = 0.1, .momentum = 0.9};
  check_two_steps(GetParam(), [&](auto ps) { return std::make_unique<optim::SGD>(ps, o); },
                  RefSGD{.lr = 0.1, .momentum = 0.9}, {0.1, 0.05});
}

TEST_P(OptimDtype, SGDMomentumDampeningWeightDecay) {
  optim::SGDOptions o{.lr = 0.2, .momentum = 0.8, .dampening = 0.3, .weight_decay = 0.05};
  check_two_steps(GetParam(), [&](auto ps) { return std::make_unique<optim::SGD>(ps, o); },
                  RefSGD{.lr = 0.2, .momentum = 0.8, .dampening = 0.3, .wd = 0.05}, {0.2, 0.2});
}

TEST_P(OptimDtype, SGDNesterovWeightDecay) {
  optim::SGDOptions o{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true};
  check_two_steps(GetParam(), [&](auto ps) { return std::make_unique<optim::SGD>(ps, o); },
                  RefSGD{.lr = 0.1, .momentum = 0.9, .wd = 0.01, .nesterov = true}, {0.1, 0.1});
}

TEST_P(OptimDtype, Adam) {
  optim::AdamOptions o{.lr = 0.1};
  check_two_steps(GetParam(), [&](auto ps) { return std::make_unique<optim::Adam>(ps, o); }, RefAdam{.lr = 0.1},
                  {0.1, 0.05});
}

TEST_P(OptimDtype, AdamL2WeightDecay) {
  optim::AdamOptions o{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1};
  check_two_steps(GetParam(), [&](auto ps) { return std::make_unique<optim::Adam>(ps, o); },
                  RefAdam{.lr = 0.01, .b1 = 0.8, .b2 = 0.99, .eps = 1e-6, .wd = 0.1}, {0.01, 0.01});
}

TEST_P(OptimDtype, AdamWDecoupledWeightDecay) {
  optim::AdamOptions o{.lr = 0.05, .weight_decay = 0.1};
  check_two_steps(GetParam(), [&](auto ps) { return std::make_unique<optim::AdamW>(ps, o); },
                  RefAdam{.lr = 0.05, .wd = 0.1, .decoupled = true}, {0.05, 0.02});
  // AdamW's defaults are PyTorch's (lr 1e-3, weight decay 1e-2).
  check_two_steps(GetParam(), [&](auto ps) { return std::make_unique<optim::AdamW>(ps); },
                  RefAdam{.lr = 1e-3, .wd = 1e-2, .decoupled = true}, {1e-3, 1e-3});
}

INSTANTIATE_TEST_SUITE_P(Optim, OptimDtype, ::testing::Values(DType::Float32, DType::Float64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The multi-tensor kernels called directly (as Python's optimizers call them): two parameters
// in one call, one without a gradient (skipped), three steps against the references.
TEST(OptimKernels, SGDUpdateManyParamsAgainstReference) {
  optim::SGDOptions o{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01, .nesterov = false};
  Tensor a = make_tensor(kP0, {4}, DType::Float32), b = make_tensor(kP0, {2, 2}, DType::Float32),
         idle = make_tensor(kP0, {4}, DType::Float32);
  for (Tensor* t : {&a, &b, &idle}) t->requires_grad_();
  std::vector<Tensor> bufs(3);
  RefSGD ref{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .wd = 0.01};
  V want = kP0;
  for (int s = 0; s < 3; ++s) {
    a.set_grad(Tensor()), b.set_grad(Tensor());
    backward_tiny(a);
    backward_tiny(b.reshape({4}));
    bufs = optim::sgd_update({a, b, idle}, {a.grad(), b.grad(), Tensor()}, bufs, o);
    ref.step(want, grad_by_hand(want));
    EXPECT_TRUE(all_close(a.to_vector<double>(), want, 1e-6));
    EXPECT_TRUE(all_close(b.to_vector<double>(), want, 1e-6));
  }
  EXPECT_TRUE(bufs[0].defined() && bufs[1].defined());
  EXPECT_FALSE(bufs[2].defined());
  EXPECT_TRUE(all_close(idle.to_vector<double>(), kP0, 0));
  EXPECT_THROW(optim::sgd_update({a, b}, {a.grad()}, bufs, o), Error);
}

TEST(OptimKernels, AdamUpdateManyParamsAgainstReference) {
  for (bool decoupled : {false, true}) {
    SCOPED_TRACE(decoupled ? "AdamW" : "Adam");
    optim::AdamOptions o{.lr = 0.05, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
    Tensor a = make_tensor(kP0, {4}, DType::Float32), b = make_tensor(kP0, {4}, DType::Float64);
    a.requires_grad_(), b.requires_grad_();
    std::vector<Tensor> m{zeros_like(a), zeros_like(b)}, v{zeros_like(a), zeros_like(b)};
    RefAdam ref{.lr = 0.05, .b1 = 0.8, .b2 = 0.95, .eps = 1e-6, .wd = 0.1, .decoupled = decoupled};
    V want = kP0;
    for (int64_t s = 1; s <= 3; ++s) {
      a.set_grad(Tensor()), b.set_grad(Tensor());
      backward_tiny(a);
      backward_tiny(b);
      optim::adam_update({a, b}, {a.grad(), b.grad()}, m, v, s, o, decoupled);
      ref.step(want, grad_by_hand(want));
      EXPECT_TRUE(all_close(a.to_vector<double>(), want, 1e-6));
      EXPECT_TRUE(all_close(b.to_vector<double>(), want, 1e-6));  // the runtime scalars are float32
    }
    EXPECT_TRUE(all_close(m[1].to_vector<double>(), ref.m, 1e-6));
    EXPECT_TRUE(all_close(v[1].to_vector<double>(), ref.v, 1e-6));
    EXPECT_THROW(optim::adam_update({a, b}, {a.grad(), b.grad()}, m, v, 0, o, decoupled), Error);
    EXPECT_THROW(optim::adam_update({a, b}, {a.grad(), b.grad()}, {Tensor(), Tensor()}, v, 1, o, decoupled), Error);
  }
}

TEST(Optim, AdamAndAdamWDiffer) {
  // With weight decay the two rules give different parameters (sanity check of the flag).
  auto run = [](bool decoupled) {
    Tensor p = make_tensor(kP0, {4}, DType::Float64);
    p.requires_grad_();
    optim::Adam opt({p}, {.lr = 0.1, .weight_decay = 0.5}, decoupled);
    for (int s = 0; s < 2; ++s) {
      opt.zero_grad();
      backward_tiny(p);
      opt.step();
    }
    return p.to_vector<double>();
  };
  EXPECT_GT(testing::normalized_error(run(true), run(false)), 1e-4);
}

TEST(Optim, ZeroGradClearsAndAccumulationAdds) {
  Tensor p = make_tensor(kP0, {4});
  p.requires_grad_();
  optim::SGD opt({p}, {.lr = 0.1});
  backward_tiny(p);
  backward_tiny(p);  // accumulates
  V g = grad_by_hand(kP0);
  for (double& x : g) x *= 2;
  ASSERT_TRUE(p.grad().defined());
  EXPECT_TRUE(all_close(p.grad().to_vector<double>(), g, 1e-6));
  opt.zero_grad();
  EXPECT_FALSE(p.grad().defined());
  // A step without gradients leaves the parameter alone.
  opt.step();
  EXPECT_EQ(p.to_vector<double>(), kP0);
  backward_tiny(p);
  EXPECT_TRUE(all_close(p.grad().to_vector<double>(), grad_by_hand(kP0), 1e-6));
}

TEST(Optim, BadOptionsAreErrors) {
  Tensor p = make_tensor(kP0, {4});
  p.requires_grad_();
  Tensor q = make_tensor(kP0, {4});  // no requires_grad
  EXPECT_THROW(optim::SGD({q}, {.lr = 0.1}), Error);
  EXPECT_THROW(optim::SGD({p}, {.lr = -1}), Error);
  EXPECT_THROW(optim::SGD({p}, {.lr = 0.1, .nesterov = true}), Error);  // needs momentum
  EXPECT_THROW(optim::SGD({p}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}), Error);
  EXPECT_THROW(optim::Adam({p}, {.beta1 = 1.0}), Error);
  EXPECT_THROW(optim::AdamW({p}, {.beta2 = -0.1}), Error);
}

// ---- clipping ----
TEST(Optim, ClipGradNormScalesByGlobalNorm) {
  Tensor a = make_tensor({3, 4}, {2}), b = make_tensor({12}, {1}, DType::Float64), c = make_tensor({5}, {1});
  for (Tensor* t : {&a, &b, &c}) t->requires_grad_();
  a.set_grad(make_tensor({3, 4}, {2}));
  b.set_grad(make_tensor({12}, {1}, DType::Float64));
  // c has no gradient: skipped.
  Tensor norm = optim::clip_grad_norm({a, b, c}, 6.5);
  EXPECT_NEAR(norm.item(), 13.0, 1e-5);
  double coef = 6.5 / (13.0 + 1e-6);  // PyTorch: max_norm / (total_norm + 1e-6)
  EXPECT_TRUE(all_close(a.grad().to_vector<double>(), {3 * coef, 4 * coef}, 1e-6));
  EXPECT_TRUE(all_close(b.grad().to_vector<double>(), {12 * coef}, 1e-6));
  EXPECT_EQ(b.grad().dtype(), DType::Float64);
  EXPECT_FALSE(c.grad().defined());

  // Below the threshold: unchanged.
  a.set_grad(make_tensor({0.3, -0.4}, {2}));
  b.set_grad(make_tensor({1.2}, {1}, DType::Float64));
  EXPECT_NEAR(optim::clip_grad_norm({a, b}, 100).item(), 1.3, 1e-6);
  EXPECT_TRUE(all_close(a.grad().to_vector<double>(), {0.3, -0.4}, 1e-7));
  EXPECT_TRUE(all_close(b.grad().to_vector<double>(), {1.2}, 1e-7));

  // No gradients at all: norm 0.
  EXPECT_EQ(optim::clip_grad_norm({c}, 1.0).item(), 0.0);
}

// ---- schedule ----
TEST(Optim, WarmupCosineValues) {
  optim::WarmupCosine s{.lr = 1.0, .min_lr = 0.1, .warmup = 10, .total = 110};
  // Linear warmup: step s (0-based) gets lr * (s + 1) / warmup.
  EXPECT_NEAR(s(0), 0.1, 1e-12);
  EXPECT_NEAR(s(4), 0.5, 1e-12);
  EXPECT_NEAR(s(9), 1.0, 1e-12);
  // Cosine from lr at the end of warmup down to min_lr at `total`.
  EXPECT_NEAR(s(10), 1.0, 1e-12);
  EXPECT_NEAR(s(35), 0.1 + 0.5 * (1 + std::cos(M_PI * 0.25)) * 0.9, 1e-12);
  EXPECT_NEAR(s(60), 0.55, 1e-12);
  EXPECT_NEAR(s(85), 0.1 + 0.5 * (1 + std::cos(M_PI * 0.75)) * 0.9, 1e-12);
  EXPECT_NEAR(s(110), 0.1, 1e-12);
  EXPECT_NEAR(s(1000), 0.1, 1e-12);
  for (int64_t t = 10; t < 120; ++t) EXPECT_LE(s(t + 1), s(t) + 1e-15) << t;
  for (int64_t t = 0; t < 9; ++t) EXPECT_LT(s(t), s(t + 1)) << t;
  optim::WarmupCosine nw{.lr = 3e-4, .min_lr = 0, .warmup = 0, .total = 100};
  EXPECT_NEAR(nw(0), 3e-4, 1e-15);
  EXPECT_NEAR(nw(50), 1.5e-4, 1e-15);
  EXPECT_NEAR(nw(100), 0, 1e-15);
}

// ---- optimizer state round trip ----
std::map<std::string, Tensor> host_copy(const std::map<std::string, Tensor>& sd) {
  std::map<std::string, Tensor> r;
  for (auto& [k, t] : sd) r[k] = make_tensor(t.to_vector<double>(), t.shape(), t.dtype());
  return r;
}

void check_resume(const std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>& make) {
  // Two parameters, one of which gets no gradient on odd steps (its state must still match).
  auto fresh = [](const V& v) {
    Tensor t = make_tensor(v, {4});
    t.requires_grad_();
    return t;
  };
  auto loss_step = [](Tensor& p, Tensor& q, int s) {
    Tensor c = make_tensor(kC, {4}), d = make_tensor(kD, {4});
    Tensor l = (c * p * p + d * p).sum();
    if (s % 2 == 0) l = l + (q * q * q).sum() * 0.1;
    l.backward();
  };
  Tensor p = fresh(kP0), q = fresh({0.5, 1, -1, 2});
  auto opt = make({p, q});
  for (int s = 0; s < 3; ++s) {
    opt->zero_grad();
    loss_step(p, q, s);
    opt->step();
  }
  sync();
  auto saved = host_copy(opt->state_dict());
  EXPECT_TRUE(saved.count("step"));
  EXPECT_EQ(saved.at("step").item(), 3);
  V p3 = p.to_vector<double>(), q3 = q.to_vector<double>();
  double lr = opt->lr();
  // Uninterrupted: a fourth step.
  opt->zero_grad();
  loss_step(p, q, 3);
  opt->step();
  loss_step(p, q, 4);  // and a fifth, to check the step count carried over
  opt->step();
  V p5 = p.to_vector<double>(), q5 = q.to_vector<double>();

  // Resumed: new parameters with the saved values, a new optimizer loading the saved state.
  Tensor p2 = fresh(p3), q2 = fresh(q3);
  auto opt2 = make({p2, q2});
  opt2->set_lr(lr);
  opt2->load_state_dict(saved);
  EXPECT_EQ(opt2->steps(), 3);
  opt2->zero_grad();
  loss_step(p2, q2, 3);
  opt2->step();
  loss_step(p2, q2, 4);
  opt2->step();
  EXPECT_EQ(p2.to_vector<double>(), p5);
  EXPECT_EQ(q2.to_vector<double>(), q5);
  EXPECT_EQ(opt2->steps(), 5);
  // Saving must not alias live state: the snapshot keeps step 3's values.
  EXPECT_EQ(saved.at("step").item(), 3);
}

TEST(Optim, StateDictRoundTripSGDMomentum) {
  check_resume([](auto ps) { return std::make_unique<optim::SGD>(ps, optim::SGDOptions{.lr = 0.05, .momentum = 0.9}); });
}

TEST(Optim, StateDictRoundTripAdamW) {
  check_resume([](auto ps) { return std::make_unique<optim::AdamW>(ps, optim::AdamOptions{.lr = 0.05, .weight_decay = 0.1}); });
}

TEST(Optim, LoadStateDictErrors) {
  Tensor p = make_tensor(kP0, {4});
  p.requires_grad_();
  optim::AdamW opt({p});
  EXPECT_THROW(opt.load_state_dict({}), Error);  // no step
  std::map<std::string, Tensor> sd{{"step", from_vector<int64_t>({1}, {}, {DType::Int64, Device("cpu")})},
                                   {"3.exp_avg", zeros({4})}};
  EXPECT_THROW(opt.load_state_dict(sd), Error);  // no parameter 3
  sd.erase("3.exp_avg");
  sd["0.exp_avg"] = zeros({5});
  EXPECT_THROW(opt.load_state_dict(sd), Error);  // wrong shape
}

// ---- parameter groups ----
// The tiny problem's p plus a second parameter q with loss 0.1 * sum(q^3) (grad 0.3 q^2).
const V kQ0{0.5, -1.0};
V grad_q_by_hand(const V& q) { return {0.3 * q[0] * q[0], 0.3 * q[1] * q[1]}; }
void backward_two(const Tensor& p, const Tensor& q) {
  Tensor c = make_tensor(kC, {4}, p.dtype()), d = make_tensor(kD, {4}, p.dtype());
  ((c * p * p + d * p).sum() + (q * q * q).sum() * 0.1).backward();
}
Tensor leaf(const V& v) {
  Tensor t = make_tensor(v, {int64_t(v.size())}, DType::Float64);
  t.requires_grad_();
  return t;
}

// AdamW with two groups (a decayed one at the defaults and one with its own rate and no decay)
// against the reference rule applied to each group, through a schedule driving both.
TEST(OptimGroups, AdamWTwoGroupsByHand) {
  Tensor p = leaf(kP0), q = leaf(kQ0);
  optim::AdamW opt({{{p}}, {{q}, optim::AdamOptions{.lr = 0.05, .weight_decay = 0}}}, {.lr = 0.1, .weight_decay = 0.5});
  ASSERT_EQ(opt.num_param_groups(), 2u);
  EXPECT_EQ(opt.param_groups()[0].options->weight_decay, 0.5);  // filled in from the defaults
  EXPECT_EQ(opt.param_groups()[1].options->lr, 0.05);
  EXPECT_EQ(opt.defaults().lr, 0.1);
  RefAdam rp{.lr = 0.1, .wd = 0.5, .decoupled = true}, rq{.lr = 0.05, .wd = 0, .decoupled = true};
  V wp = kP0, wq = kQ0;
  // The schedule's rate goes to group 0; group 1 keeps half of it (0.05 / 0.1).
  for (double lr : {0.1, 0.2, 0.04}) {
    opt.set_lr(lr);
    EXPECT_EQ(opt.lr(), lr);
    EXPECT_EQ(opt.lr(0), lr);
    EXPECT_NEAR(opt.lr(1), lr / 2, 1e-15);
    rp.lr = lr;
    rq.lr = lr / 2;
    opt.zero_grad();
    backward_two(p, q);
    opt.step();
    rp.step(wp, grad_by_hand(wp));
    rq.step(wq, grad_q_by_hand(wq));
    EXPECT_TRUE(all_close(p.to_vector<double>(), wp, 1e-6));  // the rates are float32 graph inputs
    EXPECT_TRUE(all_close(q.to_vector<double>(), wq, 1e-6));  // the rates are float32 graph inputs
  }
  EXPECT_EQ(opt.params().size(), 2u);
}

TEST(OptimGroups, SGDAddParamGroupAndPerGroupRates) {
  Tensor p = leaf(kP0), q = leaf(kQ0);
  optim::SGD opt({p}, {.lr = 0.1, .momentum = 0.9});
  opt.add_param_group({{q}, optim::SGDOptions{.lr = 0.01, .weight_decay = 0.2}});
  opt.add_param_group({{leaf({1.0})}});  // the defaults; gets no gradient here
  ASSERT_EQ(opt.param_groups().size(), 3u);
  EXPECT_EQ(opt.param_groups()[2].options->momentum, 0.9);
  opt.set_lr(1, 0.02);  // one group only
  EXPECT_EQ(opt.lr(0), 0.1);
  RefSGD rp{.lr = 0.1, .momentum = 0.9}, rq{.lr = 0.02, .wd = 0.2};
  V wp = kP0, wq = kQ0;
  for (int s = 0; s < 2; ++s) {
    opt.zero_grad();
    backward_two(p, q);
    opt.step();
    rp.step(wp, grad_by_hand(wp));
    rq.step(wq, grad_q_by_hand(wq));
  }
  EXPECT_TRUE(all_close(p.to_vector<double>(), wp, 1e-6));  // the rates are float32 graph inputs
  EXPECT_TRUE(all_close(q.to_vector<double>(), wq, 1e-6));  // the rates are float32 graph inputs
  EXPECT_EQ(opt.param_groups()[2].params[0].to_vector<double>(), V{1.0});
}

TEST(OptimGroups, BadGroupsAreErrors) {
  Tensor p = leaf(kP0), q = leaf(kQ0);
  EXPECT_THROW(optim::Adam({{{p}}, {{p, q}}}), Error);  // p in two groups
  EXPECT_THROW(optim::SGD({p, p}, {.lr = 0.1}), Error);  // twice in one
  optim::SGD opt({p}, {.lr = 0.1});
  EXPECT_THROW(opt.add_param_group({{q}, optim::SGDOptions{.lr = 0.1, .nesterov = true}}), Error);
  EXPECT_THROW(opt.add_param_group({{q}, optim::SGDOptions{.lr = -1}}), Error);
  EXPECT_THROW(opt.lr(1), Error);
  EXPECT_THROW(optim::AdamW({{{q}, optim::AdamOptions{.beta1 = 1}}}), Error);
  EXPECT_EQ(opt.num_param_groups(), 1u);  // the refused groups were not added
}

// A checkpoint of a grouped optimizer restores the rates and the state per group, and refuses
// an optimizer whose groups are laid out differently.
TEST(OptimGroups, StateDictWithGroups) {
  auto make = [](Tensor p, Tensor q) {
    return std::make_unique<optim::AdamW>(std::vector<optim::AdamW::Group>{{{p}}, {{q}, optim::AdamOptions{.lr = 0.02, .weight_decay = 0}}},
                                          optim::AdamOptions{.lr = 0.04, .weight_decay = 0.1});
  };
  Tensor p = leaf(kP0), q = leaf(kQ0);
  auto opt = make(p, q);
  opt->set_lr(0.03);
  for (int s = 0; s < 2; ++s) {
    opt->zero_grad();
    backward_two(p, q);
    opt->step();
  }
  auto saved = host_copy(opt->state_dict());
  EXPECT_EQ(saved.at("param_groups.1.lr").item(), 0.015);
  EXPECT_EQ(saved.at("param_groups.0.params").item<int64_t>(), 1);
  V p2 = p.to_vector<double>(), q2 = q.to_vector<double>();
  opt->zero_grad();
  backward_two(p, q);
  opt->step();

  Tensor pr = leaf(p2), qr = leaf(q2);
  auto resumed = make(pr, qr);
  resumed->load_state_dict(saved);
  EXPECT_EQ(resumed->lr(), 0.03);
  EXPECT_EQ(resumed->lr(1), 0.015);
  EXPECT_EQ(resumed->steps(), 2);
  resumed->zero_grad();
  backward_two(pr, qr);
  resumed->step();
  EXPECT_EQ(pr.to_vector<double>(), p.to_vector<double>());
  EXPECT_EQ(qr.to_vector<double>(), q.to_vector<double>());

  optim::AdamW one({leaf(p2), leaf(q2)});  // one group of both: another layout
  EXPECT_THROW(one.load_state_dict(saved), Error);
  // A state without group entries (older checkpoints) still loads, keeping the rates.
  saved.erase("param_groups.0.lr"), saved.erase("param_groups.1.lr"), saved.erase("param_groups.0.params"),
      saved.erase("param_groups.1.params"), saved.erase("lr");
  one.load_state_dict(saved);
  EXPECT_EQ(one.lr(), 1e-3);
  EXPECT_EQ(one.steps(), 2);
  for (const char* key : {"param_groups.x.lr", "param_groups.0.betas", "x.exp_avg", "01234567890.exp_avg"}) {
    auto bad = saved;
    bad[key] = bad.at("step");
    EXPECT_THROW(one.load_state_dict(bad), Error) << key;
  }
}

// ---- the compile cache over a training loop ----
TEST(OptimCache, FixedShapeTrainingLoopCompilesAtMostTwoGraphs) {
  nn::GPTConfig c;
  c.vocab = 19;
  c.block = 12;
  c.embd = 24;
  c.heads = 2;
  c.layers = 2;
  nn::GPT model(c);
  optim::AdamW opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0.1});
  optim::WarmupCosine sched{.lr = 1e-2, .min_lr = 1e-3, .warmup = 5, .total = 20};
  std::mt19937 rng(7);
  auto batch = [&](int64_t B) {
    std::vector<int64_t> x(size_t(B * c.block)), y(x.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = int64_t(rng() % uint32_t(c.vocab)), y[i] = (x[i] + 1) % c.vocab;
    return std::pair{from_vector(x, {B, c.block}, {DType::Int64, Device("cpu")}),
                     from_vector(y, {B, c.block}, {DType::Int64, Device("cpu")})};
  };
  auto train_step = [&](int64_t step, int64_t B) {
    auto [x, y] = batch(B);
    opt.set_lr(sched(step));
    opt.zero_grad();
    Tensor loss = model.loss(x, y);
    loss.backward();
    optim::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    sync();
    EXPECT_TRUE(loss.is_realized());
    return loss.item();
  };
  Tensor wte = model.wte->weight;
  auto before = metrics();
  std::vector<double> losses;
  for (int64_t s = 0; s < 20; ++s) losses.push_back(train_step(s, 4));
  auto after = metrics();
  int64_t compiled = after.graphs_compiled - before.graphs_compiled;
  std::printf("[optim] 20 fixed-shape GPT training steps: %lld graphs compiled, %lld cache hits\n", (long long)compiled,
              (long long)(after.cache_hits - before.cache_hits));
  EXPECT_LE(compiled, 2) << "20 fixed-shape steps compiled " << compiled << " graphs";
  EXPECT_GE(after.cache_hits - before.cache_hits, 18);
  EXPECT_EQ(opt.steps(), 20);
  // The parameters are updated in place (same handles, realized) and training did something.
  EXPECT_TRUE(wte.is_same(model.wte->weight));
  EXPECT_TRUE(wte.is_realized());
  for (double l : losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(losses.back(), losses.front());

  // A different batch size is a different graph.
  auto mid = metrics();
  train_step(20, 2);
  train_step(21, 2);
  EXPECT_GT(metrics().graphs_compiled - mid.graphs_compiled, 0);
}

}  // namespace
}  // namespace tessera
