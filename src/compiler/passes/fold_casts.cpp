// fold_casts: autocast's roundings of float32 operands to bfloat16, folded into the products that
// read them (issue 28). A Step that only casts a float32 buffer to bfloat16 (a weight's transposed
// copy, a cotangent rounded for the backward products) whose every reader is a Gemm Step reading
// it as B, or as A by rows or by columns, is removed: those products read the float32 buffer through the
// composed map and round each value as they pack it (Step::rounded; the same round-to-nearest-even
// of the same float32 value, so the same bits), with no pass over memory and no bfloat16 copy.
// Only for a device that declares Target::gemm_rounds_operands (the cpu); others keep the Steps.
#include <algorithm>
#include <optional>

#include "compiler/passes/passes.h"

namespace tessera::compiler {
namespace {

// The view `g` (a single strided view over the dense row-major buffer of shape `c`) composed with
// the view `v` that the cast read that buffer's elements through, when each of g's dimensions
// moves within one dimension of c (a permutation, broadcast or split of c's dimensions), else none.
std::optional<kir::View> compose(const kir::View& g, const Shape& c, const kir::View& v) {
  const size_t rc = c.size();
  if (numel(c) == 0) return std::nullopt;
  std::vector<int64_t> dense(rc, 1);
  for (size_t j = rc; j-- > 1;) dense[j - 1] = dense[j] * c[j];
  if (g.offset < 0) return std::nullopt;
  std::vector<int64_t> idx(rc, 0), reach(rc, 0);  // the offset's index in c; the highest index reached
  for (size_t j = 0, off = size_t(g.offset); j < rc; ++j) idx[j] = int64_t(off) / dense[j], off %= size_t(dense[j]);
  kir::View out;
  out.shape = g.shape;
  out.offset = v.offset;
  for (size_t j = 0; j < rc; ++j) out.offset += idx[j] * v.strides[j], reach[j] = idx[j];
  for (size_t d = 0; d < g.shape.size(); ++d) {
    const int64_t s = g.strides[d];
    if (g.shape[d] == 1 || s == 0) {
      out.strides.push_back(0);
      continue;
    }
    if (s < 0) return std::nullopt;
    size_t j = 0;
    while (j < rc && !(s % dense[j] == 0 && s / dense[j] < c[j])) ++j;
    if (j == rc) return std::nullopt;
    out.strides.push_back(s / dense[j] * v.strides[j]);
    reach[j] += (g.shape[d] - 1) * (s / dense[j]);
  }
  for (size_t j = 0; j < rc; ++j)
    if (reach[j] >= c[j]) return std::nullopt;  // would carry into another dimension
  return out;
}

}  // namespace

void fold_casts(Plan& plan) {
  auto& steps = plan.steps;
  std::vector<std::vector<int>> readers(plan.slots.size());
  for (size_t s = 0; s < steps.size(); ++s)
    for (int x : steps[s].inputs)
      if (readers[size_t(x)].empty() || readers[size_t(x)].back() != int(s)) readers[size_t(x)].push_back(int(s));
  std::vector<bool> gone(steps.size(), false);
  for (size_t c = 0; c < steps.size(); ++c) {
    const kir::Step& C = steps[c];
    if (C.kind != kir::StepKind::Elementwise || C.dtype != DType::BFloat16 || !C.more_outputs.empty() ||
        C.program.size() != 2 || plan.slots[size_t(C.output)].kind != kir::SlotKind::Temp)
      continue;
    const kir::Instr& L = C.program[0];
    const kir::Instr& K = C.program[1];
    if (L.code != kir::Code::Load || L.dtype != DType::Float32 || !L.map.single() || K.code != kir::Code::Cast ||
        K.a != 0 || K.dtype != DType::BFloat16)
      continue;
    const int src = C.inputs[size_t(L.input)];
    if (plan.slots[size_t(src)].dtype != DType::Float32) continue;
    // Every reader a product reading it as B, or as A by rows or columns, with composable maps; and nothing
    // between the cast and its last reader writes the float32 buffer (a parameter's update).
    const std::vector<int>& rd = readers[size_t(C.output)];
    if (rd.empty()) continue;
    struct Fold {
      int step, input;
      kir::View view;
    };
    std::vector<Fold> folds;
    bool ok = true;
    for (int r : rd) {
      const kir::Step& R = steps[size_t(r)];
      if (R.kind != kir::StepKind::Gemm || R.accumulate || R.input_dtypes.size() < 2) {
        ok = false;
        break;
      }
      for (size_t i = 0; i < R.inputs.size() && ok; ++i) {
        if (R.inputs[i] != C.output) continue;
        if (i > 1 || R.input_dtypes[i] != DType::BFloat16 || !R.maps[i].single()) {
          ok = false;
          break;
        }
        std::optional<kir::View> v = compose(R.maps[i].views[0], C.shape, L.map.views[0]);
        const size_t rr = R.shape.size();
        const bool rows = v && (v->shape[rr - 1] <= 1 || v->strides[rr - 1] == 1);
        const bool cols = v && (v->shape[rr - 2] <= 1 || v->strides[rr - 2] == 1);
        if (!v || (i == 0 && !rows && !cols)) ok = false;
        else folds.push_back({r, int(i), *v});
      }
      if (!ok) break;
    }
    // A parameter's update (an elementwise Step reading it into an output of its size, which the
    // donation pass may write in place) stays after the products that now read the parameter.
    const bool param = plan.slots[size_t(src)].kind == kir::SlotKind::Param;
    for (size_t m = c + 1; ok && m <= size_t(rd.back()); ++m) {
      const kir::Step& S = steps[m];
      for (int o : S.outputs()) {
        ok &= o != src;
        if (param && S.kind == kir::StepKind::Elementwise && plan.slots[size_t(o)].kind == kir::SlotKind::Output &&
            plan.slots[size_t(o)].nbytes == plan.slots[size_t(src)].nbytes)
          ok &= std::find(S.inputs.begin(), S.inputs.end(), src) == S.inputs.end();
      }
    }
    if (!ok) continue;
    for (const Fold& f : folds) {
      kir::Step& R = steps[size_t(f.step)];
      R.inputs[size_t(f.input)] = src;
      R.maps[size_t(f.input)].views = {f.view};
      R.rounded = uint8_t(R.rounded | (1u << f.input));
      R.sources.insert(R.sources.end(), C.sources.begin(), C.sources.end());
      R.cost.bytes += double(numel(C.shape)) * 2;  // float32 read where bfloat16 was
    }
    gone[c] = true;
  }
  size_t w = 0;
  for (size_t s = 0; s < steps.size(); ++s)
    if (!gone[s]) {
      if (w != s) steps[w] = std::move(steps[s]);
      ++w;
    }
  steps.resize(w);
}

}  // namespace tessera::compiler
