// One register allocator for the CPU backend's two engines: the interpreter's register plan
// (registers are tiles in memory, as many as a program needs) and the native loops' vector
// registers (16 ymm, some pinned to constants). Both run a Step's program as straight-line code,
// so registers are assigned by last use, in one pass.
#pragma once
#include <vector>

#include "kernel_ir/step.h"

namespace tessera::backends::cpu {

// Per value of prog, the index of the last instruction that reads it (-1: none).
std::vector<int> last_readers(const std::vector<kir::Instr>& prog);

// Assigns reg[k] to each value k with own[k] set: when instruction k runs, the lowest register of
// [first, first + count) that no live value holds. A value stays live until instruction last[k]
// has run (its last reader, or later: `last` may say past the end for a result read after the
// program) and at least through its own instruction, and it never takes a register one of its
// operands is in (a multi-instruction sequence may write its result before its last operand
// read). Values without own[k] keep reg[k] as given (pinned by the caller: the interpreter's
// scalar constants, a loop's constants and broadcasts) and hold no register of the range.
// Returns how many registers of the range were used (the highest one + 1 - first), or -1 when
// more than count values would be live at once.
int assign_registers(const std::vector<kir::Instr>& prog, const std::vector<uint8_t>& own, std::vector<int> last,
                     int first, int count, std::vector<int>& reg);

}  // namespace tessera::backends::cpu
