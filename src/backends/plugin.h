// Backend plugins: a backend in its own shared library, loaded by libtessera when a program first
// asks for a device kind that is not built in (or for every device: `tessera devices`).
//
// A plugin exports one C function, `tessera_backend_plugin`, returning its table: the interface
// version it was built for and one C function per Backend method (backend.h). Nothing else
// crosses the boundary: no C++ exception (each function returns a status; the message of a
// failure is read with last_error), no symbol of the plugin's own. The SDK types (kir::Step,
// kir::Target, DeviceInfo ...) are passed by pointer, so a plugin must be built against the SDK
// of the same interface version with a compatible C++ compiler (the table records the C++ ABI).
//
// Writing one: implement a tessera::backends::Backend subclass as for a built-in backend, then
//   TESSERA_BACKEND_PLUGIN(make_my_backend)   // std::shared_ptr<Backend> make_my_backend(std::string* why_not)
// in one source file of the plugin. make_my_backend may return null with a reason (no driver):
// the loader reports it in `tessera devices`. Build it as a MODULE library named
// libtessera-backend-<name>.so that does not link libtessera (the SDK's symbols come from the
// process: libtessera.so, or an executable that links the library statically and exports them),
// and put it next to libtessera.so or in a directory of TESSERA_PLUGIN_PATH.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"

#pragma GCC visibility push(default)  // the backend SDK: exported for plugins
extern "C" {

// The C++ ABI a plugin was built with; the loader refuses a table whose tag differs.
#define TESSERA_PLUGIN_CXX_ABI (__GXX_ABI_VERSION * 10 + _GLIBCXX_USE_CXX11_ABI)

// Every function returns 0 on success; otherwise last_error(self) holds the message (with the
// op first, as tessera::Error's) until the next call. `self` is the plugin's backend.
struct TesseraBackendPlugin {
  int32_t interface_version;  // tessera::backends::kInterfaceVersion of the SDK it was built with
  int32_t cxx_abi;            // TESSERA_PLUGIN_CXX_ABI
  void* self;
  const char* (*last_error)(void* self);
  void (*destroy)(void* self);

  int (*name)(void* self, std::string* out);
  int (*device_count)(void* self, int* out);
  int (*info)(void* self, int index, tessera::DeviceInfo* out);
  int (*can_execute)(void* self, bool* out);
  int (*properties)(void* self, int index, tessera::kir::Target* out);
  int (*no_device_message)(void* self, std::string* out);

  int (*allocate)(void* self, int index, size_t nbytes, void** out);
  int (*free)(void* self, int index, void* ptr, size_t nbytes);
  int (*copy_in)(void* self, void* dst, const void* host, size_t nbytes);
  int (*copy_out)(void* self, void* host, const void* src, size_t nbytes);

  // Kernels, executables and events are the plugin's objects; the host destroys them with
  // destroy_kernel / destroy_executable / destroy_event.
  int (*compile)(void* self, const tessera::kir::Step* step, tessera::backends::Kernel** out);
  int (*launch)(void* self, const tessera::backends::Kernel* k, const tessera::kir::Step* step,
                const tessera::backends::LaunchArgs* args);
  int (*synchronize)(void* self);
  int (*claim)(void* self, const tessera::kir::Step* step, int device, tessera::backends::Claim* out);
  int (*compile_library)(void* self, const tessera::kir::Step* step, tessera::backends::Kernel** out);
  void (*destroy_kernel)(void* self, tessera::backends::Kernel* k);

  // spec->kernels are this plugin's kernels. *out may be null: declined.
  int (*compile_executable)(void* self, const tessera::backends::ExecutableSpec* spec, tessera::backends::Executable** out);
  int (*run_executable)(void* self, tessera::backends::Executable* exe, const tessera::backends::RunArgs* args);
  void (*destroy_executable)(void* self, tessera::backends::Executable* exe);

  int (*async_copies)(void* self, bool* out);
  int (*copy_in_async)(void* self, void* dst, const void* host, size_t nbytes);
  int (*copy_out_async)(void* self, void* host, const void* src, size_t nbytes);
  int (*copy_device)(void* self, void* dst, int dst_index, const void* src, int src_index, size_t nbytes);
  int (*record_event)(void* self, int index, tessera::backends::Event** out);  // *out may be null
  int (*event_done)(void* self, const tessera::backends::Event* e, bool* out);
  int (*wait_event)(void* self, const tessera::backends::Event* e);
  void (*destroy_event)(void* self, tessera::backends::Event* e);
};

// The one symbol a plugin exports. Returns null when the backend cannot start here (then
// *why_not holds the reason, valid until the library is unloaded).
typedef const TesseraBackendPlugin* (*TesseraBackendPluginEntry)(const char** why_not);
#define TESSERA_BACKEND_PLUGIN_SYMBOL "tessera_backend_plugin"

}  // extern "C"
#pragma GCC visibility pop

namespace tessera::backends {

// The plugin side, compiled into each plugin (hidden there): a C table over a C++ Backend, every
// call guarded so that an exception becomes a status and a message.
class __attribute__((visibility("hidden"))) PluginExport {
 public:
  explicit PluginExport(std::shared_ptr<Backend> b);
  const TesseraBackendPlugin* table() const { return &table_; }

 private:
  std::shared_ptr<Backend> backend_;
  std::string error_;
  TesseraBackendPlugin table_{};
  // Runs f(backend); an exception's message goes to error_ and the status is 1.
  template <class F>
  static int guard(void* self, F&& f) {
    auto* p = static_cast<PluginExport*>(self);
    try {
      f(*p->backend_);
      return 0;
    } catch (const std::exception& e) {
      p->error_ = e.what();
    } catch (...) {
      p->error_ = "[plugin] unknown exception";
    }
    return 1;
  }
};

inline PluginExport::PluginExport(std::shared_ptr<Backend> b) : backend_(std::move(b)) {
  using kir::Step;
  TesseraBackendPlugin& t = table_;
  t.interface_version = kInterfaceVersion;
  t.cxx_abi = TESSERA_PLUGIN_CXX_ABI;
  t.self = this;
  t.last_error = [](void* self) { return static_cast<PluginExport*>(self)->error_.c_str(); };
  t.destroy = [](void* self) { static_cast<PluginExport*>(self)->backend_.reset(); };
  t.name = [](void* s, std::string* o) { return guard(s, [&](Backend& b) { *o = b.name(); }); };
  t.device_count = [](void* s, int* o) { return guard(s, [&](Backend& b) { *o = b.device_count(); }); };
  t.info = [](void* s, int i, DeviceInfo* o) { return guard(s, [&](Backend& b) { *o = b.info(i); }); };
  t.can_execute = [](void* s, bool* o) { return guard(s, [&](Backend& b) { *o = b.can_execute(); }); };
  t.properties = [](void* s, int i, kir::Target* o) { return guard(s, [&](Backend& b) { *o = b.properties(i); }); };
  t.no_device_message = [](void* s, std::string* o) { return guard(s, [&](Backend& b) { *o = b.no_device_message(); }); };
  t.allocate = [](void* s, int i, size_t n, void** o) { return guard(s, [&](Backend& b) { *o = b.allocate(i, n); }); };
  t.free = [](void* s, int i, void* p, size_t n) { return guard(s, [&](Backend& b) { b.free(i, p, n); }); };
  t.copy_in = [](void* s, void* d, const void* h, size_t n) { return guard(s, [&](Backend& b) { b.copy_in(d, h, n); }); };
  t.copy_out = [](void* s, void* h, const void* d, size_t n) { return guard(s, [&](Backend& b) { b.copy_out(h, d, n); }); };
  t.compile = [](void* s, const Step* st, Kernel** o) { return guard(s, [&](Backend& b) { *o = b.compile(*st).release(); }); };
  t.launch = [](void* s, const Kernel* k, const Step* st, const LaunchArgs* a) {
    return guard(s, [&](Backend& b) { b.launch(*k, *st, *a); });
  };
  t.synchronize = [](void* s) { return guard(s, [&](Backend& b) { b.synchronize(); }); };
  t.claim = [](void* s, const Step* st, int d, Claim* o) { return guard(s, [&](Backend& b) { *o = b.claim(*st, d); }); };
  t.compile_library = [](void* s, const Step* st, Kernel** o) {
    return guard(s, [&](Backend& b) { *o = b.compile_library(*st).release(); });
  };
  t.destroy_kernel = [](void*, Kernel* k) { delete k; };
  t.compile_executable = [](void* s, const ExecutableSpec* spec, Executable** o) {
    return guard(s, [&](Backend& b) { *o = b.compile_executable(*spec).release(); });
  };
  t.run_executable = [](void* s, Executable* e, const RunArgs* a) { return guard(s, [&](Backend& b) { b.run_executable(*e, *a); }); };
  t.destroy_executable = [](void*, Executable* e) { delete e; };
  t.async_copies = [](void* s, bool* o) { return guard(s, [&](Backend& b) { *o = b.async_copies(); }); };
  t.copy_in_async = [](void* s, void* d, const void* h, size_t n) { return guard(s, [&](Backend& b) { b.copy_in_async(d, h, n); }); };
  t.copy_out_async = [](void* s, void* h, const void* d, size_t n) { return guard(s, [&](Backend& b) { b.copy_out_async(h, d, n); }); };
  t.copy_device = [](void* s, void* d, int di, const void* src, int si, size_t n) {
    return guard(s, [&](Backend& b) { b.copy_device(d, di, src, si, n); });
  };
  t.record_event = [](void* s, int i, Event** o) { return guard(s, [&](Backend& b) { *o = b.record_event(i).release(); }); };
  t.event_done = [](void* s, const Event* e, bool* o) { return guard(s, [&](Backend& b) { *o = b.event_done(*e); }); };
  t.wait_event = [](void* s, const Event* e) { return guard(s, [&](Backend& b) { b.wait_event(*e); }); };
  t.destroy_event = [](void*, Event* e) { delete e; };
}

}  // namespace tessera::backends

// One line in a plugin's source: defines the exported entry point around `factory`, a function
// std::shared_ptr<tessera::backends::Backend>(std::string* why_not). The backend lives until the
// process exits (the library is never unloaded, and nothing is torn down at exit, so no static
// destructor of the host can reach a backend already destroyed).
#define TESSERA_BACKEND_PLUGIN(factory)                                                          \
  extern "C" __attribute__((visibility("default"))) const TesseraBackendPlugin* tessera_backend_plugin( \
      const char** why_not) {                                                                    \
    static std::string reason;                                                                   \
    static tessera::backends::PluginExport* exported = nullptr; /* never destroyed (above) */ \
    if (!exported) {                                                                             \
      std::shared_ptr<tessera::backends::Backend> b;                                             \
      try {                                                                                      \
        b = factory(&reason);                                                                    \
      } catch (const std::exception& e) {                                                        \
        reason = e.what();                                                                       \
      }                                                                                          \
      if (!b) {                                                                                  \
        if (why_not) *why_not = reason.c_str();                                                  \
        return nullptr;                                                                          \
      }                                                                                          \
      exported = new tessera::backends::PluginExport(std::move(b));                              \
    }                                                                                            \
    return exported->table();                                                                    \
  }

