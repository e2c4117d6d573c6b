// The profiler: every executed Step with the fused ops it computes (op and module path, from the
// compiler's provenance), compile events with the reason the cache missed, host syncs, and the
// runtime's own time, each timed directly.
//
//   {
//     tessera::Profiler prof;                    // starts recording (RAII; or start()/stop())
//     for (int i = 0; i < 5; ++i) train_step();
//     prof.stop();
//     prof.write_chrome_trace("trace.json");     // Perfetto / chrome://tracing
//     std::cout << prof.table_text();            // time per Step kind, module path and op
//   }
//   tessera::write_memory_viewer("mem.html", tessera::last_memory_plan());
//
// Attribution rule (fused Steps): a Step's time, flops and bytes are split over its source ops in
// proportion to each op's flops by its own cost rule (the rules that sum to the Step's flops: a
// matmul 2mnk, an elementwise op or a reduction one per element of its own output or input,
// movement, indexing and casts zero), so per-op flops are exact as far as the cost rules are;
// time and bytes follow the flops (fused ops share one pass over memory, which has no exact
// split). When no source has flops (a copy, a gather) the split is equal. A module path gets the
// shares of the ops traced in it.
//
// Time outside Steps is timed directly between clock readings at region boundaries (see
// ProfileEvent): the table's `<runtime>` row is the sum of those intervals, `<compile>` the
// compiles'. Steps, `<compile>` and `<runtime>` together cover start() .. stop() exactly once.
// While a profiler records, the runtime waits for each Step to finish before timing the next.
// One profiler records at a time (starting a second one throws); record from one host thread.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessera/memory.h"

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera {

struct ProfiledOp {
  std::string op;     // primitive name ("matmul", "exp")
  std::string scope;  // module path it was traced in ("blocks.1.mlp"; "" at top level)
  double share = 0;   // its part of the Step's time, flops and bytes (the rule above); sums to 1
};

struct ProfileEvent {
  // "step": one executed Step (on `device`); "runtime": a host region of the runtime (name:
  // trace, graph, lookup, launch, copy); "compile": a cache miss compiling (detail: why);
  // "sync": a host sync (name: item, to_vector, ...) enclosing the regions and Steps it ran.
  std::string type;
  std::string name;    // step: "blocks.1.mlp: matmul+gelu" (dominant module path: its compute ops)
  std::string device;  // step: the device ("cpu"); others: "host"
  std::string kind;    // step: the Step kind ("gemm", "elementwise", "row" ...)
  std::string shape;   // step: output dtype and shape ("f32[16, 64, 128]")
  std::string scope;   // step: the dominant module path (largest share)
  std::string detail;  // compile: the miss reason
  int graph = -1;      // step: the graph run it belongs to (0, 1, ... in order)
  int step = -1;       // step: its index in the plan
  double start_us = 0, dur_us = 0;  // since start()
  double flops = 0, bytes = 0;      // step: the cost rules' estimate
  std::vector<ProfiledOp> ops;      // step: every fused source op
};

struct OpTableRow {
  std::string group;  // "kind", "module" or "op"
  std::string name;   // "gemm"; "blocks.1.mlp"; "matmul @ blocks.1.mlp"; "<runtime>"; "<compile>"
  double ms = 0;
  int64_t calls = 0;  // Steps that contributed (regions/compiles for <runtime>/<compile>)
  double flops = 0, bytes = 0;
  double percent = 0;  // of the profiled wall time
  double gflops_per_s() const { return ms > 0 ? flops / ms / 1e6 : 0; }
  double gbytes_per_s() const { return ms > 0 ? bytes / ms / 1e6 : 0; }
};

class Profiler {
 public:
  explicit Profiler(bool start_now = true);
  ~Profiler();  // stops
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  void start();  // clears what was recorded; throws tessera::Error if another profiler records
  void stop();   // no-op when not recording
  bool recording() const;

  double wall_ms() const;  // start() .. stop() (or now, while recording)
  std::vector<ProfileEvent> events() const;  // in time order (syncs before what they enclose)
  // Rows of one group ("kind", "module" or "op"), every row, by time descending; each group's
  // rows (with <runtime> and <compile>) sum to wall_ms().
  std::vector<OpTableRow> op_table(const std::string& group) const;
  std::string table_text() const;  // the three groups, every row, plus the <runtime> breakdown
  std::string table_csv() const;   // group,name,ms,calls,flops,bytes,gflops_per_s,gbytes_per_s,percent
  std::string chrome_trace() const;  // Chrome Trace Event JSON
  void write_chrome_trace(const std::string& path) const;
  void write_table_csv(const std::string& path) const;

  struct Data;

 private:
  std::shared_ptr<Data> d_;
};

// One self-contained HTML page (inline SVG and script, no network): the plan's buffers as
// rectangles over program order (x: Steps, y: bytes; parameters and outputs stacked at the
// bottom for the whole run, temporaries at their arena offsets over their lifetimes), the live
// bytes and the peak marked; hovering a buffer shows its shape, dtype, producing op and module.
std::string memory_viewer_html(const MemoryPlan& plan, const std::string& title = "tessera memory plan");
void write_memory_viewer(const std::string& path, const MemoryPlan& plan, const std::string& title = "tessera memory plan");

}  // namespace tessera
#pragma GCC visibility pop
