// Collectives in flight across Steps (docs/architecture.md "Parallelism", overlap): a collective
// Step the backend starts (Backend::start_collective: the cpu backend's all-reduces) is completed
// only before the first later Step that touches its buffers -- reads or writes its output, writes
// or reads its input, judged by the slots' actual address ranges, so arena reuse and donation
// are covered -- or at the end of the executable; the Steps in between run while it is in
// flight, and each pending one is tested before every Step (MPI moves a transfer only inside
// MPI calls). Results equal the blocking form's bit for bit: the same reduction, only later.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backends/backend.h"
#include "compiler/lower.h"

namespace tessera::runtime {

// On unless TESSERA_COLLECTIVE_OVERLAP=0 (read once) or set_collective_overlap(false) (tests,
// A/B measurements): off, every collective Step blocks its rank as before.
bool collective_overlap();

class InFlight {
 public:
  // prof_run >= 0: each completion's wait is recorded as time of its collective Step.
  InFlight(const compiler::Plan& plan, void* const* slots, int prof_run);
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  // Before Step s: completes every pending collective that Step s touches and tests the rest.
  // `at` is set to a collective's Step while it is completed (a failure there is that Step's).
  void before(size_t s, int& at);
  // Starts Step s through the backend where it can (true); false: launch it.
  bool start(size_t s, backends::Backend& be, const backends::Kernel& k, const backends::LaunchArgs& args);
  void finish(int& at);  // completes every pending one: the end of the executable
  // Completes what is left (a Step failed: the buffers must not be freed under a transfer), errors
  // swallowed.
  ~InFlight();

 private:
  struct Range {
    const char* p = nullptr;
    size_t n = 0;
  };
  struct Pending {
    size_t step;
    std::unique_ptr<backends::PendingCollective> handle;
    Range in, out;
  };
  Range range(int slot) const;
  void complete(Pending& p, int& at, long before_step);  // before_step -1: at the end
  const compiler::Plan& plan_;
  void* const* slots_;
  int prof_run_;
  std::vector<Pending> pending_;
};

}  // namespace tessera::runtime
