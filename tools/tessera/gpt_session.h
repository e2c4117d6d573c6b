// Training and sampling of the character GPT, shared by `train gpt`, `sample` and `demo`.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <tessera/tessera.h>

#include "session.h"

namespace tessera::cli {

struct TrainOptions {
  std::string device = "best";
  int64_t steps = 1000, batch = 16, block = 64, layers = 4, heads = 4, embd = 128;
  // Autocast's dtype for the products (bfloat16, float16 with loss scaling), or float32.
  std::string dtype = "float32";
  double lr = 3e-3, min_lr = 3e-4, dropout = 0.0, weight_decay = 0.1, clip = 1.0;
  int64_t warmup = 100;
  std::string data;      // a text file; empty: Debian's fortunes
  std::string out;       // checkpoint directory; empty: none
  bool resume = false;   // continue from <out>/ckpt.safetensors
  uint64_t seed = 1337;
  std::string log_json;  // one JSON object per step
  int64_t eval_every = 100, eval_batches = 8;
  int64_t ckpt_every = 0;  // also checkpoint every N steps (0: only at the end)
  bool quiet = false;
  MemoryBudget memory_budget;  // for each training step's graphs (none: no limit)
  int64_t micro_batches = 1;   // gradient accumulation slices; 0: the fewest that fit memory_budget
  // Data parallelism (optim::DataParallel): --data-parallel N, N in-process ranks; --distributed,
  // this process is one rank of the job mpirun started (rank 0 writes the checkpoints and
  // --log-json FILE, rank k > 0 FILE.rank<k>). --batch is the global batch, split over the ranks.
  int64_t data_parallel = 1;
  // --tensor-parallel M: Megatron-style tensor parallelism on M in-process ranks (GPT::
  // shard_tensor_parallel, each step run by dist::sync_partitioned); not with data parallelism.
  int64_t tensor_parallel = 1;
  bool distributed = false;
  bool zero1 = false;  // --zero1: AdamW's moments sharded over the ranks (optim::ZeroAdamW; MPI rank k > 0 checkpoints its shards to ckpt.safetensors.rank<k>)
  // Called after each training step's loss.item() (before any evaluation or checkpoint); `step`
  // counts from 1. The profiler starts and stops around steps with it.
  std::function<void(int64_t step)> on_step;
};

struct TrainResult {
  std::shared_ptr<nn::GPT> model;
  data::CharTokenizer tokenizer;
  std::vector<std::pair<int64_t, double>> train_loss, val_loss;  // (step, loss)
  int64_t first_step = 0, last_step = 0;
  double seconds = 0, tokens_per_s = 0, bigram_entropy = 0;
  std::string checkpoint;  // path written, if any
  // What one rank holds (rank 0's share) beside the whole model's: parameters (a tensor-parallel
  // split weight: 1 / M of it) and AdamW's two float32 moments (they follow the parameters'
  // layout; ZeRO-1: this rank's shards, about 1 / N). `tessera profile gpt` prints it with the
  // step graph's per-rank plan (activations and temporaries).
  struct RankMemory {
    int64_t data = 1, model = 1;  // the ranks: data parallel x tensor parallel
    int64_t param_bytes = 0, full_param_bytes = 0, optimizer_bytes = 0, full_optimizer_bytes = 0;
  } rank_memory;
};

TrainResult train_gpt(const TrainOptions& o);

// Conditional entropy H(next byte | byte) of a text, in nats: what a bigram model achieves.
double bigram_entropy(const std::string& text);

struct Loaded {
  std::shared_ptr<nn::GPT> model;
  data::CharTokenizer tokenizer;
  int64_t step = 0;
};
Loaded load_checkpoint(const std::string& path, const Device& device);

}  // namespace tessera::cli
