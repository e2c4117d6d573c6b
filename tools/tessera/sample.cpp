// `tessera sample`: generates text from a checkpoint through the KV cache.
#include <cstdio>

#include "commands.h"
#include "gpt_session.h"

namespace tessera::cli {

void add_sample(CLI::App& app) {
  struct Opts {
    std::string ckpt, prompt = "\n", device = "best";
    nn::SampleOptions s{.tokens = 256, .temperature = 0.8, .top_k = 40, .seed = 0};
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("sample", "generate text from a GPT checkpoint");
  cmd->add_option("--ckpt", o->ckpt, "checkpoint file (ckpt.safetensors)")->required();
  cmd->add_option("--prompt", o->prompt, "text to continue")->capture_default_str();
  cmd->add_option("--tokens", o->s.tokens, "characters to generate")->capture_default_str()->check(positive());
  cmd->add_option("--temperature", o->s.temperature, "sampling temperature")->capture_default_str()->check(positive());
  cmd->add_option("--top-k", o->s.top_k, "sample among the k likeliest (0: all)")->capture_default_str()->check(non_negative());
  cmd->add_option("--seed", o->s.seed, "random seed")->capture_default_str();
  cmd->add_option("--device", o->device, "device to run on")->capture_default_str();
  auto show_metrics = add_metrics_flag(*cmd);
  cmd->callback([o, show_metrics] {
    Loaded l = load_checkpoint(o->ckpt, pick_device(o->device));
    if (o->prompt.empty()) fail("sample", "--prompt must not be empty", "");
    std::vector<int64_t> prompt = l.tokenizer.encode(o->prompt);
    std::fputs(o->prompt.c_str(), stdout);
    nn::generate(*l.model, prompt, o->s, [&](int64_t t) {
      std::fputs(l.tokenizer.decode({t}).c_str(), stdout);
      std::fflush(stdout);
    });
    std::printf("\n");
    print_metrics(*show_metrics);
  });
}

}  // namespace tessera::cli
