// Data parallelism (optim.h: DataParallel): a rank's rows of the batch, its gradients averaged
// over the ranks in buckets by all_reduce(mean), the update, one graph per rank and step.
#include <cmath>
#include <cstring>

#include "tessera/distributed.h"
#include "tessera/ops.h"
#include "tessera/optim.h"
#include "tessera/tensor.h"

namespace tessera::optim {
namespace {

[[noreturn]] void fail_dp(const std::string& msg) { throw Error("[DataParallel] " + msg); }

// A bucket's gradients flattened into one vector, zero-padded to `length` elements (0: none).
Tensor flat_grads(const std::vector<Tensor>& params, const std::vector<size_t>& bucket, int64_t length = 0) {
  std::vector<Tensor> flat;
  int64_t len = 0;
  for (size_t i : bucket) flat.push_back(params[i].grad().reshape({-1})), len += params[i].numel();
  if (length > len) flat.push_back(zeros({length - len}, {DType::Float32, params[bucket[0]].device()}));
  return flat.size() == 1 ? flat[0] : cat(flat, 0);
}

// Rows [start, start + rows) of a realized tensor as a tensor of its own (a buffer of its own:
// another rank's input to the graph).
template <class T>
Tensor rows_of_t(const Tensor& t, int64_t start, int64_t rows) {
  std::vector<T> all = t.to_vector<T>();
  const int64_t row = t.numel() / t.shape()[0];
  std::vector<T> part(all.begin() + start * row, all.begin() + (start + rows) * row);
  Shape s = t.shape();
  s[0] = rows;
  return from_vector<T>(part, s, {t.dtype(), t.device()});
}
Tensor rows_of(const Tensor& t, int64_t start, int64_t rows) {
  switch (t.dtype()) {
    case DType::Float32: return rows_of_t<float>(t, start, rows);
    case DType::Float64: return rows_of_t<double>(t, start, rows);
    case DType::Int32: return rows_of_t<int32_t>(t, start, rows);
    case DType::Int64: return rows_of_t<int64_t>(t, start, rows);
    default: {  // bool and 16-bit floats: through a graph of their own
      Tensor part = t.narrow(0, start, rows).clone();
      sync();
      return part;
    }
  }
}

void check(const DataParallelOptions& o) {
  if (o.bucket_bytes < 1 || o.bucket_params < 1)
    fail_dp("bucket_bytes and bucket_params must be positive, got " + std::to_string(o.bucket_bytes) + " and " + std::to_string(o.bucket_params));
}

}  // namespace

DataParallel DataParallel::in_process(int ranks, DataParallelOptions o) {
  if (ranks < 1) fail_dp("needs at least one rank, got " + std::to_string(ranks));
  check(o);
  return DataParallel(ranks, 0, true, o);
}
DataParallel DataParallel::process_group(DataParallelOptions o) {
  check(o);
  return DataParallel(dist::world_size(), dist::rank(), false, o);
}

// A batch's rows: one or more tensors sharing their leading extent, checked.
static int64_t batch_rows(const std::vector<Tensor>& batch) {
  if (batch.empty()) fail_dp("needs a batch (one or more tensors sharing their leading extent)");
  for (const Tensor& t : batch)
    if (!t.defined() || t.dim() == 0 || t.shape()[0] != batch[0].shape()[0])
      fail_dp("the batch's tensors must share their leading extent, got " +
              (t.defined() ? shape_str(t.shape()) : std::string("an undefined tensor")) + " beside " + shape_str(batch[0].shape()));
  return batch[0].shape()[0];
}

// The batch's checks; its rows per rank.
int64_t DataParallel::rows_per_rank(const std::vector<Tensor>& global_batch) const {
  const int64_t N = ranks_, B = batch_rows(global_batch);
  if (B % N != 0)
    fail_dp("a batch of " + std::to_string(B) + " rows (" + dtype_name(global_batch[0].dtype()) + shape_str(global_batch[0].shape()) +
            ") does not divide into " + std::to_string(N) + " ranks");
  return B / N;
}

std::vector<Tensor> DataParallel::local_rows(const std::vector<Tensor>& global_batch) const {
  if (in_process_ && ranks_ > 1) fail_dp("local_rows is for process groups: in process, step() takes the global batch");
  const int64_t rows = rows_per_rank(global_batch);
  if (ranks_ == 1) return global_batch;
  std::vector<Tensor> mine;
  for (const Tensor& t : global_batch) mine.push_back(rows_of(t, rank_ * rows, rows));
  return mine;
}

Tensor DataParallel::trace_rows(const std::vector<Tensor>& global_batch, const std::function<Tensor(const std::vector<Tensor>&)>& loss_fn,
                                std::vector<std::vector<std::pair<Tensor, Tensor>>>& others, int64_t& rows) {
  const int64_t N = ranks_;
  rows = rows_per_rank(global_batch);
  // This rank's rows (in process: rank 0's; each other rank's are its inputs to the graph).
  std::vector<Tensor> mine;
  others.clear();
  if (N == 1) {
    mine = global_batch;
  } else if (in_process_) {
    for (const Tensor& t : global_batch) mine.push_back(rows_of(t, 0, rows));
    for (int64_t r = 1; r < N; ++r) {
      others.emplace_back();
      for (size_t k = 0; k < global_batch.size(); ++k) others.back().push_back({mine[k], rows_of(global_batch[k], r * rows, rows)});
    }
  } else {
    for (const Tensor& t : global_batch) mine.push_back(rows_of(t, rank_ * rows, rows));
  }
  return trace_loss(mine, loss_fn, in_process_ ? 0 : rank_ * rows, rows);
}

// loss_fn on `mine` (rows start..start+rows of the global batch) and its backward.
Tensor DataParallel::trace_loss(const std::vector<Tensor>& mine, const std::function<Tensor(const std::vector<Tensor>&)>& loss_fn,
                                int64_t start, int64_t rows) {
  BatchSliceScope slice(start, rows);
  Tensor loss = loss_fn(mine);
  if (!loss.defined() || loss.numel() != 1)
    fail_dp("the loss function must return a scalar, got " + (loss.defined() ? shape_str(loss.shape()) : std::string("an undefined tensor")));
  loss.backward();
  return loss;
}

// Buckets, from the last parameter to the first (one dtype each, up to bucket_bytes).
void DataParallel::make_buckets(const std::vector<Tensor>& params, bool by_params) {
  buckets_.clear();
  int64_t bytes = 0;
  for (size_t i = params.size(); i-- > 0;) {
    const Tensor g = by_params ? params[i] : params[i].grad();
    if (!g.defined()) continue;
    const int64_t b = g.numel() * int64_t(itemsize(g.dtype()));
    const bool fits = !buckets_.empty() && bytes + b <= o_.bucket_bytes && int64_t(buckets_.back().size()) < o_.bucket_params &&
                      params[buckets_.back()[0]].dtype() == g.dtype();
    if (!fits) buckets_.emplace_back(), bytes = 0;
    buckets_.back().push_back(i);
    bytes += b;
  }
}

// After this rank's rows' forward and backward: the gradients all-reduced by bucket, the update;
// returns the mean loss, pending.
Tensor DataParallel::reduce_and_update(const std::vector<Tensor>& params, const Tensor& loss, const std::function<void()>& update) {
  const int64_t N = ranks_;
  Tensor mean_loss;
  {
    NoGradGuard ng;
    mean_loss = N == 1 ? loss.detach() : dist::all_reduce(loss.detach(), N, dist::Reduce::Mean);
    make_buckets(params);
    if (N > 1)
      for (const std::vector<size_t>& bucket : buckets_) {
        Tensor sum = dist::all_reduce(flat_grads(params, bucket), N, dist::Reduce::Mean);
        int64_t at = 0;
        for (size_t i : bucket) {
          Tensor p = params[i];  // a handle: sets the parameter's gradient
          const Tensor g = p.grad();
          p.set_grad(sum.narrow(0, at, g.numel()).reshape(g.shape()));
          at += g.numel();
        }
      }
  }
  update();
  return mean_loss;
}

double DataParallel::step(const std::vector<Tensor>& params, const std::vector<Tensor>& global_batch,
                          const std::function<Tensor(const std::vector<Tensor>&)>& loss_fn, const std::function<void()>& update) {
  std::vector<std::vector<std::pair<Tensor, Tensor>>> others;
  int64_t rows = 0;
  Tensor mean_loss = reduce_and_update(params, trace_rows(global_batch, loss_fn, others, rows), update);
  if (ranks_ > 1 && in_process_) dist::sync_ranks(int(ranks_), others, rows);
  else sync();
  return mean_loss.item();
}

Tensor DataParallel::trace_step(const std::vector<Tensor>& params, const std::vector<Tensor>& local_batch,
                                const std::function<Tensor(const std::vector<Tensor>&)>& loss_fn, const std::function<void()>& update) {
  if (in_process_ && ranks_ > 1) fail_dp("trace_step is for process groups: in process, step() runs the ranks' graphs together");
  const int64_t rows = batch_rows(local_batch);  // this rank's: local_rows(global_batch)
  return reduce_and_update(params, trace_loss(local_batch, loss_fn, rank_ * rows, rows), update);
}

// ---- ZeRO-1 ----
ZeroAdamW::ZeroAdamW(DataParallel& dp, std::vector<Tensor> params, AdamOptions o, double max_norm)
    : dp_(dp), params_(std::move(params)), o_(o), max_norm_(max_norm) {
  if (params_.empty()) fail_dp("ZeroAdamW needs parameters");
  for (const Tensor& p : params_)
    if (!p.defined() || !p.requires_grad() || p.dtype() != DType::Float32)
      fail_dp("ZeroAdamW's parameters must be float32 tensors requiring gradients");
  if (!(o.lr >= 0) || !(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1) || !(o.eps >= 0) || !(max_norm >= 0))
    fail_dp("ZeroAdamW: invalid options (lr, betas in [0, 1), eps and max_norm must be non-negative)");
}

int64_t ZeroAdamW::state_numel() const {
  int64_t n = 0;
  for (const Tensor& m : m_) n += 2 * m.numel();
  return n;
}

// The layout: DataParallel's buckets over every parameter; zero moments, this rank's shard of each
// bucket (in process, every rank's).
void ZeroAdamW::make_layout() {
  const int64_t N = dp_.ranks_;
  const Device dev = params_[0].device();
  dp_.make_buckets(params_, true);
  const auto& buckets = dp_.buckets_;
  if (m_.empty()) {
    for (const auto& bucket : buckets) {
      int64_t len = 0;
      for (size_t i : bucket) len += params_[i].numel();
      padded_.push_back((len + N - 1) / N * N);
      m_.push_back(zeros({padded_.back() / N}, {DType::Float32, dev}));
      v_.push_back(zeros({padded_.back() / N}, {DType::Float32, dev}));
    }
    if (dp_.in_process_ && N > 1) {
      others_m_.assign(size_t(N - 1), {});
      others_v_.assign(size_t(N - 1), {});
      for (size_t r = 0; r + 1 < size_t(N); ++r)
        for (size_t b = 0; b < m_.size(); ++b) {
          others_m_[r].push_back(zeros(m_[b].shape(), {DType::Float32, dev}));
          others_v_[r].push_back(zeros(v_[b].shape(), {DType::Float32, dev}));
        }
    }
    sync();  // realized: the other ranks' moments are inputs of their own
  }
}

double ZeroAdamW::step(const std::vector<Tensor>& global_batch, const std::function<Tensor(const std::vector<Tensor>&)>& loss_fn) {
  const int64_t N = dp_.ranks_;
  const Device dev = params_[0].device();
  auto scalar = [&](double v) { return from_vector<double>({v}, {}, {DType::Float32, dev}); };
  make_layout();  // at the first step; the buckets again at every step (DataParallel's, by the parameters)
  const auto& buckets = dp_.buckets_;
  std::vector<std::vector<std::pair<Tensor, Tensor>>> others;
  int64_t rows = 0;
  Tensor loss = dp_.trace_rows(global_batch, loss_fn, others, rows);
  const int64_t step = steps_ + 1;  // counted once the step has run (a failed one is undone)
  NoGradGuard ng;
  Tensor mean_loss = N == 1 ? loss.detach() : dist::all_reduce(loss.detach(), N, dist::Reduce::Mean);
  for (const Tensor& p : params_)
    if (!p.grad().defined()) fail_dp("ZeroAdamW: a parameter " + std::string(dtype_name(p.dtype())) + shape_str(p.shape()) + " got no gradient");
  // The shards of the mean gradient.
  std::vector<Tensor> shard;
  for (size_t b = 0; b < buckets.size(); ++b) {
    Tensor all = flat_grads(params_, buckets[b], padded_[b]);
    shard.push_back(N == 1 ? all : dist::reduce_scatter(all, N, 0) * (1.0 / double(N)));
  }
  if (max_norm_ > 0) {  // clip_grad_norm's rule on the global gradient
    Tensor total;
    for (const Tensor& g : shard) {
      Tensor s2 = (g * g).sum();
      total = total.defined() ? total + s2 : s2;
    }
    if (N > 1) total = dist::all_reduce(total, N, dist::Reduce::Sum);
    Tensor coef = clamp(max_norm_ / (tessera::sqrt(total) + 1e-6), std::nullopt, 1.0);
    for (Tensor& g : shard) g = g * coef;
  }
  const double bc1 = 1 - std::pow(o_.beta1, double(step)), bc2 = 1 - std::pow(o_.beta2, double(step));
  Tensor step_size = scalar(o_.lr / bc1), inv_sqrt_bc2 = scalar(1 / std::sqrt(bc2)), decay = scalar(1 - o_.lr * o_.weight_decay);
  std::vector<Tensor> new_m, new_v;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const Tensor& g = shard[b];
    Tensor m = m_[b] * o_.beta1 + g * (1 - o_.beta1);
    Tensor v = v_[b] * o_.beta2 + g * g * (1 - o_.beta2);
    Tensor update = m / (tessera::sqrt(v) * inv_sqrt_bc2 + o_.eps) * step_size;  // AdamW's, on this rank's shard
    Tensor full = N == 1 ? update : dist::all_gather(update, N, 0);
    int64_t at = 0;
    for (size_t i : buckets[b]) {
      Tensor p = params_[i];
      if (o_.weight_decay != 0) p.mul_(decay);
      p.sub_(full.narrow(0, at, p.numel()).reshape(p.shape()));
      p.set_grad(Tensor());
      at += p.numel();
    }
    new_m.push_back(m), new_v.push_back(v);
  }
  if (N > 1 && dp_.in_process_) {
    // Rank r's moment shards are its inputs, and its new ones come back.
    for (size_t r = 0; r + 1 < size_t(N); ++r)
      for (size_t b = 0; b < m_.size(); ++b) {
        others[r].push_back({m_[b], others_m_[r][b]});
        others[r].push_back({v_[b], others_v_[r][b]});
      }
    std::vector<Tensor> wanted = new_m;
    wanted.insert(wanted.end(), new_v.begin(), new_v.end());
    std::vector<std::vector<Tensor>> got = dist::sync_ranks(int(N), others, rows, wanted);
    for (size_t r = 0; r + 1 < size_t(N); ++r)
      for (size_t b = 0; b < m_.size(); ++b) {
        others_m_[r][b] = got[r][b];
        others_v_[r][b] = got[r][m_.size() + b];
      }
  } else {
    sync();
  }
  m_ = new_m, v_ = new_v;
  steps_ = step;
  return mean_loss.item();
}

namespace {
std::string shard_key(int64_t rank, const char* moment, size_t bucket) {
  return "rank" + std::to_string(rank) + "." + moment + "." + std::to_string(bucket);
}
}  // namespace

std::map<std::string, Tensor> ZeroAdamW::state_dict() const {
  const Device cpu("cpu");
  std::map<std::string, Tensor> sd;
  sd["step"] = from_vector<int64_t>({steps_}, {}, {DType::Int64, cpu});
  sd["ranks"] = from_vector<int64_t>({int64_t(dp_.ranks_)}, {}, {DType::Int64, cpu});
  sd["lr"] = from_vector<double>({o_.lr}, {}, {DType::Float64, cpu});
  const int64_t mine = dp_.in_process_ ? 0 : dp_.rank_;
  for (size_t b = 0; b < m_.size(); ++b) {
    sd[shard_key(mine, "m", b)] = m_[b];
    sd[shard_key(mine, "v", b)] = v_[b];
    for (size_t r = 0; r < others_m_.size(); ++r) {
      sd[shard_key(int64_t(r + 1), "m", b)] = others_m_[r][b];
      sd[shard_key(int64_t(r + 1), "v", b)] = others_v_[r][b];
    }
  }
  return sd;
}

void ZeroAdamW::load_state_dict(const std::map<std::string, Tensor>& sd) {
  const int64_t N = dp_.ranks_;
  auto scalar = [&](const char* key) {
    auto it = sd.find(key);
    if (it == sd.end() || !it->second.defined() || it->second.numel() != 1)
      fail_dp(std::string("ZeroAdamW: the state has no scalar '") + key + "' (not a ZeroAdamW state_dict?)");
    return it->second;
  };
  const int64_t steps = scalar("step").item<int64_t>(), ranks = scalar("ranks").item<int64_t>();
  if (ranks != N)
    fail_dp("ZeroAdamW: the state's moments are sharded over " + std::to_string(ranks) + " ranks, this run has " + std::to_string(N) +
            " (ZeRO-1 resumes with the same number of ranks)");
  if (sd.size() == 2 + sd.count("lr")) {  // saved before the first step: no moments yet
    if (steps != 0) fail_dp("ZeroAdamW: the state of step " + std::to_string(steps) + " holds no moments");
    padded_.clear(), m_.clear(), v_.clear(), others_m_.clear(), others_v_.clear();
    steps_ = 0;
    if (auto l = sd.find("lr"); l != sd.end()) o_.lr = l->second.item();
    return;
  }
  // The layout this run makes; every shard this process holds must be there with its shape.
  ZeroAdamW fresh(dp_, params_, o_, max_norm_);
  fresh.make_layout();
  const int64_t first = dp_.in_process_ ? 0 : dp_.rank_, last = dp_.in_process_ ? N - 1 : dp_.rank_;
  size_t held = 2;  // step and ranks
  held += sd.count("lr");
  for (int64_t r = first; r <= last; ++r)
    for (size_t b = 0; b < fresh.m_.size(); ++b)
      for (const char* moment : {"m", "v"}) {
        const std::string key = shard_key(r, moment, b);
        auto it = sd.find(key);
        const Tensor& want = fresh.m_[b];
        if (it == sd.end() || !it->second.defined())
          fail_dp("ZeroAdamW: the state has no '" + key + "' (rank " + std::to_string(r) + "'s shard of bucket " + std::to_string(b) +
                  " of " + std::to_string(fresh.m_.size()) + "; a state saved by another rank or for other parameters?)");
        if (it->second.shape() != want.shape() || it->second.dtype() != DType::Float32)
          fail_dp("ZeroAdamW: state entry '" + key + "' is " + dtype_name(it->second.dtype()) + shape_str(it->second.shape()) +
                  ", this run's shard float32" + shape_str(want.shape()) + " (other parameters or buckets?)");
        Tensor t = it->second.device() == want.device() ? it->second.clone() : it->second.to(want.device());
        const bool is_m = moment[0] == 'm';
        if (r == first) (is_m ? fresh.m_ : fresh.v_)[b] = t;
        else (is_m ? fresh.others_m_ : fresh.others_v_)[size_t(r - 1)][b] = t;
        ++held;
      }
  if (held != sd.size()) {
    std::string extra;
    for (const auto& [key, t] : sd)
      if (key != "step" && key != "ranks" && key != "lr" && key.rfind("rank", 0) != 0) extra = key;
    fail_dp("ZeroAdamW: the state holds " + std::to_string(sd.size()) + " entries, this run's layout " + std::to_string(held) +
            (extra.empty() ? std::string(" (other buckets or ranks?)") : " ('" + extra + "' is not ZeroAdamW's)"));
  }
  sync();  // realized: the other ranks' moments are inputs of their own
  padded_ = std::move(fresh.padded_);
  m_ = std::move(fresh.m_), v_ = std::move(fresh.v_);
  others_m_ = std::move(fresh.others_m_), others_v_ = std::move(fresh.others_v_);
  steps_ = steps;
  if (auto l = sd.find("lr"); l != sd.end()) o_.lr = l->second.item();
}

}  // namespace tessera::optim
