#include <algorithm>
#include <unordered_map>

#include "compiler/passes/fuse.h"
#include "compiler/passes/passes.h"

namespace tessera::compiler {
namespace {

bool identity(const kir::Instr& in, const Shape& s) {
  return in.map.is_contiguous() && in.map.views[0].offset == 0 && in.map.shape() == s;
}

// B's program appended to A's: B's loads of A's outputs become A's registers.
void absorb(kir::Step& A, const kir::Step& B) {
  std::vector<int> outs = A.outputs();
  std::vector<int> results{int(A.program.size()) - 1};
  results.insert(results.end(), A.more_results.begin(), A.more_results.end());
  std::vector<int> at(B.program.size());
  for (size_t k = 0; k < B.program.size(); ++k) {
    kir::Instr in = B.program[k];
    if (in.code == kir::Code::Load) {
      int slot = B.inputs[in.input];
      auto o = std::find(outs.begin(), outs.end(), slot);
      if (o != outs.end()) {
        at[k] = results[o - outs.begin()];
        continue;
      }
      auto it = std::find(A.inputs.begin(), A.inputs.end(), slot);
      in.input = int(it - A.inputs.begin());
      if (it == A.inputs.end()) A.inputs.push_back(slot);
    }
    if (in.a >= 0) in.a = at[in.a];
    if (in.b >= 0) in.b = at[in.b];
    if (in.c >= 0) in.c = at[in.c];
    // An instruction A already computes is reused, not evaluated twice.
    auto same = std::find_if(A.program.begin(), A.program.end(), [&](const kir::Instr& x) { return same_instr(x, in); });
    if (same != A.program.end()) {
      at[k] = int(same - A.program.begin());
      continue;
    }
    A.program.push_back(in);
    at[k] = int(A.program.size()) - 1;
  }
  // The main result is the last instruction: B's result becomes the main output (appended last
  // unless A already computed it) and A's outputs join the further ones.
  int b_last = at.back();
  if (b_last != int(A.program.size()) - 1) {  // B's result was found in A: evaluate it last again
    A.program.push_back(A.program[size_t(b_last)]);
    b_last = int(A.program.size()) - 1;
  }
  A.more_outputs.insert(A.more_outputs.begin(), A.output);
  A.more_results.insert(A.more_results.begin(), results[0]);
  A.output = B.output;
  A.dtype = B.dtype;
  for (size_t j = 0; j < B.more_outputs.size(); ++j) {
    A.more_outputs.push_back(B.more_outputs[j]);
    A.more_results.push_back(at[B.more_results[j]]);
  }
  A.sources.insert(A.sources.end(), B.sources.begin(), B.sources.end());
  A.cost.flops += B.cost.flops;
  A.cost.bytes += B.cost.bytes;
}

// Whether `m` reads, at every position of a Row Step's domain, the value its row holds in a
// dense buffer of one value per row (a statistic broadcast back along the row).
bool row_broadcast(const kir::IndexMap& m, const Shape& domain, int64_t row) {
  if (m.views.size() != 1) return false;
  const kir::View& v = m.views[0];
  if (v.masked() || v.offset != 0 || v.shape != domain) return false;
  int64_t stride = 0, inner = 1;  // the row spans dims whose extents multiply to `row`
  for (size_t d = domain.size(); d-- > 0;) {
    if (inner < row) {
      inner *= domain[d];
      if (v.strides[d] != 0 && domain[d] != 1) return false;
      if (inner == row) stride = 1;
      continue;
    }
    if (v.strides[d] != stride && domain[d] != 1) return false;
    stride *= domain[d];
  }
  return inner == row;
}

}  // namespace

// A Row Step B that reads the per-row result of an earlier Row Step A over the same rows, only
// broadcast back along its rows (a layer norm's deviation, softmax's sum), recomputes A's
// program itself: A's instructions come first in B, B's loads of A's result become A's result,
// and B stores it once per row as a further output (A's slot). Done when no Step between them
// reads A's output (the merged Step runs at B's place). A result stored in a narrower type than
// it is computed in (float16) is read as a cast to that type, rounded as the store rounds.
void merge_rows(Plan& plan) {
  auto& steps = plan.steps;
  std::vector<int> writer(plan.slots.size(), -1);
  for (size_t s = 0; s < steps.size(); ++s)
    for (int o : steps[s].outputs()) writer[size_t(o)] = int(s);
  std::vector<bool> gone(steps.size(), false);
  auto reads = [](const kir::Step& st, int slot) { return std::count(st.inputs.begin(), st.inputs.end(), slot) > 0; };
  for (size_t b = 0; b < steps.size(); ++b) {
    const kir::Step& B = steps[b];
    if (B.kind != kir::StepKind::Row || numel(B.shape) != numel(B.domain) || !B.more_outputs.empty()) continue;
    for (int x : B.inputs) {
      int a = writer[size_t(x)];
      if (a < 0 || gone[size_t(a)] || a >= int(b)) continue;
      const kir::Step& A = steps[size_t(a)];
      if (A.kind != kir::StepKind::Row || A.domain != B.domain || A.row != B.row || !A.more_outputs.empty() ||
          numel(A.shape) * A.row != numel(A.domain))
        continue;
      bool ok = true;
      for (const kir::Instr& in : B.program)
        if (in.code == kir::Code::Load && B.inputs[size_t(in.input)] == x) ok &= row_broadcast(in.map, B.domain, B.row);
      for (size_t m = size_t(a) + 1; m < b && ok; ++m) ok = gone[m] || !reads(steps[m], x);
      if (!ok) continue;
      kir::Step M = B;
      M.inputs.clear();
      M.program.clear();
      auto input = [&](int slot) {
        auto it = std::find(M.inputs.begin(), M.inputs.end(), slot);
        if (it != M.inputs.end()) return int(it - M.inputs.begin());
        M.inputs.push_back(slot);
        return int(M.inputs.size()) - 1;
      };
      auto add = [&](kir::Instr in) {  // an instruction already there is reused
        for (size_t j = 0; j < M.program.size(); ++j)
          if (same_instr(M.program[j], in)) return int(j);
        M.program.push_back(in);
        return int(M.program.size()) - 1;
      };
      auto paste = [&](const kir::Step& S, int replaced, int by) {
        std::vector<int> at(S.program.size());
        for (size_t k = 0; k < S.program.size(); ++k) {
          kir::Instr in = S.program[k];
          if (in.code == kir::Code::Load) {
            if (S.inputs[size_t(in.input)] == replaced) {
              at[k] = by;
              continue;
            }
            in.input = input(S.inputs[size_t(in.input)]);
          }
          for (int* o : {&in.a, &in.b, &in.c})
            if (*o >= 0) *o = at[size_t(*o)];
          at[k] = add(in);
        }
        return at.back();
      };
      int stat = paste(A, -1, -1), as_read = stat;
      if (compute_dtype(A.dtype) != A.dtype) {
        kir::Instr cast;
        cast.code = kir::Code::Cast;
        cast.dtype = A.dtype;
        cast.a = stat;
        as_read = add(cast);
      }
      int res = paste(B, x, as_read);
      if (res != int(M.program.size()) - 1) M.program.push_back(M.program[size_t(res)]);  // the result stays last
      M.more_outputs = {A.output};
      M.more_results = {stat};
      M.sources.insert(M.sources.begin(), A.sources.begin(), A.sources.end());
      M.cost.flops += A.cost.flops;
      M.cost.bytes += A.cost.bytes;
      writer[size_t(A.output)] = int(b);
      steps[b] = std::move(M);
      gone[size_t(a)] = true;
      break;
    }
  }
  std::vector<kir::Step> kept;
  for (size_t s = 0; s < steps.size(); ++s)
    if (!gone[s]) kept.push_back(std::move(steps[s]));
  steps = std::move(kept);
}

// Elementwise Steps over the same shape are merged when B (later) shares an input with A or
// reads A's outputs, only element for element. The merged Step goes where A was when all of
// B's other inputs are written before A, else where B was when no Step between them reads A's
// outputs; otherwise the pair is left alone.
void merge_elementwise(Plan& plan) {
  auto& steps = plan.steps;
  std::vector<int> writer(plan.slots.size(), -1);
  for (size_t s = 0; s < steps.size(); ++s)
    for (int o : steps[s].outputs()) writer[o] = int(s);
  std::vector<bool> gone(steps.size(), false);
  std::unordered_map<int, std::vector<int>> readers_of;  // slot -> elementwise Steps reading it so far
  for (size_t b = 0; b < steps.size(); ++b) {
    kir::Step& B = steps[b];
    if (B.kind != kir::StepKind::Elementwise) continue;
    int target = -1;
    for (int x : B.inputs) {
      std::vector<int> cands = readers_of[x];
      if (writer[x] >= 0 && steps[writer[x]].kind == kir::StepKind::Elementwise) cands.push_back(writer[x]);
      for (int a : cands) {
        if (gone[a] || a == int(b)) continue;
        kir::Step& A = steps[a];
        if (A.shape != B.shape || A.program.size() + B.program.size() > 2 * kMaxFragInstrs) continue;
        std::vector<int> outs = A.outputs();
        bool ok = true;
        for (const kir::Instr& in : B.program)
          if (in.code == kir::Code::Load && std::count(outs.begin(), outs.end(), B.inputs[in.input]))
            ok &= identity(in, B.shape);
        if (!ok) continue;
        // Where can the merged Step run?
        bool at_a = true;
        for (int y : B.inputs)
          if (!std::count(outs.begin(), outs.end(), y) && writer[y] > a) at_a = false;
        bool at_b = true;
        for (size_t m = a + 1; m < b && at_b; ++m) {
          if (gone[m]) continue;
          for (int y : steps[m].inputs) at_b &= !std::count(outs.begin(), outs.end(), y);
        }
        if (at_a || at_b) {
          target = a;
          if (!at_a) {  // run at B's position: move A's Step there
            std::swap(steps[a], steps[b]);
            for (int o : steps[b].outputs()) writer[o] = int(b);
            target = int(b);
            absorb(steps[b], steps[a]);
            for (int o : steps[b].outputs()) writer[o] = int(b);
            for (int y : steps[b].inputs) readers_of[y].push_back(int(b));
            gone[a] = true;
          } else {
            absorb(A, B);
            for (int o : A.outputs()) writer[o] = a;
            for (int y : A.inputs) readers_of[y].push_back(a);
            gone[b] = true;
          }
          break;
        }
      }
      if (target >= 0) break;
    }
    if (target < 0)
      for (int x : B.inputs) readers_of[x].push_back(int(b));
  }
  std::vector<kir::Step> kept;
  for (size_t s = 0; s < steps.size(); ++s)
    if (!gone[s]) kept.push_back(std::move(steps[s]));
  steps = std::move(kept);
}

}  // namespace tessera::compiler
