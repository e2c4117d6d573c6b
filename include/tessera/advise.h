// The advisor: predicts a training step's time and memory on accelerators that are not here.
// A graph is traced on a device that is here (the cpu) and compiled without running for the
// target's properties (through the null backend posing as it: alignment, buffer tiling, dtypes;
// under bfloat16 traced inside tessera::Autocast, as training runs), so the Steps' {flops, bytes} and the static memory
// plan are the target's; they are priced against a device table (src/advise/devices.cpp, every
// figure with its source).
//
//   auto devs = tessera::advise::builtin_devices();
//   auto t4 = tessera::advise::find_device(devs, "t4");
//   tessera::advise::GptWorkloads w(cfg);                      // a GPT + AdamW, realized on the cpu
//   const auto& wl = w.at(16, t4, tessera::DType::BFloat16);   // compile only, batch 16, t4's plan
//   auto p = tessera::advise::predict(t4, wl, {});
//   p.step_s, p.peak_bytes, p.fits, p.bottleneck
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <tuple>
#include <utility>
#include <memory>
#include <string>
#include <vector>

#include "tessera/memory.h"
#include "tessera/nn.h"
#include "tessera/tensor.h"

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera::advise {

// One device (or one board of `replicas` identical cores run data parallel, e.g. a TPU v3-8).
// Rates are per replica. "Achievable" fractions scale the peaks (documented per class in
// devices.cpp).
struct DeviceSpec {
  std::string name;          // "t4", "tpu-v3-8", "host"
  std::string description;
  std::string cls;           // "gpu" (no matrix unit), "gpu-tc" (tensor cores), "tpu", "cpu"
  int replicas = 1;          // cores of a board that run data parallel (TPU v3-8: 8)
  double fp32_flops = 0;     // dense peak FLOP/s, vector float32
  double tf32_flops = 0;     // matrix unit on float32 inputs (0: none; not used by default)
  double bf16_flops = 0;     // matrix unit bf16/fp16 dense peak (0: no matrix unit: vector rate)
  double vec16_flops = 0;    // vector rate at bf16/fp16 (0: the fp32 vector rate)
  double mem_bytes = 0;      // nominal memory per replica
  double usable_bytes = 0;   // what a program can hold (nominal less context/reserve)
  double capacity_bytes() const { return usable_bytes > 0 ? usable_bytes : mem_bytes; }  // usable, else nominal
  double mem_bw = 0;         // bytes/s per replica
  double link_bw = 0;        // interconnect bytes/s per direction per replica (ring all-reduce)
  double link_latency_s = 0; // alpha of the all-reduce, per ring hop
  std::string link;          // the interconnect the all-reduce runs over ("NVLink 3", "ICI", "PCIe 3.0 x16")
  double power_w = 0;        // per replica (board power / replicas)
  double matrix_eff = 0.75;  // achievable fraction of the matrix-unit peak on large GEMMs
  double vector_eff = 0.8;   // of the vector peak
  double bw_eff = 0.85;      // of the memory bandwidth
  double link_eff = 0.8;     // of the interconnect
  double launch_s = 5e-6;    // per-Step overhead (kernel launch / dispatch)
  int64_t tile_mn = 1, tile_k = 1;     // matrix-unit padding of M,N and of K
  double fp32_matmul_passes = 1;       // TPU: float32 matmul as this many bf16 passes
  // Host only: the GEMM peak (0: fp32_flops), whose efficiency falls on small problems:
  // rate = gemm_flops * f / (f + gemm_half_flops). fp32_flops is then the elementwise rate.
  double gemm_flops = 0;
  double gemm_half_flops = 0;
  // Host only: a product's time per output element besides (storing each result and its
  // epilogue, which a short K does not hide: M x N x K at K = 128 runs ~20% slower than the same
  // flops at K = 512): t = (f + gemm_half_flops) / gemm_flops + out_s * outputs. 0: none (the
  // host's calibration times two shapes, which fit no output term: always 0 there today).
  double gemm_out_s = 0;
  double gemm_bf16_out_s = 0;
  // The same line for products of bfloat16 operands (autocast's; the host: vdpbf16ps where the cpu
  // has it), 0: as float32's.
  double gemm_bf16_flops = 0;
  double gemm_bf16_half_flops = 0;
  // Host only (0 / empty elsewhere: the terms below are then unused).
  // The rate of transcendental ops (exp, log, tanh, erf, pow, sqrt, sin, cos; one flop per
  // element as the cost rules count them): a Step's transcendental flops run at this rate, the rest
  // at fp32_flops (the fused arithmetic rate), and a Gemm's epilogue at those rates besides its product.
  double transcendental_flops = 0;
  // The bandwidth a Step achieves by the bytes it moves, measured at sizes that stay in the
  // caches: {bytes, bytes/s} ascending; a Step moving at most `bytes` runs at the first such
  // entry's rate; beyond the last, mem_bw (the DRAM stream).
  std::vector<std::pair<double, double>> cache_bw;
  // The bandwidth of a Reduce Step (a column sum over rows: bias and layer-norm gradients, which
  // the cpu runs slower than a stream), measured on one (0: as other Steps).
  double reduce_bw = 0;
  // Host only: a Row Step (a row loop: layer norm, softmax, their backward passes, which the cpu
  // runs in several passes over each row) costs its flops and its bytes at the rates above plus
  // row_element_s per output element and row_s per Step, fitted on two layer norms (0: none).
  double row_element_s = 0, row_s = 0;
  // Host only: the fused attention Step (StepKind::Attention, the cpu's one kernel for softmax(Q K^T)
  // V and one for its gradients) costs its products' flops over the (query, key) pairs it computes
  // (the causal range: StepCost::attention_flops) at attention_flops, plus attention_pair_s per
  // pair (the softmax's exp and bookkeeping), plus its bytes at the bandwidth curve's rate;
  // the backward Step the same at its own two terms. Fitted on the GPT's attention shape at two
  // head dimensions (0: priced as any other Step, by its decomposition's flops).
  double attention_flops = 0, attention_pair_s = 0;
  double attention_bwd_flops = 0, attention_bwd_pair_s = 0;
  // Host only: tracing is synchronous with running there, so its time is added to the step.
  bool add_trace_time = false;
  // The plan the device runs. "cpu" (the host): the cpu backend's own plan, compiled for this
  // machine's cpu device as the runtime compiles it (every Step kind the backend declares: attention
  // over >= 64 keys as one fused Step each way, products writing through strides and offsets, autocast's
  // casts folded into the products, merged column sums); the fields below are then unused. Empty:
  // the null device posing as the fields below (the portable plan: attention as its decomposition,
  // which is what every other backend runs).
  std::string backend;
  // What changes the compiled plan on this device (kir::Target, see src/kernel_ir/target.h):
  size_t alignment = 64;     // of arena temporaries, bytes (CUDA: 256)
  int64_t layout_tile_rows = 1, layout_tile_cols = 1;  // buffer tiling (TPU: 8 x 128; 1 x 1 none)
  std::vector<DType> dtypes; // dtypes it computes (empty: all; a TPU: no float64)
  std::string source;        // where the figures come from (table: see devices.cpp)
};

// The built-in table: t4, t4x2 (two T4s, data parallel), p100, v100-16, v100-32, a100-40, a100-80, h100, h200, tpu-v3-core,
// tpu-v3-8, tpu-v4-chip, tpu-v4-8.
std::vector<DeviceSpec> builtin_devices();
// Devices from a JSON file: [{"name": ..., "fp32_tflops": ..., "bf16_tflops": ..., "mem_gb": ...,
// "mem_bw_gbs": ..., "power_w": ..., ...}] (see devices.cpp for every key; missing keys take the
// defaults of "cls").
std::vector<DeviceSpec> load_devices_json(const std::string& path);
// The host CPU, calibrated by microbenchmarks shaped like a training step's Steps (the GEMM line
// on a linear layer's three products, the arithmetic and transcendental vector rates, a bandwidth
// curve by size, a column sum, per-Step overhead), cached in $XDG_CACHE_HOME/tessera (or
// ~/.cache/tessera)/host-v6-<threads>.json. Each figure is the median of three calibrations (one
// disturbed by other work on a shared machine moves none of them).
DeviceSpec host_device(bool recalibrate = false);
// The host's GEMM line, t = flops / peak + outputs * out_s + products * c, fitted (least squares;
// exact for three) to timed groups of products: each group's flops, output elements, number of
// products and seconds (less its Steps' launch overhead); with two groups, no output term (the
// line through them, c per product). A negative out_s or c is refitted as 0.
struct GemmSample {
  double flops = 0, outputs = 0, products = 0, seconds = 0;
};
struct GemmLine {
  double peak_flops = 0;  // gemm_flops
  double half_flops = 0;  // gemm_half_flops: c * peak, the flops one product's intercept is worth
  double out_s = 0;       // gemm_out_s
};
GemmLine gemm_line(const std::vector<GemmSample>& samples);
// The host's row line through two points {elements, seconds}: {per element, per Step}, neither
// negative (a negative slope: the points' mean per Step; a negative intercept: through the origin).
std::pair<double, double> row_line(std::pair<double, double> a, std::pair<double, double> b);
// The device named `name` in `devs` ("host" calibrates; "cuda" or "cuda:N" is the table's spec of
// the GPU present there, with the memory it reports); throws tessera::Error naming the choices.
DeviceSpec find_device(const std::vector<DeviceSpec>& devs, const std::string& name);

// One Kernel-IR Step of a target's plan as the cost model sees it.
struct StepCost {
  bool gemm = false;
  std::string kind;  // the Step's kind as the profiler names it ("gemm", "row", "elementwise", ...)
  // Its output's dtype; a Gemm's its operands' (bfloat16/float16: matrix-unit and 16-bit vector rates).
  DType dtype = DType::Float32;
  double flops = 0, bytes = 0;   // the compiler's Step cost on the target (bytes of its layout)
  // Of flops: those of transcendental source ops (exp, log, tanh, erf, pow, sqrt, sin, cos), and
  // a Gemm's epilogue (its source ops other than the matmul: bias, activation, their derivatives).
  double transcendental_flops = 0, epilogue_flops = 0;
  // The share of its flops (of its sources, by count where they have none) computed inside a
  // GPT block's attention or MLP (scope ".attn" / ".mlp", backward included): the part tensor
  // parallelism splits over its M devices (Megatron: heads and hidden units).
  double split_fraction = 0;
  int64_t batch = 1, m = 0, n = 0, k = 0;  // Gemm: out[batch.., m, n] = [m, k] @ [k, n]
  // A fused attention Step (kind "attention"): the (query, key) pairs it computes over all its
  // batch elements (the causal range: sum over queries i of min(tk, max(0, i + offset + 1))),
  // the flops of its products over them (forward: Q K^T and P V, 2 (d + dv) per pair; backward:
  // the scores again, dP, dQ, dK and dV, 6 d + 4 dv per pair), and whether it is the backward.
  // Its flops above are the decomposition's (every pair, the softmax's ops), as the cost rules count.
  double attention_pairs = 0, attention_flops = 0;
  bool attention_backward = false;
  double elements = 0;  // its output's elements (a Row Step: the rows times the row's length)
};

// A training step compiled for one target (device properties and dtype).
struct Workload {
  std::vector<StepCost> steps;
  MemoryPlan plan;               // the target's plan (its buffer sizes, dtypes, alignment)
  DType dtype = DType::Float32;  // float32, or bfloat16: the step traced under Autocast
  int64_t batch = 0;             // per replica
  double tokens = 0;             // tokens per replica per step
  double grad_bytes = 0;         // gradient bytes on the target (all-reduced under data parallelism)
  double state_bytes = 0;        // the optimizer's per-parameter state on the target (AdamW's moments)
  double trace_s = 0;            // host time to trace the step (added on devices with add_trace_time)
  // The cpu's own plan (GptWorkloads::at(batch)): host time to prepare the traced graph again as
  // every step after the first does (build it, decide donations, its key, the cache lookup: a
  // hit), timed by compiling it a second time; added with trace_s. 0 for other targets.
  double prepare_s = 0;
  // Held on the device beside the graph and not read by it: a micro-batch slice's optimizer
  // moments and the gradients later slices read (0 for a whole step, which reads everything).
  double beside_bytes = 0;
  // Tensor parallelism (Options::tensor_parallel), for a GPT's step (0 for other workloads):
  int64_t tp_blocks = 0;            // transformer blocks, each with 2 all-reduces forward, 2 backward
  int64_t tp_heads = 0;             // attention heads (the split must divide them)
  double tp_activation_bytes = 0;   // one all-reduce's buffer: B x T x C float32 (autocast's products are float32)
  double tp_split_param_bytes = 0;  // weights of the split matrices (qkv, attn proj, fc, mlp proj) and the
                                    // column-split biases: each device keeps 1/M of them and of
                                    // their moments (gradients and activations: not reduced)
  // Compiled under a memory budget the compiler could not meet (the plan is then empty).
  bool over_budget = false;
  // What the device holds during the step: the plan's parameters plus what the run allocates
  // (outputs and the arena, whose placement honours the target's alignment), plus beside_bytes.
  double footprint_bytes() const { return double(plan.param_bytes + plan.run_bytes()) + beside_bytes; }
};

// Compiles the pending graph that computes `outputs` (compile only; all pending tensors when
// empty) into a Workload: for `target`'s properties when given, else for the tensors' device;
// `dtype` is recorded (trace the outputs under Autocast for a bfloat16 workload).
Workload workload_of(const std::vector<Tensor>& outputs, const DeviceSpec* target = nullptr,
                     DType dtype = DType::Float32);

enum class Bottleneck { Compute, Memory, Launch, Communication };
const char* bottleneck_name(Bottleneck b);

struct Options {
  int data_parallel = 1;         // devices (boards); replicas = data_parallel * device.replicas
  // ZeRO-1: the optimizer state sharded over the replicas, each holding and updating 1/R of it.
  // The ring all-reduce becomes a reduce-scatter of the gradients and an all-gather of the updated
  // weights: the same bytes on the link, so the same time; the state's (R-1)/R leaves each replica.
  bool zero1 = false;
  // Tensor parallel (Megatron's column-then-row split of each block's attention and MLP) over M
  // of the devices: the data_parallel * device.replicas devices form a 2-D mesh of
  // (devices / M) data-parallel replicas x M. Each block adds 2 all-reduces of B x T x C
  // activations in the forward and 2 in the backward over the M devices' interconnect (ring, not
  // overlapped); the split Steps' time and the split matrices' weights and moments are divided by
  // M; the gradient all-reduce runs over the devices / M replicas with 1/M of the split gradients.
  // GPT workloads only (Workload::tp_blocks); M must divide the devices and the heads.
  int tensor_parallel = 1;
};

// Time of one Step on one replica (seconds), and what bounds it.
double step_seconds(const DeviceSpec& d, const StepCost& s, Bottleneck* why = nullptr);
// Ring all-reduce of `bytes` over n replicas: 2(n-1) alpha + 2(n-1)/n bytes / (link_bw link_eff).
double allreduce_seconds(const DeviceSpec& d, double bytes, int n);
// A GEMM's dimension padded up to a multiple of the tile.
int64_t pad_to(int64_t x, int64_t tile);

struct Prediction {
  std::string device;
  double step_s = 0, compute_s = 0, memory_s = 0, launch_s = 0, comm_s = 0, trace_s = 0;
  Bottleneck bottleneck = Bottleneck::Compute;
  double peak_bytes = 0;      // per replica: the workload's footprint
  double capacity_bytes = 0;  // usable per replica
  bool fits = false;
  double tokens_per_s = 0;    // all replicas
  double tokens_per_joule = 0;  // 0: power unknown
  int64_t max_batch = 0;      // global batch (all replicas); 0: not searched / none fits
  int replicas = 1;           // data_parallel * the device's replicas (devices, all of the mesh)
  int tensor_parallel = 1;    // M: devices per tensor-parallel group (replicas / M data-parallel replicas)
  double tp_comm_s = 0;       // of comm_s: the blocks' activation all-reduces (4 per block)
  double tp_allreduce_bytes = 0;  // one of them: B x T x C float32 (0 without tensor parallelism)
  double dp_comm_s = 0;       // of comm_s: the gradient all-reduce over the data-parallel replicas
  // Weak-scaling efficiency: one device's whole step at the same per-data-parallel-replica batch
  // (no communication) over M times this step (M = 1: over this step); tokens/s is replicas x
  // efficiency times one device's.
  double scaling = 1;
};

// Prices one workload (compiled for d at the per-replica batch) on a device.
Prediction predict(const DeviceSpec& d, const Workload& w, const Options& o);

// How the runtime fits one per-replica batch into a device's usable memory with the memory
// budget's rewrites (`tessera train gpt --memory-budget <capacity>`): the step as one graph if it
// fits; else one graph rewritten by the compiler's budget passes (batch unstacking and
// rematerialization: compiler/passes/unstack.cpp, remat.cpp) if that meets the budget; else gradient accumulation over the fewest micro-batches dividing the batch whose
// slice graph fits beside the weights, moments and gradients (`--micro-batches auto`,
// optim/accumulate.cpp, whose slice graphs are not rematerialized).
struct Fit {
  int64_t batch = 0;            // per replica
  bool fits = false;            // false: not even slices of one row fit
  int64_t micro_batches = 1;    // 1: one graph
  int recomputed_steps = 0;     // one graph: the Steps remat recomputes
  int unstacked_slices = 0;     // one graph: the slices batch unstacking runs its largest values in (0: none)
  double peak_bytes = 0;        // the footprint with the rewrites
  double step_s = 0;            // predicted with the rewrites: k slices' forward and backward, one update
  double plain_step_s = 0;      // the same batch as one graph without them (as if memory were unbounded)
  double slowdown() const { return plain_step_s > 0 ? step_s / plain_step_s : 0; }
};

// The training step of a GPT with AdamW (no dropout) at any per-replica batch: the model and
// the optimizer's state are realized on the cpu once; each batch size is traced, compiled
// without running for a target, and the model restored. Results are memoized per batch and
// target properties (devices with equal properties share them).
class GptWorkloads {
 public:
  explicit GptWorkloads(const nn::GPTConfig& cfg);
  ~GptWorkloads();
  const Workload& at(int64_t batch);  // the cpu's plan (float32)
  const Workload& at(int64_t batch, const DeviceSpec& target, DType dtype);
  // The largest per-replica batch whose footprint on `target` (under dtype) fits its usable
  // memory: grows from the fitted line through two compiled sizes, then checks by compiling (at
  // most `limit`).
  int64_t max_batch(const DeviceSpec& target, DType dtype, int64_t limit = 1 << 16);

  // The memory budget's rewrites on `target` with a budget of its usable memory (see Fit).
  // The step compiled under that budget (remat; over_budget when the compiler cannot meet it):
  const Workload& rematerialized(int64_t batch, const DeviceSpec& target, DType dtype);
  // One micro-batch slice of `rows` rows: its forward and backward as one graph (the gradients
  // its outputs), beside the moments and the gradients later slices read.
  const Workload& slice(int64_t rows, const DeviceSpec& target, DType dtype);
  Fit fit(int64_t batch, const DeviceSpec& target, DType dtype, const Options& o = {});
  // The largest per-replica batch that runs as one graph with rematerialization (0: none).
  int64_t max_batch_remat(const DeviceSpec& target, DType dtype, int64_t limit = 1 << 16);
  // The most rows a micro-batch slice may have (0: none fits): accumulation runs any batch that
  // is a multiple of a row count up to it.
  int64_t max_slice_rows(const DeviceSpec& target, DType dtype, int64_t limit = 1 << 16);

  const nn::GPTConfig& config() const { return cfg_; }
  int64_t compiles() const { return int64_t(memo_.size()); }

 private:
  struct State;
  enum class Graph { Step, Slice };
  const Workload& trace_and_compile(int64_t batch, const DeviceSpec* target, DType dtype, Graph graph = Graph::Step,
                                    size_t budget = 0);
  nn::GPTConfig cfg_;
  std::unique_ptr<State> st_;
  // (batch, target: null device index; -1 the cpu, dtype, graph, budget bytes)
  std::map<std::tuple<int64_t, int, DType, Graph, size_t>, Workload> memo_;
};

// Runs `steps` training steps of the GPT at `batch` on the cpu after `warmup`, returning the
// median measured step time and the allocator's high-water mark (params + the run's bytes).
struct Measured {
  double step_s = 0;
  double fastest_step_s = 0;  // the fastest step: comparable to the calibration's best-of timing on a busy machine
  double high_water_bytes = 0;
};
// at_timed: called once, before the first timed step (after the warm-up), e.g. to start a Profiler.
Measured measure_gpt_on_host(const nn::GPTConfig& cfg, int64_t batch, int steps = 5, int warmup = 2,
                             const std::function<void()>& at_timed = {});

}  // namespace tessera::advise
#pragma GCC visibility pop
