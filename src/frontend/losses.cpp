// Losses with libtorch's semantics and defaults (reduction, ignore_index, label_smoothing), as
// decompositions over public ops.
#include <limits>

#include "core/fail.h"
#include "tessera/ops.h"

namespace tessera {
namespace {

std::string desc(const Tensor& t) { return std::string(dtype_name(t.dtype())) + shape_str(t.shape()); }

// Scores [C], [N, C] or [N, C, d1, ...] with integer targets [], [N] or [N, d1, ...] as rows
// [M, C] and targets [M]; `shape` is the targets' shape (what Reduction::None returns).
struct Rows {
  Tensor scores, target;
  Shape shape;
};
Rows as_rows(const Tensor& scores, const Tensor& target, const char* op) {
  if (!scores.defined() || !target.defined()) fail(op, "called on an undefined tensor");
  Shape want = scores.shape();
  if (!want.empty()) want.erase(want.begin() + (scores.dim() == 1 ? 0 : 1));
  if (scores.dim() == 0 || !is_integral(target.dtype()) || target.shape() != want)
    fail(op, "expects scores [C], [N, C] or [N, C, d1, ...] and integer targets [], [N] or [N, d1, ...] (classes along dim " +
                 std::string(scores.dim() == 1 ? "0" : "1") + "), got " + desc(scores) + " and " + desc(target));
  const int64_t C = scores.shape()[scores.dim() == 1 ? 0 : 1];
  if (scores.dim() <= 2) return {scores.reshape({-1, C}), target.reshape({-1}), target.shape()};
  std::vector<int64_t> classes_last{0};
  for (int64_t d = 2; d < scores.dim(); ++d) classes_last.push_back(d);
  classes_last.push_back(1);
  return {scores.permute(classes_last).reshape({-1, C}), target.reshape({-1}), target.shape()};
}

// Reduces per-row log-likelihood terms x (zero at ignored rows) whose kept-row mask is w:
// -x per row, -sum(x), or -sum(x) / sum(w) (the mean over kept rows).
Tensor reduce_rows(const Tensor& x, const Tensor& w, Reduction r, const Shape& shape) {
  switch (r) {
    case Reduction::None: return (-x).reshape(shape);
    case Reduction::Sum: return -x.sum();
    case Reduction::Mean: break;
  }
  return -x.sum() / w.sum();
}

// The kept-row mask (1 where the target is not ignore_index) in `dtype`, and each row's value of
// v at its target: the row sum of where(class == target, v, 0), an elementwise mask and a row
// reduction, so the pick runs in the Row pass over v (no gather) and its gradient is the
// elementwise where(class == target, g, 0) (no scatter into zeros). The sum adds zeros to the
// one picked value: exactly v[target]. An ignored row picks nothing (its terms are masked
// anyway); a kept row whose target is outside [0, C) gets a NaN mask (the gather this replaced
// checked the index when it ran; the mask checks nothing, so the values say it).
struct Picked {
  Tensor value, keep;
};
Picked pick(const Tensor& v, const Tensor& target, int64_t ignore_index) {
  const int64_t C = v.shape()[1];
  const TensorOptions ti{target.dtype(), target.device()}, tv{v.dtype(), v.device()};
  auto num = [&](double x) { return full({}, x, ti); };
  Tensor hit = eq(arange(0, double(C), 1, ti).reshape({1, C}), target.reshape({-1, 1}));
  Tensor value = where(hit, v, zeros({}, tv)).sum({1});
  // (==, <, > and where only: what the CPU's Row loops compare integers and turn masks into values with)
  Tensor kept = logical_or(lt(target, num(double(ignore_index))), gt(target, num(double(ignore_index))));
  Tensor bad = logical_and(kept, logical_or(lt(target, num(0)), gt(target, num(double(C - 1)))));
  // A bad row's mask is NaN: its loss term and, through the mask, its gradient are NaN (under a
  // mean every term is, through the kept count), so no optimizer step takes a finite wrong value.
  Tensor keep = where(bad, full({}, std::numeric_limits<double>::quiet_NaN(), tv), where(kept, ones({}, tv), zeros({}, tv)));
  return {value, keep};
}

}  // namespace

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const NLLLossOptions& o) {
  Rows r = as_rows(log_probs, target, "nll_loss");
  if (!is_floating(r.scores.dtype())) fail("nll_loss", "expects floating log-probabilities, got " + desc(log_probs));
  Picked p = pick(r.scores, r.target, o.ignore_index);
  return reduce_rows(p.value * p.keep, p.keep, o.reduction, r.shape);
}

// log_softmax's terms without its [M, C] result: z = x - max (the shift detached, as in
// log_softmax), the row's log-sum-exp log(sum(exp(z))), the target's z; the row's
// log-probability at its target is z[t] - lse (log_softmax's bits at the target). Forward and
// backward are elementwise and row reductions over x only: the compiler's Row fusion runs the
// loss terms and the logits' gradient (softmax(x) * g - where(class == t, g, 0)) over x's rows.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& o) {
  Rows r = as_rows(logits, target, "cross_entropy");
  const double e = o.label_smoothing;
  if (e < 0 || e > 1) fail("cross_entropy", "label smoothing must be in [0, 1], got " + std::to_string(e));
  Tensor x = is_floating(r.scores.dtype()) ? r.scores : r.scores.to(DType::Float32);
  Tensor z = x - amax(x, {1}, true).detach();
  Tensor lse = log(exp(z).sum({1}));
  Picked p = pick(z, r.target, o.ignore_index);
  Tensor loss = reduce_rows((p.value - lse) * p.keep, p.keep, o.reduction, r.shape);
  if (e == 0) return loss;
  // PyTorch: (1 - e) * nll + e * (the mean over classes of -log p), over the kept rows; the mean
  // of log p over the classes is mean(z) - lse.
  return loss * (1 - e) + reduce_rows((mean(z, {1}) - lse) * p.keep, p.keep, o.reduction, r.shape) * e;
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  if (!input.defined() || !target.defined()) fail("mse_loss", "called on an undefined tensor");
  if (input.shape() != target.shape())
    fail("mse_loss", "input " + shape_str(input.shape()) + " and target " + shape_str(target.shape()) + " differ");
  Tensor d = input - target;
  switch (reduction) {
    case Reduction::None: return d * d;
    case Reduction::Sum: return (d * d).sum();
    case Reduction::Mean: break;
  }
  return mean(d * d);
}

}  // namespace tessera
