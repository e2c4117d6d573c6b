// Device::best() and devices(): the registered backends' devices.
#include "backends/backend.h"
#include "core/fail.h"
#include "tessera/device.h"

namespace tessera {

Device Device::best() {
  for (auto& b : backends::all_backends())
    for (int i = 0; i < (b->can_execute() ? b->device_count() : 0); ++i)
      if (b->info(i).accelerator) return Device(b->name(), i);
  for (auto& b : backends::all_backends())
    if (b->can_execute() && b->device_count() > 0) return Device(b->name(), 0);
  fail("device", "no backend can execute programs", "");
}

std::vector<std::string> plugin_errors() {
  std::vector<std::string> out;
  for (auto& f : backends::plugin_failures())
    if (f.unavailable.empty()) out.push_back(f.path + ": " + f.reason);
  return out;
}

std::vector<std::string> unavailable_backends() {
  std::vector<std::string> out;
  for (auto& f : backends::plugin_failures())
    if (!f.unavailable.empty()) out.push_back(f.kind + ": not available (" + f.unavailable + ")");
  return out;
}

std::vector<DeviceInfo> devices() {
  std::vector<DeviceInfo> r;
  for (auto& b : backends::all_backends())
    for (int i = 0; i < b->device_count(); ++i) r.push_back(b->info(i));
  return r;
}

}  // namespace tessera
