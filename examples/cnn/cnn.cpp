// A convolutional network trained on Fashion-MNIST, in one page: data, the model, Adam, the
// training loop and the test accuracy per epoch.
//   cnn_example [steps]        (default: one epoch, 938 steps of 64 images)
#include <cstdio>
#include <cstdlib>

#include <tessera/tessera.h>

namespace ts = tessera;

// Fraction of the test images classified correctly (eval mode, no gradients).
double test_accuracy(ts::nn::Module& model, const ts::data::FashionMNIST& test, const ts::Device& dev) {
  ts::NoGradGuard no_grad;
  model.eval();
  int64_t correct = 0;
  for (int64_t start = 0; start < test.size(); start += 500) {
    std::vector<int64_t> idx;
    for (int64_t i = start; i < start + 500 && i < test.size(); ++i) idx.push_back(i);
    auto [x, y] = test.batch_at(idx, dev);
    correct += int64_t((ts::argmax(model(x), 1) == y).to(ts::DType::Int64).sum().item());
  }
  model.train();
  return double(correct) / double(test.size());
}

int main(int argc, char** argv) {
  try {
    const ts::Device dev = ts::Device::best();
    ts::manual_seed(1);

    // Data: Debian's dataset-fashion-mnist, normalized, shuffled in batches of 64.
    ts::data::FashionMNIST train(ts::data::FashionMNIST::Part::Train), test(ts::data::FashionMNIST::Part::Test);
    ts::data::ImageLoader loader(train, /*batch=*/64, /*seed=*/1);
    const int64_t steps = argc > 1 ? std::atoll(argv[1]) : loader.batches_per_epoch();

    // Model: two 3x3 conv layers with ReLU and 2x2 max-pooling, then two linear layers.
    ts::nn::SmallCNN model;
    model.to(dev);
    ts::optim::Adam opt(model.parameters(), {.lr = 1e-3});
    std::printf("SmallCNN with %lld parameters on %s\n", (long long)model.num_parameters(), dev.str().c_str());

    for (int64_t step = 1; step <= steps; ++step) {
      auto [x, y] = loader.next(dev);
      ts::Tensor loss = ts::cross_entropy(model(x), y);
      loss.backward();
      opt.step();
      opt.zero_grad();
      double l = loss.item();  // forward, backward and the update run here, as one compiled graph
      if (step % 100 == 0 || step == steps) std::printf("step %5lld  loss %.4f\n", (long long)step, l);
      if (step % loader.batches_per_epoch() == 0 || step == steps)
        std::printf("test accuracy: %.2f%%\n", 100 * test_accuracy(model, test, dev));
    }
    std::printf("%s", ts::metrics().report().c_str());
  } catch (const ts::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
