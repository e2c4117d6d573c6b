#include "backends/cpu/row_loops.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <list>

#include "backends/cpu/interpreter.h"
#include "backends/cpu/native_loops.h"

namespace tessera::backends::cpu {
namespace {

std::atomic<uint64_t> launches{0};

bool lanes32(DType t) { return t == DType::Float32 || t == DType::Int32; }

// Elements between consecutive positions of a row for view v (dims [first, rank) of dom are the
// row), or -1 when the row does not walk it evenly.
int64_t row_stride(const kir::View& v, const Shape& dom, size_t first) {
  int64_t per = -1, run = 1;
  for (size_t d = dom.size(); d > first; --d) {
    if (dom[d - 1] == 1) continue;
    const int64_t s = v.strides[d - 1];
    if (s < 0 || (per < 0 ? s % run != 0 : s != per * run)) return -1;
    per = s / run;
    run *= dom[d - 1];
  }
  return per < 0 ? 0 : per;
}

// The part of `prog` that computes `targets`, each reduction read as a broadcast load of its
// value (red[k]: instruction k's reduction number, or -1), as a native loop.
bool build_part(RowPart& part, const std::vector<Instr>& prog, const std::vector<int>& red,
                const std::vector<int64_t>& per, const std::vector<int>& targets) {
  std::vector<uint8_t> need(prog.size(), 0);
  for (int t : targets) need[size_t(t)] = 1;
  for (size_t k = prog.size(); k-- > 0;)
    if (need[k] && red[k] < 0)
      for (int o : {prog[k].a, prog[k].b, prog[k].c})
        if (o >= 0) need[size_t(o)] = 1;
  std::vector<Instr> sub;
  std::vector<int64_t> stride;
  std::vector<int> src, at(prog.size(), -1);
  for (size_t k = 0; k < prog.size(); ++k) {
    if (!need[k]) continue;
    at[k] = int(sub.size());
    if (red[k] >= 0) {
      sub.push_back(Instr::load(-1, DType::Float32, {}));
      stride.push_back(0), src.push_back(-1 - red[k]);
      continue;
    }
    Instr I = prog[k];
    if (I.dtype == DType::Int64) I.dtype = DType::Int32;  // compared only, its values within int32 (build_row_loops)
    for (int* o : {&I.a, &I.b, &I.c})
      if (*o >= 0) *o = at[size_t(*o)];
    stride.push_back(I.code == Code::Load ? per[k] : 0);
    src.push_back(I.code == Code::Load ? int(k) : 0);
    sub.push_back(std::move(I));
  }
  part.prog = std::move(sub);
  jit::Spec spec;
  spec.prog = &part.prog;
  spec.stride = stride;
  for (int t : targets) spec.results.push_back(at[size_t(t)]);
  spec.early.assign(targets.size(), 1);  // outputs never overlap inputs (run_row_loops checks)
  part.loop = jit::build(spec);
  if (!part.loop) return false;
  for (int l : part.loop->loads()) part.srcs.push_back(src[size_t(l)]);
  return true;
}

}  // namespace

std::unique_ptr<RowLoops> build_row_loops(const Step& st) {
  static const bool off = [] {  // TESSERA_CPU_ROW_LOOPS=0: Row Steps in the interpreter (measuring)
    const char* e = std::getenv("TESSERA_CPU_ROW_LOOPS");
    return e && std::strcmp(e, "0") == 0;
  }();
  if (off) return nullptr;
  const std::vector<Instr>& prog = st.program;
  const Shape& dom = st.domain;
  if (!jit::available() || st.kind != StepKind::Row || prog.empty() || st.row <= 0 || numel(dom) == 0) return nullptr;
  size_t first = dom.size();
  int64_t p = 1;
  while (first > 0 && p < st.row) p *= dom[--first];
  if (p != st.row) return nullptr;
  auto rl = std::make_unique<RowLoops>();
  rl->row = st.row;
  rl->outer.assign(dom.begin(), dom.begin() + std::ptrdiff_t(first));
  rl->outer_strides.resize(prog.size());
  std::vector<int64_t> per(prog.size(), 0);
  std::vector<int> red(prog.size(), -1), reds;
  // int64 values (a causal mask's positions) only compared by ==, <, >: as int32 lanes, a
  // constant when it fits, a load when every value it spans does (checked per launch).
  std::vector<uint8_t> compared(prog.size(), 1);
  for (const Instr& I : prog)
    for (int o : {I.a, I.b, I.c})
      if (o >= 0) compared[size_t(o)] &= I.code == Code::Eq || I.code == Code::Lt || I.code == Code::Gt;
  rl->wide.assign(prog.size(), 0);
  for (size_t k = 0; k < prog.size(); ++k) {
    const Instr& I = prog[k];
    if (I.dtype == DType::Int64 && (I.code == Code::Load || I.code == Code::Const)) {
      if (!compared[k] || (I.code == Code::Const && !(std::abs(I.value) < 2147483648.0 && std::trunc(I.value) == I.value))) return nullptr;
      rl->wide[k] = 1;
    }
    if (I.code == Code::Load) {
      if (I.map.views.size() != 1 || !(lanes32(I.dtype) || rl->wide[k])) return nullptr;
      const kir::View& v = I.map.views[0];
      if (v.shape != dom || v.masked() || v.offset < 0) return nullptr;
      for (int64_t s : v.strides)
        if (s < 0) return nullptr;
      per[k] = row_stride(v, dom, first);
      if (per[k] < 0 || per[k] >= (int64_t(1) << 24)) return nullptr;
      rl->outer_strides[k].assign(v.strides.begin(), v.strides.begin() + std::ptrdiff_t(first));
    } else if (I.code == Code::RowSum || I.code == Code::RowMax) {
      if (I.dtype != DType::Float32 || prog[size_t(I.a)].dtype != DType::Float32) return nullptr;
      red[k] = int(reds.size());
      reds.push_back(int(k));
    }
  }
  for (int k : reds) {
    RowPart part;
    const Instr& I = prog[size_t(k)];
    part.max = I.code == Code::RowMax;
    const Instr& A = prog[size_t(I.a)];
    if (A.code == Code::Load && A.dtype == DType::Float32 && per[size_t(I.a)] == 1) part.in_place = I.a;
    else if (red[size_t(I.a)] >= 0 || !build_part(part, prog, red, per, {I.a})) return nullptr;
    rl->parts.push_back(std::move(part));
  }
  const std::vector<int> results = results_of(st);
  std::vector<int> targets;
  for (int r : results) {
    if (!lanes32(prog[size_t(r)].dtype)) return nullptr;
    rl->result_red.push_back(red[size_t(r)]);
    if (red[size_t(r)] < 0) targets.push_back(r);
  }
  if (st.dtype != prog.back().dtype) return nullptr;
  RowPart last;
  if (!targets.empty() && !build_part(last, prog, red, per, targets)) return nullptr;
  rl->parts.push_back(std::move(last));
  return rl;
}

bool run_row_loops(const RowLoops& rl, const Step& st, const LaunchArgs& args) {
  const std::vector<Instr>& prog = st.program;
  const int64_t total = numel(st.domain), row = rl.row, nrows = total / row;
  const bool per_row = numel(st.shape) != total;
  auto in = inputs_of(st, args);
  // Each load's first element and the bytes it spans; outputs must not overlap them.
  std::vector<const char*> base(prog.size(), nullptr);
  std::vector<std::pair<const char*, const char*>> spans;
  std::list<std::vector<int32_t>> narrowed;
  for (size_t k = 0; k < prog.size(); ++k) {
    const Instr& I = prog[k];
    if (I.code != Code::Load) continue;
    const kir::View& v = I.map.views[0];
    const size_t size = itemsize(I.dtype);
    base[k] = static_cast<const char*>(in[size_t(I.input)]) + v.offset * int64_t(size);
    int64_t last = 0;
    for (size_t d = 0; d < v.shape.size(); ++d) last += v.strides[d] * (v.shape[d] - 1);
    spans.push_back({base[k], base[k] + (last + 1) * int64_t(size)});
    if (rl.wide[k]) {  // int64 as int32 lanes: the elements it spans, when they all fit
      const int64_t* w = reinterpret_cast<const int64_t*>(base[k]);
      std::vector<int32_t>& c = narrowed.emplace_back(size_t(last + 1));
      for (int64_t i = 0; i <= last; ++i) {
        if (w[i] < std::numeric_limits<int32_t>::min() || w[i] > std::numeric_limits<int32_t>::max()) return false;
        c[size_t(i)] = int32_t(w[i]);
      }
      base[k] = reinterpret_cast<const char*>(c.data());
    }
  }
  const std::vector<int> results = results_of(st);
  const size_t nres = results.size();
  std::vector<char*> outs(nres);
  for (size_t j = 0; j < nres; ++j) {
    const bool main = j + 1 == nres;
    outs[j] = static_cast<char*>(args.slots[main ? st.output : st.more_outputs[j]]);
    const char* hi = outs[j] + (main && !per_row ? total : nrows) * 4;
    for (const auto& [lo, end] : spans)
      if (lo < hi && outs[j] < end) return false;
  }
  const RowPart& fin = rl.parts.back();
  const size_t nred = rl.parts.size() - 1;
  const int64_t rows_per_tile = std::max<int64_t>(1, kTile / row), ntiles = (nrows + rows_per_tile - 1) / rows_per_tile;
#pragma omp parallel for schedule(static) if (total >= kParallelMin && ntiles > 1)
  for (int64_t t = 0; t < ntiles; ++t) {
    thread_local std::vector<float> buf;
    if (buf.size() < size_t(row) * (nres + 1)) buf.resize(size_t(row) * (nres + 1));
    float red[64];
    std::vector<float> reds(nred);
    float* rv = nred <= 64 ? red : reds.data();
    const void* p[kMaxLoopPtrs];
    const char* at[256];
    std::vector<const char*> at_big(prog.size() > 256 ? prog.size() : 0);
    const char** a = prog.size() > 256 ? at_big.data() : at;
    int64_t idx[32];
    const int64_t g0 = t * rows_per_tile, g1 = std::min(nrows, g0 + rows_per_tile);
    unravel(g0, rl.outer, idx);
    for (int64_t g = g0; g < g1; ++g) {
      for (size_t k = 0; k < prog.size(); ++k) {
        if (!base[k]) continue;
        int64_t o = 0;
        const std::vector<int64_t>& os = rl.outer_strides[k];
        for (size_t d = 0; d < os.size(); ++d) o += idx[d] * os[d];
        a[k] = base[k] + o * 4;
      }
      auto fill = [&](const RowPart& part) {
        size_t i = 0;
        for (int s : part.srcs) p[i++] = s >= 0 ? static_cast<const void*>(a[size_t(s)]) : &rv[size_t(-1 - s)];
        return i;
      };
      for (size_t s = 0; s < nred; ++s) {
        const RowPart& part = rl.parts[s];
        const float* v = buf.data();
        if (part.in_place >= 0) {
          v = reinterpret_cast<const float*>(a[size_t(part.in_place)]);
        } else {
          p[fill(part)] = buf.data();
          (*part.loop)(p, row);
        }
        rv[s] = part.max ? run_max(v, row, -std::numeric_limits<float>::infinity()) : float(run_sum(v, row));
      }
      if (fin.loop) {
        size_t i = fill(fin);
        for (size_t j = 0; j < nres; ++j) {
          if (rl.result_red[j] >= 0) continue;
          const bool dense = j + 1 == nres && !per_row;
          p[i++] = dense ? static_cast<void*>(outs[j] + g * row * 4) : buf.data() + (j + 1) * size_t(row);
        }
        (*fin.loop)(p, row);
      }
      for (size_t j = 0; j < nres; ++j) {
        if (j + 1 == nres && !per_row) {  // a reduction's value as the result at every position
          if (rl.result_red[j] >= 0)
            for (int64_t i = 0; i < row; ++i) std::memcpy(outs[j] + (g * row + i) * 4, &rv[size_t(rl.result_red[j])], 4);
          continue;
        }
        const float* v = rl.result_red[j] >= 0 ? &rv[size_t(rl.result_red[j])] : buf.data() + (j + 1) * size_t(row);
        std::memcpy(outs[j] + g * 4, v, 4);
      }
      bump(idx, rl.outer);
    }
  }
  launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

uint64_t row_loop_launches() { return launches.load(std::memory_order_relaxed); }

}  // namespace tessera::backends::cpu
