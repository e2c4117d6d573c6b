// `tessera train cnn`: trains a Fashion-MNIST classifier, printing test accuracy per epoch.
#include <cstdio>

#include "cnn_session.h"
#include "commands.h"

namespace tessera::cli {

void add_train_cnn(CLI::App& train) {
  auto* cmd = train.add_subcommand("cnn", "train a convolutional network on Fashion-MNIST (Debian's dataset-fashion-mnist)");
  auto o = std::make_shared<CnnOptions>();
  cmd->add_option("--model", o->model, "small (two conv layers) or resnet (basic blocks with skip connections)")
      ->capture_default_str()
      ->check(CLI::IsMember({"small", "resnet"}));
  cmd->add_option("--device", o->device, "device to run on (\"best\", cpu, ...)")->capture_default_str();
  cmd->add_option("--epochs", o->epochs, "passes over the 60,000 training images")->capture_default_str()->check(positive());
  cmd->add_option("--steps", o->steps, "stop after this many steps (0: all epochs)")->capture_default_str()->check(non_negative());
  cmd->add_option("--batch", o->batch, "images per step")->capture_default_str()->check(positive());
  cmd->add_option("--lr", o->lr, "Adam learning rate")->capture_default_str()->check(positive());
  cmd->add_flag("--flip", o->flip, "augment with random horizontal flips");
  cmd->add_option("--test-images", o->test_images, "evaluate on the first N test images (0: all 10,000)")
      ->capture_default_str()
      ->check(non_negative());
  cmd->add_option("--data", o->data, "directory of the Fashion-MNIST .gz files (default: Debian's)");
  cmd->add_option("--out", o->out, "directory for the checkpoint (ckpt.safetensors, written after every epoch)");
  cmd->add_flag("--resume", o->resume, "continue from the checkpoint in --out");
  cmd->add_option("--seed", o->seed, "random seed")->capture_default_str();
  cmd->add_option("--log-json", o->log_json, "write one JSON object per step and per evaluation to FILE");
  auto show_metrics = add_metrics_flag(*cmd);
  add_memory_flags(*cmd, o->memory_budget, o->micro_batches);
  cmd->callback([o, show_metrics] {
    CnnResult r = train_cnn(*o);
    if (!r.test_accuracy.empty())
      std::printf("test accuracy %.2f%% after %lld steps; median step %.1f ms; %.1f s in all\n",
                  100 * r.test_accuracy.back().second, (long long)r.test_accuracy.back().first, r.median_step_ms, r.seconds);
    if (!r.checkpoint.empty()) std::printf("checkpoint: %s\n", r.checkpoint.c_str());
    print_metrics(*show_metrics);
  });
}

}  // namespace tessera::cli
