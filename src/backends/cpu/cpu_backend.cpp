// The CPU backend: runs each Step over L1-sized tiles of its domain, one instruction at a time
// across the whole tile; matmul through OpenBLAS (its OpenMP build, sharing our OpenMP pool).
#include <cblas.h>
#include <omp.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <numeric>
#include <optional>

#include "backends/backend.h"
#include "backends/cpu/jit_x86.h"
#include "backends/cpu/window_gemm.h"
#include "backends/cpu/vmath.h"
#include "core/half.h"
#include "core/philox.h"
#include "core/fail.h"

namespace tessera::backends {
namespace {

using kir::Code;
using kir::IndexMap;
using kir::Instr;
using kir::Step;
using kir::StepKind;

constexpr int64_t kTile = 1024;             // elements per tile: a few tiles fit in L1
constexpr int64_t kParallelMin = 1 << 16;   // below this many elements, one thread
constexpr int64_t kStreamMin = 8 << 20;     // outputs of at least this many bytes bypass the caches
constexpr int64_t kRowConstMin = 32;       // Row Steps with rows this long keep row-constant values once per row

struct F16 { uint16_t v; };
struct BF16 { uint16_t v; };

// Calls f with a typed null pointer of the storage type of dtype t.
template <class F>
void with_storage(DType t, F&& f) {
  switch (t) {
    case DType::Bool: f((uint8_t*)nullptr); break;
    case DType::Int32: f((int32_t*)nullptr); break;
    case DType::Int64: f((int64_t*)nullptr); break;
    case DType::Float16: f((F16*)nullptr); break;
    case DType::BFloat16: f((BF16*)nullptr); break;
    case DType::Float32: f((float*)nullptr); break;
    case DType::Float64: f((double*)nullptr); break;
  }
}
// Calls f with a typed null pointer of the compute type of dtype t.
template <class F>
void with_compute(DType t, F&& f) {
  switch (compute_dtype(t)) {
    case DType::Bool: f((uint8_t*)nullptr); break;
    case DType::Int32: f((int32_t*)nullptr); break;
    case DType::Int64: f((int64_t*)nullptr); break;
    case DType::Float64: f((double*)nullptr); break;
    default: f((float*)nullptr); break;
  }
}

template <class T> inline T to_c(uint8_t s) { return T(s); }
template <class T> inline T to_c(int32_t s) { return T(s); }
template <class T> inline T to_c(int64_t s) { return T(s); }
template <class T> inline T to_c(float s) { return T(s); }
template <class T> inline T to_c(double s) { return T(s); }
template <class T> inline T to_c(F16 s) { return T(half::f16_to_float(s.v)); }
template <class T> inline T to_c(BF16 s) { return T(half::bf16_to_float(s.v)); }

template <class S> inline S from_c(double v);  // compute value -> storage
template <> inline uint8_t from_c<uint8_t>(double v) { return v != 0; }
template <> inline int32_t from_c<int32_t>(double v) { return int32_t(v); }
template <> inline int64_t from_c<int64_t>(double v) { return int64_t(v); }
template <> inline float from_c<float>(double v) { return float(v); }
template <> inline double from_c<double>(double v) { return v; }
template <> inline F16 from_c<F16>(double v) { return F16{half::float_to_f16(float(v))}; }
template <> inline BF16 from_c<BF16>(double v) { return BF16{half::float_to_bf16(float(v))}; }

// Converting stores keep integer values exact (no detour through double for int64).
template <class S, class T> inline S store_as(T v) {
  if constexpr (std::is_same_v<S, T>) return v;
  else if constexpr (std::is_same_v<S, uint8_t>) return v != T(0);
  else if constexpr (std::is_integral_v<S> && std::is_integral_v<T>) return S(v);
  else return from_c<S>(double(v));
}

// Advances a row-major multi-index by one.
inline void bump(int64_t* idx, const Shape& s) {
  for (size_t d = s.size(); d-- > 0;) {
    if (++idx[d] < s[d]) return;
    idx[d] = 0;
  }
}
// Advances the multi-index idx over the first `dims` dims of view v by one (row-major), keeping
// `off` the view's offset of it: the next row (dims = rank - 1) or block of rows (rank - 2).
inline void next_outer(int64_t* idx, int64_t& off, const kir::View& v, size_t dims) {
  for (size_t d = dims; d-- > 0;) {
    off += v.strides[d];
    if (++idx[d] < v.shape[d]) return;
    off -= v.strides[d] * v.shape[d];
    idx[d] = 0;
  }
}
inline void unravel(int64_t lin, const Shape& s, int64_t* idx) {
  for (size_t d = s.size(); d-- > 0;) {
    int64_t e = s[d] == 0 ? 1 : s[d];
    idx[d] = lin % e;
    lin /= e;
  }
}

// A view of a stacked index map below the top, tracking the multi-index of a linear position.
struct Level {
  const kir::View* v;
  int64_t idx[16];
  int64_t pos = -1;  // linear position in v->shape
  int64_t off = 0;   // v->offset + sum(idx * strides)

  // Moves to position p: a small step forward carries digit by digit; anything else unravels.
  void seek(int64_t p) {
    const Shape& s = v->shape;
    size_t r = s.size();
    int64_t delta = p - pos;
    if (pos >= 0 && delta >= 0 && r > 0 && delta < s[r - 1] - idx[r - 1]) {
      idx[r - 1] += delta;
      off += delta * v->strides[r - 1];
    } else {
      unravel(p, s, idx);
      off = v->offset;
      for (size_t d = 0; d < r; ++d) off += idx[d] * v->strides[d];
    }
    pos = p;
  }
  bool in_mask() const {
    if (!v->masked()) return true;
    for (size_t d = 0; d < v->shape.size(); ++d)
      if (idx[d] < v->lo[d] || idx[d] >= v->hi[d]) return false;
    return true;
  }
};

// Offsets through a stack of views: the top view's offset is a position in the view below it,
// and so on down to views[0]; consecutive positions usually move each level by a small step.
void stacked_offsets(const IndexMap& m, size_t top, int64_t* idx, int64_t n, int64_t* off, uint8_t* valid) {
  const kir::View& tv = m.views[top];
  const Shape& s = tv.shape;
  if (top > 15 || s.size() > 16) {  // deep stacks: evaluate each element on its own
    for (int64_t i = 0; i < n; ++i) {
      valid[i] = m.offset_from(top, idx, &off[i]);
      bump(idx, s);
    }
    return;
  }
  Level lv[16];
  for (size_t k = 0; k < top; ++k) lv[k].v = &m.views[k];
  for (int64_t i = 0; i < n; ++i) {
    bool ok = true;
    int64_t o = tv.offset;
    for (size_t d = 0; d < s.size(); ++d) {
      o += idx[d] * tv.strides[d];
      if (tv.masked()) ok &= idx[d] >= tv.lo[d] && idx[d] < tv.hi[d];
    }
    for (size_t k = top; ok && k-- > 0;) {
      lv[k].seek(o);
      ok = lv[k].in_mask();
      o = lv[k].off;
    }
    valid[i] = ok;
    off[i] = o;
    bump(idx, s);
  }
}

// Element offsets (and validity under masks) of n consecutive domain positions from `start`.
// Plain-reshape views on top are skipped (they keep the row-major order); a single strided view,
// masked or not, is walked incrementally; deeper stacks are evaluated per element.
void tile_offsets(const IndexMap& m, int64_t start, int64_t n, int64_t* off, uint8_t* valid) {
  size_t top = m.effective_top();
  const kir::View& v = m.views[top];
  const Shape& s = v.shape;
  size_t r = s.size();
  int64_t idx[32];
  unravel(start, s, idx);
  if (top > 0) {
    stacked_offsets(m, top, idx, n, off, valid);
    return;
  }
  if (r == 0) {
    for (int64_t i = 0; i < n; ++i) off[i] = v.offset, valid[i] = 1;
    return;
  }
  bool masked = v.masked();
  int64_t last = int64_t(r) - 1, inner = s[last], st = v.strides[last];
  int64_t lo = masked ? v.lo[last] : 0, hi = masked ? v.hi[last] : inner;
  for (int64_t i = 0; i < n;) {
    int64_t base = v.offset;
    bool row_ok = true;
    for (int64_t d = 0; d < last; ++d) {
      base += idx[d] * v.strides[d];
      if (masked) row_ok &= idx[d] >= v.lo[d] && idx[d] < v.hi[d];
    }
    int64_t run = std::min(n - i, inner - idx[last]);
    for (int64_t j = 0; j < run; ++j) {
      int64_t p = idx[last] + j;
      off[i + j] = base + p * st;
      valid[i + j] = row_ok && p >= lo && p < hi;
    }
    i += run;
    idx[last] += run - 1;
    bump(idx, s);
  }
}

// Registers start on cache lines: a vector load or store that straddles two lines costs two (a
// plain vector<double> from a large malloc starts 16 bytes into a page, which made every other
// 32-byte access of the register loops a split one, ~30% of their time).
template <class T> struct LineAligned {
  using value_type = T;
  LineAligned() = default;
  template <class U> LineAligned(const LineAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  bool operator==(const LineAligned&) const = default;
};

struct Scratch {
  std::vector<double, LineAligned<double>> regs;  // `lanes` 8-byte lanes per register
  std::vector<double> consts;  // one 8-byte lane per instruction: scalar constants
  // Where each instruction's values are: its register, or for a load of a dense run of the
  // same type, the source memory itself (no copy).
  std::vector<const void*> at;
  int64_t lanes = kTile;
  std::vector<int64_t> off;
  std::vector<uint8_t> valid;
};
// out[i] = a[i] op b[i] over n lanes, for one op and dtype; a scalar operand (sa, sb) is its lane 0.
using BinaryFn = void (*)(const void* a, const void* b, bool sa, bool sb, void* out, int64_t n);
BinaryFn binary_fn(Code c, DType t);

// How a program uses registers, planned once per Step (CpuKernel): an instruction's register is
// reused once its last reader has run, so a long program's live values stay within L1; a Const
// read only by binary ops and where's value operands is a scalar (one lane, never filled).
// An instruction never writes a register one of its operands is in.
struct RegPlan {
  std::vector<int> reg;          // per instruction (-1: a scalar constant)
  std::vector<uint8_t> scalar;   // per instruction: a scalar constant
  int nregs = 0;
  std::vector<uint8_t> load;     // per instruction: how a Load reads (LoadPath), fixed per Step
  // Row Steps (empty otherwise): per instruction, whether its value is constant along each row;
  // such values are computed and kept once per row (lane r: the tile's row r), see row_constants.
  // Registers spare .. spare + 2 (counted in nregs) spell them out for per-position readers.
  std::vector<uint8_t> rowc;
  int spare = -1;
  // Resolved once per Step, so a tile's instruction dispatch is one indirect call: each binary
  // instruction's loop for its op and dtype, and each scalar constant's value in its compute type.
  std::vector<BinaryFn> binary;
  std::vector<double> cval;
};

// Which instructions of a Row Step are constant along each row (RegPlan::rowc): row reductions,
// loads that stay put along the row (a per-row statistic broadcast back), and what is computed
// from those and scalar constants. Empty (every value per position) for other Steps and for
// rows shorter than kRowConstMin, where evaluating row by row costs more than it saves.
std::vector<uint8_t> row_constants(const Step& st, const RegPlan& rp) {
  const Shape& d = st.domain;
  if (st.kind != StepKind::Row || st.row < kRowConstMin) return {};
  size_t first = d.size();  // the row: dims [first, rank)
  int64_t p = 1;
  while (first > 0 && p < st.row) p *= d[--first];
  if (p != st.row) return {};
  std::vector<uint8_t> rc(st.program.size(), 0);
  auto still = [&](int o) { return o < 0 || rc[size_t(o)] || rp.scalar[size_t(o)]; };
  for (size_t k = 0; k < st.program.size(); ++k) {
    const Instr& I = st.program[k];
    switch (I.code) {
      case Code::RowSum: case Code::RowMax: rc[k] = 1; break;
      case Code::Const: rc[k] = !rp.scalar[k]; break;
      case Code::Iota: case Code::Rng: break;
      case Code::Load: {
        const kir::View& v = I.map.views.back();
        bool c = I.map.views.size() == 1 && v.shape == d;
        for (size_t j = first; j < d.size() && c; ++j)
          c = v.strides[j] == 0 && (!v.masked() || (v.lo[j] <= 0 && v.hi[j] >= d[j]));
        rc[k] = c;
        break;
      }
      default: rc[k] = still(I.a) && still(I.b) && still(I.c); break;
    }
  }
  return rc;
}

// How a Load reads its input: a dense run of the compute type in place, through one strided
// view (load_strided), or per element through a stack of views.
enum LoadPath : uint8_t { kInPlace, kStrided, kStacked };
std::vector<uint8_t> load_paths(const std::vector<Instr>& prog) {
  std::vector<uint8_t> r(prog.size(), kStacked);
  for (size_t k = 0; k < prog.size(); ++k) {
    const Instr& I = prog[k];
    if (I.code != Code::Load) continue;
    if (I.map.is_contiguous() && compute_dtype(I.dtype) == I.dtype) r[k] = kInPlace;
    else if (I.map.effective_top() == 0) r[k] = kStrided;
  }
  return r;
}

bool is_binary(Code c) { return c >= Code::Add && c <= Code::Ge; }

// `keep`: instructions whose values are read after the program (results).
RegPlan plan_registers(const std::vector<Instr>& prog, const std::vector<int>& keep) {
  const int n = int(prog.size());
  RegPlan p;
  p.reg.assign(size_t(n), -1);
  p.scalar.assign(size_t(n), 0);
  std::vector<int> last(size_t(n), -1);
  for (int k = 0; k < n; ++k) {
    const Instr& I = prog[size_t(k)];
    if (I.code == Code::Const) p.scalar[size_t(k)] = 1;
    for (int o : {I.a, I.b, I.c})
      if (o >= 0) {
        last[size_t(o)] = k;
        bool as_scalar = is_binary(I.code) || (I.code == Code::Where && o != I.a);
        if (!as_scalar) p.scalar[size_t(o)] = 0;
      }
  }
  for (int k : keep) last[size_t(k)] = n, p.scalar[size_t(k)] = 0;
  std::vector<int> free_regs;  // kept sorted descending: the lowest register is reused first
  auto release = [&](int r) {
    free_regs.insert(std::upper_bound(free_regs.begin(), free_regs.end(), r, std::greater<int>()), r);
  };
  for (int k = 0; k < n; ++k) {
    const Instr& I = prog[size_t(k)];
    if (!p.scalar[size_t(k)]) {
      if (free_regs.empty()) free_regs.push_back(p.nregs++);
      p.reg[size_t(k)] = free_regs.back();
      free_regs.pop_back();
    }
    for (int o : {I.a, I.b, I.c})
      if (o >= 0 && last[size_t(o)] == k && p.reg[size_t(o)] >= 0) {
        release(p.reg[size_t(o)]);
        last[size_t(o)] = -2;  // released once, even when read twice
      }
    if (last[size_t(k)] == -1 && p.reg[size_t(k)] >= 0) release(p.reg[size_t(k)]);  // never read
  }
  p.binary.assign(size_t(n), nullptr);
  p.cval.assign(size_t(n), 0.0);
  for (size_t k = 0; k < size_t(n); ++k) {
    const Instr& I = prog[k];
    if (is_binary(I.code)) p.binary[k] = binary_fn(I.code, prog[size_t(I.a)].dtype);
    if (I.code == Code::Const)
      with_compute(I.dtype, [&](auto* tp) {
        using T = std::remove_pointer_t<decltype(tp)>;
        T v = store_as<T>(I.value);
        if (I.dtype == DType::Float16) v = T(half::f16_to_float(half::float_to_f16(float(I.value))));
        if (I.dtype == DType::BFloat16) v = T(half::bf16_to_float(half::float_to_bf16(float(I.value))));
        std::memcpy(&p.cval[k], &v, sizeof v);
      });
  }
  return p;
}

// Registers of `lanes` elements (Row Steps hold whole rows, so more) for a program of ninstr
// instructions using nregs registers.
Scratch& scratch(size_t ninstr, size_t nregs, int64_t lanes = kTile) {
  thread_local Scratch s;
  lanes = std::max(lanes, kTile);
  if (s.lanes != lanes) s.lanes = lanes, s.regs.clear();
  if (s.regs.size() < nregs * size_t(lanes)) s.regs.resize(nregs * size_t(lanes));
  if (s.consts.size() < ninstr) s.consts.resize(ninstr);
  if (s.off.size() < size_t(lanes)) s.off.resize(size_t(lanes)), s.valid.resize(size_t(lanes));
  return s;
}

template <class T> T* reg(Scratch& sc, int i) { return reinterpret_cast<T*>(sc.regs.data() + size_t(i) * size_t(sc.lanes)); }
// The values of instruction i (after run_program).
template <class T> const T* val(const Scratch& sc, int i) { return static_cast<const T*>(sc.at[size_t(i)]); }

template <class T> inline T nan_max(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  }
  return a > b ? a : b;
}
template <class T> inline T nan_min(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  }
  return a < b ? a : b;
}

// Reductions of a run of values with 8 independent accumulators, so they vectorize; the order
// is fixed by the run alone, so results are the same for any thread count. Sums of floats
// accumulate in double, of integers in int64; a NaN anywhere makes the maximum NaN.
template <class T> inline auto run_sum(const T* a, int64_t n) {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
  Acc acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += Acc(a[i + j]);
  for (int j = 0; i < n; ++i, ++j) acc[j] += Acc(a[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
template <class T> inline T run_max(const T* a, int64_t n, T init) {
  T m[8];
  std::fill_n(m, 8, init);
  bool nan = false;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) {
      T x = a[i + j];
      m[j] = x > m[j] ? x : m[j];
      if constexpr (std::is_floating_point_v<T>) nan |= x != x;
    }
  for (int j = 0; i < n; ++i, ++j) {
    T x = a[i];
    m[j] = x > m[j] ? x : m[j];
    if constexpr (std::is_floating_point_v<T>) nan |= x != x;
  }
  if (nan) return std::numeric_limits<T>::quiet_NaN();
  T r = m[0];
  for (int j = 1; j < 8; ++j) r = m[j] > r ? m[j] : r;
  return r;
}

// A load through one strided view: copied run by run along the last dimension (contiguous runs
// as plain copies, broadcast runs as fills, masked parts as pad fills), no offset arrays.
void load_strided(const Instr& I, const void* base_ptr, int64_t start, int64_t n, void* dst) {
  const kir::View& v = I.map.views[0];
  const Shape& s = v.shape;
  size_t r = s.size();
  bool masked = v.masked();
  with_compute(I.dtype, [&](auto* tp) {
    using T = std::remove_pointer_t<decltype(tp)>;
    T* out = static_cast<T*>(dst);
    T pad = T(I.value);
    with_storage(I.dtype, [&](auto* sp) {
      using S = std::remove_pointer_t<decltype(sp)>;
      const S* src = static_cast<const S*>(base_ptr);
      if (r == 0) {
        std::fill_n(out, n, to_c<T>(src[v.offset]));
        return;
      }
      int64_t idx[32];
      unravel(start, s, idx);
      int64_t last = int64_t(r) - 1, inner = s[last], st = v.strides[last];
      if (r >= 2 && inner <= 4) {
        // Short rows (pooling windows, kernel taps): element by element over blocks of the last
        // two dimensions, the block's offset and outer mask computed once per block.
        int64_t A = s[last - 1], sa = v.strides[last - 1];
        int64_t o = v.offset;
        for (int64_t d = 0; d + 1 < last; ++d) o += idx[d] * v.strides[d];
        int64_t alo = masked ? v.lo[last - 1] : 0, ahi = masked ? v.hi[last - 1] : A;
        int64_t blo = masked ? v.lo[last] : 0, bhi = masked ? v.hi[last] : inner;
        for (int64_t i = 0; i < n;) {
          bool outer_ok = true;
          if (masked)
            for (int64_t d = 0; d + 1 < last; ++d) outer_ok &= idx[d] >= v.lo[d] && idx[d] < v.hi[d];
          int64_t a = idx[last - 1], b = idx[last], run = std::min(n - i, (A - a) * inner - b);
          T* q = out + i;
          int64_t j = 0;
          auto one = [&] {  // element j at (a, b)
            bool ok = outer_ok && a >= alo && a < ahi && b >= blo && b < bhi;
            q[j++] = ok ? to_c<T>(src[o + a * sa + b * st]) : pad;
            if (++b == inner) b = 0, ++a;
          };
          while (j < run && b != 0) one();  // a partial first row
          if (int64_t rows = (run - j) / inner; rows > 0) {
            // Whole rows: pads first, then each valid column of the block as one strided run.
            T* qr = q + j;
            int64_t a0 = outer_ok ? std::max(a, alo) : a, a1 = outer_ok ? std::min(a + rows, ahi) : a;
            if (masked) std::fill_n(qr, rows * inner, pad);
            for (int64_t c = std::max<int64_t>(blo, 0); a1 > a0 && c < std::min(bhi, inner); ++c) {
              const S* p = src + o + c * st;
              for (int64_t x = a0; x < a1; ++x) qr[(x - a) * inner + c] = to_c<T>(p[x * sa]);
            }
            j += rows * inner;
            a += rows;
          }
          while (j < run) one();  // a partial last row
          i += run;
          idx[last - 1] = a, idx[last] = b;
          if (a < A) continue;
          idx[last - 1] = 0;
          next_outer(idx, o, v, size_t(last - 1));
        }
        return;
      }
      int64_t o = v.offset;  // of the current row (the last index at 0), kept incrementally
      for (int64_t d = 0; d < last; ++d) o += idx[d] * v.strides[d];
      for (int64_t i = 0; i < n;) {
        int64_t a = idx[last], run = std::min(n - i, inner - a), va = a, vb = a + run;
        if (masked) {  // the valid part [va, vb) of this run
          bool row_ok = true;
          for (int64_t d = 0; d < last; ++d) row_ok &= idx[d] >= v.lo[d] && idx[d] < v.hi[d];
          va = row_ok ? std::clamp(v.lo[last], a, a + run) : a;
          vb = row_ok ? std::clamp(v.hi[last], va, a + run) : a;
        }
        T* q = out + i;
        std::fill(q, q + (va - a), pad);
        std::fill(q + (vb - a), q + run, pad);
        if (vb > va) {
          const S* p = src + o + va * st;
          T* w = q + (va - a);
          int64_t m = vb - va;
          if (st == 1 && m > 4) {
            if constexpr (std::is_same_v<S, T>) std::memcpy(w, p, size_t(m) * sizeof(T));
            else for (int64_t j = 0; j < m; ++j) w[j] = to_c<T>(p[j]);
          } else if (st == 0) {
            std::fill_n(w, m, to_c<T>(*p));
          } else {
            for (int64_t j = 0; j < m; ++j) w[j] = to_c<T>(p[j * st]);
          }
        }
        i += run;
        idx[last] += run;
        if (idx[last] < inner) continue;
        idx[last] = 0;
        next_outer(idx, o, v, size_t(last));
      }
    });
  });
}

// c ? x : y as bit operations: where's condition is data, on which a branch mispredicts, and
// this form vectorizes.
template <class T>
inline T select(uint8_t c, T x, T y) {
  using U = std::conditional_t<sizeof(T) == 1, uint8_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;
  static_assert(sizeof(T) == sizeof(U));
  const U m = U(U(0) - U(c != 0));
  return std::bit_cast<T>(U((std::bit_cast<U>(x) & m) | (std::bit_cast<U>(y) & U(~m))));
}

// out[i] = f(a[i], b[i]) for i < n, where a scalar operand (sa, sb) is its lane 0.
template <class T, class R, class F>
inline void binary(const T* a, const T* b, bool sa, bool sb, R* out, int64_t n, F f) {
  if (sa && sb) {
    std::fill_n(out, n, R(f(a[0], b[0])));
  } else if (sb) {
    const T y = b[0];
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], y);
  } else if (sa) {
    const T x = a[0];
    for (int64_t i = 0; i < n; ++i) out[i] = f(x, b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
  }
}

template <class T, class R, class F>
void binary_loop(const void* a, const void* b, bool sa, bool sb, void* out, int64_t n) {
  binary(static_cast<const T*>(a), static_cast<const T*>(b), sa, sb, static_cast<R*>(out), n, F{});
}

template <class T> BinaryFn binary_fn_of(Code c) {
  auto arith = [](auto f) -> BinaryFn { return &binary_loop<T, T, decltype(f)>; };
  auto compare = [](auto f) -> BinaryFn { return &binary_loop<T, uint8_t, decltype(f)>; };
  switch (c) {
    case Code::Add: return arith([](T x, T y) { return T(x + y); });
    case Code::Sub: return arith([](T x, T y) { return T(x - y); });
    case Code::Mul: return arith([](T x, T y) { return T(x * y); });
    case Code::Div: return arith([](T x, T y) { return T(x / y); });
    case Code::Max: return arith([](T x, T y) { return nan_max(x, y); });
    case Code::Min: return arith([](T x, T y) { return nan_min(x, y); });
    case Code::Pow:
      if constexpr (std::is_floating_point_v<T>) return arith([](T x, T y) { return T(std::pow(x, y)); });
      break;
    case Code::Eq: return compare([](T x, T y) { return uint8_t(x == y); });
    case Code::Ne: return compare([](T x, T y) { return uint8_t(x != y); });
    case Code::Lt: return compare([](T x, T y) { return uint8_t(x < y); });
    case Code::Le: return compare([](T x, T y) { return uint8_t(x <= y); });
    case Code::Gt: return compare([](T x, T y) { return uint8_t(x > y); });
    case Code::Ge: return compare([](T x, T y) { return uint8_t(x >= y); });
    default: break;
  }
  fail("cpu", "internal: a binary instruction with no kernel for its dtype (pow of integers is refused when traced)", "");
}

BinaryFn binary_fn(Code c, DType t) {
  BinaryFn r = nullptr;
  with_compute(t, [&](auto* tp) { r = binary_fn_of<std::remove_pointer_t<decltype(tp)>>(c); });
  return r;
}

// dst[r * row + j] = src[r] for rows r < rows (dst may be src: rows are filled from the last one
// down, so each row's value is read before its lanes are written).
template <class T>
void expand_rows(T* dst, const T* src, int64_t rows, int64_t row) {
  for (int64_t r = rows - 1; r >= 0; --r) std::fill_n(dst + r * row, row, T(src[r]));
}

// Evaluates `prog` for domain positions [start, start + n) (n <= kTile); results in registers.
// Row Steps pass `row`: then start and n are multiples of it and RowSum/RowMax reduce each run.
// `direct` (optional, per instruction): an output whose element `start` instruction k writes
// instead of its register (the output itself: no copy out of a register; see direct_outputs).
void run_program(const std::vector<Instr>& prog, const RegPlan& rp, const std::vector<const void*>& in,
                 const Shape& domain, int64_t start, int64_t n, const LaunchArgs& args, Scratch& sc, int64_t row = 0,
                 char* const* direct = nullptr) {
  if (sc.at.size() < prog.size()) sc.at.resize(prog.size());
  const bool rowc = row > 0 && !rp.rowc.empty();
  const int64_t rows = row > 0 ? n / row : 0;
  // Operand o of instruction k: a row-constant value read by a per-position instruction is
  // spelled out over the tile's positions first, into spare register rp.spare + j.
  auto operand = [&](size_t k, int o, int j) -> const void* {
    if (!rowc || rp.rowc[k] || !rp.rowc[size_t(o)]) return sc.at[size_t(o)];
    void* dst = reg<double>(sc, rp.spare + j);
    switch (itemsize(compute_dtype(prog[size_t(o)].dtype))) {
      case 1: expand_rows(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(sc.at[size_t(o)]), rows, row); break;
      case 4: expand_rows(static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(sc.at[size_t(o)]), rows, row); break;
      default: expand_rows(static_cast<uint64_t*>(dst), static_cast<const uint64_t*>(sc.at[size_t(o)]), rows, row);
    }
    return dst;
  };
  for (size_t k = 0; k < prog.size(); ++k) {
    const Instr& I = prog[k];
    const int ki = rp.reg[k];
    const int64_t m = rowc && rp.rowc[k] ? rows : n;  // lanes computed: one per row, or one per position
    void* dst = direct && direct[k] ? direct[k] + size_t(start) * itemsize(I.dtype)
                : ki >= 0           ? static_cast<void*>(reg<double>(sc, ki))
                                    : &sc.consts[k];
    sc.at[k] = dst;
    switch (I.code) {
      case Code::Load: {
        if (m < n) {  // one element per row: at each row's first position
          int64_t idx[32];
          for (int64_t r = 0; r < rows; ++r) {
            unravel(start + r * row, domain, idx);
            sc.valid[size_t(r)] = I.map.offset(idx, &sc.off[size_t(r)]);
          }
        } else if (rp.load[k] == kInPlace) {
          sc.at[k] = static_cast<const char*>(in[I.input]) + size_t(I.map.views[0].offset + start) * itemsize(I.dtype);
          break;
        } else if (rp.load[k] == kStrided) {
          load_strided(I, in[I.input], start, n, dst);
          break;
        } else {
          tile_offsets(I.map, start, n, sc.off.data(), sc.valid.data());
        }
        const int64_t* off = sc.off.data();
        const uint8_t* valid = sc.valid.data();
        with_compute(I.dtype, [&](auto* tp) {
          using T = std::remove_pointer_t<decltype(tp)>;
          T* out = static_cast<T*>(dst);
          T pad = T(I.value);
          with_storage(I.dtype, [&](auto* sp) {
            using S = std::remove_pointer_t<decltype(sp)>;
            const S* src = static_cast<const S*>(in[I.input]);
            for (int64_t i = 0; i < m; ++i) out[i] = valid[i] ? to_c<T>(src[off[i]]) : pad;
          });
        });
        break;
      }
      case Code::Const:
        if (ki < 0) {
          sc.at[k] = &rp.cval[k];
          break;
        }
        with_compute(I.dtype, [&](auto* tp) {
          using T = std::remove_pointer_t<decltype(tp)>;
          T v;
          std::memcpy(&v, &rp.cval[k], sizeof v);
          std::fill_n(static_cast<T*>(dst), m, v);
        });
        break;
      case Code::Iota: {  // run by run along the domain's last dimension
        int64_t* out = static_cast<int64_t*>(dst);
        int64_t idx[32];
        unravel(start, domain, idx);
        int64_t last = int64_t(domain.size()) - 1;
        if (last < 0) std::fill_n(out, n, 0);
        for (int64_t i = 0; i < n && last >= 0;) {
          int64_t run = std::min(n - i, domain[last] - idx[last]);
          if (I.i0 == last)
            for (int64_t j = 0; j < run; ++j) out[i + j] = idx[last] + j;
          else
            std::fill_n(out + i, run, idx[I.i0]);
          i += run;
          idx[last] += run - 1;
          bump(idx, domain);
        }
        with_compute(I.dtype, [&](auto* tp) {  // iota may be typed narrower than int64
          using T = std::remove_pointer_t<decltype(tp)>;
          if constexpr (!std::is_same_v<T, int64_t>) {
            T* o = static_cast<T*>(dst);
            for (int64_t i = 0; i < n; ++i) o[i] = T(out[i]);
          }
        });
        break;
      }
      case Code::Rng:
        with_compute(I.dtype, [&](auto* tp) {
          using T = std::remove_pointer_t<decltype(tp)>;
          T* out = static_cast<T*>(dst);
          for (int64_t i = 0; i < n; ++i) {
            double v = rng::sample(args.seed, args.offset, uint32_t(I.i0), uint64_t(start + i), int(I.i1));
            if (I.dtype == DType::Float16) v = half::f16_to_float(half::float_to_f16(float(v)));
            if (I.dtype == DType::BFloat16) v = half::bf16_to_float(half::float_to_bf16(float(v)));
            out[i] = T(v);
          }
        });
        break;
      case Code::Cast:
        with_compute(prog[I.a].dtype, [&](auto* ap) {
          using A = std::remove_pointer_t<decltype(ap)>;
          const A* a = val<A>(sc, I.a);
          with_compute(I.dtype, [&](auto* tp) {
            using T = std::remove_pointer_t<decltype(tp)>;
            T* out = static_cast<T*>(dst);
            for (int64_t i = 0; i < m; ++i) out[i] = store_as<T>(a[i]);
            if (I.dtype == DType::Float16)
              for (int64_t i = 0; i < m; ++i) out[i] = T(half::f16_to_float(half::float_to_f16(float(out[i]))));
            if (I.dtype == DType::BFloat16)
              for (int64_t i = 0; i < m; ++i) out[i] = T(half::bf16_to_float(half::float_to_bf16(float(out[i]))));
          });
        });
        break;
      case Code::Neg: case Code::Exp: case Code::Log: case Code::Tanh: case Code::Abs: case Code::Sign:
      case Code::Sqrt: case Code::Sin: case Code::Cos: case Code::Erf: case Code::Floor: case Code::Ceil:
      case Code::Round:
        with_compute(I.dtype, [&](auto* tp) {
          using T = std::remove_pointer_t<decltype(tp)>;
          const T* a = val<T>(sc, I.a);
          T* out = static_cast<T*>(dst);
          switch (I.code) {
            case Code::Neg: for (int64_t i = 0; i < m; ++i) out[i] = T(-a[i]); break;
            case Code::Abs: for (int64_t i = 0; i < m; ++i) out[i] = a[i] < T(0) ? T(-a[i]) : a[i]; break;
            case Code::Sign:
              for (int64_t i = 0; i < m; ++i) out[i] = a[i] > T(0) ? T(1) : a[i] < T(0) ? T(-1) : a[i];
              break;
            default:
              if constexpr (std::is_same_v<T, float>) {  // vectorized float32 (within 1.02 ulp)
                switch (I.code) {
                  case Code::Exp: vmath::vexp(a, out, m); return;
                  case Code::Log: vmath::vlog(a, out, m); return;
                  case Code::Tanh: vmath::vtanh(a, out, m); return;
                  case Code::Erf: vmath::verf(a, out, m); return;
                  default: break;
                }
              }
              if constexpr (std::is_floating_point_v<T>) {
                switch (I.code) {
                  case Code::Exp: for (int64_t i = 0; i < m; ++i) out[i] = std::exp(a[i]); break;
                  case Code::Log: for (int64_t i = 0; i < m; ++i) out[i] = std::log(a[i]); break;
                  case Code::Tanh: for (int64_t i = 0; i < m; ++i) out[i] = std::tanh(a[i]); break;
                  case Code::Sqrt: for (int64_t i = 0; i < m; ++i) out[i] = std::sqrt(a[i]); break;
                  case Code::Sin: for (int64_t i = 0; i < m; ++i) out[i] = std::sin(a[i]); break;
                  case Code::Cos: for (int64_t i = 0; i < m; ++i) out[i] = std::cos(a[i]); break;
                  case Code::Erf: for (int64_t i = 0; i < m; ++i) out[i] = std::erf(a[i]); break;
                  case Code::Floor: for (int64_t i = 0; i < m; ++i) out[i] = std::floor(a[i]); break;
                  case Code::Ceil: for (int64_t i = 0; i < m; ++i) out[i] = std::ceil(a[i]); break;
                  case Code::Round: for (int64_t i = 0; i < m; ++i) out[i] = std::nearbyint(a[i]); break;
                  default: break;
                }
              } else {  // floor/ceil/round of an integer is itself
                std::copy_n(a, m, out);
              }
          }
        });
        break;
      case Code::RowSum:
      case Code::RowMax:
        with_compute(I.dtype, [&](auto* tp) {
          using T = std::remove_pointer_t<decltype(tp)>;
          const T* a = val<T>(sc, I.a);
          T* out = static_cast<T*>(dst);
          if (rowc && rp.rowc[size_t(I.a)]) {  // a row of equal values: spelled out, then reduced
            expand_rows(out, a, rows, row);
            a = out;
          }
          const T lowest = std::is_floating_point_v<T> ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::lowest();
          for (int64_t r = 0; r < rows; ++r) {  // row r is read before lane r (< r * row) is written
            T v = I.code == Code::RowSum ? T(run_sum(a + r * row, row)) : run_max(a + r * row, row, lowest);
            if (rowc) out[r] = v;
            else std::fill_n(out + r * row, row, v);
          }
        });
        break;
      case Code::Where:
        with_compute(I.dtype, [&](auto* tp) {
          using T = std::remove_pointer_t<decltype(tp)>;
          const uint8_t* c = static_cast<const uint8_t*>(operand(k, I.a, 0));
          const T* a = static_cast<const T*>(operand(k, I.b, 1));
          const T* b = static_cast<const T*>(operand(k, I.c, 2));
          T* out = static_cast<T*>(dst);
          const bool sa = rp.scalar[size_t(I.b)], sb = rp.scalar[size_t(I.c)];
          if (sa && sb)
            for (int64_t i = 0; i < m; ++i) out[i] = select(c[i], a[0], b[0]);
          else if (sa)
            for (int64_t i = 0; i < m; ++i) out[i] = select(c[i], a[0], b[i]);
          else if (sb)
            for (int64_t i = 0; i < m; ++i) out[i] = select(c[i], a[i], b[0]);
          else
            for (int64_t i = 0; i < m; ++i) out[i] = select(c[i], a[i], b[i]);
        });
        break;
      default:  // binary arithmetic and comparisons; operands share one dtype
        rp.binary[k](operand(k, I.a, 0), operand(k, I.b, 1), rp.scalar[size_t(I.a)], rp.scalar[size_t(I.b)], dst, m);
    }
  }
}

// Stores register r (of dtype t) into out[start, start + n), or, given `view` (a domain walked
// in a permuted order: CpuKernel::out), at the view's offsets of those positions, run by run
// along its last dimension.
void store_reg(DType t, int r, void* out, int64_t start, int64_t n, Scratch& sc, const kir::View* view = nullptr) {
  with_compute(t, [&](auto* tp) {
    using T = std::remove_pointer_t<decltype(tp)>;
    const T* v = val<T>(sc, r);
    with_storage(t, [&](auto* sp) {
      using S = std::remove_pointer_t<decltype(sp)>;
      if (view) {
        const Shape& s = view->shape;
        const size_t last = s.size() - 1;
        int64_t idx[32] = {};
        unravel(start, s, idx);
        int64_t o = view->offset;
        for (size_t d = 0; d < last; ++d) o += idx[d] * view->strides[d];
        const int64_t inner = s[last], st = view->strides[last];
        for (int64_t i = 0; i < n;) {
          int64_t a = idx[last], run = std::min(n - i, inner - a);
          S* q = static_cast<S*>(out) + o + a * st;
          for (int64_t j = 0; j < run; ++j) q[j * st] = store_as<S>(v[i + j]);
          i += run;
          idx[last] += run;
          if (idx[last] < inner) continue;
          idx[last] = 0;
          next_outer(idx, o, *view, last);
        }
        return;
      }
      S* o = static_cast<S*>(out) + start;
      if constexpr (std::is_same_v<S, T>) {
        if (static_cast<const void*>(o) != static_cast<const void*>(v)) std::memcpy(o, v, size_t(n) * sizeof(T));
      }
      else for (int64_t i = 0; i < n; ++i) o[i] = store_as<S>(v[i]);
    });
  });
}
// Stores the Step's result (the last register) and any further outputs.
void store_tile(const Step& st, void* out, int64_t start, int64_t n, Scratch& sc) {
  store_reg(st.dtype, int(st.program.size()) - 1, out, start, n, sc);
}

std::vector<const void*> inputs_of(const Step& st, const LaunchArgs& a) {
  std::vector<const void*> in;
  for (int s : st.inputs) in.push_back(a.slots[s]);
  return in;
}

// A Copy Step of one masked view whose rows are a few elements (a dilation's interleaved zeros,
// [.., X, 2] masked to [.., X, 1]): the output filled with the pad, then the mask's box copied
// over it along the box's last dim longer than 1, whatever its strides (row by row, the
// rows otherwise a few elements each cost ~3 ns per element).
void run_box_copy(const Step& st, const Instr& I, const LaunchArgs& args) {
  const kir::View& v = I.map.views[0];
  const Shape& s = v.shape;
  const std::vector<int64_t> ostr = contiguous_strides(s);
  Shape box;
  std::vector<int64_t> os, is;
  int64_t obase = 0, ibase = v.offset;
  for (size_t d = 0; d < s.size(); ++d) {
    const int64_t lo = std::clamp<int64_t>(v.lo[d], 0, s[d]), hi = std::clamp<int64_t>(v.hi[d], lo, s[d]);
    obase += lo * ostr[d], ibase += lo * v.strides[d];
    if (hi - lo != 1) box.push_back(hi - lo), os.push_back(ostr[d]), is.push_back(v.strides[d]);
  }
  if (box.empty()) box = {1}, os = {0}, is = {0};
  const size_t last = box.size() - 1;
  const int64_t inner = box[last], rows = inner ? numel(box) / inner : 0, total = numel(s);
  const Shape outer(box.begin(), box.end() - 1);
  with_storage(st.dtype, [&](auto* sp) {
    using S = std::remove_pointer_t<decltype(sp)>;
    const S* src = static_cast<const S*>(args.slots[st.inputs[I.input]]);
    S* out = static_cast<S*>(args.slots[st.output]);
    const S pad = from_c<S>(I.value);
#pragma omp parallel for schedule(static) if (total >= kParallelMin)
    for (int64_t e = 0; e < total; e += kParallelMin) std::fill(out + e, out + std::min(total, e + kParallelMin), pad);
#pragma omp parallel for schedule(static) if (total >= kParallelMin)
    for (int64_t row = 0; row < rows; ++row) {
      int64_t idx[32], o = obase, i = ibase;
      unravel(row, outer, idx);
      for (size_t d = 0; d < last; ++d) o += idx[d] * os[d], i += idx[d] * is[d];
      for (int64_t j = 0; j < inner; ++j) out[o + j * os[last]] = src[i + j * is[last]];
    }
  });
}

// A Copy whose one load is a single strided view (masked or not) of the output's dtype -- im2col,
// padding, transposes: written row by row along the view's last dimension straight from the
// source (no registers), rows split over the pool. False when the Step is not of that form.
bool run_view_copy(const Step& st, const LaunchArgs& args) {
  if (st.kind != StepKind::Copy || st.program.size() != 1 || st.program[0].code != Code::Load) return false;
  const Instr& I = st.program[0];
  if (I.dtype != st.dtype || I.map.effective_top() != 0 || numel(st.shape) == 0) return false;
  const kir::View& v = I.map.views[0];
  const Shape& s = v.shape;
  if (s.empty() || s.size() > 32) return false;
  size_t r = s.size(), last = r - 1;
  int64_t inner = s[last], rows = numel(s) / inner, st_in = v.strides[last];
  bool masked = v.masked();
  if (masked && inner <= 4) return run_box_copy(st, I, args), true;
  with_storage(st.dtype, [&](auto* sp) {
    using S = std::remove_pointer_t<decltype(sp)>;
    const S* src = static_cast<const S*>(args.slots[st.inputs[I.input]]);
    S* out = static_cast<S*>(args.slots[st.output]);
    S pad = from_c<S>(I.value);
    int nt = numel(st.shape) >= kParallelMin ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(nt)
    {
      int t = omp_get_thread_num(), n = omp_get_num_threads();
      int64_t r0 = rows * t / n, r1 = rows * (t + 1) / n;
      int64_t idx[32] = {0}, off = v.offset;
      unravel(r0, Shape(s.begin(), s.end() - 1), idx);
      for (size_t d = 0; d < last; ++d) off += idx[d] * v.strides[d];
      for (int64_t row = r0; row < r1; ++row) {
        S* o = out + row * inner;
        int64_t a = 0, b = inner;
        if (masked) {
          bool ok = true;
          for (size_t d = 0; d < last; ++d) ok &= idx[d] >= v.lo[d] && idx[d] < v.hi[d];
          a = ok ? std::clamp<int64_t>(v.lo[last], 0, inner) : 0;
          b = ok ? std::clamp<int64_t>(v.hi[last], a, inner) : 0;
          std::fill(o, o + a, pad);
          std::fill(o + b, o + inner, pad);
        }
        const S* p = src + off + a * st_in;
        if (st_in == 1) {
          if (o + a != p) std::memmove(o + a, p, size_t(b - a) * sizeof(S));
        }
        else for (int64_t j = a; j < b; ++j) o[j] = p[(j - a) * st_in];
        next_outer(idx, off, v, last);
      }
    }
  });
  return true;
}

// Copies with non-temporal stores (no read-for-ownership of the destination, no cache
// pollution), for outputs far larger than the caches; 16-byte aligned pointers, else memcpy.
void stream_copy(void* dst, const void* src, size_t bytes) {
#if defined(__SSE2__)
  auto* d = static_cast<char*>(dst);
  auto* s = static_cast<const char*>(src);
  if ((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(s)) % 16 == 0) {
    size_t i = 0;
    for (; i + 16 <= bytes; i += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), _mm_load_si128(reinterpret_cast<const __m128i*>(s + i)));
    std::memcpy(d + i, s + i, bytes - i);
    _mm_sfence();  // ordered before this thread's later stores and the pool's barrier
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

// A compiled Step: its program's register plan and, for Elementwise, Copy and Reduce Steps,
// the program and domain as run (loads' views coalesced, permuted along with the domain).
struct CpuKernel : Kernel {
  RegPlan regs;
  std::vector<Instr> program;
  Shape domain;
  // Elementwise Steps walked in a permuted order (interleave_order): where each position's
  // output element lies, as a view over `domain`.
  std::optional<kir::View> out;
  std::vector<int> last_read;  // per instruction of `program`: its last reader (results: past the end)
  // Elementwise and float32 Reduce Steps within jit::build's reach (see build_loop): the program
  // as a native loop over runs of `run` positions, the domain's last dims, along which every
  // load walks memory evenly (dense, constant or strided); `run_outer` is the domain's other
  // dims. stream_loop: the same with non-temporal stores, for a single run far larger than the
  // caches. A Step with `out` has its permuted program and output view before coalescing
  // (walk_program, walk_out; kept only when its loop is built), which the loop runs over and
  // stores through (out_offset, out_outer_strides, out_stride).
  std::unique_ptr<jit::Loop> loop, stream_loop;
  int64_t run = 0;
  Shape run_outer;
  std::vector<Instr> walk_program;
  kir::View walk_out;
  std::vector<int64_t> out_outer_strides;
  int64_t out_offset = 0, out_stride = 1;
  bool masked_last = false;  // a load masked along the last outer dim (each run a call)
  struct LoopLoad {
    std::vector<int64_t> outer_strides;
    int64_t first = 0;   // elements from the view's offset to the first one read
    int64_t span = 0;    // elements from the first one read to the last, plus one (0: none)
    bool whole = false;  // dense over the whole domain (may be its own output, position for position)
    int64_t stride = 0;  // elements from one position of the run to the next (jit::Spec::stride)
    std::vector<int64_t> lo, hi;  // a masked view's mask over the outer dims (empty: none)
    std::vector<float> pad;       // and what its masked runs read
    bool valid(const int64_t* idx) const {
      for (size_t d = 0; d < lo.size(); ++d)
        if (idx[d] < lo[d] || idx[d] >= hi[d]) return false;
      return true;
    }
    // Elements from the load's first one to its run at outer index idx (over run_outer).
    int64_t offset(const int64_t* idx) const {
      int64_t o = 0;
      for (size_t d = 0; d < outer_strides.size(); ++d) o += idx[d] * outer_strides[d];
      return o;
    }
  };
  std::vector<LoopLoad> loop_loads;  // in loop->loads() order
  // A float32 Gemm Step whose B (a conv's im2col window) window_gemm reads in place: per batch
  // element, B's offset and which of A's distinct matrices it multiplies (at a_off, rows a_rs
  // apart, columns a_cs); B's element (k, n) of a batch lies k_off[k] + n_off[n] further.
  struct Window {
    std::vector<int64_t> b_off, a_off, k_off, n_off;
    std::vector<int> a_of;
    int64_t a_rs = 0, a_cs = 0;
  };
  std::optional<Window> window;
};

// The view with adjacent dims merged where they walk memory as one (stride[d] = stride[d + 1] *
// extent[d + 1], neither masked) and unmasked extent-1 dims dropped: the same row-major positions
// in fewer, longer rows for load_strided and store_reg.
kir::View coalesced(const kir::View& v) {
  kir::View r;
  r.offset = v.offset;
  const bool masked = v.masked();
  auto whole = [&](size_t d) { return !masked || (v.lo[d] <= 0 && v.hi[d] >= v.shape[d]); };
  bool prev_whole = false, any_mask = false;
  for (size_t d = 0; d < v.shape.size(); ++d) {
    const bool w = whole(d);
    if (w && v.shape[d] == 1) continue;
    if (w && prev_whole && r.strides.back() == v.strides[d] * v.shape[d]) {
      r.shape.back() *= v.shape[d];
      r.strides.back() = v.strides[d];
      if (masked) r.hi.back() = r.shape.back();
      continue;
    }
    r.shape.push_back(v.shape[d]);
    r.strides.push_back(v.strides[d]);
    if (masked) r.lo.push_back(w ? 0 : v.lo[d]), r.hi.push_back(w ? v.shape[d] : v.hi[d]);
    prev_whole = w;
    any_mask |= !w;
  }
  if (!any_mask) r.lo.clear(), r.hi.clear();
  return r;
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

// An Elementwise or Copy Step's program as run: in interleave_order when every load stays one
// strided view there, with each load's view coalesced.
void prepare_elementwise(CpuKernel& k, const Step& st) {
  k.program = st.program;
  k.domain = st.shape;
  if (std::vector<int64_t> perm = interleave_order(st); !perm.empty()) {
    if (std::vector<Instr> prog = permuted(st.program, perm); !prog.empty()) {
      k.program = k.walk_program = std::move(prog);
      k.walk_out = kir::IndexMap::contiguous(st.shape).permute(perm).views[0];
      k.domain = k.walk_out.shape;
      k.out = coalesced(k.walk_out);
    }
  }
  for (Instr& I : k.program)
    if (I.code == Code::Load && I.map.views.size() == 1) I.map.views[0] = coalesced(I.map.views[0]);
}

// Which results of an Elementwise Step write their output themselves (per instruction: the
// output's base, else null): those computed (not loaded, constant or iota) in the output's own
// type, stored in row-major order, one output per instruction, and -- when the output is also an
// input (an in-place update) -- computed after every load of it has been read for the last time.
std::vector<char*> direct_outputs(const CpuKernel& k, const Step& st, const std::vector<const void*>& in,
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

constexpr int kMaxLoopPtrs = jit::Loop::kMaxPtrs;
// Runs of fewer positions stay with the interpreter (a call per few positions), unless a call
// covers at least kMinCall positions (the runs along the outer dim next to them, stepped through
// by the loop: a 7-wide pooling output's rows).
constexpr int64_t kMinRun = 8, kMinCall = 32;

// The native loop (CpuKernel::loop) of `prog` over domain `dom`, storing `results` (see
// jit::Spec for `early`), when the program is within jit::build's reach and every load is one
// view that walks the domain's last dims (see kMinRun) evenly: densely, not at all, or by a fixed
// stride (gathered). `out`: where the positions' outputs lie (null: densely, in order), walked
// evenly too; then loads may be masked along the other dims (a pooling gradient's taps, each a
// block of the interleaved domain), run_loop reading their pad for a masked run. may_stream: a
// single run far larger than the caches also gets non-temporal stores.
void build_loop(CpuKernel& k, const std::vector<Instr>& prog, const Shape& dom, const std::vector<int>& results,
                const std::vector<uint8_t>& early, bool may_stream, const kir::View* out = nullptr) {
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
  // The run: the longest suffix of the domain along which each view walks memory evenly, unmasked:
  // its elements from one position to the next (0: constant, 1: dense, more: gathered).
  std::vector<int64_t> per(views.size(), -1);
  int64_t run = 1;
  size_t first = dom.size();
  for (; first > 0; --first) {
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
  const int64_t per_call = run * (first > 0 ? dom[first - 1] : 1);
  if ((run < kMinRun && (run < 4 || per_call < kMinCall)) || int(views.size() + results.size()) > kMaxLoopPtrs) return;
  if (out && (per.back() == 0 || results.size() != 1)) return;

  jit::Spec spec;
  spec.prog = &prog;
  spec.stride.assign(prog.size(), 0);
  for (size_t i = 0, l = 0; i < prog.size(); ++i)
    if (prog[i].code == Code::Load) spec.stride[i] = per[l++];
  spec.results = results;
  spec.early = early;
  if (out) spec.out_stride = per.back();
  k.loop = jit::build(spec);
  if (!k.loop) return;
  if (may_stream && !out && run == numel(dom) && run * 4 >= kStreamMin) spec.stream = true, k.stream_loop = jit::build(spec);
  k.run = run;
  k.run_outer.assign(dom.begin(), dom.begin() + std::ptrdiff_t(first));
  if (out) {
    k.out_outer_strides.assign(out->strides.begin(), out->strides.begin() + std::ptrdiff_t(first));
    k.out_offset = out->offset, k.out_stride = per.back();
  }
  for (int i : k.loop->loads()) {
    const kir::View& v = prog[size_t(i)].map.views[0];
    CpuKernel::LoopLoad L;
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
      k.masked_last |= first > 0 && (L.lo.back() > 0 || L.hi.back() < dom[first - 1]);
      L.pad.assign(size_t((run - 1) * spec.stride[size_t(i)] + 1), float(prog[size_t(i)].value));
    }
    L.whole = !out && prog[size_t(i)].map.is_contiguous();
    L.stride = spec.stride[size_t(i)];
    k.loop_loads.push_back(std::move(L));
  }
}

// An Elementwise Step's loop: its results early unless a later load reads their output. A Step
// walked in interleave_order runs its permuted program over the permuted domain, storing through
// CpuKernel::out.
void build_loops(CpuKernel& k, const Step& st) {
  if (st.kind == StepKind::Gemm && st.dtype == DType::Float32 && !st.program.empty()) {
    // A GEMM's epilogue, over its loads' domain (the consumer's shape), its result in place.
    Shape dom = st.shape;
    for (const Instr& I : st.program)
      if (I.code == Code::Load) dom = I.map.shape();
    return build_loop(k, st.program, dom, {int(st.program.size()) - 1}, {1}, false);
  }
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
  if (!k.out) return build_loop(k, st.program, st.shape, results, early, true);
  build_loop(k, k.walk_program, k.walk_out.shape, results, early, false, &k.walk_out);
  if (!k.loop) k.walk_program.clear();
}

// A Reduce Step's loop over its own domain and program (ReduceKernel), writing the value to be
// reduced, float32 only: loop_range runs it over a tile. Not for a lone load, which the
// interpreter reduces in place (a bias gradient's sum of a GEMM's output).
void build_reduce_loop(CpuKernel& k, const Step& st, const std::vector<Instr>& prog, const Shape& dom) {
  if (st.dtype == DType::Float32 && prog.size() > 1) build_loop(k, prog, dom, {int(prog.size()) - 1}, {1}, false);
}

// A program's loop over positions [start, start + n) of its domain, run piece by run piece, its
// result into out (position start first): a Reduce's values, a GEMM epilogue's block.
void loop_range(const CpuKernel& k, const std::vector<char*>& base, int64_t start, int64_t n, float* out) {
  const size_t nl = k.loop->loads().size();
  const void* p[kMaxLoopPtrs];
  int64_t idx[32];
  for (int64_t pos = start, end = start + n; pos < end;) {
    const int64_t j = pos % k.run, len = std::min(k.run - j, end - pos);
    unravel(pos / k.run, k.run_outer, idx);
    for (size_t i = 0; i < nl; ++i) {
      const CpuKernel::LoopLoad& L = k.loop_loads[i];
      p[i] = base[i] + (L.offset(idx) + j * L.stride) * 4;
    }
    p[nl] = out + (pos - start);
    (*k.loop)(p, len);
    pos += len;
  }
}

// The first element of each of the loop's loads (at its view's offset).
void load_bases(const jit::Loop& loop, const std::vector<Instr>& prog, const std::vector<const void*>& in, std::vector<char*>& base) {
  base.clear();
  for (int l : loop.loads()) {
    const Instr& I = prog[size_t(l)];
    base.push_back(const_cast<char*>(static_cast<const char*>(in[size_t(I.input)])) + I.map.views[0].offset * 4);
  }
}

// The loop to run this launch with and its pointers at position 0 (loads, then outputs), or
// null: when an output overlaps an input other than as the same slot read position for position
// (what build_loops's early stores assume), or in any way the loop does not store in order.
const jit::Loop* loop_for(const CpuKernel& k, const Step& st, const std::vector<const void*>& in,
                          const LaunchArgs& args, std::vector<char*>& base) {
  if (!k.loop) return nullptr;
  const jit::Loop* loop = k.stream_loop ? k.stream_loop.get() : k.loop.get();
  const std::vector<Instr>& prog = k.out ? k.walk_program : st.program;
  const std::vector<int>& loads = loop->loads();
  load_bases(*loop, prog, in, base);
  const size_t out_bytes = size_t(numel(st.shape)) * 4;
  for (size_t o = 0; o <= st.more_outputs.size(); ++o) {
    const int slot = o == 0 ? st.output : st.more_outputs[o - 1];
    char* out = static_cast<char*>(args.slots[slot]);
    if (loop->streams() && reinterpret_cast<uintptr_t>(out) % 32) loop = k.loop.get();
    for (size_t l = 0; l < loads.size(); ++l) {
      const CpuKernel::LoopLoad& L = k.loop_loads[l];
      const char* lo = base[l] + L.first * 4;
      const bool overlap = L.span && lo < out + out_bytes && out < lo + L.span * 4;
      const bool same = base[l] == out && L.whole && st.inputs[size_t(prog[size_t(loads[l])].input)] == slot;
      if (overlap && !same) return nullptr;
    }
    base.push_back(out + k.out_offset * 4);
  }
  return loop;
}

// An Elementwise Step through its native loop: tiles of a single run, else blocks of runs. The
// runs along the last outer dim are one call (each pointer stepping by that dim's stride); the
// pointers are placed along the other outer dims per call. A masked load reads its pad for the
// runs outside its mask (the pad stays put along the call's runs).
void run_loop(const CpuKernel& k, const jit::Loop& loop, const std::vector<char*>& base, int64_t total) {
  const size_t nloads = loop.loads().size(), nptr = base.size();
  const bool one_run = k.run == total;
  const int64_t per = one_run ? kTile : std::max<int64_t>(1, kTile / k.run);  // positions or runs per task
  const int64_t units = one_run ? total : total / k.run, ntasks = (units + per - 1) / per;
  const size_t last = k.run_outer.empty() ? 0 : k.run_outer.size() - 1;
  const bool strided_out = !k.out_outer_strides.empty();
  auto out_offset = [&](const int64_t* idx) {
    int64_t o = 0;
    for (size_t d = 0; d < k.out_outer_strides.size(); ++d) o += idx[d] * k.out_outer_strides[d];
    return o;
  };
  const bool masked = std::any_of(k.loop_loads.begin(), k.loop_loads.end(), [](const auto& L) { return !L.lo.empty(); });
  int64_t steps[kMaxLoopPtrs];
  for (size_t i = 0; i < nptr && !one_run; ++i)
    steps[i] = (i < nloads ? k.loop_loads[i].outer_strides[last] : strided_out ? k.out_outer_strides[last] : k.run) * 4;
#pragma omp parallel for schedule(static) if (total >= kParallelMin)
  for (int64_t t = 0; t < ntasks; ++t) {
    const void* p[kMaxLoopPtrs];
    int64_t step[kMaxLoopPtrs];
    const int64_t u0 = t * per, u1 = std::min(units, u0 + per);
    if (one_run) {  // a load constant over the domain stays put
      for (size_t i = 0; i < nptr; ++i) p[i] = base[i] + u0 * (i < nloads ? k.loop_loads[i].stride : k.out_stride) * 4;
      loop(p, u1 - u0);
      continue;
    }
    int64_t idx[32];
    unravel(u0, k.run_outer, idx);
    for (int64_t r = u0; r < u1;) {
      const int64_t rows = k.masked_last ? 1 : std::min(u1 - r, k.run_outer[last] - idx[last]);
      if (masked) std::copy(steps, steps + nptr, step);
      for (size_t i = 0; i < nloads; ++i) {
        const CpuKernel::LoopLoad& L = k.loop_loads[i];
        if (L.lo.empty() || L.valid(idx)) p[i] = base[i] + L.offset(idx) * 4;
        else p[i] = L.pad.data(), step[i] = 0;
      }
      for (size_t i = nloads; i < nptr; ++i) p[i] = base[i] + (strided_out ? out_offset(idx) : r * k.run) * 4;
      loop(p, k.run, rows, masked ? step : steps);
      r += rows;
      idx[last] += rows - 1;
      bump(idx, k.run_outer);
    }
  }
}

void run_elementwise(const CpuKernel& k, const Step& st, const LaunchArgs& args) {
  const int64_t total = numel(st.shape);
  auto in = inputs_of(st, args);
  void* out = args.slots[st.output];
  std::vector<char*> base;
  if (const jit::Loop* loop = loop_for(k, st, in, args, base)) return run_loop(k, *loop, base, total);
  const int64_t ntiles = (total + kTile - 1) / kTile;
  // An output far larger than the caches and the Step's only one is streamed out of its register.
  const kir::View* view = k.out ? &*k.out : nullptr;
  const bool stream = st.more_outputs.empty() && compute_dtype(st.dtype) == st.dtype && !view &&
                      total * int64_t(itemsize(st.dtype)) >= kStreamMin;
  const std::vector<char*> direct = direct_outputs(k, st, in, args, stream);
  const int last = int(st.program.size()) - 1;
#pragma omp parallel for schedule(static) if (total >= kParallelMin)
  for (int64_t t = 0; t < ntiles; ++t) {
    Scratch& sc = scratch(st.program.size(), size_t(k.regs.nregs));
    int64_t start = t * kTile, n = std::min(kTile, total - start);
    run_program(k.program, k.regs, in, k.domain, start, n, args, sc, 0, direct.data());
    if (stream) {
      stream_copy(static_cast<char*>(out) + size_t(start) * itemsize(st.dtype), sc.at[size_t(last)],
                  size_t(n) * itemsize(st.dtype));
      continue;
    }
    if (!st.more_outputs.empty()) {
      // Values read in place are copied out first: an earlier store may overwrite their source.
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
    if (direct[size_t(last)] != out) store_reg(st.dtype, last, out, start, n, sc, view);
    for (size_t o = 0; o < st.more_outputs.size(); ++o) {
      int r = st.more_results[o];
      if (direct[size_t(r)] != args.slots[st.more_outputs[o]])
        store_reg(st.program[r].dtype, r, args.slots[st.more_outputs[o]], start, n, sc, view);
    }
  }
}

// Row: tiles of whole rows; the output is the program (one value per position) or, when the
// Step's shape has one element per row, the first lane of each row.
void run_row(const CpuKernel& k, const Step& st, const LaunchArgs& args) {
  int64_t total = numel(st.domain), row = st.row;
  int64_t rows_per_tile = std::max<int64_t>(1, kTile / row), lanes = rows_per_tile * row;
  int64_t ntiles = (total + lanes - 1) / lanes;
  bool per_row = numel(st.shape) != total;
  auto in = inputs_of(st, args);
  void* out = args.slots[st.output];
  int last = int(st.program.size()) - 1;
  auto compact = [&](int r) { return !k.regs.rowc.empty() && k.regs.rowc[size_t(r)]; };  // one lane per row
  // Instruction r's value once per row (its first position's, or its lane r when compact).
  auto store_rows = [&](Scratch& sc, int r, DType t, void* dst, int64_t start, int64_t n) {
    with_compute(t, [&](auto* tp) {
      using T = std::remove_pointer_t<decltype(tp)>;
      const T* v = val<T>(sc, r);
      const int64_t step = compact(r) ? 1 : row;
      with_storage(t, [&](auto* sp) {
        using S = std::remove_pointer_t<decltype(sp)>;
        S* o = static_cast<S*>(dst) + start / row;
        for (int64_t j = 0; j < n / row; ++j) o[j] = store_as<S>(v[j * step]);
      });
    });
  };
#pragma omp parallel for schedule(static) if (total >= kParallelMin && ntiles > 1)
  for (int64_t t = 0; t < ntiles; ++t) {
    Scratch& sc = scratch(st.program.size(), size_t(k.regs.nregs), lanes);
    int64_t start = t * lanes, n = std::min(lanes, total - start);
    run_program(st.program, k.regs, in, st.domain, start, n, args, sc, row);
    for (size_t o = 0; o < st.more_outputs.size(); ++o) {
      int r = st.more_results[o];
      store_rows(sc, r, st.program[size_t(r)].dtype, args.slots[st.more_outputs[o]], start, n);
    }
    if (per_row) {
      store_rows(sc, last, st.dtype, out, start, n);
      continue;
    }
    if (compact(last))
      with_compute(st.dtype, [&](auto* tp) {
        using T = std::remove_pointer_t<decltype(tp)>;
        T* v = reg<T>(sc, k.regs.reg[size_t(last)]);
        expand_rows(v, v, n / row, row);
      });
    store_tile(st, out, start, n, sc);
  }
}

// Reduce: the domain is permuted so kept axes come first; output o then owns the contiguous
// range [o * R, (o + 1) * R) of the permuted domain, reduced in order (deterministic).
struct ReduceKernel : CpuKernel {  // program and domain permuted to the kept-first order
  int64_t outer = 1, inner = 1;
  // When the reduced axes all come before the kept ones (column sums, bias gradients), the
  // domain is walked in its own order, each row adding into a vector of accumulators.
  bool columns = false;
};

// The values a Reduce reduces at positions [start, start + n <= kTile) of its domain: through its
// loop (float32) into this thread's buffer, else by the interpreter.
template <class T>
const T* reduce_tile(const ReduceKernel& k, const std::vector<const void*>& in, const std::vector<char*>& base,
                     const LaunchArgs& args, Scratch& sc, int64_t start, int64_t n) {
  if constexpr (std::is_same_v<T, float>)
    if (k.loop) {
      thread_local std::vector<float, LineAligned<float>> buf(kTile);
      loop_range(k, base, start, n, buf.data());
      return buf.data();
    }
  run_program(k.program, k.regs, in, k.domain, start, n, args, sc);
  return val<T>(sc, int(k.program.size()) - 1);
}

void run_column_reduce(const ReduceKernel& k, const Step& st, const LaunchArgs& args) {
  auto in = inputs_of(st, args);
  std::vector<char*> base;
  if (k.loop) load_bases(*k.loop, k.program, in, base);
  int64_t K = k.outer, R = k.inner;  // kept extent, reduced extent
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
        Scratch& sc = scratch(k.program.size(), size_t(k.regs.nregs));
        int64_t k0 = b * kTile, n = std::min(kTile, K - k0);
        std::vector<Acc> sum(size_t(n), Acc(0));
        std::vector<T> mx(size_t(n), std::is_floating_point_v<T> ? -std::numeric_limits<T>::infinity()
                                                                 : std::numeric_limits<T>::lowest());
        for (int64_t r = 0; r < R; ++r) {  // rows in order: deterministic
          const T* v = reduce_tile<T>(k, in, base, args, sc, r * K + k0, n);
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

void run_reduce(const ReduceKernel& k, const Step& st, const LaunchArgs& args) {
  auto in = inputs_of(st, args);
  std::vector<char*> base;
  if (k.loop) load_bases(*k.loop, k.program, in, base);
  void* out = args.slots[st.output];
  bool is_max = st.reduce_op == ir::Op::ReduceMax;
  int64_t outer = k.outer, inner = k.inner;
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
        Scratch& sc = scratch(k.program.size(), size_t(k.regs.nregs));
        int64_t oe = std::min(outer, ob + group);
        Acc sum[64];
        T mx[64];
        for (int64_t j = 0; j < oe - ob; ++j) sum[j] = 0, mx[j] = std::numeric_limits<T>::lowest();
        if constexpr (std::is_floating_point_v<T>)
          for (int64_t j = 0; j < oe - ob; ++j) mx[j] = -std::numeric_limits<T>::infinity();
        int64_t lo = ob * inner, hi = oe * inner;
        for (int64_t start = lo; start < hi; start += kTile) {
          int64_t n = std::min(kTile, hi - start);
          const T* r = reduce_tile<T>(k, in, base, args, sc, start, n);
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

// Copies n consecutive row-major positions of map m's domain, from position `start`, densely into
// dst; masked positions read 0. A single unmasked view (plain reshapes above it keep its order) is
// walked row by row along its last dimension, dense runs as one copy; other maps go through
// tile_offsets.
void copy_positions(const kir::IndexMap& m, const void* src, int64_t start, int64_t n, void* dst, size_t elem) {
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  const size_t top = m.effective_top();
  const kir::View& v = m.views[top];
  if (top == 0 && !v.masked() && !v.shape.empty()) {
    const size_t last = v.shape.size() - 1;
    const int64_t inner = v.shape[last], st = v.strides[last];
    int64_t idx[32] = {}, off = v.offset;
    unravel(start, v.shape, idx);
    for (size_t k = 0; k < last; ++k) off += idx[k] * v.strides[k];
    for (int64_t j = idx[last]; n > 0; j = 0, next_outer(idx, off, v, last)) {
      const int64_t run = std::min(n, inner - j);
      const char* p = s + (off + j * st) * int64_t(elem);
      if (st == 1) std::memcpy(d, p, size_t(run) * elem);
      else for (int64_t q = 0; q < run; ++q) std::memcpy(d + size_t(q) * elem, p + q * st * int64_t(elem), elem);
      d += size_t(run) * elem;
      n -= run;
    }
    return;
  }
  constexpr int64_t kChunk = 256;
  int64_t off[kChunk];
  uint8_t valid[kChunk];
  for (int64_t p = 0; p < n; p += kChunk) {
    const int64_t c = std::min(kChunk, n - p);
    tile_offsets(m, start + p, c, off, valid);
    for (int64_t q = 0; q < c; ++q, d += elem)
      if (valid[q]) std::memcpy(d, s + off[q] * int64_t(elem), elem);
      else std::memset(d, 0, elem);
  }
}

// The whole of map m's domain, densely; large copies in fixed chunks over the pool.
void copy_map(const kir::IndexMap& m, const void* src, void* dst, size_t elem) {
  const int64_t n = numel(m.shape()), chunks = (n + kParallelMin - 1) / kParallelMin;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t start = c * kParallelMin;
    copy_positions(m, src, start, std::min(kParallelMin, n - start), static_cast<char*>(dst) + size_t(start) * elem, elem);
  }
}

int64_t read_index(const void* base, DType t, int64_t off) {
  return t == DType::Int32 ? static_cast<const int32_t*>(base)[off] : static_cast<const int64_t*>(base)[off];
}

[[noreturn]] void index_error(const Step& st, int64_t v, int64_t extent, const Shape& src) {
  const kir::Source& s = st.sources.front();
  fail(s.op, "index " + std::to_string(v) + " out of range [0, " + std::to_string(extent) + ") along dimension " +
                 std::to_string(st.axis) + " of a tensor of shape " + shape_str(src),
       s.scope);
}

// Gather and scatter-add walk the index row by row along the last dimension: a row's offsets are
// computed once and each element steps by the views' last strides; a row with one index (an
// embedding's) is checked once and moved as a run. Row-major order, so the first out-of-range
// index is the one reported and scatter-add adds in a fixed order.
struct IndexRows {
  Shape outer;  // the index's shape but the last dimension
  int64_t last, inner, rows, ax, istride, sstride;
  bool along_last;
  std::vector<int64_t> idx;  // the row's position over every dimension but the last
  // iv: the index's view; sv: the view walked along the row besides it (gather's source,
  // scatter-add's updates).
  IndexRows(const Step& st, const kir::View& iv, const kir::View& sv)
      : outer(iv.shape.begin(), iv.shape.end() - 1), last(int64_t(iv.shape.size()) - 1), inner(iv.shape[size_t(last)]),
        rows(inner ? numel(iv.shape) / inner : 0), ax(st.axis), istride(iv.strides[size_t(last)]),
        sstride(sv.strides[size_t(last)]), along_last(st.axis == last), idx(size_t(last), 0) {}
  // Offset in view v of the row's first element; the axis term left out when skip_axis.
  int64_t row_offset(const kir::View& v, bool skip_axis) const {
    int64_t o = v.offset;
    for (int64_t d = 0; d < last; ++d)
      if (!(skip_axis && d == ax)) o += idx[size_t(d)] * v.strides[size_t(d)];
    return o;
  }
  void next() { bump(idx.data(), outer); }
};

void run_gather(const Step& st, const LaunchArgs& args, DType src_t, DType idx_t) {
  const kir::View& sv = st.maps[0].views[0];
  const kir::View& iv = st.maps[1].views[0];
  const char* src = static_cast<const char*>(args.slots[st.inputs[0]]);
  const void* index = args.slots[st.inputs[1]];
  char* out = static_cast<char*>(args.slots[st.output]);
  const size_t elem = itemsize(src_t);
  const int64_t extent = sv.shape[size_t(st.axis)], sax = sv.strides[size_t(st.axis)];
  IndexRows w(st, iv, sv);
  for (int64_t row = 0; row < w.rows; ++row, w.next()) {
    const int64_t ioff = w.row_offset(iv, false), soff = w.row_offset(sv, true);
    char* o = out + size_t(row * w.inner) * elem;
    if (!w.along_last && w.istride == 0) {
      int64_t v = read_index(index, idx_t, ioff);
      if (v < 0 || v >= extent) index_error(st, v, extent, sv.shape);
      const char* p = src + size_t(soff + v * sax) * elem;
      if (w.sstride == 1) std::memcpy(o, p, size_t(w.inner) * elem);
      else for (int64_t j = 0; j < w.inner; ++j) std::memcpy(o + size_t(j) * elem, p + j * w.sstride * int64_t(elem), elem);
      continue;
    }
    for (int64_t j = 0; j < w.inner; ++j) {
      int64_t v = read_index(index, idx_t, ioff + j * w.istride);
      if (v < 0 || v >= extent) index_error(st, v, extent, sv.shape);
      int64_t so = soff + v * sax + (w.along_last ? 0 : j * w.sstride);
      std::memcpy(o + size_t(j) * elem, src + size_t(so) * elem, elem);
    }
  }
}

void run_scatter_add(const Step& st, const LaunchArgs& args, DType t, DType idx_t) {
  const kir::View& iv = st.maps[1].views[0];
  const kir::View& sv = st.maps[2].views[0];
  void* out = args.slots[st.output];
  copy_map(st.maps[0], args.slots[st.inputs[0]], out, itemsize(t));
  const void* index = args.slots[st.inputs[1]];
  const std::vector<int64_t> ostr = contiguous_strides(st.shape);
  const int64_t extent = st.shape[size_t(st.axis)], oax = ostr[size_t(st.axis)];
  kir::View ov{st.shape, ostr, 0, {}, {}};  // the output as a view, for row offsets
  IndexRows w(st, iv, sv);
  with_storage(t, [&](auto* sp) {
    using S = std::remove_pointer_t<decltype(sp)>;
    S* o = static_cast<S*>(out);
    const S* src = static_cast<const S*>(args.slots[st.inputs[2]]);
    auto add = [](S& dst, S v) {
      if constexpr (std::is_same_v<S, F16> || std::is_same_v<S, BF16>) dst = from_c<S>(to_c<float>(dst) + to_c<float>(v));
      else dst = S(dst + v);
    };
    for (int64_t row = 0; row < w.rows; ++row, w.next()) {
      const int64_t ioff = w.row_offset(iv, false), soff = w.row_offset(sv, false), obase = w.row_offset(ov, true);
      if (!w.along_last && w.istride == 0) {
        int64_t v = read_index(index, idx_t, ioff);
        if (v < 0 || v >= extent) index_error(st, v, extent, st.shape);
        S* q = o + obase + v * oax;
        for (int64_t j = 0; j < w.inner; ++j) add(q[j], src[soff + j * w.sstride]);
        continue;
      }
      for (int64_t j = 0; j < w.inner; ++j) {
        int64_t v = read_index(index, idx_t, ioff + j * w.istride);
        if (v < 0 || v >= extent) index_error(st, v, extent, st.shape);
        add(o[obase + v * oax + (w.along_last ? 0 : j)], src[soff + j * w.sstride]);
      }
    }
  });
}

void run_dus(const Step& st, const LaunchArgs& args) {
  const kir::View& uv = st.maps[1].views[0];
  const kir::View& ov = st.maps[2].views[0];
  size_t elem = itemsize(st.dtype);
  char* out = static_cast<char*>(args.slots[st.output]);
  copy_map(st.maps[0], args.slots[st.inputs[0]], out, elem);
  size_t r = st.shape.size();
  std::vector<int64_t> start(r), ostr = contiguous_strides(st.shape), idx(r, 0);
  for (size_t d = 0; d < r; ++d) {
    int64_t v = static_cast<const int64_t*>(args.slots[st.inputs[2]])[ov.offset + int64_t(d) * ov.strides[0]];
    start[d] = std::clamp<int64_t>(v, 0, st.shape[d] - uv.shape[d]);
  }
  const char* upd = static_cast<const char*>(args.slots[st.inputs[1]]);
  int64_t total = numel(uv.shape);
  for (int64_t i = 0; i < total; ++i) {
    int64_t uoff = uv.offset, ooff = 0;
    for (size_t d = 0; d < r; ++d) uoff += idx[d] * uv.strides[d], ooff += (start[d] + idx[d]) * ostr[d];
    std::memcpy(out + size_t(ooff) * elem, upd + size_t(uoff) * elem, elem);
    bump(idx.data(), uv.shape);
  }
}

// C[m, n] = op(A)[m, k] @ op(B)[k, n] through the BLAS, row-major, R float or double.
template <class R>
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const R* a, int64_t lda, const R* b, int64_t ldb, R* c,
               int64_t ldc) {
  auto oa = ta ? CblasTrans : CblasNoTrans, ob = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<R, float>) cblas_sgemm(CblasRowMajor, oa, ob, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
  else cblas_dgemm(CblasRowMajor, oa, ob, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc);
}

// One operand of a matmul as BLAS sees it. One that is not BLAS-addressable (an im2col window,
// a stacked map) is packed densely: per_block (a floating product over several batches), block
// by block inside the task that multiplies it (see pack_rows), so a conv's columns are written
// into the cache of the core that reads them rather than through a buffer of the whole batch;
// otherwise as a whole.
struct GemmOperand {
  std::vector<int64_t> batch_strides;
  int64_t offset = 0, ld = 0;
  bool trans = false;
  const void* data = nullptr;
  const kir::IndexMap* pack = nullptr;  // packed per block from this map
  std::vector<char> packed;              // packed as a whole
};

GemmOperand gemm_operand(const kir::IndexMap& m, const void* data, DType t, bool per_block) {
  GemmOperand g;
  const Shape& s = m.shape();
  size_t r = s.size();
  int64_t rows = s[r - 2], cols = s[r - 1];
  g.data = data;
  if (m.single()) {
    const kir::View& v = m.views[0];
    const int64_t sr = v.strides[r - 2], sc = v.strides[r - 1];
    g.batch_strides.assign(v.strides.begin(), v.strides.end() - 2);
    g.offset = v.offset;
    if ((sc == 1 || cols <= 1) && (sr >= std::max<int64_t>(cols, 1) || rows <= 1)) {
      g.ld = rows <= 1 ? std::max<int64_t>(cols, 1) : sr;
      return g;
    }
    if ((sr == 1 || rows <= 1) && (sc >= std::max<int64_t>(rows, 1) || cols <= 1)) {
      g.trans = true;
      g.ld = cols <= 1 ? std::max<int64_t>(rows, 1) : sc;
      return g;
    }
  }
  g.ld = std::max<int64_t>(cols, 1);
  g.offset = 0;
  g.batch_strides = contiguous_strides(Shape(s.begin(), s.end() - 2));
  for (auto& b : g.batch_strides) b *= rows * cols;
  if (per_block) {
    g.pack = &m;
    return g;
  }
  g.packed.resize(size_t(numel(s)) * itemsize(t));
  copy_map(m, data, g.packed.data(), itemsize(t));
  g.data = g.packed.data();
  return g;
}

// Rows [r0, r1) of batch b of an operand packed per block, densely into this thread's buffer for
// operand `which` (0: A, 1: B).
const void* pack_rows(const GemmOperand& g, int which, int64_t b, int64_t r0, int64_t r1, size_t elem) {
  thread_local std::vector<char, LineAligned<char>> bufs[2];
  std::vector<char, LineAligned<char>>& buf = bufs[which];
  const Shape& s = g.pack->shape();
  const int64_t cols = s.back();
  buf.resize(std::max(buf.size(), size_t((r1 - r0) * cols) * elem));
  copy_positions(*g.pack, g.data, (b * s[s.size() - 2] + r0) * cols, (r1 - r0) * cols, buf.data(), elem);
  return buf.data();
}

// c[e] = part[e] + part[n + e] + ... + part[(chunks - 1) * n + e], added in that order, for e < n:
// split-K partial products summed. Blocks of e take every chunk in turn, so each chunk is read
// in runs (the chunks lie a multiple of 4 KiB apart, whose same elements share an L1 set).
template <class R>
void sum_partials(const R* part, int64_t chunks, int64_t n, R* c) {
  constexpr int64_t kRun = 1024;
#pragma omp parallel for schedule(static) if (n * chunks >= kParallelMin)
  for (int64_t e0 = 0; e0 < n; e0 += kRun) {
    const int64_t e1 = std::min(n, e0 + kRun);
    std::copy(part + e0, part + e1, c + e0);
    for (int64_t q = 1; q < chunks; ++q)
      for (int64_t e = e0; e < e1; ++e) c[e] += part[q * n + e];
  }
}

// Element offsets of map m over [batch..., R, C] that split as batch[b] + row[r] + col[c]: a
// single unmasked view, or a plain reshape of one whose dims group into the domain's (a conv's
// window [B, G, F, kh, kw, oh, ow] read as [B, G, F * kh * kw, oh * ow]). False otherwise.
bool split_offsets(const kir::IndexMap& m, std::vector<int64_t>& batch, std::vector<int64_t>& row, std::vector<int64_t>& col) {
  const kir::View& v = m.views[0];
  if (v.masked() || m.views.size() > 2) return false;
  if (m.views.size() == 2) {
    const kir::View& top = m.views[1];
    if (top.masked() || top.offset != 0 || top.strides != contiguous_strides(top.shape)) return false;
  }
  const Shape& dom = m.shape();
  const size_t r = dom.size();
  if (r < 2) return false;
  // Per domain dim, the offsets of its indices: the view dims it groups, walked row-major.
  std::vector<std::vector<int64_t>> offs(r);
  size_t p = 0;
  for (size_t d = 0; d < r; ++d) {
    std::vector<int64_t>& o = offs[d];
    o = {0};
    int64_t ext = 1;
    while (ext < dom[d] && p < v.shape.size()) {
      std::vector<int64_t> next;
      next.reserve(o.size() * size_t(v.shape[p]));
      for (int64_t base : o)
        for (int64_t i = 0; i < v.shape[p]; ++i) next.push_back(base + i * v.strides[p]);
      o = std::move(next);
      ext *= v.shape[p++];
    }
    if (ext != dom[d]) return false;
  }
  for (; p < v.shape.size(); ++p)
    if (v.shape[p] != 1) return false;
  batch = {v.offset};
  for (size_t d = 0; d + 2 < r; ++d) {
    std::vector<int64_t> next;
    for (int64_t base : batch)
      for (int64_t o : offs[d]) next.push_back(base + o);
    batch = std::move(next);
  }
  row = std::move(offs[r - 2]);
  col = std::move(offs[r - 1]);
  return true;
}

// The Window plan of a float32 Gemm Step whose B is a window read in place (window_gemm), or
// none: B already dense (the BLAS reads it as it is), A not a single view, or a product too
// shallow for the tile to pay (K < 32: a one-channel conv, left to the BLAS).
std::optional<CpuKernel::Window> window_plan(const Step& st) {
  if (!window_gemm::available() || st.dtype != DType::Float32 || st.maps[1].single()) return std::nullopt;
  for (DType t : st.input_dtypes)
    if (t != DType::Float32) return std::nullopt;
  const size_t r = st.shape.size();
  const kir::IndexMap& am = st.maps[0];
  const int64_t K = am.shape()[r - 1];
  if (K < 32 || !am.single()) return std::nullopt;
  CpuKernel::Window w;
  if (!split_offsets(st.maps[1], w.b_off, w.k_off, w.n_off)) return std::nullopt;
  std::vector<int64_t> rows, cols;
  split_offsets(am, w.a_off, rows, cols);
  const kir::View& av = am.views[0];
  w.a_rs = av.strides[r - 2], w.a_cs = av.strides[r - 1];
  // A's distinct matrices (one, or one per group; the batch broadcasts it).
  std::vector<int64_t> distinct;
  for (int64_t o : w.a_off) {
    auto it = std::find(distinct.begin(), distinct.end(), o);
    w.a_of.push_back(int(it - distinct.begin()));
    if (it == distinct.end()) distinct.push_back(o);
  }
  w.a_off = std::move(distinct);
  return w;
}

void run_gemm(const CpuKernel& k, const Step& st, const LaunchArgs& args) {
  size_t r = st.shape.size();
  int64_t M = st.shape[r - 2], N = st.shape[r - 1], K = st.maps[0].shape()[r - 1];
  Shape batch(st.shape.begin(), st.shape.end() - 2);
  int64_t nb = numel(batch);
  char* out = static_cast<char*>(args.slots[st.output]);
  size_t elem = itemsize(st.dtype);
  if (M * N == 0) return;
  std::vector<const void*> epi_in = inputs_of(st, args);
  std::vector<char*> base;
  const jit::Loop* loop = loop_for(k, st, epi_in, args, base);
  // The epilogue over rows [m0, m1) and columns [n0, n1) of batch b, while they are in cache:
  // its loads of the output slot read the product. Blocks of whole rows are one range. Through
  // its native loop where it has one.
  auto epilogue = [&](int64_t b, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    if (st.program.empty()) return;
    auto range = [&](int64_t p, int64_t e) {
      if (loop) return loop_range(k, base, p, e - p, reinterpret_cast<float*>(base.back()) + p);
      Scratch& sc = scratch(st.program.size(), size_t(k.regs.nregs));
      for (; p < e; p += kTile) {
        int64_t n = std::min(kTile, e - p);
        run_program(st.program, k.regs, epi_in, st.shape, p, n, args, sc);
        store_tile(st, out, p, n, sc);
      }
    };
    if (n0 == 0 && n1 == N) return range(b * M * N + m0 * N, b * M * N + m1 * N);
    for (int64_t i = m0; i < m1; ++i) range(b * M * N + i * N + n0, b * M * N + i * N + n1);
  };
  if (K == 0) {
    std::memset(out, 0, size_t(nb * M * N) * elem);
    for (int64_t b = 0; b < nb; ++b) epilogue(b, 0, M, 0, N);
    return;
  }
  if (k.window) {
    // Each batch element's product is computed transposed (its positions as rows, M as vector
    // columns, A^T packed as [K, M rounded up to 16] with zeros past M) and stored into [M, N].
    const CpuKernel::Window& w = *k.window;
    const int64_t Mp = (M + 15) / 16 * 16;
    const float* a = static_cast<const float*>(args.slots[st.inputs[0]]);
    const float* bm = static_cast<const float*>(args.slots[st.inputs[1]]);
    float* c = reinterpret_cast<float*>(out);
    auto pack = [&](float* at, int64_t d, int64_t k0, int64_t k1) {  // A^T rows [k0, k1) of distinct A d
      const float* ab = a + w.a_off[size_t(d)];
      if (w.a_cs == 1) return window_gemm::pack_transposed(ab + k0, w.a_rs, M, k1 - k0, at, Mp);
      for (int64_t q = k0; q < k1; ++q) {
        float* row = at + (q - k0) * Mp;
        for (int64_t i = 0; i < M; ++i) row[i] = ab[i * w.a_rs + q * w.a_cs];
        std::fill(row + M, row + Mp, 0.0f);
      }
    };
    auto product = [&](const float* at, int64_t b, int64_t n0, int64_t n1, int64_t k0, int64_t k1, float* dst) {
      window_gemm::product(bm + w.b_off[size_t(b)], w.n_off.data() + n0, n1 - n0, w.k_off.data() + k0, k1 - k0, at, Mp, M,
                           dst + n0, N, true, false);
    };
    // Deep products over fewer than 8 batch elements (a conv's kernel gradient: K = batch x
    // positions): K in chunks of equal depth whose partial products are summed in chunk order,
    // each chunk's A^T packed by the task that multiplies it. Chunks: a multiple of 4 (even work
    // for 1, 2 or 4 threads), about 1,024 deep; all fixed by the shape, so results do not depend
    // on the thread count. (The small CNN's conv2 kernel gradient, K = 12,544, in 16 chunks:
    // 2.2 ms standalone against 2.9 in 25 chunks of 504, 2.4 in 13 of 968.)
    constexpr int64_t kDepth = 1024, kMaxPartial = int64_t(1) << 22;
    const int64_t deep = (K + kDepth - 1) / kDepth, nk = deep > 1 ? (deep + 3) / 4 * 4 : 1;
    if (nb < 8 && nk > 1 && nk * nb * M * N <= kMaxPartial) {
      const int64_t depth = ((K + nk - 1) / nk + 7) / 8 * 8, chunks = (K + depth - 1) / depth;
      std::vector<float> part(size_t(chunks * nb * M * N));
#pragma omp parallel for schedule(static)
      for (int64_t t = 0; t < nb * chunks; ++t) {
        const int64_t b = t / chunks, q = t % chunks, k0 = q * depth, k1 = std::min(K, k0 + depth);
        thread_local std::vector<float, LineAligned<float>> at;
        at.resize(size_t(depth * Mp));
        pack(at.data(), w.a_of[size_t(b)], k0, k1);
        product(at.data(), b, 0, N, k0, k1, part.data() + (q * nb + b) * M * N);
      }
      sum_partials(part.data(), chunks, nb * M * N, c);
      for (int64_t b = 0; b < nb; ++b) epilogue(b, 0, M, 0, N);
      return;
    }
    // Otherwise A^T packed once per distinct A; tasks per batch element (N in chunks when the
    // batch is small).
    const int64_t na = int64_t(w.a_off.size());
    std::vector<float, LineAligned<float>> at(size_t(na * K * Mp));
    for (int64_t d = 0; d < na; ++d) pack(at.data() + d * K * Mp, d, 0, K);
    constexpr int64_t kChunk = 240;
    const int64_t nch = nb >= 2 * int64_t(omp_get_max_threads()) ? 1 : (N + kChunk - 1) / kChunk, len = (N + nch - 1) / nch;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < nb * nch; ++t) {
      const int64_t b = t / nch, n0 = t % nch * len, n1 = std::min(N, n0 + len);
      product(at.data() + w.a_of[size_t(b)] * K * Mp, b, n0, n1, 0, K, c + b * M * N);
      epilogue(b, 0, M, n0, n1);
    }
    return;
  }
  const bool floating = st.dtype == DType::Float32 || st.dtype == DType::Float64;
  GemmOperand A = gemm_operand(st.maps[0], args.slots[st.inputs[0]], st.dtype, floating && nb > 1);
  GemmOperand B = gemm_operand(st.maps[1], args.slots[st.inputs[1]], st.dtype, floating && nb > 1);
  // Rows [m0, m1) and columns [n0, n1) of batch b. op(A)'s rows are A's rows, or A's columns
  // when transposed; likewise op(B)'s columns.
  auto block = [&](int64_t b, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    int64_t idx[32];
    unravel(b, batch, idx);
    int64_t ao = A.offset, bo = B.offset;
    for (size_t d = 0; d < batch.size(); ++d) ao += idx[d] * A.batch_strides[d], bo += idx[d] * B.batch_strides[d];
    char* c = out + size_t(b * M * N) * elem;
    if (!floating) {  // integers: int64 accumulation
      auto at = [&](const GemmOperand& g, int64_t off, int64_t i, int64_t j) {
        return read_index(g.data, st.dtype, off + (g.trans ? j * g.ld + i : i * g.ld + j));
      };
      for (int64_t i = m0; i < m1; ++i)
        for (int64_t j = n0; j < n1; ++j) {
          int64_t sum = 0;
          for (int64_t q = 0; q < K; ++q) sum += at(A, ao, i, q) * at(B, bo, q, j);
          if (st.dtype == DType::Int32) reinterpret_cast<int32_t*>(c)[i * N + j] = int32_t(sum);
          else reinterpret_cast<int64_t*>(c)[i * N + j] = sum;
        }
      epilogue(b, m0, m1, n0, n1);
      return;
    }
    ao += A.trans ? m0 : m0 * A.ld;
    bo += B.trans ? n0 * B.ld : n0;
    c += size_t(m0 * N + n0) * elem;
    const char* ap = static_cast<const char*>(A.data) + ao * int64_t(elem);
    const char* bp = static_cast<const char*>(B.data) + bo * int64_t(elem);
    int64_t lda = A.ld, ldb = B.ld;
    if (A.pack) ap = static_cast<const char*>(pack_rows(A, 0, b, m0, m1, elem)), lda = K;
    if (B.pack) bp = static_cast<const char*>(pack_rows(B, 1, b, 0, K, elem)), ldb = N;  // whole rows: n0 = 0
    if (st.dtype == DType::Float32)
      blas_gemm(A.trans, B.trans, m1 - m0, n1 - n0, K, reinterpret_cast<const float*>(ap), lda,
                reinterpret_cast<const float*>(bp), ldb, reinterpret_cast<float*>(c), N);
    else
      blas_gemm(A.trans, B.trans, m1 - m0, n1 - n0, K, reinterpret_cast<const double*>(ap), lda,
                reinterpret_cast<const double*>(bp), ldb, reinterpret_cast<double*>(c), N);
    epilogue(b, m0, m1, n0, n1);
  };
  // Our pool runs the BLAS over fixed blocks (128 rows; 128 columns too when the matrix is only
  // a row block tall and B is not packed per block, whose rows are then packed whole, in one
  // walk): blocks do not depend on the thread count, so results are bit-identical with any
  // number of threads. Every call is made inside an active parallel region, where OpenBLAS's
  // OpenMP build stays on the calling thread (outside one it would start its own threads, which
  // was slow here).
  constexpr int64_t kBlock = 128;
  int64_t mb = (M + kBlock - 1) / kBlock, nbk = M <= kBlock && !B.pack ? (N + kBlock - 1) / kBlock : 1;
  int64_t per = mb * nbk, tasks = nb * per;
  // Deep, narrow products (a conv's kernel gradient: K = batch x pixels, M x N a few hundred by
  // a few dozen; a Linear layer on a flattened image) give those blocks too few tasks: K is then
  // cut into chunks of equal depth (at most 2048, a multiple of 8) whose partial products are
  // added in chunk order, and the rows into equal blocks of at most 256 (the tasks come from K
  // here); all fixed by the shape, so the same for any thread count. The epilogue runs on the
  // sum. The partial products are bounded (a vocabulary-sized weight gradient keeps the blocks).
  // Equal tasks: docs/architecture.md (Threads) says what unequal ones cost.
  constexpr int64_t kChunkK = 2048, kMaxPartial = int64_t(1) << 22;
  const int64_t chunks = (K + kChunkK - 1) / kChunkK;
  if (floating && nb == 1 && tasks < 8 && K > kChunkK && chunks * M * N <= kMaxPartial) {
    const int64_t depth = ((K + chunks - 1) / chunks + 7) / 8 * 8, nch = (K + depth - 1) / depth;
    const int64_t row_blocks = (M + 2 * kBlock - 1) / (2 * kBlock), rows = (M + row_blocks - 1) / row_blocks;
    const int64_t per_chunk = row_blocks * nbk;
    auto split_k = [&](auto* rp) {
      using R = std::remove_pointer_t<decltype(rp)>;
      std::vector<R> part(size_t(nch * M * N));
      const R* a = static_cast<const R*>(A.data);
      const R* bm = static_cast<const R*>(B.data);
#pragma omp parallel for schedule(static)
      for (int64_t t = 0; t < nch * per_chunk; ++t) {
        int64_t q = t / per_chunk, i = (t % per_chunk) / nbk, j = t % nbk;
        int64_t m0 = i * rows, m1 = std::min(M, m0 + rows);
        int64_t n0 = nbk == 1 ? 0 : j * kBlock, n1 = nbk == 1 ? N : std::min(N, n0 + kBlock);
        int64_t k0 = q * depth, k1 = std::min(K, k0 + depth);
        int64_t ao = A.offset + (A.trans ? k0 * A.ld + m0 : m0 * A.ld + k0);
        int64_t bo = B.offset + (B.trans ? n0 * B.ld + k0 : k0 * B.ld + n0);
        blas_gemm(A.trans, B.trans, m1 - m0, n1 - n0, k1 - k0, a + ao, A.ld, bm + bo, B.ld,
                  part.data() + q * M * N + m0 * N + n0, N);
      }
      sum_partials(part.data(), nch, M * N, reinterpret_cast<R*>(out));
    };
    if (st.dtype == DType::Float32) split_k((float*)nullptr);
    else split_k((double*)nullptr);
    epilogue(0, 0, M, 0, N);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tasks; ++t) {
    int64_t b = t / per, i = (t % per) / nbk, j = t % nbk;
    int64_t n0 = nbk == 1 ? 0 : j * kBlock, n1 = nbk == 1 ? N : std::min(N, n0 + kBlock);
    block(b, i * kBlock, std::min(M, (i + 1) * kBlock), n0, n1);
  }
}

class CpuBackend : public Backend {
 public:
  // Parallelism comes from our pool only. In OpenBLAS's OpenMP build this call also shrinks
  // the calling thread's OpenMP team, so the team size is put back.
  CpuBackend() {
    int n = omp_get_max_threads();
    openblas_set_num_threads(1);
    omp_set_num_threads(n);
  }
  std::string name() const override { return "cpu"; }
  DeviceInfo info(int index) const override {
    double gib = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE)) / double(1ull << 30);
    char buf[320];
    std::snprintf(buf, sizeof buf, "host CPU, %d threads (OpenMP), %.1f GiB memory, BLAS: %s (one thread per call)",
                  omp_get_max_threads(), gib, openblas_get_config());
    return {Device("cpu", index), buf, true};
  }
  void* allocate(int, size_t nbytes) override {
    size_t n = (std::max<size_t>(nbytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, n);
    if (!p) fail("allocate", "out of host memory allocating " + std::to_string(nbytes) + " bytes", "");
    return p;
  }
  void free(int, void* p, size_t) override { std::free(p); }
  void copy_in(void* dst, const void* host, size_t n) override { if (n) std::memcpy(dst, host, n); }
  void copy_out(void* host, const void* src, size_t n) override { if (n) std::memcpy(host, src, n); }

  std::unique_ptr<Kernel> compile(const Step& st) override {
    std::vector<int> keep;
    if (!st.program.empty()) keep = st.more_results, keep.push_back(int(st.program.size()) - 1);
    RegPlan regs = plan_registers(st.program, keep);
    if (st.kind != StepKind::Reduce) {
      auto k = std::make_unique<CpuKernel>();
      k->regs = std::move(regs);
      if (st.kind == StepKind::Elementwise || st.kind == StepKind::Copy) {
        prepare_elementwise(*k, st);
        k->last_read.assign(st.program.size(), -1);
        for (size_t i = 0; i < st.program.size(); ++i)
          for (int o : {st.program[i].a, st.program[i].b, st.program[i].c})
            if (o >= 0) k->last_read[size_t(o)] = int(i);
        for (int r : keep) k->last_read[size_t(r)] = std::numeric_limits<int>::max();
      }
      k->regs.load = load_paths(k->program.empty() ? st.program : k->program);
      if (st.kind == StepKind::Gemm) k->window = window_plan(st);
      build_loops(*k, st);
      k->regs.rowc = row_constants(st, k->regs);
      if (!k->regs.rowc.empty()) k->regs.spare = k->regs.nregs, k->regs.nregs += 3;
      return k;
    }
    auto k = std::make_unique<ReduceKernel>();
    k->regs = std::move(regs);
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
    build_reduce_loop(*k, st, k->program, k->domain);
    for (Instr& I : k->program)
      if (I.code == Code::Load && I.map.views.size() == 1) I.map.views[0] = coalesced(I.map.views[0]);
    k->regs.load = load_paths(k->program);
    return k;
  }

  void launch(const Kernel& kernel, const Step& st, const LaunchArgs& args) override {
    const auto& k = static_cast<const CpuKernel&>(kernel);
    switch (st.kind) {
      case StepKind::Elementwise:
      case StepKind::Copy:
        if (!run_view_copy(st, args)) run_elementwise(k, st, args);
        break;
      case StepKind::Reduce: {
        auto& rk = static_cast<const ReduceKernel&>(k);
        rk.columns ? run_column_reduce(rk, st, args) : run_reduce(rk, st, args);
        break;
      }
      case StepKind::Gemm: run_gemm(k, st, args); break;
      case StepKind::Row: run_row(k, st, args); break;
      case StepKind::Gather: run_gather(st, args, st.dtype, st.input_dtypes.at(1)); break;
      case StepKind::ScatterAdd: run_scatter_add(st, args, st.dtype, st.input_dtypes.at(1)); break;
      case StepKind::DynamicUpdateSlice: run_dus(st, args); break;
    }
  }
};

}  // namespace

std::shared_ptr<Backend> make_cpu_backend() { return std::make_shared<CpuBackend>(); }

}  // namespace tessera::backends
