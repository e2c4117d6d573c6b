// Data parallelism (optim.h: DataParallel): a rank's rows of the batch, its gradients averaged
// over the ranks in buckets by all_reduce(mean), the update, one graph per rank and step.
#include <cstring>

#include "tessera/distributed.h"
#include "tessera/optim.h"
#include "tessera/tensor.h"

namespace tessera::optim {
namespace {

[[noreturn]] void fail_dp(const std::string& msg) { throw Error("[DataParallel] " + msg); }

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

}  // namespace

DataParallel DataParallel::in_process(int ranks, DataParallelOptions o) {
  if (ranks < 1) fail_dp("needs at least one rank, got " + std::to_string(ranks));
  if (o.bucket_bytes < 1) fail_dp("bucket_bytes must be positive, got " + std::to_string(o.bucket_bytes));
  return DataParallel(ranks, 0, true, o);
}
DataParallel DataParallel::process_group(DataParallelOptions o) {
  if (o.bucket_bytes < 1) fail_dp("bucket_bytes must be positive, got " + std::to_string(o.bucket_bytes));
  return DataParallel(dist::world_size(), dist::rank(), false, o);
}

double DataParallel::step(const std::vector<Tensor>& params, const std::vector<Tensor>& global_batch,
                          const std::function<Tensor(const std::vector<Tensor>&)>& loss_fn, const std::function<void()>& update) {
  if (global_batch.empty()) fail_dp("needs a batch (one or more tensors sharing their leading extent)");
  const int64_t N = ranks_;
  for (const Tensor& t : global_batch)
    if (!t.defined() || t.dim() == 0 || t.shape()[0] != global_batch[0].shape()[0])
      fail_dp("the batch's tensors must share their leading extent, got " +
              (t.defined() ? shape_str(t.shape()) : std::string("an undefined tensor")) + " beside " + shape_str(global_batch[0].shape()));
  const int64_t B = global_batch[0].shape()[0];
  if (B % N != 0)
    fail_dp("a batch of " + std::to_string(B) + " rows (" + dtype_name(global_batch[0].dtype()) + shape_str(global_batch[0].shape()) +
            ") does not divide into " +
            std::to_string(N) + " ranks");
  const int64_t rows = B / N;
  // This rank's rows (in process: rank 0's; each other rank's are its inputs to the graph).
  std::vector<Tensor> mine;
  std::vector<std::vector<std::pair<Tensor, Tensor>>> others;
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
  Tensor loss;
  {
    BatchSliceScope slice(in_process_ ? 0 : rank_ * rows, rows);
    loss = loss_fn(mine);
    if (!loss.defined() || loss.numel() != 1)
      fail_dp("the loss function must return a scalar, got " + (loss.defined() ? shape_str(loss.shape()) : std::string("an undefined tensor")));
    loss.backward();
  }
  Tensor mean_loss;
  {
    NoGradGuard ng;
    mean_loss = N == 1 ? loss.detach() : dist::all_reduce(loss.detach(), N, dist::Reduce::Mean);
    // Buckets, from the last parameter to the first.
    buckets_.clear();
    int64_t bytes = 0;
    for (size_t i = params.size(); i-- > 0;) {
      const Tensor g = params[i].grad();
      if (!g.defined()) continue;
      const int64_t b = g.numel() * int64_t(itemsize(g.dtype()));
      const bool fits = !buckets_.empty() && bytes + b <= o_.bucket_bytes && params[buckets_.back()[0]].grad().dtype() == g.dtype();
      if (!fits) buckets_.emplace_back(), bytes = 0;
      buckets_.back().push_back(i);
      bytes += b;
    }
    if (N > 1)
      for (const std::vector<size_t>& bucket : buckets_) {
        std::vector<Tensor> flat;
        for (size_t i : bucket) flat.push_back(params[i].grad().reshape({-1}));
        Tensor sum = dist::all_reduce(flat.size() == 1 ? flat[0] : cat(flat, 0), N, dist::Reduce::Mean);
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
  if (N > 1 && in_process_) dist::sync_ranks(int(N), others, rows);
  else sync();
  return mean_loss.item();
}

}  // namespace tessera::optim
