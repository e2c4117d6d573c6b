#include "backends/cpu/jit_x86.h"

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

// General-purpose registers (x86-64 numbering).
enum Gpr : int { RAX = 0, RCX = 1, RDX = 2, RBX = 3, RBP = 5, RSI = 6, RDI = 7, R8 = 8, R9, R10, R11, R12, R13, R14, R15 };
// Pointer registers in order of use; rdi (the pointer array) is loaded last, the callee-saved
// ones (rbx, rbp, r12-r15) are pushed and popped.
constexpr int kPtrRegs[] = {RDX, RCX, R8, R9, R10, R11, RBX, RBP, R12, R13, R14, R15, RDI};
constexpr int kMaxPtrs = int(sizeof kPtrRegs / sizeof kPtrRegs[0]);
bool callee_saved(int r) { return r == RBX || r == RBP || r >= R12; }

// The few instructions the loops need, encoded by hand (VEX.256 forms, three-byte prefix).
struct Asm {
  std::vector<uint8_t> b;
  void byte(int x) { b.push_back(uint8_t(x)); }
  void u32(uint32_t x) { for (int i = 0; i < 4; ++i) byte(int(x >> (8 * i)) & 0xff); }
  void u64(uint64_t x) { for (int i = 0; i < 8; ++i) byte(int(x >> (8 * i)) & 0xff); }
  // map: 1 = 0F, 2 = 0F38, 3 = 0F3A; pp: 0 = none, 1 = 66. reg/vvvv/base are register numbers.
  void vex(int map, int pp, int reg, int vvvv, int base) {
    byte(0xC4);
    byte((((~reg >> 3) & 1) << 7) | (1 << 6) | (((~base >> 3) & 1) << 5) | map);
    byte(((~vvvv & 15) << 3) | (1 << 2) | pp);
  }
  // op ymm_reg, ymm_vvvv, ymm_rm
  void rr(int map, int pp, int op, int reg, int vvvv, int rm) {
    vex(map, pp, reg, vvvv, rm);
    byte(op);
    byte(0xC0 | ((reg & 7) << 3) | (rm & 7));
  }
  // op ymm_reg, [base + rax]
  void mem_idx(int map, int pp, int op, int reg, int base) {
    vex(map, pp, reg, 0, base);
    byte(op);
    byte(0x44 | ((reg & 7) << 3));  // mod 01 (disp8), rm 100 (SIB)
    byte(base & 7);                 // scale 1, index rax
    byte(0);
  }
  void push(int r) { if (r >= 8) byte(0x41); byte(0x50 + (r & 7)); }
  void pop(int r) { if (r >= 8) byte(0x41); byte(0x58 + (r & 7)); }
};

struct Built {
  std::vector<uint8_t> code;  // the loop, then its constants' pool
  std::vector<int> loads;
};

bool supported(const std::vector<Instr>& prog) {
  for (const Instr& I : prog) {
    if (I.dtype != DType::Float32) return false;
    switch (I.code) {
      case Code::Load: case Code::Const: case Code::Neg: case Code::Abs: case Code::Sqrt: case Code::Floor:
      case Code::Ceil: case Code::Round: case Code::Add: case Code::Sub: case Code::Mul: case Code::Div:
      case Code::Max: case Code::Min:
        break;
      default: return false;
    }
  }
  return true;
}

// Emits the loop, or returns false when it needs more registers than there are.
bool emit(const std::vector<Instr>& prog, const std::vector<int>& results, bool stream, Built& out) {
  const int n = int(prog.size());
  // Pointers: the loads, then the results.
  std::vector<int> ptr_of(size_t(n), -1);
  for (int k = 0; k < n; ++k)
    if (prog[size_t(k)].code == Code::Load) ptr_of[size_t(k)] = int(out.loads.size()), out.loads.push_back(k);
  const int nptr = int(out.loads.size() + results.size());
  if (nptr > kMaxPtrs) return false;

  // Vector registers: constants (and the masks the ops need) pinned for the whole loop, two
  // temporaries, then the values by last use.
  std::vector<int> reg(size_t(n), -1);
  std::vector<float> pool;  // pool[r]: the value pinned in register r
  auto pin = [&](float v) {
    for (size_t r = 0; r < pool.size(); ++r)
      if (std::memcmp(&pool[r], &v, 4) == 0) return int(r);
    pool.push_back(v);
    return int(pool.size()) - 1;
  };
  bool need_sign = false, need_zero = false, need_nan = false;
  for (int k = 0; k < n; ++k) {
    const Instr& I = prog[size_t(k)];
    if (I.code == Code::Const) reg[size_t(k)] = pin(float(I.value));
    need_sign |= I.code == Code::Neg || I.code == Code::Abs;
    need_zero |= I.code == Code::Abs;
    need_nan |= I.code == Code::Max || I.code == Code::Min;
  }
  const int r_sign = need_sign ? pin(-0.0f) : -1, r_zero = need_zero ? pin(0.0f) : -1;
  const int r_nan = need_nan ? pin(__builtin_nanf("")) : -1;  // the default NaN, as quiet_NaN()
  const int t0 = int(pool.size()), t1 = t0 + 1;
  if (t1 >= 16) return false;

  std::vector<int> last(size_t(n), -1);
  for (int k = 0; k < n; ++k)
    for (int o : {prog[size_t(k)].a, prog[size_t(k)].b})
      if (o >= 0) last[size_t(o)] = k;
  for (int r : results) last[size_t(r)] = n;
  std::vector<int> free_regs;
  for (int r = 15; r > t1; --r) free_regs.push_back(r);
  for (int k = 0; k < n; ++k) {
    const Instr& I = prog[size_t(k)];
    if (I.code == Code::Const) continue;
    if (free_regs.empty()) return false;
    // A result never shares a register with an operand, so the multi-instruction sequences
    // below may write it before their last read of an operand.
    reg[size_t(k)] = free_regs.back();
    free_regs.pop_back();
    for (int o : {I.a, I.b})
      if (o >= 0 && last[size_t(o)] == k && prog[size_t(o)].code != Code::Const) {
        free_regs.push_back(reg[size_t(o)]);
        last[size_t(o)] = -2;  // freed once, even when read twice
      }
    if (last[size_t(k)] == -1) free_regs.push_back(reg[size_t(k)]);  // never read
  }

  Asm a;
  std::vector<int> saved;
  for (int p = 0; p < nptr; ++p)
    if (callee_saved(kPtrRegs[p])) saved.push_back(kPtrRegs[p]);
  for (int r : saved) a.push(r);
  // vbroadcastss ymm_r, [rip + pool + 4r] (the displacements patched once the pool's place is known)
  std::vector<size_t> disp_at;
  for (size_t r = 0; r < pool.size(); ++r) {
    a.vex(2, 1, int(r), 0, 0);
    a.byte(0x18);
    a.byte(0x05 | ((int(r) & 7) << 3));  // mod 00, rm 101: rip-relative
    disp_at.push_back(a.b.size());
    a.u32(0);
  }
  // The pointers, from the array in rdi (rdi itself last): mov r, [rdi + 8p]
  std::vector<int> order;
  for (int p = 0; p < nptr; ++p)
    if (kPtrRegs[p] != RDI) order.push_back(p);
  for (int p = 0; p < nptr; ++p)
    if (kPtrRegs[p] == RDI) order.push_back(p);
  for (int p : order) {
    const int r = kPtrRegs[p];
    a.byte(0x48 | ((r >> 3) << 2)), a.byte(0x8B), a.byte(0x47 | ((r & 7) << 3)), a.byte(8 * p);
  }
  a.byte(0x31), a.byte(0xC0);  // xor eax, eax
  const size_t top = a.b.size();
  for (int k = 0; k < n; ++k) {
    const Instr& I = prog[size_t(k)];
    const int d = reg[size_t(k)];
    const int x = I.a >= 0 ? reg[size_t(I.a)] : -1, y = I.b >= 0 ? reg[size_t(I.b)] : -1;
    switch (I.code) {
      case Code::Load: a.mem_idx(1, 0, 0x10, d, kPtrRegs[ptr_of[size_t(k)]]); break;  // vmovups
      case Code::Const: break;
      case Code::Add: a.rr(1, 0, 0x58, d, x, y); break;
      case Code::Mul: a.rr(1, 0, 0x59, d, x, y); break;
      case Code::Sub: a.rr(1, 0, 0x5C, d, x, y); break;
      case Code::Div: a.rr(1, 0, 0x5E, d, x, y); break;
      case Code::Max: case Code::Min:
        // (x > y ? x : y) or (x < y ? x : y) as vmaxps / vminps compute them; a NaN on either side
        // gives the default NaN, as the interpreter's nan_max / nan_min.
        a.rr(1, 0, 0xC2, t0, x, y), a.byte(3);                    // t0 = unordered(x, y)
        a.rr(1, 0, I.code == Code::Max ? 0x5F : 0x5D, t1, x, y);  // t1 = max / min
        a.rr(3, 1, 0x4A, d, t1, r_nan), a.byte(t0 << 4);          // d = t0 ? nan : t1
        break;
      case Code::Neg: a.rr(1, 0, 0x57, d, x, r_sign); break;  // vxorps with the sign bit
      case Code::Abs:
        // x < 0 ? -x : x (a NaN and -0 stay as they are, as in the interpreter)
        a.rr(1, 0, 0xC2, t0, x, r_zero), a.byte(1);  // t0 = x < 0
        a.rr(1, 0, 0x57, t1, x, r_sign);             // t1 = -x
        a.rr(3, 1, 0x4A, d, x, t1), a.byte(t0 << 4); // d = t0 ? t1 : x
        break;
      case Code::Sqrt: a.rr(1, 0, 0x51, d, 0, x); break;
      case Code::Floor: case Code::Ceil: case Code::Round:
        // vroundps; 8 suppresses the inexact exception; round is to nearest even, as nearbyint
        a.rr(3, 1, 0x08, d, 0, x), a.byte(8 | (I.code == Code::Floor ? 1 : I.code == Code::Ceil ? 2 : 0));
        break;
      default: return false;
    }
  }
  // Results are stored once every load of this iteration has run (an output may be an input).
  for (size_t j = 0; j < results.size(); ++j)
    a.mem_idx(1, 0, stream ? 0x2B : 0x11, reg[size_t(results[j])], kPtrRegs[out.loads.size() + j]);
  a.byte(0x48), a.byte(0x83), a.byte(0xC0), a.byte(32);  // add rax, 32
  a.byte(0x48), a.byte(0x39), a.byte(0xF0);              // cmp rax, rsi
  a.byte(0x0F), a.byte(0x82);                            // jb top
  a.u32(uint32_t(int32_t(top) - int32_t(a.b.size() + 4)));
  if (stream) a.byte(0x0F), a.byte(0xAE), a.byte(0xF8);  // sfence
  a.byte(0xC5), a.byte(0xF8), a.byte(0x77);              // vzeroupper
  for (auto it = saved.rbegin(); it != saved.rend(); ++it) a.pop(*it);
  a.byte(0xC3);
  while (a.b.size() % 4) a.byte(0xCC);
  for (size_t r = 0; r < pool.size(); ++r) {
    const int32_t rel = int32_t(a.b.size() + 4 * r) - int32_t(disp_at[r] + 4);
    std::memcpy(&a.b[disp_at[r]], &rel, 4);
  }
  for (float v : pool) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    a.u32(bits);
  }
  out.code = std::move(a.b);
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
    return __builtin_cpu_supports("avx") != 0;
  }();
  return ok;
}

std::unique_ptr<Loop> build(const std::vector<Instr>& prog, const std::vector<int>& results, bool stream) {
  if (!available() || prog.empty() || results.empty() || !supported(prog)) return nullptr;
  Built b;
  if (!emit(prog, results, stream, b)) return nullptr;
  std::unique_ptr<Loop> loop(new Loop());
  const size_t page = 4096, bytes = (b.code.size() + page - 1) / page * page;
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return nullptr;
  std::memcpy(mem, b.code.data(), b.code.size());
  if (mprotect(mem, bytes, PROT_READ | PROT_EXEC) != 0) {
    munmap(mem, bytes);
    return nullptr;
  }
  loop->code_ = mem;
  loop->code_bytes_ = bytes;
  loop->fn_ = reinterpret_cast<void (*)(const void* const*, int64_t)>(mem);
  loop->loads_ = std::move(b.loads);
  loop->stream_ = stream;
  return loop;
}

#else  // not x86-64 Linux: the interpreter runs everything

Loop::~Loop() = default;
bool available() { return false; }
std::unique_ptr<Loop> build(const std::vector<Instr>&, const std::vector<int>&, bool) { return nullptr; }

#endif

}  // namespace tessera::backends::jit
