// Losses with libtorch's semantics and defaults (reduction, ignore_index, label_smoothing), as
// decompositions over public ops.
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

// The log-probability at each row's target times the kept mask, and the mask (logp's dtype).
std::pair<Tensor, Tensor> picked(const Tensor& logp, const Tensor& target, int64_t ignore_index) {
  Tensor keep = ne(target, full({}, double(ignore_index), {target.dtype(), target.device()}));
  Tensor safe = where(keep, target, zeros({}, {target.dtype(), target.device()}));  // ignored ids are never read
  Tensor w = keep.to(logp.dtype());
  return {gather(logp, 1, safe.reshape({-1, 1})).reshape({-1}) * w, w};
}

}  // namespace

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const NLLLossOptions& o) {
  Rows r = as_rows(log_probs, target, "nll_loss");
  auto [x, w] = picked(r.scores, r.target, o.ignore_index);
  return reduce_rows(x, w, o.reduction, r.shape);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& o) {
  Rows r = as_rows(logits, target, "cross_entropy");
  const double e = o.label_smoothing;
  if (e < 0 || e > 1) fail("cross_entropy", "label smoothing must be in [0, 1], got " + std::to_string(e));
  Tensor logp = log_softmax(r.scores, 1);
  auto [x, w] = picked(logp, r.target, o.ignore_index);
  Tensor loss = reduce_rows(x, w, o.reduction, r.shape);
  if (e == 0) return loss;
  // PyTorch: (1 - e) * nll + e * (the mean over classes of -log p), over the kept rows.
  return loss * (1 - e) + reduce_rows(mean(logp, {1}) * w, w, o.reduction, r.shape) * e;
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
