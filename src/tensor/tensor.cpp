// Tensor handles, realization triggers (sync, item, to_vector, printing) and factories.
#include <cmath>
#include <cstring>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <tuple>
#include <type_traits>
#include <unordered_map>

#include "core/half.h"
#include "core/scope_impl.h"
#include "ir/graph.h"
#include "tensor/tensor_impl.h"
#include "runtime/allocator.h"
#include "runtime/memory_plan.h"
#include "runtime/metrics_impl.h"
#include "runtime/profiler_impl.h"
#include "runtime/realize.h"
#include "core/fail.h"
#include "tessera/scope.h"

namespace tessera {
namespace {

struct Rng {
  uint64_t seed = 0x7e55e2a;
  uint64_t offset = 0;
  uint32_t draws = 0;
};

// The lazy graph's state, under one mutex: pending impls in the order they last became pending,
// so graphs are built deterministically (an intrusive list: no allocation per tensor,
// re-registering moves an impl to the end); the generator; and the owner thread. Threading
// (docs/architecture.md): one thread at a time holds unsynced work (pending tensors or a running
// sync); another thread's call that would build on the graph, run it or draw then raises.
struct Registry {
  std::mutex mu;
  TensorImpl* head = nullptr;
  TensorImpl* tail = nullptr;
  size_t count = 0;
  Rng rng;
  int owner = 0;         // thread_no() of the thread that last claimed the graph (0: none)
  bool syncing = false;  // the owner is running its pending work (sync() until reset_draws())
  // Unsynced work: pending tensors or a running sync. Draws whose tensors were dropped hold
  // nothing back (a thread that took the graph over numbers its draws after them).
  bool busy() const { return count || syncing; }
};
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

// Threads are numbered 1, 2, ... in the order they first use the graph; a thread that exits while
// owning the graph gives it up, so another can take over what it left pending.
struct ThreadNo {
  int n;
  ThreadNo() {
    static std::atomic<int> next{1};
    n = next++;
  }
  ~ThreadNo() {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.owner == n) r.owner = 0;
  }
};
int thread_no() {
  thread_local ThreadNo t;
  return t.n;
}

// With r.mu held: makes the calling thread the graph's owner, or throws when another thread holds
// unsynced work (the state is untouched).
void claim(Registry& r, std::string_view what) {
  const int me = thread_no();
  if (r.owner && r.owner != me && r.busy())
    fail(std::string(what), "thread " + std::to_string(me) +
                " cannot use the lazy graph while thread " + std::to_string(r.owner) + " holds unsynced work (" +
                std::to_string(r.count) + " pending tensors, " + std::to_string(r.rng.draws) +
                " random draws); one thread at a time builds, runs and draws: call tessera::sync() on thread " +
                std::to_string(r.owner) + " first (docs/architecture.md, Threading)");
  r.owner = me;
}

// With r.mu held: links t at the end of the pending list (on) or unlinks it.
void set_pending(Registry& r, TensorImpl* t, bool on) {
  if (t->pending) {
    (t->pending_prev ? t->pending_prev->pending_next : r.head) = t->pending_next;
    (t->pending_next ? t->pending_next->pending_prev : r.tail) = t->pending_prev;
    t->pending_prev = t->pending_next = nullptr;
    --r.count;
  }
  t->pending = on;
  if (on) {
    t->pending_prev = r.tail;
    (r.tail ? r.tail->pending_next : r.head) = t;
    r.tail = t;
    ++r.count;
  }
}

const std::shared_ptr<TensorImpl>& need(const Tensor& t, const char* op) {
  if (!t.defined()) fail(op, "called on an undefined tensor");
  const auto& impl = detail::impl_of(t);
  if (impl->errored.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(registry().mu);
    throw Error(*impl->error);
  }
  return impl;
}

// Writes host values of type T into storage of dtype t.
template <class T>
void convert_to(const T* src, int64_t n, DType t, void* dst) {
  for (int64_t i = 0; i < n; ++i) {
    double v = double(src[i]);
    switch (t) {
      case DType::Bool: static_cast<uint8_t*>(dst)[i] = v != 0; break;
      case DType::Int32: static_cast<int32_t*>(dst)[i] = int32_t(src[i]); break;
      case DType::Int64: static_cast<int64_t*>(dst)[i] = int64_t(src[i]); break;
      case DType::Float16: static_cast<uint16_t*>(dst)[i] = half::float_to_f16(float(v)); break;
      case DType::BFloat16: static_cast<uint16_t*>(dst)[i] = half::float_to_bf16(float(v)); break;
      case DType::Float32: static_cast<float*>(dst)[i] = float(v); break;
      case DType::Float64: static_cast<double*>(dst)[i] = v; break;
    }
  }
}
template <class T>
void convert_from(const void* src, DType t, int64_t n, T* dst) {
  for (int64_t i = 0; i < n; ++i) {
    switch (t) {
      case DType::Bool: dst[i] = T(static_cast<const uint8_t*>(src)[i]); break;
      case DType::Int32: dst[i] = T(static_cast<const int32_t*>(src)[i]); break;
      case DType::Int64: dst[i] = T(static_cast<const int64_t*>(src)[i]); break;
      case DType::Float16: dst[i] = T(half::f16_to_float(static_cast<const uint16_t*>(src)[i])); break;
      case DType::BFloat16: dst[i] = T(half::bf16_to_float(static_cast<const uint16_t*>(src)[i])); break;
      case DType::Float32: dst[i] = T(static_cast<const float*>(src)[i]); break;
      case DType::Float64: dst[i] = T(static_cast<const double*>(src)[i]); break;
    }
  }
}

// The buffer holding t's value after sync(); a realized value is read without syncing on any
// thread but the graph's owner (reading never touches the owner's work, and never claims the
// graph: a monitor reading the last loss between two steps must not take the graph from the
// training thread). A failure t did not depend on does not stop reading t.
std::shared_ptr<Buffer> value_buffer(const Tensor& t) {
  const auto& impl = detail::impl_of(t);
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (impl->error) throw Error(*impl->error);
    if (impl->buffer && r.owner != thread_no()) return impl->buffer;
  }
  std::exception_ptr failure;
  try {
    sync();
  } catch (const Error&) {
    failure = std::current_exception();
  }
  std::lock_guard<std::mutex> lock(r.mu);
  if (impl->error) throw Error(*impl->error);
  if (impl->buffer) return impl->buffer;
  if (failure) std::rethrow_exception(failure);
  fail("read", "thread " + std::to_string(r.owner) +
                   " updated this tensor in place before this thread could read it (docs/architecture.md, Threading)");
}

}  // namespace

std::vector<char> detail::host_bytes(const Tensor& t, const char* op) {
  need(t, op);
  runtime::counters().host_syncs++;
  // Profiling: the sync is one slice; the copy back is runtime (Copy) time inside it.
  struct ProfSync {
    bool on;
    ~ProfSync() {
      if (on) runtime::prof::sync_end();
    }
  } prof_sync{runtime::prof::on()};
  if (prof_sync.on) runtime::prof::sync_begin(op);
  std::shared_ptr<Buffer> b = value_buffer(t);
  std::vector<char> bytes(size_t(numel(t.shape())) * itemsize(t.dtype()));
  runtime::download(*b, bytes.data(), bytes.size());
  return bytes;
}

// ---- TensorImpl ----
// Every change of an impl's value happens with the registry's mutex held, so a thread reading a
// realized value (host_bytes) sees it whole while the owner of the graph works.
namespace {
std::atomic<uint64_t> g_impl_serial{0};
thread_local detail::CaptureRecorder* t_recorder = nullptr;
}  // namespace
TensorImpl::TensorImpl(ir::NodePtr n)
    : node(std::move(n)), shape(node->shape), dtype(node->dtype), device(node->device),
      serial(g_impl_serial.fetch_add(1, std::memory_order_relaxed)) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  claim(r, ir::op_name(node->op));
  set_pending(r, this, true);
}
TensorImpl::TensorImpl(std::shared_ptr<Buffer> b, Shape s, DType t)
    : buffer(std::move(b)), shape(std::move(s)), dtype(t), device(buffer->device),
      serial(g_impl_serial.fetch_add(1, std::memory_order_relaxed)) {}
TensorImpl::~TensorImpl() {
  if (!pending) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  set_pending(r, this, false);
}
void TensorImpl::rebind(ir::NodePtr n) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  claim(r, "in-place update");
  if (t_recorder) t_recorder->note_touch(*this);
  if (buffer) donor = buffer, donor_version = version;
  ++version;
  buffer.reset();
  node = std::move(n);
  set_pending(r, this, true);
}
namespace detail {
std::atomic<uint64_t>& realize_epoch() {
  static std::atomic<uint64_t> n{0};
  return n;
}
}  // namespace detail
void TensorImpl::realize_to(std::shared_ptr<Buffer> b) {
  detail::realize_epoch().fetch_add(1, std::memory_order_relaxed);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  realized_from = node;
  buffer = std::move(b);
  node.reset();
  donor.reset();
  set_pending(r, this, false);
}
void TensorImpl::set_error(std::string msg) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  set_pending(r, this, false);
  error = std::make_shared<const std::string>(std::move(msg));
  errored.store(true, std::memory_order_release);
  node.reset();
  buffer.reset();
  donor.reset();
  realized_from.reset();
}
void TensorImpl::adopt_value(const TensorImpl& other) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  claim(r, "set_data");
  if (t_recorder) {
    t_recorder->note_touch(*this);
    t_recorder->assigned.insert(this);
  }
  error = other.error;
  errored.store(error != nullptr, std::memory_order_release);
  node = other.node;
  buffer = other.buffer;
  shape = other.shape;
  dtype = other.dtype;
  device = other.device;
  donor.reset();
  realized_from = other.realized_from;
  set_pending(r, this, node != nullptr);
}
void TensorImpl::revert_to_donor() {
  if (node) {
    std::shared_ptr<Buffer> b = donor.lock();
    if (!b) fail("tensor", "internal: the buffer an in-place value replaced is gone", "");
    realize_to(std::move(b));
    version = donor_version;
  }
  realized_from.reset();
}

namespace detail {
ir::NodePtr node_of(const Tensor& t) {
  const auto& impl = need(t, "tensor");
  std::shared_ptr<Buffer> b;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    claim(r, "an op on a tensor");
    if (impl->node) return impl->node;
    b = impl->buffer;
  }
  if (t_recorder) t_recorder->note_read(impl, b.get());
  return ir::leaf(std::move(b), impl->shape, impl->dtype);
}
void CaptureRecorder::note_read(const std::shared_ptr<TensorImpl>& impl, const Buffer* b) {
  note_touch(*impl);
  auto [it, fresh] = leaves.emplace(b, Read{impl, impl->serial});
  if (!fresh) {
    auto had = it->second.impl.lock();
    if (had && had != impl) shared_leaf = true;
    else if (!had) it->second = {impl, impl->serial};
  }
}
void set_capture_recorder(CaptureRecorder* r) { t_recorder = r; }
CaptureRecorder* capture_recorder() { return t_recorder; }
uint64_t impl_serial() { return g_impl_serial.load(std::memory_order_relaxed); }
size_t pending_count() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.count;
}
void claim_graph(const char* what) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  claim(r, what);
}
void set_replayed_value(TensorImpl& impl, std::shared_ptr<Buffer> b, int64_t versions) {
  detail::realize_epoch().fetch_add(1, std::memory_order_relaxed);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  impl.realized_from.reset();
  impl.buffer = std::move(b);
  impl.donor.reset();
  impl.version += versions;
}
Tensor from_node(ir::NodePtr n) { return TensorAccess::make(std::make_shared<TensorImpl>(std::move(n))); }
Tensor from_buffer(std::shared_ptr<Buffer> b, Shape s, DType t) {
  return TensorAccess::make(std::make_shared<TensorImpl>(std::move(b), std::move(s), t));
}
std::vector<std::shared_ptr<TensorImpl>> pending_impls(bool for_sync) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  claim(r, for_sync ? "sync" : "pending tensors");
  r.syncing |= for_sync;
  std::vector<std::shared_ptr<TensorImpl>> out;
  out.reserve(r.count);
  for (TensorImpl* impl = r.head; impl; impl = impl->pending_next) {
    // Handles own impls through shared_ptr; a dying impl is skipped (it unregisters itself).
    if (auto sp = impl->self.lock()) out.push_back(std::move(sp));
  }
  return out;
}
std::vector<runtime::Request> pending_requests(const std::vector<Tensor>& outputs) {
  std::vector<const TensorImpl*> wanted;
  for (auto& t : outputs) wanted.push_back(impl_of(t).get());
  std::vector<runtime::Request> req;
  for (auto& impl : pending_impls()) {
    if (!outputs.empty() && std::find(wanted.begin(), wanted.end(), impl.get()) == wanted.end()) continue;
    if (impl->node && impl->node->op != ir::Op::Leaf) req.push_back({impl->node, impl->donor});  // a leaf: sync only rebinds it
  }
  return req;
}
RngState rng_state() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return {r.rng.seed, r.rng.offset, r.rng.draws};
}
static thread_local BatchSlice g_batch_slice;
BatchSlice batch_slice() { return g_batch_slice; }
uint32_t next_draw() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  claim(r, "a random draw");
  return r.rng.draws++;
}
// Draws are numbered from the offset: the next sync's draws follow every draw traced before.
void reset_draws() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.rng.offset += r.rng.draws;
  r.rng.draws = 0;
  r.syncing = false;
}
}  // namespace detail

BatchSliceScope::BatchSliceScope(int64_t start, int64_t rows)
    : prev_start_(detail::g_batch_slice.start), prev_rows_(detail::g_batch_slice.rows) {
  if (start < 0 || rows <= 0) fail("batch_slice", "needs start >= 0 and rows > 0, got " + std::to_string(start) + " and " + std::to_string(rows));
  detail::g_batch_slice = {start, rows};
}
BatchSliceScope::~BatchSliceScope() { detail::g_batch_slice = {prev_start_, prev_rows_}; }

void manual_seed(uint64_t seed) {
  Registry& r = registry();
  bool drawn;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    claim(r, "manual_seed");
    drawn = r.rng.draws;
  }
  if (drawn) sync();  // pending draws take the old seed's numbers; this resets draws
  std::lock_guard<std::mutex> lock(r.mu);
  claim(r, "manual_seed");
  r.rng.seed = seed;
  r.rng.offset = 0;
}
RngState rng_state() { return detail::rng_state(); }
void set_rng_state(const RngState& s) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  claim(r, "set_rng_state");
  r.rng = {s.seed, s.offset, s.draws};
}

namespace {
// One device's pending impls as one graph. When the graph fails while running (failure isolation,
// docs/architecture.md): a tensor updated in place goes back to its value before the step when
// the failed run did not write its buffer, else it is errored (all or nothing: no half-applied
// optimizer step is kept); other values complete before the failure are kept; what did not depend
// on the failed Step runs again as one graph; the rest become errored, raising the failure when
// used or read. Returns the failure ("" when none).
std::string realize_group(const std::vector<std::shared_ptr<TensorImpl>>& group, const RngState& st) {
  std::vector<runtime::Request> req;
  for (auto& impl : group) req.push_back({impl->node, impl->donor});
  try {
    auto bufs = runtime::realize(req, {st.seed, st.offset});
    req.clear();
    for (size_t k = 0; k < group.size(); ++k) group[k]->realize_to(std::move(bufs[k]));
    return "";
  } catch (const runtime::GraphFailure& f) {
    req.clear();
    std::vector<std::shared_ptr<TensorImpl>> again;
    for (size_t k = 0; k < group.size(); ++k) {
      TensorImpl& impl = *group[k];
      if (!impl.donor.expired() || f.donor_written[k]) {  // updated in place: all or nothing
        if (!f.donor_written[k]) impl.revert_to_donor();
        else
          impl.set_error(std::string(f.what()) +
                         " (the failed graph had written this tensor's buffer in place: its value before the step is lost; "
                         "restore it from the last checkpoint)");
      } else if (f.done[k]) {
        impl.realize_to(f.done[k]);
      } else if (!f.tainted[k]) {
        again.push_back(group[k]);
      } else {
        impl.set_error(f.what());
      }
    }
    if (again.size() == group.size())  // nothing depended on the failure: it cannot be confined
      for (auto& impl : again) impl->set_error(f.what());
    else if (!again.empty())
      realize_group(again, st);
    return f.what();
  }
}
}  // namespace

namespace {
void sync_impl(detail::SyncReport* report);
}
void sync() { sync_impl(nullptr); }
void detail::sync_reported(SyncReport& report) { sync_impl(&report); }
namespace {
void sync_impl(detail::SyncReport* report) {
  const bool prof = runtime::prof::on();
  if (prof) runtime::prof::mark(runtime::prof::Region::Graph);
  auto impls = detail::pending_impls(true);
  struct Reset {
    bool prof;
    ~Reset() {
      detail::reset_draws();
      if (prof) runtime::prof::mark(runtime::prof::Region::Trace);  // back to the caller's code (Copy inside item())
    }
  } reset{prof};
  // One graph per device, in a deterministic order.
  std::vector<std::pair<Device, std::vector<std::shared_ptr<TensorImpl>>>> groups;
  for (auto& impl : impls) {
    if (impl->node->op == ir::Op::Leaf) {  // already a value: just rebind
      impl->realize_to(impl->node->buffer);
      if (report) report->leaf_rebinds++;
      continue;
    }
    auto it = std::find_if(groups.begin(), groups.end(), [&](auto& g) { return g.first == impl->device; });
    if (it == groups.end()) groups.push_back({impl->device, {impl}});
    else it->second.push_back(impl);
  }
  if (report) {
    report->devices = int(groups.size());
    if (groups.size() == 1) report->realized = groups[0].second;
  }
  std::string failed;
  for (auto& [dev, group] : groups) {
    std::string e = realize_group(group, detail::rng_state());
    if (failed.empty()) failed = e;
  }
  if (!failed.empty()) throw Error(failed);
}
}  // namespace

namespace {
// The graph of `outs` with every random draw of leading extent `rows` moved `shift` rows of the
// batch on (its first element index + shift * its row size); the rest rebuilt on the new inputs,
// each node in its own module scope. Empty when no draw moved (the graph stays rank 0's).
std::vector<ir::NodePtr> shift_draws(const std::vector<ir::NodePtr>& outs, int64_t rows, int64_t shift) {
  const ir::Graph g = ir::build_graph(outs);  // inputs before their users
  std::vector<ir::NodePtr> out(g.nodes.size());
  bool any = false;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::NodePtr& n = g.nodes[i];
    std::vector<ir::NodePtr> ins;
    bool same = true;
    for (const ir::NodePtr& x : n->inputs) {
      ins.push_back(out[size_t(g.index.at(x.get()))]);
      same &= ins.back() == x;
    }
    const bool draw = n->op == ir::Op::Rng && !n->shape.empty() && n->shape[0] == rows;
    if (!draw && same) {
      out[i] = n;
      continue;
    }
    ScopeAs in(*n->scope);
    out[i] = draw ? ir::rng_from(*n, shift * (n->numel() / rows), n->shape)
                  : ir::make(n->op, std::move(ins), n->attrs, &n->shape, n->dtype, n->device);
    any |= draw;
  }
  std::vector<ir::NodePtr> moved;
  if (any)
    for (const ir::NodePtr& o : outs) moved.push_back(out[size_t(g.index.at(o.get()))]);
  return moved;
}
// The pending tensors of a graph that ranks run: leaves realized on the spot, the rest (one
// device's, else an error under `op`) returned.
std::vector<std::shared_ptr<TensorImpl>> rank_group(const char* op) {
  std::vector<std::shared_ptr<TensorImpl>> group;
  for (auto& impl : detail::pending_impls(true)) {
    if (impl->node->op == ir::Op::Leaf) {
      impl->realize_to(impl->node->buffer);
      continue;
    }
    if (!group.empty() && !(impl->device == group[0]->device))
      fail(op, "pending tensors on two devices (" + group[0]->device.str() + ", " + impl->device.str() + "): one graph runs on the ranks", "");
    group.push_back(impl);
  }
  return group;
}

}  // namespace

namespace detail {
std::vector<std::vector<Tensor>> sync_spmd(int ranks, const std::vector<std::vector<std::pair<Tensor, Tensor>>>& rank_inputs,
                                           int64_t rows, const std::vector<Tensor>& rank_outputs) {
  if (ranks < 1 || rank_inputs.size() != size_t(ranks - 1))
    fail("spmd", "inputs for " + std::to_string(rank_inputs.size() + 1) + " ranks, expected " + std::to_string(ranks), "");
  // The inputs: realized values, checked before anything is claimed.
  std::vector<runtime::RankInputs> inputs(static_cast<size_t>(ranks));
  for (size_t r = 1; r < size_t(ranks); ++r)
    for (const auto& [mine, theirs] : rank_inputs[r - 1]) {
      const auto& a = need(mine, "spmd");
      const auto& b = need(theirs, "spmd");
      if (a->shape != b->shape || a->dtype != b->dtype)
        fail("spmd", "rank " + std::to_string(r) + "'s input " + dtype_name(b->dtype) + shape_str(b->shape) +
                         " does not match rank 0's " + dtype_name(a->dtype) + shape_str(a->shape), "");
      std::lock_guard<std::mutex> lock(registry().mu);
      if (!a->buffer || !b->buffer) fail("spmd", "rank inputs must be realized values (sync them first)", "");
      inputs[r].push_back({a->buffer.get(), b->buffer});
    }
  struct Reset {
    ~Reset() { detail::reset_draws(); }
  } reset;
  const std::vector<std::shared_ptr<TensorImpl>> group = rank_group("spmd");
  // Where each wanted per-rank output is among the requests.
  std::vector<size_t> wanted;
  for (const Tensor& t : rank_outputs) {
    const TensorImpl* impl = need(t, "spmd").get();
    auto it = std::find_if(group.begin(), group.end(), [&](const auto& g) { return g.get() == impl; });
    if (it == group.end()) fail("spmd", std::string("a per-rank output ") + dtype_name(t.dtype()) + shape_str(t.shape()) + " is not pending", "");
    wanted.push_back(size_t(it - group.begin()));
  }
  std::vector<std::vector<Tensor>> per_rank(size_t(ranks - 1));
  if (group.empty()) return per_rank;
  std::vector<runtime::Request> req;
  for (auto& impl : group) req.push_back({impl->node, {}});
  const RngState st = detail::rng_state();
  std::vector<std::vector<std::shared_ptr<Buffer>>> bufs;
  try {
    std::vector<std::vector<runtime::Request>> own;  // ranks whose draws differ from rank 0's
    if (rows > 0 && st.draws > 0)
      for (int r = 1; r < ranks; ++r) {
        std::vector<ir::NodePtr> nodes;
        for (const runtime::Request& q : req) nodes.push_back(q.node);
        nodes = shift_draws(nodes, rows, int64_t(r) * rows);
        if (nodes.empty()) break;  // no draw of the batch's rows: every rank runs rank 0's graph
        std::vector<runtime::Request> mine;
        for (ir::NodePtr& n : nodes) mine.push_back({std::move(n), {}});
        own.resize(size_t(ranks));
        own[size_t(r)] = std::move(mine);
      }
    bufs = runtime::realize_spmd_inprocess(req, {st.seed, st.offset}, inputs, ranks, own);
  } catch (const std::exception& e) {
    req.clear();
    for (auto& impl : group) {
      if (!impl->donor.expired()) impl->revert_to_donor();  // no donation here: the old buffer is intact
      else impl->set_error(e.what());
    }
    throw;
  }
  req.clear();
  for (size_t r = 1; r < size_t(ranks); ++r)
    for (size_t k : wanted) per_rank[r - 1].push_back(detail::from_buffer(bufs[r][k], group[k]->shape, group[k]->dtype));
  for (size_t k = 0; k < group.size(); ++k) group[k]->realize_to(std::move(bufs[0][k]));
  return per_rank;
}
}  // namespace detail

// ---- Tensor ----
const Shape& Tensor::shape() const { return need(*this, "shape")->shape; }
int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, shape(), "size")]; }
int64_t Tensor::numel() const { return tessera::numel(shape()); }
DType Tensor::dtype() const { return need(*this, "dtype")->dtype; }
Device Tensor::device() const { return need(*this, "device")->device; }
bool Tensor::is_realized() const {
  const auto& impl = need(*this, "is_realized");
  std::lock_guard<std::mutex> lock(registry().mu);
  return impl->buffer != nullptr;
}
bool Tensor::failed() const {
  if (!defined()) return false;
  return detail::impl_of(*this)->errored.load(std::memory_order_acquire);
}
int64_t Tensor::version() const {
  if (!defined()) fail("version", "called on an undefined tensor");
  return detail::impl_of(*this)->version;
}
void Tensor::set_data(const Tensor& new_data) {
  need(*this, "set_data")->adopt_value(*need(new_data, "set_data"));
}

template <class T>
T Tensor::item() const {
  if (numel() != 1) fail("item", "needs a one-element tensor, got shape " + shape_str(shape()));
  if constexpr (std::is_same_v<T, bool>) return to_vector<double>()[0] != 0;
  else return to_vector<T>()[0];
}
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int32_t Tensor::item<int32_t>() const;
template int64_t Tensor::item<int64_t>() const;
template uint8_t Tensor::item<uint8_t>() const;
template bool Tensor::item<bool>() const;
double Tensor::item() const { return item<double>(); }

template <class T>
std::vector<T> Tensor::to_vector() const {
  std::vector<char> bytes = detail::host_bytes(*this, "to_vector");
  std::vector<T> out(static_cast<size_t>(numel()));
  convert_from(bytes.data(), dtype(), numel(), out.data());
  return out;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;

void* Tensor::host_data(std::shared_ptr<void>* keep) const {
  need(*this, "host_data");
  runtime::counters().host_syncs++;
  std::shared_ptr<Buffer> b = value_buffer(*this);
  if (b->device.kind != "cpu") return nullptr;
  void* data = b->data;
  if (keep) *keep = std::move(b);
  return data;
}

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::vector<double> v = to_vector<double>();
  const Shape& s = shape();
  std::ostringstream os;
  bool fl = is_floating(dtype());
  auto elem = [&](double x) {
    if (dtype() == DType::Bool) os << (x != 0 ? "True" : "False");
    else if (fl) os << std::fixed << std::setprecision(4) << x;
    else os << int64_t(x);
  };
  std::vector<int64_t> strides = contiguous_strides(s);
  // Recursive nested-bracket printing; long dimensions show their first and last 3 entries.
  std::function<void(size_t, int64_t)> rec = [&](size_t d, int64_t base) {
    if (d == s.size()) return elem(v[size_t(base)]);
    os << "[";
    for (int64_t i = 0; i < s[d]; ++i) {
      if (s[d] > 6 && i == 3) {
        os << "..., ";
        i = s[d] - 3;
      }
      if (i && !(s[d] > 6 && i == s[d] - 3)) os << (d + 1 == s.size() ? ", " : ",\n" + std::string(d + 8, ' '));
      rec(d + 1, base + i * strides[d]);
    }
    os << "]";
  };
  os << "tensor(";
  rec(0, 0);
  os << ", dtype=" << dtype_name(dtype()) << ", shape=" << shape_str(s);
  if (device() != Device("cpu")) os << ", device='" << device().str() << "'";
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

Tensor Tensor::to(const Device& d) const {
  need(*this, "to");
  if (d == device()) return *this;
  runtime::check_device(d);  // unknown devices fail before any work
  if (d.kind != device().kind) {  // through the host: a host sync, as reading the value is
    std::vector<char> bytes = detail::host_bytes(*this, "to");
    return detail::from_buffer(runtime::upload(d, bytes.data(), bytes.size()), shape(), dtype());
  }
  sync();  // another device of the same backend: copied device to device
  return detail::from_buffer(runtime::copy_between_devices(*need(*this, "to")->buffer, d), shape(), dtype());
}

// ---- factories ----
template <class T>
Tensor from_vector(const std::vector<T>& data, const Shape& s, TensorOptions o) {
  for (int64_t d : s)
    if (d < 0) fail("from_vector", "negative extent in shape " + shape_str(s));
  if (int64_t(data.size()) != numel(s))
    fail("from_vector", std::to_string(data.size()) + " values do not fill shape " + shape_str(s));
  std::vector<char> bytes(data.size() * itemsize(o.dtype));
  convert_to(data.data(), int64_t(data.size()), o.dtype, bytes.data());
  return detail::from_buffer(runtime::upload(o.device, bytes.data(), bytes.size()), s, o.dtype);
}
template Tensor from_vector<float>(const std::vector<float>&, const Shape&, TensorOptions);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&, TensorOptions);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, const Shape&, TensorOptions);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&, TensorOptions);
template Tensor from_vector<uint8_t>(const std::vector<uint8_t>&, const Shape&, TensorOptions);


namespace {
// Copies block r (of n) of dimension d of a tensor of `shape`, d split with `groups`, between the
// whole tensor's bytes and the block's: to the block, or back (gather).
void copy_block_dim(char* whole, char* block, const Shape& shape, size_t esize, size_t d, int64_t groups, int64_t n, int64_t r, bool back) {
  int64_t outer = 1, inner = int64_t(esize);
  for (size_t k = 0; k < d; ++k) outer *= shape[k];
  for (size_t k = d + 1; k < shape.size(); ++k) inner *= shape[k];
  const int64_t E = shape[d], g = groups, L = E / n, sz = E / (g * n);
  if (sz * inner == 0 || outer == 0) return;  // nothing to copy (and no null pointers for memcpy)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < g; ++j) {
      char* w = whole + (o * E + j * (E / g) + r * sz) * inner;
      char* b = block + (o * L + j * sz) * inner;
      if (back) std::memcpy(w, b, size_t(sz * inner));
      else std::memcpy(b, w, size_t(sz * inner));
    }
}
// Rank r's block of a tensor laid out as s over the mesh, cut from the whole tensor's bytes (one
// split dim after another), or written back into them (back).
void copy_block(const ir::MeshAxes& mesh, std::vector<char>& whole, std::vector<char>& block, const Shape& shape, size_t esize,
                const ir::Sharding& s, int64_t r, bool back) {
  const std::vector<int64_t> c = mesh.coords(r);
  std::vector<std::pair<Shape, std::vector<char>>> steps{{shape, {}}};  // the shapes between cuts
  std::vector<size_t> dims;
  for (size_t d = 0; d < s.size(); ++d)
    if (s[d].sharded()) {
      Shape next = steps.back().first;
      next[d] /= mesh.sizes[size_t(s[d].axis)];
      steps.push_back({next, std::vector<char>(size_t(numel(next)) * esize)});
      dims.push_back(d);
    }
  if (dims.empty()) {
    if (back) whole = block;
    else block = whole;
    return;
  }
  steps.front().second = back ? std::vector<char>(whole.size()) : whole;
  if (back) steps.back().second = block;
  auto cut = [&](size_t k, bool up) {  // between steps k and k + 1
    const size_t d = dims[k];
    const ir::DimSharding& x = s[d];
    copy_block_dim(steps[k].second.data(), steps[k + 1].second.data(), steps[k].first, esize, d, x.groups,
                   mesh.sizes[size_t(x.axis)], c[size_t(x.axis)], up);
  };
  if (!back) {
    for (size_t k = 0; k < dims.size(); ++k) cut(k, false);
    block = std::move(steps.back().second);
  } else {
    if (dims.size() > 1) {  // the other ranks' parts of the intermediate shapes: start from what is there
      for (size_t k = 0; k + 1 < dims.size(); ++k) {
        steps[k].second = k == 0 ? whole : steps[k].second;
        cut(k, false);
      }
    } else {
      steps.front().second = whole;
    }
    for (size_t k = dims.size(); k-- > 0;) cut(k, true);
    whole = std::move(steps.front().second);
  }
}
// Each pending tensor of `group` realized from the ranks' results: a replicated one rank 0's, a
// split one gathered from every rank's block on the host.
void realize_gathered(const ir::MeshAxes& mesh, const std::vector<std::shared_ptr<TensorImpl>>& group,
                      std::vector<std::vector<std::shared_ptr<Buffer>>>& bufs, const ir::Partitioned& part, int64_t n) {
  for (size_t k = 0; k < group.size(); ++k) {
    const ir::Sharding& sh = part.shardings[k];
    bool split = false;
    for (const ir::DimSharding& d : sh) split |= d.sharded();
    if (!split) {
      group[k]->realize_to(std::move(bufs[0][k]));
      continue;
    }
    const Shape& full = group[k]->shape;
    const size_t es = itemsize(group[k]->dtype);
    std::vector<char> whole(size_t(numel(full)) * es);
    for (int64_t r = 0; r < n; ++r) {
      const Buffer& b = *bufs[size_t(r)][k];
      std::vector<char> block(size_t(numel(part.outputs[k]->shape)) * es);
      if (!block.empty()) runtime::download(b, block.data(), block.size());
      copy_block(mesh, whole, block, full, es, sh, r, true);
    }
    group[k]->realize_to(runtime::upload(group[k]->device, whole.data(), whole.size()));
  }
}

std::vector<char> download_all(const Buffer& b, int64_t count, DType t) {
  std::vector<char> host(size_t(count) * itemsize(t));
  if (!host.empty()) runtime::download(b, host.data(), host.size());
  return host;
}
}  // namespace

namespace detail {
PartitionReport sync_partitioned(const ir::MeshAxes& mesh, const std::vector<std::pair<Tensor, ir::Sharding>>& annotated) {
  const int64_t n = mesh.ranks();
  // MPI ranks (a process group of several): each process cuts its own blocks and runs the graph
  // with every output gathered in it; in-process ranks: every rank's blocks, gathered on the host.
  const auto [me, procs] = runtime::process_group();
  const bool mpi = procs > 1;
  if (mpi && procs != n)
    fail("partition", "the mesh has " + std::to_string(n) + " ranks, the process group " + std::to_string(procs), "");
  const int64_t lo = mpi ? me : 0, hi = mpi ? me + 1 : n;
  // The annotated tensors' buffers (a tensor rebound in place: the buffer it was rebound from).
  std::unordered_map<const Buffer*, ir::Sharding> by_buffer;
  for (const auto& [t, sh] : annotated) {
    const auto& impl = need(t, "partition");
    std::lock_guard<std::mutex> lock(registry().mu);
    std::shared_ptr<Buffer> b = impl->buffer ? impl->buffer : impl->donor.lock();
    if (b) by_buffer[b.get()] = sh;
  }
  struct Reset {
    ~Reset() { detail::reset_draws(); }
  } reset;
  const std::vector<std::shared_ptr<TensorImpl>> group = rank_group("partition");
  PartitionReport rep;
  rep.ranks = n;
  if (group.empty()) return rep;
  std::vector<runtime::RankInputs> inputs(static_cast<size_t>(n));
  std::map<std::pair<const Buffer*, std::string>, ir::NodePtr> shards;
  std::map<std::tuple<int, int64_t, int64_t>, ir::NodePtr> indices;  // (axis, extent, groups): the rank's coordinate on the axis
  ir::PartitionHooks hooks;
  hooks.shard_leaf = [&](const ir::Node& leaf, const ir::Sharding& sh) {
    auto key = std::make_pair(leaf.buffer.get(), ir::sharding_str(sh, mesh));
    if (auto it = shards.find(key); it != shards.end()) return it->second;
    const size_t es = itemsize(leaf.dtype);
    std::vector<char> whole = download_all(*leaf.buffer, leaf.numel(), leaf.dtype);
    Shape local = leaf.shape;
    for (size_t d = 0; d < sh.size(); ++d)
      if (sh[d].sharded()) {
        const int64_t a = mesh.sizes[size_t(sh[d].axis)];
        if (local[d] % (a * sh[d].groups) != 0)
          fail("partition", std::string("a leaf ") + dtype_name(leaf.dtype) + shape_str(leaf.shape) + " laid out as " + ir::sharding_str(sh, mesh) +
                                ": dimension " + std::to_string(d) + " (extent " + std::to_string(local[d]) + ") does not divide into " +
                                std::to_string(a * sh[d].groups) + " blocks", "");
        local[d] /= a;
      }
    std::vector<char> block;
    std::shared_ptr<Buffer> first;
    for (int64_t r = lo; r < hi; ++r) {
      copy_block(mesh, whole, block, leaf.shape, es, sh, r, false);
      auto b = runtime::upload(leaf.device, block.data(), block.size());
      if (r == lo) first = b;
      else inputs[size_t(r)].push_back({first.get(), b});
    }
    return shards[key] = ir::leaf(first, local, leaf.dtype);
  };
  hooks.block_index = [&](int64_t extent, const ir::DimSharding& d) {
    auto key = std::make_tuple(d.axis, extent, d.groups);
    if (auto it = indices.find(key); it != indices.end()) return it->second;
    const int64_t g = d.groups, a = mesh.sizes[size_t(d.axis)], sz = extent / (g * a);
    std::shared_ptr<Buffer> first;
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t c = mesh.coords(r)[size_t(d.axis)];
      std::vector<int64_t> idx;
      for (int64_t j = 0; j < g; ++j)
        for (int64_t i = 0; i < sz; ++i) idx.push_back(j * (extent / g) + c * sz + i);
      auto b = runtime::upload(group[0]->device, idx.data(), idx.size() * sizeof(int64_t));
      if (r == lo) first = b;
      else inputs[size_t(r)].push_back({first.get(), b});
    }
    return indices[key] = ir::leaf(first, Shape{extent / a}, DType::Int64);
  };
  auto leaf_sharding = [&](const ir::Node& leaf) -> const ir::Sharding* {
    auto it = by_buffer.find(leaf.buffer.get());
    return it == by_buffer.end() ? nullptr : &it->second;
  };
  std::vector<runtime::Request> req;
  std::vector<std::vector<std::shared_ptr<Buffer>>> bufs;
  ir::Partitioned part;
  try {
    std::vector<ir::NodePtr> outs;
    for (auto& impl : group) outs.push_back(impl->node);
    part = ir::partition(outs, leaf_sharding, mesh, hooks, mpi);
    for (const ir::NodePtr& x : ir::build_graph(outs).nodes)
      if (x->op == ir::Op::Leaf) rep.leaf_bytes += x->numel() * int64_t(itemsize(x->dtype));
    for (const ir::NodePtr& x : ir::build_graph(part.outputs).nodes)
      if (x->op == ir::Op::Leaf) rep.rank_leaf_bytes += x->numel() * int64_t(itemsize(x->dtype));
    rep.collectives = ir::count_collectives(part.outputs);
    for (const ir::NodePtr& o : part.outputs) req.push_back({o, {}});
    rep.rank_peak_bytes = int64_t(runtime::memory_plan_of(*runtime::compile_only(req)).peak_bytes);  // compiled once: the run below hits the cache
    const RngState st = detail::rng_state();
    std::vector<runtime::CommTraffic> traffic;
    if (mpi) {
      const runtime::CommTraffic before = runtime::process_traffic();
      bufs = {runtime::realize(req, {st.seed, st.offset})};
      const runtime::CommTraffic after = runtime::process_traffic();
      traffic = {{after.calls - before.calls, after.bytes - before.bytes}};
    } else {
      bufs = runtime::realize_spmd_inprocess(req, {st.seed, st.offset}, inputs, int(n), {}, &traffic);
    }
    for (const runtime::CommTraffic& t : traffic) rep.rank_comm_calls.push_back(t.calls), rep.rank_comm_bytes.push_back(t.bytes);
  } catch (const std::exception& e) {
    req.clear();
    for (auto& impl : group) {
      if (!impl->donor.expired()) impl->revert_to_donor();  // no donation: the old buffer is intact
      else impl->set_error(e.what());
    }
    throw;
  }
  req.clear();
  rep.output_shardings = part.shardings;
  realize_gathered(mesh, group, bufs, part, n);
  return rep;
}
}  // namespace detail

}  // namespace tessera
