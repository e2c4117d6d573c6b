#include <mutex>
#include <sstream>
#include <vector>

#include "ir/node.h"
#include "runtime/metrics_impl.h"
#include "tessera/metrics.h"

namespace tessera {
namespace runtime {

Counters& counters() {
  static Counters c;
  return c;
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
  std::lock_guard<std::mutex> lock(runtime::g_reasons_mu);
  m.compile_reasons = runtime::reasons();
  return m;
}

void reset_peak_bytes() { runtime::counters().peak_bytes = runtime::counters().live_bytes.load(); }

int64_t live_nodes() { return ir::live_node_count(); }

std::string Metrics::report() const {
  std::ostringstream os;
  os.precision(3);
  os << "graphs compiled: " << graphs_compiled << " (" << std::fixed << compile_ms << " ms), cache hits: " << cache_hits
     << "\nsteps launched: " << steps_launched << " (" << execute_ms << " ms executing)"
     << "\nhost syncs: " << host_syncs << "\nmemory: " << live_bytes << " B live, " << peak_bytes << " B peak\n";
  if (!compile_reasons.empty()) {
    os << "why graphs were compiled" << (compile_reasons.size() < size_t(graphs_compiled) ? " (latest)" : "") << ":\n";
    for (auto& r : compile_reasons) os << "  " << r << "\n";
  }
  return os.str();
}

}  // namespace tessera
