// The op table: Profiler::events() summed per Step kind, module path or op (the attribution rule
// in tessera/profiler.h splits a fused Step), with <runtime> and <compile> rows, as rows, text
// and CSV.
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "profiler/export.h"
#include "core/fail.h"

namespace tessera {
namespace {

std::string num(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", std::isfinite(x) ? x : 0.0);
  return b;
}

}  // namespace

std::vector<OpTableRow> Profiler::op_table(const std::string& group) const {
  if (group != "kind" && group != "module" && group != "op")
    fail("profiler", "op_table: unknown group '" + group + "' (kind, module or op)", "");
  std::vector<ProfileEvent> ev = events();
  double wall = wall_ms();
  std::map<std::string, OpTableRow> rows;
  OpTableRow rt{group, "<runtime>"}, comp{group, "<compile>"};
  for (auto& e : ev) {
    if (e.type == "runtime") rt.ms += e.dur_us / 1e3, rt.calls++;
    if (e.type == "compile") comp.ms += e.dur_us / 1e3, comp.calls++;
    if (e.type != "step") continue;
    double ms = e.dur_us / 1e3;
    if (group == "kind") {
      OpTableRow& r = rows[e.kind];
      r.ms += ms, r.calls++, r.flops += e.flops, r.bytes += e.bytes;
      continue;
    }
    std::set<std::string> counted;
    for (auto& o : e.ops) {
      std::string scope = o.scope.empty() ? "(top level)" : o.scope;
      std::string key = group == "module" ? scope : o.op + " @ " + scope;
      OpTableRow& r = rows[key];
      r.ms += ms * o.share, r.flops += e.flops * o.share, r.bytes += e.bytes * o.share;
      if (counted.insert(key).second) r.calls++;
    }
  }
  std::vector<OpTableRow> out;
  for (auto& [k, r] : rows) {
    OpTableRow x = r;
    x.group = group, x.name = k;
    out.push_back(x);
  }
  out.push_back(rt);
  out.push_back(comp);
  for (auto& r : out) r.percent = wall > 0 ? 100 * r.ms / wall : 0;
  std::stable_sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.ms > b.ms; });
  return out;
}

std::string Profiler::table_text() const {
  std::vector<ProfileEvent> ev = events();
  double wall = wall_ms();
  int64_t nsteps = 0, nsync = 0;
  std::set<int> graphs;
  std::map<std::string, std::pair<double, int64_t>> regions;
  std::vector<std::string> compiles;
  for (auto& e : ev) {
    if (e.type == "step") nsteps++, graphs.insert(e.graph);
    if (e.type == "sync") nsync++;
    if (e.type == "runtime") regions[e.name].first += e.dur_us / 1e3, regions[e.name].second++;
    if (e.type == "compile") {
      char b[64];
      std::snprintf(b, sizeof b, "%.1f ms: ", e.dur_us / 1e3);
      compiles.push_back(b + e.detail);
    }
  }
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line, "profile: %.3f ms wall, %zu graph runs, %lld Steps, %lld host syncs, %zu compiles\n", wall,
                graphs.size(), (long long)nsteps, (long long)nsync, compiles.size());
  os << line
     << "fused Steps: time, flops and bytes split over their source ops by each op's flops from its cost rule\n"
        "(matmul 2mnk; elementwise and reduction ops one per element; movement, indexing and casts zero; equal\n"
        "split when all are zero). <runtime>: host time outside Steps and compiles, timed directly between clock\n"
        "readings; rows of each table sum to the wall time.\n";
  for (const char* g : {"kind", "module", "op"}) {
    std::vector<OpTableRow> rows = op_table(g);
    size_t w = 10;
    for (auto& r : rows) w = std::max(w, r.name.size());
    os << "\nby " << (std::string(g) == "kind" ? "Step kind" : std::string(g) == "module" ? "module path" : "op and module") << "\n";
    std::snprintf(line, sizeof line, "  %-*s %11s %7s %8s %11s %10s %9s\n", int(w), "name", "time ms", "%", "calls", "GFLOP",
                  "GFLOP/s", "GB/s");
    os << line;
    double sum = 0;
    for (auto& r : rows) {
      std::snprintf(line, sizeof line, "  %-*s %11.3f %7.2f %8lld %11.4f %10.2f %9.2f\n", int(w), r.name.c_str(), r.ms, r.percent,
                    (long long)r.calls, r.flops / 1e9, r.gflops_per_s(), r.gbytes_per_s());
      os << line;
      sum += r.ms;
    }
    std::snprintf(line, sizeof line, "  %-*s %11.3f %7.2f\n", int(w), "total", sum, wall > 0 ? 100 * sum / wall : 0);
    os << line;
  }
  os << "\n<runtime> breakdown:";
  for (auto& [n, v] : regions) {
    std::snprintf(line, sizeof line, " %s %.3f ms (%lld);", n.c_str(), v.first, (long long)v.second);
    os << line;
  }
  os << "\n";
  if (!compiles.empty()) {
    os << "compiles:\n";
    for (auto& c : compiles) os << "  " << c << "\n";
  }
  return os.str();
}

std::string Profiler::table_csv() const {
  std::ostringstream os;
  os << "group,name,ms,calls,flops,bytes,gflops_per_s,gbytes_per_s,percent\n";
  auto csv = [](const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string r = "\"";
    for (char c : s) r += c == '"' ? std::string("\"\"") : std::string(1, c);
    return r + "\"";
  };
  for (const char* g : {"kind", "module", "op"})
    for (auto& r : op_table(g))
      os << r.group << "," << csv(r.name) << "," << num(r.ms) << "," << r.calls << "," << num(r.flops) << "," << num(r.bytes)
         << "," << num(r.gflops_per_s()) << "," << num(r.gbytes_per_s()) << "," << num(r.percent) << "\n";
  return os.str();
}

void Profiler::write_table_csv(const std::string& path) const { profiler::write_file(path, table_csv(), "op table"); }

}  // namespace tessera
