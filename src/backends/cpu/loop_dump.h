// TESSERA_DUMP=asm (among the stages of the comma list compiler/dump.h reads): every native loop
// built (jit_x86.h), numbered in build order, is
//   - named in the perf map /tmp/perf-<pid>.map ("<address> <size> tessera_loop_NNNN", hex), so
//     `perf report` attributes samples inside it to the loop;
//   - with TESSERA_DUMP_DIR, written to <dir>/loop-NNNN.bin (the code and its data, raw) and
//     <dir>/loop-NNNN.s (a header line and `objdump -D -b binary -mi386:x86-64 -M intel` of the
//     bytes at their run-time address, where objdump is on the PATH); without it, the listing
//     goes to standard error.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backends/cpu/jit_x86.h"

namespace tessera::backends::jit {

// Whether TESSERA_DUMP names asm (read once per process).
bool dump_asm();
// Dumps one loop's code (the executable bytes `size` long at `code`) when dump_asm().
void dump_loop(const uint8_t* code, size_t size, const Spec& spec);

}  // namespace tessera::backends::jit
