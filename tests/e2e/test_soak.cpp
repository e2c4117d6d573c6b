// Stability soak: 1,000 training steps of a tiny GPT (with dropout, periodic held-out
// evaluation and checkpoints, like the CLI's loop) keep the live IR node count and the process
// RSS flat after warm-up. Public API only.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <tessera/tessera.h>

#include "ir/node.h"  // live_node_count: nodes still alive (a leak check below the public API)

namespace {

namespace ts = tessera;
namespace fs = std::filesystem;

int64_t rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

TEST(Soak, ThousandStepsKeepLiveNodesAndRssFlat) {
  const int64_t steps = 1000, warm = 200, block = 16, batch = 4;
  fs::path ckpt = fs::temp_directory_path() / ("tessera-soak-" + std::to_string(getpid()) + ".safetensors");

  ts::manual_seed(1);
  ts::data::TextDataset ds(ts::data::read_default_corpus(), block, 0.1);
  ts::nn::GPT model({.vocab = ds.vocab_size(), .block = block, .embd = 32, .heads = 2, .layers = 1, .dropout = 0.1});
  const ts::Device dev("cpu");
  model.to(dev);
  ts::optim::AdamW opt(model.parameters(), {.lr = 3e-3, .weight_decay = 0.1});
  ts::optim::WarmupCosine schedule{3e-3, 3e-4, 50, steps};
  ts::data::DataLoader loader(ds, batch, 1);

  int64_t nodes_warm = 0, rss_warm = 0, nodes_end = 0, rss_end = 0, graphs_warm = 0;
  double first_loss = 0, last_loss = 0;
  for (int64_t step = 0; step < steps; ++step) {
    opt.set_lr(schedule(step));
    auto [x, y] = loader.next(dev);
    ts::Tensor loss = model.loss(x, y);
    loss.backward();
    ts::optim::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    double l = loss.item();
    ASSERT_TRUE(std::isfinite(l)) << "step " << step + 1;
    if (step == 0) first_loss = l;
    last_loss = l;
    if ((step + 1) % 100 == 0) {  // held-out loss and a checkpoint, as a training run does
      {
        ts::NoGradGuard ng;
        model.eval();
        auto [vx, vy] = ds.batch_at(ts::data::Split::Val, {0, 100, 200, 300}, dev);
        EXPECT_TRUE(std::isfinite(model.loss(vx, vy).item()));
        model.train();
      }
      ts::io::TensorMap t;
      for (auto& [k, v] : model.state_dict()) t["model." + k] = v;
      for (auto& [k, v] : opt.state_dict()) t["optim." + k] = v;
      ts::io::save_safetensors(ckpt.string(), t, {{"step", std::to_string(step + 1)}});
    }
    if (step + 1 == warm || step + 1 == steps) {
      (step + 1 == warm ? nodes_warm : nodes_end) = ts::ir::live_node_count();
      (step + 1 == warm ? rss_warm : rss_end) = rss_bytes();
      if (step + 1 == warm) graphs_warm = ts::metrics().graphs_compiled;
    }
  }
  fs::remove(ckpt);
  std::printf("step %lld: %lld live nodes, RSS %.2f MB; step %lld: %lld live nodes, RSS %.2f MB; loss %.3f -> %.3f\n",
              (long long)warm, (long long)nodes_warm, rss_warm / 1e6, (long long)steps, (long long)nodes_end, rss_end / 1e6,
              first_loss, last_loss);
  std::printf("%s\n", ts::metrics().report().c_str());
  EXPECT_LE(std::abs(double(nodes_end - nodes_warm)), 0.02 * double(nodes_warm))
      << "live IR nodes drift: " << nodes_warm << " at step " << warm << ", " << nodes_end << " at step " << steps;
  EXPECT_LE(std::abs(double(rss_end - rss_warm)), 0.02 * double(rss_warm))
      << "RSS drifts: " << rss_warm << " bytes at step " << warm << ", " << rss_end << " at step " << steps;
  EXPECT_EQ(ts::metrics().graphs_compiled, graphs_warm) << "graphs kept compiling after warm-up";
  EXPECT_LT(last_loss, first_loss) << "the soak run should still learn";
}

}  // namespace
