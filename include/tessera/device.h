// Device names: "cpu", "cpu:0", "null". Backends register themselves; the runtime looks them up.
#pragma once
#include <string>
#include <vector>

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera {

struct Device {
  std::string kind = "cpu";  // backend name
  int index = 0;

  Device() = default;
  Device(const char* name);         // NOLINT: implicit, so tensors take "cpu" where a Device fits
  Device(const std::string& name);  // NOLINT
  Device(std::string kind_, int index_) : kind(std::move(kind_)), index(index_) {}

  std::string str() const;  // "cpu:0"
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }

  // The best device that can run programs: the first accelerator (an OpenCL GPU), else "cpu";
  // an OpenCL device that is really the host CPU (PoCL) ranks below the native cpu backend.
  static Device best();
};

struct DeviceInfo {
  Device device;
  std::string description;  // one line: what it is, memory, threads
  bool can_execute = true;  // false for "null", which compiles but never runs
  bool accelerator = false; // a device other than the host CPU (ranked first by Device::best)
};

// Every registered device, in order of preference.
std::vector<DeviceInfo> devices();
// Backend plugins found but not loaded, one line each: "<file>: <why>" (an interface version
// mismatch, a library it needs missing). Plugins are libtessera-backend-<kind>.so files next to
// libtessera or in a directory of TESSERA_PLUGIN_PATH, loaded at the first device query that
// needs them.
std::vector<std::string> plugin_errors();
// Backends whose plugin is fine but that cannot run on this machine (no driver, no GPU), one line
// each: "<kind>: not available (<why>)", e.g. "cuda: not available (no NVIDIA driver: ...)".
std::vector<std::string> unavailable_backends();

}  // namespace tessera
#pragma GCC visibility pop
