// The options realize() compiles with (compiler::Options): the one place the compiler's settings
// come from. Read once from the environment, at first use:
//   TESSERA_DISABLE_PASSES  passes switched off: a comma list of names (compiler::pass_names()),
//                           or "all"; an unknown name is an error at the first compile
//   TESSERA_ARENA_GUARD     guard bytes around each arena temporary (debug; see realize.h)
//   TESSERA_DUMP            stages to dump: a comma list of ir, fused, plan, or 1/all (those three); asm
//                           (the CPU backend's native loops) is read by backends/cpu/loop_dump.h; 0 or empty: none
//   TESSERA_DUMP_DIR        dump into graph-NNNN.<stage>.txt files there instead of standard error
// and changed by the setters below (tests, the conformance suite, benchmarks). The disabled
// passes and the guard are part of the compile-cache key; dumps are not (a cache hit dumps
// nothing). Setters are not meant to run while another thread compiles.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "compiler/options.h"

namespace tessera::runtime {

// The current settings (the target is left default: realize() sets the device's).
compiler::Options compile_options();
// Replaces every setting (e.g. putting back what compile_options() returned).
void set_compile_options(const compiler::Options& opts);

// Disables passes: a comma list of pass names or "all" ("" enables every pass). Throws
// tessera::Error naming an unknown pass.
void set_disabled_passes(const std::string& list);
// Arena guards: bytes (rounded up to 64) before and after each arena temporary; 0 is off.
void set_arena_guard(size_t bytes);
// The memory budget (compiler::Options::memory_budget and memory_budget_fraction; 0, 0: none).
void set_memory_budget(size_t bytes, double fraction);
// Dumps: the syntax of TESSERA_DUMP and TESSERA_DUMP_DIR; graph numbering restarts at 1. Throws
// tessera::Error on an unknown stage.
void set_dump_config(const std::string& stages, const std::string& dir);
// Back to the dump settings read from the environment (numbering restarts at 1).
void clear_dump_config();

namespace detail {
// For realize(): the settings and their cache-key string, taken together.
struct CompileSettings {
  compiler::Options opts;
  std::string key;  // opts.key()
};
std::shared_ptr<const CompileSettings> compile_settings();
// The number of the next dumped graph (1, 2, ... since the dump settings were last set).
int next_dump_graph();
}  // namespace detail

}  // namespace tessera::runtime
