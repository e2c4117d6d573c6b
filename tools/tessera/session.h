// Helpers shared by the training sessions (gpt_session.cpp, cnn_session.cpp): device choice,
// checkpoints holding everything needed to resume bit-identically, and small formatting.
#pragma once
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <tessera/tessera.h>

namespace tessera::cli {

// The CLI's own one-line errors, in the library's "[op] detail" form.
[[noreturn]] inline void fail(const std::string& op, const std::string& detail, const std::string& = "") {
  throw Error("[" + op + "] " + detail);
}

Device pick_device(const std::string& name);  // "best" or a device name

std::string fmt_time(double seconds);  // m:ss
std::string join(const std::vector<int64_t>& v);
std::vector<int64_t> split_ints(const std::string& s);

// A checkpoint's metadata: every missing or malformed value is a clear "[load]" error naming
// the key; `kind` names the model in the messages ("GPT", "CNN").
struct Metadata {
  const std::string& path;
  const io::Metadata& meta;
  const char* kind;

  const std::string& at(const char* key) const;
  // f(value), with any exception other than tessera::Error reported as corrupt metadata.
  template <class F>
  auto parse(const char* key, F&& f) const {
    try {
      return f(at(key));
    } catch (const Error&) {
      throw;
    } catch (const std::exception&) {
      fail("load", path + ": corrupt checkpoint metadata '" + key + "'", "");
    }
  }
  int64_t integer(const char* key) const;
  std::vector<int64_t> ints(const char* key) const;
  nlohmann::json json_of(const char* key) const;
};

// A training checkpoint: "model.*" and "optim.*" tensors, plus metadata with the step, the
// generator state and the loader state, and the caller's own entries (format, config, ...).
void save_training(const std::string& path, const nn::Module& model, const optim::Optimizer& opt, int64_t step,
                   const std::vector<int64_t>& loader, io::Metadata meta);
// Loads one into model and opt after checking that its "config" metadata equals `config`,
// restores the generator and returns the metadata (the caller restores its loader from
// "loader" and its position from "step").
io::Metadata load_training(const std::string& path, const Device& dev, const nlohmann::json& config, nn::Module& model,
                           optim::Optimizer& opt);
// The same with the optimizer's state given as tensors (optim::ZeroAdamW, not an Optimizer): saved
// as "optim.*"; on loading, load_optim gets them (without the prefix) after the model is loaded.
void save_training(const std::string& path, const nn::Module& model, const std::map<std::string, Tensor>& optim_state, int64_t step,
                   const std::vector<int64_t>& loader, io::Metadata meta);
io::Metadata load_training(const std::string& path, const Device& dev, const nlohmann::json& config, nn::Module& model,
                           const std::function<void(const std::map<std::string, Tensor>&)>& load_optim);
// The "model.*" tensors of a checkpoint, without the prefix.
std::map<std::string, Tensor> model_tensors(const io::TensorMap& t);

// One training step under `budget`: loss_fn(batch), its backward and update() (clipping, the
// optimizer's step and zero_grad) traced as one graph, run by reading the loss; with micro_batches
// other than 1 (0: auto), the forward and backward over slices of the batch
// (optim::accumulate_gradients) and then update() as one more graph, held to the bytes the slices
// met. Returns the step's loss.
double train_step(const std::vector<Tensor>& params, const std::vector<Tensor>& batch,
                  const std::function<Tensor(const std::vector<Tensor>&)>& loss_fn, const std::function<void()>& update,
                  const MemoryBudget& budget, int64_t micro_batches);

// --micro-batches auto (0) fits the memory budget: refused without one.
void check_micro_batches(int64_t micro_batches, const MemoryBudget& budget);

// --log-json: one JSON object per line, appended when resuming; null when no file was asked for.
std::FILE* open_log(const std::string& path, bool append);

}  // namespace tessera::cli
