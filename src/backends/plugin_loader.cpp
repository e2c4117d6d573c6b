// Loading backend plugins (backends/plugin.h): finding libtessera-backend-*.so files, checking
// their table, and a Backend over the table that turns a status and message back into
// tessera::Error.
#include "backends/plugin_loader.h"

#include <dirent.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>

#include "backends/plugin.h"
#include "core/fail.h"

namespace tessera::backends {
namespace {

class PluginBackend final : public Backend {
 public:
  PluginBackend(const TesseraBackendPlugin* t, std::string name) : t_(t), name_(std::move(name)) {}

  std::string name() const override { return name_; }
  int device_count() const override { return get<int>(t_->device_count); }
  DeviceInfo info(int index) const override {
    DeviceInfo d;
    check(t_->info(t_->self, index, &d));
    return d;
  }
  bool can_execute() const override { return get<bool>(t_->can_execute); }
  kir::Target properties(int index) const override {
    kir::Target tg;
    check(t_->properties(t_->self, index, &tg));
    return tg;
  }
  std::string no_device_message() const override { return get<std::string>(t_->no_device_message); }

  void* allocate(int index, size_t nbytes) override {
    void* p = nullptr;
    check(t_->allocate(t_->self, index, nbytes, &p));
    return p;
  }
  void free(int index, void* ptr, size_t nbytes) override { check(t_->free(t_->self, index, ptr, nbytes)); }
  void copy_in(void* dst, const void* host, size_t n) override { check(t_->copy_in(t_->self, dst, host, n)); }
  void copy_out(void* host, const void* src, size_t n) override { check(t_->copy_out(t_->self, host, src, n)); }

  std::unique_ptr<Kernel> compile(const kir::Step& st) override { return wrap(t_->compile, st); }
  void launch(const Kernel& k, const kir::Step& st, const LaunchArgs& a) override {
    check(t_->launch(t_->self, inner(k), &st, &a));
  }
  void synchronize() override { check(t_->synchronize(t_->self)); }
  Claim claim(const kir::Step& st, int device) override {
    Claim c;
    check(t_->claim(t_->self, &st, device, &c));
    return c;
  }
  std::unique_ptr<Kernel> compile_library(const kir::Step& st) override { return wrap(t_->compile_library, st); }

  std::unique_ptr<Executable> compile_executable(const ExecutableSpec& spec) override {
    ExecutableSpec mine = spec;  // the plugin sees its own kernels
    for (const Kernel*& k : mine.kernels) k = inner(*k);
    Executable* e = nullptr;
    check(t_->compile_executable(t_->self, &mine, &e));
    return e ? std::make_unique<Handle<Executable>>(t_, e, t_->destroy_executable) : nullptr;
  }
  void run_executable(Executable& e, const RunArgs& a) override {
    check(t_->run_executable(t_->self, static_cast<Handle<Executable>&>(e).inner, &a));
  }

  bool async_copies() const override { return get<bool>(t_->async_copies); }
  void copy_in_async(void* dst, const void* host, size_t n) override { check(t_->copy_in_async(t_->self, dst, host, n)); }
  void copy_out_async(void* host, const void* src, size_t n) override { check(t_->copy_out_async(t_->self, host, src, n)); }
  void copy_device(void* dst, int di, const void* src, int si, size_t n) override {
    check(t_->copy_device(t_->self, dst, di, src, si, n));
  }
  std::unique_ptr<Event> record_event(int index) override {
    Event* e = nullptr;
    check(t_->record_event(t_->self, index, &e));
    return e ? std::make_unique<Handle<Event>>(t_, e, t_->destroy_event) : nullptr;
  }
  bool event_done(const Event& e) override {
    bool done = true;
    check(t_->event_done(t_->self, static_cast<const Handle<Event>&>(e).inner, &done));
    return done;
  }
  void wait_event(const Event& e) override { check(t_->wait_event(t_->self, static_cast<const Handle<Event>&>(e).inner)); }

 private:
  // The host's handle on one of the plugin's objects, destroyed through the table.
  template <class T>
  struct Handle final : T {
    Handle(const TesseraBackendPlugin* t, T* p, void (*destroy)(void*, T*)) : t(t), inner(p), destroy(destroy) {}
    ~Handle() override { destroy(t->self, inner); }
    const TesseraBackendPlugin* t;
    T* inner;
    void (*destroy)(void*, T*);
  };

  const TesseraBackendPlugin* t_;
  std::string name_;

  void check(int status) const {
    if (status) throw Error(t_->last_error(t_->self));
  }
  template <class T, class F>
  T get(F fn) const {
    T v{};
    check(fn(t_->self, &v));
    return v;
  }
  static const Kernel* inner(const Kernel& k) { return static_cast<const Handle<Kernel>&>(k).inner; }
  std::unique_ptr<Kernel> wrap(int (*fn)(void*, const kir::Step*, Kernel**), const kir::Step& st) {
    Kernel* k = nullptr;
    check(fn(t_->self, &st, &k));
    if (!k) fail(name_, "the plugin compiled no kernel for " + st.str(), "");
    return std::make_unique<Handle<Kernel>>(t_, k, t_->destroy_kernel);
  }
};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
std::string dir_of(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// The module (libtessera.so, or an executable that links the library statically) holding this code.
std::string own_module() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&plugin_search_path), &info) && info.dli_fname) return info.dli_fname;
  return "";
}

}  // namespace

const char* const kPluginPrefix = "libtessera-backend-";

std::vector<std::string> plugin_search_path() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("TESSERA_PLUGIN_PATH")) {
    std::string p = env;
    for (size_t a = 0; a <= p.size();) {
      size_t b = p.find(':', a);
      if (b == std::string::npos) b = p.size();
      if (b > a) dirs.push_back(p.substr(a, b - a));
      a = b + 1;
    }
  }
  std::string here = own_module();
  if (!here.empty()) {
    std::string d = dir_of(here);
    for (const std::string& c : {d, d + "/../lib", d + "/../../lib"})
      if (std::find(dirs.begin(), dirs.end(), c) == dirs.end()) dirs.push_back(c);
  }
  return dirs;
}

std::vector<LoadedPlugin> load_plugins(const std::vector<std::string>& taken_names) {
  // A plugin resolves the SDK's symbols against the process: make sure this module's are
  // global even when it was itself loaded with RTLD_LOCAL (a Python extension's dependency).
  if (std::string self = own_module(); !self.empty()) dlopen(self.c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);

  std::vector<LoadedPlugin> out;
  std::vector<std::string> names = taken_names, seen_files;
  for (const std::string& dir : plugin_search_path()) {
    DIR* d = opendir(dir.c_str());
    if (!d) continue;
    std::vector<std::string> files;
    while (dirent* e = readdir(d)) {
      std::string f = e->d_name;
      if (f.rfind(kPluginPrefix, 0) == 0 && ends_with(f, ".so")) files.push_back(f);
    }
    closedir(d);
    std::sort(files.begin(), files.end());
    for (const std::string& f : files) {
      if (std::find(seen_files.begin(), seen_files.end(), f) != seen_files.end()) continue;  // first on the path wins
      seen_files.push_back(f);
      LoadedPlugin p;
      p.path = dir + "/" + f;
      p.kind = f.substr(std::string(kPluginPrefix).size(), f.size() - std::string(kPluginPrefix).size() - 3);
      out.push_back(p);
      LoadedPlugin& r = out.back();
      void* lib = dlopen(r.path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
      if (!lib) {
        const char* why = dlerror();
        r.failure = std::string("cannot load it: ") + (why ? why : "unknown dlopen error");
        continue;
      }
      auto entry = reinterpret_cast<TesseraBackendPluginEntry>(dlsym(lib, TESSERA_BACKEND_PLUGIN_SYMBOL));
      if (!entry) {
        r.failure = std::string("it does not export ") + TESSERA_BACKEND_PLUGIN_SYMBOL + " (not a Tessera backend plugin)";
        continue;
      }
      const char* why_not = nullptr;
      const TesseraBackendPlugin* t = entry(&why_not);
      if (!t) {
        r.unavailable = why_not && *why_not ? why_not : "no reason given";
        r.failure = "the backend cannot start here: " + r.unavailable;
        continue;
      }
      if (t->interface_version != kInterfaceVersion) {
        r.failure = "built for backend interface version " + std::to_string(t->interface_version) +
                    "; this libtessera speaks version " + std::to_string(kInterfaceVersion) + " (rebuild the plugin)";
        continue;
      }
      if (t->cxx_abi != TESSERA_PLUGIN_CXX_ABI) {
        r.failure = "built with another C++ ABI (" + std::to_string(t->cxx_abi) + ", this libtessera: " +
                    std::to_string(TESSERA_PLUGIN_CXX_ABI) + ")";
        continue;
      }
      std::string name;
      if (t->name(t->self, &name) != 0) {
        r.failure = std::string("its name() failed: ") + t->last_error(t->self);
        continue;
      }
      if (std::find(names.begin(), names.end(), name) != names.end()) {
        r.failure = "a backend named '" + name + "' is already registered";
        continue;
      }
      names.push_back(name);
      r.kind = name;
      r.backend = std::make_shared<PluginBackend>(t, name);
    }
  }
  return out;
}

}  // namespace tessera::backends
