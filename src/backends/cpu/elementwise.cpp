// Elementwise and Row Steps: a program over every position of the output, through its native
// loop where it has one (native_loops.h), else the interpreter over tiles; Row Steps over tiles of
// whole rows (through their native loops where they build, row_loops.h).
#include <atomic>
#include <numeric>
#include <optional>

#include "backends/cpu/copies.h"
#include "backends/cpu/interpreter.h"
#include "backends/cpu/kernel.h"
#include "backends/cpu/native_loops.h"
#include "backends/cpu/reg_alloc.h"
#include "backends/cpu/row_loops.h"
#include "backends/cpu/views.h"
#include "core/half.h"

namespace tessera::backends::cpu {
namespace {

std::atomic<uint64_t> elementwise_launches{0};

// An Elementwise Step (or a Copy that is not a plain view copy): its program and domain as run
// (loads' views coalesced, permuted along with the domain).
struct ElementwiseKernel final : CpuKernel {
  std::vector<Instr> program;
  RegPlan regs;
  Shape domain;
  // Steps walked in a permuted order (interleave_order): where each position's output element
  // lies, as a view over `domain`.
  std::optional<kir::View> out;
  std::vector<int> last_read;  // per instruction of `program`: its last reader (results: past the end)
  // The native loop (Elementwise only). A Step with `out` runs its permuted program before
  // coalescing (walk_program, kept only when the loop is built) and stores through the
  // uncoalesced permuted output view. A loop built over the Step's domain with dims merged
  // (merge_dims) runs that program (walk_program too, its stores dense in order).
  NativeLoop loop;
  std::vector<Instr> walk_program;
  // A float32 program whose one result is rounded to bfloat16/float16 (autocast's operands: a
  // weight's or an activation's copy for a product): the program before the rounding as a native
  // loop into a per-thread float32 tile, rounded from there (`narrow_prog`: that program).
  NativeLoop narrow;
  std::vector<Instr> narrow_prog;

  void run(const Step& st, const LaunchArgs& args) const override;
  // The interpreter's launch: set up once (tiles), then tile by tile (run_tile), on any thread.
  struct Tiles {
    std::vector<const void*> in;
    std::vector<char*> direct;
    bool stream = false;
    int64_t total = 0, ntiles = 0;
  };
  Tiles tiles(const Step& st, const LaunchArgs& args, std::vector<const void*> in) const;
  void run_tile(const Step& st, const LaunchArgs& args, const Tiles& ts, int64_t t) const;
  bool run_narrowing(const Step& st, const std::vector<const void*>& in, const LaunchArgs& args) const;
};

// The narrowing loop of an Elementwise Step with one output, stored densely, whose last
// instruction rounds a float32 value to bfloat16/float16, when the rest is a native loop without
// masked loads (loop_range reads every load in place).
void build_narrowing(ElementwiseKernel& k, const Step& st) {
  const Instr& last = st.program.back();
  if (st.kind != StepKind::Elementwise || k.loop.loop || k.out || !st.more_outputs.empty() || last.code != Code::Cast ||
      (st.dtype != DType::BFloat16 && st.dtype != DType::Float16) || st.program[size_t(last.a)].dtype != DType::Float32)
    return;
  k.narrow_prog.assign(st.program.begin(), st.program.end() - 1);
  build_loop(k.narrow, k.narrow_prog, st.shape, {last.a}, {1}, false);
  for (const NativeLoop::Load& L : k.narrow.loads)
    if (!L.lo.empty()) k.narrow.loop.reset();
}

// The order to walk an elementwise domain in, or {} for its own: when its last dim is short (at
// most 4: pooling windows, the interleaved taps of a pooling gradient) after a long one, the last
// (up to) four dims are reordered short ones first, so loads and masks run along the long dims
// ([N, C, OH, kH, OW, kW] as [N, C, kH, kW, OH, OW]: each pooling tap a dense block).
std::vector<int64_t> interleave_order(const Step& st) {
  const Shape& s = st.shape;
  const size_t r = s.size();
  if (r < 2 || s[r - 1] > 4 || s[r - 2] <= 4) return {};
  for (const Instr& I : st.program)
    if (I.code == Code::Rng) return {};  // Philox streams follow the position
  std::vector<int64_t> perm(r);
  std::iota(perm.begin(), perm.end(), int64_t(0));
  auto tail = perm.end() - std::ptrdiff_t(std::min<size_t>(r, 4));
  std::stable_partition(tail, perm.end(), [&](int64_t d) { return s[size_t(d)] <= 4; });
  return perm;
}

// `prog` over its domain permuted by perm, or {} when a load is then no longer one strided view.
std::vector<Instr> permuted(const std::vector<Instr>& prog, const std::vector<int64_t>& perm) {
  std::vector<Instr> r = prog;
  for (Instr& I : r) {
    if (I.code == Code::Load) {
      I.map = I.map.permute(perm);
      if (I.map.effective_top() != 0) return {};
    }
    if (I.code == Code::Iota) I.i0 = std::find(perm.begin(), perm.end(), I.i0) - perm.begin();
  }
  return r;
}

// The Step's program as run: in interleave_order when every load stays one strided view there
// (walk_out: the permuted output view), with each load's view coalesced.
void prepare(ElementwiseKernel& k, const Step& st, kir::View& walk_out) {
  k.program = st.program;
  k.domain = st.shape;
  if (std::vector<int64_t> perm = interleave_order(st); !perm.empty()) {
    if (std::vector<Instr> prog = permuted(st.program, perm); !prog.empty()) {
      k.program = k.walk_program = std::move(prog);
      walk_out = kir::IndexMap::contiguous(st.shape).permute(perm).views[0];
      k.domain = walk_out.shape;
      k.out = coalesced(walk_out);
    }
  }
  for (Instr& I : k.program)
    if (I.code == Code::Load && I.map.views.size() == 1) I.map.views[0] = coalesced(I.map.views[0]);
}

// `prog` over `dom` with adjacent dims merged where every load walks them as one (the output,
// dense in order, always does): a permuted copy's [64, 4, 4, 6] whose loads walk the middle two
// dims as one is [64, 16, 6]. `prog` itself (and dom unchanged) when a load is not one unmasked
// view over dom, or an instruction names an axis (iota) or a position (rng).
std::vector<Instr> merge_dims(const std::vector<Instr>& prog, Shape& dom) {
  std::vector<Instr> r = prog;
  for (const Instr& I : r)
    if (I.code == Code::Iota || I.code == Code::Rng ||
        (I.code == Code::Load && (I.map.views.size() != 1 || I.map.views[0].shape != dom || I.map.views[0].masked())))
      return r;
  for (size_t d = dom.size(); d-- > 1;) {  // dims d - 1 and d
    bool ok = true;
    for (const Instr& I : r)
      if (I.code == Code::Load) {
        const kir::View& v = I.map.views[0];
        ok &= dom[d - 1] == 1 || dom[d] == 1 || v.strides[d - 1] == v.strides[d] * dom[d];
      }
    if (!ok) continue;
    for (Instr& I : r)
      if (I.code == Code::Load) {
        kir::View& v = I.map.views[0];
        if (dom[d] == 1) v.strides[d] = v.strides[d - 1];
        v.strides.erase(v.strides.begin() + std::ptrdiff_t(d - 1));
        v.shape.erase(v.shape.begin() + std::ptrdiff_t(d - 1));
        v.shape[d - 1] = dom[d - 1] * dom[d];
      }
    dom[d] *= dom[d - 1];
    dom.erase(dom.begin() + std::ptrdiff_t(d - 1));
  }
  return r;
}

// An Elementwise Step's loop: its results stored early unless a later load reads their output. A
// Step walked in interleave_order runs its permuted program over the permuted domain, storing
// through the permuted output view. When that builds no loop, the Step's own order with its dims
// merged (merge_dims) may: a permuted copy's runs of 6 along 16 merged rows per call, or of 4
// taking the next dim in (two_dims; the transformer block's q and v are walked in
// interleave_order, their two outputs more than a loop through an output view stores).
void build_loops(ElementwiseKernel& k, const Step& st, const kir::View& walk_out) {
  if (st.kind != StepKind::Elementwise) return k.walk_program.clear();
  std::vector<int> results{int(st.program.size()) - 1};
  results.insert(results.end(), st.more_results.begin(), st.more_results.end());
  std::vector<uint8_t> early;
  for (size_t j = 0; j < results.size(); ++j) {
    const int slot = j == 0 ? st.output : st.more_outputs[j - 1];
    bool e = true;
    for (size_t i = size_t(results[j]) + 1; i < st.program.size(); ++i)
      e &= !(st.program[i].code == Code::Load && st.inputs[size_t(st.program[i].input)] == slot);
    early.push_back(e);
  }
  if (!k.out) {
    build_loop(k.loop, st.program, st.shape, results, early, true, nullptr, true);
  } else {
    build_loop(k.loop, k.walk_program, walk_out.shape, results, early, false, &walk_out);
    if (!k.loop.loop) k.walk_program.clear();
  }
  if (k.loop.loop) return;
  Shape dom = st.shape;
  std::vector<Instr> prog = merge_dims(st.program, dom);
  if (dom == st.shape && !k.out) return;  // (nothing new to try)
  build_loop(k.loop, prog, dom, results, early, true, nullptr, true);
  if (k.loop.loop) k.walk_program = std::move(prog);
}

// Which results write their output themselves (per instruction: the output's base, else null):
// those computed (not loaded, constant or iota) in the output's own type, stored in row-major
// order, one output per instruction, and -- when the output is also an input (an in-place
// update) -- computed after every load of it has been read for the last time.
std::vector<char*> direct_outputs(const ElementwiseKernel& k, const Step& st, const std::vector<const void*>& in,
                                  const LaunchArgs& args, bool stream) {
  std::vector<char*> direct(k.program.size(), nullptr);
  if (k.out) return direct;
  auto take = [&](int r, int slot) {
    const Instr& R = k.program[size_t(r)];
    if (direct[size_t(r)] || compute_dtype(R.dtype) != R.dtype || R.code == Code::Load || R.code == Code::Const ||
        R.code == Code::Iota)
      return;
    char* out = static_cast<char*>(args.slots[slot]);
    for (size_t l = 0; l < k.program.size(); ++l) {
      const Instr& L = k.program[l];
      if (L.code == Code::Load && in[size_t(L.input)] == out && (int(l) > r || k.last_read[l] >= r)) return;
    }
    direct[size_t(r)] = out;
  };
  if (!stream) take(int(st.program.size()) - 1, st.output);
  for (size_t o = 0; o < st.more_outputs.size(); ++o) take(st.more_results[o], st.more_outputs[o]);
  return direct;
}

// The tile's results out of their registers: values read in place are copied out first when the
// Step has several outputs (an earlier store may overwrite their source); then each output not
// written directly.
void store_results(const ElementwiseKernel& k, const Step& st, const LaunchArgs& args, const std::vector<char*>& direct,
                   Scratch& sc, int64_t start, int64_t n) {
  const int last = int(st.program.size()) - 1;
  const kir::View* view = k.out ? &*k.out : nullptr;
  if (!st.more_outputs.empty()) {
    std::vector<int> rs = st.more_results;
    rs.push_back(last);
    for (int r : rs) {
      double* rr = reg<double>(sc, k.regs.reg[size_t(r)]);
      if (!direct[size_t(r)] && sc.at[r] != rr) {
        std::memcpy(rr, sc.at[r], size_t(n) * itemsize(st.program[r].dtype));
        sc.at[r] = rr;
      }
    }
  }
  void* out = args.slots[st.output];
  if (direct[size_t(last)] != out) store_reg(st.dtype, last, out, start, n, sc, view);
  for (size_t o = 0; o < st.more_outputs.size(); ++o) {
    int r = st.more_results[o];
    if (direct[size_t(r)] != args.slots[st.more_outputs[o]])
      store_reg(st.program[r].dtype, r, args.slots[st.more_outputs[o]], start, n, sc, view);
  }
}

// The narrowing loop's launch (false: the interpreter's, when the loop cannot run it).
bool ElementwiseKernel::run_narrowing(const Step& st, const std::vector<const void*>& in, const LaunchArgs& args) const {
  std::vector<char*> base;
  if (!narrow.loop || !loop_for(narrow, narrow_prog, st, in, args, base)) return false;
  const int64_t total = numel(st.shape), ntiles = (total + kTile - 1) / kTile;
  uint16_t* o = static_cast<uint16_t*>(args.slots[st.output]);
  const bool bf16 = st.dtype == DType::BFloat16;
#pragma omp parallel for schedule(static) if (total >= kParallelMin)
  for (int64_t t = 0; t < ntiles; ++t) {
    float v[kTile];
    const int64_t start = t * kTile, n = std::min(kTile, total - start);
    loop_range(narrow, base, start, n, v);
    if (bf16)
      for (int64_t i = 0; i < n; ++i) o[start + i] = half::float_to_bf16(v[i]);
    else
      for (int64_t i = 0; i < n; ++i) o[start + i] = half::float_to_f16(v[i]);
  }
  return true;
}

void ElementwiseKernel::run(const Step& st, const LaunchArgs& args) const {
  const int64_t total = numel(st.shape);
  auto in = inputs_of(st, args);
  std::vector<char*> base;
  if (const jit::Loop* l = loop_for(loop, walk_program.empty() ? st.program : walk_program, st, in, args, base)) {
    elementwise_launches.fetch_add(1, std::memory_order_relaxed);
    return run_loop(loop, *l, base, total);
  }
  if (run_narrowing(st, in, args)) return;
  const Tiles ts = tiles(st, args, std::move(in));
#pragma omp parallel for schedule(static) if (ts.total >= kParallelMin)
  for (int64_t t = 0; t < ts.ntiles; ++t) run_tile(st, args, ts, t);
}

ElementwiseKernel::Tiles ElementwiseKernel::tiles(const Step& st, const LaunchArgs& args, std::vector<const void*> in) const {
  Tiles ts;
  ts.total = numel(st.shape);
  ts.ntiles = (ts.total + kTile - 1) / kTile;
  // An output far larger than the caches and the Step's only one is streamed out of its register.
  ts.stream = st.more_outputs.empty() && compute_dtype(st.dtype) == st.dtype && !out &&
              ts.total * int64_t(itemsize(st.dtype)) >= kStreamMin;
  ts.direct = direct_outputs(*this, st, in, args, ts.stream);
  ts.in = std::move(in);
  return ts;
}

void ElementwiseKernel::run_tile(const Step& st, const LaunchArgs& args, const Tiles& ts, int64_t t) const {
  const int last = int(st.program.size()) - 1;
  Scratch& sc = scratch(st.program.size(), size_t(regs.nregs));
  int64_t start = t * kTile, n = std::min(kTile, ts.total - start);
  run_program(program, regs, ts.in, domain, start, n, args, sc, 0, ts.direct.data());
  if (ts.stream)
    stream_copy(static_cast<char*>(args.slots[st.output]) + size_t(start) * itemsize(st.dtype), sc.at[size_t(last)],
                size_t(n) * itemsize(st.dtype));
  else
    store_results(*this, st, args, ts.direct, sc, start, n);
}

// A Row Step: tiles of whole rows; the output is the program (one value per position) or, when
// the Step's shape has one element per row, the first lane of each row.
struct RowKernel final : CpuKernel {
  RegPlan regs;  // with the row-constant values (plan_row_constants)
  std::unique_ptr<RowLoops> loops;  // the native loops (row_loops.h), when they build
  void run(const Step& st, const LaunchArgs& args) const override;
};

// Instruction r's value once per row of the tile [start, start + n) into dst (its first
// position's, or lane r when `compact`: computed once per row).
void store_rows(Scratch& sc, int r, bool compact, DType t, void* dst, int64_t start, int64_t n, int64_t row) {
  with_compute(t, [&](auto* tp) {
    using T = std::remove_pointer_t<decltype(tp)>;
    const T* v = val<T>(sc, r);
    const int64_t step = compact ? 1 : row;
    with_storage(t, [&](auto* sp) {
      using S = std::remove_pointer_t<decltype(sp)>;
      S* o = static_cast<S*>(dst) + start / row;
      for (int64_t j = 0; j < n / row; ++j) o[j] = store_as<S>(v[j * step]);
    });
  });
}

void RowKernel::run(const Step& st, const LaunchArgs& args) const {
  if (loops && run_row_loops(*loops, st, args)) return;
  int64_t total = numel(st.domain), row = st.row;
  int64_t rows_per_tile = std::max<int64_t>(1, kTile / row), lanes = rows_per_tile * row;
  int64_t ntiles = (total + lanes - 1) / lanes;
  bool per_row = numel(st.shape) != total;
  auto in = inputs_of(st, args);
  void* out = args.slots[st.output];
  int last = int(st.program.size()) - 1;
  auto compact = [&](int r) { return !regs.rowc.empty() && regs.rowc[size_t(r)]; };  // one lane per row
#pragma omp parallel for schedule(static) if (total >= kParallelMin && ntiles > 1)
  for (int64_t t = 0; t < ntiles; ++t) {
    Scratch& sc = scratch(st.program.size(), size_t(regs.nregs), lanes);
    int64_t start = t * lanes, n = std::min(lanes, total - start);
    run_program(st.program, regs, in, st.domain, start, n, args, sc, row);
    for (size_t o = 0; o < st.more_outputs.size(); ++o) {
      int r = st.more_results[o];
      store_rows(sc, r, compact(r), st.program[size_t(r)].dtype, args.slots[st.more_outputs[o]], start, n, row);
    }
    if (per_row) {
      store_rows(sc, last, compact(last), st.dtype, out, start, n, row);
      continue;
    }
    if (compact(last))
      with_compute(st.dtype, [&](auto* tp) {
        using T = std::remove_pointer_t<decltype(tp)>;
        T* v = reg<T>(sc, regs.reg[size_t(last)]);
        expand_rows(v, v, n / row, row);
      });
    store_tile(st, out, start, n, sc);
  }
}

// A Step of parts (Step::parts, independent Elementwise Steps in one launch: an optimizer's
// updates): each part compiled as it would be alone, and all of them run as one task grid, each
// part's tasks the pieces its own launch would cut: kTile positions of its native loop where that
// is one run over its whole domain (dense and constant loads: every update), else the
// interpreter's tiles. (A part whose loop is laid out otherwise, or that rounds its result through
// the narrowing loop, runs by its own launch first: no update does.) A task computes the positions
// it computes in the part's own launch, so every value has the bits it has there, on any number
// of threads.
struct PartsKernel final : CpuKernel {
  std::vector<std::unique_ptr<ElementwiseKernel>> parts;
  void run(const Step& st, const LaunchArgs& args) const override;
};

std::atomic<uint64_t> grid_parts{0};

void PartsKernel::run(const Step& st, const LaunchArgs& args) const {
  struct Piece {
    size_t part;
    const jit::Loop* loop;  // null: the interpreter's tiles
    std::vector<char*> base;
    ElementwiseKernel::Tiles tiles;
    int64_t total, first_task;
  };
  std::vector<Piece> grid;
  int64_t ntasks = 0, positions = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const ElementwiseKernel& k = *parts[i];
    const Step& part = st.parts[i];
    const int64_t total = numel(part.shape);
    if (total == 0) continue;
    std::vector<char*> base;
    std::vector<const void*> in = inputs_of(part, args);
    const jit::Loop* l = loop_for(k.loop, k.walk_program.empty() ? part.program : k.walk_program, part, in, args, base);
    Piece pc{i, l, std::move(base), {}, total, ntasks};
    if (l && (k.loop.run != total || k.loop.inner)) l = nullptr, pc.loop = nullptr;
    if (!l && (k.loop.loop || k.narrow.loop)) {  // laid out otherwise: its own launch
      k.run(part, args);
      continue;
    }
    if (!l) pc.tiles = k.tiles(part, args, std::move(in));
    grid.push_back(std::move(pc));
    ntasks += (total + kTile - 1) / kTile;
    positions += total;
  }
  grid_parts.fetch_add(grid.size(), std::memory_order_relaxed);
#pragma omp parallel for schedule(static) if (positions >= kParallelMin)
  for (int64_t t = 0; t < ntasks; ++t) {
    const Piece& g = *(std::upper_bound(grid.begin(), grid.end(), t, [](int64_t x, const Piece& y) { return x < y.first_task; }) - 1);
    const ElementwiseKernel& k = *parts[g.part];
    if (!g.loop) {
      k.run_tile(st.parts[g.part], args, g.tiles, t - g.first_task);
      continue;
    }
    const size_t nloads = g.loop->loads().size();
    const int64_t u0 = (t - g.first_task) * kTile, n = std::min(kTile, g.total - u0);
    const void* p[kMaxLoopPtrs];
    for (size_t i = 0; i < g.base.size(); ++i) p[i] = g.base[i] + u0 * (i < nloads ? k.loop.loads[i].stride : k.loop.out_stride) * 4;
    (*g.loop)(p, n);
  }
}

}  // namespace

uint64_t parts_in_grid() { return grid_parts.load(std::memory_order_relaxed); }

std::unique_ptr<CpuKernel> compile_parts(const Step& st) {
  auto k = std::make_unique<PartsKernel>();
  for (const Step& part : st.parts) {
    std::unique_ptr<CpuKernel> c = compile_elementwise(part);
    k->parts.emplace_back(static_cast<ElementwiseKernel*>(c.release()));
  }
  return k;
}

uint64_t elementwise_loop_launches() { return elementwise_launches.load(std::memory_order_relaxed); }

std::unique_ptr<CpuKernel> compile_elementwise(const Step& st) {
  auto k = std::make_unique<ElementwiseKernel>();
  const std::vector<int> keep = results_of(st);
  k->regs = plan_registers(st.program, keep);
  kir::View walk_out;
  prepare(*k, st, walk_out);
  k->last_read = last_readers(st.program);
  for (int r : keep) k->last_read[size_t(r)] = std::numeric_limits<int>::max();
  k->regs.load = load_paths(k->program);
  build_loops(*k, st, walk_out);
  build_narrowing(*k, st);
  return k;
}

std::unique_ptr<CpuKernel> compile_row(const Step& st) {
  auto k = std::make_unique<RowKernel>();
  k->regs = plan_registers(st.program, results_of(st));
  k->regs.load = load_paths(st.program);
  plan_row_constants(k->regs, st);
  k->loops = build_row_loops(st);
  return k;
}

}  // namespace tessera::backends::cpu
