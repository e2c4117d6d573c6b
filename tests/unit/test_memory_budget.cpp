// The memory budget (issue 24): parsing "200MB" / "0.5"; a budget the plan meets runs and the
// allocator's measured high-water mark stays under it; a budget it cannot meet fails before
// anything runs (no Step launched, the tensors still pending) naming the smallest figure reached
// and the buffers at its peak with their module paths; the budget is part of the cache key.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tessera/memory.h"
#include "tessera/metrics.h"
#include "tessera/nn.h"
#include "tessera/optim.h"
#include "tessera/tessera.h"
#include "test_util.h"

namespace tessera {
namespace {

using testing::error_message;

TEST(MemoryBudget, ParsesBytesAndFractions) {
  EXPECT_EQ(MemoryBudget::parse("200MB").bytes, size_t(200'000'000));
  EXPECT_EQ(MemoryBudget::parse("1.5GiB").bytes, size_t(1.5 * 1073741824.0));
  EXPECT_EQ(MemoryBudget::parse("4096").bytes, size_t(4096));
  EXPECT_EQ(MemoryBudget::parse("64KiB").bytes, size_t(65536));
  EXPECT_DOUBLE_EQ(MemoryBudget::parse("0.5").fraction, 0.5);
  EXPECT_EQ(MemoryBudget::parse("0.5").bytes, size_t(0));
  EXPECT_TRUE(MemoryBudget::parse("none").none());
  EXPECT_TRUE(MemoryBudget::parse("").none());
  for (const char* bad : {"lots", "200XB", "-1", "0", "MB"})
    EXPECT_NE(error_message([&] { MemoryBudget::parse(bad); }).find("[memory] cannot read the memory budget"), std::string::npos)
        << bad;
}

// A small MLP's training step traced as one graph (forward, backward, AdamW update).
struct MlpStep {
  std::shared_ptr<nn::Sequential> model;
  optim::AdamW opt;
  Tensor x, y;
  explicit MlpStep(int64_t batch)
      : model(make_model()), opt(model->parameters(), {.lr = 1e-2}),
        x(testing::random_tensor({batch, 64}, DType::Float32, 3)), y(testing::random_tensor({batch, 8}, DType::Float32, 4)) {
    sync();
  }
  static std::shared_ptr<nn::Sequential> make_model() {
    manual_seed(7);
    auto m = std::make_shared<nn::Sequential>();
    m->add(std::make_shared<nn::Linear>(64, 256)).add(std::make_shared<nn::GELU>()).add(std::make_shared<nn::Linear>(256, 8));
    return m;
  }
  Tensor trace() {
    Tensor loss = mse_loss((*model)(x), y);
    loss.backward();
    opt.step();
    opt.zero_grad();
    return loss;
  }
};

TEST(MemoryBudget, AMetBudgetRunsUnderItAndAnUnreachableOneFailsBeforeRunning) {
  MlpStep s(512);
  Tensor loss = s.trace();
  MemoryPlan natural = pending_memory_plan();
  ASSERT_GT(natural.step_bytes, size_t(0));
  EXPECT_EQ(natural.step_bytes, natural.param_bytes + natural.output_bytes + natural.arena_bytes);
  EXPECT_EQ(natural.budget_bytes, size_t(0));
  {
    // Too small: the error comes at compile time, before any Step runs.
    MemoryBudgetScope budget({natural.step_bytes / 2, 0});
    int64_t launched = metrics().steps_launched;
    std::string e = error_message([] { sync(); });
    EXPECT_NE(e.find("[memory] the budget of"), std::string::npos) << e;
    EXPECT_NE(e.find("cannot be met: the smallest step this compiler reaches needs"), std::string::npos) << e;
    EXPECT_NE(e.find("largest buffers live there:"), std::string::npos) << e;
    EXPECT_NE(e.find(" in "), std::string::npos) << e;  // module paths
    EXPECT_EQ(metrics().steps_launched, launched);
    EXPECT_FALSE(loss.is_realized());
    // The same through plan_memory(), which compiles without running.
    EXPECT_NE(error_message([&] { plan_memory({loss}); }).find("cannot be met"), std::string::npos);
  }
  // Exactly the natural figure, as bytes and as the fraction 1: met, and the step runs under it.
  for (MemoryBudget b : {MemoryBudget{natural.step_bytes, 0}, MemoryBudget{0, 1.0}}) {
    MemoryBudgetScope budget(b);
    MemoryPlan p = pending_memory_plan();
    EXPECT_EQ(p.budget_bytes, natural.step_bytes) << b.str();
    EXPECT_EQ(p.natural_step_bytes, natural.step_bytes);
    EXPECT_LE(p.step_bytes, p.budget_bytes);
    EXPECT_NE(p.report().find("budget "), std::string::npos);
  }
  MemoryBudgetScope budget({natural.step_bytes, 0});
  int64_t live_before = metrics().live_bytes;
  reset_peak_bytes();
  loss.item();
  // Everything live before the step that the graph does not read counts beside the budget.
  int64_t outside = live_before - int64_t(natural.param_bytes);
  EXPECT_LE(metrics().peak_bytes - outside, int64_t(natural.step_bytes) + 256 * 32);  // the allocator rounds to 256 B
  EXPECT_TRUE(memory_budget().bytes == natural.step_bytes);
}

TEST(MemoryBudget, TheScopeRestoresThePreviousBudget) {
  EXPECT_TRUE(memory_budget().none());
  {
    MemoryBudgetScope a(MemoryBudget::parse("0.5"));
    EXPECT_DOUBLE_EQ(memory_budget().fraction, 0.5);
    {
      MemoryBudgetScope b(MemoryBudget::parse("1MB"));
      EXPECT_EQ(memory_budget().bytes, size_t(1'000'000));
      EXPECT_EQ(memory_budget().fraction, 0.0);
    }
    EXPECT_DOUBLE_EQ(memory_budget().fraction, 0.5);
  }
  EXPECT_TRUE(memory_budget().none());
}

}  // namespace
}  // namespace tessera
