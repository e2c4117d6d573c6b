#include <map>
#include <mutex>

#include "backends/backend.h"
#include "tessera/error.h"

namespace tessera::backends {

std::shared_ptr<Backend> make_cpu_backend();
std::shared_ptr<Backend> make_null_backend();
#ifdef TESSERA_HAVE_OPENCL
std::shared_ptr<Backend> make_opencl_backend();
#endif

namespace {
std::mutex g_mu;
std::vector<std::shared_ptr<Backend>>& registry() {
  static std::vector<std::shared_ptr<Backend>> r = {
      make_cpu_backend(),
#ifdef TESSERA_HAVE_OPENCL
      make_opencl_backend(),
#endif
      make_null_backend()};
  return r;
}
}  // namespace

std::atomic<int64_t>& reported_host_transfers(const std::string& kind) {
  static std::mutex mu;
  static std::map<std::string, std::atomic<int64_t>> counters;  // map nodes never move
  std::lock_guard<std::mutex> lock(mu);
  return counters[kind];
}

void report_host_transfer(const std::string& kind, int64_t bytes) { reported_host_transfers(kind) += bytes; }

void register_backend(std::shared_ptr<Backend> b) {
  std::lock_guard<std::mutex> lock(g_mu);
  registry().push_back(std::move(b));
}

std::vector<std::shared_ptr<Backend>> all_backends() {
  std::lock_guard<std::mutex> lock(g_mu);
  return registry();
}

Backend& backend_for(const Device& d) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::string names;
  for (auto& b : registry()) {
    if (b->name() == d.kind) {
      if (b->device_count() == 0 && !b->no_device_message().empty()) fail("device", b->no_device_message(), "");
      if (d.index < 0 || d.index >= b->device_count())
        fail("device", "'" + d.str() + "' does not exist; " + b->name() + " has " + std::to_string(b->device_count()) +
                           " device(s)", "");
      return *b;
    }
    names += (names.empty() ? "" : ", ") + b->name();
  }
  if (d.kind == "opencl")
    fail("device", "this build has no OpenCL backend (OpenCL was not found when it was configured: install "
                   "ocl-icd-opencl-dev and opencl-headers, then reconfigure); available: " + names, "");
  fail("device", "unknown device '" + d.str() + "'; available: " + names, "");
}

}  // namespace tessera::backends
