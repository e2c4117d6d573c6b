// What a tessera::Profiler records: the hooks (profiler_impl.h) append to these records while it
// is active; the profiler module (src/profiler: events, op table, Chrome trace) reads a copy.
// Times are steady-clock nanoseconds (prof::now_ns()).
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/profiler_impl.h"
#include "tessera/profiler.h"

namespace tessera {

struct Profiler::Data {
  struct RegionRec {  // a host region outside Steps
    runtime::prof::Region r;
    int64_t t0, t1;
    int compile;  // Compile: index into compiles
  };
  struct CompileRec {
    std::string why;  // the cache miss reason
    int64_t nodes;
  };
  struct RunRec {  // one graph run; keeps its plan, from which Steps are described on export
    std::shared_ptr<const compiler::Plan> plan;
    std::string device;
    int64_t t0, t1;
  };
  struct StepRec {
    int run, index;  // into runs; the Step's index in that run's plan
    int64_t t0, t1;
  };
  struct SyncRec {
    std::string what;  // item, to_vector, ...
    int64_t t0, t1;    // t1 < 0: still open
  };
  bool recording = false;
  int64_t t_start = 0, t_stop = 0;
  runtime::prof::Region cur = runtime::prof::Region::Trace;  // the open region, since cur_t0
  int64_t cur_t0 = 0;
  int sync_depth = 0;
  int open_compile = -1;
  std::vector<RegionRec> regions;
  std::vector<CompileRec> compiles;
  std::vector<RunRec> runs;
  std::vector<StepRec> steps;
  std::vector<SyncRec> syncs;

  void close_region(int64_t t) {
    if (t > cur_t0) regions.push_back({cur, cur_t0, t, cur == runtime::prof::Region::Compile ? open_compile : -1});
    cur_t0 = std::max(cur_t0, t);
  }
};

namespace runtime::prof {
// A copy of d taken under the recording lock, so it is consistent while d still records; then
// t_stop is the time of the copy.
Profiler::Data snapshot(const Profiler::Data& d);
}  // namespace runtime::prof

}  // namespace tessera
