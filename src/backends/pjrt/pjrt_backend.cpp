// The pjrt backend: Tessera programs compiled by XLA through PJRT C API plugins (pjrt_client.h).
// Each run of a program is one XLA executable: compile_executable emits the optimized graph as
// StableHLO (backends/stablehlo/emit.h) and compiles it with the plugin; run_executable executes
// it. Per-Step compile() accepts every Step (the runtime compiles them before offering the whole
// program) and launch() declines: profiling and Step hooks need another backend.
//
// Devices: pjrt:0, pjrt:1 ... number the plugins found -- the first device of each; XLA's CPU
// client refuses our single-device executables on its others ("ExecuteShard attempted to execute
// on device id 1 which is not addressable"), and using several is issue 25's -- in this order: the files
// of TESSERA_PJRT_PLUGINS (a ':' list), the build folder's (pjrt-plugins/*/*.so beside the lib/
// folder holding this library: where scripts/run unpacks XLA's CPU plugin), and jax's plugin
// packages (jax_plugins/*/*.so in Python's site-packages). Nothing is loaded until a device of
// the kind is asked for.
//
// Memory: allocate() hands out handles from a private address range (the runtime only adds
// offsets). An allocation holds its bytes either on the host (what copy_in wrote, waiting for a
// run to give them a dtype and shape) or as one PJRT buffer (a program's output, or a parameter
// uploaded by its first run), so parameters stay on the device between runs and outputs become
// the next run's inputs without a copy. Small parameters the runtime stages into the scalars
// buffer with copy_device keep pointing at their device buffers (`pieces`).
#include <dlfcn.h>
#include <glob.h>
#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "backends/backend.h"
#include "pjrt_client.h"
#include "backends/plugin.h"
#include "backends/stablehlo/emit.h"
#include "core/fail.h"
#include "ir/graph.h"

namespace tessera::backends {
namespace {

using pjrt::BufferPtr;
using pjrt::Plugin;

std::vector<std::string> glob_files(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g{};
  if (glob(pattern.c_str(), 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.push_back(g.gl_pathv[i]);
  globfree(&g);
  return out;
}

// The .so files one folder below `dir` (dir/*/x.so), sorted.
std::vector<std::string> plugins_below(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec, sub_ec;
  for (auto& sub : std::filesystem::directory_iterator(dir, ec))
    if (sub.is_directory(sub_ec))
      for (auto& f : std::filesystem::directory_iterator(sub.path(), sub_ec))
        if (f.path().extension() == ".so") out.push_back(f.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t b = 0;
  for (size_t e; (e = s.find(sep, b)) != std::string::npos; b = e + 1)
    if (e > b) out.push_back(s.substr(b, e - b));
  if (b < s.size()) out.push_back(s.substr(b));
  return out;
}

// The PJRT plugin files to try, in device-numbering order, each once.
std::vector<std::string> plugin_files() {
  std::vector<std::string> found = split(env("TESSERA_PJRT_PLUGINS"), ':');
  Dl_info self{};
  if (dladdr(reinterpret_cast<void*>(&plugin_files), &self) && self.dli_fname) {
    std::string dir = self.dli_fname;
    dir = dir.substr(0, dir.rfind('/') + 1);
    for (auto& f : plugins_below(dir + "../pjrt-plugins")) found.push_back(f);
  }
  std::vector<std::string> sites;
  for (const char* prefix : {"VIRTUAL_ENV", "CONDA_PREFIX"})
    if (!env(prefix).empty()) sites.push_back(env(prefix) + "/lib/python3*/site-packages");
  for (auto& p : split(env("PYTHONPATH"), ':')) sites.push_back(p);
  if (!env("HOME").empty()) sites.push_back(env("HOME") + "/.local/lib/python3*/site-packages");
  for (const char* s : {"/usr/local/lib/python3*/site-packages", "/usr/local/lib/python3*/dist-packages",
                        "/usr/lib/python3/dist-packages", "/usr/lib/python3*/site-packages", "/opt/conda/lib/python3*/site-packages"})
    sites.push_back(s);
  for (auto& s : sites)
    for (auto& site : glob_files(s))
      for (auto& f : plugins_below(site + "/jax_plugins")) found.push_back(f);
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (auto& f : found) {
    char real[PATH_MAX];
    std::string key = realpath(f.c_str(), real) ? real : f;
    if (seen.insert(key).second) out.push_back(key);
  }
  return out;
}

// A Step accepted by compile(), never launched on its own.
struct WholeOnly : Kernel {};

// A compiled program and how its arguments and results map to the runtime's slots.
struct PjrtExecutable : Executable {
  Plugin* plugin = nullptr;
  int device = 0;  // the plugin's device
  std::unique_ptr<pjrt::LoadedProgram> program;
  std::shared_ptr<const stablehlo::Program> emitted;
  std::vector<int> param_slots, output_slots;
  std::vector<pjrt::TensorType> params, results;  // @main's arguments (without the RNG state) and results
  std::vector<bool> aliased;                      // per parameter: donated to an output
};

// An allocation: bytes on the host, and device buffers holding some byte ranges (`pieces`, by
// offset: a tensor's bytes, which the runtime places at an offset in a rounded-up block). Where a
// piece lies it holds the bytes; the host vector holds the rest (allocated when first needed).
struct Alloc {
  size_t nbytes = 0;
  std::vector<char> host;
  std::map<size_t, BufferPtr> pieces;
  size_t written_lo = SIZE_MAX, written_hi = 0;  // bytes copy_in wrote on the host: [lo, hi)
};

std::vector<int64_t> dims_of(const Shape& s) { return std::vector<int64_t>(s.begin(), s.end()); }

class PjrtBackend : public Backend {
 public:
  std::string name() const override { return "pjrt"; }
  int device_count() const override { return int(discover().size()); }
  DeviceInfo info(int index) const override;
  std::string no_device_message() const override {
    discover();
    std::string s = "[device] no PJRT plugin found; set TESSERA_PJRT_PLUGINS to a plugin's path (scripts/run fetches XLA's CPU "
                    "plugin into the build folder)";
    for (auto& f : failures_) s += "; not loaded: " + f;
    return s;
  }

  void* allocate(int, size_t nbytes) override {
    uintptr_t at = next_;
    next_ += (std::max<size_t>(nbytes, 1) + 255) / 256 * 256;
    allocs_[at].nbytes = nbytes;
    return reinterpret_cast<void*>(at);
  }
  void free(int, void* ptr, size_t) override { allocs_.erase(reinterpret_cast<uintptr_t>(ptr)); }
  void copy_in(void* dst, const void* host, size_t n) override {
    auto [a, off] = resolve(dst, n);
    if (!n) return;
    std::memcpy(settle(a, off, n, true) + off, host, n);
    a.written_lo = std::min(a.written_lo, off);
    a.written_hi = std::max(a.written_hi, off + n);
  }
  void copy_out(void* host, const void* src, size_t n) override {
    auto [a, off] = resolve(src, n);
    auto piece = a.pieces.find(off);
    if (piece != a.pieces.end() && piece->second->nbytes() == n) return piece->second->to_host(host);
    if (n) std::memcpy(host, settle(a, off, n, false) + off, n);
  }
  void copy_device(void* dst, int dst_index, const void* src, int src_index, size_t n) override;

  std::unique_ptr<Kernel> compile(const kir::Step&) override { return std::make_unique<WholeOnly>(); }
  void launch(const Kernel&, const kir::Step& st, const LaunchArgs&) override {
    fail("pjrt", "pjrt runs whole programs through XLA: a Step cannot be launched on its own (" + st.str() +
                     "); profiling, TESSERA_STEP_TIMES and Step hooks need another backend", "");
  }
  void synchronize() override {
    // The index checks of the last run: the status word backend.h lets synchronize() read.
    std::vector<BufferPtr> checks = std::move(pending_checks_);
    pending_checks_.clear();
    std::vector<int64_t> values;
    for (auto& c : checks) {
      int64_t v[2];
      c->to_host(v);
      values.insert(values.end(), v, v + 2);
    }
    if (!values.empty()) stablehlo::raise_index_errors(*checks_of_, values);
  }

  std::unique_ptr<Executable> compile_executable(const ExecutableSpec& spec) override;
  void run_executable(Executable& exe, const RunArgs& args) override;

 private:
  // Finds every plugin once; the list of (plugin, its device) per device index.
  const std::vector<std::pair<Plugin*, int>>& discover() const {
    if (discovered_) return devices_;
    discovered_ = true;
    for (const std::string& f : plugin_files()) {
      try {
        plugins_.push_back(Plugin::load(f));
        if (plugins_.back()->device_count() > 0) devices_.push_back({plugins_.back().get(), 0});
      } catch (const std::exception& e) {
        failures_.push_back(e.what());
      }
    }
    return devices_;
  }
  std::pair<Plugin*, int> device(int index) const {
    const auto& d = discover();
    if (index < 0 || size_t(index) >= d.size())
      fail("device", "no device pjrt:" + std::to_string(index) + " (" + std::to_string(d.size()) + " PJRT devices)", "");
    return d[size_t(index)];
  }
  std::pair<Alloc&, size_t> resolve(const void* p, size_t n) {
    auto at = reinterpret_cast<uintptr_t>(p);
    auto it = allocs_.upper_bound(at);
    if (it == allocs_.begin() || at + n > std::prev(it)->first + std::prev(it)->second.nbytes)
      fail("pjrt", "an address that is not inside a pjrt allocation", "");
    --it;
    return {it->second, at - it->first};
  }
  // The host bytes with [off, off + n) current: pieces overlapping it are dropped, their bytes
  // brought to the host first unless `overwritten`. A write that covers only part of a piece
  // means the runtime's caching allocator handed the block to another tensor (nothing else
  // writes part of a live tensor), so the old piece is dead and is dropped unread.
  char* settle(Alloc& a, size_t off, size_t n, bool overwritten) {
    if (a.host.size() != a.nbytes) a.host.resize(a.nbytes);
    for (auto it = a.pieces.begin(); it != a.pieces.end();) {
      size_t b = it->first, e = b + it->second->nbytes();
      if (b >= off + n || e <= off) {
        ++it;
        continue;
      }
      if (!overwritten) {
        it->second->to_host(a.host.data() + b);
        report_host_transfer("pjrt", int64_t(e - b));
      }
      it = a.pieces.erase(it);
    }
    return a.host.data();
  }
  // Makes `b` the bytes at [off, off + b's size) (dropping the pieces it overlaps, as settle()).
  void place(Alloc& a, size_t off, BufferPtr b) {
    size_t n = b->nbytes();
    for (auto it = a.pieces.begin(); it != a.pieces.end();)
      it = it->first >= off + n || it->first + it->second->nbytes() <= off ? std::next(it) : a.pieces.erase(it);
    a.pieces[off] = std::move(b);
    if (off <= a.written_lo && a.written_hi <= off + n) {  // the host holds nothing else anyone wrote
      a.host.clear();
      a.host.shrink_to_fit();
      a.written_lo = SIZE_MAX, a.written_hi = 0;
    }
  }
  // The device buffer for argument t read at p: the piece there, or the bytes there uploaded
  // (and kept as a piece, so a parameter stays on the device).
  BufferPtr argument(const PjrtExecutable& x, const void* p, const pjrt::TensorType& t) {
    size_t nbytes = t.nbytes();
    auto [a, off] = resolve(p, nbytes);
    auto piece = a.pieces.find(off);
    if (piece != a.pieces.end()) {
      const BufferPtr& b = piece->second;
      if (b->type == t && b->device == x.device) return b;
    }
    BufferPtr b = x.plugin->upload(x.device, settle(a, off, nbytes, false) + off, t);
    place(a, off, b);
    return b;
  }

  mutable bool discovered_ = false;
  mutable std::vector<std::unique_ptr<Plugin>> plugins_;
  mutable std::vector<std::pair<Plugin*, int>> devices_;
  mutable std::vector<std::string> failures_;
  std::map<int, pjrt::MemoryStats> last_stats_;
  std::map<uintptr_t, Alloc> allocs_;
  uintptr_t next_ = uintptr_t(1) << 44;
  std::vector<BufferPtr> pending_checks_;
  std::shared_ptr<const stablehlo::Program> checks_of_;  // the program pending_checks_ came from
};

DeviceInfo PjrtBackend::info(int index) const {
  auto [p, d] = device(index);
  std::string s = "XLA " + p->platform() + " device " + std::to_string(d) + " of " + std::to_string(p->device_count()) + " (" +
                  p->device_kind(d) + ") through PJRT " + p->api_version() + ", plugin " + p->path();
  if (!p->platform_version().empty() && p->platform_version() != p->platform()) s += ", " + p->platform_version();
  auto it = last_stats_.find(index);
  if (it != last_stats_.end() && it->second.known) s += "; the last program compiled: " + it->second.text();
  if (index == 0)
    for (auto& f : failures_) s += "; not loaded: " + f;
  return {Device("pjrt", index), s, true, p->platform() != "cpu"};
}

void PjrtBackend::copy_device(void* dst, int dst_index, const void* src, int src_index, size_t n) {
  auto [s, soff] = resolve(src, n);
  auto [d, doff] = resolve(dst, n);
  auto piece = s.pieces.find(soff);
  auto [dp, dd] = device(dst_index);
  auto [sp, sd] = device(src_index);
  if (piece != s.pieces.end() && piece->second->nbytes() == n && dp == sp) {
    // A tensor's device buffer: shared (buffers are immutable), or copied to the other device.
    place(d, doff, dd == sd ? piece->second : dp->copy_to_device(*piece->second, dd));
    return;
  }
  // Bytes still on the host (written, never yet given a dtype by a run) move on the host; a
  // device buffer's bytes come over first (settle() reports them).
  std::vector<char> tmp(n);
  copy_out(tmp.data(), src, n);
  copy_in(dst, tmp.data(), n);
}

std::unique_ptr<Executable> PjrtBackend::compile_executable(const ExecutableSpec& spec) {
  auto x = std::make_unique<PjrtExecutable>();
  std::tie(x->plugin, x->device) = device(spec.device);
  const ir::Graph& g = *spec.graph;
  stablehlo::EmitOptions o;
  for (size_t k = 0; k < spec.donated.size(); ++k)
    if (spec.donated[k] >= 0) o.aliases.push_back({spec.donated[k], int(k)});
  x->emitted = std::make_shared<const stablehlo::Program>(stablehlo::emit(g, o));
  if (x->emitted->replicas > 1)  // the runtime refuses these first: pjrt declares no Target::collectives
    fail("pjrt", "a graph with collectives for " + std::to_string(x->emitted->replicas) +
                     " ranks: the pjrt backend runs one device's program (its StableHLO runs on replicas through the plugin itself)", "");
  x->program = x->plugin->compile(x->emitted->text);
  pjrt::MemoryStats stats = x->program->memory_stats();
  last_stats_[spec.device] = stats;
  if (spec.memory_report && stats.known) *spec.memory_report = stats.text();
  x->param_slots = spec.param_slots;
  x->output_slots = spec.output_slots;
  auto type_of = [&](int node) { return pjrt::tensor_type(g.nodes[size_t(node)]->dtype, dims_of(g.nodes[size_t(node)]->shape)); };
  for (int p : g.params) x->params.push_back(type_of(p));
  for (int o : g.outputs) x->results.push_back(type_of(o));
  for (size_t k = 0; k < x->emitted->index_checks.size(); ++k) x->results.push_back({pjrt::api::ElementType::S64, {2}});
  x->aliased.assign(g.params.size(), false);
  for (auto [p, k] : o.aliases) x->aliased[size_t(p)] = true;
  size_t n = x->program->num_outputs();
  if (n != x->results.size())
    fail("pjrt", "the compiled program has " + std::to_string(n) + " results where " + std::to_string(x->results.size()) +
                     " were emitted", "");
  return x;
}

void PjrtBackend::run_executable(Executable& e, const RunArgs& args) {
  auto& x = static_cast<PjrtExecutable&>(e);
  std::vector<BufferPtr> bufs;
  for (size_t p = 0; p < x.params.size(); ++p) bufs.push_back(argument(x, args.slots[x.param_slots[p]], x.params[p]));
  if (x.emitted->rng) bufs.push_back(argument(x, args.scalars, {pjrt::api::ElementType::U64, {2}}));  // RunScalars {seed, offset}
  // A donated buffer that something else still holds (another allocation or argument) must
  // survive the run: XLA then copies instead of writing in place.
  std::vector<int64_t> keep;
  std::vector<pjrt::api::Buffer*> raw;
  for (size_t i = 0; i < bufs.size(); ++i) {
    raw.push_back(bufs[i]->buffer);
    long here = std::count(bufs.begin(), bufs.end(), bufs[i]);
    if (i < x.aliased.size() && x.aliased[i] && (here > 1 || bufs[i].use_count() > here + 1)) keep.push_back(int64_t(i));
  }
  std::vector<BufferPtr> outs = x.program->execute(x.device, raw, keep, x.results);
  bufs.clear();
  for (size_t k = 0; k < x.output_slots.size(); ++k) {
    auto [a, off] = resolve(args.slots[x.output_slots[k]], outs[k]->nbytes());
    place(a, off, outs[k]);
  }
  pending_checks_.assign(outs.begin() + long(x.output_slots.size()), outs.end());
  checks_of_ = x.emitted;
}

std::shared_ptr<Backend> make_pjrt_backend(std::string*) { return std::make_shared<PjrtBackend>(); }

}  // namespace
}  // namespace tessera::backends

TESSERA_BACKEND_PLUGIN(tessera::backends::make_pjrt_backend)
