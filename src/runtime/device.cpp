#include "tessera/device.h"

#include "backends/backend.h"
#include "tessera/error.h"
#include "tessera/tensor.h"

namespace tessera {

static Device parse(const std::string& name) {
  auto colon = name.find(':');
  std::string kind = name.substr(0, colon);
  int index = 0;
  if (colon != std::string::npos) {
    std::string num = name.substr(colon + 1);
    bool ok = !num.empty() && num.size() < 6 && num.find_first_not_of("0123456789") == std::string::npos;
    if (!ok) fail("device", "bad device name '" + name + "'; expected KIND or KIND:INDEX, e.g. \"cpu:0\"", "");
    index = std::stoi(num);
  }
  if (kind.empty()) fail("device", "bad device name '" + name + "'", "");
  return Device(kind, index);
}

Device::Device(const char* name) : Device(std::string(name)) {}
Device::Device(const std::string& name) {
  Device d = parse(name);
  kind = d.kind;
  index = d.index;
}

std::string Device::str() const { return kind + ":" + std::to_string(index); }

Device Device::best() {
  for (auto& b : backends::all_backends())
    for (int i = 0; i < (b->can_execute() ? b->device_count() : 0); ++i)
      if (b->info(i).accelerator) return Device(b->name(), i);
  for (auto& b : backends::all_backends())
    if (b->can_execute() && b->device_count() > 0) return Device(b->name(), 0);
  fail("device", "no backend can execute programs", "");
}

std::vector<DeviceInfo> devices() {
  std::vector<DeviceInfo> r;
  for (auto& b : backends::all_backends())
    for (int i = 0; i < b->device_count(); ++i) r.push_back(b->info(i));
  return r;
}

const char* version() { return TESSERA_VERSION; }

}  // namespace tessera
