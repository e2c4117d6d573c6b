// tessera::Profiler's recording: the hooks realize() and sync() call (profiler_impl.h) append to
// the active profiler's records (profiler_records.h). Exports (events, the op table, the Chrome
// trace) and the memory viewer are the profiler module's (src/profiler).
#include <mutex>

#include "runtime/profiler_records.h"
#include "core/fail.h"

namespace tessera {

namespace runtime::prof {

std::atomic<bool> g_on{false};

namespace {
std::mutex g_mu;
Profiler::Data* g_active = nullptr;  // under g_mu

// Ends the records at t: the open region and open syncs close there.
void finish(Profiler::Data& d, int64_t t) {
  d.close_region(t);
  for (auto& s : d.syncs)
    if (s.t1 < 0) s.t1 = t;
  d.t_stop = t;
}
}  // namespace

const char* region_name(Region r) {
  static const char* names[] = {"trace", "graph", "lookup", "compile", "launch", "copy"};
  return names[int(r)];
}

void mark_at(Region next, int64_t t) {
  std::lock_guard<std::mutex> lock(g_mu);
  Profiler::Data* d = g_active;
  if (!d) return;
  if (next == Region::Trace && d->sync_depth > 0) next = Region::Copy;  // still inside item()/to_vector()
  d->close_region(t);
  d->cur = next;
}
void mark(Region next) { mark_at(next, now_ns()); }

void compile_begin(const std::string& why, int64_t nodes) {
  int64_t t = now_ns();
  std::lock_guard<std::mutex> lock(g_mu);
  Profiler::Data* d = g_active;
  if (!d) return;
  d->close_region(t);
  d->compiles.push_back({why, nodes});
  d->open_compile = int(d->compiles.size()) - 1;
  d->cur = Region::Compile;
}

int begin_run(std::shared_ptr<const compiler::Plan> plan, const std::string& device) {
  int64_t t = now_ns();
  std::lock_guard<std::mutex> lock(g_mu);
  Profiler::Data* d = g_active;
  if (!d) return -1;
  d->close_region(t);
  d->cur = Region::Launch;
  d->runs.push_back({std::move(plan), device, t, t});
  return int(d->runs.size()) - 1;
}

void step(int run, int index, int64_t t0, int64_t t1) {
  std::lock_guard<std::mutex> lock(g_mu);
  Profiler::Data* d = g_active;
  if (!d || run >= int(d->runs.size())) return;
  d->close_region(t0);  // the bookkeeping before this Step
  d->steps.push_back({run, index, t0, t1});
  d->cur_t0 = std::max(d->cur_t0, t1);  // the region goes on after it
}

void end_run(int run) {
  int64_t t = now_ns();
  std::lock_guard<std::mutex> lock(g_mu);
  Profiler::Data* d = g_active;
  if (!d || run < 0 || run >= int(d->runs.size())) return;
  d->runs[size_t(run)].t1 = t;
}

void sync_begin(const char* what) {
  int64_t t = now_ns();
  std::lock_guard<std::mutex> lock(g_mu);
  Profiler::Data* d = g_active;
  if (!d) return;
  d->close_region(t);
  d->cur = Region::Graph;
  d->syncs.push_back({what, t, -1});
  d->sync_depth++;
}

void sync_end() {
  int64_t t = now_ns();
  std::lock_guard<std::mutex> lock(g_mu);
  Profiler::Data* d = g_active;
  if (!d) return;
  d->close_region(t);
  d->cur = Region::Trace;
  for (auto it = d->syncs.rbegin(); it != d->syncs.rend(); ++it)
    if (it->t1 < 0) {
      it->t1 = t;
      break;
    }
  if (d->sync_depth > 0) d->sync_depth--;
}

Profiler::Data snapshot(const Profiler::Data& d) {
  std::lock_guard<std::mutex> lock(g_mu);
  Profiler::Data c = d;
  if (c.recording) finish(c, now_ns());  // as if stopped now
  return c;
}

}  // namespace runtime::prof

namespace prof = runtime::prof;

// ---- Profiler ----

Profiler::Profiler(bool start_now) : d_(std::make_shared<Data>()) {
  if (start_now) start();
}
Profiler::~Profiler() { stop(); }

void Profiler::start() {
  std::lock_guard<std::mutex> lock(prof::g_mu);
  if (prof::g_active == d_.get()) fail("profiler", "start(): this profiler is already recording", "");
  if (prof::g_active) fail("profiler", "start(): another tessera::Profiler is recording; stop it first", "");
  *d_ = Data{};
  d_->recording = true;
  d_->t_start = d_->cur_t0 = prof::now_ns();
  prof::g_active = d_.get();
  prof::g_on.store(true, std::memory_order_relaxed);
}

void Profiler::stop() {
  std::lock_guard<std::mutex> lock(prof::g_mu);
  if (prof::g_active != d_.get()) return;
  prof::g_on.store(false, std::memory_order_relaxed);
  prof::g_active = nullptr;
  prof::finish(*d_, prof::now_ns());
  d_->recording = false;
}

bool Profiler::recording() const {
  std::lock_guard<std::mutex> lock(prof::g_mu);
  return d_->recording;
}

double Profiler::wall_ms() const {
  std::lock_guard<std::mutex> lock(prof::g_mu);
  int64_t end = d_->recording ? prof::now_ns() : d_->t_stop;
  return double(end - d_->t_start) / 1e6;
}

}  // namespace tessera
