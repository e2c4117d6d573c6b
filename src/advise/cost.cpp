// The advisor's cost model and workloads.
//
// The target's plan: the step traced on the cpu is compiled for the null device posing as the
// target (backends::null_device_for with the DeviceSpec's alignment, buffer tiling and dtypes),
// so buffer sizes, Step bytes, the arena and the peak are what the compiler plans for that device
// (compiler/passes/target.cpp). bfloat16 is what the runtime trains: the step traced under
// tessera::Autocast, so the products take bfloat16 operands (float32 accumulation and results)
// and everything else, the float32 master weights, AdamW's moments and the gradients, stays
// float32; the plan holds the bfloat16 operand copies besides.
// Per Step (one replica): t = max(flops / (peak * eff), bytes / (bw * bw_eff)) + launch.
//   Gemm Steps: M, N, K from the Step's output shape and its first input's map; on a matrix
//   unit (tensor cores, a TPU MXU) the flops are those of M, N, K padded to the device's tiles;
//   bfloat16 operands run at the matrix unit's bf16/fp16 peak, float32 at the vector fp32 peak on GPUs
//   and at the MXU peak / fp32_matmul_passes on TPUs; the host's GEMM rate falls on small
//   problems (rate = peak f / (f + gemm_half_flops), calibrated).
//   Other Steps run at the vector rate (the 16-bit one for bfloat16 Steps: the operand copies).
// Data parallel over R replicas: + a ring all-reduce of the gradient bytes over the device's
// interconnect, not overlapped with the backward pass (an upper bound; DDP overlaps most of it);
// the scaling efficiency is the step without it over the step with it. ZeRO-1 (Options::zero1)
// moves the same bytes (reduce-scatter + all-gather) and keeps 1/R of the optimizer state.
// Memory per replica: the footprint of the target's plan of the training step at the
// per-replica batch: its parameters plus what the run allocates (outputs and the arena). The
// graph's parameters are the model's weights, AdamW's two moments, the token batch and the
// step's runtime scalars; its outputs (the updated weights and moments) are written into them
// (donation) and add nothing; the gradients and activations are temporaries in the arena, so
// the footprint is weights + 2 moments + the arena (within ~1% of the most activations and
// gradients live at once, plus alignment padding). Under data parallelism every replica holds all
// of it (plain DDP, no sharding).
// The memory budget's rewrites (GptWorkloads::fit, `tessera advise --memory-budget`): the step
// compiled under a budget of the device's usable memory (the remat pass on the target's plan),
// and micro-batch slices (forward and backward, the gradients their outputs) beside the moments
// and the gradients later slices read, as the runtime's accumulate_gradients estimates them.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <optional>
#include <set>
#include <string_view>

#include "backends/backend.h"
#include "compiler/lower.h"
#include "runtime/memory_plan.h"
#include "tensor/tensor_impl.h"
#include "kernel_ir/target.h"
#include "runtime/realize.h"
#include "tessera/advise.h"
#include "tessera/autocast.h"
#include "core/fail.h"
#include "tessera/metrics.h"
#include "tessera/optim.h"

namespace tessera::advise {

const char* bottleneck_name(Bottleneck b) {
  switch (b) {
    case Bottleneck::Compute: return "compute";
    case Bottleneck::Memory: return "memory";
    case Bottleneck::Launch: return "launch";
    case Bottleneck::Communication: return "communication";
  }
  return "?";
}

int64_t pad_to(int64_t x, int64_t tile) {
  if (tile <= 1) return x;
  return (x + tile - 1) / tile * tile;
}

namespace {
// The host's bandwidth for a Step moving `bytes`: the first cache_bw entry at or above them, else mem_bw.
double curve_bw(const DeviceSpec& d, double bytes) {
  for (const auto& [upto, r] : d.cache_bw)
    if (bytes <= upto) return r;
  return d.mem_bw;
}
}  // namespace

double step_seconds(const DeviceSpec& d, const StepCost& s, Bottleneck* why) {
  if (s.kind == "attention" && s.attention_pairs > 0) {  // the host's fused attention kernel, calibrated
    const double rate = s.attention_backward ? d.attention_bwd_flops : d.attention_flops;
    const double pair = s.attention_backward ? d.attention_bwd_pair_s : d.attention_pair_s;
    if (rate > 0) {
      const double bw = curve_bw(d, s.bytes);
      const double tc = s.attention_flops / rate + s.attention_pairs * pair, tm = bw > 0 ? s.bytes / (bw * d.bw_eff) : 0;
      if (why) *why = d.launch_s > tc + tm ? Bottleneck::Launch : tc >= tm ? Bottleneck::Compute : Bottleneck::Memory;
      return tc + tm + d.launch_s;
    }
  }
  const bool half = s.dtype == DType::BFloat16 || s.dtype == DType::Float16;
  const double bytes = s.bytes;
  double flops = s.flops, rate = 0;
  // A calibrated host: vector flops split into arithmetic and transcendental (each at its own
  // measured rate); a Gemm's epilogue priced so besides its product on the GEMM line.
  double tv = 0;  // the vector part's seconds (host only)
  const bool host_rates = d.transcendental_flops > 0 && d.fp32_flops > 0;
  if (host_rates) {
    const double vec = s.gemm ? std::min(s.epilogue_flops, flops) : flops;
    const double tr = std::min(s.transcendental_flops, vec);
    tv = (vec - tr) / (d.fp32_flops * d.vector_eff) + tr / (d.transcendental_flops * d.vector_eff);
    flops -= vec;
  }
  if (host_rates && !s.gemm) {
    rate = 0;
  } else if (s.gemm) {
    const bool matrix_unit = d.bf16_flops > 0 && (half || d.cls == "tpu");
    if (matrix_unit) {
      double mnk = double(s.m) * double(s.n) * double(s.k);
      if (mnk > 0)
        flops *= double(pad_to(s.m, d.tile_mn)) * double(pad_to(s.n, d.tile_mn)) * double(pad_to(s.k, d.tile_k)) / mnk;
      rate = d.bf16_flops * d.matrix_eff / (half ? 1.0 : d.fp32_matmul_passes);
    } else {
      const bool line16 = half && d.gemm_bf16_flops > 0;  // a calibrated host's bfloat16 GEMM line
      rate = (line16 ? d.gemm_bf16_flops : half && d.vec16_flops > 0 ? d.vec16_flops : d.gemm_flops > 0 ? d.gemm_flops : d.fp32_flops) *
             d.vector_eff;
      const double half_flops = line16 ? d.gemm_bf16_half_flops : d.gemm_half_flops;
      if (half_flops > 0 && flops > 0) rate *= flops / (flops + half_flops);
      tv += (line16 ? d.gemm_bf16_out_s : d.gemm_out_s) * s.elements;  // the host's per-output term
    }
  } else {
    rate = (half && d.vec16_flops > 0 ? d.vec16_flops : d.fp32_flops) * d.vector_eff;
  }
  const double tc = (rate > 0 ? flops / rate : 0) + tv;
  double bw = curve_bw(d, bytes);
  if (s.kind == "reduce" && d.reduce_bw > 0) bw = d.reduce_bw;
  const double tm = bw > 0 ? bytes / (bw * d.bw_eff) : 0;
  if (s.kind == "row" && (d.row_element_s > 0 || d.row_s > 0)) {  // the host's row loops: passes over each row
    const double tr = tc + tm + d.row_element_s * s.elements + d.row_s;
    if (why) *why = d.launch_s > tr ? Bottleneck::Launch : tc >= tm ? Bottleneck::Compute : Bottleneck::Memory;
    return tr + d.launch_s;
  }
  if (why) *why = d.launch_s > std::max(tc, tm) ? Bottleneck::Launch : tc >= tm ? Bottleneck::Compute : Bottleneck::Memory;
  return std::max(tc, tm) + d.launch_s;
}

double allreduce_seconds(const DeviceSpec& d, double bytes, int n) {
  if (n <= 1 || bytes <= 0) return 0;
  if (d.link_bw <= 0) fail("advise", "device '" + d.name + "' has no interconnect bandwidth for data parallelism", "");
  const double hops = 2.0 * (n - 1);
  return hops * d.link_latency_s + hops / n * bytes / (d.link_bw * d.link_eff);
}

Prediction predict(const DeviceSpec& d, const Workload& w, const Options& o) {
  if (o.data_parallel < 1) fail("advise", "data parallelism must be at least 1", "");
  const int replicas = o.data_parallel * d.replicas, M = o.tensor_parallel;
  if (M < 1) fail("advise", "tensor parallelism must be at least 1", "");
  if (M > 1) {
    if (w.tp_blocks == 0) fail("advise", "tensor parallelism is priced for a GPT's step only (GptWorkloads)", "");
    if (replicas % M)
      fail("advise", "--tensor-parallel " + std::to_string(M) + " does not divide the " + std::to_string(replicas) + " devices of " +
                         (o.data_parallel > 1 ? std::to_string(o.data_parallel) + " x " : "") + "'" + d.name + "'", "");
    if (w.tp_heads % M)
      fail("advise", "--tensor-parallel " + std::to_string(M) + " does not divide the model's " + std::to_string(w.tp_heads) + " heads", "");
  }
  Prediction p;
  p.device = d.name;
  p.replicas = replicas;
  p.tensor_parallel = M;
  double whole = 0;  // one device's step without tensor parallelism (the scaling's reference)
  for (const StepCost& s : w.steps) {
    Bottleneck why;
    whole += step_seconds(d, s, nullptr);
    StepCost mine = s;  // this device's share: 1/M of the split part
    const double keep = 1 - s.split_fraction + s.split_fraction / M;
    mine.flops *= keep;
    mine.bytes *= keep;
    double t = step_seconds(d, mine, &why);
    (why == Bottleneck::Compute ? p.compute_s : why == Bottleneck::Memory ? p.memory_s : p.launch_s) += t;
  }
  const int dp = replicas / M;
  if (M > 1) {
    p.tp_allreduce_bytes = w.tp_activation_bytes;
    p.tp_comm_s = 4.0 * double(w.tp_blocks) * allreduce_seconds(d, w.tp_activation_bytes, M);
  }
  p.dp_comm_s = allreduce_seconds(d, w.grad_bytes - w.tp_split_param_bytes * (M - 1) / M, dp);
  p.comm_s = p.tp_comm_s + p.dp_comm_s;
  p.trace_s = d.add_trace_time ? w.trace_s + w.prepare_s : 0;
  p.launch_s += p.trace_s;  // host-side overhead, like launching
  whole += p.trace_s;
  p.step_s = p.compute_s + p.memory_s + p.launch_s + p.comm_s;
  double best = p.compute_s;
  p.bottleneck = Bottleneck::Compute;
  if (p.memory_s > best) best = p.memory_s, p.bottleneck = Bottleneck::Memory;
  if (p.launch_s > best) best = p.launch_s, p.bottleneck = Bottleneck::Launch;
  if (p.comm_s > best) best = p.comm_s, p.bottleneck = Bottleneck::Communication;
  p.scaling = p.step_s > 0 ? whole / (M * p.step_s) : 1;
  // Weights + 2 moments of the split matrices: 1/M each (float32, as the plan holds them).
  p.peak_bytes = w.footprint_bytes() - 3 * w.tp_split_param_bytes * (M - 1) / M;
  const double state = w.state_bytes - 2 * w.tp_split_param_bytes * (M - 1) / M;
  if (o.zero1) p.peak_bytes -= state * (dp - 1) / dp;
  p.capacity_bytes = d.capacity_bytes();
  p.fits = p.peak_bytes <= p.capacity_bytes;
  p.tokens_per_s = p.step_s > 0 ? w.tokens * dp / p.step_s : 0;
  p.tokens_per_joule = d.power_w > 0 ? p.tokens_per_s / (d.power_w * replicas) : 0;
  return p;
}

// ---- workloads ---------------------------------------------------------------------------------
namespace {

kir::Target target_of(const DeviceSpec& d, DType dtype) {
  if (dtype != DType::Float32 && dtype != DType::BFloat16)
    fail("advise", std::string("dtype must be float32 or bfloat16, not ") + dtype_name(dtype), "");
  kir::Target t;
  t.alignment = d.alignment;
  t.compute_dtypes = d.dtypes;
  t.tile_rows = d.layout_tile_rows;
  t.tile_cols = d.layout_tile_cols;
  return t;
}

// Whether a scope is inside a GPT block's attention or MLP ("GPT.blocks.3.attn", "...mlp.fc.backward").
bool split_scope(const std::string& scope) {
  return scope.find(".attn") != std::string::npos || scope.find(".mlp") != std::string::npos;
}

// Ops the host runs far slower than an add or a multiply (a polynomial or a library call per element).
bool transcendental_op(const std::string& op) {
  static const std::set<std::string> ops = {"exp", "log", "tanh", "erf", "pow", "sqrt", "sin", "cos"};
  return ops.count(op) > 0;
}

// The share of a Step's flops (by count where its sources have none) in split scopes.
double split_fraction(const kir::Step& st) {
  double all = 0, split = 0, n = 0, ns = 0;
  for (const kir::Source& s : st.sources) {
    all += s.flops, n += 1;
    if (split_scope(s.scope)) split += s.flops, ns += 1;
  }
  return all > 0 ? split / all : n > 0 ? ns / n : 0;
}

// Compiles the requests for `target` (null: their own device) into a Workload.
Workload compile_workload(const std::vector<runtime::Request>& req, const DeviceSpec* target, DType dtype) {
  Workload w;
  w.dtype = dtype;
  if (req.empty()) return w;
  std::shared_ptr<const compiler::Plan> compiled;
  if (target && !target->backend.empty() && target->backend != "cpu")
    fail("advise", "device '" + target->name + "': backend '" + target->backend +
                       "' is not one the advisor plans for (\"cpu\": the cpu's own plan; empty: the portable plan)", "");
  if (target && target->backend == "cpu") target = nullptr;  // the host: the cpu's own plan, as the runtime runs it
  if (target) {
    Device dev = backends::null_device_for(target_of(*target, dtype));
    try {
      compiled = runtime::compile_only(req, &dev);
    } catch (const Error& e) {
      fail("advise", "the step does not compile for device '" + target->name + "': " + e.what(), "");
    }
  } else {
    compiled = runtime::compile_only(req);
  }
  w.plan = runtime::memory_plan_of(*compiled);
  for (const kir::Step& st : compiled->steps) {
    StepCost c;
    c.gemm = st.kind == kir::StepKind::Gemm;
    c.kind = kir::step_kind_name(st.kind);
    c.dtype = st.dtype;
    if (c.gemm && !st.input_dtypes.empty() && compute_dtype(st.input_dtypes[0]) != st.input_dtypes[0])
      c.dtype = st.input_dtypes[0];  // autocast's product: 16-bit operands (float32 accumulation)
    c.flops = st.cost.flops;
    c.bytes = st.cost.bytes;
    for (const kir::Source& src : st.sources) {
      if (transcendental_op(src.op)) c.transcendental_flops += src.flops;
      if (c.gemm && src.op != "matmul" && src.op != "conv") c.epilogue_flops += src.flops;
    }
    c.split_fraction = split_fraction(st);
    c.elements = double(numel(st.shape));
    if (st.kind == kir::StepKind::Attention && st.attention) {
      const kir::Step::Attention& a = *st.attention;
      double pairs = 0;  // per batch element: each query's keys in the causal range
      for (int64_t i = 0; i < a.tq; ++i) pairs += double(a.causal ? std::clamp<int64_t>(i + a.causal_offset + 1, 0, a.tk) : a.tk);
      c.attention_pairs = pairs * double(a.batch);
      c.attention_backward = a.backward;
      c.attention_flops = c.attention_pairs * double(a.backward ? 6 * a.d + 4 * a.dv : 2 * (a.d + a.dv));
    }
    if (c.gemm && st.shape.size() >= 2 && !st.maps.empty() && !st.maps[0].shape().empty()) {
      c.m = st.shape[st.shape.size() - 2];
      c.n = st.shape.back();
      c.k = st.maps[0].shape().back();
      c.batch = std::max<int64_t>(1, numel(st.shape) / std::max<int64_t>(1, c.m * c.n));
    }
    w.steps.push_back(c);
  }
  return w;
}

}  // namespace

Workload workload_of(const std::vector<Tensor>& outputs, const DeviceSpec* target, DType dtype) {
  return compile_workload(detail::pending_requests(outputs), target, dtype);
}

struct GptWorkloads::State {
  std::unique_ptr<nn::GPT> model;
  std::unique_ptr<optim::AdamW> opt;
};

GptWorkloads::GptWorkloads(const nn::GPTConfig& cfg) : cfg_(cfg), st_(std::make_unique<State>()) {
  nn::GPTConfig c = cfg;
  c.dropout = 0;  // no RNG in the step: the graph does not depend on the draw
  st_->model = std::make_unique<nn::GPT>(c);
  st_->model->train();
  st_->opt = std::make_unique<optim::AdamW>(st_->model->parameters(), optim::AdamOptions{.lr = 3e-3, .weight_decay = 0.1});
  // The steady state: AdamW's moments exist (realized zeros), as from the second step on.
  std::map<std::string, Tensor> sd;
  const auto& ps = st_->opt->params();
  for (size_t i = 0; i < ps.size(); ++i) {
    sd[std::to_string(i) + ".exp_avg"] = zeros_like(ps[i]);
    sd[std::to_string(i) + ".exp_avg_sq"] = zeros_like(ps[i]);
  }
  sd["step"] = full({}, 1.0, TensorOptions{DType::Float32, Device("cpu")});
  st_->opt->load_state_dict(sd);
  sync();
}

GptWorkloads::~GptWorkloads() = default;

const Workload& GptWorkloads::at(int64_t batch) { return trace_and_compile(batch, nullptr, DType::Float32); }

const Workload& GptWorkloads::at(int64_t batch, const DeviceSpec& target, DType dtype) {
  return trace_and_compile(batch, &target, dtype);
}

const Workload& GptWorkloads::trace_and_compile(int64_t batch, const DeviceSpec* target, DType dtype, Graph graph, size_t budget) {
  if (batch < 1) fail("advise", "batch must be positive", "");
  // The host (DeviceSpec::backend "cpu") gets the cpu's own plan: compiled for the cpu device
  // itself, as the runtime runs the step there; other devices the null device posing as them.
  if (target && !target->backend.empty() && target->backend != "cpu")
    fail("advise", "device '" + target->name + "': backend '" + target->backend +
                       "' is not one the advisor plans for (\"cpu\": the cpu's own plan; empty: the portable plan)", "");
  if (target) target_of(*target, dtype);  // the dtype check
  const bool own = !target || target->backend == "cpu";
  const kir::Target props = own ? backends::backend_for(Device("cpu")).properties(0) : target_of(*target, dtype);
  const int dev_index = own ? -1 : backends::null_device_for(props).index;
  const auto key = std::make_tuple(batch, dev_index, dtype, graph, budget);
  auto it = memo_.find(key);
  if (it != memo_.end()) return it->second;
  // Everything the step updates in place; put back on its old buffer after. No strong reference
  // to those buffers is held here: one would forbid donating them and change the plan (the
  // pending graph's leaves keep them alive, and each rebound impl's donor names its buffer).
  std::vector<std::shared_ptr<TensorImpl>> saved;
  for (auto& p : st_->opt->params()) saved.push_back(detail::impl_of(p));
  for (auto& [k, t] : st_->opt->state_dict())
    if (k != "step") saved.push_back(detail::impl_of(t));
  Workload w;
  {
    const int64_t T = cfg_.block;
    std::vector<int64_t> ids(size_t(batch * T), 1);
    TensorOptions o{DType::Int64, Device("cpu")};
    Tensor x = from_vector(ids, {batch, T}, o), y = from_vector(ids, {batch, T}, o);
    st_->opt->zero_grad();
    auto t0 = std::chrono::steady_clock::now();
    Tensor loss;
    {
      std::optional<Autocast> ac;  // bfloat16: as `tessera train gpt --dtype bfloat16` trains
      if (dtype != DType::Float32) ac.emplace(dtype);
      loss = st_->model->loss(x, y);
    }
    loss.backward();
    if (graph == Graph::Step) {
      st_->opt->step();
      st_->opt->zero_grad();  // as a training loop does before loss.item(): gradients are temporaries
    }  // a slice: the gradients are its outputs, for the next slice or the update
    double trace_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Put the model back (also when the target refuses the step); no strong reference to the
    // donors may exist while compiling.
    auto restore = [&] {
      st_->opt->zero_grad();
      for (auto& impl : saved) impl->revert_to_donor();
    };
    try {
      MemoryBudgetScope in_force(MemoryBudget{budget, 0});
      std::vector<runtime::Request> req = detail::pending_requests();
      w = compile_workload(req, own ? nullptr : target, dtype);
      if (own) {  // the cpu's own plan (the host's): prepared again, a cache hit, as every step after the first
        auto p0 = std::chrono::steady_clock::now();
        runtime::compile_only(req);
        w.prepare_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - p0).count();
      }
    } catch (const Error& e) {
      if (!budget || std::string_view(e.what()).find("[memory]") == std::string_view::npos) {
        restore();
        throw;
      }
      w = Workload{};  // the compiler's budget passes fall short: nothing to price (restored below)
      w.dtype = dtype;
      w.over_budget = true;
    } catch (...) {
      restore();
      throw;
    }
    w.trace_s = trace_s;
    restore();
  }
  w.batch = batch;
  w.tokens = double(batch * cfg_.block);
  for (auto& p : st_->opt->params()) w.grad_bytes += double(props.buffer_bytes(p.shape(), p.dtype()));
  // Tensor parallelism's figures: the parameters GPT::shard_tensor_parallel splits (Megatron: qkv
  // and fc by columns, their biases too, the projections by rows, their biases replicated).
  w.tp_blocks = cfg_.layers;
  w.tp_heads = cfg_.heads;
  w.tp_activation_bytes = double(batch * cfg_.block * cfg_.embd) * 4;
  for (const auto& [t, spec] : st_->model->tensor_parallel_specs())
    w.tp_split_param_bytes += double(props.buffer_bytes(t.shape(), t.dtype()));
  for (auto& [name, t] : st_->opt->state_dict())  // per-parameter state; not the scalars (step, learning rates)
    if (t.dim() > 0) w.state_bytes += double(props.buffer_bytes(t.shape(), t.dtype()));
  if (graph == Graph::Slice) {  // beside it: AdamW's moments and the gradients the later slices read
    w.beside_bytes = w.grad_bytes + w.state_bytes;
    w.grad_bytes = 0;  // all-reduced once, by the update
  }
  return memo_.emplace(key, std::move(w)).first->second;
}

namespace {

// The largest b in [1, limit] with fits(b), fits monotone (0: not even 1), starting the search
// from the line through the footprints at 1 and 2.
int64_t largest_fitting(const std::function<double(int64_t)>& peak, const std::function<bool(int64_t)>& fits, double capacity,
                        int64_t limit) {
  if (!fits(1)) return 0;
  if (limit < 2 || !fits(2)) return 1;
  double p1 = peak(1), p2 = peak(2);
  double slope = p2 - p1;
  int64_t est = slope > 0 ? int64_t(std::floor((capacity - p1) / slope)) + 1 : limit;
  est = std::clamp<int64_t>(est, 1, limit);
  int64_t lo, hi;  // fits(lo), !fits(hi) (hi may be limit + 1)
  if (fits(est)) {
    lo = est;
    int64_t step = 1;
    while (lo + step <= limit && fits(lo + step)) lo += step, step *= 2;
    hi = std::min(lo + step, limit + 1);
  } else {
    hi = est;
    int64_t step = 1;
    while (hi - step >= 1 && !fits(hi - step)) hi -= step, step *= 2;
    lo = std::max<int64_t>(hi - step, 1);
  }
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace

int64_t GptWorkloads::max_batch(const DeviceSpec& target, DType dtype, int64_t limit) {
  const double capacity = target.capacity_bytes();
  auto peak = [&](int64_t b) { return at(b, target, dtype).footprint_bytes(); };
  return largest_fitting(peak, [&](int64_t b) { return peak(b) <= capacity; }, capacity, limit);
}

const Workload& GptWorkloads::rematerialized(int64_t batch, const DeviceSpec& target, DType dtype) {
  return trace_and_compile(batch, &target, dtype, Graph::Step, size_t(target.capacity_bytes()));
}

const Workload& GptWorkloads::slice(int64_t rows, const DeviceSpec& target, DType dtype) {
  return trace_and_compile(rows, &target, dtype, Graph::Slice);
}

int64_t GptWorkloads::max_batch_remat(const DeviceSpec& target, DType dtype, int64_t limit) {
  const double capacity = target.capacity_bytes();
  auto fits = [&](int64_t b) {  // the plain plan first: remat is only compiled where that does not fit
    if (at(b, target, dtype).footprint_bytes() <= capacity) return true;
    const Workload& w = rematerialized(b, target, dtype);
    return !w.over_budget && w.footprint_bytes() <= capacity;
  };
  return largest_fitting([&](int64_t b) { return at(b, target, dtype).footprint_bytes(); }, fits, capacity, limit);
}

int64_t GptWorkloads::max_slice_rows(const DeviceSpec& target, DType dtype, int64_t limit) {
  const double capacity = target.capacity_bytes();
  auto peak = [&](int64_t b) { return slice(b, target, dtype).footprint_bytes(); };
  return largest_fitting(peak, [&](int64_t b) { return peak(b) <= capacity; }, capacity, limit);
}

Fit GptWorkloads::fit(int64_t batch, const DeviceSpec& target, DType dtype, const Options& o) {
  if (o.tensor_parallel > 1)
    fail("advise", "the memory budget's rewrites are not priced with tensor parallelism yet (whole replicas only)", "");
  const double capacity = target.capacity_bytes();
  Fit f;
  f.batch = batch;
  const Workload& plain = at(batch, target, dtype);
  f.plain_step_s = predict(target, plain, o).step_s;
  if (plain.footprint_bytes() <= capacity) {
    f.fits = true;
    f.peak_bytes = plain.footprint_bytes();
    f.step_s = f.plain_step_s;
    return f;
  }
  if (const Workload& r = rematerialized(batch, target, dtype); !r.over_budget && r.footprint_bytes() <= capacity) {
    f.fits = true;
    f.recomputed_steps = r.plan.recomputed_steps;
    f.unstacked_slices = r.plan.unstacked_slices;
    f.peak_bytes = r.footprint_bytes();
    f.step_s = predict(target, r, o).step_s;
    return f;
  }
  // Micro-batches: the fewest k dividing the batch whose slice fits (accumulate_gradients' auto).
  // The step: k slices' forward and backward, then the update, priced as the whole step at the
  // slice's rows (its forward, backward and update) plus k - 1 more slices.
  for (int64_t k = 2; k <= batch; ++k) {
    if (batch % k) continue;
    const Workload& s = slice(batch / k, target, dtype);
    if (s.footprint_bytes() > capacity) continue;
    f.fits = true;
    f.micro_batches = k;
    f.peak_bytes = s.footprint_bytes();
    f.step_s = double(k - 1) * predict(target, s, o).step_s + predict(target, at(batch / k, target, dtype), o).step_s;
    return f;
  }
  return f;
}

Measured measure_gpt_on_host(const nn::GPTConfig& cfg, int64_t batch, int steps, int warmup, const std::function<void()>& at_timed) {
  using clk = std::chrono::steady_clock;
  nn::GPTConfig c = cfg;
  c.dropout = 0;
  nn::GPT model(c);
  model.train();
  optim::AdamW opt(model.parameters(), {.lr = 3e-3, .weight_decay = 0.1});
  TensorOptions o{DType::Int64, Device("cpu")};
  uint64_t s = 1234;
  auto batch_of = [&] {
    std::vector<int64_t> v(size_t(batch * c.block));
    for (auto& t : v) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      t = int64_t((s >> 33) % uint64_t(c.vocab));
    }
    return from_vector(v, {batch, c.block}, o);
  };
  std::vector<double> times;
  Measured m;
  for (int i = 0; i < warmup + steps; ++i) {
    Tensor x = batch_of(), y = batch_of();
    sync();
    if (i == warmup && at_timed) at_timed();
    auto t0 = clk::now();
    Tensor loss = model.loss(x, y);
    loss.backward();
    opt.step();
    opt.zero_grad();
    int64_t before = metrics().live_bytes;
    if (i == warmup) reset_peak_bytes();
    loss.item();
    double dt = std::chrono::duration<double>(clk::now() - t0).count();
    if (i == warmup) {
      MemoryPlan last = last_memory_plan();
      m.high_water_bytes = double(last.param_bytes) + double(metrics().peak_bytes - before);
    }
    if (i >= warmup) times.push_back(dt);
  }
  std::sort(times.begin(), times.end());
  m.step_s = times.empty() ? 0 : times[times.size() / 2];
  m.fastest_step_s = times.empty() ? 0 : times.front();
  return m;
}

}  // namespace tessera::advise
