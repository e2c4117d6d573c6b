#include "gpt_session.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace tessera::cli {
namespace {

using json = nlohmann::json;
using clk = std::chrono::steady_clock;
namespace fs = std::filesystem;

std::string hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string r;
  for (unsigned char c : s) r += d[c >> 4], r += d[c & 15];
  return r;
}
std::string unhex(const std::string& h) {
  if (h.size() % 2) throw std::invalid_argument("odd length");
  std::string r;
  for (size_t i = 0; i < h.size(); i += 2) {
    size_t used = 0;
    int v = std::stoi(h.substr(i, 2), &used, 16);
    if (used != 2) throw std::invalid_argument(h);
    r += char(v);
  }
  return r;
}

json config_json(const nn::GPTConfig& c) {
  return {{"vocab", c.vocab}, {"block", c.block}, {"embd", c.embd}, {"heads", c.heads},
          {"layers", c.layers}, {"dropout", c.dropout}, {"bias", c.bias}, {"tied_head", c.tied_head}};
}
nn::GPTConfig config_from(const json& j) {
  nn::GPTConfig c;
  c.vocab = j.at("vocab");
  c.block = j.at("block");
  c.embd = j.at("embd");
  c.heads = j.at("heads");
  c.layers = j.at("layers");
  c.dropout = j.at("dropout");
  c.bias = j.at("bias");
  c.tied_head = j.at("tied_head");
  return c;
}

// Mean loss over fixed, evenly spaced held-out windows (eval mode, no gradients).
double held_out_loss(nn::GPT& model, const data::TextDataset& ds, int64_t batches, int64_t batch, const Device& d) {
  NoGradGuard ng;
  model.eval();
  int64_t n = ds.size(data::Split::Val), total = batches * batch;
  if (n <= 0) fail("data", "the held-out split is shorter than one window: use a longer text or a smaller --block", "");
  double sum = 0;
  for (int64_t b = 0; b < batches; ++b) {
    std::vector<int64_t> starts;
    for (int64_t i = 0; i < batch; ++i) starts.push_back((b * batch + i) * n / total);
    auto [x, y] = ds.batch_at(data::Split::Val, starts, d);
    sum += model.loss(x, y).item();
  }
  model.train();
  return sum / double(batches);
}

// --zero1 checkpoints: the moments are sharded. Rank 0's checkpoint holds its shards (in process:
// every rank's) as optim.*; MPI rank k > 0 keeps its own in `shard` (ckpt.safetensors.rank<k>;
// "" for rank 0 and in process). Loads the model, the generator and this rank's shards.
io::Metadata load_zero1(const std::string& ckpt, const std::string& shard, const Device& dev, const json& config, nn::Module& model,
                        optim::ZeroAdamW& zero) {
  io::Metadata meta = load_training(ckpt, dev, config, model, [&](const std::map<std::string, Tensor>& os) {
    if (shard.empty()) zero.load_state_dict(os);  // else rank 0's shards: not this rank's
  });
  if (shard.empty()) return meta;
  if (!fs::exists(shard)) fail("train", "--resume --zero1: " + shard + " is missing (this rank keeps its moment shards there)", "");
  io::Metadata sm;
  io::TensorMap t = io::load_safetensors(shard, &sm, dev);
  const int64_t step = Metadata{ckpt, meta, "GPT"}.integer("step");
  if (Metadata{shard, sm, "ZeRO-1 shard"}.integer("step") != step)
    fail("train", "--resume --zero1: " + shard + " is of step " + sm["step"] + ", " + ckpt + " of step " + std::to_string(step) +
                      " (a run that stopped between the two writes: resume from an earlier pair)", "");
  zero.load_state_dict(t);
  return meta;
}
void save_zero1_shard(const std::string& shard, const std::string& dir, const optim::ZeroAdamW& zero, int64_t step) {
  fs::create_directories(dir);
  io::save_safetensors(shard, zero.state_dict(), {{"format", "tessera-zero1-shard-1"}, {"step", std::to_string(step)}});
}

}  // namespace

double bigram_entropy(const std::string& text) {
  std::vector<double> pair(256 * 256, 0), first(256, 0);
  for (size_t i = 0; i + 1 < text.size(); ++i) {
    unsigned a = (unsigned char)text[i], b = (unsigned char)text[i + 1];
    pair[a * 256 + b] += 1;
    first[a] += 1;
  }
  double n = double(text.size() - 1), h = 0;
  for (unsigned a = 0; a < 256; ++a)
    for (unsigned b = 0; b < 256; ++b)
      if (double c = pair[a * 256 + b]; c > 0) h -= c / n * std::log(c / first[a]);
  return h;
}

// Data parallelism (in-process ranks, or this process as an MPI rank) or tensor parallelism
// (--tensor-parallel M: the GPT's weights split over M in-process ranks), as the options ask.
static void parallel_setup(const TrainOptions& o, std::optional<optim::DataParallel>& dp, std::optional<dist::Mesh>& tp) {
  if (o.tensor_parallel > 1) {  // a data x model mesh of in-process or MPI ranks, each step run partitioned
    if (o.zero1) fail("train", "--zero1 does not combine with --tensor-parallel yet", "");
    if (o.micro_batches != 1 || !o.memory_budget.none() || o.dtype == "float16")
      fail("train", "--tensor-parallel does not combine with --micro-batches, a memory budget or --dtype float16 yet", "");
    int64_t data = o.data_parallel;
    if (o.distributed) {  // the job's ranks: --tensor-parallel M of them per model, the rest data parallel
      if (o.data_parallel > 1) fail("train", "--data-parallel (in-process ranks) and --distributed (MPI ranks) do not combine", "");
      const int64_t size = dist::init_mpi().second;
      if (size % o.tensor_parallel != 0)
        fail("train", "the job's " + std::to_string(size) + " ranks do not divide by --tensor-parallel " + std::to_string(o.tensor_parallel), "");
      data = size / o.tensor_parallel;
    }
    if (o.batch % data != 0)
      fail("train", "--batch " + std::to_string(o.batch) + " (the global batch) does not divide into " + std::to_string(data) + " ranks", "");
    tp.emplace(std::vector<std::pair<std::string, int64_t>>{{"data", data}, {"model", o.tensor_parallel}});
    return;
  }
  // Data parallelism: in-process ranks or this process as an MPI rank.
  if (o.distributed && o.data_parallel > 1) fail("train", "--data-parallel (in-process ranks) and --distributed (MPI ranks) do not combine", "");
  if (o.distributed || o.data_parallel > 1) {
    if (o.micro_batches != 1 || !o.memory_budget.none())
      fail("train", "data parallelism does not combine with --micro-batches or a memory budget yet", "");
    if (o.dtype == "float16") fail("train", "data parallelism does not combine with --dtype float16 (loss scaling) yet", "");
    if (o.distributed) dist::init_mpi();
    dp = o.distributed ? optim::DataParallel::process_group() : optim::DataParallel::in_process(int(o.data_parallel));
    if (o.batch % dp->ranks() != 0)
      fail("train", "--batch " + std::to_string(o.batch) + " (the global batch) does not divide into " + std::to_string(dp->ranks()) + " ranks", "");
  }
}

// One training step traced on full shapes, then run partitioned over the mesh (--tensor-parallel):
// the batch's rows split over "data" where that axis has several ranks.
static double partitioned_step(const dist::Mesh& mesh, const std::vector<Tensor>& batch,
                               const std::function<Tensor(const std::vector<Tensor>&)>& loss_fn, const std::function<void()>& update) {
  if (mesh.size("data") > 1)
    for (const Tensor& t : batch) dist::shard(t, mesh, {"data", dist::none});
  Tensor loss = loss_fn(batch);
  loss.backward();
  update();
  dist::sync_partitioned(mesh);
  return loss.item();
}

// What one rank holds (TrainResult::RankMemory): a weight tensor parallelism splits counts 1/M.
static TrainResult::RankMemory rank_memory(const nn::GPT& model, const std::optional<optim::DataParallel>& dp,
                                           const std::optional<dist::Mesh>& tp, const std::optional<optim::ZeroAdamW>& zero) {
  TrainResult::RankMemory m;
  m.data = dp ? dp->ranks() : tp ? tp->size("data") : 1;
  m.model = tp ? tp->size("model") : 1;
  std::vector<Tensor> split;
  if (tp)
    for (const auto& [t, spec] : model.tensor_parallel_specs("model"))
      if (std::any_of(spec.begin(), spec.end(), [](const dist::Split& d) { return !d.axis.empty(); })) split.push_back(t);
  for (const Tensor& p : model.parameters()) {
    const int64_t b = p.numel() * int64_t(itemsize(p.dtype()));
    const bool is_split = std::any_of(split.begin(), split.end(), [&](const Tensor& t) { return t.is_same(p); });
    m.full_param_bytes += b;
    m.param_bytes += is_split ? b / m.model : b;
  }
  m.full_optimizer_bytes = 2 * m.full_param_bytes;  // AdamW: m and v, float32 like the parameters
  m.optimizer_bytes = zero ? zero->state_numel() * 4 : 2 * m.param_bytes;
  return m;
}

// One --log-json line: the step's figures, the metrics so far, whether a captured step replayed
// (and why not).
static void log_step(std::FILE* log, int64_t step, double loss, double lr, double ms, double tokens_per_s,
                     const std::optional<double>& val, const StepCapture* capture) {
  Metrics m = metrics();
  json j = {{"step", step}, {"loss", loss}, {"lr", lr}, {"step_ms", ms}, {"tokens_per_s", tokens_per_s},
            {"graphs_compiled", m.graphs_compiled}, {"host_syncs", m.host_syncs}, {"peak_bytes", m.peak_bytes},
            {"replayed", capture && capture->last_replayed()}};
  if (capture && !capture->last_replayed()) j["traced_because"] = capture->last_reason();
  if (val) j["val_loss"] = *val;
  std::fprintf(log, "%s\n", j.dump().c_str());
  std::fflush(log);
}

TrainResult train_gpt(const TrainOptions& o) {
  if (o.steps < 1 || o.batch < 1 || o.block < 2 || o.eval_every < 1 || o.eval_batches < 1)
    fail("train", "steps, batch, eval-every and eval-batches must be positive and block at least 2", "");
  if (o.embd % o.heads != 0) fail("train", "--embd " + std::to_string(o.embd) + " is not divisible by --heads " + std::to_string(o.heads), "");
  if (o.resume && o.out.empty()) fail("train", "--resume needs --out DIR (the checkpoint directory)", "");
  if (o.ckpt_every > 0 && o.out.empty()) fail("train", "--ckpt-every needs --out DIR (where the checkpoints go)", "");
  check_micro_batches(o.micro_batches, o.memory_budget);
  std::optional<optim::DataParallel> dp;
  std::optional<dist::Mesh> tp;
  parallel_setup(o, dp, tp);
  if (o.zero1 && !dp) fail("train", "--zero1 needs --data-parallel N or --distributed", "");
  const int rank = dp ? dp->rank() : o.distributed ? dist::rank() : 0;
  const bool quiet = o.quiet || rank != 0;
  Device dev = pick_device(o.device);
  std::string text = o.data.empty() ? data::read_default_corpus() : data::read_text_file(o.data);
  data::TextDataset ds(text, o.block, 0.1);
  if (ds.size(data::Split::Train) < o.batch)
    fail("data", "the text is too short for --block " + std::to_string(o.block) + " and --batch " + std::to_string(o.batch), "");

  TrainResult r;
  r.tokenizer = ds.tokenizer();
  r.bigram_entropy = bigram_entropy(text);
  manual_seed(o.seed);
  nn::GPTConfig cfg{.vocab = ds.vocab_size(), .block = o.block, .embd = o.embd, .heads = o.heads,
                    .layers = o.layers, .dropout = o.dropout};
  r.model = std::make_shared<nn::GPT>(cfg);
  nn::GPT& model = *r.model;
  model.to(dev);
  if (tp) model.shard_tensor_parallel(*tp, "model");
  optim::AdamW opt(model.parameters(), {.lr = o.lr, .weight_decay = o.weight_decay});
  std::optional<optim::ZeroAdamW> zero;  // --zero1: in place of opt and clip_grad_norm
  if (o.zero1) zero.emplace(*dp, model.parameters(), optim::AdamOptions{.lr = o.lr, .weight_decay = o.weight_decay}, o.clip);
  optim::WarmupCosine schedule{o.lr, o.min_lr, o.warmup, o.steps};
  data::DataLoader loader(ds, o.batch, o.seed);

  std::string ckpt = o.out.empty() ? "" : (fs::path(o.out) / "ckpt.safetensors").string();
  // --zero1: MPI rank k > 0's moment shards go to ckpt.safetensors.rank<k> (load_zero1).
  const std::string shard = zero && !ckpt.empty() && !dp->is_in_process() && rank > 0 ? ckpt + ".rank" + std::to_string(rank) : "";
  int64_t start = 0;
  if (o.resume && fs::exists(ckpt)) {
    Metadata m{ckpt, zero ? load_zero1(ckpt, shard, dev, config_json(cfg), model, *zero) : load_training(ckpt, dev, config_json(cfg), model, opt),
               "GPT"};
    loader.load_state(m.ints("loader"));
    start = m.integer("step");
    if (!quiet) std::printf("resumed from %s at step %lld\n", ckpt.c_str(), (long long)start);
  } else if (o.resume && !quiet) {
    std::printf("no checkpoint at %s: starting fresh\n", ckpt.c_str());
  }

  auto save = [&](int64_t step) {
    if (!shard.empty()) return save_zero1_shard(shard, o.out, *zero, step);  // ZeRO-1, MPI rank k > 0: its moment shards
    if (ckpt.empty() || rank != 0) return;  // rank 0's model: every rank holds the same
    fs::create_directories(o.out);
    io::Metadata meta{{"format", "tessera-gpt-1"}, {"config", config_json(cfg).dump()}, {"vocab_hex", hex(ds.tokenizer().vocab())}};
    if (zero) save_training(ckpt, model, zero->state_dict(), step, loader.state(), meta);
    else save_training(ckpt, model, opt, step, loader.state(), meta);
    r.checkpoint = ckpt;
  };

  std::FILE* log = open_log(o.log_json.empty() || rank == 0 ? o.log_json : o.log_json + ".rank" + std::to_string(rank), start > 0);
  bool tty = isatty(STDOUT_FILENO);
  int64_t every = std::max<int64_t>(1, (o.steps - start) / 20);
  auto t_begin = clk::now();
  double tokens = 0, last_print = -1;
  r.first_step = start;
  reset_peak_bytes();
  std::optional<optim::GradScaler> scaler;
  if (o.dtype == "float16") scaler.emplace();
  auto loss_fn = [&](const std::vector<Tensor>& b) {
    std::optional<Autocast> ac;
    if (o.dtype != "float32") ac.emplace(o.dtype == "float16" ? DType::Float16 : DType::BFloat16);
    Tensor loss = model.loss(b[0], b[1]);
    return scaler ? scaler->scale(loss) : loss;  // float16: scaled so that small gradients survive
  };
  auto update = [&] {
    if (scaler) scaler->unscale(opt);  // before clipping: the norm of the true gradients
    if (o.clip > 0) optim::clip_grad_norm(model.parameters(), o.clip);
    if (scaler) {
      scaler->step(opt);  // skipped when a gradient is inf or NaN
      scaler->update();
    } else {
      opt.step();
    }
    opt.zero_grad();  // gradients are consumed inside the step's graph, never stored
  };
  // One device's or MPI rank's step replayed once two traces agree (tessera/capture.h). Not for
  // float16 (its GradScaler reads a value back), micro-batches, budgets, in-process ranks.
  std::optional<StepCapture> capture;
  if (!zero && !tp && !scaler && o.micro_batches == 1 && o.memory_budget.none() && (!dp || !dp->is_in_process()))
    capture.emplace([&](const std::vector<Tensor>& b) {
      if (dp) return std::vector<Tensor>{dp->trace_step(model.parameters(), b, loss_fn, update)};
      Tensor loss = loss_fn(b);
      loss.backward();
      update();
      return std::vector<Tensor>{loss};
    });
  for (int64_t step = start; step < o.steps; ++step) {
    auto t0 = clk::now();
    double lr = schedule(step);
    opt.set_lr(lr);
    if (zero) zero->set_lr(lr);
    auto [x, y] = loader.next(dev);
    const double scale = scaler ? scaler->get_scale() : 1.0;
    double l = (capture ? (*capture)(dp ? dp->local_rows({x, y}) : std::vector<Tensor>{x, y})[0].item()
                : zero ? zero->step({x, y}, loss_fn)
                : dp ? dp->step(model.parameters(), {x, y}, loss_fn, update)
                : tp ? partitioned_step(*tp, {x, y}, loss_fn, update)
                     : train_step(model.parameters(), {x, y}, loss_fn, update, o.memory_budget, o.micro_batches)) /
               scale;
    if (!std::isfinite(l)) fail("train", "the loss became " + std::to_string(l) + " at step " + std::to_string(step) + "; try a smaller --lr", "");
    double ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
    if (o.on_step) o.on_step(step + 1);
    tokens += double(o.batch * o.block);
    double elapsed = std::chrono::duration<double>(clk::now() - t_begin).count();
    r.train_loss.push_back({step + 1, l});
    std::optional<double> val;
    if ((step + 1) % o.eval_every == 0 || step + 1 == o.steps) {
      val = held_out_loss(model, ds, o.eval_batches, o.batch, dev);
      r.val_loss.push_back({step + 1, *val});
    }
    if (o.ckpt_every > 0 && (step + 1) % o.ckpt_every == 0) save(step + 1);
    if (log) log_step(log, step + 1, l, lr, ms, tokens / elapsed, val, capture ? &*capture : nullptr);
    if (!quiet) {
      double done = double(step + 1 - start) / double(o.steps - start);
      double eta = elapsed / done * (1 - done);
      if (tty && (elapsed - last_print > 0.1 || step + 1 == o.steps || val)) {
        int w = 24, fill = int(done * w);
        std::printf("\r[%s%s] step %lld/%lld  loss %.3f%s  %.0f tok/s  ETA %s ", std::string(fill, '#').c_str(),
                    std::string(w - fill, '.').c_str(), (long long)(step + 1), (long long)o.steps, l,
                    val ? (" val " + std::to_string(*val).substr(0, 5)).c_str() : "", tokens / elapsed, fmt_time(eta).c_str());
        if (val) std::printf("\n");
        std::fflush(stdout);
        last_print = elapsed;
      } else if (!tty && ((step + 1 - start) % every == 0 || val || step + 1 == o.steps)) {
        std::printf("step %lld/%lld  loss %.4f%s  lr %.2e  %.0f tok/s  ETA %s\n", (long long)(step + 1), (long long)o.steps, l,
                    val ? ("  val_loss " + std::to_string(*val)).c_str() : "", lr, tokens / elapsed, fmt_time(eta).c_str());
        std::fflush(stdout);
      }
    }
  }
  if (log) std::fclose(log);
  if (tty && !quiet) std::printf("\n");
  r.rank_memory = rank_memory(model, dp, tp, zero);
  r.last_step = o.steps;
  r.seconds = std::chrono::duration<double>(clk::now() - t_begin).count();
  r.tokens_per_s = r.seconds > 0 ? tokens / r.seconds : 0;
  save(o.steps);
  return r;
}

Loaded load_checkpoint(const std::string& path, const Device& device) {
  io::Metadata meta;
  io::TensorMap t = io::load_safetensors(path, &meta, device);
  Metadata m{path, meta, "GPT"};
  Loaded l;
  nn::GPTConfig cfg = m.parse("config", [](const std::string& v) { return config_from(json::parse(v)); });
  l.step = m.integer("step");
  l.tokenizer = data::CharTokenizer::from_vocab(m.parse("vocab_hex", unhex));
  if (l.tokenizer.vocab_size() != cfg.vocab) fail("load", path + ": vocabulary and model disagree", "");
  l.model = std::make_shared<nn::GPT>(cfg);
  l.model->to(device);
  l.model->load_state_dict(model_tensors(t));
  return l;
}

}  // namespace tessera::cli
