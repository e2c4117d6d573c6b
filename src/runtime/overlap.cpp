#include "runtime/overlap.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/profiler_impl.h"
#include "runtime/realize.h"

namespace tessera::runtime {
namespace {

std::atomic<int> g_overlap{-1};  // -1: not read yet
std::atomic<int64_t> g_steps_overlapped{0}, g_started{0}, g_wait_ns{0};

bool overlaps(const char* a, size_t an, const char* b, size_t bn) { return an && bn && a < b + bn && b < a + an; }

// TESSERA_OVERLAP_TRACE=1, a diagnostic: each started collective's span printed when it ends
// ("collective step 212 completed before step 240 / at the end: 27 Steps in flight, waited 0.1 ms").
bool trace() {
  static const bool on = std::getenv("TESSERA_OVERLAP_TRACE") != nullptr;
  return on;
}
void print_span(size_t step, long until, int64_t wait_ns) {
  if (until >= 0)
    std::fprintf(stderr, "[overlap] collective step %zu completed before step %ld: %ld Steps in flight, waited %.3f ms\n", step, until,
                 until - long(step) - 1, double(wait_ns) / 1e6);
  else
    std::fprintf(stderr, "[overlap] collective step %zu completed %s, waited %.3f ms\n", step,
                 until == -1 ? "at the end" : "in a test between Steps", double(wait_ns) / 1e6);
}

}  // namespace

bool collective_overlap() {
  int v = g_overlap.load();
  if (v < 0) {
    const char* e = std::getenv("TESSERA_COLLECTIVE_OVERLAP");
    v = !(e && std::strcmp(e, "0") == 0);
    g_overlap = v;
  }
  return v != 0;
}
void set_collective_overlap(bool on) { g_overlap = on ? 1 : 0; }
CollectiveOverlapStats collective_overlap_stats() { return {g_started.load(), g_steps_overlapped.load(), g_wait_ns.load()}; }

InFlight::InFlight(const compiler::Plan& plan, void* const* slots, int prof_run) : plan_(plan), slots_(slots), prof_run_(prof_run) {}

InFlight::Range InFlight::range(int slot) const {
  return {static_cast<const char*>(slots_[size_t(slot)]), plan_.slots[size_t(slot)].nbytes};
}

void InFlight::complete(Pending& p, int& at, long before_step) {
  const int saved = at;
  at = int(p.step);
  const int64_t t0 = prof::now_ns();
  p.handle->wait();
  const int64_t t1 = prof::now_ns();
  g_wait_ns += t1 - t0;
  if (prof_run_ >= 0) prof::step(prof_run_, int(p.step), t0, t1);
  if (trace()) print_span(p.step, before_step, t1 - t0);
  at = saved;
}

void InFlight::before(size_t s, int& at) {
  if (pending_.empty()) return;
  const kir::Step& st = plan_.steps[s];
  std::vector<int> touched = st.inputs;
  for (int o : st.outputs()) touched.push_back(o);
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    bool conflict = false;
    for (int slot : touched) {
      const Range r = range(slot);
      conflict |= overlaps(r.p, r.n, p.in.p, p.in.n) || overlaps(r.p, r.n, p.out.p, p.out.n);
    }
    if (conflict) {
      complete(p, at, long(s));
    } else {
      const int saved = at;
      at = int(p.step);
      const bool done = p.handle->test();
      at = saved;
      if (!done) {
        ++i;
        continue;
      }
      if (trace()) print_span(p.step, -2, 0);
    }
    pending_.erase(pending_.begin() + std::ptrdiff_t(i));
  }
  if (!pending_.empty()) g_steps_overlapped++;
}

bool InFlight::start(size_t s, backends::Backend& be, const backends::Kernel& k, const backends::LaunchArgs& args) {
  const kir::Step& st = plan_.steps[s];
  if (st.kind != kir::StepKind::Collective || !collective_overlap()) return false;
  std::unique_ptr<backends::PendingCollective> h = be.start_collective(k, st, args);
  if (!h) return false;
  g_started++;
  pending_.push_back({s, std::move(h), range(st.inputs[0]), range(st.output)});
  return true;
}

void InFlight::finish(int& at) {
  while (!pending_.empty()) {
    complete(pending_.front(), at, -1);
    pending_.erase(pending_.begin());
  }
}

InFlight::~InFlight() {
  for (Pending& p : pending_) try {
      p.handle->wait();
    } catch (...) {
    }
}

}  // namespace tessera::runtime
