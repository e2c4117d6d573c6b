#include "cnn_session.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

namespace tessera::cli {
namespace {

using json = nlohmann::json;
using clk = std::chrono::steady_clock;
namespace fs = std::filesystem;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

std::shared_ptr<nn::Module> make_cnn(const std::string& model) {
  if (model == "small") return std::make_shared<nn::SmallCNN>();
  if (model == "resnet") return std::make_shared<nn::ResNet>();
  fail("train", "unknown --model '" + model + "' (small or resnet)", "");
}

double accuracy(nn::Module& model, const data::FashionMNIST& ds, int64_t batch, const Device& d, int64_t limit) {
  NoGradGuard ng;
  bool was_training = model.is_training();
  model.eval();
  int64_t correct = 0, n = limit > 0 ? std::min(limit, ds.size()) : ds.size();
  for (int64_t s = 0; s < n; s += batch) {
    std::vector<int64_t> idx;
    for (int64_t i = s; i < std::min(n, s + batch); ++i) idx.push_back(i);
    auto [x, y] = ds.batch_at(idx, d);
    correct += int64_t((argmax(model(x), 1) == y).to(DType::Int64).sum().item());
  }
  model.train(was_training);
  return double(correct) / double(n);
}

CnnResult train_cnn(const CnnOptions& o) {
  if (o.epochs < 1 || o.batch < 1 || o.steps < 0 || o.eval_batch < 1 || o.test_images < 0 || !(o.lr > 0))
    fail("train", "epochs, batch and lr must be positive and steps and test images non-negative", "");
  if (o.resume && o.out.empty()) fail("train", "--resume needs --out DIR (the checkpoint directory)", "");
  check_micro_batches(o.micro_batches, o.memory_budget);
  Device dev = pick_device(o.device);
  data::FashionMNIST train(data::FashionMNIST::Part::Train, o.data), test(data::FashionMNIST::Part::Test, o.data);
  manual_seed(o.seed);
  std::shared_ptr<nn::Module> model = make_cnn(o.model);
  model->to(dev);
  optim::Adam opt(model->parameters(), {.lr = o.lr});
  if (o.batch > train.size())
    fail("train", "--batch " + std::to_string(o.batch) + " is larger than the " + std::to_string(train.size()) + " training images", "");
  data::ImageLoader loader(train, o.batch, o.seed, true, o.flip);
  int64_t per_epoch = loader.batches_per_epoch(), total = o.epochs * per_epoch;
  if (o.steps > 0) total = std::min(total, o.steps);
  json config = {{"model", o.model}, {"batch", o.batch}};

  std::string ckpt = o.out.empty() ? "" : (fs::path(o.out) / "ckpt.safetensors").string();
  int64_t start = 0;
  if (o.resume && fs::exists(ckpt)) {
    Metadata m{ckpt, load_training(ckpt, dev, config, *model, opt), "CNN"};
    loader.load_state(m.ints("loader"));
    start = m.integer("step");
    if (!o.quiet) std::printf("resumed from %s at step %lld\n", ckpt.c_str(), (long long)start);
  }
  CnnResult r;
  auto save = [&](int64_t step) {
    if (ckpt.empty()) return;
    fs::create_directories(o.out);
    save_training(ckpt, *model, opt, step, loader.state(), {{"format", "tessera-cnn-1"}, {"config", config.dump()}});
    r.checkpoint = ckpt;
  };
  std::FILE* log = open_log(o.log_json, start > 0);
  if (!o.quiet)
    std::printf("training %s (%lld parameters) on %s: %lld steps of %lld images, %lld per epoch\n", o.model.c_str(),
                (long long)model->num_parameters(), dev.str().c_str(), (long long)total, (long long)o.batch, (long long)per_epoch);
  std::vector<double> ms;
  double loss_sum = 0;
  int64_t loss_n = 0;
  auto t_begin = clk::now();
  for (int64_t step = start; step < total; ++step) {
    auto t0 = clk::now();
    auto [x, y] = loader.next(dev);
    // One graph: forward, backward, the update and the running statistics (unless micro-batched).
    double l = train_step(model->parameters(), {x, y}, [&](const std::vector<Tensor>& b) { return cross_entropy((*model)(b[0]), b[1]); },
                          [&] {
                            opt.step();
                            opt.zero_grad();
                          }, o.memory_budget, o.micro_batches);
    if (!std::isfinite(l)) fail("train", "the loss became " + std::to_string(l) + " at step " + std::to_string(step) + "; try a smaller --lr", "");
    ms.push_back(std::chrono::duration<double, std::milli>(clk::now() - t0).count());
    loss_sum += l, ++loss_n;
    if (log) std::fprintf(log, "%s\n", json{{"step", step + 1}, {"loss", l}, {"step_ms", ms.back()}}.dump().c_str());
    bool epoch_end = (step + 1) % per_epoch == 0 || step + 1 == total;
    if (!o.quiet && !epoch_end && (step + 1) % 100 == 0) {
      std::printf("step %lld/%lld  loss %.4f  %.1f ms/step\n", (long long)(step + 1), (long long)total, loss_sum / double(loss_n),
                  median(std::vector<double>(ms.end() - std::min<size_t>(ms.size(), 100), ms.end())));
      std::fflush(stdout);
    }
    if (!epoch_end) continue;
    double acc = accuracy(*model, test, o.eval_batch, dev, o.test_images);
    int64_t tested = o.test_images > 0 ? std::min(o.test_images, test.size()) : test.size();
    r.test_accuracy.push_back({step + 1, acc});
    double elapsed = std::chrono::duration<double>(clk::now() - t_begin).count();
    if (!o.quiet) {
      std::printf("epoch %.2f (step %lld): train loss %.4f, test accuracy %.2f%% (%lld images), %s elapsed\n",
                  double(step + 1) / double(per_epoch), (long long)(step + 1), loss_sum / double(loss_n), 100 * acc,
                  (long long)tested, fmt_time(elapsed).c_str());
      std::fflush(stdout);
    }
    if (log) {
      json j = {{"step", step + 1}, {"epoch", double(step + 1) / double(per_epoch)}, {"test_accuracy", acc},
                {"train_loss", loss_sum / double(loss_n)}, {"median_step_ms", median(ms)}, {"peak_bytes", metrics().peak_bytes}};
      std::fprintf(log, "%s\n", j.dump().c_str());
      std::fflush(log);
    }
    loss_sum = 0, loss_n = 0;
    save(step + 1);
  }
  if (log) std::fclose(log);
  r.steps = total;
  r.seconds = std::chrono::duration<double>(clk::now() - t_begin).count();
  r.median_step_ms = median(ms);
  return r;
}

}  // namespace tessera::cli
