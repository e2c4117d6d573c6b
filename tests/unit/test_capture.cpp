// tessera::StepCapture (include/tessera/capture.h): a replayed step gives what tracing the step
// gives, bit for bit (a GPT trained with dropout, AdamW and a learning-rate schedule, against the
// same run traced every step: losses, parameters, moments, the optimizer's step count and the
// parameters' versions), reads what changed outside the step (set_data, set_lr), and traces,
// saying why, whenever a replay could differ from tracing.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>

#include "tessera/capture.h"
#include "tessera/metrics.h"
#include "tessera/nn.h"
#include "tessera/ops.h"
#include "tessera/optim.h"
#include "tessera/tensor.h"

using namespace tessera;

namespace {

Tensor ids(const std::vector<int64_t>& v, const Shape& s) { return from_vector<int64_t>(v, s, {DType::Int64, Device("cpu")}); }

std::vector<int64_t> random_ids(size_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> r(n);
  for (auto& x : r) x = int64_t(rng() % uint32_t(vocab));
  return r;
}

// Exact equality of two float tensors' bits.
bool same_bits(const Tensor& a, const Tensor& b) {
  std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

struct GptRun {
  std::vector<float> losses;
  std::vector<Tensor> params;
  std::map<std::string, Tensor> opt_state;
  int64_t opt_steps = 0;
  std::vector<int64_t> versions;
  int64_t replays = 0, traces = 0, compiled_while_replaying = 0;
  std::string reason;
  Tensor next_draw;
};

// 12 steps of a 2-layer GPT with dropout, AdamW with weight decay and a warm-up + cosine schedule
// set before every step; traced every step, or as a StepCapture.
GptRun train_gpt(bool capture) {
  manual_seed(7);
  nn::GPTConfig cfg;
  cfg.vocab = 23, cfg.block = 8, cfg.embd = 16, cfg.heads = 2, cfg.layers = 2, cfg.dropout = 0.1;
  nn::GPT model(cfg);
  model.train(true);
  optim::AdamW opt(model.parameters(), {.lr = 3e-3, .weight_decay = 0.1});
  optim::WarmupCosine sched{3e-3, 1e-4, 3, 12};
  auto body = [&](const std::vector<Tensor>& b) {
    Tensor loss = model.loss(b[0], b[1]);
    loss.backward();
    opt.step();
    opt.zero_grad();
    return std::vector<Tensor>{loss};
  };
  StepCapture step(body);
  GptRun r;
  for (int64_t s = 0; s < 12; ++s) {
    opt.set_lr(sched(s));
    Tensor x = ids(random_ids(4 * 8, cfg.vocab, uint32_t(100 + s % 3)), {4, 8});
    Tensor y = ids(random_ids(4 * 8, cfg.vocab, uint32_t(200 + s % 3)), {4, 8});
    const int64_t compiled = metrics().graphs_compiled;
    Tensor loss = capture ? step({x, y})[0] : body({x, y})[0];
    r.losses.push_back(loss.item<float>());
    if (capture && step.last_replayed()) r.compiled_while_replaying += metrics().graphs_compiled - compiled;
    if (capture && !step.last_replayed()) r.reason += "[" + std::to_string(s) + "] " + step.last_reason() + "\n";
  }
  for (const Tensor& p : model.parameters()) {
    r.params.push_back(p.detach().clone());
    r.versions.push_back(p.version());
  }
  for (auto& [k, t] : opt.state_dict()) r.opt_state[k] = t.detach().clone();
  r.opt_steps = opt.steps();
  r.next_draw = rand({4});
  r.next_draw.to_vector<float>();
  r.replays = step.replays();
  r.traces = step.traces();
  return r;
}

}  // namespace

TEST(StepCapture, GptTrainingWithDropoutAndAScheduleIsBitIdenticalToTracing) {
  GptRun traced = train_gpt(false), captured = train_gpt(true);
  // The first call traces (AdamW makes its moments), the second is recorded, the third's trace
  // agrees with it: the other 9 replay, compiling nothing.
  EXPECT_EQ(captured.traces, 3) << captured.reason;
  EXPECT_EQ(captured.replays, 9) << captured.reason;
  EXPECT_EQ(captured.compiled_while_replaying, 0);
  ASSERT_EQ(traced.losses.size(), captured.losses.size());
  for (size_t s = 0; s < traced.losses.size(); ++s)
    EXPECT_EQ(std::memcmp(&traced.losses[s], &captured.losses[s], sizeof(float)), 0)
        << "step " << s << ": traced " << traced.losses[s] << ", captured " << captured.losses[s];
  EXPECT_NE(traced.losses[0], traced.losses[11]);  // it trained
  ASSERT_EQ(traced.params.size(), captured.params.size());
  for (size_t i = 0; i < traced.params.size(); ++i) EXPECT_TRUE(same_bits(traced.params[i], captured.params[i])) << "parameter " << i;
  EXPECT_EQ(traced.versions, captured.versions);  // the in-place updates counted as tracing counts them
  EXPECT_EQ(traced.opt_steps, 12);
  EXPECT_EQ(captured.opt_steps, 12);
  ASSERT_EQ(traced.opt_state.size(), captured.opt_state.size());
  for (auto& [k, t] : traced.opt_state) {
    ASSERT_TRUE(captured.opt_state.count(k)) << k;
    const Tensor& c = captured.opt_state.at(k);
    if (t.dtype() == DType::Float32) EXPECT_TRUE(same_bits(t, c)) << k;
    else EXPECT_EQ(t.item(), c.item()) << k;
  }
  // The next draws continue where the traced run's do (the replays moved the generator on).
  EXPECT_TRUE(same_bits(traced.next_draw, captured.next_draw));
}

namespace {
// y = x @ w fitted by SGD with momentum: a small step whose values the tests compute by tracing.
struct Linear {
  Tensor w = from_vector<float>({0.5f, -0.25f, 1.0f}, {3, 1});
  optim::SGD opt;
  Linear() : opt({w.requires_grad_()}, {.lr = 0.1, .momentum = 0.9}) {}
  std::vector<Tensor> step(const std::vector<Tensor>& in) {
    Tensor d = in[0].matmul(w) - in[1];
    Tensor loss = (d * d).mean();
    loss.backward();
    opt.step();
    opt.zero_grad();
    return {loss};
  }
};
Tensor batch_x(int k, int64_t rows = 4) {
  std::vector<float> v;
  for (int64_t i = 0; i < rows * 3; ++i) v.push_back(float((i * 7 + k * 3) % 11) / 11.0f - 0.4f);
  return from_vector<float>(v, {rows, 3});
}
Tensor batch_y(int k, int64_t rows = 4) {
  std::vector<float> v;
  for (int64_t i = 0; i < rows; ++i) v.push_back(float((i * 5 + k) % 7) / 7.0f);
  return from_vector<float>(v, {rows, 1});
}
}  // namespace

TEST(StepCapture, ReplaysSeeSetDataAndSetLrOutsideTheStep) {
  Linear a, b;  // a: captured; b: traced every step, the reference
  StepCapture step([&](const std::vector<Tensor>& in) { return a.step(in); });
  auto both = [&](int k) {
    float got = step({batch_x(k), batch_y(k)})[0].item<float>();
    float want = b.step({batch_x(k), batch_y(k)})[0].item<float>();
    EXPECT_EQ(got, want) << "call " << k;
    EXPECT_TRUE(same_bits(a.w, b.w)) << "call " << k;
  };
  for (int k = 0; k < 4; ++k) both(k);
  EXPECT_EQ(step.replays(), 1);  // calls 0 and 1 traced (the momentum buffer appears), 2 armed, 3 replayed
  EXPECT_TRUE(step.last_replayed()) << step.last_reason();
  // Outside the step: new parameter values and a new learning rate; the replay reads both.
  // (A tensor of its own: a buffer shared with another tensor would not be updated in place.)
  a.w.set_data(from_vector<float>({-1.0f, 2.0f, 0.125f}, {3, 1}));
  b.w.set_data(from_vector<float>({-1.0f, 2.0f, 0.125f}, {3, 1}));
  a.opt.set_lr(0.02);
  b.opt.set_lr(0.02);
  for (int k = 4; k < 7; ++k) {
    both(k);
    EXPECT_TRUE(step.last_replayed()) << step.last_reason();
  }
  EXPECT_EQ(a.opt.steps(), 7);
}

TEST(StepCapture, TracesAndSaysWhyWhenAReplayCouldDiffer) {
  Linear a, b;
  StepCapture step([&](const std::vector<Tensor>& in) { return a.step(in); });
  int k = 0;
  auto both = [&](Tensor x, Tensor y) {
    float got = step({x, y})[0].item<float>();
    float want = b.step({x, y})[0].item<float>();
    EXPECT_EQ(got, want) << "call " << k;
    EXPECT_TRUE(same_bits(a.w, b.w)) << "call " << k;
    ++k;
  };
  auto arm = [&] {
    for (int i = 0; i < 3; ++i) both(batch_x(k), batch_y(k));
    ASSERT_TRUE(step.last_replayed() || step.last_reason().find("the next calls replay") != std::string::npos) << step.last_reason();
    both(batch_x(k), batch_y(k));
    ASSERT_TRUE(step.last_replayed()) << step.last_reason();
  };
  auto expect_traced = [&](const std::string& why) {
    EXPECT_FALSE(step.last_replayed());
    EXPECT_NE(step.last_reason().find(why), std::string::npos) << "reason: " << step.last_reason();
  };
  arm();
  // Work pending before the call would join the step's graph.
  Tensor pending = a.w * 2.0;
  both(batch_x(k), batch_y(k));
  expect_traced("pending before the call");
  pending = Tensor();
  arm();
  // An input of another shape.
  both(batch_x(k, 6), batch_y(k, 6));
  expect_traced("input 0 is float32[6, 3]");
  arm();  // back at 4 rows
  // A gradient left on the parameter outside the step: tracing would add to it.
  {
    Tensor g = (a.w * a.w).sum();
    g.backward();
    Tensor gb = (b.w * b.w).sum();
    gb.backward();
    tessera::sync();
  }
  both(batch_x(k), batch_y(k));
  expect_traced("gradient of the parameter float32[3, 1]");
  arm();
  // Another tensor sharing the parameter's buffer: the step must not overwrite it.
  Tensor before = a.w.detach();
  std::vector<float> old = before.to_vector<float>();
  both(batch_x(k), batch_y(k));
  expect_traced("shared with another tensor");
  EXPECT_EQ(before.to_vector<float>(), old);  // the alias kept its value
  before = Tensor();
  arm();
  // The parameter frozen: tracing differentiates nothing (an error), a replay would update it.
  a.w.requires_grad_(false);
  EXPECT_THROW(step({batch_x(k), batch_y(k)}), Error);
  expect_traced("no longer requires grad");
  a.w.requires_grad_(true);
  step.reset();
  arm();
  // Grad mode off: the step's trace would record no gradient.
  {
    NoGradGuard no_grad;
    EXPECT_THROW(step({batch_x(k), batch_y(k)}), Error);  // backward() with nothing to differentiate
    expect_traced("grad mode is off");
  }
}

TEST(StepCapture, NeverReplaysAStepItCannotRepeat) {
  Tensor w = from_vector<float>({1.0f, 2.0f}, {2});
  auto run = [&](StepCapture::Fn fn, const std::string& why) {
    StepCapture step(std::move(fn));
    for (int k = 0; k < 4; ++k) {
      std::vector<Tensor> out = step({from_vector<float>({float(k), 1.0f}, {2})});
      EXPECT_FALSE(step.last_replayed()) << why;
      EXPECT_NE(step.last_reason().find(why), std::string::npos) << "reason: " << step.last_reason();
    }
    EXPECT_EQ(step.replays(), 0);
  };
  // A value read back mid-step may steer the trace.
  run([&](const std::vector<Tensor>& in) {
        double s = (in[0] * w).sum().item();
        return std::vector<Tensor>{in[0] * (s > 1 ? 2.0 : 3.0)};
      },
      "read a value back");
  // A tensor made from host values inside the step: its next value is unseen.
  int calls = 0;
  run([&](const std::vector<Tensor>& in) {
        Tensor scale = from_vector<float>({float(++calls)}, {});
        return std::vector<Tensor>{in[0] * scale};
      },
      "made from host values");
  // A value the step made, kept outside it: a replay would not update it.
  Tensor kept;
  run([&](const std::vector<Tensor>& in) {
        kept = in[0] + w;
        return std::vector<Tensor>{kept * 2.0};
      },
      "still referenced after it");
  // A state tensor given a host value with set_data inside the step, no hook refreshing it.
  Tensor bias = from_vector<float>({0.0f, 0.0f}, {2});
  run([&](const std::vector<Tensor>& in) {
        bias.set_data(from_vector<float>({float(++calls), 0.0f}, {2}));
        return std::vector<Tensor>{in[0] + bias};
      },
      "no on_replay hook");
  // A tensor that existed before the step, given a new value and returned: its version and its
  // other holders would not follow a replay.
  Tensor acc = from_vector<float>({0.0f, 0.0f}, {2});
  run([&](const std::vector<Tensor>& in) {
        acc.add_(in[0]);
        return std::vector<Tensor>{acc};
      },
      "existed before it");
  // One tensor passed as two inputs: a replay on two tensors could not tell the uses apart.
  {
    StepCapture step([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * w + in[1]}; });
    for (int k = 0; k < 4; ++k) {
      Tensor x = from_vector<float>({float(k), 1.0f}, {2});
      std::vector<float> got = step({x, x})[0].to_vector<float>();
      EXPECT_EQ(got, (std::vector<float>{float(k) * 1.0f + float(k), 1.0f * 2.0f + 1.0f}));
      EXPECT_FALSE(step.last_replayed());
      EXPECT_NE(step.last_reason().find("are one value"), std::string::npos) << step.last_reason();
    }
  }
  // Outside a recording, on_replay is an error.
  EXPECT_THROW(StepCapture::on_replay([] {}), Error);
}

TEST(StepCapture, AStateTensorPassedAsAnInputTraces) {
  Tensor w = from_vector<float>({1.0f, 2.0f}, {2}), w_ref = from_vector<float>({1.0f, 2.0f}, {2});
  StepCapture step([&](const std::vector<Tensor>& in) {
    Tensor out = in[0] * w;
    w.add_(in[0]);
    return std::vector<Tensor>{out};
  });
  auto ref = [&](const Tensor& x) {
    Tensor out = x * w_ref;
    w_ref.add_(x);
    return out.to_vector<float>();
  };
  for (int k = 0; k < 4; ++k) {
    std::vector<float> got = step({from_vector<float>({float(k), 1.0f}, {2})})[0].to_vector<float>();
    EXPECT_EQ(got, ref(from_vector<float>({float(k), 1.0f}, {2}))) << k;
  }
  EXPECT_TRUE(step.last_replayed()) << step.last_reason();
  // The state tensor itself as the input: tracing reads one value for both uses.
  std::vector<float> got = step({w})[0].to_vector<float>();
  EXPECT_FALSE(step.last_replayed());
  EXPECT_NE(step.last_reason().find("is the value of a tensor the step reads or updates"), std::string::npos) << step.last_reason();
  EXPECT_EQ(got, ref(w_ref));
  EXPECT_EQ(w.to_vector<float>(), w_ref.to_vector<float>());
}
