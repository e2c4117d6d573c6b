// `tessera devices`: one line per registered device, then one per backend that cannot run here
// ("cuda: not available (<why>)") and one per plugin that did not load.
#include <algorithm>
#include <cstdio>
#include <string>

#include <tessera/tessera.h>

#include "commands.h"

namespace tessera::cli {

namespace {

void run_devices() {
  std::vector<DeviceInfo> infos = devices();
  size_t width = 6;  // "DEVICE"
  for (const DeviceInfo& d : infos) width = std::max(width, d.device.str().size());
  std::printf("%-*s  %-7s  %s\n", static_cast<int>(width), "DEVICE", "RUNS", "DESCRIPTION");
  for (const DeviceInfo& d : infos)
    std::printf("%-*s  %-7s  %s\n", static_cast<int>(width), d.device.str().c_str(),
                d.can_execute ? "yes" : "no", d.description.c_str());
  for (const std::string& u : unavailable_backends()) std::printf("%s\n", u.c_str());
  for (const std::string& e : plugin_errors()) std::printf("plugin not loaded: %s\n", e.c_str());
}

}  // namespace

void add_devices(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("devices", "List the registered devices and whether each can run programs");
  sub->callback(run_devices);
}

}  // namespace tessera::cli
