// Finding and loading backend plugins (the registry calls this once, at the first lookup that
// needs them; backends/plugin.h is the plugins' side).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"

namespace tessera::backends {

extern const char* const kPluginPrefix;  // plugins are files <dir>/libtessera-backend-<kind>.so

// Where plugins are looked for, in order: each directory of TESSERA_PLUGIN_PATH (':'-separated),
// then the directory of the module holding libtessera's code (libtessera.so, or an executable
// that links it statically) and its ../lib and ../../lib (a build tree's tools and tests).
std::vector<std::string> plugin_search_path();

struct LoadedPlugin {
  std::string path;
  std::string kind;                  // the backend's name (from the file name until it loads)
  std::shared_ptr<Backend> backend;  // null when it failed
  std::string failure;               // why it failed
  std::string unavailable;           // when its backend cannot start here: the backend's reason (no driver, no GPU)
};

// Loads every plugin on the search path (the first file of a name wins), refusing those whose
// interface version or C++ ABI differs and those whose backend name is in taken_names or came
// earlier. Never throws for a bad plugin: it is reported in LoadedPlugin::failure.
std::vector<LoadedPlugin> load_plugins(const std::vector<std::string>& taken_names);

}  // namespace tessera::backends
