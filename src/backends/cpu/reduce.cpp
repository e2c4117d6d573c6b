// Reduce Steps: the domain is permuted so kept axes come first; output o then owns the contiguous
// range [o * R, (o + 1) * R) of the permuted domain, reduced in order (deterministic). The values
// reduced come from the program through its native loop (float32) or the interpreter.
#include "backends/cpu/interpreter.h"
#include "backends/cpu/kernel.h"
#include "backends/cpu/native_loops.h"
#include "backends/cpu/views.h"
#include "core/fail.h"

namespace tessera::backends::cpu {
namespace {

struct ReduceKernel final : CpuKernel {
  std::vector<Instr> program;  // loads permuted to the kept-first order (unless `columns`), coalesced
  RegPlan regs;
  Shape domain;                // kept-first
  int64_t outer = 1, inner = 1;  // kept and reduced extents
  // When the reduced axes all come before the kept ones (column sums, bias gradients), the
  // domain is walked in its own order, each row adding into a vector of accumulators.
  bool columns = false;
  // The program's loop over the domain, writing the value to be reduced, float32 only: not for a
  // lone load, which the interpreter reduces in place (a bias gradient's sum of a GEMM's output).
  NativeLoop loop;

  void run(const Step& st, const LaunchArgs& args) const override {
    columns ? run_columns(st, args) : run_rows(st, args);
  }
  void run_columns(const Step& st, const LaunchArgs& args) const;
  void run_rows(const Step& st, const LaunchArgs& args) const;
};

// The values a Reduce reduces at positions [start, start + n <= kTile) of its domain: through its
// loop (float32) into this thread's buffer, else by the interpreter.
template <class T>
const T* reduce_tile(const ReduceKernel& k, const std::vector<const void*>& in, const std::vector<char*>& base,
                     const LaunchArgs& args, Scratch& sc, int64_t start, int64_t n) {
  if constexpr (std::is_same_v<T, float>)
    if (k.loop.loop) {
      thread_local std::vector<float, LineAligned<float>> buf(kTile);
      loop_range(k.loop, base, start, n, buf.data());
      return buf.data();
    }
  run_program(k.program, k.regs, in, k.domain, start, n, args, sc);
  return val<T>(sc, int(k.program.size()) - 1);
}

void ReduceKernel::run_columns(const Step& st, const LaunchArgs& args) const {
  auto in = inputs_of(st, args);
  std::vector<char*> base;
  if (loop.loop) load_bases(*loop.loop, program, in, base);
  int64_t K = outer, R = inner;  // kept extent, reduced extent
  bool is_max = st.reduce_op == ir::Op::ReduceMax;
  with_compute(st.dtype, [&](auto* tp) {
    using T = std::remove_pointer_t<decltype(tp)>;
    using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
    with_storage(st.dtype, [&](auto* sp) {
      using S = std::remove_pointer_t<decltype(sp)>;
      S* o = static_cast<S*>(args.slots[st.output]);
      int64_t nblocks = (K + kTile - 1) / kTile;
#pragma omp parallel for schedule(static) if (K * R >= kParallelMin && nblocks > 1)
      for (int64_t b = 0; b < nblocks; ++b) {
        Scratch& sc = scratch(program.size(), size_t(regs.nregs));
        int64_t k0 = b * kTile, n = std::min(kTile, K - k0);
        std::vector<Acc> sum(size_t(n), Acc(0));
        std::vector<T> mx(size_t(n), std::is_floating_point_v<T> ? -std::numeric_limits<T>::infinity()
                                                                 : std::numeric_limits<T>::lowest());
        for (int64_t r = 0; r < R; ++r) {  // rows in order: deterministic
          const T* v = reduce_tile<T>(*this, in, base, args, sc, r * K + k0, n);
          if (is_max)
            for (int64_t j = 0; j < n; ++j) mx[j] = nan_max(mx[j], v[j]);
          else
            for (int64_t j = 0; j < n; ++j) sum[j] += Acc(v[j]);
        }
        for (int64_t j = 0; j < n; ++j) o[k0 + j] = is_max ? store_as<S>(mx[j]) : store_as<S>(T(sum[j]));
      }
    });
  });
}

void ReduceKernel::run_rows(const Step& st, const LaunchArgs& args) const {
  auto in = inputs_of(st, args);
  std::vector<char*> base;
  if (loop.loop) load_bases(*loop.loop, program, in, base);
  void* out = args.slots[st.output];
  bool is_max = st.reduce_op == ir::Op::ReduceMax;
  with_compute(st.dtype, [&](auto* tp) {
    using T = std::remove_pointer_t<decltype(tp)>;
    // Sums accumulate in double (floats) or int64 (integers); max in the compute type.
    using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
    with_storage(st.dtype, [&](auto* sp) {
      using S = std::remove_pointer_t<decltype(sp)>;
      S* o = static_cast<S*>(out);
      // Outputs per task: 64 short reductions, or one long one (a few outputs, such as a conv's
      // per-channel bias gradient, still spread over the pool). Fixed by the shape alone.
      const int64_t group = inner >= kTile ? 1 : 64;
      bool par = outer > 1 && outer * inner >= kParallelMin;
#pragma omp parallel for schedule(static) if (par)
      for (int64_t ob = 0; ob < outer; ob += group) {
        Scratch& sc = scratch(program.size(), size_t(regs.nregs));
        int64_t oe = std::min(outer, ob + group);
        Acc sum[64];
        T mx[64];
        for (int64_t j = 0; j < oe - ob; ++j) sum[j] = 0, mx[j] = std::numeric_limits<T>::lowest();
        if constexpr (std::is_floating_point_v<T>)
          for (int64_t j = 0; j < oe - ob; ++j) mx[j] = -std::numeric_limits<T>::infinity();
        int64_t lo = ob * inner, hi = oe * inner;
        for (int64_t start = lo; start < hi; start += kTile) {
          int64_t n = std::min(kTile, hi - start);
          const T* r = reduce_tile<T>(*this, in, base, args, sc, start, n);
          for (int64_t i = 0; i < n;) {
            int64_t oi = (start + i) / inner, seg = std::min(n - i, (oi + 1) * inner - (start + i));
            int64_t j = oi - ob;
            if (is_max) mx[j] = nan_max(mx[j], run_max(r + i, seg, mx[j]));
            else sum[j] += run_sum(r + i, seg);
            i += seg;
          }
        }
        for (int64_t j = 0; j < oe - ob; ++j) o[ob + j] = is_max ? store_as<S>(mx[j]) : store_as<S>(T(sum[j]));
      }
    });
  });
}

}  // namespace

std::unique_ptr<CpuKernel> compile_reduce(const Step& st) {
  auto k = std::make_unique<ReduceKernel>();
  k->regs = plan_registers(st.program, results_of(st));
  std::vector<int64_t> perm;
  std::vector<bool> red(st.domain.size(), false);
  for (int64_t a : st.axes) red[a] = true;
  for (size_t d = 0; d < red.size(); ++d)
    if (!red[d]) perm.push_back(int64_t(d));
  for (int64_t a : st.axes) perm.push_back(a);
  for (size_t d = 0; d < red.size(); ++d) {
    k->domain.push_back(st.domain[perm[d]]);
    (red[perm[d]] ? k->inner : k->outer) *= st.domain[perm[d]];
  }
  k->program = st.program;
  k->columns = !st.axes.empty() && st.axes.size() < st.domain.size();
  for (size_t i = 0; i < st.axes.size(); ++i) k->columns &= st.axes[i] == int64_t(i);
  if (k->columns) k->domain = st.domain;
  for (Instr& I : k->program) {
    if (I.code == Code::Iota || I.code == Code::Rng)
      fail("cpu", "reduce programs cannot use iota or rng (step " + st.str() + ")", "");
    if (I.code == Code::Load && !k->columns) I.map = I.map.permute(perm);
  }
  if (st.dtype == DType::Float32 && k->program.size() > 1)
    build_loop(k->loop, k->program, k->domain, {int(k->program.size()) - 1}, {1}, false);
  for (Instr& I : k->program)
    if (I.code == Code::Load && I.map.views.size() == 1) I.map.views[0] = coalesced(I.map.views[0]);
  k->regs.load = load_paths(k->program);
  return k;
}

}  // namespace tessera::backends::cpu
