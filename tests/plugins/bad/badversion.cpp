// A plugin built for another backend interface version: the loader must report and skip it.
#include "backends/plugin.h"

extern "C" __attribute__((visibility("default"))) const TesseraBackendPlugin* tessera_backend_plugin(const char**) {
  static TesseraBackendPlugin t{};
  t.interface_version = tessera::backends::kInterfaceVersion - 1;
  t.cxx_abi = TESSERA_PLUGIN_CXX_ABI;
  return &t;
}
