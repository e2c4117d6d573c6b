// Training of the Fashion-MNIST classifiers (SmallCNN, ResNet), used by `train cnn`.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <tessera/tessera.h>

#include "session.h"

namespace tessera::cli {

struct CnnOptions {
  std::string model = "small";  // small | resnet
  std::string device = "best";
  int64_t epochs = 1, batch = 64;
  int64_t steps = 0;            // stop after this many steps (0: run every epoch)
  double lr = 1e-3;             // Adam
  bool flip = false;            // random horizontal flips
  std::string data;             // Fashion-MNIST directory (empty: Debian's)
  std::string out;              // checkpoint directory; empty: none
  bool resume = false;
  uint64_t seed = 1;
  std::string log_json;         // one JSON object per step and per evaluation
  int64_t eval_batch = 500;
  int64_t test_images = 0;      // evaluate on the first N test images (0: all 10,000)
  bool quiet = false;
  MemoryBudget memory_budget;  // for each training step's graphs (none: no limit)
  int64_t micro_batches = 1;   // gradient accumulation slices; 0: the fewest that fit memory_budget
};

struct CnnResult {
  std::vector<std::pair<int64_t, double>> test_accuracy;  // (step, fraction correct)
  int64_t steps = 0;
  double seconds = 0, median_step_ms = 0;
  std::string checkpoint;
};

std::shared_ptr<nn::Module> make_cnn(const std::string& model);  // "small" or "resnet"
// Fraction of the first `limit` images of a dataset (0: all) classified correctly (eval mode, no
// gradients; batches of `batch`).
double accuracy(nn::Module& model, const data::FashionMNIST& ds, int64_t batch, const Device& d, int64_t limit = 0);
CnnResult train_cnn(const CnnOptions& o);

}  // namespace tessera::cli
