#include "backends/render/c_render.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "core/half.h"
#include "core/fail.h"
#include "core/hash.h"

namespace tessera::render {
namespace {

using kir::Code;
using kir::IndexMap;
using kir::Instr;
using kir::Step;
using kir::StepKind;
using kir::View;

// Helpers every program shares, written against the dialect's names: float16/bfloat16
// conversions rounded as core/half.h rounds, and Philox4x32-10 as core/philox.h draws it.
const char* kHelpers = R"(
FN u16 f32_to_f16(float f) {
  u32 u = BITS_F32(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (u16)(sign | 0x7e00u);
  if (a >= 0x477ff000u) return (u16)(sign | 0x7c00u);
  if (a < 0x38800000u) {
    if (a < 0x33000000u) return (u16)sign;
    u32 mant = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - (int)(a >> 23);
    u32 r = mant >> shift, rem = mant & ((1u << shift) - 1u), hw = 1u << (shift - 1);
    if (rem > hw || (rem == hw && (r & 1u))) ++r;
    return (u16)(sign | r);
  }
  u32 r = (a - 0x38000000u) >> 13, rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return (u16)(sign | r);
}
FN float f16_to_f32(u16 h) {
  u32 sign = (u32)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    if (m == 0) return F32_BITS(sign);
    float f = (float)m * (1.0f / 16777216.0f);
    return sign ? -f : f;
  }
  if (e == 31) return F32_BITS(sign | 0x7f800000u | (m << 13));
  return F32_BITS(sign | ((e + 112u) << 23) | (m << 13));
}
FN u16 f32_to_bf16(float f) {
  u32 u = BITS_F32(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (u16)(u >> 16);
}
FN float bf16_to_f32(u16 h) { return F32_BITS((u32)h << 16); }
FN float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }
FN float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }
FN u64 philox(u64 seed, u64 off, u32 draw, u64 index) {
  u64 stream = off + draw;
  u32 c0 = (u32)index, c1 = (u32)(index >> 32), c2 = (u32)stream, c3 = (u32)(stream >> 32);
  u32 k0 = (u32)seed, k1 = (u32)(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    u64 p0 = (u64)0xD2511F53u * c0, p1 = (u64)0xCD9E8D57u * c2;
    u32 n0 = (u32)(p1 >> 32) ^ c1 ^ k0, n2 = (u32)(p0 >> 32) ^ c3 ^ k1;
    c0 = n0; c1 = (u32)p1; c2 = n2; c3 = (u32)p0;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  return ((u64)c1 << 32) | c0;
}
FN FACC rng_uniform(u64 seed, u64 off, u32 draw, u64 index) {
  u64 w = philox(seed, off, draw, index);
  return (FACC)((u32)w >> 8) * (FACC)(1.0 / 16777216.0);
}
FN FACC rng_normal(u64 seed, u64 off, u32 draw, u64 index) {
  u64 w = philox(seed, off, draw, index);
  FACC u1 = ((FACC)((u32)w >> 8) + (FACC)1) * (FACC)(1.0 / 16777216.0);
  FACC u2 = (FACC)((u32)(w >> 32) >> 8) * (FACC)(1.0 / 16777216.0);
  return sqrt((FACC)-2 * log(u1)) * cos((FACC)6.283185307179586 * u2);
}
)";

const char* storage_type(DType t) {
  switch (t) {
    case DType::Bool: return "u8";
    case DType::Int32: return "i32";
    case DType::Int64: return "i64";
    case DType::Float16:
    case DType::BFloat16: return "u16";
    case DType::Float32: return "float";
    case DType::Float64: return "double";
  }
  return "?";
}
const char* ctype(DType t) { return storage_type(compute_dtype(t)); }
std::string S(int64_t v) { return std::to_string(v); }

// Storage value expression -> compute value, and back.
std::string to_compute(DType t, const std::string& x) {
  if (t == DType::Float16) return "f16_to_f32(" + x + ")";
  if (t == DType::BFloat16) return "bf16_to_f32(" + x + ")";
  return x;
}
std::string to_storage(DType t, const std::string& x) {
  switch (t) {
    case DType::Bool: return "(u8)((" + x + ") != 0)";
    case DType::Float16: return "f32_to_f16(" + x + ")";
    case DType::BFloat16: return "f32_to_bf16(" + x + ")";
    default: return "(" + std::string(storage_type(t)) + ")(" + x + ")";
  }
}
// A compute value rounded as a store into dtype t would round it (float16/bfloat16 only).
std::string rounded(DType t, const std::string& x) {
  if (t == DType::Float16) return "round_f16(" + x + ")";
  if (t == DType::BFloat16) return "round_bf16(" + x + ")";
  return x;
}

// Builds one kernel: parameters, buffer arguments and body text.
struct Kernel {
  std::vector<int64_t> P;
  std::vector<int> slots;
  std::vector<DType> slot_types;
  std::ostringstream b;  // body

  std::string p(int64_t v) {
    P.push_back(v);
    return "P[" + S(int64_t(P.size()) - 1) + "]";
  }
  // Divisor parameter: never zero (a zero extent has no positions; masked ones may still unravel).
  std::string pdiv(int64_t v) { return p(std::max<int64_t>(v, 1)); }
  // The typed pointer variable of a slot ("s0"), binding it on first use.
  std::string arg(int slot, DType t) {
    for (size_t k = 0; k < slots.size(); ++k)
      if (slots[k] == slot) return "s" + S(int64_t(k));
    slots.push_back(slot);
    slot_types.push_back(t);
    return "s" + S(int64_t(slots.size()) - 1);
  }
  // A constant of dtype t as a compute value: passed as bits, so the source does not depend on it.
  std::string constant(DType t, double v, bool round_half) {
    DType c = compute_dtype(t);
    if (c == DType::Float32) {
      float f = float(v);
      if (round_half && t == DType::Float16) f = half::f16_to_float(half::float_to_f16(f));
      if (round_half && t == DType::BFloat16) f = half::bf16_to_float(half::float_to_bf16(f));
      return "F32_BITS(" + p(int64_t(half::bits(f))) + ")";
    }
    if (c == DType::Float64) {
      int64_t bits;
      std::memcpy(&bits, &v, 8);
      return "F64_BITS(" + p(bits) + ")";
    }
    if (c == DType::Bool) return "(u8)" + p(v != 0);
    if (c == DType::Int32) return "(i32)" + p(int64_t(int32_t(v)));
    return p(int64_t(v));
  }

  // Declares d<prefix>0.. = the multi-index of linear position `lin` in shape s.
  void unravel(const std::string& prefix, const std::string& lin, const Shape& s, const std::string& ind) {
    size_t r = s.size();
    if (r == 0) return;
    b << ind << "i64 " << prefix << "t = " << lin << ";\n";
    for (size_t d = r; d-- > 1;) {
      std::string e = pdiv(s[d]);
      b << ind << "i64 " << prefix << d << " = " << prefix << "t % " << e << "; " << prefix << "t /= " << e << ";\n";
    }
    b << ind << "i64 " << prefix << "0 = " << prefix << "t;\n";
  }
  // Advances multi-index d<prefix> over shape s by one position.
  void bump(const std::string& prefix, const Shape& s, const std::string& ind) {
    size_t r = s.size();
    if (r == 0) return;
    std::string close;
    b << ind;
    for (size_t d = r; d-- > 0;) {
      b << "if (++" << prefix << d << " == " << p(s[d]) << ") { " << prefix << d << " = 0; ";
      close += "}";
      if (d == 0) b << close;
    }
    b << "\n";
  }
};

std::string source_of(const std::string& name_placeholder, Kernel& k, const std::string& body_text) {
  std::ostringstream os;
  os << "KERNEL void " << name_placeholder << "(GLOBAL const i64* P, GLOBAL int* E, RNG_ARGS";
  for (size_t a = 0; a < k.slots.size(); ++a) os << ", GLOBAL char* b" << a << ", i64 o" << a;
  os << ") {\n";
  if (body_text.find("rng_") != std::string::npos) os << "  RNG_INIT\n";  // seed, roff (the dialect's)
  for (size_t a = 0; a < k.slots.size(); ++a)
    os << "  GLOBAL " << storage_type(k.slot_types[a]) << "* s" << a << " = (GLOBAL " << storage_type(k.slot_types[a])
       << "*)(b" << a << " + o" << a << ");\n";
  os << body_text << "}\n";
  return os.str();
}

KernelCode finish(Kernel& k, int64_t work, bool checks = false) {
  // Named by the hash of its text with a placeholder name, which is then replaced.
  const std::string placeholder = "KNAME";
  std::string text = source_of(placeholder, k, k.b.str());
  KernelCode kc;
  char name[24];
  std::snprintf(name, sizeof name, "t%016llx", (unsigned long long)fnv1a(text));
  kc.name = name;
  kc.uses_f64 = text.find("double") != std::string::npos;  // a float64 slot, sum or value
  kc.source = text.replace(text.find(placeholder), placeholder.size(), name);
  kc.params = std::move(k.P);
  kc.work_items = work;
  kc.slots = k.slots;
  kc.checks_index = checks;
  return kc;
}

// Renders an elementwise program: the values of the instructions `want` needs, at the domain
// position whose multi-index is d<dom>0.. and linear number `pos`. Row reductions already
// computed are in `scalar` (their variable name), others may not be needed.
struct ProgramWriter {
  Kernel& k;
  const Step& st;
  const std::vector<Instr>& prog;
  Shape domain;
  std::string dom = "d", pos = "pos";
  std::vector<std::string> scalar;  // per instruction: a precomputed value ("" if none)
  int product_input = -1;           // Gemm epilogue: loads of this input read `product`
  std::string product;

  ProgramWriter(Kernel& kk, const Step& s, const std::vector<Instr>& p, Shape d)
      : k(kk), st(s), prog(p), domain(std::move(d)), scalar(p.size()) {}

  std::string v(int i) const { return scalar[size_t(i)].empty() ? "v" + S(i) : scalar[size_t(i)]; }

  void load(int i, const std::string& ind) {
    const Instr& I = prog[size_t(i)];
    std::string T = ctype(I.dtype), f = "f" + S(i), m = "m" + S(i);
    if (I.input == product_input) {
      k.b << ind << T << " v" << i << " = " << product << ";\n";
      return;
    }
    std::string src = k.arg(st.inputs[size_t(I.input)], I.dtype);
    const auto& views = I.map.views;
    bool any_mask = false;
    for (auto& vw : views) any_mask |= vw.masked();
    k.b << ind << T << " v" << i << ";\n" << ind << "{\n";
    std::string in2 = ind + "  ";
    // The top view reads the domain's multi-index; a view of another shape (a Gemm epilogue
    // reading through a reshape) unravels the linear position itself.
    std::string cur = dom;
    if (views.back().shape != domain) {
      k.unravel("u" + S(i) + "_", pos, views.back().shape, in2);
      cur = "u" + S(i) + "_";
    }
    if (any_mask) k.b << in2 << "int " << m << " = 1;\n";
    for (size_t lv = views.size(); lv-- > 0;) {
      const View& vw = views[lv];
      if (lv + 1 < views.size()) {  // unravel the position in the view above into this one's shape
        std::string pre = "w" + S(i) + "_" + S(int64_t(lv)) + "_";
        k.unravel(pre, f, vw.shape, in2);
        cur = pre;
      }
      if (vw.masked())
        for (size_t d = 0; d < vw.shape.size(); ++d)
          k.b << in2 << m << " &= " << cur << d << " >= " << k.p(vw.lo[d]) << " && " << cur << d << " < " << k.p(vw.hi[d])
              << ";\n";
      k.b << in2 << (lv + 1 == views.size() ? "i64 " : "") << f << " = " << k.p(vw.offset);
      for (size_t d = 0; d < vw.shape.size(); ++d) k.b << " + " << cur << d << " * " << k.p(vw.strides[d]);
      k.b << ";\n";
    }
    std::string val = to_compute(I.dtype, src + "[" + f + "]");
    if (any_mask)
      k.b << in2 << "v" << i << " = " << m << " ? " << val << " : " << k.constant(I.dtype, I.value, false) << ";\n";
    else
      k.b << in2 << "v" << i << " = " << val << ";\n";
    k.b << ind << "}\n";
  }

  std::string expr(int i) {
    const Instr& I = prog[size_t(i)];
    DType t = I.dtype;
    std::string T = ctype(t), a = I.a >= 0 ? v(I.a) : "", bb = I.b >= 0 ? v(I.b) : "", c = I.c >= 0 ? v(I.c) : "";
    bool fl = is_floating(t);
    switch (I.code) {
      case Code::Const: return k.constant(t, I.value, true);
      case Code::Iota: return "(" + T + ")" + dom + S(I.i0);
      case Code::Rng:
        return rounded(t, "(" + T + ")" + std::string(I.i1 == 0 ? "rng_uniform" : "rng_normal") + "((u64)seed, (u64)roff, (u32)" +
                              k.p(I.i0) + ", (u64)" + pos + (I.value != 0 ? " + " + std::to_string(int64_t(I.value)) + "ull" : std::string()) + ")");
      case Code::Cast: {
        DType from = compute_dtype(prog[size_t(I.a)].dtype);
        if (t == DType::Bool) return "(u8)(" + a + " != 0)";
        // The CPU converts integers to float through double.
        if (compute_dtype(t) == DType::Float32 && is_integral(from))
          return rounded(t, "(float)(FACC)" + a);
        return rounded(t, "(" + T + ")" + a);
      }
      case Code::Neg: return "(" + T + ")(-" + a + ")";
      case Code::Exp: return "exp(" + a + ")";
      case Code::Log: return "log(" + a + ")";
      case Code::Tanh: {
        // Past these bounds tanh rounds to +-1; PoCL's stops one ulp short, so 0.5x(1+tanh(x))
        // (GELU) at -inf gave -inf instead of NaN.
        std::string big = compute_dtype(t) == DType::Float64 ? "19.1" : "9.1f";
        return "(fabs(" + a + ") > " + big + " ? copysign((" + T + ")1, " + a + ") : tanh(" + a + "))";
      }
      case Code::Sqrt: return "sqrt(" + a + ")";
      case Code::Sin: return "sin(" + a + ")";
      case Code::Cos: return "cos(" + a + ")";
      case Code::Erf: return "erf(" + a + ")";
      case Code::Abs: return "(" + a + " < (" + T + ")0 ? (" + T + ")(-" + a + ") : " + a + ")";
      case Code::Sign:
        return "(" + a + " > (" + T + ")0 ? (" + T + ")1 : " + a + " < (" + T + ")0 ? (" + T + ")(-1) : " + a + ")";
      case Code::Floor: return fl ? "floor(" + a + ")" : a;
      case Code::Ceil: return fl ? "ceil(" + a + ")" : a;
      case Code::Round: return fl ? "rint(" + a + ")" : a;
      case Code::Add: return "(" + T + ")(" + a + " + " + bb + ")";
      case Code::Sub: return "(" + T + ")(" + a + " - " + bb + ")";
      case Code::Mul: return "(" + T + ")(" + a + " * " + bb + ")";
      case Code::Div: return "(" + T + ")(" + a + " / " + bb + ")";
      case Code::Max:
      case Code::Min: {
        std::string op = I.code == Code::Max ? " > " : " < ";
        std::string pick = "(" + a + op + bb + " ? " + a + " : " + bb + ")";
        return fl ? "((" + a + " != " + a + " || " + bb + " != " + bb + ") ? (" + T + ")NAN : " + pick + ")" : pick;
      }
      case Code::Pow: return fl ? "pow(" + a + ", " + bb + ")" : "(" + T + ")0";
      case Code::Eq: return "(u8)(" + a + " == " + bb + ")";
      case Code::Ne: return "(u8)(" + a + " != " + bb + ")";
      case Code::Lt: return "(u8)(" + a + " < " + bb + ")";
      case Code::Le: return "(u8)(" + a + " <= " + bb + ")";
      case Code::Gt: return "(u8)(" + a + " > " + bb + ")";
      case Code::Ge: return "(u8)(" + a + " >= " + bb + ")";
      case Code::Where: return "(" + a + " ? " + bb + " : " + c + ")";
      case Code::Load:
      case Code::RowSum:
      case Code::RowMax: break;
    }
    fail("render", "cannot render instruction " + S(int(I.code)), "");
  }

  // Emits every instruction the targets need (in program order), skipping precomputed ones.
  void emit(const std::vector<int>& targets, const std::string& ind) {
    std::vector<bool> need(prog.size(), false);
    std::vector<int> stack = targets;
    while (!stack.empty()) {
      int i = stack.back();
      stack.pop_back();
      if (need[size_t(i)] || !scalar[size_t(i)].empty()) continue;
      need[size_t(i)] = true;
      const Instr& I = prog[size_t(i)];
      if (I.code == Code::RowSum || I.code == Code::RowMax)
        fail("render", "row reduction needed before it is computed (step " + st.str() + ")", "");
      for (int o : {I.a, I.b, I.c})
        if (o >= 0) stack.push_back(o);
    }
    for (size_t i = 0; i < prog.size(); ++i) {
      if (!need[i]) continue;
      if (prog[i].code == Code::Load) load(int(i), ind);
      else k.b << ind << ctype(prog[i].dtype) << " v" << i << " = " << expr(int(i)) << ";\n";
    }
  }
};

// Accumulation of a sum or max over a loop: declarations, the update, the final value.
struct Accumulator {
  std::string name, type;
  bool is_max, fl;
  DType t;
  Accumulator(std::string n, DType dt, bool mx) : name(std::move(n)), is_max(mx), fl(is_floating(dt)), t(dt) {
    // Sums accumulate in double (FACC: float on devices without float64) or int64, as the CPU's;
    // a max in the compute type.
    type = is_max ? ctype(dt) : compute_dtype(dt) == DType::Float64 ? "double" : fl ? "FACC" : "i64";
  }
  std::string init() const {
    std::string start = !is_max ? "0"
                        : fl    ? "-INFINITY"
                        : t == DType::Int32 ? "(-2147483647 - 1)"
                        : t == DType::Int64 ? "(-9223372036854775807L - 1)"
                                            : "0";
    return type + " " + name + " = (" + type + ")" + start + ";" + (is_max && fl ? " int " + name + "n = 0;" : "");
  }
  std::string add(const std::string& x) const {
    if (!is_max) return name + " += (" + type + ")" + x + ";";
    return (fl ? name + "n |= " + x + " != " + x + "; " : std::string()) + name + " = " + x + " > " + name + " ? " + x +
           " : " + name + ";";
  }
  // Combines the partial results of a group's work-items (BLOCK_REDUCE(x, is_max)): every
  // work-item gets the group's result.
  std::string combine() const {
    std::string mx = is_max ? "1" : "0";
    std::string r = name + " = (" + type + ")BLOCK_REDUCE(" + (type == "u8" ? "(int)" : "") + name + ", " + mx + ");";
    return is_max && fl ? r + " " + name + "n = BLOCK_REDUCE(" + name + "n, 1);" : r;
  }
  std::string value() const {
    std::string T = ctype(t);
    if (is_max && fl) return "(" + name + "n ? (" + T + ")NAN : " + name + ")";
    return "(" + T + ")" + name;
  }
};

// The Step's result at index `at`; `more`: its further results there too.
void store_outputs(Kernel& k, const Step& st, ProgramWriter& w, const std::string& at, const std::string& ind,
                   bool more = true) {
  int last = int(st.program.size()) - 1;
  k.b << ind << k.arg(st.output, st.dtype) << "[" << at << "] = " << to_storage(st.dtype, w.v(last)) << ";\n";
  for (size_t o = 0; o < st.more_outputs.size() && more; ++o) {
    int r = st.more_results[o];
    DType t = st.program[size_t(r)].dtype;
    k.b << ind << k.arg(st.more_outputs[o], t) << "[" << at << "] = " << to_storage(t, w.v(r)) << ";\n";
  }
}

// Input slots are bound before outputs so the argument order is the same for equal structures.
void bind_inputs(Kernel& k, const Step& st, const std::vector<DType>& types) {
  for (size_t i = 0; i < st.inputs.size(); ++i) k.arg(st.inputs[i], types[i]);
}
std::vector<DType> program_input_types(const Step& st) {
  std::vector<DType> t(st.inputs.size(), st.dtype);
  for (const Instr& I : st.program)
    if (I.code == Code::Load) t[size_t(I.input)] = I.dtype;
  return t;
}

KernelCode render_elementwise(const Step& st) {
  Kernel k;
  bind_inputs(k, st, program_input_types(st));
  int64_t n = numel(st.shape);
  k.b << "  i64 pos = GID;\n  if (pos >= " << k.p(n) << ") return;\n";
  k.unravel("d", "pos", st.shape, "  ");
  ProgramWriter w(k, st, st.program, st.shape);
  std::vector<int> targets{int(st.program.size()) - 1};
  targets.insert(targets.end(), st.more_results.begin(), st.more_results.end());
  w.emit(targets, "  ");
  store_outputs(k, st, w, "pos", "  ");
  return finish(k, n);
}

// Row: one work-item per row of `row` positions; each RowSum/RowMax is a loop over the row
// (recomputing what it reads), then the outputs are computed per position (or once per row).
// With nt > 0 (a dialect's row_block), one group of work-items per row instead: work-item `lid`
// of a group of n takes positions lid, lid + n, ... in order, and the group combines its partial
// results with BLOCK_REDUCE (a fixed order: deterministic for a given n). The source reads n
// from LOCAL_SIZE; the launch's n (group_size) is nt, or less for a short row (multiples of 32).
KernelCode render_row(const Step& st, int nt) {
  Kernel k;
  bind_inputs(k, st, program_input_types(st));
  int64_t total = numel(st.domain), row = st.row, rows = row ? total / row : 0;
  bool per_row = numel(st.shape) != total;
  // The loop over a row's positions, each with its multi-index d0.. and linear number pos.
  auto open_loop = [&](const std::string& ind) {
    if (nt == 0) {
      k.unravel("d", "r * L", st.domain, ind);
      k.b << ind << "for (i64 j = 0; j < L; ++j) {\n" << ind << "  i64 pos = r * L + j;\n";
    } else {
      k.b << ind << "for (i64 j = lid; j < L; j += LOCAL_SIZE) {\n" << ind << "  i64 pos = r * L + j;\n";
      k.unravel("d", "pos", st.domain, ind + "  ");
    }
  };
  auto close_loop = [&](const std::string& ind) {
    if (nt == 0) k.bump("d", st.domain, ind + "  ");
    k.b << ind << "}\n";
  };
  if (nt == 0)
    k.b << "  i64 r = GID;\n  if (r >= " << k.p(rows) << ") return;\n  i64 L = " << k.p(row) << ";\n";
  else  // every work-item of a group reaches each BLOCK_REDUCE: the group returns as a whole
    k.b << "  i64 r = GROUP_ID;\n  if (r >= " << k.p(rows) << ") return;\n  i64 L = " << k.p(row) << ";\n  int lid = LOCAL_ID;\n";
  ProgramWriter w(k, st, st.program, st.domain);
  for (size_t i = 0; i < st.program.size(); ++i) {
    const Instr& I = st.program[i];
    if (I.code != Code::RowSum && I.code != Code::RowMax) continue;
    Accumulator acc("a" + S(int64_t(i)), I.dtype, I.code == Code::RowMax);
    k.b << "  " << acc.init() << "\n  {\n";
    open_loop("    ");
    w.emit({I.a}, "      ");
    k.b << "      " << acc.add(w.v(I.a)) << "\n";
    close_loop("    ");
    k.b << "  }\n";
    if (nt > 0) k.b << "  " << acc.combine() << "\n";
    k.b << "  " << ctype(I.dtype) << " v" << i << " = " << acc.value() << ";\n";
    w.scalar[i] = "v" + S(int64_t(i));
  }
  const std::string first = nt == 0 ? "" : "if (lid == 0) ";  // values stored once per row
  int last = int(st.program.size()) - 1;
  if (!st.more_outputs.empty()) {  // further results: one value per row, at the row's first position
    k.b << "  " << first << "{\n";
    k.unravel("d", "r * L", st.domain, "    ");
    k.b << "    i64 pos = r * L;\n";
    w.emit(st.more_results, "    ");
    for (size_t o = 0; o < st.more_outputs.size(); ++o) {
      int r = st.more_results[o];
      DType t = st.program[size_t(r)].dtype;
      k.b << "    " << k.arg(st.more_outputs[o], t) << "[r] = " << to_storage(t, w.v(r)) << ";\n";
    }
    k.b << "  }\n";
  }
  if (per_row) {
    k.b << "  " << first << "{\n";
    k.unravel("d", "r * L", st.domain, "    ");
    k.b << "    i64 pos = r * L;\n";
    w.emit({last}, "    ");
    store_outputs(k, st, w, "r", "    ", false);
  } else {
    k.b << "  {\n";
    open_loop("    ");
    w.emit({last}, "      ");
    store_outputs(k, st, w, "pos", "      ", false);
    close_loop("    ");
  }
  k.b << "  }\n";
  const int n = int(std::min<int64_t>(nt, std::max<int64_t>(32, (row + 31) / 32 * 32)));
  KernelCode kc = finish(k, nt == 0 ? rows : rows * n);
  kc.group_size = nt == 0 ? 0 : n;
  return kc;
}

// Reduce: the domain is permuted so the kept axes come first; each work-item owns one output
// and reduces its contiguous range of the permuted domain in order.
KernelCode render_reduce(const Step& st) {
  std::vector<int64_t> perm;
  std::vector<bool> red(st.domain.size(), false);
  for (int64_t a : st.axes) red[size_t(a)] = true;
  for (size_t d = 0; d < red.size(); ++d)
    if (!red[d]) perm.push_back(int64_t(d));
  for (int64_t a : st.axes) perm.push_back(a);
  Shape dom;
  int64_t outer = 1, inner = 1;
  for (int64_t d : perm) {
    dom.push_back(st.domain[size_t(d)]);
    (red[size_t(d)] ? inner : outer) *= st.domain[size_t(d)];
  }
  std::vector<Instr> prog = st.program;
  for (Instr& I : prog) {
    if (I.code == Code::Iota || I.code == Code::Rng || I.code == Code::RowSum || I.code == Code::RowMax)
      fail("render", "reduce programs cannot use iota, rng or row reductions (step " + st.str() + ")", "");
    if (I.code == Code::Load) I.map = I.map.permute(perm);
  }
  Kernel k;
  bind_inputs(k, st, program_input_types(st));
  k.b << "  i64 o = GID;\n  if (o >= " << k.p(outer) << ") return;\n  i64 R = " << k.p(inner) << ";\n";
  Accumulator acc("acc", st.dtype, st.reduce_op == ir::Op::ReduceMax);
  k.b << "  " << acc.init() << "\n";
  k.unravel("d", "o * R", dom, "  ");
  k.b << "  for (i64 j = 0; j < R; ++j) {\n    i64 pos = o * R + j;\n";
  ProgramWriter w(k, st, prog, dom);
  int last = int(prog.size()) - 1;
  w.emit({last}, "    ");
  k.b << "    " << acc.add(w.v(last)) << "\n";
  k.bump("d", dom, "    ");
  k.b << "  }\n";
  k.b << "  " << k.arg(st.output, st.dtype) << "[o] = " << to_storage(st.dtype, acc.value()) << ";\n";
  return finish(k, outer);
}

// Gemm: each work-item computes a tile of kTileM x kTileN outputs of one batch, accumulating
// over K in order (float32 in float32, as BLAS does; integers in int64), with the inner loop
// over contiguous columns so it vectorizes on CPU devices (PoCL). Operands are read through
// their strided views (batch strides too); the epilogue is applied to each product before it is
// stored. Measured on PoCL (bench/opencl_gemm.cpp): several times CLBlast's SGEMM on the GPT's shapes.
constexpr int kTileM = 8, kTileN = 16;
KernelCode render_gemm(const Step& st) {
  const View& av = st.maps[0].views[0];
  const View& bv = st.maps[1].views[0];
  size_t r = st.shape.size();
  int64_t M = st.shape[r - 2], N = st.shape[r - 1], K = av.shape[r - 1];
  Shape batch(st.shape.begin(), st.shape.end() - 2);
  int64_t nb = numel(batch), mb = (M + kTileM - 1) / kTileM, nc = (N + kTileN - 1) / kTileN;
  DType t = st.dtype;
  std::string T = ctype(t), acc = is_integral(t) ? "i64" : T, TM = S(kTileM), TN = S(kTileN);
  Kernel k;
  std::vector<DType> types = st.input_dtypes;
  types.resize(st.inputs.size(), t);
  bind_inputs(k, st, types);
  // Operands of float16/bfloat16 (autocast's products) are converted as read; the product is float32.
  const DType ot = types[0];
  std::string a = k.arg(st.inputs[0], ot), b = k.arg(st.inputs[1], ot);
  k.b << "  i64 g = GID;\n  if (g >= " << k.p(nb * mb * nc) << ") return;\n";
  k.b << "  i64 M = " << k.p(M) << ", N = " << k.p(N) << ", K = " << k.p(K) << ", nc = " << k.pdiv(nc) << ", mb = " << k.pdiv(mb)
      << ";\n";
  k.b << "  i64 jb = (g % nc) * " << TN << ", q = g / nc, i0 = (q % mb) * " << TM << ", bi = q / mb;\n";
  k.b << "  i64 oa = " << k.p(av.offset) << ", ob = " << k.p(bv.offset) << ";\n";
  k.unravel("e", "bi", batch, "  ");
  for (size_t d = 0; d < batch.size(); ++d)
    k.b << "  oa += e" << d << " * " << k.p(av.strides[d]) << "; ob += e" << d << " * " << k.p(bv.strides[d]) << ";\n";
  k.b << "  i64 ar = " << k.p(av.strides[r - 2]) << ", ac = " << k.p(av.strides[r - 1]) << ", br = " << k.p(bv.strides[r - 2])
      << ";\n";
  // B's column stride is structure (1 or not): contiguous columns load as vectors.
  bool unit = bv.strides[r - 1] == 1 || N == 1;
  std::string bc = unit ? "1" : k.p(bv.strides[r - 1]);
  k.b << "  " << acc << " c[" << TM << "][" << TN << "];\n  i64 ra[" << TM << "];\n";
  k.b << "  for (int x = 0; x < " << TM << "; ++x) {\n    ra[x] = oa + min(i0 + x, M - 1) * ar;\n    for (int y = 0; y < " << TN
      << "; ++y) c[x][y] = 0;\n  }\n";
  // Columns past N read column N - 1 and rows past M row M - 1 (never stored): no branches inside.
  k.b << "  i64 jl = min(jb + " << TN << ", N) - jb;\n";
  k.b << "  for (i64 kk = 0; kk < K; ++kk) {\n    " << acc << " bt[" << TN << "];\n";
  k.b << "    GLOBAL const " << storage_type(ot) << "* brow = " << b << " + ob + kk * br + jb * " << bc << ";\n";
  k.b << "    if (jl == " << TN << ") { for (int y = 0; y < " << TN << "; ++y) bt[y] = (" << acc << ")"
      << to_compute(ot, "brow[y * " + bc + "]") << "; }\n";
  k.b << "    else { for (int y = 0; y < " << TN << "; ++y) bt[y] = (" << acc << ")"
      << to_compute(ot, "brow[min((i64)y, jl - 1) * " + bc + "]") << "; }\n";
  k.b << "    for (int x = 0; x < " << TM << "; ++x) {\n      " << acc << " av = (" << acc << ")"
      << to_compute(ot, a + "[ra[x] + kk * ac]") << ";\n      for (int y = 0; y < " << TN
      << "; ++y) c[x][y] += av * bt[y];\n    }\n  }\n";
  k.b << "  for (int x = 0; x < " << TM << "; ++x)\n    for (int y = 0; y < " << TN << "; ++y) {\n";
  k.b << "      if (i0 + x >= M || y >= jl) continue;\n      i64 pos = (bi * M + i0 + x) * N + jb + y;\n";
  if (st.program.empty()) {
    k.b << "      " << k.arg(st.output, t) << "[pos] = " << to_storage(t, "(" + T + ")c[x][y]") << ";\n";
  } else {
    // The epilogue's domain is its loads' shape (the consumer's, which may be a reshape).
    Shape dom = st.shape;
    int product = -1;
    for (const Instr& I : st.program)
      if (I.code == Code::Load) {
        dom = I.map.shape();
        if (st.inputs[size_t(I.input)] == st.output) product = I.input;
      }
    k.unravel("d", "pos", dom, "      ");
    ProgramWriter w(k, st, st.program, dom);
    w.product_input = product;
    w.product = "(" + T + ")c[x][y]";
    w.emit({int(st.program.size()) - 1}, "      ");
    store_outputs(k, st, w, "pos", "      ");
  }
  k.b << "    }\n";
  return finish(k, nb * mb * nc);
}

// A dense copy of map m over slot `src` into slot `dst` (the base of ScatterAdd and
// DynamicUpdateSlice; a Gemm operand packed into the scratch slot), as a Copy Step.
KernelCode render_copy(int src_slot, int dst_slot, DType t, const IndexMap& m) {
  Step copy;
  copy.kind = StepKind::Copy;
  copy.shape = m.shape();
  copy.dtype = t;
  copy.inputs = {src_slot};
  copy.output = dst_slot;
  copy.program = {Instr::load(0, t, m)};
  KernelCode kc = render_elementwise(copy);
  if (dst_slot == kScratchSlot) kc.scratch_bytes = numel(copy.shape) * int64_t(itemsize(t));
  return kc;
}

// Offset through a single strided view of multi-index d<pre> with axis `ax` replaced by `val`.
std::string offset_expr(Kernel& k, const View& v, const std::string& pre, const std::string& ax, const std::string& val) {
  std::string e = k.p(v.offset);
  for (size_t d = 0; d < v.shape.size(); ++d)
    e += " + (" + ax + " == " + S(int64_t(d)) + " ? " + val + " : " + pre + S(int64_t(d)) + ") * " + k.p(v.strides[d]);
  return e;
}

// Gather: one work-item per output element; an out-of-range index records its position in E.
KernelCode render_gather(const Step& st) {
  const View& sv = st.maps[0].views[0];
  const View& iv = st.maps[1].views[0];
  Kernel k;
  std::string src = k.arg(st.inputs[0], st.dtype), idx = k.arg(st.inputs[1], st.input_dtypes.at(1));
  std::string out = k.arg(st.output, st.dtype);
  int64_t n = numel(st.shape);
  k.b << "  i64 pos = GID;\n  if (pos >= " << k.p(n) << ") return;\n  i64 ax = " << k.p(st.axis) << ";\n";
  k.unravel("d", "pos", st.shape, "  ");
  k.b << "  i64 v = (i64)" << idx << "[" << offset_expr(k, iv, "d", "-1", "0") << "];\n";
  k.b << "  if (v < 0 || v >= " << k.p(sv.shape[size_t(st.axis)]) << ") { ATOMIC_MIN(E, (int)min(pos, (i64)2147483646)); return; }\n";
  k.b << "  " << out << "[pos] = " << src << "[" << offset_expr(k, sv, "d", "ax", "v") << "];\n";
  return finish(k, n, true);
}

// ScatterAdd: one work-item per line of the index along the axis, adding in index order, so
// every output element sums its sources in the CPU's order (deterministic).
KernelCode render_scatter(const Step& st) {
  const View& iv = st.maps[1].views[0];
  const View& sv = st.maps[2].views[0];
  Shape lines = iv.shape;
  int64_t len = lines[size_t(st.axis)];
  lines[size_t(st.axis)] = 1;
  Kernel k;
  DType t = st.dtype;
  std::string idx = k.arg(st.inputs[1], st.input_dtypes.at(1)), src = k.arg(st.inputs[2], t), out = k.arg(st.output, t);
  int64_t n = numel(lines);
  k.b << "  i64 c = GID;\n  if (c >= " << k.p(n) << ") return;\n  i64 ax = " << k.p(st.axis) << ";\n";
  k.unravel("d", "c", lines, "  ");
  std::vector<int64_t> ostr = contiguous_strides(st.shape), istr = contiguous_strides(iv.shape);
  k.b << "  for (i64 q = 0; q < " << k.p(len) << "; ++q) {\n";
  k.b << "    i64 v = (i64)" << idx << "[" << offset_expr(k, iv, "d", "ax", "q") << "];\n";
  std::string lin = "0";
  for (size_t d = 0; d < iv.shape.size(); ++d)
    lin += " + (ax == " + S(int64_t(d)) + " ? q : d" + S(int64_t(d)) + ") * " + k.p(istr[d]);
  k.b << "    if (v < 0 || v >= " << k.p(st.shape[size_t(st.axis)]) << ") { ATOMIC_MIN(E, (int)min(" << lin
      << ", (i64)2147483646)); continue; }\n";
  std::string o = "    i64 f = 0";
  for (size_t d = 0; d < st.shape.size(); ++d)
    o += " + (ax == " + S(int64_t(d)) + " ? v : d" + S(int64_t(d)) + ") * " + k.p(ostr[d]);
  k.b << o << ";\n";
  std::string x = to_compute(t, out + "[f]"), y = to_compute(t, src + "[" + offset_expr(k, sv, "d", "ax", "q") + "]");
  k.b << "    " << out << "[f] = " << to_storage(t, "(" + std::string(ctype(t)) + ")(" + x + " + " + y + ")") << ";\n  }\n";
  return finish(k, n, true);
}

// DynamicUpdateSlice, after the base copy: one work-item per update element, at offsets read
// from the offsets buffer and clamped as XLA clamps them.
KernelCode render_dus(const Step& st) {
  const View& uv = st.maps[1].views[0];
  const View& ov = st.maps[2].views[0];
  Kernel k;
  std::string upd = k.arg(st.inputs[1], st.dtype), offs = k.arg(st.inputs[2], DType::Int64), out = k.arg(st.output, st.dtype);
  int64_t n = numel(uv.shape);
  k.b << "  i64 pos = GID;\n  if (pos >= " << k.p(n) << ") return;\n";
  k.unravel("d", "pos", uv.shape, "  ");
  std::vector<int64_t> ostr = contiguous_strides(st.shape);
  k.b << "  i64 f = 0, u = " << k.p(uv.offset) << ";\n";
  for (size_t d = 0; d < st.shape.size(); ++d) {
    k.b << "  { i64 s = " << offs << "[" << k.p(ov.offset + int64_t(d) * ov.strides[0]) << "]; s = clamp(s, (i64)0, (i64)"
        << k.p(st.shape[d] - uv.shape[d]) << "); f += (s + d" << d << ") * " << k.p(ostr[d]) << "; u += d" << d << " * "
        << k.p(uv.strides[d]) << "; }\n";
  }
  k.b << "  " << out << "[f] = " << upd << "[u];\n";
  return finish(k, n);
}

}  // namespace

const Dialect& opencl_c() {
  static const Dialect d{"opencl", R"(#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#define HAS_FP64 1
typedef double FACC;
#else
#define HAS_FP64 0
typedef float FACC;
#endif
#pragma OPENCL FP_CONTRACT OFF
typedef char i8;
typedef uchar u8;
typedef ushort u16;
typedef int i32;
typedef uint u32;
typedef long i64;
typedef ulong u64;
#define KERNEL __kernel
#define GLOBAL __global
#define FN static inline
#define GID ((i64)get_global_id(0))
#define F32_BITS(u) as_float((uint)(u))
#define F64_BITS(u) as_double((long)(u))
#define BITS_F32(f) as_uint(f)
#define ATOMIC_MIN(p, v) atomic_min((volatile __global int*)(p), (v))
#define RNG_ARGS i64 seed, i64 roff
#define RNG_INIT
)",
                         {},
                         0};
  return d;
}

// CUDA C++ for NVRTC, without headers (NVRTC's built-in math functions and intrinsics only),
// compiled with the dialect's options: no fused multiply-add contraction (as OpenCL's
// FP_CONTRACT OFF), so results round as the CPU's do.
const Dialect& cuda_c() {
  static const Dialect d{"cuda", R"(#define HAS_FP64 1
typedef double FACC;
typedef signed char i8;
typedef unsigned char u8;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;
#define KERNEL extern "C" __global__
#define GLOBAL
#define FN static __device__ __forceinline__
#define GID ((i64)blockIdx.x * (i64)blockDim.x + (i64)threadIdx.x)
#define F32_BITS(u) __uint_as_float((u32)(u))
#define F64_BITS(u) __longlong_as_double((i64)(u))
#define BITS_F32(f) __float_as_uint(f)
#define ATOMIC_MIN(p, v) atomicMin((int*)(p), (int)(v))
#define RNG_ARGS i64 seed_arg, i64 roff_arg, const u64* rng_ptr
#define RNG_INIT i64 seed = rng_ptr ? (i64)rng_ptr[0] : seed_arg, roff = rng_ptr ? (i64)rng_ptr[1] : roff_arg;
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fc00000)
#endif
static __device__ __forceinline__ i64 clamp(i64 x, i64 lo, i64 hi) { return x < lo ? lo : x > hi ? hi : x; }
#define LOCAL_ID ((int)threadIdx.x)
#define LOCAL_SIZE ((int)blockDim.x)
#define GROUP_ID ((i64)blockIdx.x)
#define BLOCK_REDUCE(v, mx) block_reduce(v, mx)
// The sum (mx = 0) or max (mx = 1) of v over the block (blockDim.x a multiple of 32), in a fixed
// order: a shuffle tree within each warp, then the warps' results in warp order.
template <typename T> static __device__ T block_reduce(T v, int mx) {
  __shared__ T part[32];
  for (int o = 16; o > 0; o >>= 1) {
    T u = __shfl_down_sync(0xffffffffu, v, o);
    v = mx ? (u > v ? u : v) : v + u;
  }
  __syncthreads();  // part[] may still be read from the previous call
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w) v = mx ? (part[w] > v ? part[w] : v) : v + part[w];
  if (threadIdx.x == 0) part[0] = v;
  __syncthreads();
  return part[0];
}
)",
                         {"--fmad=false"},
                         256};
  return d;
}

std::vector<KernelCode> render(const Step& st) { return render(st, opencl_c()); }

std::vector<KernelCode> render(const Step& st, const Dialect& d) {
  switch (st.kind) {
    case StepKind::Elementwise:
    case StepKind::Copy: return {render_elementwise(st)};
    case StepKind::Row: return {render_row(st, d.row_block)};
    case StepKind::Reduce: return {render_reduce(st)};
    case StepKind::Gemm: {
      if (st.accumulate)  // only for targets declaring Target::gemm_accumulate; these do not
        fail("render", "an accumulating product (C += A @ B) is not rendered (step " + st.str() + ")", "");
      // A B whose columns are not contiguous (a Linear layer's transposed weight), or that is
      // read through a stacked map (a conv's im2col window), is packed densely into the scratch
      // slot first, so the GEMM's inner loop reads contiguous columns. An epilogue that loads B's
      // slot keeps reading the slot itself, as a further input.
      const IndexMap& bm = st.maps[1];
      const View& bv = bm.views[0];
      if (bm.single() && (bv.strides.back() == 1 || bv.shape.back() == 1 || numel(bv.shape) == 0)) return {render_gemm(st)};
      Step packed = st;
      packed.inputs[1] = kScratchSlot;
      packed.maps[1] = IndexMap::contiguous(bm.shape());
      bool reads_b = false;
      for (Instr& I : packed.program)
        if (I.code == Code::Load && I.input == 1) I.input = int(st.inputs.size()), reads_b = true;
      if (reads_b) {
        packed.inputs.push_back(st.inputs[1]);
        if (!packed.input_dtypes.empty()) packed.input_dtypes.resize(st.inputs.size(), st.dtype), packed.input_dtypes.push_back(st.input_dtypes.at(1));
      }
      const DType bt = st.input_dtypes.size() > 1 ? st.input_dtypes[1] : st.dtype;  // 16-bit B: packed as stored
      return {render_copy(st.inputs[1], kScratchSlot, bt, bm), render_gemm(packed)};
    }
    case StepKind::Gather: return {render_gather(st)};
    case StepKind::ScatterAdd: return {render_copy(st.inputs[0], st.output, st.dtype, st.maps[0]), render_scatter(st)};
    case StepKind::DynamicUpdateSlice:
      return {render_copy(st.inputs[0], st.output, st.dtype, st.maps[0]), render_dus(st)};
    case StepKind::Collective:
      fail(ir::op_name(st.collective), "this backend does not run collectives (only the cpu backend does; "
           "docs/architecture.md \"Parallelism\")", st.sources.empty() ? "" : st.sources[0].scope);
    case StepKind::Attention:  // only for targets declaring Target::attention; these do not
      fail("render", "the fused attention Step is not rendered (step " + st.str() + ")", "");
  }
  fail("render", "unknown step kind", "");
}

std::string program_source(const Dialect& d, const std::vector<const KernelCode*>& kernels) {
  std::string s = d.preamble;
  s += kHelpers;
  for (const KernelCode* k : kernels) s += "\n" + k->source;
  return s;
}

}  // namespace tessera::render
