// A PJRT plugin loaded and its client created (pjrt_api.h declares the C API): loading checks the
// table's size and API version before any call; every error of the plugin becomes a
// tessera::Error "[pjrt] <what>: <the plugin's message>".
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pjrt_api.h"
#include "tessera/dtype.h"

namespace tessera::pjrt {

class Plugin;

// A buffer's element type and dimensions.
struct TensorType {
  api::ElementType element = api::ElementType::Invalid;
  std::vector<int64_t> dims;
  bool operator==(const TensorType& o) const { return element == o.element && dims == o.dims; }
  size_t nbytes() const;
};
TensorType tensor_type(DType t, const std::vector<int64_t>& dims);  // Tessera's dtypes as PJRT's

// A device buffer, destroyed with its owner. Immutable once made (PJRT buffers are): an
// allocation that changes gets a new one.
struct DeviceBuffer {
  const Plugin* plugin = nullptr;
  api::Buffer* buffer = nullptr;
  TensorType type;
  int device = 0;  // index among the plugin's devices
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();
  size_t nbytes() const { return type.nbytes(); }
  void to_host(void* dst) const;  // all of it; waits until the copy is done
};
using BufferPtr = std::shared_ptr<DeviceBuffer>;

// XLA's memory figures for a compiled program (PJRT_Executable_GetCompiledMemoryStats).
struct MemoryStats {
  bool known = false;
  int64_t code = 0, arguments = 0, outputs = 0, aliased = 0, temporaries = 0, peak = 0;
  std::string text() const;  // "XLA: peak 1.20 MiB (arguments ..., outputs ..., ...), code ..."
};

class LoadedProgram {
 public:
  LoadedProgram(const Plugin& p, api::LoadedExecutable* e) : plugin_(p), exe_(e) {}
  ~LoadedProgram();
  LoadedProgram(const LoadedProgram&) = delete;
  LoadedProgram& operator=(const LoadedProgram&) = delete;
  size_t num_outputs() const { return num_outputs_; }
  const MemoryStats& memory_stats() const { return stats_; }
  // Runs on `device` with these arguments; non_donatable: argument positions whose buffers must
  // survive even where the program aliases them to an output. Waits for the run to finish.
  std::vector<BufferPtr> execute(int device, const std::vector<api::Buffer*>& args, const std::vector<int64_t>& non_donatable,
                                 const std::vector<TensorType>& outputs) const;
  // Runs a program compiled for args.size() replicas once on each, replica r on device r with
  // args[r] (its collectives meet inside the plugin); per replica its outputs. Waits for all.
  std::vector<std::vector<BufferPtr>> execute_replicas(const std::vector<std::vector<api::Buffer*>>& args,
                                                       const std::vector<TensorType>& outputs) const;

 private:
  friend class Plugin;
  void describe();
  const Plugin& plugin_;
  api::LoadedExecutable* exe_;
  size_t num_outputs_ = 0;
  int64_t replicas_ = 1;  // compiled for
  MemoryStats stats_;
};

class Plugin {
 public:
  // Loads the shared library at `path`, checks its API table and creates a client. Throws
  // "[pjrt] <path>: <why>" (not a shared library, no GetPjrtApi, an incompatible API version,
  // the client cannot be created).
  // cpu_device_count > 0 asks the client for that many devices (XLA's CPU plugin's create option
  // "cpu_device_count"; other plugins may refuse it): replicas of one program run on them.
  static std::unique_ptr<Plugin> load(const std::string& path, int64_t cpu_device_count = 0);
  ~Plugin() = default;  // the library stays loaded and its client alive until the process exits

  const std::string& path() const { return path_; }
  const std::string& platform() const { return platform_; }  // "cpu", "cuda", "tpu" ...
  const std::string& platform_version() const { return platform_version_; }
  std::string api_version() const;  // "0.115"
  int device_count() const { return int(devices_.size()); }
  const std::string& device_kind(int i) const { return device_kinds_[size_t(i)]; }

  // Compiles MLIR text (StableHLO) for one device, or for `replicas` replicas (the module's
  // mhlo.num_replicas; devices 0..replicas-1); "[pjrt] compile failed: <XLA's message>".
  std::unique_ptr<LoadedProgram> compile(const std::string& mlir, int64_t replicas = 1) const;
  BufferPtr upload(int device, const void* data, const TensorType& t) const;
  BufferPtr copy_to_device(const DeviceBuffer& b, int device) const;

  // Throws "[pjrt] <what>: <message>" when e is an error (and frees it).
  void check(api::Error* e, const char* what) const;
  bool discard(api::Error* e) const;  // frees e; whether it was an error
  void await(api::Event* ev, const char* what) const;  // waits and frees; null: nothing to wait for
  const api::Api& api() const { return *api_; }
  api::Device* device(int i) const { return devices_[size_t(i)]; }

 private:
  Plugin() = default;
  std::string path_, platform_, platform_version_;
  const api::Api* api_ = nullptr;
  api::Client* client_ = nullptr;
  std::vector<api::Device*> devices_;
  std::vector<std::string> device_kinds_;
};

}  // namespace tessera::pjrt
