#include "backends/cpu/reg_alloc.h"

#include <algorithm>
#include <functional>

namespace tessera::backends::cpu {

std::vector<int> last_readers(const std::vector<kir::Instr>& prog) {
  std::vector<int> last(prog.size(), -1);
  for (size_t k = 0; k < prog.size(); ++k)
    for (int o : {prog[k].a, prog[k].b, prog[k].c})
      if (o >= 0) last[size_t(o)] = int(k);
  return last;
}

int assign_registers(const std::vector<kir::Instr>& prog, const std::vector<uint8_t>& own, std::vector<int> last,
                     int first, int count, std::vector<int>& reg) {
  std::vector<int> free_regs;  // released registers, kept sorted descending: the lowest is taken first
  int used = 0;                // registers first .. first + used - 1 have been handed out
  auto release = [&](int r) {
    free_regs.insert(std::upper_bound(free_regs.begin(), free_regs.end(), r, std::greater<int>()), r);
  };
  for (size_t k = 0; k < prog.size(); ++k) {
    if (!own[k]) continue;
    if (free_regs.empty()) {
      if (used == count) return -1;
      free_regs.push_back(first + used++);
    }
    reg[k] = free_regs.back();
    free_regs.pop_back();
    const kir::Instr& I = prog[k];
    for (int o : {I.a, I.b, I.c})
      if (o >= 0 && own[size_t(o)] && last[size_t(o)] == int(k)) {
        release(reg[size_t(o)]);
        last[size_t(o)] = -2;  // released once, even when read twice
      }
    if (last[k] <= int(k)) release(reg[k]);  // never read after its own instruction
  }
  return used;
}

}  // namespace tessera::backends::cpu
