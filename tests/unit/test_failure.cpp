// Failure isolation (issue 27): a graph that fails while running raises one tessera::Error; the
// tensors that depended on the failure are errored (using or reading one raises it again), the
// rest stay valid, in-place updates whose buffers the failed run had not written are taken back
// (no half-applied optimizer step), and the next step runs as if the failed one never happened.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "compiler/lower.h"
#include "runtime/compile_options.h"
#include "runtime/realize.h"
#include "tensor/tensor_impl.h"
#include "tessera/tessera.h"
#include "test_util.h"

namespace tessera {
namespace {

using testing::error_message;

constexpr int64_t kVocab = 16, kBlock = 8, kBatch = 2;

// A one-layer GPT trained with AdamW (whose state is in-place tensors and a host step count).
struct Training {
  nn::GPT model;
  optim::AdamW opt;
  Training() : model(seeded()), opt(model.parameters(), {.lr = 1e-2}) {}
  static nn::GPTConfig seeded() {
    manual_seed(3);
    return {.vocab = kVocab, .block = kBlock, .embd = 16, .heads = 2, .layers = 1, .dropout = 0.0, .bias = true, .tied_head = false};
  }
  // Traces one training step on batch `b` (token `bad` at its first position when >= 0).
  Tensor trace(int b, int64_t bad = -1) {
    std::vector<int64_t> x(size_t(kBatch * kBlock)), y(x.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = int64_t(7 * b + 3 * i) % kVocab, y[i] = int64_t(5 * b + i) % kVocab;
    if (bad >= 0) x[0] = bad;
    TensorOptions ids{DType::Int64};
    Tensor loss = model.loss(from_vector(x, {kBatch, kBlock}, ids), from_vector(y, {kBatch, kBlock}, ids));
    loss.backward();
    opt.step();
    opt.zero_grad();
    return loss;
  }
  std::vector<std::vector<float>> values() {
    std::vector<std::vector<float>> v;
    for (const Tensor& p : model.parameters()) v.push_back(p.to_vector<float>());
    for (auto& [name, t] : opt.state_dict())
      if (t.numel() > 1) v.push_back(t.to_vector<float>());
    return v;
  }
};

TEST(FailureIsolation, ABadBatchMidTrainingIsAnErrorAndTheNextTenStepsMatchARunWithoutIt) {
  Training with_bad, without;
  std::vector<double> a, b;
  for (int step = 0; step < 16; ++step) {
    if (step == 5) {
      Tensor loss = with_bad.trace(step, kVocab + 40);  // an embedding index out of range
      std::string e = error_message([&] { loss.item(); });
      EXPECT_NE(e.find("out of range"), std::string::npos) << e;
      EXPECT_TRUE(loss.failed());
      EXPECT_EQ(error_message([&] { loss.item(); }), e);  // reading it again raises the same error
      EXPECT_NE(error_message([&] { (loss * 2.0).item(); }), "");  // and so does using it
      for (const Tensor& p : with_bad.model.parameters()) EXPECT_FALSE(p.failed());
      continue;
    }
    a.push_back(with_bad.trace(step).item());
    b.push_back(without.trace(step).item());
  }
  EXPECT_EQ(a, b);  // bit for bit: the failed step left nothing behind (AdamW's step count included)
  EXPECT_EQ(with_bad.values(), without.values());
  EXPECT_EQ(with_bad.opt.steps(), 15);
}

// A pending tensor that does not depend on the failure is computed; one that does is errored.
TEST(FailureIsolation, TensorsThatDoNotDependOnTheFailureStayValid) {
  Tensor table = from_vector<float>({1, 2, 3, 4}, {4});
  Tensor bad = table.gather(0, from_vector<int64_t>({0, 9}, {2}, {DType::Int64})) * 2.0;
  Tensor good = table.exp().sum();
  std::string e = error_message([] { sync(); });
  EXPECT_NE(e.find("out of range"), std::string::npos) << e;
  EXPECT_TRUE(bad.failed());
  EXPECT_FALSE(good.failed());
  EXPECT_NEAR(good.item(), std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(4.0), 1e-4);
  EXPECT_EQ(error_message([&] { bad.to_vector<float>(); }), e);
  // The next graph runs normally.
  EXPECT_EQ((table * 3.0).to_vector<float>(), (std::vector<float>{3, 6, 9, 12}));
}

// A failure injected after every Step of a training step in turn (a device error anywhere): each
// time one error. Before the first Step that writes a parameter or moment in place -- the fused
// updates, which run after every other Step -- the step is undone entirely and the next one gives
// the values of a run without the failure; from there on, the tensors whose buffers were written
// are errored with a message saying to restore the checkpoint. Never a silently half-updated value.
TEST(FailureIsolation, AFailureAfterAnyStepOfATrainingStepIsConfined) {
  // The updates as separate Steps (the cpu's "group" pass makes them one Step of parts, leaving
  // no Step boundary between two in-place writes for a failure to fall on).
  testing::PassesOff no_group("group");
  Training reference;
  reference.trace(0).item();
  const std::vector<float> ref_loss = reference.trace(1).to_vector<float>();
  const auto ref_after = reference.values();

  Training probe;
  probe.trace(0).item();
  const auto before = probe.values();
  probe.trace(1);
  const auto plan = runtime::compile_only(detail::pending_requests());
  const int steps = int(plan->steps.size());
  int first_in_place = steps;  // the first Step writing a donated buffer (a parameter or moment, in place)
  for (size_t k = 0; k < plan->output_slot.size(); ++k)
    for (int s = 0; s < steps && plan->donated[k] >= 0; ++s)
      for (int o : plan->steps[size_t(s)].outputs())
        if (o == plan->output_slot[k]) first_in_place = std::min(first_in_place, s);
  // The pass "inplace_last" put the in-place writes last: every Step from the first one on writes a
  // donated buffer or reads what such a Step wrote.
  std::set<int> tail_slots;
  for (size_t k = 0; k < plan->output_slot.size(); ++k)
    if (plan->donated[k] >= 0) tail_slots.insert(plan->output_slot[k]);
  for (int s = first_in_place; s < steps; ++s) {
    const kir::Step& st = plan->steps[size_t(s)];
    bool in_tail = false;
    for (int o : st.outputs()) in_tail = in_tail || tail_slots.count(o);
    for (int x : st.inputs) in_tail = in_tail || tail_slots.count(x);
    EXPECT_TRUE(in_tail) << "Step " << s << " runs after an in-place write without needing to";
    if (in_tail)
      for (int o : st.outputs()) tail_slots.insert(o);
  }
  sync();
  ASSERT_GT(steps, 20);
  ASSERT_LT(first_in_place, steps);

  int clean = 0, lost = 0, first_lost = steps;
  for (int fail_at = 0; fail_at < steps; ++fail_at) {
    SCOPED_TRACE("failure after Step " + std::to_string(fail_at));
    Training t;
    t.trace(0).item();
    Tensor loss = t.trace(1);
    bool armed = true;
    runtime::set_after_step_hook([&](int s, void* const*) {
      if (armed && s == fail_at) armed = false, throw Error("[test] injected device error");
    });
    std::string e = error_message([] { sync(); });
    runtime::set_after_step_hook(nullptr);
    EXPECT_EQ(e, "[test] injected device error");
    bool whole = true;
    std::vector<Tensor> held = t.model.parameters();
    try {
      for (auto& [name, st] : t.opt.state_dict())
        if (st.numel() > 1) held.push_back(st);
    } catch (const Error& lost_state) {  // reading an errored moment
      EXPECT_NE(std::string(lost_state.what()).find("restore it from the last checkpoint"), std::string::npos);
      whole = false;
    }
    for (size_t k = 0; k < held.size(); ++k) {
      if (held[k].failed()) {
        whole = false;
        EXPECT_NE(error_message([&] { held[k].item(); }).find("restore it from the last checkpoint"), std::string::npos);
      } else if (k < before.size() && whole) {
        EXPECT_EQ(held[k].to_vector<float>(), before[k]) << "tensor " << k << " half-updated";
      }
    }
    if (!whole) {
      if (!lost++) first_lost = fail_at;
      continue;
    }
    EXPECT_EQ(lost, 0) << "undone entirely after an earlier failure point had lost values";
    ++clean;
    EXPECT_EQ(t.trace(1).to_vector<float>(), ref_loss);
    EXPECT_EQ(t.values(), ref_after);
  }
  std::printf("failures confined with every value kept: %d of %d Steps (the first in-place write: Step %d); after an in-place write: %d\n", clean, steps,
              first_in_place, lost);
  // Every failure before the first in-place write is undone entirely; from some Step after it on
  // (a parameter's or moment's own update), every one is reported.
  EXPECT_GE(first_lost, first_in_place);
  EXPECT_EQ(clean, first_lost);
  EXPECT_GT(clean, 0);
  EXPECT_GT(lost, 0);

  // Strictly all or nothing: with donation off ("donate" disabled), nothing is written in place,
  // so a failure even inside the updates' tail undoes the whole step (at the cost of the updated
  // tensors' bytes beside the old ones).
  testing::PassesOff no_donation("donate");
  for (int fail_at = first_in_place; fail_at < steps; fail_at += testing::kSanitized ? 6 : 1) {
    SCOPED_TRACE("donation off, failure after Step " + std::to_string(fail_at));
    Training t;
    t.trace(0).item();
    t.trace(1);
    bool armed = true;
    runtime::set_after_step_hook([&](int s, void* const*) {
      if (armed && s == fail_at) armed = false, throw Error("[test] injected device error");
    });
    EXPECT_EQ(error_message([] { sync(); }), "[test] injected device error");
    runtime::set_after_step_hook(nullptr);
    EXPECT_EQ(t.values(), before) << "a value changed or was lost";
    EXPECT_EQ(t.trace(1).to_vector<float>(), ref_loss);
    EXPECT_EQ(t.values(), ref_after);
  }
}

}  // namespace
}  // namespace tessera
