// Optimizers. Updates are in place under NoGradGuard, so parameters and moments keep their
// buffers (donation); the learning rate and step-dependent factors enter each step's graph as
// runtime scalars, so a schedule never changes the graph or recompiles it.
//
// Parameter groups, as in libtorch: an optimizer holds one or more groups, each a list of
// parameters with options of its own (no weight decay for biases and norms, a smaller rate for
// an embedding ...). A group given without options takes the optimizer's defaults:
//   optim::AdamW opt({{decay}, {no_decay, optim::AdamOptions{.lr = 3e-4, .weight_decay = 0}}},
//                    {.lr = 3e-4, .weight_decay = 0.1});
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tessera/tensor.h"

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera::optim {

// libtorch's OptimizerParamGroup. Once in an optimizer, every group's options are set.
template <class Options>
struct ParamGroup {
  std::vector<Tensor> params;
  std::optional<Options> options = std::nullopt;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  void zero_grad();  // clears every parameter's gradient
  virtual void step() = 0;
  int64_t steps() const { return steps_; }
  virtual size_t num_param_groups() const = 0;
  std::vector<Tensor> params() const;  // every group's parameters, group by group

  // Learning rates. set_lr(lr) drives every group from one schedule, like PyTorch's LambdaLR:
  // each group's rate becomes lr times (its initial rate / the defaults' rate), so a group
  // without options of its own gets exactly lr (every group gets lr when the defaults' rate is 0).
  // lr() is the rate last given to set_lr (the defaults' until then).
  double lr() const { return lr_; }
  void set_lr(double lr);
  double lr(size_t group) const;
  void set_lr(size_t group, double lr);  // that group only

  // State for checkpoints: per-parameter tensors as "<parameter index>.<name>" (indices count
  // through the groups in order), "step", "lr", and per group "param_groups.<g>.lr" and
  // "param_groups.<g>.params" (its parameter count). Loading checks the groups' layout and
  // restores the rates; states without group entries (older checkpoints) keep the rates.
  virtual std::map<std::string, Tensor> state_dict() const;
  virtual void load_state_dict(const std::map<std::string, Tensor>& sd);

 protected:
  Optimizer(const char* name, double default_lr);
  // Validates a new group's parameters (defined, requiring grad, in no other group) and its
  // rate, and makes room for their state.
  void register_group(const std::vector<Tensor>& params, double lr);
  virtual const std::vector<Tensor>& group_params(size_t g) const = 0;
  virtual double group_lr(size_t g) const = 0;
  virtual void set_group_lr(size_t g, double lr) = 0;
  // What step() runs inside. A step whose graph failed while running is taken back by sync() (its
  // in-place updates undone, the tensors it created errored: Tensor::failed); entering the next
  // step drops the count and the state tensors that step created, so it is the failed one run
  // again, and done() records the parameters' versions when a step completes. One thread at a
  // time: a second thread entering the same optimizer's step raises (docs/architecture.md,
  // Threading).
  class StepScope {
   public:
    explicit StepScope(Optimizer& o);
    ~StepScope();
    StepScope(const StepScope&) = delete;
    StepScope& operator=(const StepScope&) = delete;
    void done();

   private:
    Optimizer& o_;
  };
  int64_t param_versions() const;
  // The step's runtime scalars (learning rate, bias corrections), per group: float32 tensors on the
  // parameters' device that live across steps and get each step's values with set_data, so that a
  // StepCapture (tessera/capture.h) reads them as state. scalar() sets one and returns it;
  // capture_replay() registers, while a StepCapture records, `refresh` (which sets every scalar
  // for the next step, as step() does) and the step's bookkeeping to run at each replay.
  const Tensor& scalar(size_t group, size_t k, double v);
  void capture_replay(std::function<void()> refresh);
  std::vector<std::vector<Tensor>> scalars_;
  int64_t versions_after_step_ = -1;  // the parameters' versions after the last step (-1: none)
  std::atomic<bool> in_step_{false};

  const char* name_;  // for error messages: "SGD", "Adam", "AdamW"
  std::vector<std::map<std::string, Tensor>> state_;  // per parameter, in params() order
  std::vector<double> initial_lr_;                    // per group
  double default_lr_, lr_;
  int64_t steps_ = 0;
};

// The groups of an optimizer whose options are `Options`.
template <class Options>
class OptimizerBase : public Optimizer {
 public:
  using Group = ParamGroup<Options>;
  std::vector<Group>& param_groups() { return groups_; }
  const std::vector<Group>& param_groups() const { return groups_; }
  // Adds a group; its options default to defaults().
  void add_param_group(Group g);
  const Options& defaults() const { return defaults_; }
  size_t num_param_groups() const override { return groups_.size(); }

 protected:
  OptimizerBase(const char* name, std::vector<Group> groups, Options defaults);
  const std::vector<Tensor>& group_params(size_t g) const override { return groups_.at(g).params; }
  double group_lr(size_t g) const override { return groups_.at(g).options->lr; }
  void set_group_lr(size_t g, double lr) override { groups_.at(g).options->lr = lr; }
  std::vector<Group> groups_;
  Options defaults_;
};

struct SGDOptions {
  double lr = 1e-2, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
};
class SGD : public OptimizerBase<SGDOptions> {
 public:
  SGD(std::vector<Tensor> params, SGDOptions o);
  SGD(std::vector<Group> groups, SGDOptions defaults);
  void step() override;

 private:
  void set_step_scalars();
};

struct AdamOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
};
// Adam (L2 weight decay added to the gradient); AdamW decouples it (p -= lr * wd * p).
class Adam : public OptimizerBase<AdamOptions> {
 public:
  Adam(std::vector<Tensor> params, AdamOptions o = {}, bool decoupled_weight_decay = false);
  Adam(std::vector<Group> groups, AdamOptions defaults = {}, bool decoupled_weight_decay = false);
  void step() override;

 private:
  void set_step_scalars();  // this step's learning rate and bias corrections, per group
  bool decoupled_;
};
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamOptions o = {.lr = 1e-3, .weight_decay = 1e-2}) : Adam(std::move(params), o, true) {}
  AdamW(std::vector<Group> groups, AdamOptions defaults = {.lr = 1e-3, .weight_decay = 1e-2})
      : Adam(std::move(groups), defaults, true) {}
};

// ---- multi-tensor update kernels (what SGD/Adam/AdamW's step() runs; also for Python's optimizers) ----
// Each updates a whole parameter list in place, lazily (under NoGradGuard; nothing runs until a
// sync), entry i of every list belonging to parameter i; a parameter whose grads[i] is undefined
// is skipped. The learning rate and every step-dependent factor enter the graph as runtime
// scalars, so a schedule never changes the graph.
//
// SGD with momentum, dampening, weight decay and Nesterov (PyTorch's rule). Returns the momentum
// buffers: momentum_buffers[i] updated in place, or, where undefined (the first step), a new
// buffer holding the gradient. With momentum 0 the buffers are returned unchanged.
std::vector<Tensor> sgd_update(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                               const std::vector<Tensor>& momentum_buffers, const SGDOptions& o);
// Adam (decoupled = false: L2 decay added to the gradient) or AdamW (decoupled: p *= 1 - lr * wd)
// at step `step` (1 at the first update: the bias corrections' exponent). exp_avg and exp_avg_sq
// must be defined (zeros before the first step) and are updated in place.
void adam_update(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avg,
                 const std::vector<Tensor>& exp_avg_sq, int64_t step, const AdamOptions& o, bool decoupled);

extern template class OptimizerBase<SGDOptions>;
extern template class OptimizerBase<AdamOptions>;

// Scales gradients in place so their global L2 norm is at most max_norm; returns the norm
// before clipping (lazy: reading it is a host sync).
Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

// Linear warmup from 0 to lr over `warmup` steps, then cosine decay to min_lr at `total`.
// opt.set_lr(schedule(step)) applies it to every group (see Optimizer::set_lr).
struct WarmupCosine {
  double lr, min_lr;
  int64_t warmup, total;
  double operator()(int64_t step) const;
};

// Dynamic loss scaling for float16 autocast, PyTorch's GradScaler: the loss is multiplied by a
// scale before backward() so that small gradients survive float16; step() divides the gradients
// by it, checks them (one host sync) and runs the optimizer only when all are finite; update()
// halves the scale after a skipped step and doubles it after `growth_interval` good steps in a
// row. The scale enters each graph as a realized scalar, so a new scale never recompiles.
//   Tensor loss; { Autocast ac{DType::Float16}; loss = cross_entropy(model(x), y); }
//   opt.zero_grad(); scaler.scale(loss).backward(); scaler.step(opt); scaler.update();
// To clip the gradients, unscale them first: scaler.unscale(opt); clip_grad_norm(...); scaler.step(opt).
struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions o = {});
  Tensor scale(const Tensor& loss) const;  // loss times the current scale
  // Divides the gradients of opt's parameters by the scale, in place (lazily: nothing runs).
  void unscale(Optimizer& opt);
  // Unscales (unless unscale() did since the last step), checks the gradients for inf and NaN
  // (one host sync) and steps opt unless it found one. Returns whether it stepped.
  bool step(Optimizer& opt);
  void update();  // the new scale, from what the last step() found
  double get_scale() const { return scale_; }
  int64_t skipped_steps() const { return skipped_; }

 private:
  GradScalerOptions o_;
  double scale_;
  bool found_inf_ = false;
  Tensor nonfinite_;  // after unscale(): NaN when a gradient holds an inf or NaN, else 0
  int64_t good_steps_ = 0, skipped_ = 0;
};

// Gradient accumulation over micro-batches: the forward and backward passes of one training step
// over `batch` (tensors sharing their leading extent N) in k slices along it, each traced and run
// as its own graph, so only one slice's activations are live at a time. loss_fn(slice) returns
// the mean loss over its slice; each slice's backward, weighted by its share of N, accumulates
// into the parameters' grad(), so the gradients and the returned loss are the unsliced step's up
// to summation order. Afterwards the caller clips, steps and zeroes as usual (one more graph).
//   micro_batches > 0: that k (it must divide N). 0 ("auto"): the smallest divisor k of N whose
//   graphs fit the memory budget in force (tessera::MemoryBudgetScope; without one, 1), counting
//   every byte live on the device beside the graph (parameters, optimizer state, inputs, the
//   accumulated gradients); a fraction is of the k = 1 figure. A budget no k meets throws
//   "[memory] ..." before any slice runs, naming the smallest figure and the buffers at its peak.
// Dropout draws the whole batch's numbers (BatchSliceScope); batch norm in training is refused.
struct AccumulateResult {
  double loss = 0;            // the slices' losses weighted by their rows: the step's mean loss
  int64_t micro_batches = 1;  // k
  size_t planned_bytes = 0;   // bytes live on the device at a slice graph's high-water mark, as planned
  size_t budget_bytes = 0;    // the budget that was met, in bytes (0: none)
};
AccumulateResult accumulate_gradients(const std::vector<Tensor>& params, const std::vector<Tensor>& batch,
                                      const std::function<Tensor(const std::vector<Tensor>&)>& loss_fn,
                                      int64_t micro_batches = 0);

// ---- data parallelism (docs/architecture.md "Parallelism") ----
// Every rank holds the whole model and optimizer state (replicated) and takes an equal share of
// each global batch: rank r the rows [r * B/N, (r + 1) * B/N). step() traces loss_fn on the
// rank's rows (under BatchSliceScope, so dropout draws the global batch's numbers), its backward,
// then the gradients' mean over the ranks: all_reduce(mean) per bucket (the parameters taken from
// the last to the first, the order the backward finishes them, several per all_reduce up to
// bucket_bytes, one dtype per bucket), written back as the parameters' grad(); then update()
// (clip, optimizer step, zero_grad: it sees the global batch's mean gradients, the same on every
// rank), all as one graph per rank. So N ranks give one device's training on the global batch up
// to summation order. Two kinds of ranks:
//   in_process(N): N rank threads of this process (backends' in-process communicator); this
//     thread traces and compiles the step once (rank 0's), the ranks run it (dist::sync_ranks);
//     the model's tensors get rank 0's values, which every rank computes alike.
//   process_group(): this process is one rank (dist::init_mpi() first, under mpirun; one rank
//     without it); every rank runs step() with the same global batch.
struct DataParallelOptions {
  int64_t bucket_bytes = int64_t(4) << 20;  // gradient bytes per all_reduce (at least one parameter each)
  // Parameters per bucket at most: a bucket is a concat of its gradients, whose Copy Step reads
  // every input at every element (compiler/lower.cpp lower_concat), so its cost grows with them.
  int64_t bucket_params = 8;
};
class DataParallel {
 public:
  static DataParallel in_process(int ranks, DataParallelOptions o = {});
  static DataParallel process_group(DataParallelOptions o = {});
  int ranks() const { return ranks_; }
  int rank() const { return rank_; }  // this process's rank (0 in process)
  bool is_in_process() const { return in_process_; }
  // One training step; returns the global batch's mean loss (loss_fn returns its rows' mean).
  // The global batch's leading extent must divide evenly into the ranks.
  double step(const std::vector<Tensor>& params, const std::vector<Tensor>& global_batch,
              const std::function<Tensor(const std::vector<Tensor>&)>& loss_fn, const std::function<void()>& update);
  // The same step traced and left pending, for a StepCapture (tessera/capture.h) to run and
  // replay: process groups only (in process, the ranks' graphs run together inside step()).
  // `local_batch` is this rank's rows, local_rows(global_batch), made before the captured step
  // (a step must not read tensors it made from host values); returns the global batch's mean
  // loss, pending. Both throw "[DataParallel] ..." for more than one in-process rank.
  std::vector<Tensor> local_rows(const std::vector<Tensor>& global_batch) const;
  Tensor trace_step(const std::vector<Tensor>& params, const std::vector<Tensor>& local_batch,
                    const std::function<Tensor(const std::vector<Tensor>&)>& loss_fn, const std::function<void()>& update);
  // The last step's buckets: indices into params, one list per all_reduce.
  const std::vector<std::vector<size_t>>& buckets() const { return buckets_; }

 private:
  friend class ZeroAdamW;
  DataParallel(int ranks, int rank, bool in_process, DataParallelOptions o)
      : ranks_(ranks), rank_(rank), in_process_(in_process), o_(o) {}
  // Traces loss_fn and its backward on this rank's rows (in process: rank 0's, the other ranks'
  // rows going to `others`); returns the loss.
  Tensor trace_rows(const std::vector<Tensor>& global_batch, const std::function<Tensor(const std::vector<Tensor>&)>& loss_fn,
                    std::vector<std::vector<std::pair<Tensor, Tensor>>>& others, int64_t& rows);
  void make_buckets(const std::vector<Tensor>& params, bool by_params = false);  // by the parameters' sizes, not their gradients'
  int64_t rows_per_rank(const std::vector<Tensor>& global_batch) const;  // checks the batch
  Tensor trace_loss(const std::vector<Tensor>& mine, const std::function<Tensor(const std::vector<Tensor>&)>& loss_fn,
                    int64_t start, int64_t rows);
  // The gradients all-reduced by bucket, the update; the mean loss, pending.
  Tensor reduce_and_update(const std::vector<Tensor>& params, const Tensor& loss, const std::function<void()>& update);

  int ranks_, rank_;
  bool in_process_;
  DataParallelOptions o_;
  std::vector<std::vector<size_t>> buckets_;
};

// ZeRO-1 over a DataParallel's ranks: AdamW (decoupled weight decay) whose moments are sharded --
// each rank keeps 1/N of every bucket's moments. A step: the rank's rows forward and backward as
// in DataParallel::step; per bucket (DataParallel's buckets, zero-padded to a multiple of N), the
// flattened gradients reduce_scatter'ed and divided by N (the rank's shard of the mean gradient);
// optionally clipped to max_norm by the global norm (an all_reduce of the shards' squared sums);
// the Adam update of the rank's shard from its moments; the shards' updates all_gather'ed and
// applied to every rank's full parameters with the weight decay. So it trains as DataParallel::step
// with clip_grad_norm and AdamW does, with 1/N of the moments' memory per rank. `dp` must outlive it.
// Checkpoints: state_dict() holds the moment shards this process keeps -- under MPI this rank's,
// in process every rank's -- so each MPI rank saves its own; resuming needs the same N.
class ZeroAdamW {
 public:
  ZeroAdamW(DataParallel& dp, std::vector<Tensor> params, AdamOptions o = {.lr = 1e-3, .weight_decay = 1e-2}, double max_norm = 0);
  // One training step on the global batch; returns its mean loss.
  double step(const std::vector<Tensor>& global_batch, const std::function<Tensor(const std::vector<Tensor>&)>& loss_fn);
  void set_lr(double lr) { o_.lr = lr; }
  double lr() const { return o_.lr; }
  int64_t steps() const { return steps_; }
  // This rank's moment elements (both moments, every bucket): about 2 * parameters / N.
  int64_t state_numel() const;
  // State for checkpoints: "step", "ranks" (N) and "lr" (scalars), and per bucket b and rank r
  // whose shards this process holds (in process: every rank; under MPI: its own), "rank<r>.m.<b>"
  // and "rank<r>.v.<b>" (float32 [padded length / N]). load_state_dict takes what state_dict gave
  // on a run with the same N, rank (MPI) and parameters; another N, a missing or misshapen shard
  // is an error naming it, and nothing changes.
  std::map<std::string, Tensor> state_dict() const;
  void load_state_dict(const std::map<std::string, Tensor>& sd);

 private:
  DataParallel& dp_;
  std::vector<Tensor> params_;
  AdamOptions o_;
  double max_norm_;
  int64_t steps_ = 0;
  // Per bucket: its padded length; this rank's moment shards (in process: rank 0's, then the
  // other ranks' in others_m_/others_v_[r - 1]).
  std::vector<int64_t> padded_;
  std::vector<Tensor> m_, v_;
  std::vector<std::vector<Tensor>> others_m_, others_v_;
  void make_layout();  // the buckets and zero moments (at the first step or a load)
};

}  // namespace tessera::optim
#pragma GCC visibility pop
