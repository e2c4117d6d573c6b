// Modules: named parameters, buffers and submodules; module paths ("blocks.2.attn.qkv") become
// scopes while a module runs, so every traced op knows where it came from.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessera/distributed.h"
#include "tessera/ops.h"
#include "tessera/scope.h"
#include "tessera/tensor.h"

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera::nn {

class Module {
 public:
  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& type_name() const { return type_name_; }
  // Runs forward() inside this module's scope.
  Tensor operator()(const Tensor& x);
  virtual Tensor forward(const Tensor& x);

  // Parameters of this module and its descendants, depth first, by dotted path; a tensor shared
  // by two modules (tied weights) is listed once, under its first path.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules() const;  // descendants
  int64_t num_parameters() const;
  // Parameters and buffers by path. load_state_dict copies values in place (shapes and dtypes
  // must match); with strict, missing or unexpected names are an error listing them.
  std::map<std::string, Tensor> state_dict() const;
  void load_state_dict(const std::map<std::string, Tensor>& sd, bool strict = true);

  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves every parameter and buffer to `d`, keeping tensor identities (optimizers stay valid).
  void to(const Device& d);
  // The name this module pushes as a scope while it runs (its path below the calling module).
  const std::string& scope_name() const { return scope_name_; }

 protected:
  Tensor register_parameter(const std::string& name, Tensor t);  // marks it requires_grad
  Tensor register_buffer(const std::string& name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  virtual void set_scope_name(const std::string& s) { scope_name_ = s; }
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;

 private:
  friend class ModuleList;  // renames its children's scopes
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out, bool params,
               std::vector<Tensor>& seen) const;
  std::string type_name_;
  std::string scope_name_;
  bool training_ = true;
  std::vector<std::pair<std::string, Tensor>> params_, buffers_;
};

// Pushes a module's scope for a custom forward signature; a no-op when that module's scope is
// already the innermost one (operator() pushed it before calling forward()).
class ModuleScope {
 public:
  explicit ModuleScope(const Module& m);
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;

 private:
  std::optional<Scope> scope_;
};

// ---- layers (initialized like PyTorch's defaults) ----
class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias = true);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;  // weight [out, in]; bias [out] or undefined
};

class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim);
  Tensor forward(const Tensor& indices) override;
  Tensor weight;  // [num, dim], N(0, 1)
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool affine = true);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  Shape normalized_shape;
  double eps;
};

class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;  // identity in eval mode or when p == 0
  double p;
};

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override { return relu(x); }
};
class GELU : public Module {
 public:
  explicit GELU(bool tanh_approximation = false) : Module("GELU"), tanh_(tanh_approximation) {}
  Tensor forward(const Tensor& x) override { return gelu(x, tanh_); }

 private:
  bool tanh_;
};
class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor forward(const Tensor& x) override { return silu(x); }
};

class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  Sequential& add(std::shared_ptr<Module> m);  // named "0", "1", ...
  Tensor forward(const Tensor& x) override;
  size_t size() const;
};

// Holds modules without running them; its children's scopes include its name ("blocks.0").
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  ModuleList& add(std::shared_ptr<Module> m);
  size_t size() const;
  std::shared_ptr<Module> operator[](size_t i) const;

 protected:
  void set_scope_name(const std::string& s) override;
};

// ---- the GPT ----
struct GPTConfig {
  int64_t vocab = 114;
  int64_t block = 64;   // context length
  int64_t embd = 128;
  int64_t heads = 4;
  int64_t layers = 4;
  double dropout = 0.0;
  bool bias = true;
  bool tied_head = false;
};

// Fixed-size key/value buffers for generation: [batch, heads, block, head_dim] per layer.
struct KVCache {
  std::vector<Tensor> k, v;
};

class MLP : public Module {
 public:
  MLP(int64_t embd, double dropout, bool bias);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Linear> fc, proj;
  std::shared_ptr<Dropout> drop;
};

// Multi-head causal self-attention. With a cache, the new keys/values of positions
// [pos, pos + T) are written into the cache (pos is an int64 scalar tensor, a runtime value)
// and queries attend to cached positions <= their own.
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t embd, int64_t heads, double dropout, bool bias);
  Tensor forward(const Tensor& x) override;
  Tensor forward(const Tensor& x, Tensor* k_cache, Tensor* v_cache, const Tensor& pos);
  std::shared_ptr<Linear> qkv, proj;
  std::shared_ptr<Dropout> attn_drop, resid_drop;
  int64_t heads, embd;
};

class Block : public Module {
 public:
  Block(const GPTConfig& c);
  Tensor forward(const Tensor& x) override;
  Tensor forward(const Tensor& x, Tensor* k_cache, Tensor* v_cache, const Tensor& pos);
  std::shared_ptr<LayerNorm> ln1, ln2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<MLP> mlp;
};

class GPT : public Module {
 public:
  explicit GPT(const GPTConfig& c);
  // Logits [B, T, vocab] for token ids [B, T] (T <= block).
  Tensor forward(const Tensor& idx) override;
  // Mean cross entropy of next-token prediction.
  Tensor loss(const Tensor& idx, const Tensor& targets);
  // Generation: a zeroed cache for `batch` sequences, and logits [B, T, vocab] of tokens placed
  // at positions [pos, pos + T) (pos: int64 scalar tensor) attending through the cache.
  KVCache make_cache(int64_t batch) const;
  Tensor forward_cached(const Tensor& idx, KVCache& cache, const Tensor& pos);
  const GPTConfig& config() const { return cfg_; }
  // Tensor parallelism, Megatron style, over `axis` of `mesh` (dist::shard on the weights; run
  // a step with dist::sync_partitioned): per block the fused qkv projection and the MLP's first
  // layer split by output features (column split; qkv as three groups, so each rank holds whole
  // heads of q, k and v), the attention's and the MLP's output projections by input features
  // (row split: one all-reduce each), their biases accordingly; embeddings, norms and the head
  // replicated. The heads must divide among the axis' ranks.
  void shard_tensor_parallel(const dist::Mesh& mesh, const std::string& axis = "model");
  // The layouts shard_tensor_parallel gives, per split parameter (the advisor prices the same).
  std::vector<std::pair<Tensor, dist::Spec>> tensor_parallel_specs(const std::string& axis = "model") const;

  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<ModuleList> blocks;
  std::shared_ptr<LayerNorm> ln_f;
  std::shared_ptr<Linear> head;

 private:
  GPTConfig cfg_;
  Tensor logits_of(const Tensor& x);
};

// ---- generation ----
struct SampleOptions {
  int64_t tokens = 256;      // new tokens to draw
  double temperature = 1.0;  // > 0
  int64_t top_k = 0;         // 0: all tokens
  uint64_t seed = 0;
};
// Draws tokens after `prompt` (non-empty) through a fixed-size KV cache: the prompt is padded to
// the block and prefilled, each new token is one decode step at a runtime position, and when
// the context fills the block its last half is kept and prefilled again. Three graphs at most.
std::vector<int64_t> generate(GPT& model, const std::vector<int64_t>& prompt, const SampleOptions& o,
                              const std::function<void(int64_t)>& on_token = {});

// ---- convolutional layers (channels first; initialized like PyTorch's defaults) ----
struct ConvOptions {
  std::vector<int64_t> stride{1}, padding{0}, dilation{1};  // one value, or one per spatial dim
  int64_t groups = 1;
  bool bias = true;
  std::vector<int64_t> output_padding{0};  // ConvTranspose2d only
};

class Conv1d : public Module {
 public:
  Conv1d(int64_t in, int64_t out, int64_t kernel, ConvOptions o = {});
  Tensor forward(const Tensor& x) override;  // [N, in, L] -> [N, out, L']
  Tensor weight, bias;                       // weight [out, in/groups, kernel]
  ConvOptions options;
};

class Conv2d : public Module {
 public:
  Conv2d(int64_t in, int64_t out, std::vector<int64_t> kernel, ConvOptions o = {});
  Tensor forward(const Tensor& x) override;  // [N, in, H, W] -> [N, out, H', W']
  Tensor weight, bias;                       // weight [out, in/groups, kH, kW]
  ConvOptions options;
};

class ConvTranspose2d : public Module {
 public:
  ConvTranspose2d(int64_t in, int64_t out, std::vector<int64_t> kernel, ConvOptions o = {});
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;  // weight [in, out/groups, kH, kW]
  ConvOptions options;
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(std::vector<int64_t> kernel, std::vector<int64_t> stride = {}, std::vector<int64_t> padding = {0})
      : Module("MaxPool2d"), kernel(std::move(kernel)), stride(std::move(stride)), padding(std::move(padding)) {}
  Tensor forward(const Tensor& x) override { return max_pool2d(x, kernel, stride, padding); }
  std::vector<int64_t> kernel, stride, padding;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(std::vector<int64_t> kernel, std::vector<int64_t> stride = {}, std::vector<int64_t> padding = {0},
                     bool count_include_pad = true)
      : Module("AvgPool2d"), kernel(std::move(kernel)), stride(std::move(stride)), padding(std::move(padding)),
        count_include_pad(count_include_pad) {}
  Tensor forward(const Tensor& x) override { return avg_pool2d(x, kernel, stride, padding, count_include_pad); }
  std::vector<int64_t> kernel, stride, padding;
  bool count_include_pad;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(std::vector<int64_t> output_size) : Module("AdaptiveAvgPool2d"), output_size(std::move(output_size)) {}
  Tensor forward(const Tensor& x) override { return adaptive_avg_pool2d(x, output_size); }
  std::vector<int64_t> output_size;
};

// Batch normalization over channel dim 1. In training mode it normalizes with the batch's
// statistics and updates running_mean/running_var/num_batches_tracked in place (no autodiff
// history, the same graph every step); in eval mode it uses the running statistics.
class BatchNorm : public Module {
 public:
  BatchNorm(const char* type, int64_t features, double eps, double momentum, bool affine, bool track_running_stats);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  double eps, momentum;

 protected:
  virtual void check_input(const Tensor& x) const = 0;
};
class BatchNorm1d : public BatchNorm {  // [N, C] or [N, C, L]
 public:
  explicit BatchNorm1d(int64_t features, double eps = 1e-5, double momentum = 0.1, bool affine = true, bool track = true)
      : BatchNorm("BatchNorm1d", features, eps, momentum, affine, track) {}

 protected:
  void check_input(const Tensor& x) const override;
};
class BatchNorm2d : public BatchNorm {  // [N, C, H, W]
 public:
  explicit BatchNorm2d(int64_t features, double eps = 1e-5, double momentum = 0.1, bool affine = true, bool track = true)
      : BatchNorm("BatchNorm2d", features, eps, momentum, affine, track) {}

 protected:
  void check_input(const Tensor& x) const override;
};

class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1) : Module("Flatten"), start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& x) override { return flatten(x, start_dim, end_dim); }
  int64_t start_dim, end_dim;
};

// ---- image classifiers ----
// conv 3x3 pad 1 (32) -> ReLU -> max-pool 2 -> conv 3x3 pad 1 (64) -> ReLU -> max-pool 2 ->
// flatten -> linear 128 -> ReLU -> linear `classes`, for [N, channels, H, W] images.
class SmallCNN : public Module {
 public:
  explicit SmallCNN(int64_t channels = 1, int64_t classes = 10, int64_t height = 28, int64_t width = 28);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<MaxPool2d> pool;
  std::shared_ptr<Linear> fc1, fc2;
};

// Two 3x3 conv + batch-norm layers with a skip connection (a 1x1 conv + batch norm when the
// stride or width changes): relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)).
class BasicBlock : public Module {
 public:
  BasicBlock(int64_t in, int64_t out, int64_t stride);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Conv2d> conv1, conv2, down;
  std::shared_ptr<BatchNorm2d> bn1, bn2, down_bn;
};

struct ResNetConfig {
  int64_t channels = 1, classes = 10;
  std::vector<int64_t> widths{16, 32, 64};  // one stage per width; stages after the first halve the resolution
  int64_t blocks = 1;                       // basic blocks per stage
};
// A small ResNet: 3x3 stem conv + batch norm + ReLU, the stages, global average pool, linear.
class ResNet : public Module {
 public:
  explicit ResNet(const ResNetConfig& c = {});
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Conv2d> stem;
  std::shared_ptr<BatchNorm2d> stem_bn;
  std::shared_ptr<Sequential> stages;
  std::shared_ptr<Linear> head;
};

// ---- losses: the functions of ops.h, also reachable here (as torch::nn::functional has them) ----
using tessera::cross_entropy;
using tessera::mse_loss;
using tessera::nll_loss;

}  // namespace tessera::nn
#pragma GCC visibility pop
