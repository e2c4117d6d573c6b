#include "backends/cpu/native_loops.h"

namespace tessera::backends::cpu {
namespace {

// Runs of fewer positions stay with the interpreter (a call per few positions), unless a call
// covers at least kMinCall positions (the runs along the outer dim next to them, stepped through
// by the loop: a 7-wide pooling output's rows).
constexpr int64_t kMinRun = 8, kMinCall = 32;

// The run of views over domain dom: the longest suffix of the domain along which each view walks
// memory evenly, unmasked. Returns its length; `first` is where it starts among dom's dims and
// per[l] view l's elements from one position to the next (0: constant, 1: dense, more: gathered).
int64_t even_run(const std::vector<const kir::View*>& views, const Shape& dom, size_t& first, std::vector<int64_t>& per) {
  per.assign(views.size(), -1);
  int64_t run = 1;
  for (first = dom.size(); first > 0; --first) {
    const size_t d = first - 1;
    if (dom[d] == 1) continue;
    bool ok = true;
    for (size_t l = 0; l < views.size() && ok; ++l) {
      const kir::View& v = *views[l];
      const int64_t stride = v.strides[d];
      ok = per[l] < 0 ? stride % run == 0 : stride == per[l] * run;
      ok &= !v.masked() || (v.lo[d] <= 0 && v.hi[d] >= dom[d]);
    }
    if (!ok) break;
    for (size_t l = 0; l < views.size(); ++l) per[l] = views[l]->strides[d] / run;
    run *= dom[d];
  }
  return run;
}

// What run_loop needs of load i of the loop (its view v over domain dom, runs from dim `first`).
NativeLoop::Load describe_load(NativeLoop& nl, const Instr& I, int64_t stride, const Shape& dom, size_t first, bool out) {
  const kir::View& v = I.map.views[0];
  NativeLoop::Load L;
  L.outer_strides.assign(v.strides.begin(), v.strides.begin() + std::ptrdiff_t(first));
  L.span = 1;
  for (size_t d = 0; d < dom.size(); ++d) {
    const int64_t lo = v.masked() ? std::max<int64_t>(v.lo[d], 0) : 0, hi = v.masked() ? std::min(v.hi[d], dom[d]) : dom[d];
    if (lo >= hi) L.span = 0;
    if (L.span) L.first += v.strides[d] * lo, L.span += v.strides[d] * (hi - 1 - lo);
  }
  if (v.masked()) {
    L.lo.assign(v.lo.begin(), v.lo.begin() + std::ptrdiff_t(first));
    L.hi.assign(v.hi.begin(), v.hi.begin() + std::ptrdiff_t(first));
    nl.masked_last |= first > 0 && (L.lo.back() > 0 || L.hi.back() < dom[first - 1]);
    L.pad.assign(size_t((nl.run - 1) * stride + 1), float(I.value));
  }
  L.whole = !out && I.map.is_contiguous();
  L.stride = stride;
  return L;
}

}  // namespace

// Loads walk the run densely, not at all, or by a fixed stride (gathered). With an output view
// (walked evenly too), loads may be masked along the other dims (a pooling gradient's taps, each
// a block of the interleaved domain), run_loop reading their pad for a masked run.
void build_loop(NativeLoop& nl, const std::vector<Instr>& prog, const Shape& dom, const std::vector<int>& results,
                const std::vector<uint8_t>& early, bool may_stream, const kir::View* out, bool two_dims) {
  if (!jit::available() || numel(dom) == 0) return;
  std::vector<const kir::View*> views;  // the loads', then the output's
  for (const Instr& I : prog) {
    if (I.code != Code::Load) continue;
    if (I.map.views.size() != 1 || I.map.views[0].shape != dom || (I.map.views[0].masked() && !out)) return;
    views.push_back(&I.map.views[0]);
  }
  if (out) views.push_back(out);
  for (const kir::View* v : views)
    for (int64_t stride : v->strides)
      if (stride < 0) return;
  std::vector<int64_t> per, per2;
  size_t first = 0;
  int64_t run = even_run(views, dom, first, per), inner = 0;
  // A run of 2 or 4 positions (a pooling output's short rows, each load gathered at its stride)
  // takes the next dim in: 8 positions are then 8 / run rows, each load read at its two-dim
  // pattern (dense stores); the calls' rows step along the dim before (when there is one).
  if (two_dims && !out && run < kMinRun && 8 % run == 0 && run > 1 && first > 1) {
    const size_t d = first - 1;
    bool ok = true;
    for (const kir::View* v : views) ok &= !v->masked();
    if (ok) {
      for (const kir::View* v : views) per2.push_back(v->strides[d]);
      inner = run, run *= dom[d], first = d;
    }
  }
  const int64_t per_call = run * (first > 0 ? dom[first - 1] : 1);
  if ((run < kMinRun && (run < 4 || per_call < kMinCall)) || int(views.size() + results.size()) > kMaxLoopPtrs) return;
  if (out && (per.back() == 0 || results.size() != 1)) return;

  jit::Spec spec;
  spec.prog = &prog;
  spec.stride.assign(prog.size(), 0);
  spec.inner = inner;
  if (inner) spec.stride2.assign(prog.size(), 0);
  for (size_t i = 0, l = 0; i < prog.size(); ++i)
    if (prog[i].code == Code::Load) {
      if (inner) spec.stride2[i] = per2[l];
      spec.stride[i] = per[l++];
    }
  spec.results = results;
  spec.early = early;
  if (out) spec.out_stride = per.back();
  nl.loop = jit::build(spec);
  if (!nl.loop) return;
  if (may_stream && !out && run == numel(dom) && run * 4 >= kStreamMin) spec.stream = true, nl.stream = jit::build(spec);
  nl.run = run;
  nl.inner = inner;
  nl.outer.assign(dom.begin(), dom.begin() + std::ptrdiff_t(first));
  if (out) {
    nl.out_outer_strides.assign(out->strides.begin(), out->strides.begin() + std::ptrdiff_t(first));
    nl.out_offset = out->offset, nl.out_stride = per.back();
  }
  for (int i : nl.loop->loads()) nl.loads.push_back(describe_load(nl, prog[size_t(i)], spec.stride[size_t(i)], dom, first, out));
}

void loop_range(const NativeLoop& nl, const std::vector<char*>& base, int64_t start, int64_t n, float* out) {
  loop_range(nl, base, start, n, &out, 1);
}

void loop_range(const NativeLoop& nl, const std::vector<char*>& base, int64_t start, int64_t n, float* const* outs,
                size_t nouts) {
  const size_t nloads = nl.loop->loads().size();
  const void* p[kMaxLoopPtrs];
  int64_t idx[32];
  for (int64_t pos = start, end = start + n; pos < end;) {
    const int64_t j = pos % nl.run, len = std::min(nl.run - j, end - pos);
    unravel(pos / nl.run, nl.outer, idx);
    for (size_t i = 0; i < nloads; ++i) {
      const NativeLoop::Load& L = nl.loads[i];
      p[i] = base[i] + (L.offset(idx) + j * L.stride) * 4;
    }
    for (size_t r = 0; r < nouts; ++r) p[nloads + r] = outs[r] + (pos - start);
    (*nl.loop)(p, len);
    pos += len;
  }
}

namespace {
thread_local uint64_t tile_calls = 0;  // per thread: no cache line shared by the workers in the hot path
}  // namespace

void loop_rows(const NativeLoop& nl, const std::vector<char*>& base, int64_t start, int64_t n, int64_t rows, int64_t stride,
               float* out) {
  loop_rows(nl, base, start, n, rows, stride, &out, 1);
}

void loop_rows(const NativeLoop& nl, const std::vector<char*>& base, int64_t start, int64_t n, int64_t rows, int64_t stride,
               float* const* outs, size_t nouts) {
  const size_t nloads = nl.loop->loads().size();
  auto per_row = [&] {
    float* o[kMaxLoopPtrs];
    for (int64_t i = 0; i < rows; ++i) {
      for (size_t r = 0; r < nouts; ++r) o[r] = outs[r] + i * stride;
      loop_range(nl, base, start + i * stride, n, o, nouts);
    }
  };
  if (rows < 2 || n < 16) return per_row();
  // Each range inside one run, and every load's first element of range i at its first one's
  // plus i times a step (a view's runs at even strides: a batch of [16, 64, N] rows walks from
  // one 64-row block into the next at 64 rows' stride).
  const void* p[kMaxLoopPtrs];
  int64_t first[kMaxLoopPtrs], step[kMaxLoopPtrs], idx[32] = {};
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t pos = start + i * stride, j = pos % nl.run;
    if (j + n > nl.run) return per_row();
    unravel(pos / nl.run, nl.outer, idx);
    for (size_t l = 0; l < nloads; ++l) {
      const NativeLoop::Load& L = nl.loads[l];
      if (!L.lo.empty()) return per_row();
      const int64_t at = L.offset(idx) + j * L.stride;
      if (i == 0) first[l] = at;
      else if (i == 1) step[l] = at - first[l];
      else if (at != first[l] + i * step[l]) return per_row();
    }
  }
  for (size_t l = 0; l < nloads; ++l) p[l] = base[l] + first[l] * 4, step[l] *= 4;
  for (size_t r = 0; r < nouts; ++r) p[nloads + r] = outs[r], step[nloads + r] = stride * 4;
  (*nl.loop)(p, n, rows, step);
  ++tile_calls;
}

uint64_t loop_rows_tile_calls() { return tile_calls; }

void load_bases(const jit::Loop& loop, const std::vector<Instr>& prog, const std::vector<const void*>& in,
                std::vector<char*>& base) {
  base.clear();
  for (int l : loop.loads()) {
    const Instr& I = prog[size_t(l)];
    base.push_back(const_cast<char*>(static_cast<const char*>(in[size_t(I.input)])) + I.map.views[0].offset * 4);
  }
}

const jit::Loop* loop_for(const NativeLoop& nl, const std::vector<Instr>& prog, const Step& st,
                          const std::vector<const void*>& in, const LaunchArgs& args, std::vector<char*>& base) {
  if (!nl.loop) return nullptr;
  const jit::Loop* loop = nl.stream ? nl.stream.get() : nl.loop.get();
  const std::vector<int>& loads = loop->loads();
  load_bases(*loop, prog, in, base);
  const size_t out_bytes = size_t(numel(st.shape)) * 4;
  for (size_t o = 0; o <= st.more_outputs.size(); ++o) {
    const int slot = o == 0 ? st.output : st.more_outputs[o - 1];
    char* out = static_cast<char*>(args.slots[slot]);
    if (loop->streams() && reinterpret_cast<uintptr_t>(out) % uintptr_t(4 * loop->lanes())) loop = nl.loop.get();
    for (size_t l = 0; l < loads.size(); ++l) {
      const NativeLoop::Load& L = nl.loads[l];
      const char* lo = base[l] + L.first * 4;
      const bool overlap = L.span && lo < out + out_bytes && out < lo + L.span * 4;
      const bool same = base[l] == out && L.whole && st.inputs[size_t(prog[size_t(loads[l])].input)] == slot;
      if (overlap && !same) return nullptr;
    }
    base.push_back(out + nl.out_offset * 4);
  }
  return loop;
}

// Tiles of a single run, else blocks of runs. The runs along the last outer dim are one call (each
// pointer stepping by that dim's stride); the pointers are placed along the other outer dims per
// call. A masked load reads its pad for the runs outside its mask (the pad stays put along the
// call's runs).
void run_loop(const NativeLoop& nl, const jit::Loop& loop, const std::vector<char*>& base, int64_t total) {
  const size_t nloads = loop.loads().size(), nptr = base.size();
  const bool one_run = nl.run == total && !nl.inner;  // (a two-dim run's positions are not at multiples of a stride)
  const int64_t per = one_run ? kTile : std::max<int64_t>(1, kTile / nl.run);  // positions or runs per task
  const int64_t units = one_run ? total : total / nl.run, ntasks = (units + per - 1) / per;
  const size_t last = nl.outer.empty() ? 0 : nl.outer.size() - 1;
  const bool strided_out = !nl.out_outer_strides.empty();
  auto out_offset = [&](const int64_t* idx) {
    int64_t o = 0;
    for (size_t d = 0; d < nl.out_outer_strides.size(); ++d) o += idx[d] * nl.out_outer_strides[d];
    return o;
  };
  const bool masked = std::any_of(nl.loads.begin(), nl.loads.end(), [](const auto& L) { return !L.lo.empty(); });
  int64_t steps[kMaxLoopPtrs];
  for (size_t i = 0; i < nptr && !one_run; ++i)
    steps[i] = (i < nloads ? nl.loads[i].outer_strides[last] : strided_out ? nl.out_outer_strides[last] : nl.run) * 4;
#pragma omp parallel for schedule(static) if (total >= kParallelMin)
  for (int64_t t = 0; t < ntasks; ++t) {
    const void* p[kMaxLoopPtrs];
    int64_t step[kMaxLoopPtrs];
    const int64_t u0 = t * per, u1 = std::min(units, u0 + per);
    if (one_run) {  // a load constant over the domain stays put
      for (size_t i = 0; i < nptr; ++i) p[i] = base[i] + u0 * (i < nloads ? nl.loads[i].stride : nl.out_stride) * 4;
      loop(p, u1 - u0);
      continue;
    }
    int64_t idx[32];
    unravel(u0, nl.outer, idx);
    for (int64_t r = u0; r < u1;) {
      const int64_t rows = nl.masked_last ? 1 : std::min(u1 - r, nl.outer[last] - idx[last]);
      if (masked) std::copy(steps, steps + nptr, step);
      for (size_t i = 0; i < nloads; ++i) {
        const NativeLoop::Load& L = nl.loads[i];
        if (L.lo.empty() || L.valid(idx)) p[i] = base[i] + L.offset(idx) * 4;
        else p[i] = L.pad.data(), step[i] = 0;
      }
      for (size_t i = nloads; i < nptr; ++i) p[i] = base[i] + (strided_out ? out_offset(idx) : r * nl.run) * 4;
      loop(p, nl.run, rows, masked ? step : steps);
      r += rows;
      idx[last] += rows - 1;
      bump(idx, nl.outer);
    }
  }
}

}  // namespace tessera::backends::cpu
