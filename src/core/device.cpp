// Device names (parsing and printing) and the library version.
#include "tessera/device.h"
#include "tessera/version.h"

#include "core/fail.h"

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

const char* version() { return TESSERA_VERSION; }

}  // namespace tessera
