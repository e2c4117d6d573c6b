// A character-level GPT trained on Debian's fortunes, in one page: data, model, optimizer with
// a warmup-cosine schedule, a training loop, held-out loss, a sample, and what it all cost.
//   gpt_example [steps]        (default 300; about a minute on two cores)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <tessera/tessera.h>

namespace ts = tessera;

// Mean next-character loss over evenly spaced held-out windows, without gradients or dropout.
double held_out_loss(ts::nn::GPT& model, const ts::data::TextDataset& ds, const ts::Device& dev) {
  ts::NoGradGuard no_grad;
  model.eval();
  const int64_t batches = 8, batch = 16, n = ds.size(ts::data::Split::Val);
  double sum = 0;
  for (int64_t b = 0; b < batches; ++b) {
    std::vector<int64_t> starts;
    for (int64_t i = 0; i < batch; ++i) starts.push_back((b * batch + i) * n / (batches * batch));
    auto [x, y] = ds.batch_at(ts::data::Split::Val, starts, dev);
    sum += model.loss(x, y).item();
  }
  model.train();
  return sum / batches;
}

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 300;
  const int64_t batch = 16, block = 64, print_every = std::max<int64_t>(1, steps / 10);
  if (steps < 1) {
    std::fprintf(stderr, "usage: %s [steps]\n", argv[0]);
    return 2;
  }
  try {
    const ts::Device dev = ts::Device::best();
    ts::manual_seed(1337);

    // Data: the fortunes text, split into train and held-out windows of block + 1 characters.
    ts::data::TextDataset ds(ts::data::read_default_corpus(), block, /*val_fraction=*/0.1);
    ts::data::DataLoader loader(ds, batch, /*seed=*/1337);

    // Model: 4 pre-norm transformer blocks of width 128 over a byte vocabulary.
    ts::nn::GPT model({.vocab = ds.vocab_size(), .block = block, .embd = 128, .heads = 4, .layers = 4});
    model.to(dev);
    std::printf("GPT with %lld parameters, vocabulary %lld, on %s\n", (long long)model.num_parameters(),
                (long long)ds.vocab_size(), dev.str().c_str());

    // Optimizer: AdamW; the learning rate warms up linearly, then decays along a cosine.
    ts::optim::AdamW opt(model.parameters(), {.lr = 3e-3, .weight_decay = 0.1});
    ts::optim::WarmupCosine schedule{.lr = 3e-3, .min_lr = 3e-4, .warmup = steps / 8, .total = steps};

    for (int64_t step = 0; step < steps; ++step) {
      opt.set_lr(schedule(step));
      auto [x, y] = loader.next(dev);
      ts::Tensor loss = model.loss(x, y);  // traced lazily: nothing has run yet
      loss.backward();
      ts::optim::clip_grad_norm(model.parameters(), 1.0);
      opt.step();
      opt.zero_grad();
      double l = loss.item();  // runs forward, backward and update as one compiled graph
      if ((step + 1) % print_every == 0 || step == 0)
        std::printf("step %5lld  loss %.4f  lr %.2e\n", (long long)step + 1, l, opt.lr());
    }
    std::printf("held-out loss: %.4f nats per character\n", held_out_loss(model, ds, dev));

    // Sample through the key/value cache.
    const std::string prompt = "Q: ";
    std::vector<int64_t> ids = ts::nn::generate(model, ds.tokenizer().encode(prompt),
                                                {.tokens = 200, .temperature = 0.8, .top_k = 40, .seed = 1});
    std::printf("\nsample:\n%s%s\n\n", prompt.c_str(), ds.tokenizer().decode(ids).c_str());
    std::printf("%s\n", ts::metrics().report().c_str());
  } catch (const ts::Error& e) {
    std::fprintf(stderr, "gpt_example: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
