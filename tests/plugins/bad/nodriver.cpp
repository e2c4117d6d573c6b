// A plugin whose backend cannot start here (as a GPU plugin on a machine without its driver).
#include "backends/plugin.h"

namespace {
std::shared_ptr<tessera::backends::Backend> no_backend(std::string* why_not) {
  *why_not = "no device driver found (a test plugin that never starts)";
  return nullptr;
}
}  // namespace

TESSERA_BACKEND_PLUGIN(no_backend)
