#include "backends/cpu/interpreter.h"

#include <bit>
#include <cmath>

#include "backends/cpu/reg_alloc.h"
#include "backends/cpu/views.h"
#include "backends/cpu/vmath.h"
#include "core/philox.h"
#include "core/fail.h"

namespace tessera::backends::cpu {
namespace {

bool is_binary(Code c) { return c >= Code::Add && c <= Code::Ge; }

// ---- Binary ops: one loop per op and compute type, chosen when the Step is compiled ----------

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

// ---- Loads through one strided view --------------------------------------------------------

// Short rows (pooling windows, kernel taps: the view's last dim at most 4, rank >= 2): element by
// element over blocks of the last two dimensions, the block's offset and outer mask computed once
// per block; whole rows of a block as one strided run per valid column.
template <class T, class S>
void load_short_rows(const kir::View& v, const S* src, int64_t* idx, int64_t n, T* out, T pad) {
  const bool masked = v.masked();
  const int64_t last = int64_t(v.shape.size()) - 1, inner = v.shape[last], st = v.strides[last];
  int64_t A = v.shape[last - 1], sa = v.strides[last - 1];
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
}

// Run by run along the view's last dimension: contiguous runs as plain copies, broadcast runs as
// fills, masked parts as pad fills.
template <class T, class S>
void load_rows(const kir::View& v, const S* src, int64_t* idx, int64_t n, T* out, T pad) {
  const bool masked = v.masked();
  const int64_t last = int64_t(v.shape.size()) - 1, inner = v.shape[last], st = v.strides[last];
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
}

// A load through one strided view (masked or not), no offset arrays.
void load_strided(const Instr& I, const void* base_ptr, int64_t start, int64_t n, void* dst) {
  const kir::View& v = I.map.views[0];
  const Shape& s = v.shape;
  with_compute(I.dtype, [&](auto* tp) {
    using T = std::remove_pointer_t<decltype(tp)>;
    T* out = static_cast<T*>(dst);
    T pad = T(I.value);
    with_storage(I.dtype, [&](auto* sp) {
      using S = std::remove_pointer_t<decltype(sp)>;
      const S* src = static_cast<const S*>(base_ptr);
      if (s.empty()) {
        std::fill_n(out, n, to_c<T>(src[v.offset]));
        return;
      }
      int64_t idx[32];
      unravel(start, s, idx);
      if (s.size() >= 2 && s.back() <= 4) load_short_rows(v, src, idx, n, out, pad);
      else load_rows(v, src, idx, n, out, pad);
    });
  });
}

// ---- Unary ops -------------------------------------------------------------------------------

// out[i] = op(a[i]) for i < m: vectorized float32 exp/log/tanh/erf (vmath.h, within 1.02 ulp),
// the C library for the other floating-point ops; floor/ceil/round of an integer is itself.
template <class T>
void unary(Code c, const T* a, T* out, int64_t m) {
  switch (c) {
    case Code::Neg: for (int64_t i = 0; i < m; ++i) out[i] = T(-a[i]); return;
    case Code::Abs: for (int64_t i = 0; i < m; ++i) out[i] = a[i] < T(0) ? T(-a[i]) : a[i]; return;
    case Code::Sign:
      for (int64_t i = 0; i < m; ++i) out[i] = a[i] > T(0) ? T(1) : a[i] < T(0) ? T(-1) : a[i];
      return;
    default: break;
  }
  if constexpr (std::is_same_v<T, float>) {
    switch (c) {
      case Code::Exp: vmath::vexp(a, out, m); return;
      case Code::Log: vmath::vlog(a, out, m); return;
      case Code::Tanh: vmath::vtanh(a, out, m); return;
      case Code::Erf: vmath::verf(a, out, m); return;
      default: break;
    }
  }
  if constexpr (std::is_floating_point_v<T>) {
    switch (c) {
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
  } else {
    std::copy_n(a, m, out);
  }
}

// The value v as a float16 or bfloat16 Step stores it, in the compute type.
double rounded_to(DType t, double v) {
  if (t == DType::Float16) return half::f16_to_float(half::float_to_f16(float(v)));
  if (t == DType::BFloat16) return half::bf16_to_float(half::float_to_bf16(float(v)));
  return v;
}

// m float32 values rounded to float16/bfloat16 in place (their compute type stays float32). The
// bfloat16 rounding is half::bf16_round_bits on whole words, which the compiler vectorizes: autocast rounds every product operand so, and a call per element through
// rounded_to took a sixth of a bfloat16 training step.
void round_floats(DType t, float* v, int64_t m) {
  if (t == DType::BFloat16) {
    for (int64_t i = 0; i < m; ++i) {
      uint32_t u;
      std::memcpy(&u, v + i, 4);
      u = half::bf16_round_bits(u);
      std::memcpy(v + i, &u, 4);
    }
  } else if (t == DType::Float16) {
    for (int64_t i = 0; i < m; ++i) v[i] = half::f16_to_float(half::float_to_f16(v[i]));
  }
}

// ---- One tile ---------------------------------------------------------------------------------

// One evaluation of a program over positions [start, start + n) of its domain (run_program):
// each instruction's values go to its register (or an output written directly), or stay where
// they are (a scalar constant, a load read in place); each method below evaluates one kind of
// instruction and returns where its values are. Row Steps with row-constant values (RegPlan::rowc)
// compute those one lane per row: m = rows lanes instead of n.
class Tile {
 public:
  Tile(const std::vector<Instr>& prog, const RegPlan& rp, const std::vector<const void*>& in, const Shape& domain,
       int64_t start, int64_t n, const LaunchArgs& args, Scratch& sc, int64_t row)
      : prog_(prog), rp_(rp), in_(in), domain_(domain), start_(start), n_(n), args_(args), sc_(sc), row_(row),
        rows_(row > 0 ? n / row : 0), rowc_(row > 0 && !rp.rowc.empty()) {}

  void run(char* const* direct) {
    if (sc_.at.size() < prog_.size()) sc_.at.resize(prog_.size());
    for (size_t k = 0; k < prog_.size(); ++k) {
      const Instr& I = prog_[k];
      const int ki = rp_.reg[k];
      const int64_t m = rowc_ && rp_.rowc[k] ? rows_ : n_;  // lanes computed: one per row, or one per position
      void* dst = direct && direct[k] ? direct[k] + size_t(start_) * itemsize(I.dtype)
                  : ki >= 0           ? static_cast<void*>(reg<double>(sc_, ki))
                                      : &sc_.consts[k];
      sc_.at[k] = eval(k, dst, m);
    }
  }

 private:
  const void* eval(size_t k, void* dst, int64_t m) {
    const Instr& I = prog_[k];
    switch (I.code) {
      case Code::Load: return load(k, dst, m);
      case Code::Const: return constant(k, dst, m);
      case Code::Iota: return iota(I, dst);
      case Code::Rng: return rng(I, dst);
      case Code::Cast: return cast(I, dst, m);
      case Code::Neg: case Code::Exp: case Code::Log: case Code::Tanh: case Code::Abs: case Code::Sign:
      case Code::Sqrt: case Code::Sin: case Code::Cos: case Code::Erf: case Code::Floor: case Code::Ceil:
      case Code::Round:
        with_compute(I.dtype, [&](auto* tp) {
          using T = std::remove_pointer_t<decltype(tp)>;
          unary(I.code, val<T>(sc_, I.a), static_cast<T*>(dst), m);
        });
        return dst;
      case Code::RowSum: case Code::RowMax: return row_reduce(I, dst);
      case Code::Where: return where(k, dst, m);
      default:  // binary arithmetic and comparisons; operands share one dtype
        rp_.binary[k](operand(k, I.a, 0), operand(k, I.b, 1), rp_.scalar[size_t(I.a)], rp_.scalar[size_t(I.b)], dst, m);
        return dst;
    }
  }

  // Operand o of instruction k: a row-constant value read by a per-position instruction is
  // spelled out over the tile's positions first, into spare register rp.spare + j.
  const void* operand(size_t k, int o, int j) {
    if (!rowc_ || rp_.rowc[k] || !rp_.rowc[size_t(o)]) return sc_.at[size_t(o)];
    void* dst = reg<double>(sc_, rp_.spare + j);
    const void* src = sc_.at[size_t(o)];
    switch (itemsize(compute_dtype(prog_[size_t(o)].dtype))) {
      case 1: expand_rows(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), rows_, row_); break;
      case 4: expand_rows(static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(src), rows_, row_); break;
      default: expand_rows(static_cast<uint64_t*>(dst), static_cast<const uint64_t*>(src), rows_, row_);
    }
    return dst;
  }

  const void* load(size_t k, void* dst, int64_t m) {
    const Instr& I = prog_[k];
    if (m < n_) {  // one element per row: at each row's first position
      int64_t idx[32];
      for (int64_t r = 0; r < rows_; ++r) {
        unravel(start_ + r * row_, domain_, idx);
        sc_.valid[size_t(r)] = I.map.offset(idx, &sc_.off[size_t(r)]);
      }
    } else if (rp_.load[k] == kInPlace) {
      return static_cast<const char*>(in_[I.input]) + size_t(I.map.views[0].offset + start_) * itemsize(I.dtype);
    } else if (rp_.load[k] == kStrided) {
      load_strided(I, in_[I.input], start_, n_, dst);
      return dst;
    } else {
      tile_offsets(I.map, start_, n_, sc_.off.data(), sc_.valid.data());
    }
    const int64_t* off = sc_.off.data();
    const uint8_t* valid = sc_.valid.data();
    with_compute(I.dtype, [&](auto* tp) {
      using T = std::remove_pointer_t<decltype(tp)>;
      T* out = static_cast<T*>(dst);
      T pad = T(I.value);
      with_storage(I.dtype, [&](auto* sp) {
        using S = std::remove_pointer_t<decltype(sp)>;
        const S* src = static_cast<const S*>(in_[I.input]);
        for (int64_t i = 0; i < m; ++i) out[i] = valid[i] ? to_c<T>(src[off[i]]) : pad;
      });
    });
    return dst;
  }

  const void* constant(size_t k, void* dst, int64_t m) {
    if (rp_.reg[k] < 0) return &rp_.cval[k];
    with_compute(prog_[k].dtype, [&](auto* tp) {
      using T = std::remove_pointer_t<decltype(tp)>;
      T v;
      std::memcpy(&v, &rp_.cval[k], sizeof v);
      std::fill_n(static_cast<T*>(dst), m, v);
    });
    return dst;
  }

  const void* iota(const Instr& I, void* dst) {  // run by run along the domain's last dimension
    int64_t* out = static_cast<int64_t*>(dst);
    int64_t idx[32];
    unravel(start_, domain_, idx);
    int64_t last = int64_t(domain_.size()) - 1;
    if (last < 0) std::fill_n(out, n_, 0);
    for (int64_t i = 0; i < n_ && last >= 0;) {
      int64_t run = std::min(n_ - i, domain_[last] - idx[last]);
      if (I.i0 == last)
        for (int64_t j = 0; j < run; ++j) out[i + j] = idx[last] + j;
      else
        std::fill_n(out + i, run, idx[I.i0]);
      i += run;
      idx[last] += run - 1;
      bump(idx, domain_);
    }
    with_compute(I.dtype, [&](auto* tp) {  // iota may be typed narrower than int64
      using T = std::remove_pointer_t<decltype(tp)>;
      if constexpr (!std::is_same_v<T, int64_t>) {
        T* o = static_cast<T*>(dst);
        for (int64_t i = 0; i < n_; ++i) o[i] = T(out[i]);
      }
    });
    return dst;
  }

  const void* rng(const Instr& I, void* dst) {
    with_compute(I.dtype, [&](auto* tp) {
      using T = std::remove_pointer_t<decltype(tp)>;
      T* out = static_cast<T*>(dst);
      for (int64_t i = 0; i < n_; ++i)
        out[i] = T(rounded_to(I.dtype, rng::sample(args_.seed, args_.offset, uint32_t(I.i0), uint64_t(I.value) + uint64_t(start_ + i), int(I.i1))));
    });
    return dst;
  }

  const void* cast(const Instr& I, void* dst, int64_t m) {
    with_compute(prog_[I.a].dtype, [&](auto* ap) {
      using A = std::remove_pointer_t<decltype(ap)>;
      const A* a = val<A>(sc_, I.a);
      with_compute(I.dtype, [&](auto* tp) {
        using T = std::remove_pointer_t<decltype(tp)>;
        T* out = static_cast<T*>(dst);
        for (int64_t i = 0; i < m; ++i) out[i] = store_as<T>(a[i]);
        if constexpr (std::is_same_v<T, float>) round_floats(I.dtype, out, m);
      });
    });
    return dst;
  }

  const void* row_reduce(const Instr& I, void* dst) {
    with_compute(I.dtype, [&](auto* tp) {
      using T = std::remove_pointer_t<decltype(tp)>;
      const T* a = val<T>(sc_, I.a);
      T* out = static_cast<T*>(dst);
      if (rowc_ && rp_.rowc[size_t(I.a)]) {  // a row of equal values: spelled out, then reduced
        expand_rows(out, a, rows_, row_);
        a = out;
      }
      const T lowest = std::is_floating_point_v<T> ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::lowest();
      for (int64_t r = 0; r < rows_; ++r) {  // row r is read before lane r (< r * row) is written
        T v = I.code == Code::RowSum ? T(run_sum(a + r * row_, row_)) : run_max(a + r * row_, row_, lowest);
        if (rowc_) out[r] = v;
        else std::fill_n(out + r * row_, row_, v);
      }
    });
    return dst;
  }

  const void* where(size_t k, void* dst, int64_t m) {
    const Instr& I = prog_[k];
    with_compute(I.dtype, [&](auto* tp) {
      using T = std::remove_pointer_t<decltype(tp)>;
      const uint8_t* c = static_cast<const uint8_t*>(operand(k, I.a, 0));
      const T* a = static_cast<const T*>(operand(k, I.b, 1));
      const T* b = static_cast<const T*>(operand(k, I.c, 2));
      T* out = static_cast<T*>(dst);
      const bool sa = rp_.scalar[size_t(I.b)], sb = rp_.scalar[size_t(I.c)];
      if (sa && sb)
        for (int64_t i = 0; i < m; ++i) out[i] = select(c[i], a[0], b[0]);
      else if (sa)
        for (int64_t i = 0; i < m; ++i) out[i] = select(c[i], a[0], b[i]);
      else if (sb)
        for (int64_t i = 0; i < m; ++i) out[i] = select(c[i], a[i], b[0]);
      else
        for (int64_t i = 0; i < m; ++i) out[i] = select(c[i], a[i], b[i]);
    });
    return dst;
  }

  const std::vector<Instr>& prog_;
  const RegPlan& rp_;
  const std::vector<const void*>& in_;
  const Shape& domain_;
  const int64_t start_, n_;
  const LaunchArgs& args_;
  Scratch& sc_;
  const int64_t row_, rows_;
  const bool rowc_;
};

}  // namespace

// ---- The register plan ------------------------------------------------------------------------

std::vector<int> results_of(const Step& st) {
  std::vector<int> keep;
  if (!st.program.empty()) keep = st.more_results, keep.push_back(int(st.program.size()) - 1);
  return keep;
}

RegPlan plan_registers(const std::vector<Instr>& prog, const std::vector<int>& keep) {
  const int n = int(prog.size());
  RegPlan p;
  p.reg.assign(size_t(n), -1);
  p.scalar.assign(size_t(n), 0);
  for (int k = 0; k < n; ++k) {
    const Instr& I = prog[size_t(k)];
    if (I.code == Code::Const) p.scalar[size_t(k)] = 1;
    for (int o : {I.a, I.b, I.c})
      if (o >= 0 && !(is_binary(I.code) || (I.code == Code::Where && o != I.a))) p.scalar[size_t(o)] = 0;
  }
  std::vector<int> last = last_readers(prog);
  for (int k : keep) last[size_t(k)] = n, p.scalar[size_t(k)] = 0;
  std::vector<uint8_t> own(p.scalar.size());
  for (size_t k = 0; k < size_t(n); ++k) own[k] = !p.scalar[k];
  p.nregs = assign_registers(prog, own, std::move(last), 0, std::numeric_limits<int>::max(), p.reg);
  p.binary.assign(size_t(n), nullptr);
  p.cval.assign(size_t(n), 0.0);
  for (size_t k = 0; k < size_t(n); ++k) {
    const Instr& I = prog[k];
    if (is_binary(I.code)) p.binary[k] = binary_fn(I.code, prog[size_t(I.a)].dtype);
    if (I.code == Code::Const)
      with_compute(I.dtype, [&](auto* tp) {
        using T = std::remove_pointer_t<decltype(tp)>;
        T v = store_as<T>(I.value);
        if (I.dtype == DType::Float16 || I.dtype == DType::BFloat16) v = T(rounded_to(I.dtype, I.value));
        std::memcpy(&p.cval[k], &v, sizeof v);
      });
  }
  return p;
}

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

// Which instructions of a Row Step are constant along each row: row reductions, loads that stay
// put along the row (a per-row statistic broadcast back), and what is computed from those and
// scalar constants. None (every value per position) for rows shorter than kRowConstMin, where
// evaluating row by row costs more than it saves.
void plan_row_constants(RegPlan& rp, const Step& st) {
  const Shape& d = st.domain;
  if (st.kind != StepKind::Row || st.row < kRowConstMin) return;
  size_t first = d.size();  // the row: dims [first, rank)
  int64_t p = 1;
  while (first > 0 && p < st.row) p *= d[--first];
  if (p != st.row) return;
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
  rp.rowc = std::move(rc);
  rp.spare = rp.nregs;
  rp.nregs += 3;
}

// ---- Running a program ------------------------------------------------------------------------

Scratch& scratch(size_t ninstr, size_t nregs, int64_t lanes) {
  thread_local Scratch s;
  lanes = std::max(lanes, kTile);
  if (s.lanes != lanes) s.lanes = lanes, s.regs.clear();
  if (s.regs.size() < nregs * size_t(lanes)) s.regs.resize(nregs * size_t(lanes));
  if (s.consts.size() < ninstr) s.consts.resize(ninstr);
  if (s.off.size() < size_t(lanes)) s.off.resize(size_t(lanes)), s.valid.resize(size_t(lanes));
  return s;
}

void run_program(const std::vector<Instr>& prog, const RegPlan& rp, const std::vector<const void*>& in,
                 const Shape& domain, int64_t start, int64_t n, const LaunchArgs& args, Scratch& sc, int64_t row,
                 char* const* direct) {
  Tile(prog, rp, in, domain, start, n, args, sc, row).run(direct);
}

void store_reg(DType t, int r, void* out, int64_t start, int64_t n, Scratch& sc, const kir::View* view) {
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

}  // namespace tessera::backends::cpu
