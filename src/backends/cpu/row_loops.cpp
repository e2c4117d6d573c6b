#include "backends/cpu/row_loops.h"

#include <immintrin.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <list>

#include "backends/cpu/interpreter.h"
#include "backends/cpu/native_loops.h"
#include "core/half.h"

namespace tessera::backends::cpu {
namespace {

std::atomic<uint64_t> launches{0}, calls{0}, lane_rows{0};

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

// run_max(a, n, -inf) (common.h), its bits exactly: lane j of the vector is its accumulator j
// (x > m ? x : m is vmaxps(x, m), NaN included), then the same scalar tail and final fold.
float row_max(const float* a, int64_t n) {
#if defined(__AVX2__)
  if (n >= 16) {
    __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity()), nan = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 x = _mm256_loadu_ps(a + i);
      m = _mm256_max_ps(x, m);
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    }
    alignas(32) float acc[8];
    _mm256_store_ps(acc, m);
    bool any_nan = _mm256_movemask_ps(nan) != 0;
    for (int j = 0; i < n; ++i, ++j) {
      const float x = a[i];
      acc[j] = x > acc[j] ? x : acc[j];
      any_nan |= x != x;
    }
    if (any_nan) return std::numeric_limits<float>::quiet_NaN();
    float r = acc[0];
    for (int j = 1; j < 8; ++j) r = acc[j] > r ? acc[j] : r;
    return r;
  }
#endif
  return run_max(a, n, -std::numeric_limits<float>::infinity());
}

// Rows shorter than 8 reduced 8 rows at a time, a row per lane (rows `vstep` elements apart):
// row_max's and run_sum's results exactly, since each lane does their scalar operations in their
// order (run_max's accumulator j holds position j; run_sum's double tree over 8 accumulators,
// the missing ones zero). Returns the rows done (a multiple of 8), also added to `counted` (the
// launch's count for row_loop_lane_rows); the caller reduces the rest.
int64_t short_rows(bool max, const float* v, int64_t vstep, int64_t n, int64_t rows, float* r, uint64_t& counted) {
#if defined(__AVX2__)
  if (n >= 8 || rows < 8 || vstep * 7 + n > std::numeric_limits<int32_t>::max()) return 0;
  const __m256i at = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(int32_t(vstep)));
  int64_t i = 0;
  for (; i + 8 <= rows; i += 8) {
    const float* b = v + i * vstep;
    if (max) {
      const __m256 lowest = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
      __m256 m = lowest, nan = _mm256_setzero_ps();
      for (int64_t j = 0; j < n; ++j) {
        const __m256 x = _mm256_i32gather_ps(b + j, at, 4);
        const __m256 acc = _mm256_max_ps(x, lowest);       // m[j] = x > -inf ? x : -inf
        m = j == 0 ? acc : _mm256_max_ps(acc, m);            // r = m[j] > r ? m[j] : r
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
      }
      _mm256_storeu_ps(r + i, _mm256_blendv_ps(m, _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()), nan));
    } else {
      __m256d acc[2][8];
      for (int64_t j = 0; j < 8; ++j) {
        acc[0][j] = acc[1][j] = _mm256_setzero_pd();
        if (j >= n) continue;
        const __m256 x = _mm256_i32gather_ps(b + j, at, 4);
        acc[0][j] = _mm256_add_pd(acc[0][j], _mm256_cvtps_pd(_mm256_castps256_ps128(x)));
        acc[1][j] = _mm256_add_pd(acc[1][j], _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)));
      }
      for (int h = 0; h < 2; ++h) {
        const __m256d* a = acc[h];
        const __m256d t = _mm256_add_pd(_mm256_add_pd(_mm256_add_pd(a[0], a[1]), _mm256_add_pd(a[2], a[3])),
                                        _mm256_add_pd(_mm256_add_pd(a[4], a[5]), _mm256_add_pd(a[6], a[7])));
        _mm_storeu_ps(r + i + 4 * h, _mm256_cvtpd_ps(t));
      }
    }
  }
  counted += uint64_t(i);
  return i;
#else
  (void)max, (void)v, (void)vstep, (void)n, (void)rows, (void)r, (void)counted;
  return 0;
#endif
}

// run_sum(v + i * vstep, n) into r[i] for rows i from i0 on, 4 rows at a time (rows whose length
// is a multiple of 8): each row's 8 double accumulators (two AVX2 vectors) take its elements in
// run_sum's order and are folded in its tree, so the same bits; 4 rows' additions interleaved
// instead of one row's 16 dependent ones after another (a layer norm's two row sums were ~40% of
// run_row_loops' samples). Returns the first row not done.
int64_t sum_rows(const float* v, int64_t vstep, int64_t n, int64_t i0, int64_t rows, float* r) {
#if defined(__AVX2__)
  if (n % 8 != 0 || n < 16) return i0;
  int64_t i = i0;
  for (; i + 4 <= rows; i += 4) {
    __m256d lo[4], hi[4];
    for (int q = 0; q < 4; ++q) lo[q] = hi[q] = _mm256_setzero_pd();
    for (int64_t c = 0; c < n; c += 8)
      for (int q = 0; q < 4; ++q) {
        const __m256 x = _mm256_loadu_ps(v + (i + q) * vstep + c);
        lo[q] = _mm256_add_pd(lo[q], _mm256_cvtps_pd(_mm256_castps256_ps128(x)));
        hi[q] = _mm256_add_pd(hi[q], _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)));
      }
    for (int q = 0; q < 4; ++q) {
      alignas(32) double a[8];
      _mm256_store_pd(a, lo[q]);
      _mm256_store_pd(a + 4, hi[q]);
      r[i + q] = float(((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])));
    }
  }
  return i;
#else
  (void)v, (void)vstep, (void)n, (void)rows, (void)r;
  return i0;
#endif
}

// n values (elements `per` apart) rounded to bfloat16 (else float16) and back, as the
// interpreter's casts round them (bfloat16: its bit arithmetic on whole words, vectorized).
void round_row(const float* src, int64_t per, float* dst, int64_t n, bool bf16) {
  if (!bf16) {
    for (int64_t c = 0; c < n; ++c) dst[c] = half::f16_to_float(half::float_to_f16(src[c * per]));
    return;
  }
  auto one = [](uint32_t u) { return half::bf16_round_bits(u); };
  const uint32_t* s = reinterpret_cast<const uint32_t*>(src);
  uint32_t* d = reinterpret_cast<uint32_t*>(dst);
  if (per == 1)
    for (int64_t c = 0; c < n; ++c) d[c] = one(s[c]);
  else
    for (int64_t c = 0; c < n; ++c) d[c] = one(s[c * per]);
}

constexpr int kStash = 1 << 24;  // RowPart::srcs: kStash + i is stash buffer i
constexpr int kRound = 1 << 25;  // and kRound + i rounded load i's buffer

// Which values later parts read from a row buffer instead of computing them again (a softmax's
// exp): per instruction, the part that computes and stores it (avail) and its buffer (stash, -1:
// none). Float32/int32 values computed by a part (not loads or constants) and needed by a later
// one. `targets`: per part, what it computes (empty: a reduction read in place).
int plan_stash(const std::vector<Instr>& prog, const std::vector<int>& red, const std::vector<int>& round,
               const std::vector<uint8_t>& wide, const std::vector<std::vector<int>>& targets, std::vector<int>& avail,
               std::vector<int>& stash) {
  const size_t n = prog.size();
  avail.assign(n, -1), stash.assign(n, -1);
  int nstash = 0;
  for (size_t p = 0; p < targets.size(); ++p) {
    std::vector<uint8_t> need(n, 0);
    for (int t : targets[p]) need[size_t(t)] = 1;
    for (size_t k = n; k-- > 0;) {
      if (!need[k] || red[k] >= 0 || round[k] >= 0) continue;
      if (avail[k] >= 0) {  // computed by an earlier part: read back
        if (stash[k] < 0) stash[k] = nstash++;
        continue;
      }
      for (int o : {prog[k].a, prog[k].b, prog[k].c})
        if (o >= 0) need[size_t(o)] = 1;
    }
    for (size_t k = 0; k < n; ++k)
      if (need[k] && red[k] < 0 && round[k] < 0 && avail[k] < 0 && prog[k].code != Code::Load && prog[k].code != Code::Const &&
          lanes32(prog[k].dtype) && !wide[k])
        avail[k] = int(p);
  }
  return nstash;
}

// Part p of `prog`: computes `targets` and stores the values later parts read back (plan_stash),
// each reduction read as a broadcast load of its value (red[k]: instruction k's reduction
// number, or -1) and each value an earlier part stored as a dense load of its buffer.
bool build_part(RowPart& part, const std::vector<Instr>& prog, const std::vector<int>& red,
                const std::vector<int>& round, const std::vector<int64_t>& per, const std::vector<int>& avail, const std::vector<int>& stash, int p,
                const std::vector<int>& targets) {
  std::vector<uint8_t> need(prog.size(), 0);
  auto leaf = [&](size_t k) { return red[k] >= 0 || round[k] >= 0 || (stash[k] >= 0 && avail[k] != p); };
  for (int t : targets) need[size_t(t)] = 1;
  for (size_t k = prog.size(); k-- > 0;)
    if (need[k] && !leaf(k))
      for (int o : {prog[k].a, prog[k].b, prog[k].c})
        if (o >= 0) need[size_t(o)] = 1;
  std::vector<Instr> sub;
  std::vector<int64_t> stride;
  std::vector<int> src, at(prog.size(), -1), results;
  for (size_t k = 0; k < prog.size(); ++k) {
    if (!need[k]) continue;
    at[k] = int(sub.size());
    if (round[k] >= 0) {  // a rounded load: its values rounded per chunk into a buffer
      sub.push_back(Instr::load(-1, DType::Float32, {}));
      stride.push_back(1), src.push_back(kRound + round[k]);
      continue;
    }
    if (leaf(k)) {
      const bool r = red[k] >= 0;
      sub.push_back(Instr::load(-1, r ? DType::Float32 : prog[k].dtype, {}));
      stride.push_back(r ? 0 : 1), src.push_back(r ? -1 - red[k] : kStash + stash[k]);
      continue;
    }
    if (prog[k].code == Code::Load && prog[k].dtype == DType::Bool) {  // a mask: its int32 copy > 0
      sub.push_back(Instr::load(-1, DType::Int32, {}));
      stride.push_back(per[k]), src.push_back(int(k));
      Instr zero;
      zero.code = Code::Const, zero.dtype = DType::Int32, zero.value = 0;
      sub.push_back(zero);
      stride.push_back(0), src.push_back(0);
      Instr gt;
      gt.code = Code::Gt, gt.dtype = DType::Bool, gt.a = int(sub.size()) - 2, gt.b = int(sub.size()) - 1;
      at[k] = int(sub.size());
      sub.push_back(gt);
      stride.push_back(0), src.push_back(0);
      continue;
    }
    Instr I = prog[k];
    if (I.dtype == DType::Int64) I.dtype = DType::Int32;  // compared only, its values within int32 (build_row_loops)
    for (int* o : {&I.a, &I.b, &I.c})
      if (*o >= 0) *o = at[size_t(*o)];
    stride.push_back(I.code == Code::Load ? per[k] : 0);
    src.push_back(I.code == Code::Load ? int(k) : 0);
    sub.push_back(std::move(I));
    if (stash[k] >= 0 && avail[k] == p) part.stores.push_back(stash[k]), results.push_back(at[k]);
  }
  part.prog = std::move(sub);
  jit::Spec spec;
  spec.prog = &part.prog;
  spec.stride = stride;
  for (int t : targets) spec.results.push_back(at[size_t(t)]);
  spec.results.insert(spec.results.end(), results.begin(), results.end());
  spec.early.assign(spec.results.size(), 1);  // outputs never overlap inputs (run_row_loops checks)
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
    if (I.code == Code::Load && I.dtype == DType::Bool) rl->wide[k] = 2;
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
  // Per part: its targets (a reduction's operand; the results), or none (read in place).
  const std::vector<int> results = results_of(st);
  std::vector<std::vector<int>> targets;
  rl->parts.resize(reds.size() + 1);
  for (size_t i = 0; i < reds.size(); ++i) {
    const Instr& I = prog[size_t(reds[i])];
    const Instr& A = prog[size_t(I.a)];
    rl->parts[i].max = I.code == Code::RowMax;
    if (red[size_t(I.a)] >= 0) return nullptr;
    if (A.code == Code::Load && A.dtype == DType::Float32 && per[size_t(I.a)] == 1) rl->parts[i].in_place = I.a, targets.push_back({});
    else targets.push_back({I.a});
  }
  targets.emplace_back();
  // A main result rounded to bfloat16/float16 at the end (autocast's softmax probabilities and
  // layer norm outputs, operands of the next product): its float32 value into a row buffer,
  // rounded from there as the interpreter stores it.
  const Instr& L = prog.back();
  rl->narrow = L.code == Code::Cast && (st.dtype == DType::BFloat16 || st.dtype == DType::Float16) &&
               prog[size_t(L.a)].dtype == DType::Float32 && red[size_t(L.a)] < 0 && numel(st.shape) == numel(dom);
  for (int r : st.more_results)
    if (r == int(prog.size()) - 1) rl->narrow = false;
  for (int r : results) {
    if (rl->narrow && r == int(prog.size()) - 1) r = L.a;
    if (!lanes32(prog[size_t(r)].dtype)) return nullptr;
    rl->result_red.push_back(red[size_t(r)]);
    if (red[size_t(r)] < 0) targets.back().push_back(r);
  }
  if (st.dtype != prog.back().dtype) return nullptr;
  // A float32 load rounded to bfloat16/float16 and back (autocast's gradients entering a
  // backward Row Step): rounded per chunk into a buffer the loops read.
  std::vector<int> round(prog.size(), -1);
  for (size_t k = 0; k < prog.size(); ++k) {
    const Instr& I = prog[k];
    if (I.code != Code::Cast || I.dtype != DType::Float32) continue;
    const Instr& J = prog[size_t(I.a)];
    if (J.code != Code::Cast || (J.dtype != DType::BFloat16 && J.dtype != DType::Float16)) continue;
    const Instr& L = prog[size_t(J.a)];
    if (L.code != Code::Load || L.dtype != DType::Float32) continue;
    round[k] = int(rl->rounds.size());
    rl->rounds.push_back({J.a, J.dtype == DType::BFloat16, per[size_t(J.a)]});
  }
  std::vector<int> avail, stash;
  rl->nstash = plan_stash(prog, red, round, rl->wide, targets, avail, stash);
  for (size_t i = 0; i < targets.size(); ++i)
    if (!targets[i].empty() && !build_part(rl->parts[i], prog, red, round, per, avail, stash, int(i), targets[i]))
      return nullptr;
  return rl;
}

namespace {
// Short runs along the last outer dim (a softmax over [64, 4, 6, 6]: runs of 6 rows, three loop
// calls each) become one run per tile: a load whose rows step uniformly across the outer dims
// is read in place, any other (a mask broadcast over batch and heads) has its tile's rows
// copied, each its `span` elements, into a per-thread buffer the loops step through by a span.
// Same values per row, so the same bits.
struct FlatRows {
  bool on = false;
  std::vector<int64_t> span;  // per instruction: a copied load's elements per row (0: read in place)
  std::vector<int> copied;
};
FlatRows flat_rows(const RowLoops& rl, const Step& st, const std::vector<const char*>& base, int64_t rpt) {
  static const bool off = [] {  // TESSERA_CPU_ROW_FLAT=0: runs along the last outer dim only (measuring)
    const char* e = std::getenv("TESSERA_CPU_ROW_FLAT");
    return e && std::strcmp(e, "0") == 0;
  }();
  const std::vector<Instr>& prog = st.program;
  FlatRows f;
  f.span.assign(prog.size(), 0);
  const size_t last = rl.outer.empty() ? 0 : rl.outer.size() - 1;
  f.on = !off && rl.outer.size() > 1 && rl.outer[last] < rpt;
  for (size_t k = 0; k < prog.size() && f.on; ++k) {
    if (!base[k]) continue;
    bool uniform = true;  // row r at r times the last outer dim's stride (dims of extent 1 never move)
    for (size_t d = last, n = 1; d-- > 0;) {
      n *= size_t(rl.outer[d + 1]);
      uniform = uniform && (rl.outer[d] == 1 || rl.outer_strides[k][d] == int64_t(n) * rl.outer_strides[k][last]);
    }
    if (uniform) continue;
    f.span[k] = (rl.row - 1) * row_stride(prog[k].map.views[0], st.domain, rl.outer.size()) + 1;
    f.on = f.span[k] <= 4 * rl.row;
    f.copied.push_back(int(k));
  }
  for (const RowLoops::Round& R : rl.rounds) f.on = f.on && f.span[size_t(R.load)] == 0;
  if (!f.on) f.span.assign(prog.size(), 0), f.copied.clear();  // runs along the last outer dim, as before
  return f;
}
// The copied loads' `rows` rows from outer index `idx` on, into `copy`; per instruction, a copied
// load's first row there (none when the runs are not flat).
std::vector<const char*> copy_rows(const RowLoops& rl, const FlatRows& f, const std::vector<const char*>& base, const int64_t* idx,
                                   int64_t rows, int64_t rpt, std::vector<float>& copy) {
  std::vector<const char*> at(f.on ? f.span.size() : 0, nullptr);
  if (!f.on) return at;
  size_t need = 0;
  for (int k : f.copied) need += size_t(rpt * f.span[size_t(k)]);
  if (copy.size() < need) copy.resize(need);
  float* to = copy.data();
  for (int k : f.copied) {
    const int64_t n = f.span[size_t(k)];
    int64_t j[32];
    std::copy(idx, idx + rl.outer.size(), j);
    at[size_t(k)] = reinterpret_cast<const char*>(to);
    for (int64_t r = 0; r < rows; ++r, to += n, bump(j, rl.outer)) {
      int64_t o = 0;
      for (size_t d = 0; d < rl.outer.size(); ++d) o += j[d] * rl.outer_strides[size_t(k)][d];
      std::memcpy(to, base[size_t(k)] + o * 4, size_t(n) * 4);
    }
    to += (rpt - rows) * n;
  }
  return at;
}
// A launch's loop calls and lane rows, added once (not per call: row_loop_calls).
void count_launch(uint64_t ncalls, uint64_t nlane) {
  calls.fetch_add(ncalls, std::memory_order_relaxed);
  lane_rows.fetch_add(nlane, std::memory_order_relaxed);
  launches.fetch_add(1, std::memory_order_relaxed);
}
// One call of a part's loop over `rows` rows, counted in n (the launch's count, added to
// row_loop_calls once: an atomic per call, shared by the threads, cost ~15% of a layer norm's time).
void call(const jit::Loop& loop, const void* const* p, int64_t row, int64_t rows, const int64_t* step, uint64_t& n) {
  loop(p, row, rows, step);
  ++n;
}
}  // namespace

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
    if (rl.wide[k] == 2) {  // a bool mask as int32 lanes of 0 and 1
      const uint8_t* w = reinterpret_cast<const uint8_t*>(base[k]);
      std::vector<int32_t>& c = narrowed.emplace_back(size_t(last + 1));
      for (int64_t i = 0; i <= last; ++i) c[size_t(i)] = w[i] != 0;
      base[k] = reinterpret_cast<const char*>(c.data());
    } else if (rl.wide[k]) {  // int64 as int32 lanes: the elements it spans, when they all fit
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
    const char* hi = outs[j] + (main && !per_row ? total * int64_t(itemsize(st.dtype)) : nrows * 4);
    for (const auto& [lo, end] : spans)
      if (lo < hi && outs[j] < end) return false;
  }
  const RowPart& fin = rl.parts.back();
  const size_t nred = rl.parts.size() - 1, nbuf = nres + 1 + size_t(rl.nstash) + rl.rounds.size();
  const size_t round0 = nres + 1 + size_t(rl.nstash);  // the rounded loads' buffers
  const int64_t rpt = std::max<int64_t>(1, kTile / row), ntiles = (nrows + rpt - 1) / rpt;
  const size_t last = rl.outer.empty() ? 0 : rl.outer.size() - 1;
  std::vector<int64_t> row_step(prog.size(), 0);  // bytes each load moves from one row to the next (last outer dim)
  for (size_t k = 0; k < prog.size(); ++k) row_step[k] = base[k] && !rl.outer.empty() ? rl.outer_strides[k][last] * 4 : 0;
  const FlatRows flat = flat_rows(rl, st, base, rpt);
  uint64_t ncalls = 0, nlane = 0;  // counted per launch (count_launch)
#pragma omp parallel for schedule(static) reduction(+ : ncalls, nlane) if (total >= kParallelMin && ntiles > 1)
  for (int64_t t = 0; t < ntiles; ++t) {
    // Per tile: buffer 0 (a reduction's operand), the per-row results, the stored values, each
    // rpt rows; each reduction's values (rpt per reduction).
    thread_local std::vector<float> buf, rv, copy;
    if (buf.size() < size_t(rpt * row) * nbuf) buf.resize(size_t(rpt * row) * nbuf);
    if (rv.size() < size_t(rpt) * nred) rv.resize(size_t(rpt) * nred);
    auto buffer = [&](size_t b) { return buf.data() + b * size_t(rpt * row); };
    const void* p[kMaxLoopPtrs];
    int64_t step[kMaxLoopPtrs];
    int64_t idx[32];
    const int64_t g1 = std::min(nrows, (t + 1) * rpt);
    unravel(t * rpt, rl.outer, idx);
    const std::vector<const char*> copy_at = copy_rows(rl, flat, base, idx, g1 - t * rpt, rpt, copy);
    // Chunks of rows along the last outer dim: one loop call per part, each pointer stepping by
    // its row step (reductions' values by one float, buffers by a row).
    for (int64_t g = t * rpt; g < g1;) {
      const int64_t rows = rl.outer.empty() ? 1 : flat.on ? g1 - g : std::min(g1 - g, rl.outer[last] - idx[last]);
      auto row_ptr = [&](size_t k) {
        if (flat.on && copy_at[k]) return copy_at[k];
        int64_t o = 0;
        for (size_t d = 0; d < rl.outer_strides[k].size(); ++d) o += idx[d] * rl.outer_strides[k][d];
        return base[k] + o * 4;
      };
      auto fill = [&](const RowPart& part) {
        size_t i = 0;
        for (int s : part.srcs) {
          if (s >= kRound) p[i] = buffer(round0 + size_t(s - kRound)), step[i] = row * 4;
          else if (s >= kStash) p[i] = buffer(nres + 1 + size_t(s - kStash)), step[i] = row * 4;
          else if (s >= 0) p[i] = row_ptr(size_t(s)), step[i] = flat.span[size_t(s)] ? flat.span[size_t(s)] * 4 : row_step[size_t(s)];
          else p[i] = rv.data() + size_t(-1 - s) * size_t(rpt), step[i] = 4;
          ++i;
        }
        return i;
      };
      auto stores = [&](const RowPart& part, size_t i) {
        for (int b : part.stores) p[i] = buffer(nres + 1 + size_t(b)), step[i++] = row * 4;
      };
      for (size_t r = 0; r < rl.rounds.size(); ++r) {  // as the interpreter's two casts round
        const RowLoops::Round& R = rl.rounds[r];
        const char* src = row_ptr(size_t(R.load));
        float* dst = buffer(round0 + r);
        for (int64_t i = 0; i < rows; ++i)
          round_row(reinterpret_cast<const float*>(src + i * row_step[size_t(R.load)]), R.per, dst + i * row, row, R.bf16);
      }
      for (size_t s = 0; s < nred; ++s) {
        const RowPart& part = rl.parts[s];
        const float* v = buffer(0);
        int64_t vstep = row;
        if (part.in_place >= 0) {
          v = reinterpret_cast<const float*>(row_ptr(size_t(part.in_place)));
          vstep = flat.span[size_t(part.in_place)] ? flat.span[size_t(part.in_place)] : row_step[size_t(part.in_place)] / 4;
        } else {
          const size_t i = fill(part);
          p[i] = buffer(0), step[i] = row * 4;
          stores(part, i + 1);
          call(*part.loop, p, row, rows, step, ncalls);
        }
        float* r = rv.data() + s * size_t(rpt);
        const int64_t lanes = short_rows(part.max, v, vstep, row, rows, r, nlane);
        for (int64_t i = part.max ? lanes : sum_rows(v, vstep, row, lanes, rows, r); i < rows; ++i)
          r[i] = part.max ? row_max(v + i * vstep, row) : float(run_sum(v + i * vstep, row));
      }
      if (fin.loop) {
        size_t i = fill(fin);
        for (size_t j = 0; j < nres; ++j) {
          if (rl.result_red[j] >= 0) continue;
          const bool dense = j + 1 == nres && !per_row && !rl.narrow;
          p[i] = dense ? static_cast<void*>(outs[j] + g * row * 4) : buffer(j + 1);
          step[i++] = row * 4;
        }
        stores(fin, i);
        call(*fin.loop, p, row, rows, step, ncalls);
      }
      if (rl.narrow) {  // the main result rounded (half.h's rounding: the interpreter's bits)
        const float* v = buffer(nres);
        uint16_t* o = reinterpret_cast<uint16_t*>(outs[nres - 1]) + g * row;
        if (st.dtype == DType::BFloat16)
          for (int64_t i = 0; i < rows * row; ++i) o[i] = half::float_to_bf16(v[i]);
        else
          for (int64_t i = 0; i < rows * row; ++i) o[i] = half::float_to_f16(v[i]);
      }
      for (size_t j = 0; j < nres; ++j) {  // per-row results, and a reduction's value as a result
        const int r = rl.result_red[j];
        for (int64_t i = 0; i < rows; ++i) {
          const float* v = r >= 0 ? rv.data() + size_t(r) * size_t(rpt) + i : buffer(j + 1) + i * row;
          if (j + 1 < nres || per_row) std::memcpy(outs[j] + (g + i) * 4, v, 4);
          else if (r >= 0)
            for (int64_t c = 0; c < row; ++c) std::memcpy(outs[j] + ((g + i) * row + c) * 4, v, 4);
        }
      }
      g += rows;
      if (!rl.outer.empty()) idx[last] += rows - 1, bump(idx, rl.outer);
    }
  }
  count_launch(ncalls, nlane);
  return true;
}

uint64_t row_loop_launches() { return launches.load(std::memory_order_relaxed); }
uint64_t row_loop_calls() { return calls.load(std::memory_order_relaxed); }
uint64_t row_loop_lane_rows() { return lane_rows.load(std::memory_order_relaxed); }

}  // namespace tessera::backends::cpu
