// A GPT: token + position embeddings, pre-norm blocks of causal self-attention and an MLP, a
// final norm and a (optionally tied) head. forward_cached() runs it over a fixed-size KV cache
// with the position as a runtime value, so generation reuses one decode graph.
#include <cmath>

#include "core/fail.h"
#include "tessera/memory.h"
#include "tessera/nn.h"

namespace tessera::nn {
namespace {

Tensor positions(int64_t n, const Device& d) { return arange(0, double(n), 1, TensorOptions{DType::Int64, d}); }

// [B, T, C] -> [B, H, T, D]
Tensor heads_first(const Tensor& x, int64_t H) {
  int64_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2];
  return x.reshape({B, T, H, C / H}).transpose(1, 2);
}

}  // namespace

MLP::MLP(int64_t embd, double dropout, bool bias) : Module("MLP") {
  fc = register_module("fc", std::make_shared<Linear>(embd, 4 * embd, bias));
  proj = register_module("proj", std::make_shared<Linear>(4 * embd, embd, bias));
  drop = register_module("drop", std::make_shared<Dropout>(dropout));
}

Tensor MLP::forward(const Tensor& x) { return (*drop)((*proj)(gelu((*fc)(x)))); }

CausalSelfAttention::CausalSelfAttention(int64_t embd_, int64_t heads_, double dropout, bool bias)
    : Module("CausalSelfAttention"), heads(heads_), embd(embd_) {
  if (heads <= 0 || embd % heads != 0)
    fail("CausalSelfAttention", "embedding size " + std::to_string(embd) + " is not divisible by " + std::to_string(heads) + " heads");
  qkv = register_module("qkv", std::make_shared<Linear>(embd, 3 * embd, bias));
  proj = register_module("proj", std::make_shared<Linear>(embd, embd, bias));
  attn_drop = register_module("attn_drop", std::make_shared<Dropout>(dropout));
  resid_drop = register_module("resid_drop", std::make_shared<Dropout>(dropout));
}

Tensor CausalSelfAttention::forward(const Tensor& x) { return forward(x, nullptr, nullptr, Tensor()); }

Tensor CausalSelfAttention::forward(const Tensor& x, Tensor* k_cache, Tensor* v_cache, const Tensor& pos) {
  ModuleScope scope(*this);
  if (!x.defined() || x.dim() != 3 || x.shape()[2] != embd)
    fail("attention", "input must be [B, T, " + std::to_string(embd) + "], got " + (x.defined() ? shape_str(x.shape()) : "undefined"));
  int64_t B = x.shape()[0], T = x.shape()[1], D = embd / heads;
  Tensor qkv_out = (*qkv)(x);
  Tensor q = heads_first(narrow(qkv_out, 2, 0, embd), heads);
  Tensor k = heads_first(narrow(qkv_out, 2, embd, embd), heads);
  Tensor v = heads_first(narrow(qkv_out, 2, 2 * embd, embd), heads);
  Tensor qpos = positions(T, x.device()).reshape({T, 1});
  Tensor kpos;
  if (k_cache) {
    // Write the new keys/values at [pos, pos + T) and attend over the whole cache.
    Tensor zero = zeros({1}, {DType::Int64, x.device()});
    Tensor offsets = cat({zero, zero, pos.reshape({1}), zero});
    *k_cache = dynamic_update_slice(*k_cache, k, offsets);
    *v_cache = dynamic_update_slice(*v_cache, v, offsets);
    k = *k_cache;
    v = *v_cache;
    qpos = qpos + pos;
    kpos = positions(k.shape()[2], x.device()).reshape({1, -1});
  } else {
    kpos = positions(T, x.device()).reshape({1, T});
  }
  Tensor att = matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(D)));
  att = masked_fill(att, kpos > qpos, -INFINITY);  // a query sees keys at or before its position
  att = (*attn_drop)(softmax(att, -1));
  Tensor y = matmul(att, v).transpose(1, 2).reshape({B, T, embd});
  return (*resid_drop)((*proj)(y));
}

Block::Block(const GPTConfig& c) : Module("Block") {
  ln1 = register_module("ln1", std::make_shared<LayerNorm>(Shape{c.embd}));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(c.embd, c.heads, c.dropout, c.bias));
  ln2 = register_module("ln2", std::make_shared<LayerNorm>(Shape{c.embd}));
  mlp = register_module("mlp", std::make_shared<MLP>(c.embd, c.dropout, c.bias));
}

Tensor Block::forward(const Tensor& x) { return forward(x, nullptr, nullptr, Tensor()); }

Tensor Block::forward(const Tensor& x, Tensor* k_cache, Tensor* v_cache, const Tensor& pos) {
  ModuleScope scope(*this);
  Tensor h = x + attn->forward((*ln1)(x), k_cache, v_cache, pos);
  return h + (*mlp)((*ln2)(h));
}

GPT::GPT(const GPTConfig& c) : Module("GPT"), cfg_(c) {
  if (c.vocab <= 0 || c.block <= 0 || c.embd <= 0 || c.layers <= 0)
    fail("GPT", "vocab, block, embd and layers must be positive");
  // Parameters alone over the memory limit: refused before anything is built (a mistyped
  // --layers 100000 is this error, not minutes of tracing and then a [memory] one).
  const double e = double(c.embd), params = double(c.vocab + c.block) * e + double(c.layers) * (12 * e * e + 13 * e) +
                                            (c.tied_head ? 0.0 : double(c.vocab) * e) + 2 * e;
  if (const size_t limit = memory_limit(); limit && params * 4 > double(limit))
    fail("GPT", "about " + std::to_string(int64_t(params / 1e6)) + " M parameters (layers " + std::to_string(c.layers) +
                    ", embd " + std::to_string(c.embd) + ", vocab " + std::to_string(c.vocab) + ") need " +
                    std::to_string(int64_t(params * 4 / (1 << 20))) + " MiB, over the memory limit of " +
                    std::to_string(limit >> 20) + " MiB");
  wte = register_module("wte", std::make_shared<Embedding>(c.vocab, c.embd));
  wpe = register_module("wpe", std::make_shared<Embedding>(c.block, c.embd));
  drop = register_module("drop", std::make_shared<Dropout>(c.dropout));
  blocks = register_module("blocks", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < c.layers; ++i) blocks->add(std::make_shared<Block>(c));
  ln_f = register_module("ln_f", std::make_shared<LayerNorm>(Shape{c.embd}));
  if (!c.tied_head) head = register_module("head", std::make_shared<Linear>(c.embd, c.vocab, false));
  sync();  // parameters start realized, so the first training step's graph is the steady one
}

Tensor GPT::logits_of(const Tensor& x) {
  Tensor h = (*ln_f)(x);
  if (head) return (*head)(h);
  Scope s("head");
  return matmul(h, wte->weight.transpose(0, 1));
}

Tensor GPT::forward(const Tensor& idx) {
  ModuleScope scope(*this);
  if (!idx.defined() || idx.dim() != 2 || !is_integral(idx.dtype()))
    fail("gpt", "token ids must be an integer [B, T] tensor, got " + (idx.defined() ? std::string(dtype_name(idx.dtype())) + shape_str(idx.shape()) : "undefined"));
  int64_t T = idx.shape()[1];
  if (T > cfg_.block) fail("gpt", "sequence of " + std::to_string(T) + " tokens exceeds the block size " + std::to_string(cfg_.block));
  Tensor x = (*drop)((*wte)(idx) + (*wpe)(positions(T, idx.device())));
  for (size_t i = 0; i < blocks->size(); ++i) x = (*(*blocks)[i])(x);
  return logits_of(x);
}

Tensor GPT::loss(const Tensor& idx, const Tensor& targets) {
  Tensor logits = forward(idx);
  int64_t V = cfg_.vocab;
  Scope s("loss");
  return tessera::cross_entropy(logits.reshape({-1, V}), targets.reshape({-1}));
}

void GPT::shard_tensor_parallel(const dist::Mesh& mesh, const std::string& axis) {
  const int64_t n = mesh.size(axis);
  if (cfg_.heads % n != 0 || (4 * cfg_.embd) % n != 0)
    fail("GPT", std::to_string(cfg_.heads) + " heads (and " + std::to_string(4 * cfg_.embd) + " MLP features) do not divide among the " +
                    std::to_string(n) + " ranks of mesh axis '" + axis + "'");
  for (const auto& [t, spec] : tensor_parallel_specs(axis)) dist::shard(t, mesh, spec);
}

std::vector<std::pair<Tensor, dist::Spec>> GPT::tensor_parallel_specs(const std::string& axis) const {
  using dist::none;
  const dist::Split cols(axis), qkv_cols(axis, 3);
  std::vector<std::pair<Tensor, dist::Spec>> out;
  for (size_t i = 0; i < blocks->size(); ++i) {
    auto& b = static_cast<Block&>(*(*blocks)[i]);
    out.push_back({b.attn->qkv->weight, {qkv_cols, none}});  // weight [3C, C]: q, k and v each split
    if (b.attn->qkv->bias.defined()) out.push_back({b.attn->qkv->bias, {qkv_cols}});
    out.push_back({b.attn->proj->weight, {none, cols}});  // [C, C] split by input features
    out.push_back({b.mlp->fc->weight, {cols, none}});
    if (b.mlp->fc->bias.defined()) out.push_back({b.mlp->fc->bias, {cols}});
    out.push_back({b.mlp->proj->weight, {none, cols}});
  }
  return out;
}

KVCache GPT::make_cache(int64_t batch) const {
  KVCache c;
  int64_t D = cfg_.embd / cfg_.heads;
  Device d = wte->weight.device();
  // Each layer's buffers are distinct realized tensors (identical pending zeros would share a node).
  std::vector<float> z(size_t(batch * cfg_.heads * cfg_.block * D), 0.f);
  for (int64_t i = 0; i < cfg_.layers; ++i) {
    c.k.push_back(from_vector(z, {batch, cfg_.heads, cfg_.block, D}, {wte->weight.dtype(), d}));
    c.v.push_back(from_vector(z, {batch, cfg_.heads, cfg_.block, D}, {wte->weight.dtype(), d}));
  }
  return c;
}

Tensor GPT::forward_cached(const Tensor& idx, KVCache& cache, const Tensor& pos) {
  ModuleScope scope(*this);
  int64_t T = idx.shape()[1];
  if (T > cfg_.block) fail("gpt", "sequence of " + std::to_string(T) + " tokens exceeds the block size " + std::to_string(cfg_.block));
  // Positions [pos, pos + T), clamped into the table (padding past the block is never read).
  Tensor p = minimum(positions(T, idx.device()) + pos, full({}, double(cfg_.block - 1), {DType::Int64, idx.device()}));
  Tensor x = (*drop)((*wte)(idx) + (*wpe)(p));
  for (size_t i = 0; i < blocks->size(); ++i) {
    auto& b = static_cast<Block&>(*(*blocks)[i]);
    x = b.forward(x, &cache.k[i], &cache.v[i], pos);
  }
  return logits_of(x);
}

}  // namespace tessera::nn
