// `tessera train gpt`: trains the character GPT with progress, checkpoints and a JSON log.
#include <cstdio>

#include "commands.h"
#include "gpt_session.h"

namespace tessera::cli {

TrainResult train_gpt_profiled(const TrainOptions& o, const std::string& dir);  // profile.cpp

void add_train_flags(CLI::App& cmd, TrainOptions& o) {
  cmd.add_option("--device", o.device, "device to run on (\"best\", cpu, ...)")->capture_default_str();
  cmd.add_option("--steps", o.steps, "training steps")->capture_default_str()->check(positive());
  cmd.add_option("--batch", o.batch, "sequences per step")->capture_default_str()->check(positive());
  cmd.add_option("--block", o.block, "context length in characters")->capture_default_str()->check(CLI::Range(2, 4096));
  cmd.add_option("--layers", o.layers, "transformer blocks")->capture_default_str()->check(positive());
  cmd.add_option("--heads", o.heads, "attention heads")->capture_default_str()->check(positive());
  cmd.add_option("--embd", o.embd, "embedding width")->capture_default_str()->check(positive());
  cmd.add_option("--lr", o.lr, "peak learning rate (warmup, then cosine decay)")->capture_default_str()->check(positive());
  cmd.add_option("--min-lr", o.min_lr, "final learning rate")->capture_default_str()->check(non_negative());
  cmd.add_option("--warmup", o.warmup, "warmup steps")->capture_default_str()->check(non_negative());
  cmd.add_option("--dropout", o.dropout, "dropout probability")->capture_default_str()->check(CLI::Range(0.0, 0.95));
  cmd.add_option("--weight-decay", o.weight_decay, "AdamW weight decay")->capture_default_str()->check(non_negative());
  cmd.add_option("--clip", o.clip, "clip the gradient norm (0: off)")->capture_default_str()->check(non_negative());
  cmd.add_option("--data", o.data, "text file to train on (default: Debian's fortunes)");
  cmd.add_option("--seed", o.seed, "random seed")->capture_default_str();
  cmd.add_option("--eval-every", o.eval_every, "held-out evaluation interval in steps")->capture_default_str()->check(positive());
  cmd.add_option("--log-json", o.log_json, "write one JSON object per step to FILE");
  cmd.add_option("--dtype", o.dtype, "products in bfloat16 or float16 under autocast (float32 weights, optimizer and the rest; "
                                     "float16 with dynamic loss scaling), or float32")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  add_memory_flags(cmd, o.memory_budget, o.micro_batches);
}

// --data-parallel, --tensor-parallel, --zero1: train gpt's and profile gpt's.
void add_parallel_flags(CLI::App& cmd, TrainOptions& o) {
  cmd.add_option("--data-parallel", o.data_parallel, "data parallel on N in-process ranks (threads); --batch is the global batch")
      ->capture_default_str()
      ->check(positive());
  cmd.add_option("--tensor-parallel", o.tensor_parallel,
                 "tensor parallel (Megatron: attention and MLP weights split over M ranks: in process, with --data-parallel N "
                 "on an N x M mesh, or of mpirun's ranks with --distributed); --heads must divide by M")
      ->capture_default_str()
      ->check(positive());
  cmd.add_flag("--zero1", o.zero1, "with --data-parallel or --distributed: AdamW's moments sharded over the ranks (ZeRO-1; "
                                    "each MPI rank k > 0 checkpoints its shards to ckpt.safetensors.rank<k>; resume with the same N)");
}

void add_train(CLI::App& app) {
  auto* train = app.add_subcommand("train", "train a model");
  train->require_subcommand(1);
  auto* gpt = train->add_subcommand("gpt", "train the character GPT on a text (default: Debian's fortunes)");
  auto o = std::make_shared<TrainOptions>();
  add_train_flags(*gpt, *o);
  gpt->add_option("--out", o->out, "directory for the checkpoint (ckpt.safetensors)");
  gpt->add_flag("--resume", o->resume, "continue from the checkpoint in --out");
  gpt->add_option("--ckpt-every", o->ckpt_every, "also checkpoint every N steps")->check(non_negative());
  add_parallel_flags(*gpt, *o);
  gpt->add_flag("--distributed", o->distributed, "this process is one rank of an MPI job (mpirun -np N tessera train gpt --distributed): "
                                                  "data parallel over the ranks; rank 0 writes the checkpoints, --log-json FILE and --profile DIR, "
                                                  "rank k FILE.rank<k> and DIR.rank<k>");
  auto profile_dir = std::make_shared<std::string>();
  gpt->add_option("--profile", *profile_dir, "profile the whole run into DIR: trace.json (Chrome trace), ops.csv and "
                                             "ops.txt (op table), memory.html (the training step's memory plan)");
  auto show_metrics = add_metrics_flag(*gpt);
  add_train_cnn(*train);
  gpt->callback([o, show_metrics, profile_dir] {
    std::string prof = *profile_dir;
    if (o->distributed && dist::init_mpi().first > 0 && !prof.empty()) prof += ".rank" + std::to_string(dist::rank());  // rank k: DIR.rank<k>
    TrainResult r = prof.empty() ? train_gpt(*o) : train_gpt_profiled(*o, prof);
    if (dist::rank() != 0) return;  // --distributed: rank 0 reports
    if (!r.val_loss.empty())
      std::printf("held-out loss %.4f nats/char after %lld steps (bigram baseline %.4f); %.0f tokens/s\n",
                  r.val_loss.back().second, (long long)r.last_step, r.bigram_entropy, r.tokens_per_s);
    if (!r.checkpoint.empty()) std::printf("checkpoint: %s\n", r.checkpoint.c_str());
    print_metrics(*show_metrics);
  });
}

}  // namespace tessera::cli
