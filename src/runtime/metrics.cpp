#include <iomanip>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "backends/backend.h"
#include "ir/node.h"
#include "runtime/metrics_impl.h"
#include "tessera/metrics.h"

namespace tessera {
namespace runtime {

Counters& counters() {
  static Counters c;
  return c;
}

namespace {
std::mutex g_devices_mu;
std::map<std::string, std::unique_ptr<DeviceCounters>>& device_table() {
  static auto* m = new std::map<std::string, std::unique_ptr<DeviceCounters>>();
  return *m;
}
}  // namespace

DeviceCounters& device_counters(const std::string& kind) {
  std::lock_guard<std::mutex> lock(g_devices_mu);
  auto& p = device_table()[kind];
  if (!p) p = std::make_unique<DeviceCounters>();
  return *p;
}

void add_live_bytes(int64_t delta) {
  Counters& c = counters();
  int64_t now = c.live_bytes.fetch_add(delta) + delta;
  int64_t peak = c.peak_bytes.load();
  while (now > peak && !c.peak_bytes.compare_exchange_weak(peak, now)) {
  }
}

namespace {
std::mutex g_reasons_mu;
std::vector<std::string>& reasons() {
  static auto* r = new std::vector<std::string>();
  return *r;
}
}  // namespace

void record_compile(const std::string& reason) {
  std::lock_guard<std::mutex> lock(g_reasons_mu);
  auto& r = reasons();
  r.push_back("graph " + std::to_string(counters().graphs_compiled.load()) + ": " + reason);
  if (r.size() > 64) r.erase(r.begin());  // the most recent ones
}

}  // namespace runtime

Metrics metrics() {
  runtime::Counters& c = runtime::counters();
  Metrics m;
  m.graphs_compiled = c.graphs_compiled;
  m.cache_hits = c.cache_hits;
  m.host_syncs = c.host_syncs;
  m.steps_launched = c.steps_launched;
  m.live_bytes = c.live_bytes;
  m.peak_bytes = c.peak_bytes;
  m.compile_ms = double(c.compile_ns) / 1e6;
  m.execute_ms = double(c.execute_ns) / 1e6;
  m.bytes_to_device = c.bytes_to_device;
  m.bytes_to_host = c.bytes_to_host;
  m.bf16_flops = backends::bf16_flops_reported();
  m.budget_graphs = c.budget_graphs;
  m.recomputed_steps = c.recomputed_steps;
  m.unstacked_graphs = c.unstacked_graphs;
  m.accumulated_in_place = c.accumulated_in_place;
  {
    std::lock_guard<std::mutex> lock(runtime::g_devices_mu);
    for (auto& [kind, d] : runtime::device_table())
      m.devices[kind] = {d->steps_launched, d->kernels_compiled, d->bytes_to_device, d->bytes_to_host,
                         d->bytes_moved_in_graphs, d->executables_run, d->library_calls_compiled};
  }
  std::lock_guard<std::mutex> lock(runtime::g_reasons_mu);
  m.compile_reasons = runtime::reasons();
  return m;
}

void reset_peak_bytes() { runtime::counters().peak_bytes = runtime::counters().live_bytes.load(); }

namespace {
// "12345678 B (11.8 MiB)": exact bytes, then a readable size.
std::string bytes_text(int64_t b) {
  std::ostringstream os;
  os << b << " B";
  static const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = double(b);
  int u = -1;
  while ((v >= 1024 || v <= -1024) && u < 3) v /= 1024, ++u;
  if (u >= 0) {
    os.setf(std::ios::fixed);
    os.precision(1);
    os << " (" << v << " " << units[u] << ")";
  }
  return os.str();
}
}  // namespace

std::string Metrics::report() const {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(3);
  int64_t realizations = graphs_compiled + cache_hits;
  os << "tessera metrics\n"
     << "  graphs compiled:   " << graphs_compiled << " (" << compile_ms << " ms compiling)\n"
     << "  cache hits:        " << cache_hits;
  if (realizations > 0) os << " (" << std::setprecision(1) << 100.0 * double(cache_hits) / double(realizations) << "% of "
                           << realizations << " graphs run)" << std::setprecision(3);
  os << "\n"
     << "  steps launched:    " << steps_launched << " (" << execute_ms << " ms executing)\n"
     << "  host syncs:        " << host_syncs << "\n"
     << "  host -> device:    " << bytes_text(bytes_to_device) << "\n"
     << "  device -> host:    " << bytes_text(bytes_to_host) << "\n"
     << "  live memory:       " << bytes_text(live_bytes) << "\n"
     << "  peak memory:       " << bytes_text(peak_bytes) << "\n"
     << "  bf16 flops:        " << bf16_flops << " (run in bfloat16 dot-product instructions)\n";
  if (budget_graphs)
    os << "  memory budget:     " << budget_graphs << " graphs compiled under one; rematerialization recomputed " << recomputed_steps
       << " Steps; batch unstacking ran " << unstacked_graphs << " in slices; " << accumulated_in_place
       << " Steps accumulated in place\n";
  for (auto& [kind, d] : devices)
    os << "  on " << kind << ": " << d.steps_launched << " steps launched, " << d.kernels_compiled
       << " kernels compiled, " << bytes_text(d.bytes_to_device) << " in, " << bytes_text(d.bytes_to_host) << " out, "
       << bytes_text(d.bytes_moved_in_graphs) << " moved by the backend while launching"
       << (d.executables_run ? ", " + std::to_string(d.executables_run) + " runs as whole executables" : "")
       << (d.library_calls_compiled ? ", " + std::to_string(d.library_calls_compiled) + " library calls" : "") << "\n";
  if (compile_reasons.empty()) {
    os << "why graphs were compiled: " << (graphs_compiled ? "(not recorded)" : "(none compiled)") << "\n";
  } else {
    os << "why graphs were compiled";
    if (compile_reasons.size() < size_t(graphs_compiled))
      os << " (the latest " << compile_reasons.size() << " of " << graphs_compiled << ")";
    os << ":\n";
    for (auto& r : compile_reasons) os << "  " << r << "\n";
  }
  return os.str();
}

}  // namespace tessera
