#include <algorithm>
#include <functional>
#include <unordered_map>
#include <utility>

#include "compiler/passes/fuse.h"
#include "compiler/passes/passes.h"

namespace tessera::compiler {
namespace {

bool identity(const kir::Instr& in, const Shape& s) {
  return in.map.is_contiguous() && in.map.views[0].offset == 0 && in.map.shape() == s;
}

// S's program appended to M's (M's inputs extended as needed), reusing instructions M already
// computes; a load of a slot for which `replaced` gives an instruction of M (else -1) is that
// instruction instead. Returns where each of S's instructions is in M.
std::vector<int> append_program(kir::Step& M, const kir::Step& S, const std::function<int(int slot)>& replaced) {
  std::vector<int> at(S.program.size());
  for (size_t k = 0; k < S.program.size(); ++k) {
    kir::Instr in = S.program[k];
    if (in.code == kir::Code::Load) {
      int slot = S.inputs[size_t(in.input)];
      if (int r = replaced(slot); r >= 0) {
        at[k] = r;
        continue;
      }
      auto it = std::find(M.inputs.begin(), M.inputs.end(), slot);
      in.input = int(it - M.inputs.begin());
      if (it == M.inputs.end()) M.inputs.push_back(slot);
    }
    for (int* o : {&in.a, &in.b, &in.c})
      if (*o >= 0) *o = at[size_t(*o)];
    auto same = std::find_if(M.program.begin(), M.program.end(), [&](const kir::Instr& x) { return same_instr(x, in); });
    at[k] = int(same - M.program.begin());
    if (same == M.program.end()) M.program.push_back(in);
  }
  return at;
}

// The Steps not merged into others, in order.
void drop_gone(std::vector<kir::Step>& steps, const std::vector<bool>& gone) {
  std::vector<kir::Step> kept;
  for (size_t s = 0; s < steps.size(); ++s)
    if (!gone[s]) kept.push_back(std::move(steps[s]));
  steps = std::move(kept);
}

// Makes instruction r of M's program its last (the main result), evaluating it again at the end
// when it is not; returns its index.
int result_last(kir::Step& M, int r) {
  if (r == int(M.program.size()) - 1) return r;
  M.program.push_back(M.program[size_t(r)]);
  return int(M.program.size()) - 1;
}

// B's program appended to A's: B's loads of A's outputs become A's registers. The main result is
// the last instruction: B's result becomes the main output and A's outputs join the further ones.
void absorb(kir::Step& A, const kir::Step& B) {
  std::vector<int> outs = A.outputs();
  std::vector<int> results{int(A.program.size()) - 1};
  results.insert(results.end(), A.more_results.begin(), A.more_results.end());
  std::vector<int> at = append_program(A, B, [&](int slot) {
    auto o = std::find(outs.begin(), outs.end(), slot);
    return o == outs.end() ? -1 : results[size_t(o - outs.begin())];
  });
  result_last(A, at.back());
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

// Further outputs into temps that no Step reads are not stored: when A's output was read only by
// B, absorbing B leaves it one (a max-pool's running "wins" mask, 0.4 MB per pool).
void drop_unread_outputs(Plan& plan) {
  std::vector<bool> read(plan.slots.size(), false);
  for (const kir::Step& st : plan.steps)
    for (int x : st.inputs) read[size_t(x)] = true;
  for (kir::Step& st : plan.steps)
    for (size_t j = st.more_outputs.size(); j-- > 0 && st.kind != kir::StepKind::Attention;) {  // the kernel writes every one
      const int o = st.more_outputs[j];
      if (plan.slots[size_t(o)].kind != kir::SlotKind::Temp || read[size_t(o)]) continue;
      st.more_outputs.erase(st.more_outputs.begin() + std::ptrdiff_t(j));
      st.more_results.erase(st.more_results.begin() + std::ptrdiff_t(j));
    }
}

// `domain` with the trailing axes spanning `row` positions set to 1 ([N, C], C -> [N, 1]); empty
// when no run of trailing axes spans exactly `row`.
Shape row_axes_one(Shape domain, int64_t row) {
  int64_t p = 1;
  for (size_t i = domain.size(); i-- > 0 && p < row;) p *= std::exchange(domain[i], 1);
  return p == row ? domain : Shape{};
}

// The earlier Steps merge_rows tries to join into Step b: the writers of what b reads, then (b a
// Row Step) earlier Row Steps over b's domain and rows, several rows, that read an input b reads
// and store only values per row (a cross-entropy's picked logit beside its sum of exponentials,
// both over the logits): one pass over the rows computes both.
std::vector<int> row_partners(const Plan& plan, const std::vector<bool>& gone, const std::vector<int>& writer, size_t b) {
  const std::vector<kir::Step>& steps = plan.steps;
  const kir::Step& B = steps[b];
  std::vector<int> r;
  for (int x : B.inputs)
    if (const int a = writer[size_t(x)]; a >= 0 && a < int(b) && !gone[size_t(a)] && std::find(r.begin(), r.end(), a) == r.end())
      r.push_back(a);
  if (B.kind != kir::StepKind::Row) {
    // B elementwise over the rows of a Row Step joins that Step first (the loss's per-row
    // gradient scale: into the pass over the logits, not into the sum over rows it also reads).
    std::stable_partition(r.begin(), r.end(), [&](int a) {
      const kir::Step& A = steps[size_t(a)];
      return A.kind == kir::StepKind::Row && A.row > 1 && numel(B.shape) * A.row == numel(A.domain);
    });
    return r;
  }
  for (size_t a = 0; a < b; ++a) {
    const kir::Step& A = steps[a];
    if (gone[a] || A.kind != kir::StepKind::Row || A.row != B.row || A.domain != B.domain || numel(A.shape) * A.row != numel(A.domain) ||
        numel(A.shape) == 1 ||  // (whole-tensor sums stay apart: their readers would wait for B)
        std::find(r.begin(), r.end(), int(a)) != r.end())
      continue;
    for (int x : A.inputs)
      if (std::count(B.inputs.begin(), B.inputs.end(), x) && numel(plan.slots[size_t(x)].shape) >= A.row) {
        r.push_back(int(a));
        break;
      }
  }
  return r;
}

}  // namespace

// A Row Step B that reads the per-row results of an earlier Row Step A over the same rows, only
// broadcast back along its rows (a layer norm's deviation, softmax's sum), recomputes A's
// program itself: A's instructions come first in B, B's loads of A's results become A's
// results, and B stores them once per row as further outputs (A's slots). B may also be an
// elementwise Step over A's positions (a layer norm's output from its stored statistics: it
// becomes a Row Step) or store one value per row itself (a variance from a stored mean: a chain
// of statistics joins step by step), and A may store several per-row values (lowering's
// store_row_stats). A's main result may also be one per position that only B reads, element
// for element: it is then computed inside B and not stored. B's domain may be a reshape of A's
// when its maps stay single views (the merged Step runs over A's). The merged Step runs at B's
// place: Steps between them reading A's outputs (and those reading theirs) move after it, or
// the pair is left alone when B reads their results. Several A's join one B in turn. A result
// stored in a narrower type than it is computed in (float16) is read as a cast to that type,
// rounded as the store rounds. Two more partners (row_partners): a Row Step B joins earlier Row
// Steps over its domain and rows that read an input B reads and store only per-row values (a
// cross entropy's picked logit beside its sum of exponentials); an elementwise B over one
// position per row of a Row Step A joins A, evaluated along each row (the loss's per-row
// gradient scale, inside the pass over the logits).
void merge_rows(Plan& plan) {
  auto& steps = plan.steps;
  std::vector<int> writer(plan.slots.size(), -1);
  auto index_writers = [&] {
    std::fill(writer.begin(), writer.end(), -1);
    for (size_t s = 0; s < steps.size(); ++s)
      for (int o : steps[s].outputs()) writer[size_t(o)] = int(s);
  };
  index_writers();
  std::vector<bool> gone(steps.size(), false);
  auto reads = [](const kir::Step& st, int slot) { return std::count(st.inputs.begin(), st.inputs.end(), slot) > 0; };
  // Steps between A and B reading A's outputs, with the Steps between reading theirs (a layer
  // norm's weight-gradient Reduce reading a stored mean, the optimizer's update of that weight
  // scheduled right after it), move after B when B reads none of their results: [a+1, b) those.
  auto movers = [&](size_t a, size_t b, const std::vector<int>& outs, bool* ok) {
    std::vector<size_t> move;
    std::vector<int> moved = outs;
    for (size_t m = a + 1; m < b && *ok; ++m) {
      if (gone[m]) continue;
      bool r = false;
      for (int o : moved) r |= reads(steps[m], o);
      if (!r) continue;
      if (steps[m].kind == kir::StepKind::Collective) *ok = false;
      move.push_back(m);
      for (int o : steps[m].outputs()) {
        moved.push_back(o);
        *ok = *ok && !reads(steps[b], o);
      }
    }
    return move;
  };
  for (size_t b = 0; b < steps.size(); ++b) {
    for (bool again = true; again;) {
      again = false;
      const kir::Step& B = steps[b];
      const bool row_b = B.kind == kir::StepKind::Row;
      if ((!row_b && B.kind != kir::StepKind::Elementwise) || (!row_b && !B.more_outputs.empty())) break;
      const Shape& bdom = row_b ? B.domain : B.shape;
      for (int a : row_partners(plan, gone, writer, b)) {
        const kir::Step& A = steps[size_t(a)];
        if (A.kind != kir::StepKind::Row || (row_b && A.row != B.row)) continue;
        // A's main result one per row, or one per position that only B reads, element for element
        // (a layer norm's input gradient before its mean is subtracted): then it is not stored.
        const bool per_row = numel(A.shape) * A.row == numel(A.domain);
        // B elementwise over A's rows, one position per row (the loss's per-row gradient scale
        // from its stored sum of exponentials): evaluated along each row, its result per row. Not
        // over a single row (a whole-tensor sum, clip_grad_norm's): B would run at every position.
        const bool rowwise = !row_b && per_row && A.row > 1 && numel(A.shape) > 1 && numel(bdom) * A.row == numel(A.domain);
        if (numel(A.domain) != numel(bdom) && !rowwise) continue;
        if (!per_row && (numel(A.shape) != numel(A.domain) || plan.slots[size_t(A.output)].kind != kir::SlotKind::Temp ||
                         std::any_of(steps.begin(), steps.end(), [&](const kir::Step& st) { return &st != &B && reads(st, A.output); })))
          continue;
        const std::vector<int> outs = A.outputs();
        kir::Step Bp = B;  // B over A's domain
        // (rowwise) A's domain with its row's axes 1: B's value per row, along the row (from the
        // domain, so the map's rank is the domain's whatever rank A's shape has)
        const Shape rows = rowwise ? row_axes_one(A.domain, A.row) : Shape{};
        bool ok = !rowwise || !rows.empty();
        for (kir::Instr& in : Bp.program) {
          // An index along an axis of B's domain has no counterpart over a reshape of it; a draw
          // evaluated along each row would take another position's number.
          if (in.code == kir::Code::Iota && bdom != A.domain) ok = false;
          if (in.code == kir::Code::Rng && rowwise) ok = false;
          if (in.code != kir::Code::Load || !ok) continue;
          const size_t depth = in.map.views.size();
          if (rowwise) in.map = in.map.reshape(rows).expand(A.domain);  // each row's value along the row
          else if (bdom != A.domain) in.map = in.map.reshape(A.domain);
          ok &= in.map.views.size() == depth;
          const int slot = Bp.inputs[size_t(in.input)];
          if (!per_row && slot == A.output) ok &= identity(in, A.domain);
          else if (std::count(outs.begin(), outs.end(), slot)) ok &= row_broadcast(in.map, A.domain, A.row);
        }
        const std::vector<size_t> move = ok ? movers(size_t(a), b, outs, &ok) : std::vector<size_t>{};
        if (!ok) continue;
        kir::Step M = Bp;
        M.kind = kir::StepKind::Row;
        M.domain = A.domain;
        M.row = A.row;
        M.inputs.clear();
        M.program.clear();
        const std::vector<int> at_a = append_program(M, A, [](int) { return -1; });
        std::vector<int> stats{at_a.back()};
        for (int r : A.more_results) stats.push_back(at_a[size_t(r)]);
        std::vector<int> as_read = stats;
        for (size_t j = 0; j < outs.size(); ++j) {
          const DType t = plan.slots[size_t(outs[j])].dtype;
          if (compute_dtype(t) == t) continue;
          kir::Instr cast;  // (nothing in A reads its results: a new instruction)
          cast.code = kir::Code::Cast;
          cast.dtype = t;
          cast.a = stats[j];
          M.program.push_back(cast);
          as_read[j] = int(M.program.size()) - 1;
        }
        const std::vector<int> at_b = append_program(M, Bp, [&](int slot) {
          auto o = std::find(outs.begin(), outs.end(), slot);
          return o == outs.end() ? -1 : as_read[size_t(o - outs.begin())];
        });
        result_last(M, at_b.back());
        M.more_outputs = outs;
        M.more_results = stats;
        if (!per_row) {  // A's main result read by B alone: computed, not stored
          M.more_outputs.erase(M.more_outputs.begin());
          M.more_results.erase(M.more_results.begin());
        }
        for (size_t j = 0; j < Bp.more_outputs.size(); ++j) {
          M.more_outputs.push_back(Bp.more_outputs[j]);
          M.more_results.push_back(at_b[size_t(Bp.more_results[j])]);
        }
        M.sources.insert(M.sources.begin(), A.sources.begin(), A.sources.end());
        M.cost.flops += A.cost.flops;
        M.cost.bytes += A.cost.bytes;
        steps[b] = std::move(M);
        gone[size_t(a)] = true;
        for (size_t k = move.size(); k-- > 0;) {  // the moved Steps right after B, in their order
          kir::Step st = std::move(steps[move[k]]);
          steps.erase(steps.begin() + std::ptrdiff_t(move[k]));
          gone.erase(gone.begin() + std::ptrdiff_t(move[k]));
          steps.insert(steps.begin() + std::ptrdiff_t(b), std::move(st));
          gone.insert(gone.begin() + std::ptrdiff_t(b), false);
          --b;
        }
        index_writers();
        again = true;
        break;
      }
    }
  }
  drop_gone(steps, gone);
}

// Elementwise Steps over the same shape are merged when B (later) shares an input with A or
// reads A's outputs, only element for element. The merged Step goes where A was when all of
// B's other inputs are written before A, else where B was when no Step between them reads A's
// outputs; otherwise the pair is left alone. In two rounds: first each Step with the Step that
// writes what it reads (vertical), then Steps that share an input (horizontal). Horizontal first
// would leave producers behind: AdamW's parameter update of one tensor joins the update of
// another of its shape through the step-size scalars they share, and the moment update it reads
// then finds no later Step to join (the benchmark GPT: 53 update Steps where 9 shapes suffice).
// A round merges each Step at most once, so each kind repeats until nothing merges (a moment
// update, then the other moment's, into the parameter's update: two vertical rounds), at most 8
// rounds each, a bound on compile time (a chain left longer stays correct, in more Steps).
static bool merge_elementwise_round(Plan& plan, bool horizontal);

// S over shape s instead (the same positions in the same order: equal element counts): its loads'
// maps reshaped, each still one view; false where that is not possible or S reads its domain's
// shape (Iota). GELU's value, computed in the shape its product reads ([1024, 512]), and its
// derivative saved for the backward ([16, 64, 512]) merge so.
static bool reshaped(kir::Step& S, const Shape& s) {
  if (numel(S.shape) != numel(s)) return false;
  for (kir::Instr& in : S.program) {
    if (in.code == kir::Code::Iota) return false;
    if (in.code != kir::Code::Load) continue;
    kir::IndexMap m = in.map.reshape(s);
    if (!m.single()) return false;
    in.map = std::move(m);
  }
  S.shape = s;
  return true;
}
// A and B (already in A's shape) read slot x, not a scalar, at the same elements: position p of
// both domains loads the same element of x. Only such siblings merge across shapes: Steps of
// equal element counts that share only a scalar (clip_grad_norm's coefficient, read by the
// scaling of gradients of different shapes) gain nothing from one loop.
static bool same_elements(const Plan& plan, const kir::Step& A, const kir::Step& B, int x) {
  if (numel(plan.slots[size_t(x)].shape) <= 1) return false;
  for (const kir::Instr& a : A.program)
    if (a.code == kir::Code::Load && A.inputs[a.input] == x)
      for (const kir::Instr& b : B.program)
        if (b.code == kir::Code::Load && B.inputs[b.input] == x && a.map == b.map) return true;
  return false;
}
void merge_elementwise(Plan& plan) {
  for (bool horizontal : {false, true}) {
    int round = 0;
    while (round++ < 8 && merge_elementwise_round(plan, horizontal)) {
    }
  }
  drop_unread_outputs(plan);
}

static bool merge_elementwise_round(Plan& plan, bool horizontal) {
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
      std::vector<int> cands;
      if (horizontal) cands = readers_of[x];
      if (writer[x] >= 0 && steps[writer[x]].kind == kir::StepKind::Elementwise) cands.push_back(writer[x]);
      for (int a : cands) {
        if (gone[a] || a == int(b)) continue;
        kir::Step& A = steps[a];
        if (A.program.size() + B.program.size() > 2 * kMaxFragInstrs) continue;
        kir::Step Bs;  // B in A's shape, where it differs
        if (A.shape != B.shape && (!horizontal || !(Bs = B, reshaped(Bs, A.shape)) || !same_elements(plan, A, Bs, x))) continue;
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
        // Nor earlier than a Step reading a parameter B reads: B's new value could no longer
        // be written into that parameter's buffer (AdamW's update moved up to its moment
        // update, before the backward product that still reads the weight).
        for (size_t m = a + 1; m < b && at_a; ++m)
          for (int y : steps[m].inputs)
            at_a &= gone[m] || plan.slots[size_t(y)].kind != kir::SlotKind::Param || !std::count(B.inputs.begin(), B.inputs.end(), y);
        bool at_b = true;
        for (size_t m = a + 1; m < b && at_b; ++m) {
          if (gone[m]) continue;
          for (int y : steps[m].inputs) at_b &= !std::count(outs.begin(), outs.end(), y);
        }
        if (at_a || at_b) {
          target = a;
          if (A.shape != B.shape) B = std::move(Bs);
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
  const bool merged = std::count(gone.begin(), gone.end(), true) > 0;
  drop_gone(steps, gone);
  return merged;
}

// Reduce Steps over the same domain, axes, op, shape and dtype that read a slot in common and do
// not read each other's outputs (siblings: a batch norm's sums of d and d^2, its backward's four
// sums over the gradient and the input) become one Step with several outputs, which reads the
// input once. The later Step B joins the earlier A at A's place when B's inputs are all written
// before A, else at B's place when no Step between them reads A's outputs (and the same rule as
// above for a parameter B reads, where B's output has its bytes). Only for a target that runs such Steps (Target::multi_reduce).
void merge_reduces(Plan& plan) {
  auto& steps = plan.steps;
  std::vector<int> writer(plan.slots.size(), -1);
  for (size_t s = 0; s < steps.size(); ++s)
    for (int o : steps[s].outputs()) writer[size_t(o)] = int(s);
  std::vector<bool> gone(steps.size(), false);
  std::vector<int> reduces;  // indices of the Reduce Steps before b, not gone
  auto shares_input = [](const kir::Step& x, const kir::Step& y) {
    for (int i : y.inputs)
      if (std::count(x.inputs.begin(), x.inputs.end(), i)) return true;
    return false;
  };
  for (size_t b = 0; b < steps.size(); ++b) {
    if (steps[b].kind != kir::StepKind::Reduce) continue;
    bool merged = false, at_b_merged = false;
    for (int a : reduces) {
      if (gone[size_t(a)]) continue;
      kir::Step& A = steps[size_t(a)];
      const kir::Step& B = steps[b];
      if (A.domain != B.domain || A.axes != B.axes || A.reduce_op != B.reduce_op || A.shape != B.shape ||
          A.dtype != B.dtype || A.outputs().size() + B.outputs().size() > size_t(kir::kMaxReduceOutputs) ||
          A.program.size() + B.program.size() > 2 * kMaxFragInstrs || !shares_input(A, B))
        continue;
      std::vector<int> outs = A.outputs();
      bool ok = true;
      for (int y : B.inputs) ok &= !std::count(outs.begin(), outs.end(), y);
      if (!ok) continue;
      // (a Reduce's output is never donated into a parameter: donate.cpp takes elementwise and copy
      // producers only, so B may read a parameter earlier)
      bool at_a = true;
      for (int y : B.inputs) at_a &= writer[size_t(y)] < a;
      bool at_b = !at_a;
      for (size_t m = size_t(a) + 1; m < b && at_b; ++m)
        if (!gone[m])
          for (int y : steps[m].inputs) at_b &= !std::count(outs.begin(), outs.end(), y);
      if (at_a) {
        absorb(A, B);
        for (int o : A.outputs()) writer[size_t(o)] = a;
        gone[b] = true;
      } else if (at_b) {
        std::swap(steps[size_t(a)], steps[b]);
        absorb(steps[b], steps[size_t(a)]);
        for (int o : steps[b].outputs()) writer[size_t(o)] = int(b);
        gone[size_t(a)] = true;
        at_b_merged = true;
      } else {
        continue;
      }
      merged = true;
      break;
    }
    if (!merged || at_b_merged) reduces.push_back(int(b));  // the merged Step, now at b, may take a third sibling
  }
  drop_gone(steps, gone);
}

}  // namespace tessera::compiler
