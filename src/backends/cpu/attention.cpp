// The fused attention Step (StepKind::Attention, kernel_ir/step.h): out = softmax(scale * Q K^T,
// masked) V for every batch element, without the T_q x T_k scores in memory.
//
// Tasks are (batch element, block of kRows query rows), a fixed grid run by a static OpenMP loop:
// each output row is computed by one task in one order whatever the thread count, so results are
// bit-identical for any number of threads. A task walks the keys in tiles of kKeys: it copies the
// tile's K transposed ([D, kKeys]) and its V rows into per-thread buffers, computes each score of
// the tile once (a broadcast of q[i][d] times a row of K^T: vectorized over the keys), masks it,
// and updates the row's running maximum m, running sum l and accumulator (rescaled by exp(m_old -
// m_new) when the maximum grows: the online softmax); the row's output is acc / l at the end. A
// row whose keys are all masked gets 0 / 0 = NaN, as the unfused softmax gives. Everything a task
// touches besides Q, K, V and its output rows is a few KiB (L1).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/common.h"
#include "backends/cpu/kernel.h"
#include "backends/cpu/vmath.h"
#include "core/fail.h"

namespace tessera::backends::cpu {
namespace {

constexpr int64_t kRows = 16;  // query rows per task
constexpr int64_t kKeys = 64;  // keys per tile (four 16-float vectors)

// One operand [batch..., T, C] as a plain strided view: per flat batch element its offset, and
// the strides of its last two dimensions.
struct Operand {
  std::vector<int64_t> off;
  int64_t rs = 0, cs = 0;
};

Operand operand_of(const kir::IndexMap& m, int64_t batch) {
  const kir::View& v = m.views[0];
  const size_t r = v.shape.size();
  Operand o;
  o.rs = v.strides[r - 2];
  o.cs = v.strides[r - 1];
  o.off.resize(size_t(batch));
  std::vector<int64_t> idx(r - 2, 0);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t off = v.offset;
    for (size_t d = 0; d + 2 < r; ++d) off += idx[d] * v.strides[d];
    o.off[size_t(b)] = off;
    for (size_t d = r - 2; d-- > 0;) {  // next batch index, row-major
      if (++idx[d] < v.shape[d]) break;
      idx[d] = 0;
    }
  }
  return o;
}

template <class T>
void exp_inplace(T* x, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    vmath::vexp(x, x, n);
  } else {
    for (int64_t j = 0; j < n; ++j) x[j] = std::exp(x[j]);
  }
}

struct AttentionKernel : CpuKernel {
  kir::Step::Attention a;
  Operand q, k, v;

  explicit AttentionKernel(const Step& st) : a(*st.attention) {
    q = operand_of(st.maps.at(0), a.batch);
    k = operand_of(st.maps.at(1), a.batch);
    v = operand_of(st.maps.at(2), a.batch);
  }

  template <class T>
  void run_typed(const Step& st, const LaunchArgs& args) const {
    const T* Q = static_cast<const T*>(args.slots[st.inputs[0]]);
    const T* K = static_cast<const T*>(args.slots[st.inputs[1]]);
    const T* V = static_cast<const T*>(args.slots[st.inputs[2]]);
    T* O = static_cast<T*>(args.slots[st.output]);
    const int64_t B = a.batch, Tq = a.tq, Tk = a.tk, D = a.d, Dv = a.dv;
    const int64_t blocks = (Tq + kRows - 1) / kRows, tasks = B * blocks;
    const T scale = T(a.scale), ninf = -std::numeric_limits<T>::infinity();
    const double work = double(B) * double(Tq) * double(Tk) * double(D + Dv);
#pragma omp parallel if (work >= double(kParallelMin) * 16)
    {
      // Per thread: K^T and V of one tile, the task's rows of Q, running max/sum/accumulators.
      std::vector<T> kt(size_t(D * kKeys), T(0)), vt(size_t(kKeys * Dv)), qb(size_t(kRows * D)), acc(size_t(kRows * Dv));
      T m[kRows], l[kRows];
      alignas(64) T s[kKeys];
#pragma omp for schedule(static)
      for (int64_t t = 0; t < tasks; ++t) {
        const int64_t b = t / blocks, i0 = (t % blocks) * kRows, rows = std::min(kRows, Tq - i0);
        const T* qp = Q + q.off[size_t(b)];
        const T* kp = K + k.off[size_t(b)];
        const T* vp = V + v.off[size_t(b)];
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t d = 0; d < D; ++d) qb[size_t(r * D + d)] = qp[(i0 + r) * q.rs + d * q.cs];
        std::fill(acc.begin(), acc.end(), T(0));
        std::fill(m, m + kRows, ninf);
        std::fill(l, l + kRows, T(0));
        // Keys any row of the block may see: j - i <= offset.
        int64_t kend = Tk;
        if (a.causal) kend = std::clamp<int64_t>(i0 + rows - 1 + a.causal_offset + 1, 0, Tk);
        for (int64_t j0 = 0; j0 < kend; j0 += kKeys) {
          const int64_t nk = std::min(kKeys, kend - j0);
          for (int64_t j = 0; j < nk; ++j) {
            const T* kr = kp + (j0 + j) * k.rs;
            for (int64_t d = 0; d < D; ++d) kt[size_t(d * kKeys + j)] = kr[d * k.cs];
            const T* vr = vp + (j0 + j) * v.rs;
            for (int64_t c = 0; c < Dv; ++c) vt[size_t(j * Dv + c)] = vr[c * v.cs];
          }
          for (int64_t j = nk; j < kKeys; ++j)
            for (int64_t d = 0; d < D; ++d) kt[size_t(d * kKeys + j)] = T(0);
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t j = 0; j < kKeys; ++j) s[j] = T(0);
            const T* qr = qb.data() + r * D;
            for (int64_t d = 0; d < D; ++d) {
              const T x = qr[d];
              const T* kd = kt.data() + d * kKeys;
              for (int64_t j = 0; j < kKeys; ++j) s[j] += x * kd[j];
            }
            // Keys past the tile, and past the causal limit of this row, are masked.
            int64_t lim = nk;
            if (a.causal) lim = std::clamp<int64_t>(i0 + r + a.causal_offset + 1 - j0, 0, nk);
            T mt = ninf;
            for (int64_t j = 0; j < kKeys; ++j) {
              s[j] = j < lim ? s[j] * scale : ninf;
              mt = std::max(mt, s[j]);
            }
            const T mnew = std::max(m[r], mt);
            if (mnew == ninf) continue;  // nothing seen yet in this row
            const T corr = m[r] == ninf ? T(0) : T(std::exp(m[r] - mnew));
            for (int64_t j = 0; j < kKeys; ++j) s[j] -= mnew;
            exp_inplace(s, kKeys);
            T sum = 0;
            for (int64_t j = 0; j < kKeys; ++j) sum += s[j];
            l[r] = l[r] * corr + sum;
            m[r] = mnew;
            T* ar = acc.data() + r * Dv;
            if (corr != T(1))
              for (int64_t c = 0; c < Dv; ++c) ar[c] *= corr;
            for (int64_t j = 0; j < lim; ++j) {
              const T p = s[j];
              const T* vr = vt.data() + j * Dv;
              for (int64_t c = 0; c < Dv; ++c) ar[c] += p * vr[c];
            }
          }
        }
        T* op = O + (b * Tq + i0) * Dv;
        for (int64_t r = 0; r < rows; ++r) {
          const T inv = l[r];
          for (int64_t c = 0; c < Dv; ++c) op[r * Dv + c] = acc[size_t(r * Dv + c)] / inv;
        }
      }
    }
  }

  void run(const Step& st, const LaunchArgs& args) const override {
    if (st.dtype == DType::Float64)
      run_typed<double>(st, args);
    else
      run_typed<float>(st, args);
  }
};

}  // namespace

std::unique_ptr<CpuKernel> compile_attention(const Step& st) {
  const kir::Source src = st.sources.empty() ? kir::Source{"attention", ""} : st.sources.front();
  if (!st.attention || st.inputs.size() != 3 || st.maps.size() != 3)
    fail(src.op, "internal: an attention Step without its fields or its three operands (" + st.str() + ")", src.scope);
  if (st.dtype != DType::Float32 && st.dtype != DType::Float64)
    fail(src.op, std::string("the fused attention Step runs float32 and float64, not ") + dtype_name(st.dtype), src.scope);
  for (const kir::IndexMap& m : st.maps)
    if (!m.single() || m.shape().size() < 2)
      fail(src.op, "internal: an attention operand is not a plain strided view (" + m.str() + ")", src.scope);
  return std::make_unique<AttentionKernel>(st);
}

}  // namespace tessera::backends::cpu
