// Gradient accumulation over micro-batches (optim.h: accumulate_gradients), the whole-step case of
// batch unstacking: each slice's forward and backward is its own graph, so one slice's activations
// are live at a time. With "auto", each candidate k is traced, planned (compiled through the cache,
// not run) and discarded, smallest first, until one fits the budget with every byte live beside it.
#include <cstdio>
#include <map>

#include "tessera/memory.h"
#include "tessera/metrics.h"
#include "tessera/optim.h"
#include "tessera/tensor.h"

namespace tessera::optim {
namespace {

std::string mib(size_t b) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f MiB", double(b) / (1024.0 * 1024.0));
  return buf;
}

// One slice's forward and backward, its loss weighted by its share of the batch; returns the
// slice's (unweighted) loss, pending.
Tensor trace_slice(const std::vector<Tensor>& batch, int64_t start, int64_t rows, int64_t total,
                   const std::function<Tensor(const std::vector<Tensor>&)>& loss_fn) {
  BatchSliceScope in_slice(start, rows);
  std::vector<Tensor> parts;
  for (const Tensor& t : batch) parts.push_back(rows == total ? t : t.narrow(0, start, rows));
  Tensor loss = loss_fn(parts);
  if (!loss.defined() || loss.numel() != 1)
    throw Error("[accumulate_gradients] the loss function must return a scalar, got " +
                (loss.defined() ? shape_str(loss.shape()) : std::string("an undefined tensor")));
  (loss * (double(rows) / double(total))).backward();
  return loss;
}

struct Estimate {
  size_t bytes = 0;  // live on the device at the slice graph's high-water mark
  MemoryPlan plan;
};

// Traces the slice graph of `rows` rows, plans it and takes the trace back (gradients and the
// generator as they were).
Estimate estimate(const std::vector<Tensor>& params, const std::vector<Tensor>& batch, int64_t rows, int64_t total,
                  const std::function<Tensor(const std::vector<Tensor>&)>& loss_fn) {
  RngState rs = rng_state();
  std::vector<Tensor> grads;
  size_t later_grads = 0;  // gradients the later slices' graphs read, not allocated yet
  for (const Tensor& p : params) {
    grads.push_back(p.grad());
    if (p.requires_grad() && !p.grad().defined()) later_grads += size_t(p.numel()) * itemsize(p.dtype());
  }
  Estimate e;
  const size_t live = size_t(metrics().live_bytes);
  {
    Tensor loss = trace_slice(batch, 0, rows, total, loss_fn);
    e.plan = pending_memory_plan();
  }
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor p = params[i];  // a handle: sets the parameter's gradient
    p.set_grad(grads[i]);
  }
  set_rng_state(rs);
  e.bytes = live + later_grads + e.plan.run_bytes();
  return e;
}

[[noreturn]] void unreachable(size_t budget, const Estimate& best, int64_t k) {
  std::string msg = "the budget of " + mib(budget) + " cannot be met by micro-batches: the smallest, " + std::to_string(k) +
                    " of them, needs " + mib(best.bytes) + " live on the device (its graph " + mib(best.plan.run_bytes()) +
                    " beside what is already live), its peak at step " + std::to_string(best.plan.peak_step) + " (" +
                    best.plan.peak_step_text + "); largest buffers live there:";
  for (size_t i = 0; i < best.plan.live_at_peak.size() && i < 8; ++i) {
    const PlannedBuffer& b = best.plan.live_at_peak[i];
    msg += (i ? "; " : " ") + b.kind + " " + shape_str(b.shape) + " " + mib(b.bytes) + " " + b.op + (b.scope.empty() ? "" : " in " + b.scope);
  }
  throw Error("[memory] " + msg);
}

// "auto" decisions by what they depend on (the batch's shapes, the budget, the parameters and the
// bytes live beside the step), so a training loop plans its first step only.
std::string decision_key(const std::vector<Tensor>& params, const std::vector<Tensor>& batch, const MemoryBudget& budget, int64_t k) {
  std::string key = budget.str() + "|" + std::to_string(k) + "|" + std::to_string(params.size()) + "|" + std::to_string(metrics().live_bytes);
  for (const Tensor& t : batch) key += "|" + std::string(dtype_name(t.dtype())) + shape_str(t.shape()) + t.device().str();
  return key;
}
thread_local std::map<std::string, AccumulateResult> t_decisions;

}  // namespace

AccumulateResult accumulate_gradients(const std::vector<Tensor>& params, const std::vector<Tensor>& batch,
                                      const std::function<Tensor(const std::vector<Tensor>&)>& loss_fn, int64_t micro_batches) {
  const char* op = "[accumulate_gradients] ";
  if (batch.empty() || batch[0].dim() < 1) throw Error(std::string(op) + "needs batch tensors with a leading batch dimension");
  const int64_t n = batch[0].shape()[0];
  for (const Tensor& t : batch)
    if (t.dim() < 1 || t.shape()[0] != n)
      throw Error(std::string(op) + "batch tensors must share their leading extent, got " + shape_str(batch[0].shape()) + " and " + shape_str(t.shape()));
  if (micro_batches < 0 || (micro_batches > 0 && (micro_batches > n || n % micro_batches)))
    throw Error(std::string(op) + std::to_string(micro_batches) + " micro-batches do not divide a batch of " + std::to_string(n));
  sync();  // nothing else pending: the slice graphs hold only the step
  const MemoryBudget budget = memory_budget();
  MemoryBudgetScope unbudgeted(MemoryBudget{});  // the slice graphs are checked here, with what is live beside them
  AccumulateResult r;
  int64_t k = micro_batches;
  const std::string key = budget.none() ? "" : decision_key(params, batch, budget, k);
  if (auto it = t_decisions.find(key); !key.empty() && it != t_decisions.end()) {
    r = it->second;
    k = r.micro_batches;
  } else if (!budget.none()) {
    std::vector<int64_t> candidates;
    for (int64_t d = 1; d <= n; ++d)
      if (n % d == 0 && (k == 0 || d == k)) candidates.push_back(d);
    r.budget_bytes = budget.bytes;
    Estimate whole;
    if (!budget.bytes) {  // a fraction of the unsliced (k = 1) figure
      whole = estimate(params, batch, n, n, loss_fn);
      r.budget_bytes = size_t(budget.fraction * double(whole.bytes));
    }
    Estimate best;
    int64_t best_k = 0;
    for (int64_t d : candidates) {
      Estimate e = d == 1 && whole.bytes ? whole : estimate(params, batch, n / d, n, loss_fn);
      if (!best_k || e.bytes < best.bytes) best = e, best_k = d;
      if (e.bytes <= r.budget_bytes) {
        k = d;
        r.planned_bytes = e.bytes;
        break;
      }
    }
    if (r.planned_bytes == 0) unreachable(r.budget_bytes, best, best_k);
    r.micro_batches = k;
    t_decisions[key] = r;
  }
  if (k == 0) k = 1;
  r.micro_batches = k;
  const int64_t rows = n / k;
  const RngState rs = rng_state();  // every slice draws from the unsliced step's draws
  for (int64_t i = 0; i < k; ++i) {
    set_rng_state(rs);
    r.loss += trace_slice(batch, i * rows, rows, n, loss_fn).item() * double(rows) / double(n);
  }
  return r;
}

}  // namespace tessera::optim
