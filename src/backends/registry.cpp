// The backend registry: built-in backends at first use, plugins at the first lookup that needs
// them (backends/plugin_loader.h).
#include <map>
#include <mutex>

#include "backends/backend.h"
#include "backends/plugin_loader.h"
#include "core/fail.h"

namespace tessera::backends {

std::shared_ptr<Backend> make_cpu_backend();
std::shared_ptr<Backend> make_null_backend();

namespace {

struct Registry {
  // Recursive: a plugin's factory may look up a built-in backend while plugins load (the v3 test
  // backend wraps the cpu's).
  std::recursive_mutex mu;
  std::vector<std::shared_ptr<Backend>> backends;
  std::vector<LoadedPlugin> plugins;
  bool plugins_loaded = false;
};

// Never destroyed: plugins' backends must not be torn down at exit after their libraries.
Registry& registry() {
  static Registry* r = [] {
    auto* r = new Registry();
    r->backends = {make_cpu_backend(), make_null_backend()};
    return r;
  }();
  return *r;
}

// Under r.mu. Plugins go before null (the compile-only device stays last).
void load_plugins_locked(Registry& r) {
  if (r.plugins_loaded) return;
  r.plugins_loaded = true;
  std::vector<std::string> taken;
  for (auto& b : r.backends) taken.push_back(b->name());
  r.plugins = load_plugins(taken);
  for (auto& p : r.plugins)
    if (p.backend) r.backends.insert(r.backends.end() - 1, p.backend);
}

}  // namespace

std::atomic<int64_t>& reported_host_transfers(const std::string& kind) {
  static std::mutex mu;
  static std::map<std::string, std::atomic<int64_t>> counters;  // map nodes never move
  std::lock_guard<std::mutex> lock(mu);
  return counters[kind];
}

void report_host_transfer(const std::string& kind, int64_t bytes) { reported_host_transfers(kind) += bytes; }

namespace {
std::atomic<int64_t> g_bf16_flops{0};
}
void report_bf16_flops(int64_t flops) { g_bf16_flops.fetch_add(flops, std::memory_order_relaxed); }
int64_t bf16_flops_reported() { return g_bf16_flops.load(std::memory_order_relaxed); }

void Backend::copy_device(void* dst, int, const void* src, int, size_t nbytes) {
  std::vector<char> staged(nbytes);
  copy_out(staged.data(), src, nbytes);
  copy_in(dst, staged.data(), nbytes);
  report_host_transfer(name(), int64_t(2 * nbytes));
}

void register_backend(std::shared_ptr<Backend> b) {
  Registry& r = registry();
  std::lock_guard<std::recursive_mutex> lock(r.mu);
  r.backends.push_back(std::move(b));
}

std::vector<std::shared_ptr<Backend>> all_backends() {
  Registry& r = registry();
  std::lock_guard<std::recursive_mutex> lock(r.mu);
  load_plugins_locked(r);
  return r.backends;
}

std::vector<PluginFailure> plugin_failures() {
  Registry& r = registry();
  std::lock_guard<std::recursive_mutex> lock(r.mu);
  load_plugins_locked(r);
  std::vector<PluginFailure> out;
  for (auto& p : r.plugins)
    if (!p.backend) out.push_back({p.path, p.failure, p.kind, p.unavailable});
  return out;
}

Backend& backend_for(const Device& d) {
  Registry& r = registry();
  std::lock_guard<std::recursive_mutex> lock(r.mu);
  auto find = [&]() -> Backend* {
    for (auto& b : r.backends)
      if (b->name() == d.kind) return b.get();
    return nullptr;
  };
  Backend* b = find();
  if (!b && !r.plugins_loaded) {  // not built in: perhaps a plugin's
    load_plugins_locked(r);
    b = find();
  }
  if (b) {
    if (b->device_count() == 0 && !b->no_device_message().empty()) fail("device", b->no_device_message(), "");
    if (d.index < 0 || d.index >= b->device_count())
      fail("device", "'" + d.str() + "' does not exist; " + b->name() + " has " + std::to_string(b->device_count()) +
                         " device(s)", "");
    return *b;
  }
  std::string names;
  for (auto& x : r.backends) names += (names.empty() ? "" : ", ") + x->name();
  for (auto& p : r.plugins)
    if (!p.backend && p.kind == d.kind && !p.unavailable.empty())
      fail("device", d.kind + ": not available (" + p.unavailable + "; plugin " + p.path + "); available: " + names, "");
  for (auto& p : r.plugins)
    if (!p.backend && p.kind == d.kind)
      fail("device", "the " + d.kind + " backend's plugin " + p.path + " did not load: " + p.failure + "; available: " + names, "");
  std::string where;
  for (const std::string& dir : plugin_search_path()) where += (where.empty() ? "" : ", ") + dir;
  if (d.kind == "opencl")
    fail("device", "no OpenCL backend: its plugin libtessera-backend-opencl.so is not in " + where +
                   " (it is built where OpenCL is found: install ocl-icd-opencl-dev and opencl-headers, then "
                   "reconfigure); available: " + names, "");
  fail("device", "unknown device '" + d.str() + "'; available: " + names, "");
}

}  // namespace tessera::backends
