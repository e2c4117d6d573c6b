#include "backends/cpu/jit_x86.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__linux__)
#if !__has_include(<xbyak/xbyak.h>)
#error "the CPU backend's native loops are assembled with Xbyak: install libxbyak-dev (scripts/run does)"
#endif
#include <xbyak/xbyak.h>

#include "backends/cpu/loop_dump.h"
#include "backends/cpu/reg_alloc.h"
#include "backends/cpu/vmath.h"
#include "core/fail.h"
#define TESSERA_JIT_X86 1
#endif

namespace tessera::backends::jit {

using kir::Code;
using kir::Instr;

#if TESSERA_JIT_X86

namespace {

// Float32 and int32 values (int32 through loads, constants, comparisons and where: raw lanes);
// comparisons' bool lanes (all-ones / all-zero lane masks) read by where and by each other's
// max and min (or, and); results float32 or int32.
bool supported(const std::vector<Instr>& prog, const std::vector<int>& results) {
  auto dt = [&](int o) { return prog[size_t(o)].dtype; };
  auto lanes32 = [](DType t) { return t == DType::Float32 || t == DType::Int32; };
  for (const Instr& I : prog) {
    switch (I.code) {
      case Code::Load: case Code::Const:
        if (!lanes32(I.dtype)) return false;
        break;
      case Code::Eq: case Code::Gt: case Code::Lt:
        if (dt(I.a) == DType::Int32 && dt(I.b) == DType::Int32) break;
        [[fallthrough]];
      case Code::Ne: case Code::Le: case Code::Ge:
        if (dt(I.a) != DType::Float32 || dt(I.b) != DType::Float32) return false;
        break;
      case Code::Where:
        if (!lanes32(I.dtype) || dt(I.a) != DType::Bool || dt(I.b) != I.dtype || dt(I.c) != I.dtype) return false;
        break;
      case Code::Cast:  // a float32 value rounded to bfloat16 (held as float32 lanes), and back
        if (!((I.dtype == DType::BFloat16 && dt(I.a) == DType::Float32) || (I.dtype == DType::Float32 && dt(I.a) == DType::BFloat16)))
          return false;
        break;
      case Code::Exp: case Code::Erf:
#if defined(__FMA__)
        if (I.dtype != DType::Float32 || dt(I.a) != DType::Float32) return false;
        break;
#else
        return false;  // vmath's polynomials round twice per step without FMA: the interpreter runs them
#endif
      case Code::Max: case Code::Min:
        if (I.dtype == DType::Bool && dt(I.a) == DType::Bool && dt(I.b) == DType::Bool) break;
        [[fallthrough]];
      case Code::Neg: case Code::Abs: case Code::Sqrt: case Code::Floor: case Code::Ceil: case Code::Round:
      case Code::Add: case Code::Sub: case Code::Mul: case Code::Div:
        if (I.dtype != DType::Float32 || dt(I.a) != DType::Float32 || (I.b >= 0 && dt(I.b) != DType::Float32)) return false;
        break;
      default: return false;
    }
  }
  for (int r : results)
    if (!lanes32(dt(r))) return false;
  return true;
}

// Vector registers: ymm0-15 (AVX2), zmm0-31 (AVX-512).
constexpr int kVectorRegs = 16, kVectorRegs512 = 32;

// Each instruction's operands as the AVX forms take them: `v` always a register (the VEX.vvvv
// operand), `m` a register or a constant in memory (the ModRM.rm operand); -1: none.
struct Operands { int v = -1, m = -1; };

}  // namespace

// The loop of one Spec: its registers planned, then its code emitted.
//
// General-purpose registers: rdi holds the argument array (the pointers, the row count, the
// pointers' steps: Loop::operator()), rsi the run's length (in bytes once the loop starts), rax
// the byte offset of the current W positions (W = 8 or 16), r11 is scratch; pointers live in the others (the
// callee-saved rbx, rbp, r12-r15 pushed and popped) and past those in the array, loaded where used.
//
// Vector registers: constants read other than through ModRM.rm (or stored), broadcast loads, the
// lane offsets of each stride gathered, two temporaries where an op needs them (a gather's lane
// mask, max/min's and abs's intermediate values) and the tail's lane mask (AVX2; AVX-512's is
// opmask k1, its comparisons' results pass through k2, a gather's mask is k3) are pinned for the
// whole call; then the values, by last use (reg_alloc.h). Other constants, and the masks the ops
// need, are read from memory after the code (W copies each): a value's register -2 - i is
// memory[i].
//
// A Loop keeps its Emitter, which owns the code's pages; the Spec is read only while emitting.
class Emitter : public Xbyak::CodeGenerator {
 public:
  // z: AVX-512 (16 lanes in zmm0-31, the tail and the comparisons in opmask registers), else
  // AVX2 (8 lanes in ymm0-15).
  // hoist: values the same at every position of a row computed once per row (plan_invariant).
  explicit Emitter(bool z, bool hoist = true)
      : CodeGenerator(4096, Xbyak::AutoGrow), z_(z), hoist_(hoist), W_(z ? 16 : 8), VB_(4 * W_), nregs_(z ? kVectorRegs512 : kVectorRegs) {
    for (int r = 0; r < nregs_; ++r) vr_.emplace_back(r, z ? Xbyak::Operand::ZMM : Xbyak::Operand::YMM, z ? 512 : 256);
  }

  // Plans and emits the loop of spec; false when it needs more vector registers than there are.
  bool emit(const Spec& spec) {
    spec_ = &spec;
    n_ = int(prog().size());
    bool ok = false;
    plan_pointers();
    plan_invariant();
    if (plan_pinned() && plan_values()) {
      plan_hoisted();
      prologue();
      rows();
      data();
      readyRE();
      ok = true;
    }
    spec_ = nullptr;
    return ok;
  }
  const std::vector<int>& loads() const { return loads_; }
  int hoisted() const { return int(hoisted_.size()); }
  int invariants() const { return int(std::count(inv_.begin(), inv_.end(), uint8_t(1))); }

 private:
  const std::vector<Instr>& prog() const { return *spec_->prog; }
  const std::vector<int>& results() const { return spec_->results; }

  // ---- The plan ----

  int64_t stride(int k) const { return prog()[size_t(k)].code == Code::Load ? spec_->stride[size_t(k)] : int64_t(1); }
  // Whether load k walks the run evenly (always, over one dim); then it is broadcast (stride 0),
  // dense (1) or gathered at a stride; else gathered at a two-dim pattern (Spec::inner).
  bool even(int k) const {
    return spec_->inner == 0 || prog()[size_t(k)].code != Code::Load || spec_->stride2[size_t(k)] == spec_->inner * stride(k);
  }
  bool broadcast(int k) const { return even(k) && stride(k) == 0; }
  bool gathered(int k) const { return prog()[size_t(k)].code == Code::Load && !(even(k) && stride(k) <= 1); }
  // A gathered load's lane offsets (elements, from the current W positions' first; W = 8 or
  // 16 lanes) and how far the W positions' first element moves per W positions.
  struct Gather {
    int64_t adv;
    int32_t lane[16];
    bool operator==(const Gather& o) const { return adv == o.adv && std::equal(lane, lane + 16, o.lane); }
  };
  bool halves_at_stride_2(const Gather& g) const {
    if (z_) return false;
    for (int i = 0; i < 4; ++i)
      if (g.lane[i] != 2 * i || g.lane[4 + i] != g.lane[4] + 2 * i) return false;
    return g.lane[4] >= 0;
  }
  Gather gather_of(int k) const {
    Gather g{};
    const int64_t s = stride(k);
    if (even(k)) {
      g.adv = W_ * s;
      for (int i = 0; i < W_; ++i) g.lane[i] = int32_t(i * s);
      return g;
    }
    const int64_t in = spec_->inner, s2 = spec_->stride2[size_t(k)];
    g.adv = W_ / in * s2;
    for (int i = 0; i < W_; ++i) g.lane[i] = int32_t(i % in * s + i / in * s2);
    return g;
  }
  bool is_const(int o) const { return o >= 0 && prog()[size_t(o)].code == Code::Const; }

  // Add, mul, == and != put a constant operand in ModRM.rm; int32 < is vpcmpgtd with its operands
  // swapped; where takes its condition as a register (the is4 byte), its false value in vvvv.
  Operands operands(int k) const {
    const Instr& I = prog()[size_t(k)];
    const bool swap = (I.code == Code::Add || I.code == Code::Mul || I.code == Code::Eq || I.code == Code::Ne) &&
                      is_const(I.a) && !is_const(I.b);
    const bool int_lt = I.code == Code::Lt && prog()[size_t(I.a)].dtype == DType::Int32;
    switch (I.code) {
      case Code::Load: case Code::Const: return Operands{};
      case Code::Neg: case Code::Abs: case Code::Exp: case Code::Erf: case Code::Cast: return Operands{I.a, -1};
      case Code::Sqrt: case Code::Floor: case Code::Ceil: case Code::Round: return Operands{-1, I.a};
      case Code::Where: return Operands{I.c, I.b};
      default: return swap || int_lt ? Operands{I.b, I.a} : Operands{I.a, I.b};
    }
  }

  // Pointer-array entries: the loads in program order, then the results; the first 11 that are
  // not broadcast get a general register.
  void plan_pointers() {
    ptr_of_.assign(size_t(n_), -1);
    for (int k = 0; k < n_; ++k)
      if (prog()[size_t(k)].code == Code::Load) ptr_of_[size_t(k)] = int(loads_.size()), loads_.push_back(k);
    nptr_ = int(loads_.size() + results().size());
    const Xbyak::Reg64 regs[] = {rdx, rcx, r8, r9, r10, rbx, rbp, r12, r13, r14, r15};
    ptr_reg_.assign(size_t(nptr_), Xbyak::Reg64());
    has_reg_.assign(size_t(nptr_), 0);
    size_t r = 0;
    for (int p = 0; p < nptr_ && r < std::size(regs); ++p)
      if (p >= int(loads_.size()) || !broadcast(loads_[size_t(p)])) ptr_reg_[size_t(p)] = regs[r++], has_reg_[size_t(p)] = 1;
  }

  // Ops whose operands are all the same at every position of a row (constants, broadcast loads,
  // such ops: a layer norm's 1 / sqrt(var + eps) from its row sums, or its backward's scales):
  // computed once per row into a pinned register, before the row's positions, rather than once
  // per W positions (a vdivps or vsqrtps per vector cost more than the row's loads). The same
  // operations on the same values, so the same bits.
  void plan_invariant() {
    inv_.assign(size_t(n_), 0);
    if (!hoist_) return;
    std::vector<uint8_t> uniform(size_t(n_), 0);
    for (int k = 0; k < n_; ++k) {
      const Instr& I = prog()[size_t(k)];
      if (I.code == Code::Const || (I.code == Code::Load && broadcast(k))) {
        uniform[size_t(k)] = 1;
        continue;
      }
      if (I.code == Code::Load) continue;
      bool u = true;
      for (int o : {I.a, I.b, I.c})
        if (o >= 0) u = u && uniform[size_t(o)];
      uniform[size_t(k)] = inv_[size_t(k)] = u;
    }
  }

  // Constants (into pool registers or memory), the ops' masks, broadcasts, gather lane offsets,
  // temporaries and the tail mask; false when they leave no vector register.
  bool plan_pinned() {
    reg_.assign(size_t(n_), -1);
    pinned_.assign(size_t(n_), 0);
    std::vector<uint8_t> in_reg(size_t(n_), 0);
    for (int k = 0; k < n_; ++k) {
      const Instr& I = prog()[size_t(k)];
      if (I.code == Code::Where) in_reg[size_t(I.a)] = 1;
      if (const int v = operands(k).v; v >= 0) in_reg[size_t(v)] = 1;
    }
    for (int r : results()) in_reg[size_t(r)] = 1;
    bool need_sign = false, need_zero = false, need_nan = false;
    for (int k = 0; k < n_; ++k) {
      const Instr& I = prog()[size_t(k)];
      if (I.code == Code::Const) {
        const uint32_t bits = I.dtype == DType::Int32 ? uint32_t(int32_t(I.value)) : std::bit_cast<uint32_t>(float(I.value));
        reg_[size_t(k)] = in_reg[size_t(k)] ? add_to(pool_, bits) : in_memory(bits);
        pinned_[size_t(k)] = 1;
      }
      need_sign |= I.code == Code::Neg || I.code == Code::Abs;
      need_zero |= I.code == Code::Abs;
      need_nan |= (I.code == Code::Max || I.code == Code::Min) && I.dtype == DType::Float32;
    }
    const bool need_exp = std::any_of(prog().begin(), prog().end(), [](const Instr& I) { return I.code == Code::Exp; });
    const bool need_erf = std::any_of(prog().begin(), prog().end(), [](const Instr& I) { return I.code == Code::Erf; });
    const bool need_round = std::any_of(prog().begin(), prog().end(), [](const Instr& I) {
      return I.code == Code::Cast && I.dtype == DType::BFloat16;
    });
    if (need_exp || need_erf) plan_math();
    if (need_round) {
      mc_.lsb = in_memory(1u), mc_.half = in_memory(0x7fffu), mc_.quiet = in_memory(0x400000u), mc_.top = in_memory(0xffff0000u);
    }
    need_sign |= need_erf;
    if (need_sign) m_sign_ = in_memory(std::bit_cast<uint32_t>(-0.0f));
    if (need_zero) m_zero_ = in_memory(std::bit_cast<uint32_t>(0.0f));
    if (need_nan) m_nan_ = in_memory(std::bit_cast<uint32_t>(__builtin_nanf("")));  // the default NaN, as quiet_NaN()
    next_ = int(pool_.size());
    for (int k = 0; k < n_; ++k)
      if (broadcast(k)) reg_[size_t(k)] = next_++, pinned_[size_t(k)] = 1;
    for (int k = 0; k < n_; ++k)
      if (inv_[size_t(k)]) reg_[size_t(k)] = next_++, pinned_[size_t(k)] = 1;
    if (spec_->inner && (W_ % spec_->inner != 0 || spec_->out_stride != 1)) return false;
    for (int k = 0; k < n_; ++k) {
      if (!gathered(k)) continue;
      const int64_t s = stride(k), s2 = spec_->inner ? spec_->stride2[size_t(k)] : 0;
      if (s < 0 || s >= (int64_t(1) << 24) || s2 < 0 || s2 >= (int64_t(1) << 24)) return false;
      const Gather g = gather_of(k);
      if (std::find(gathers_.begin(), gathers_.end(), g) == gathers_.end()) gathers_.push_back(g), lanes_.push_back(next_++);
    }
    const int64_t os = spec_->out_stride;
    if (os < 1 || os >= (int64_t(1) << 24) || (os > 1 && spec_->stream)) return false;
    const bool need_temps = need_zero || need_nan;
    t0_ = need_temps || !gathers_.empty() || os > 1 ? next_++ : -1;
    t1_ = need_temps ? next_++ : -1;
    for (int i = 0, n = need_erf ? 5 : need_exp ? 3 : need_round ? 2 : 0; i < n; ++i) math_t_.push_back(next_++);
    mask_ = z_ ? -1 : next_++;  // AVX-512: the tail's mask in k1
    for (size_t i = 0; i < memory_.size(); ++i) memory_at_.push_back(ptr[rip + memory_label_ + int(VB_ * i)]);
    return next_ < nregs_;
  }

  // The values' registers, above the pinned ones, each reused after its last reader (a result
  // stored early: after its own instruction; else after the iteration).
  bool plan_values() {
    std::vector<int> last = cpu::last_readers(prog());
    for (size_t j = 0; j < results().size(); ++j)
      last[size_t(results()[j])] = spec_->early[j] ? std::max(last[size_t(results()[j])], results()[j]) : n_;
    std::vector<uint8_t> own(pinned_.size());
    for (size_t k = 0; k < own.size(); ++k) own[k] = !pinned_[k];
    used_ = cpu::assign_registers(prog(), own, std::move(last), next_, nregs_ - next_, reg_);
    return used_ >= 0;
  }

  // Memory constants moved into the vector registers the values leave free, the most read first
  // (each loaded once per call instead of once per W positions: exp's and erf's ~30 constants
  // were ~30 vector loads per iteration). Only where an operand is read from changes, so the
  // bits are the same.
  void plan_hoisted() {
    std::vector<int> uses(memory_.size(), 0);
    auto use = [&](int m, int n = 1) {
      if (m <= -2) uses[size_t(-2 - m)] += n;
    };
    for (int k = 0; k < n_; ++k) {
      const Instr& I = prog()[size_t(k)];
      if (const int m = operands(k).m; m >= 0) use(reg_[size_t(m)]);
      switch (I.code) {
        case Code::Neg: use(m_sign_); break;
        case Code::Abs: use(m_zero_), use(m_sign_); break;
        case Code::Max: case Code::Min:
          if (I.dtype == DType::Float32) use(m_nan_);
          break;
        case Code::Exp:
          use(mc_.lo), use(mc_.hi), use(mc_.bias, 2);
          [[fallthrough]];
        case Code::Erf:
          use(mc_.shift, 3), use(mc_.log2e), use(mc_.ln2_hi), use(mc_.ln2_lo);
          for (int p : mc_.p) use(p);
          if (I.code == Code::Exp) break;
          use(mc_.bias), use(mc_.abs, 2), use(mc_.one, 2), use(mc_.four), use(mc_.mid), use(m_sign_);
          for (int q : mc_.q) use(q);
          for (int h : mc_.h) use(h);
          break;
        case Code::Cast:
          if (I.dtype == DType::BFloat16) use(mc_.lsb), use(mc_.half), use(mc_.quiet), use(mc_.top);
          break;
        default: break;
      }
    }
    std::vector<int> order;
    for (size_t i = 0; i < uses.size(); ++i)
      if (uses[i] > 0) order.push_back(int(i));
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return uses[size_t(a)] > uses[size_t(b)]; });
    int free = next_ + used_;
    for (int i : order) {
      if (free >= nregs_) break;
      hoisted_.emplace_back(i, free);
      memory_reg_.resize(memory_.size(), -1);
      memory_reg_[size_t(i)] = free++;
    }
  }

  // The constants of exp and erf in memory (vmath.h's, so that the loops compute its bits).
  void plan_math() {
    namespace vd = vmath::detail;
    auto f = [&](float v) { return in_memory(std::bit_cast<uint32_t>(v)); };
    mc_.lo = f(-104.0f), mc_.hi = f(89.0f), mc_.shift = f(vd::kShift), mc_.log2e = f(vd::kLog2e);
    mc_.ln2_hi = f(-vd::kLn2Hi), mc_.ln2_lo = f(-vd::kLn2Lo), mc_.bias = in_memory(127u);
    for (int i = 0; i < 5; ++i) mc_.p[i] = f(vd::kExpP[i]);
    mc_.abs = in_memory(0x7fffffffu), mc_.one = f(1.0f), mc_.four = f(4.0f), mc_.mid = f(2.5f);
    for (int i = 0; i < 7; ++i) mc_.q[i] = f(vd::kErfQ[i]);
    for (int i = 0; i < 8; ++i) mc_.h[i] = f(vd::kErfH[i]);
  }

  static int add_to(std::vector<uint32_t>& to, uint32_t v) {
    for (size_t i = 0; i < to.size(); ++i)
      if (to[i] == v) return int(i);
    to.push_back(v);
    return int(to.size()) - 1;
  }
  int in_memory(uint32_t bits) { return -2 - add_to(memory_, bits); }

  // ---- Operands ----

  const Xbyak::Xmm& vec(int r) const { return vr_[size_t(r)]; }
  // A ModRM.rm operand: a vector register, or memory[-2 - m].
  const Xbyak::Operand& rm(int m) const {
    if (m >= 0) return vr_[size_t(m)];
    if (size_t(-2 - m) < memory_reg_.size() && memory_reg_[size_t(-2 - m)] >= 0) return vr_[size_t(memory_reg_[size_t(-2 - m)])];
    return memory_at_[size_t(-2 - m)];
  }
  // The register holding pointer entry p, loaded into r11 if not resident.
  Xbyak::Reg64 base(int p) {
    if (has_reg_[size_t(p)]) return ptr_reg_[size_t(p)];
    mov(r11, ptr[rdi + 8 * p]);
    return r11;
  }
  // r11 = pointer entry p + st * rax: the address of a strided run's current W positions.
  void at_stride(int p, int64_t st) {
    imul(r11, rax, int(st));
    if (has_reg_[size_t(p)]) add(r11, ptr_reg_[size_t(p)]);
    else add(r11, ptr[rdi + 8 * p]);
  }
  // r11 = pointer entry p + the bytes of adv elements per W positions so far (rax / 4W of them):
  // rax * adv / W, exact since rax is a multiple of 4W.
  void at_advance(int p, int64_t adv) {
    if (adv % W_ == 0) return at_stride(p, adv / W_);
    imul(r11, rax, int(adv));
    sar(r11, z_ ? 4 : 3);
    if (has_reg_[size_t(p)]) add(r11, ptr_reg_[size_t(p)]);
    else add(r11, ptr[rdi + 8 * p]);
  }

  // ---- The code ----

  std::vector<Xbyak::Reg64> saved() const {  // the callee-saved registers holding pointers
    std::vector<Xbyak::Reg64> s;
    for (int p = 0; p < nptr_; ++p) {
      const Xbyak::Reg64& r = ptr_reg_[size_t(p)];
      if (has_reg_[size_t(p)] && (r == rbx || r == rbp || r.getIdx() >= 12)) s.push_back(r);
    }
    return s;
  }

  // Pinned vectors and resident pointers loaded; the run's length in bytes.
  void prologue() {
    for (const Xbyak::Reg64& r : saved()) push(r);
    for (size_t r = 0; r < pool_.size(); ++r) vbroadcastss(vec(int(r)), ptr[rip + pool_label_ + int(4 * r)]);
    for (size_t g = 0; g < gathers_.size(); ++g) vmovups(vec(lanes_[g]), ptr[rip + lanes_label_ + int(VB_ * g)]);
    for (auto [i, r] : hoisted_) vmovups(vec(r), memory_at_[size_t(i)]);
    for (int p = 0; p < nptr_; ++p)
      if (has_reg_[size_t(p)]) mov(ptr_reg_[size_t(p)], ptr[rdi + 8 * p]);
    shl(rsi, 2);
  }

  // Each row: broadcast loads read afresh, the run W positions at a time, its last 1 to W - 1
  // positions under a lane mask (AVX-512: opmask k1), then every pointer moved by its step.
  void rows() {
    Xbyak::Label row_top, top, check, done;
    L(row_top);
    for (int k = 0; k < n_; ++k)
      if (broadcast(k)) mov(r11, ptr[rdi + 8 * ptr_of_[size_t(k)]]), vbroadcastss(vec(reg_[size_t(k)]), ptr[r11]);
    for (int k = 0; k < n_; ++k)
      if (inv_[size_t(k)]) instruction(k, false);
    xor_(eax, eax);
    jmp(check, T_NEAR);
    L(top);
    body(false);
    add(rax, VB_);
    L(check);
    lea(r11, ptr[rax + VB_]);
    cmp(r11, rsi);
    jbe(top, T_NEAR);
    cmp(rax, rsi);
    jae(done, T_NEAR);
    if (z_) {
      // k1 = 2^r - 1, r = (rsi - rax) / 4 lanes: the low word of the table's dword r.
      lea(r11, ptr[rip + table_label_]);
      add(r11, rsi);
      sub(r11, rax);
      kmovw(k1, ptr[r11]);
    } else {
      // The tail's mask: 8 dwords of the table read from 32 - 4r bytes in, r = (rsi - rax) / 4 set lanes.
      lea(r11, ptr[rip + table_label_ + 32]);
      sub(r11, rsi);
      add(r11, rax);
      vmovups(vec(mask_), ptr[r11]);
    }
    body(true);
    L(done);
    for (int p = 0; p < nptr_; ++p) {
      const int step = 8 * (nptr_ + 1 + p);
      if (has_reg_[size_t(p)]) {
        add(ptr_reg_[size_t(p)], ptr[rdi + step]);
      } else {
        mov(r11, ptr[rdi + step]);
        add(ptr[rdi + 8 * p], r11);
      }
    }
    dec(qword[rdi + 8 * nptr_]);
    jnz(row_top, T_NEAR);
    if (spec_->stream) sfence();
    vzeroupper();
    const std::vector<Xbyak::Reg64> s = saved();
    for (auto it = s.rbegin(); it != s.rend(); ++it) pop(*it);
    ret();
  }

  // The program over W positions (masked: the tail's); each result stored as soon as it is
  // computed when early, else after every load of the iteration.
  void body(bool masked) {
    for (int k = 0; k < n_; ++k) {
      if (!inv_[size_t(k)]) instruction(k, masked);
      for (size_t j = 0; j < results().size(); ++j)
        if (spec_->early[j] && results()[j] == k) store(j, masked);
    }
    for (size_t j = 0; j < results().size(); ++j)
      if (!spec_->early[j]) store(j, masked);
  }

  void instruction(int k, bool masked) {
    const Instr& I = prog()[size_t(k)];
    const Xbyak::Xmm& d = vec(reg_[size_t(k)] >= 0 ? reg_[size_t(k)] : 0);
    const Operands o = operands(k);
    const Xbyak::Xmm& x = vec(o.v >= 0 ? reg_[size_t(o.v)] : 0);
    const Xbyak::Operand& y = rm(o.m >= 0 ? reg_[size_t(o.m)] : 0);
    const bool int_lanes = I.a >= 0 && prog()[size_t(I.a)].dtype == DType::Int32;
    switch (I.code) {
      case Code::Load: load(k, masked); break;
      case Code::Const: break;
      case Code::Add: vaddps(d, x, y); break;
      case Code::Mul: vmulps(d, x, y); break;
      case Code::Sub: vsubps(d, x, y); break;
      case Code::Div: vdivps(d, x, y); break;
      case Code::Max: case Code::Min:
        if (I.dtype == DType::Bool) {  // lane masks: or, and
          I.code == Code::Max ? vor(d, x, y) : vand(d, x, y);
          break;
        }
        // (x > y ? x : y) or (x < y ? x : y) as vmaxps / vminps compute them; a NaN on either
        // side gives the default NaN, as the interpreter's nan_max / nan_min.
        if (z_) {
          vcmpps(k2, x, y, 3);  // unordered(x, y)
          I.code == Code::Max ? vmaxps(d, x, y) : vminps(d, x, y);
          vmovaps(d | k2, rm(m_nan_));
          break;
        }
        vcmpps(vec(t0_), x, y, 3);  // unordered(x, y)
        I.code == Code::Max ? vmaxps(vec(t1_), x, y) : vminps(vec(t1_), x, y);
        vblendvps(d, vec(t1_), rm(m_nan_), vec(t0_));
        break;
      case Code::Neg: vxor(d, x, rm(m_sign_)); break;
      case Code::Abs:  // x < 0 ? -x : x (a NaN and -0 stay as they are, as in the interpreter)
        if (z_) {
          vcmpps(k2, x, rm(m_zero_), 1);  // x < 0
          if (d.getIdx() != x.getIdx()) vmovaps(d, x);
          vpxord(d | k2, x, rm(m_sign_));  // -x there
          break;
        }
        vcmpps(vec(t0_), x, rm(m_zero_), 1);  // x < 0
        vxorps(vec(t1_), x, rm(m_sign_));      // -x
        vblendvps(d, x, vec(t1_), vec(t0_));
        break;
      case Code::Sqrt: vsqrtps(d, y); break;
      case Code::Exp: emit_exp(d, x); break;
      case Code::Cast:
        if (I.dtype == DType::BFloat16) emit_round_bf16(d, x);
        else if (d.getIdx() != x.getIdx()) vmovaps(d, x);  // bfloat16 lanes are float32 already
        break;
      case Code::Erf: emit_erf(d, x); break;
      case Code::Eq: case Code::Ne: case Code::Lt: case Code::Le: case Code::Gt: case Code::Ge: compare(I.code, int_lanes, d, x, y); break;
      case Code::Where:  // c ? m : v as a blend on the condition's lane mask (float or int lanes)
        if (z_) {
          vpmovd2m(k2, vec(reg_[size_t(I.a)]));
          vblendmps(d | k2, x, y);
          break;
        }
        vblendvps(d, x, y, vec(reg_[size_t(I.a)]));
        break;
      case Code::Floor: case Code::Ceil: case Code::Round: {
        // 8 suppresses the inexact exception; round is to nearest even, as nearbyint (vrndscaleps
        // with scale 0: the same rounding as vroundps)
        const uint8_t mode = uint8_t(8 | (I.code == Code::Floor ? 1 : I.code == Code::Ceil ? 2 : 0));
        z_ ? vrndscaleps(d, y, mode) : vroundps(d, y, mode);
        break;
      }
      default: break;
    }
  }

  // A comparison's lane mask (all-ones or zero lanes) into d; AVX-512 compares into k2 and
  // spreads it into d's lanes.
  void compare(Code c, bool int_lanes, const Xbyak::Xmm& d, const Xbyak::Xmm& x, const Xbyak::Operand& y) {
    // vcmpps with C++'s predicates: ordered for ==, <, <=, >, >=; unordered for !=
    const uint8_t pred = c == Code::Eq ? 0x00 : c == Code::Ne ? 0x04 : c == Code::Lt ? 0x01 : c == Code::Le ? 0x02
                         : c == Code::Gt ? 0x0E : 0x0D;
    if (int_lanes) {  // ==, and > (< with its operands swapped)
      if (z_) {
        c == Code::Eq ? vpcmpeqd(k2, x, y) : vpcmpgtd(k2, x, y);
        vpmovm2d(d, k2);
        return;
      }
      c == Code::Eq ? vpcmpeqd(d, x, y) : vpcmpgtd(d, x, y);
      return;
    }
    if (z_) {
      vcmpps(k2, x, y, pred);
      vpmovm2d(d, k2);
      return;
    }
    vcmpps(d, x, y, pred);
  }

  // Bitwise ops on float32 lanes: AVX-512F's integer forms (vandps & co. on zmm are AVX512DQ's).
  void vand(const Xbyak::Xmm& d, const Xbyak::Xmm& x, const Xbyak::Operand& y) { z_ ? vpandd(d, x, y) : vandps(d, x, y); }
  void vor(const Xbyak::Xmm& d, const Xbyak::Xmm& x, const Xbyak::Operand& y) { z_ ? vpord(d, x, y) : vorps(d, x, y); }
  void vxor(const Xbyak::Xmm& d, const Xbyak::Xmm& x, const Xbyak::Operand& y) { z_ ? vpxord(d, x, y) : vxorps(d, x, y); }

  // ---- exp and erf: vmath.h's exp1 and erf1, operation for operation (FMA as std::fma) ----

  // t = x log2e + shift; k (int lanes, into kreg) = bits(t) - bits(shift); x -= kf ln2 (hi, lo):
  // vmath's exp_reduce on r (in place), using kf.
  void exp_reduce(const Xbyak::Xmm& r, const Xbyak::Xmm& kreg, const Xbyak::Xmm& kf) {
    vmovaps(kreg, rm(mc_.shift));
    vfmadd231ps(kreg, r, rm(mc_.log2e));  // t
    vsubps(kf, kreg, rm(mc_.shift));       // kf = t - shift
    vpsubd(kreg, kreg, rm(mc_.shift));     // k
    vfmadd231ps(r, kf, rm(mc_.ln2_hi));
    vfmadd231ps(r, kf, rm(mc_.ln2_lo));
  }
  // y = expm1_poly(r) + ... : into y, p a temporary: p = P(r) (Horner), y = r^2 p + r.
  void expm1_poly(const Xbyak::Xmm& y, const Xbyak::Xmm& r, const Xbyak::Xmm& p) {
    vmovaps(p, rm(mc_.p[0]));
    for (int i = 1; i < 5; ++i) vfmadd213ps(p, r, rm(mc_.p[i]));
    vmulps(y, r, r);
    vfmadd213ps(y, p, r);
  }
  // 2^k as a float from int lanes k, in place.
  void pow2(const Xbyak::Xmm& k) {
    vpaddd(k, k, rm(mc_.bias));
    vpslld(k, k, 23);
  }

  // exp1: clamp to [-104, 89] (NaN passes: vmaxps/vminps return their second operand then),
  // reduce, the polynomial, then 2^k as 2^k1 2^k2.
  void emit_exp(const Xbyak::Xmm& d, const Xbyak::Xmm& x) {
    const Xbyak::Xmm &a = vec(math_t_[0]), &b = vec(math_t_[1]), &c = vec(math_t_[2]);
    vmovaps(a, rm(mc_.lo));
    vmaxps(a, a, x);  // x < -104 ? -104 : x
    vmovaps(b, rm(mc_.hi));
    vminps(a, b, a);  // x > 89 ? 89 : x
    exp_reduce(a, b, c);   // a = r, b = k
    expm1_poly(d, a, c);   // d = y (d may be x's register: x is read)
    vpsrad(c, b, 1);       // k1 = k >> 1
    vpsubd(b, b, c);       // k2 = k - k1
    pow2(c);
    pow2(b);
    vfmadd213ps(d, c, c);  // y s1 + s1
    vmulps(d, d, b);       // * s2
  }

  // erf1: x + x Q(x^2) below 1, 1 - e^(-x^2 + H(x - 2.5)) from 1 (|x| clamped at 4), x's sign.
  // x is read to the end (its sign), d written last.
  void emit_erf(const Xbyak::Xmm& d, const Xbyak::Xmm& x) {
    const Xbyak::Xmm &a = vec(math_t_[0]), &b = vec(math_t_[1]), &c = vec(math_t_[2]), &e = vec(math_t_[3]),
                     &f = vec(math_t_[4]);
    vand(a, x, rm(mc_.abs));    // ax
    vmulps(b, a, a);            // z
    vmovaps(c, rm(mc_.q[0]));
    for (int i = 1; i < 7; ++i) vfmadd213ps(c, b, rm(mc_.q[i]));
    vfmadd213ps(c, a, a);       // small = ax q + ax
    vmovaps(b, rm(mc_.four));
    vminps(a, b, a);            // xl = ax > 4 ? 4 : ax
    vsubps(b, a, rm(mc_.mid));  // u = xl - 2.5
    vmovaps(e, rm(mc_.h[0]));
    for (int i = 1; i < 8; ++i) vfmadd213ps(e, b, rm(mc_.h[i]));
    vfnmadd231ps(e, a, a);      // -xl xl + h
    exp_reduce(e, a, b);        // e = r, a = k  (exp_normal: no clamp, 2^k in one factor)
    expm1_poly(f, e, b);        // f = y
    pow2(a);
    vfmadd213ps(f, a, a);       // e^(...) = y s + s
    vmovaps(a, rm(mc_.one));
    vsubps(a, a, f);            // large = 1 - e^(...)
    vand(b, x, rm(mc_.abs));
    if (z_) {
      vcmpps(k2, b, rm(mc_.one), 1);  // ax < 1
      vmovaps(a | k2, c);             // ax < 1 ? small : large
    } else {
      vcmpps(b, b, rm(mc_.one), 1);  // ax < 1
      vblendvps(a, a, c, b);         // ax < 1 ? small : large
    }
    vand(b, x, rm(m_sign_));
    vor(d, a, b);               // with x's sign
  }

  // A float32 value rounded to bfloat16, kept in float32 lanes (low 16 bits clear): half.h's
  // float_to_bf16 then bf16_to_float, to nearest even, a NaN quieted. x is read to the end.
  void emit_round_bf16(const Xbyak::Xmm& d, const Xbyak::Xmm& x) {
    const Xbyak::Xmm &a = vec(math_t_[0]), &b = vec(math_t_[1]);
    if (z_) {  // the same with the NaN lanes in k2
      vcmpps(k2, x, x, 3);
      vpsrld(a, x, 16);
      vpandd(a, a, rm(mc_.lsb));
      vpaddd(a, a, rm(mc_.half));
      vpaddd(a, a, x);
      vmovaps(a | k2, x);
      vpord(a | k2, a, rm(mc_.quiet));
      vpandd(d, a, rm(mc_.top));
      return;
    }
    vcmpps(b, x, x, 3);          // NaN lanes
    vpsrld(a, x, 16);
    vpand(a, a, rm(mc_.lsb));
    vpaddd(a, a, rm(mc_.half));
    vpaddd(a, a, x);             // u + 0x7fff + the kept part's lowest bit
    vblendvps(a, a, x, b);       // NaN: u itself,
    vandps(b, b, rm(mc_.quiet));
    vorps(a, a, b);              // quieted
    vandps(d, a, rm(mc_.top));
  }

  // Float32 and int32 lanes alike: dense (a vector, masked in the tail), gathered at a stride,
  // or broadcast (already in its register).
  void load(int k, bool masked) {
    if (broadcast(k)) return;
    const Xbyak::Xmm& d = vec(reg_[size_t(k)]);
    const int p = ptr_of_[size_t(k)];
    if (gathered(k)) {
      const Gather g = gather_of(k);
      const int lanes = lanes_[size_t(std::find(gathers_.begin(), gathers_.end(), g) - gathers_.begin())];
      at_advance(p, g.adv);
      if (!masked && halves_at_stride_2(g)) {
        // Lanes {0, 2, 4, 6, h, h + 2, h + 4, h + 6} (a 2x2 pooling tap: stride 2 along a row,
        // the upper half 8 elements on or the next row's): two loads of 7 elements (the 8th
        // is never needed and may lie past the buffer: masked off, read from the tail's mask
        // table), their even elements picked by vshufps and put in order by vpermpd. Fewer
        // micro-ops than a gather; the tail keeps the gather.
        vmovups(vec(t0_), ptr[rip + table_label_ + 4]);
        vmaskmovps(d, vec(t0_), ptr[r11]);
        vmaskmovps(vec(t0_), vec(t0_), ptr[r11 + int(4 * g.lane[4])]);
        vshufps(d, d, vec(t0_), 0x88);  // x0 x2 h0 h2 | x4 x6 h4 h6
        vpermpd(Xbyak::Ymm(d.getIdx()), Xbyak::Ymm(d.getIdx()), 0xD8);            // x0 x2 x4 x6 h0 h2 h4 h6
        return;
      }
      if (z_) {
        if (masked) kmovw(k3, k1);
        else kxnorw(k3, k3, k3);  // every lane
        vpxord(d, d, d);  // the gather merges into d: no wait for d's last writer
        vgatherdps(d | k3, ptr[r11 + vec(lanes) * 4]);  // clears k3
        return;
      }
      if (masked) vmovaps(vec(t0_), vec(mask_));
      else vpcmpeqd(vec(t0_), vec(t0_), vec(t0_));  // every lane
      vxorps(d, d, d);  // the gather merges into d: no wait for d's last writer
      vgatherdps(d, ptr[r11 + vec(lanes) * 4], vec(t0_));  // clears t0
      return;
    }
    if (masked && z_) vmovups(d | k1 | T_z, ptr[base(p) + rax]);  // masked-off lanes: zero, never read
    else if (masked) vmaskmovps(d, vec(mask_), ptr[base(p) + rax]);
    else vmovups(d, ptr[base(p) + rax]);
  }

  void store(size_t j, bool masked) {
    const Xbyak::Xmm& v = vec(reg_[size_t(results()[j])]);
    const int p = int(loads_.size() + j);
    if (spec_->out_stride > 1) return store_lanes(v, p, masked);
    const Xbyak::Reg64 b = base(p);
    if (masked && z_) vmovups(ptr[b + rax] | k1, v);
    else if (masked) vmaskmovps(ptr[b + rax], vec(mask_), v);
    else if (spec_->stream) vmovntps(ptr[b + rax], v);
    else vmovups(ptr[b + rax], v);
  }

  // Lane by lane at the output's stride (lanes past the first 4 through t0, 4 at a time); under
  // the tail's mask only lanes i with rax + 4i < rsi.
  void store_lanes(const Xbyak::Xmm& v, int p, bool masked) {
    const int64_t os = spec_->out_stride;
    Xbyak::Label end;
    for (int i = 0; i < W_; ++i) {
      if (masked && i > 0) {
        lea(r11, ptr[rax + 4 * i]);
        cmp(r11, rsi);
        jae(end, T_NEAR);
      }
      if (i == 0 || masked) at_stride(p, os);
      if (i == 4 && !z_) vextractf128(Xbyak::Xmm(t0_), Xbyak::Ymm(v.getIdx()), 1);
      if (i % 4 == 0 && i > 0 && z_) vextractf32x4(Xbyak::Xmm(t0_), Xbyak::Zmm(v.getIdx()), uint8_t(i / 4));
      vextractps(ptr[r11 + int(4 * os * i)], Xbyak::Xmm(i < 4 ? v.getIdx() : t0_), uint8_t(i & 3));
    }
    L(end);
  }

  // Vectors of 4W bytes (each memory value W times, the gathers' lane offsets), the pool's
  // values, then the lane masks: AVX2's table (8 set dwords, 8 clear); AVX-512's opmask words
  // 2^r - 1 for r = 0 to 15 set lanes, one per dword.
  void data() {
    align(VB_);
    L(memory_label_);
    for (uint32_t v : memory_)
      for (int i = 0; i < W_; ++i) dd(v);
    L(lanes_label_);
    for (const Gather& g : gathers_)
      for (int i = 0; i < W_; ++i) dd(uint32_t(g.lane[i]));
    L(pool_label_);
    for (uint32_t v : pool_) dd(v);
    L(table_label_);
    for (int i = 0; i < 16; ++i) dd(z_ ? (1u << i) - 1 : i < 8 ? 0xFFFFFFFFu : 0u);
  }

  const bool z_;                // AVX-512
  const bool hoist_;            // plan_invariant's hoisting (off: a retry when it leaves too few registers)
  std::vector<uint8_t> inv_;    // per instruction: computed once per row
  const int W_, VB_, nregs_;    // lanes, bytes and registers of a vector
  const Spec* spec_ = nullptr;  // while emitting
  int n_ = 0;                   // instructions
  std::vector<Xbyak::Xmm> vr_;
  // Pointers: per instruction its entry (loads), the loads in entry order, each entry's register.
  std::vector<int> ptr_of_, loads_;
  int nptr_ = 0;
  std::vector<Xbyak::Reg64> ptr_reg_;
  std::vector<uint8_t> has_reg_;
  // Vector registers per instruction (-2 - i: memory[i]); pinned values.
  std::vector<int> reg_;
  std::vector<uint8_t> pinned_;
  std::vector<uint32_t> pool_, memory_;  // pool_[r]: the lane bits pinned in register r
  std::vector<Xbyak::Address> memory_at_;
  std::vector<int> memory_reg_;                  // memory[i]'s register once hoisted (plan_hoisted), else -1
  std::vector<std::pair<int, int>> hoisted_;     // (memory index, register), loaded by the prologue
  int used_ = 0;                                 // registers the values take above next_
  int m_sign_ = 0, m_zero_ = 0, m_nan_ = 0;  // the ops' masks in memory
  std::vector<Gather> gathers_;  // the patterns gathered, each one's lane offsets in register lanes_[i]
  std::vector<int> lanes_;
  int t0_ = -1, t1_ = -1, mask_ = -1, next_ = 0;
  std::vector<int> math_t_;  // exp's (3), erf's (5) and the bfloat16 rounding's (2) temporaries
  struct MathConsts {        // memory operands of exp and erf (plan_math)
    int lo = 0, hi = 0, shift = 0, log2e = 0, ln2_hi = 0, ln2_lo = 0, bias = 0, abs = 0, one = 0, four = 0, mid = 0;
    int lsb = 0, half = 0, quiet = 0, top = 0;  // bfloat16 rounding
    int p[5] = {}, q[7] = {}, h[8] = {};
  } mc_;
  Xbyak::Label memory_label_, lanes_label_, pool_label_, table_label_;
};

Loop::~Loop() = default;

bool available() {
  static const bool ok = [] {
    const char* e = std::getenv("TESSERA_CPU_JIT");
    if (e && std::strcmp(e, "0") == 0) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return ok;
}

bool avx512() {
  static const bool cpu = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  }();
  const char* e = std::getenv("TESSERA_CPU_JIT");
  return cpu && !(e && std::strcmp(e, "avx2") == 0);
}

std::unique_ptr<Loop> build(const Spec& spec) {
  const std::vector<Instr>& prog = *spec.prog;
  if (!available() || prog.empty() || spec.results.empty() || !supported(prog, spec.results)) return nullptr;
  const bool z = avx512();
  std::unique_ptr<Emitter> code;
  try {
    code = std::make_unique<Emitter>(z);
    if (!code->emit(spec)) {  // the row's invariant values pinned left too few registers: computed per vector
      code = std::make_unique<Emitter>(z, false);
      if (!code->emit(spec)) return nullptr;
    }
    if (code->loads().size() + spec.results.size() > size_t(Loop::kMaxPtrs)) return nullptr;
  } catch (const Xbyak::Error& e) {
    // No memory for the code (or no executable pages): the interpreter runs the Step.
    if (int(e) == Xbyak::ERR_CANT_ALLOC || int(e) == Xbyak::ERR_CANT_PROTECT) return nullptr;
    fail("cpu", std::string("internal: assembling a native loop: ") + e.what(), "");
  }
  std::unique_ptr<Loop> loop(new Loop());
  loop->fn_ = code->getCode<void (*)(int64_t*, int64_t)>();
  loop->loads_ = code->loads();
  loop->results_ = spec.results.size();
  loop->stream_ = spec.stream;
  loop->lanes_ = z ? 16 : 8;
  loop->hoisted_ = code->hoisted();
  loop->invariants_ = code->invariants();
  dump_loop(code->getCode(), code->getSize(), spec);
  loop->code_ = std::move(code);
  return loop;
}

#else  // not x86-64 Linux: the interpreter runs everything

class Emitter {};
Loop::~Loop() = default;
bool available() { return false; }
bool avx512() { return false; }
std::unique_ptr<Loop> build(const Spec&) { return nullptr; }

#endif

}  // namespace tessera::backends::jit
