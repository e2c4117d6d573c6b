// `tessera demo`: the README's main job. Trains the default small GPT on Debian's fortunes for
// about a minute on the best device, then shows what it learned and what it cost.
#include <cstdio>

#include "commands.h"
#include "gpt_session.h"

namespace tessera::cli {

void add_demo(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  o->steps = 400;
  o->warmup = 50;
  o->eval_every = 100;
  auto* cmd = app.add_subcommand("demo", "train a small GPT on Debian's fortunes for about a minute, then sample it");
  cmd->add_option("--device", o->device, "device to run on")->capture_default_str();
  cmd->add_option("--steps", o->steps, "training steps")->capture_default_str()->check(positive());
  cmd->add_option("--out", o->out, "also write a checkpoint to DIR");
  cmd->add_option("--log-json", o->log_json, "write one JSON object per step to FILE");
  cmd->add_option("--seed", o->seed, "random seed")->capture_default_str();
  auto show_metrics = add_metrics_flag(*cmd);
  cmd->callback([o, show_metrics] {
    Device dev = pick_device(o->device);
    std::printf("Tessera demo: a %lld-layer character GPT on Debian's fortunes, %lld steps on %s\n\n",
                (long long)o->layers, (long long)o->steps, dev.str().c_str());
    TrainResult r = train_gpt(*o);
    std::printf("\nloss curve (nats per character; the corpus' bigram entropy is %.3f):\n", r.bigram_entropy);
    std::printf("  %8s %10s %10s\n", "step", "train", "held-out");
    for (auto& [step, val] : r.val_loss) {
      double tr = 0;
      int n = 0;  // mean of the train losses over the last 20 steps
      for (auto& [s, l] : r.train_loss)
        if (s > step - 20 && s <= step) tr += l, ++n;
      std::printf("  %8lld %10.4f %10.4f\n", (long long)step, n ? tr / n : 0.0, val);
    }
    std::printf("\nthroughput: %.0f tokens/s (%.1f s for %lld steps)\n", r.tokens_per_s, r.seconds, (long long)(r.last_step - r.first_step));
    std::string prompt = "Q: ";
    std::printf("\nsample (temperature 0.8, top-k 40):\n%s", prompt.c_str());
    nn::generate(*r.model, r.tokenizer.encode(prompt), {.tokens = 200, .temperature = 0.8, .top_k = 40, .seed = 1},
                 [&](int64_t t) { std::fputs(r.tokenizer.decode({t}).c_str(), stdout); });
    Metrics m = metrics();
    std::printf("\n\nsummary: %lld parameters; %lld graphs compiled (%.0f ms), %lld cache hits; %lld host syncs;\n"
                "         peak memory %.1f MB; %lld Steps launched\n",
                (long long)r.model->num_parameters(), (long long)m.graphs_compiled, m.compile_ms, (long long)m.cache_hits,
                (long long)m.host_syncs, double(m.peak_bytes) / 1e6, (long long)m.steps_launched);
    print_metrics(*show_metrics);
  });
}

}  // namespace tessera::cli
