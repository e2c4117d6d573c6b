#include <sstream>

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
  return os.str();
}

}  // namespace tessera
