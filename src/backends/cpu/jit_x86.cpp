#include "backends/cpu/jit_x86.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__linux__)
#include <sys/mman.h>
#define TESSERA_JIT_X86 1
#endif

namespace tessera::backends::jit {

using kir::Code;
using kir::Instr;

#if TESSERA_JIT_X86

namespace {

// General-purpose registers (x86-64 numbering). rdi holds the argument array (the pointers, the
// row count, the pointers' steps: Loop::operator()), rsi the run's length, rax the byte offset
// of the current 8 positions, r11 is scratch; pointers live in the others (the callee-saved rbx,
// rbp, r12-r15 pushed and popped) and past those in the array, loaded where used.
enum Gpr : int { RAX = 0, RCX = 1, RDX = 2, RBX = 3, RBP = 5, RSI = 6, RDI = 7, R8 = 8, R9, R10, R11, R12, R13, R14, R15 };
constexpr int kPtrRegs[] = {RDX, RCX, R8, R9, R10, RBX, RBP, R12, R13, R14, R15};
constexpr int kResident = int(sizeof kPtrRegs / sizeof kPtrRegs[0]);
bool callee_saved(int r) { return r == RBX || r == RBP || r >= R12; }

// The few instructions the loops need, encoded by hand (VEX.256 forms, three-byte prefix).
struct Asm {
  std::vector<uint8_t> b;
  void byte(int x) { b.push_back(uint8_t(x)); }
  void bytes(std::initializer_list<int> xs) { for (int x : xs) byte(x); }
  void u32(uint32_t x) { for (int i = 0; i < 4; ++i) byte(int(x >> (8 * i)) & 0xff); }
  // map: 1 = 0F, 2 = 0F38, 3 = 0F3A; pp: 0 = none, 1 = 66. reg/vvvv/base are register numbers.
  void vex(int map, int pp, int reg, int vvvv, int base, int l = 1) {
    byte(0xC4);
    byte((((~reg >> 3) & 1) << 7) | (1 << 6) | (((~base >> 3) & 1) << 5) | map);
    byte(((~vvvv & 15) << 3) | (l << 2) | pp);
  }
  // op ymm_reg, ymm_vvvv, ymm_rm
  void rr(int map, int pp, int op, int reg, int vvvv, int rm) {
    vex(map, pp, reg, vvvv, rm);
    byte(op);
    byte(0xC0 | ((reg & 7) << 3) | (rm & 7));
  }
  // op ymm_reg, ymm_vvvv, [base + rax]
  void at_rax(int map, int pp, int op, int reg, int vvvv, int base) {
    vex(map, pp, reg, vvvv, base);
    byte(op);
    byte(0x44 | ((reg & 7) << 3));  // mod 01 (disp8), rm 100 (SIB)
    byte(base & 7);                 // scale 1, index rax
    byte(0);
  }
  // op ymm_reg, [r11]
  void at_r11(int map, int pp, int op, int reg) {
    vex(map, pp, reg, 0, R11);
    byte(op);
    byte(((reg & 7) << 3) | (R11 & 7));
  }
  // mov r, [rdi + 8p]
  void load_ptr(int r, int p) {
    bytes({0x48 | ((r >> 3) << 2), 0x8B, 0x87 | ((r & 7) << 3)});  // mod 10 (disp32), rm rdi
    u32(uint32_t(8 * p));
  }
  void push(int r) { if (r >= 8) byte(0x41); byte(0x50 + (r & 7)); }
  void pop(int r) { if (r >= 8) byte(0x41); byte(0x58 + (r & 7)); }
  // A rel32 jump or branch (opcode bytes given) whose target is patched later; returns the field.
  size_t jump(std::initializer_list<int> op) {
    bytes(op);
    u32(0);
    return b.size() - 4;
  }
  void patch(size_t field, size_t target) {
    const int32_t rel = int32_t(target) - int32_t(field + 4);
    std::memcpy(&b[field], &rel, 4);
  }
};


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

// Emits the loop into `code`, or returns false when it needs more vector registers than there are.
bool emit(const Spec& spec, std::vector<int>& loads, std::vector<uint8_t>& code) {
  const std::vector<Instr>& prog = *spec.prog;
  const std::vector<int>& results = spec.results;
  const int n = int(prog.size());
  // Pointer-array entries: the loads in program order, then the results.
  std::vector<int> ptr_of(size_t(n), -1);
  for (int k = 0; k < n; ++k)
    if (prog[size_t(k)].code == Code::Load) ptr_of[size_t(k)] = int(loads.size()), loads.push_back(k);
  const int nptr = int(loads.size() + results.size());
  auto stride = [&](int k) { return prog[size_t(k)].code == Code::Load ? spec.stride[size_t(k)] : int64_t(1); };
  auto broadcast = [&](int k) { return stride(k) == 0; };

  // Each instruction's operands as encoded: the one in VEX.vvvv (a register) and the one in
  // ModRM.rm, which may be a constant in memory; add, mul, == and != put a constant there.
  struct Operands { int v = -1, m = -1; };
  auto is_const = [&](int o) { return o >= 0 && prog[size_t(o)].code == Code::Const; };
  auto operands = [&](int k) {
    const Instr& I = prog[size_t(k)];
    const bool swap = (I.code == Code::Add || I.code == Code::Mul || I.code == Code::Eq || I.code == Code::Ne) &&
                      is_const(I.a) && !is_const(I.b);
    const bool int_lt = I.code == Code::Lt && prog[size_t(I.a)].dtype == DType::Int32;  // vpcmpgtd y, x
    switch (I.code) {
      case Code::Load: case Code::Const: return Operands{};
      case Code::Neg: case Code::Abs: return Operands{I.a, -1};
      case Code::Sqrt: case Code::Floor: case Code::Ceil: case Code::Round: return Operands{-1, I.a};
      case Code::Where: return Operands{I.c, I.b};  // the condition in the is4 byte
      default: return swap || int_lt ? Operands{I.b, I.a} : Operands{I.a, I.b};
    }
  };

  // Vector registers: constants read other than through ModRM.rm (or stored), broadcast loads,
  // the lane offsets of each stride gathered, two temporaries where an op needs them (a gather
  // one, its lane mask) and the tail's lane mask, pinned for the whole call; then the values,
  // each register reused after its value's last reader. Other constants, and the masks the ops
  // need, are read from memory (8 copies each after the code): an operand -2 - i is memory[i].
  std::vector<int> reg(size_t(n), -1);
  std::vector<uint8_t> pinned(size_t(n), 0), in_reg(size_t(n), 0);
  for (int k = 0; k < n; ++k) {
    const Instr& I = prog[size_t(k)];
    if (I.code == Code::Where) in_reg[size_t(I.a)] = 1;
    if (const int v = operands(k).v; v >= 0) in_reg[size_t(v)] = 1;
  }
  for (int r : results) in_reg[size_t(r)] = 1;
  std::vector<uint32_t> pool, memory;  // pool[r]: the lane bits pinned in register r
  auto add_to = [](std::vector<uint32_t>& to, uint32_t v) {
    for (size_t i = 0; i < to.size(); ++i)
      if (to[i] == v) return int(i);
    to.push_back(v);
    return int(to.size()) - 1;
  };
  auto in_memory = [&](float v) { return -2 - add_to(memory, std::bit_cast<uint32_t>(v)); };
  bool need_sign = false, need_zero = false, need_nan = false;
  for (int k = 0; k < n; ++k) {
    const Instr& I = prog[size_t(k)];
    if (I.code == Code::Const) {
      const uint32_t bits = I.dtype == DType::Int32 ? uint32_t(int32_t(I.value)) : std::bit_cast<uint32_t>(float(I.value));
      reg[size_t(k)] = in_reg[size_t(k)] ? add_to(pool, bits) : -2 - add_to(memory, bits);
      pinned[size_t(k)] = 1;
    }
    need_sign |= I.code == Code::Neg || I.code == Code::Abs;
    need_zero |= I.code == Code::Abs;
    need_nan |= (I.code == Code::Max || I.code == Code::Min) && I.dtype == DType::Float32;
  }
  const int m_sign = need_sign ? in_memory(-0.0f) : 0, m_zero = need_zero ? in_memory(0.0f) : 0;
  const int m_nan = need_nan ? in_memory(__builtin_nanf("")) : 0;  // the default NaN, as quiet_NaN()
  const bool need_temps = need_zero || need_nan;
  int next = int(pool.size());
  for (int k = 0; k < n; ++k)
    if (broadcast(k)) reg[size_t(k)] = next++, pinned[size_t(k)] = 1;
  std::vector<int64_t> gathers;  // the strides gathered, each one's offsets in register lanes[i]
  std::vector<int> lanes;
  for (int k = 0; k < n; ++k)
    if (const int64_t s = stride(k); s > 1 && std::find(gathers.begin(), gathers.end(), s) == gathers.end()) {
      if (s >= (int64_t(1) << 24)) return false;
      gathers.push_back(s), lanes.push_back(next++);
    }
  const int64_t out_stride = spec.out_stride;
  if (out_stride < 1 || out_stride >= (int64_t(1) << 24) || (out_stride > 1 && spec.stream)) return false;
  const int t0 = need_temps || !gathers.empty() || out_stride > 1 ? next++ : -1, t1 = need_temps ? next++ : -1;
  const int mask = next++;
  if (next >= 16) return false;

  std::vector<int> last(size_t(n), -1);
  for (int k = 0; k < n; ++k)
    for (int o : {prog[size_t(k)].a, prog[size_t(k)].b, prog[size_t(k)].c})
      if (o >= 0) last[size_t(o)] = k;
  for (size_t j = 0; j < results.size(); ++j)
    last[size_t(results[j])] = spec.early[j] ? std::max(last[size_t(results[j])], results[j]) : n;
  std::vector<int> free_regs;
  for (int r = 15; r >= next; --r) free_regs.push_back(r);
  for (int k = 0; k < n; ++k) {
    const Instr& I = prog[size_t(k)];
    if (pinned[size_t(k)]) continue;
    if (free_regs.empty()) return false;
    // A value never shares a register with its operands, so the multi-instruction sequences
    // below may write it before their last read of an operand.
    reg[size_t(k)] = free_regs.back();
    free_regs.pop_back();
    for (int o : {I.a, I.b, I.c})
      if (o >= 0 && last[size_t(o)] == k && !pinned[size_t(o)]) {
        free_regs.push_back(reg[size_t(o)]);
        last[size_t(o)] = -2;  // freed once, even when read twice
      }
    if (last[size_t(k)] <= k) free_regs.push_back(reg[size_t(k)]);  // never read again
  }

  Asm a;
  std::vector<int> ptr_reg(size_t(nptr), -1);  // resident register per pointer entry (-1: loaded where used)
  {
    int r = 0;
    for (int p = 0; p < nptr && r < kResident; ++p)
      if (p >= int(loads.size()) || !broadcast(loads[size_t(p)])) ptr_reg[size_t(p)] = kPtrRegs[r++];
  }
  std::vector<int> saved;
  for (int r : ptr_reg)
    if (r >= 0 && callee_saved(r)) saved.push_back(r);
  for (int r : saved) a.push(r);
  // rip-relative data operands, patched once the data's place is known: the displacement field,
  // the instruction's bytes after it, what it reads (memory[i], pool[i], the lane offsets of
  // gathers[i]).
  enum class Data { Memory, Pool, Lanes };
  struct Fixup { size_t field; int after; Data what; int i; };
  std::vector<Fixup> fixups;
  auto rip = [&](int after, Data what, int i) {
    fixups.push_back({a.b.size(), after, what, i});
    a.u32(0);
  };
  for (size_t r = 0; r < pool.size(); ++r) {  // vbroadcastss ymm_r, [rip + pool + 4r]
    a.vex(2, 1, int(r), 0, 0);
    a.bytes({0x18, 0x05 | ((int(r) & 7) << 3)});  // mod 00, rm 101: rip-relative
    rip(0, Data::Pool, int(r));
  }
  for (size_t g = 0; g < gathers.size(); ++g) {  // vmovups ymm_lanes, [rip + offsets]
    a.vex(1, 0, lanes[g], 0, 0);
    a.bytes({0x10, 0x05 | ((lanes[g] & 7) << 3)});
    rip(0, Data::Lanes, int(g));
  }
  for (int p = 0; p < nptr; ++p)
    if (ptr_reg[size_t(p)] >= 0) a.load_ptr(ptr_reg[size_t(p)], p);
  a.bytes({0x48, 0xC1, 0xE6, 0x02});  // shl rsi, 2: positions -> bytes
  // Each row: broadcast loads read afresh, the run, then every pointer moved by its step.
  const size_t row_top = a.b.size();
  for (int k = 0; k < n; ++k)
    if (broadcast(k)) a.load_ptr(R11, ptr_of[size_t(k)]), a.at_r11(2, 1, 0x18, reg[size_t(k)]);  // vbroadcastss
  a.bytes({0x31, 0xC0});  // xor eax, eax

  // op ymm_d, ymm_v, m (+ imm8 when imm >= 0): m a register, or memory[-2 - m]
  auto op = [&](int map, int pp, int opc, int d, int v, int m, int imm = -1) {
    if (m >= 0) a.rr(map, pp, opc, d, v, m);
    else a.vex(map, pp, d, v, 0), a.bytes({opc, 0x05 | ((d & 7) << 3)}), rip(imm >= 0 ? 1 : 0, Data::Memory, -2 - m);
    if (imm >= 0) a.byte(imm);
  };
  auto base = [&](int p) {  // the register holding pointer entry p, loaded into r11 if not resident
    if (ptr_reg[size_t(p)] >= 0) return ptr_reg[size_t(p)];
    a.load_ptr(R11, p);
    return int(R11);
  };
  auto at_stride = [&](int p, int64_t st) {  // r11 = pointer entry p + st * rax
    a.bytes({0x4C, 0x69, 0xD8}), a.u32(uint32_t(st));  // imul r11, rax, st
    if (const int b = ptr_reg[size_t(p)]; b >= 0) a.bytes({0x49 | ((b >> 3) << 2), 0x01, 0xC3 | ((b & 7) << 3)});  // add r11, b
    else a.bytes({0x4C, 0x03, 0x9F}), a.u32(uint32_t(8 * p));  // add r11, [rdi + 8p]
  };
  // Lane by lane: vextractps [r11 + 4 * out_stride * i], xmm, i (the upper half through t0);
  // under the tail's mask only lanes i with rax + 4i < rsi.
  auto store_lanes = [&](int v, int p, bool masked) {
    std::vector<size_t> to_end;
    for (int i = 0; i < 8; ++i) {
      if (masked && i > 0) {
        a.bytes({0x4C, 0x8D, 0x58, 4 * i});  // lea r11, [rax + 4i]
        a.bytes({0x49, 0x39, 0xF3});         // cmp r11, rsi
        to_end.push_back(a.jump({0x0F, 0x83}));  // jae end
      }
      if (i == 0 || masked) at_stride(p, out_stride);
      if (i == 4) a.rr(3, 1, 0x19, v, 0, t0), a.byte(1);  // vextractf128 xmm_t0, ymm_v, 1
      const int src = i < 4 ? v : t0;
      a.vex(3, 1, src, 0, R11, 0);
      a.bytes({0x17, 0x80 | ((src & 7) << 3) | (R11 & 7)});  // [r11 + disp32]
      a.u32(uint32_t(4 * out_stride * i));
      a.byte(i & 3);
    }
    for (size_t f : to_end) a.patch(f, a.b.size());
  };
  auto store = [&](size_t j, bool masked) {
    const int v = reg[size_t(results[j])], p = int(loads.size() + j);
    if (out_stride > 1) return store_lanes(v, p, masked);
    const int b = base(p);
    if (masked) a.at_rax(2, 1, 0x2E, v, mask, b);  // vmaskmovps [b + rax], mask, v
    else a.at_rax(1, 0, spec.stream ? 0x2B : 0x11, v, 0, b);  // vmovntps / vmovups
  };
  auto body = [&](bool masked) {
    for (int k = 0; k < n; ++k) {
      const Instr& I = prog[size_t(k)];
      const int d = reg[size_t(k)];
      const Operands o = operands(k);
      const int x = o.v >= 0 ? reg[size_t(o.v)] : -1, y = o.m >= 0 ? reg[size_t(o.m)] : -1;
      switch (I.code) {
        case Code::Load:  // float32 and int32 lanes alike
          if (broadcast(k)) break;
          if (const int64_t st = stride(k); st > 1) {
            // vgatherdps d, [r11 + lanes * 4] under t0 (which it clears), r11 = base + st * rax
            const int r = lanes[size_t(std::find(gathers.begin(), gathers.end(), st) - gathers.begin())];
            at_stride(ptr_of[size_t(k)], st);
            if (masked) a.rr(1, 0, 0x28, t0, 0, mask);  // vmovaps t0, mask
            else a.rr(1, 1, 0x76, t0, t0, t0);          // vpcmpeqd t0, t0, t0: every lane
            a.byte(0xC4);
            a.byte((((~d >> 3) & 1) << 7) | (((~r >> 3) & 1) << 6) | 2);  // R X, B = r11, map 0F38
            a.byte(((~t0 & 15) << 3) | (1 << 2) | 1);                     // W0, vvvv = t0, L256, 66
            a.bytes({0x92, 0x04 | ((d & 7) << 3), 0x80 | ((r & 7) << 3) | (R11 & 7)});  // [r11 + r * 4]
            break;
          }
          if (masked) a.at_rax(2, 1, 0x2C, d, mask, base(ptr_of[size_t(k)]));  // vmaskmovps
          else a.at_rax(1, 0, 0x10, d, 0, base(ptr_of[size_t(k)]));            // vmovups
          break;
        case Code::Const: break;
        case Code::Add: op(1, 0, 0x58, d, x, y); break;
        case Code::Mul: op(1, 0, 0x59, d, x, y); break;
        case Code::Sub: op(1, 0, 0x5C, d, x, y); break;
        case Code::Div: op(1, 0, 0x5E, d, x, y); break;
        case Code::Max: case Code::Min:
          if (I.dtype == DType::Bool) {  // lane masks: or, and
            op(1, 0, I.code == Code::Max ? 0x56 : 0x54, d, x, y);
            break;
          }
          // (x > y ? x : y) or (x < y ? x : y) as vmaxps / vminps compute them; a NaN on either
          // side gives the default NaN, as the interpreter's nan_max / nan_min.
          op(1, 0, 0xC2, t0, x, y, 3);                           // t0 = unordered(x, y)
          op(1, 0, I.code == Code::Max ? 0x5F : 0x5D, t1, x, y);  // t1 = max / min
          op(3, 1, 0x4A, d, t1, m_nan, t0 << 4);                 // d = t0 ? nan : t1
          break;
        case Code::Neg: op(1, 0, 0x57, d, x, m_sign); break;  // vxorps with the sign bit
        case Code::Abs:
          // x < 0 ? -x : x (a NaN and -0 stay as they are, as in the interpreter)
          op(1, 0, 0xC2, t0, x, m_zero, 1);   // t0 = x < 0
          op(1, 0, 0x57, t1, x, m_sign);      // t1 = -x
          op(3, 1, 0x4A, d, x, t1, t0 << 4);  // d = t0 ? t1 : x
          break;
        case Code::Sqrt: op(1, 0, 0x51, d, 0, y); break;
        case Code::Eq: case Code::Ne: case Code::Lt: case Code::Le: case Code::Gt: case Code::Ge:
          if (prog[size_t(I.a)].dtype == DType::Int32) {  // vpcmpeqd, vpcmpgtd (lt: operands swapped)
            op(1, 1, I.code == Code::Eq ? 0x76 : 0x66, d, x, y);
            break;
          }
          // vcmpps with C++'s predicates: ordered for ==, <, <=, >, >=; unordered for !=
          op(1, 0, 0xC2, d, x, y,
             I.code == Code::Eq ? 0x00 : I.code == Code::Ne ? 0x04 : I.code == Code::Lt ? 0x01
             : I.code == Code::Le ? 0x02 : I.code == Code::Gt ? 0x0E : 0x0D);
          break;
        case Code::Where:  // c ? m : v as a blend on the condition's lane mask (float or int lanes)
          op(3, 1, 0x4A, d, x, y, reg[size_t(I.a)] << 4);
          break;
        case Code::Floor: case Code::Ceil: case Code::Round:
          // vroundps; 8 suppresses the inexact exception; round is to nearest even, as nearbyint
          op(3, 1, 0x08, d, 0, y, 8 | (I.code == Code::Floor ? 1 : I.code == Code::Ceil ? 2 : 0));
          break;
        default: break;
      }
      for (size_t j = 0; j < results.size(); ++j)
        if (spec.early[j] && results[j] == k) store(j, masked);
    }
    for (size_t j = 0; j < results.size(); ++j)
      if (!spec.early[j]) store(j, masked);
  };

  const size_t to_check = a.jump({0xE9});  // jmp check
  const size_t top = a.b.size();
  body(false);
  a.bytes({0x48, 0x83, 0xC0, 0x20});  // add rax, 32
  a.patch(to_check, a.b.size());
  a.bytes({0x4C, 0x8D, 0x58, 0x20});  // check: lea r11, [rax + 32]
  a.bytes({0x49, 0x39, 0xF3});        // cmp r11, rsi
  a.patch(a.jump({0x0F, 0x86}), top); // jbe top
  a.bytes({0x48, 0x39, 0xF0});        // cmp rax, rsi
  const size_t to_done = a.jump({0x0F, 0x83});  // jae done
  // The last 1-7 positions under a lane mask: 8 dwords of the table read from 32 - 4r bytes in,
  // r = (rsi - rax) / 4 set lanes.
  a.bytes({0x4C, 0x8D, 0x1D});  // lea r11, [rip + table + 32]
  const size_t table_disp = a.b.size();
  a.u32(0);
  a.bytes({0x49, 0x29, 0xF3});  // sub r11, rsi
  a.bytes({0x49, 0x01, 0xC3});  // add r11, rax
  a.at_r11(1, 0, 0x10, mask);   // vmovups mask, [r11]
  body(true);
  a.patch(to_done, a.b.size());
  for (int p = 0; p < nptr; ++p) {
    const uint32_t step = uint32_t(8 * (nptr + 1 + p));
    if (const int r = ptr_reg[size_t(p)]; r >= 0) {
      a.bytes({0x48 | ((r >> 3) << 2), 0x03, 0x87 | ((r & 7) << 3)}), a.u32(step);  // add r, [rdi + step]
    } else {
      a.bytes({0x4C, 0x8B, 0x9F}), a.u32(step);           // mov r11, [rdi + step]
      a.bytes({0x4C, 0x01, 0x9F}), a.u32(uint32_t(8 * p));  // add [rdi + 8p], r11
    }
  }
  a.bytes({0x48, 0xFF, 0x8F}), a.u32(uint32_t(8 * nptr));  // dec qword [rdi + rows]
  a.patch(a.jump({0x0F, 0x85}), row_top);                   // jnz row_top
  if (spec.stream) a.bytes({0x0F, 0xAE, 0xF8});  // sfence
  a.bytes({0xC5, 0xF8, 0x77});                   // vzeroupper
  for (auto it = saved.rbegin(); it != saved.rend(); ++it) a.pop(*it);
  a.byte(0xC3);
  // The data: 32-byte vectors (each memory value 8 times, the gathers' lane offsets), the
  // pinned values, then the lane-mask table (8 set dwords, 8 clear).
  while (a.b.size() % 32) a.byte(0xCC);
  const size_t at_memory = a.b.size(), at_lanes = at_memory + 32 * memory.size();
  for (uint32_t v : memory)
    for (int i = 0; i < 8; ++i) a.u32(v);
  for (int64_t g : gathers)
    for (int i = 0; i < 8; ++i) a.u32(uint32_t(i * g));
  const size_t at_pool = a.b.size();
  for (uint32_t v : pool) a.u32(v);
  for (const Fixup& f : fixups)
    a.patch(f.field, (f.what == Data::Memory ? at_memory + 32 * size_t(f.i)
                      : f.what == Data::Lanes ? at_lanes + 32 * size_t(f.i) : at_pool + 4 * size_t(f.i)) - size_t(f.after));
  a.patch(table_disp, a.b.size() + 32);
  for (int i = 0; i < 16; ++i) a.u32(i < 8 ? 0xFFFFFFFFu : 0u);
  code = std::move(a.b);
  return true;
}

}  // namespace

Loop::~Loop() {
  if (code_) munmap(code_, code_bytes_);
}

bool available() {
  static const bool ok = [] {
    const char* e = std::getenv("TESSERA_CPU_JIT");
    if (e && std::strcmp(e, "0") == 0) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return ok;
}

std::unique_ptr<Loop> build(const Spec& spec) {
  const std::vector<Instr>& prog = *spec.prog;
  if (!available() || prog.empty() || spec.results.empty() || !supported(prog, spec.results)) return nullptr;
  std::vector<int> loads;
  std::vector<uint8_t> code;
  if (!emit(spec, loads, code) || loads.size() + spec.results.size() > size_t(Loop::kMaxPtrs)) return nullptr;
  const size_t page = 4096, bytes = (code.size() + page - 1) / page * page;
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return nullptr;
  std::memcpy(mem, code.data(), code.size());
  if (mprotect(mem, bytes, PROT_READ | PROT_EXEC) != 0) {
    munmap(mem, bytes);
    return nullptr;
  }
  std::unique_ptr<Loop> loop(new Loop());
  loop->code_ = mem;
  loop->code_bytes_ = bytes;
  loop->fn_ = reinterpret_cast<void (*)(int64_t*, int64_t)>(mem);
  loop->loads_ = std::move(loads);
  loop->results_ = spec.results.size();
  loop->stream_ = spec.stream;
  return loop;
}

#else  // not x86-64 Linux: the interpreter runs everything

Loop::~Loop() = default;
bool available() { return false; }
std::unique_ptr<Loop> build(const Spec&) { return nullptr; }

#endif

}  // namespace tessera::backends::jit
