#include "runtime/compile_options.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <sstream>

#include "core/fail.h"
#include "runtime/allocator.h"

namespace tessera::runtime {
namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::set<std::string> parse_passes(const std::string& list) {
  const std::vector<std::string>& names = compiler::pass_names();
  std::set<std::string> s;
  std::stringstream ss(list);
  std::string name;
  while (std::getline(ss, name, ',')) {
    if (name == "all") s.insert(names.begin(), names.end());
    else if (!name.empty()) s.insert(name);
  }
  for (const std::string& n : s)
    if (std::find(names.begin(), names.end(), n) == names.end()) {
      std::string all;
      for (const std::string& p : names) all += (all.empty() ? "" : ", ") + p;
      fail("compile", "unknown pass '" + n + "' in the disabled list; passes are: " + all + " (or all)");
    }
  return s;
}

size_t padded_guard(size_t bytes) { return (bytes + 63) / 64 * 64; }

compiler::DumpOptions parse_dump(const std::string& stages, const std::string& dir) {
  compiler::DumpOptions d;
  d.dir = dir;
  std::stringstream ss(stages);
  std::string s;
  while (std::getline(ss, s, ',')) {
    // Trim blanks so "ir, plan" works.
    size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
    s = b == std::string::npos ? "" : s.substr(b, e - b + 1);
    if (s.empty() || s == "0") continue;
    if (s == "1" || s == "all") d.ir = d.fused = d.plan = true;
    else if (s == "ir") d.ir = true;
    else if (s == "fused") d.fused = true;
    else if (s == "plan") d.plan = true;
    else if (s == "asm") continue;  // the CPU backend's native loops: backends/cpu/loop_dump.h reads it
    else
      throw Error("[dump] TESSERA_DUMP: unknown stage '" + s + "' (stages: ir, fused, plan, asm; 1 or all for ir, fused and plan)");
  }
  return d;
}

std::mutex g_mu;
std::shared_ptr<const compiler::Options> g_env;           // read from the environment once (under g_mu)
std::shared_ptr<const detail::CompileSettings> g_current;  // under g_mu
std::atomic<int> g_next_graph{1};

// The environment's settings; an invalid variable throws here, at every use until it is fixed.
const compiler::Options& environment() {
  if (!g_env) {
    compiler::Options o;
    o.allocation_round = kAllocRound;
    o.disabled = parse_passes(env_or_empty("TESSERA_DISABLE_PASSES"));
    if (const char* g = std::getenv("TESSERA_ARENA_GUARD")) o.arena_guard = padded_guard(std::strtoull(g, nullptr, 10));
    o.dump = parse_dump(env_or_empty("TESSERA_DUMP"), env_or_empty("TESSERA_DUMP_DIR"));
    g_env = std::make_shared<const compiler::Options>(std::move(o));
  }
  return *g_env;
}

const compiler::Options& current() {
  if (!g_current) g_current = std::make_shared<const detail::CompileSettings>(detail::CompileSettings{environment(), environment().key()});
  return g_current->opts;
}

void replace(compiler::Options opts) {
  std::string key = opts.key();
  g_current = std::make_shared<const detail::CompileSettings>(detail::CompileSettings{std::move(opts), std::move(key)});
}

}  // namespace

compiler::Options compile_options() {
  std::lock_guard<std::mutex> lock(g_mu);
  return current();
}

void set_compile_options(const compiler::Options& opts) {
  std::lock_guard<std::mutex> lock(g_mu);
  replace(opts);
}

void set_disabled_passes(const std::string& list) {
  std::set<std::string> disabled = parse_passes(list);
  std::lock_guard<std::mutex> lock(g_mu);
  compiler::Options o = current();
  o.disabled = std::move(disabled);
  replace(std::move(o));
}

void set_arena_guard(size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  compiler::Options o = current();
  o.arena_guard = padded_guard(bytes);
  replace(std::move(o));
}

void set_memory_budget(size_t bytes, double fraction) {
  std::lock_guard<std::mutex> lock(g_mu);
  compiler::Options o = current();
  o.memory_budget = bytes;
  o.memory_budget_fraction = bytes ? 0.0 : fraction;
  replace(std::move(o));
}

void set_dump_config(const std::string& stages, const std::string& dir) {
  compiler::DumpOptions d = parse_dump(stages, dir);
  std::lock_guard<std::mutex> lock(g_mu);
  compiler::Options o = current();
  o.dump = std::move(d);
  replace(std::move(o));
  g_next_graph = 1;
}

void clear_dump_config() {
  std::lock_guard<std::mutex> lock(g_mu);
  compiler::Options o = current();
  o.dump = environment().dump;
  replace(std::move(o));
  g_next_graph = 1;
}

namespace detail {

std::shared_ptr<const CompileSettings> compile_settings() {
  std::lock_guard<std::mutex> lock(g_mu);
  current();
  return g_current;
}

int next_dump_graph() { return g_next_graph++; }

}  // namespace detail
}  // namespace tessera::runtime
