// End-to-end tests of `tessera train cnn` and examples/cnn: the small CNN of issue 9 (Adam
// 1e-3, batch 64) reaches 86% test accuracy on Fashion-MNIST after one epoch; a ResNet run
// resumes bit-identically from its checkpoint (batch-norm statistics included); missing data is
// a one-line error naming the Debian package. No assertion is about speed.
#include <gtest/gtest.h>

#include "e2e_util.h"

namespace {

using namespace e2e;

TEST(Cnn, SmallReaches86PercentTestAccuracyAfterOneEpoch) {
  TempDir dir;
  fs::path log = dir / "log.jsonl";
  Result r = cli({"train", "cnn", "--model", "small", "--epochs", "1", "--batch", "64", "--lr", "0.001", "--device", "cpu",
                  "--log-json", log.string()},
                 dir.path());
  ASSERT_TRUE(r.exited && r.code == 0) << r.describe();
  EXPECT_NE(r.out.find("test accuracy"), std::string::npos) << r.out;
  std::vector<json> lines = read_log(log);
  ASSERT_EQ(lines.size(), 938u + 1u) << "one line per step (60000 / 64 rounded up) and one evaluation";
  for (size_t i = 0; i < 938; ++i) {
    ASSERT_EQ(lines[i]["step"], int64_t(i + 1));
    ASSERT_TRUE(std::isfinite(lines[i]["loss"].get<double>()));
  }
  const json& eval = lines.back();
  double acc = eval["test_accuracy"].get<double>();
  std::printf("[cnn] test accuracy after one epoch: %.2f%%, median step %.1f ms\n", 100 * acc, eval["median_step_ms"].get<double>());
  EXPECT_GE(acc, 0.86);
  EXPECT_LT(lines[937]["loss"].get<double>(), lines[0]["loss"].get<double>());
}

TEST(Cnn, ResnetResumesBitIdentically) {
  TempDir dir;
  const std::vector<std::string> cfg = {"train", "cnn", "--model", "resnet", "--batch", "16", "--device", "cpu",
                                        "--seed", "3", "--flip", "--test-images", "200"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = cfg;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  std::string a = (dir / "A").string(), b = (dir / "B").string();
  Result r1 = cli(with({"--steps", "3", "--out", a, "--log-json", a + ".jsonl"}), dir.path());
  ASSERT_TRUE(r1.exited && r1.code == 0) << r1.describe();
  Result r2 = cli(with({"--steps", "6", "--out", a, "--resume", "--log-json", a + ".jsonl"}), dir.path());
  ASSERT_TRUE(r2.exited && r2.code == 0) << r2.describe();
  EXPECT_NE(r2.out.find("resumed from"), std::string::npos) << r2.describe();
  Result rb = cli(with({"--steps", "6", "--out", b, "--log-json", b + ".jsonl"}), dir.path());
  ASSERT_TRUE(rb.exited && rb.code == 0) << rb.describe();
  std::vector<json> la = read_log(a + ".jsonl"), lb = read_log(b + ".jsonl");
  std::vector<double> loss_a, loss_b;
  for (const json& j : la)
    if (j.contains("loss")) loss_a.push_back(j["loss"].get<double>());
  for (const json& j : lb)
    if (j.contains("loss")) loss_b.push_back(j["loss"].get<double>());
  ASSERT_EQ(loss_a.size(), 6u);
  EXPECT_EQ(loss_a, loss_b) << "the resumed run's losses differ from the uninterrupted run's";
  EXPECT_TRUE(read_file(fs::path(a) / "ckpt.safetensors") == read_file(fs::path(b) / "ckpt.safetensors"))
      << "final checkpoints differ";
  EXPECT_NE(read_file(fs::path(a) / "ckpt.safetensors").find("running_mean"), std::string::npos);
}

TEST(Cnn, MissingDataAndBadFlagsAreOneLineErrors) {
  TempDir dir;
  Result r = cli({"train", "cnn", "--data", (dir / "nowhere").string(), "--device", "cpu"}, dir.path());
  EXPECT_TRUE(r.exited && r.code != 0) << r.describe();
  EXPECT_EQ(lines_of(r.err).size(), 1u) << r.describe();
  EXPECT_EQ(r.err.rfind("tessera: error: [fashion_mnist] ", 0), 0u) << r.describe();
  EXPECT_NE(r.err.find("dataset-fashion-mnist"), std::string::npos) << r.describe();
  Result m = cli({"train", "cnn", "--model", "vgg"}, dir.path());
  EXPECT_TRUE(m.exited && m.code != 0) << m.describe();
  EXPECT_NE(m.err.find("--model"), std::string::npos) << m.describe();
}

#ifdef TESSERA_CNN_EXAMPLE
TEST(Example, CnnTrainsAndReportsTestAccuracy) {
  TempDir dir;
  Result r = run(TESSERA_CNN_EXAMPLE, {"5"}, dir.path());
  ASSERT_TRUE(r.exited && r.code == 0) << r.describe();
  for (const char* s : {"SmallCNN with 421642 parameters", "step     5  loss", "test accuracy: "})
    EXPECT_NE(r.out.find(s), std::string::npos) << "missing '" << s << "':\n" << r.out;
}
#endif

}  // namespace
