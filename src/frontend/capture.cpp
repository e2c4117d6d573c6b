// Step capture (include/tessera/capture.h; docs/architecture.md, "Capturing the step"). A traced
// call's one graph is recorded with where each of its parameters came from (an input, a tensor
// that existed before the call, or a constant buffer no tensor held) and where each of its
// results went (an output, such a tensor updated by the step, or a temporary); two consecutive
// equal records arm the capture, and later calls whose guards hold run the recorded executable on
// the current buffers instead of tracing.
#include "tessera/capture.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "autodiff/autograd.h"
#include "core/fail.h"
#include "runtime/allocator.h"
#include "runtime/profiler_impl.h"
#include "runtime/realize.h"
#include "tensor/tensor_impl.h"
#include "tessera/autocast.h"
#include "tessera/replay.h"
#include "tessera/scope.h"

namespace tessera {

namespace {

bool capture_disabled() {
  static const bool off = [] {
    const char* v = std::getenv("TESSERA_CAPTURE");
    return v && std::strcmp(v, "0") == 0;
  }();
  return off;
}

// The thread's settings that steer tracing.
struct Env {
  bool grad = true;
  std::optional<DType> autocast;
  std::string scope;
  int64_t slice_start = 0, slice_rows = 0;
  std::shared_ptr<const std::string> settings;  // the compile settings' key

  static Env now() {
    Env e;
    e.grad = grad_enabled();
    e.autocast = autocast_dtype();
    e.scope = current_scope();
    auto s = detail::batch_slice();
    e.slice_start = s.start;
    e.slice_rows = s.rows;
    e.settings = runtime::compile_settings_key();
    return e;
  }
  // "" when equal, else what differs.
  std::string differs(const Env& o) const {
    if (grad != o.grad) return std::string("grad mode is ") + (o.grad ? "on" : "off") + ", the recorded step's was " + (grad ? "on" : "off");
    if (autocast != o.autocast)
      return std::string("autocast is ") + (o.autocast ? dtype_name(*o.autocast) : "off") + ", the recorded step's was " +
             (autocast ? dtype_name(*autocast) : "off");
    if (scope != o.scope) return "the module scope is '" + o.scope + "', the recorded step's was '" + scope + "'";
    if (slice_start != o.slice_start || slice_rows != o.slice_rows) return "another batch slice (BatchSliceScope) is in force";
    if (settings != o.settings && *settings != *o.settings)
      return "the compile settings (memory budget, passes switched off, arena guard) differ from the recorded step's";
    return "";
  }
};

std::string sig(DType t, const Shape& s) { return std::string(dtype_name(t)) + shape_str(s); }

}  // namespace

struct __attribute__((visibility("hidden"))) StepCapture::Impl {
  Fn fn;
  struct Source {
    enum Kind { Input, State, Constant } kind;
    int index;                        // the input or the state
    std::shared_ptr<Buffer> constant;  // Constant: the buffer, kept
  };
  struct Result {
    enum Kind { Output, State, Temp } kind;
    int index;  // the output or the state
  };
  struct StateRec {
    std::weak_ptr<TensorImpl> impl;
    const TensorImpl* id;
    Shape shape;
    DType dtype;
    Device device;
    int64_t versions = 0;          // the in-place updates the step made to it
    const TensorImpl* grad = nullptr;  // its gradient after the step (null: none)
    bool requires_grad = false;    // as the step was traced (a frozen parameter is not updated)
    bool updated = false;          // one of the graph's results
  };
  struct Hook {
    std::function<void()> before, after;
    std::vector<const TensorImpl*> refreshes;
  };
  struct Record {
    std::shared_ptr<const runtime::CapturedGraph> graph;
    Env env;
    std::vector<std::pair<Shape, DType>> inputs;
    std::vector<Device> input_devices;
    std::vector<bool> input_grads;  // requires_grad of each input, as traced
    std::vector<Source> sources;
    std::vector<Result> results;
    std::vector<int> donated;  // per result: the parameter it overwrites (-1: none)
    std::vector<StateRec> states;
    std::vector<std::pair<Shape, DType>> outputs;
    std::vector<Hook> hooks;
    uint32_t draws = 0;
  };
  std::shared_ptr<Record> armed, candidate;
  std::vector<Hook> recording_hooks;
  bool replayed = false;
  std::string reason;
  int64_t replays = 0, traces = 0;

  std::vector<Tensor> trace(const std::vector<Tensor>& inputs);
  std::string classify(Record* rec, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outs,
                       const detail::SyncReport& rep, const detail::CaptureRecorder& seen,
                       const std::vector<std::shared_ptr<Buffer>>& params, uint64_t serial0,
                       std::vector<std::weak_ptr<TensorImpl>>& temps);
  std::string check(const Record& r, const std::vector<Tensor>& inputs) const;
  std::vector<Tensor> replay(const Record& r, const std::vector<Tensor>& inputs);
  static bool same(const Record& a, const Record& b);
};

namespace {
thread_local StepCapture::Impl* t_recording = nullptr;

bool wants_grad(const TensorImpl& t) { return t.grad_meta && t.grad_meta->requires_grad; }

struct RecordingScope {
  StepCapture::Impl* prev;
  detail::CaptureRecorder* prev_rec;
  RecordingScope(StepCapture::Impl* m, detail::CaptureRecorder* rec) : prev(t_recording), prev_rec(detail::capture_recorder()) {
    t_recording = m;
    detail::set_capture_recorder(rec);
  }
  void end() {
    t_recording = prev;
    detail::set_capture_recorder(prev_rec);
  }
  ~RecordingScope() { end(); }
};

// Sync, as a traced call ends.
std::vector<Tensor> realized_outputs(const std::vector<Tensor>& outs) {
  sync();
  std::vector<Tensor> r;
  for (const Tensor& t : outs) {
    if (!t.defined()) fail("StepCapture", "the step returned an undefined tensor", "");
    const auto& impl = detail::impl_of(t);
    if (impl->error) throw Error(*impl->error);
    r.push_back(impl->buffer ? detail::from_buffer(impl->buffer, impl->shape, impl->dtype) : t);
  }
  return r;
}
}  // namespace

StepCapture::StepCapture(Fn fn) : impl_(std::make_unique<Impl>()) {
  if (!fn) fail("StepCapture", "needs a step function", "");
  impl_->fn = std::move(fn);
}
StepCapture::~StepCapture() = default;
bool StepCapture::last_replayed() const { return impl_->replayed; }
const std::string& StepCapture::last_reason() const { return impl_->reason; }
int64_t StepCapture::replays() const { return impl_->replays; }
int64_t StepCapture::traces() const { return impl_->traces; }
void StepCapture::reset() {
  impl_->armed.reset();
  impl_->candidate.reset();
}
bool StepCapture::recording() { return t_recording != nullptr; }
void StepCapture::on_replay(std::function<void()> before, std::function<void()> after, const std::vector<Tensor>& refreshes) {
  if (!t_recording) fail("StepCapture::on_replay", "called while no StepCapture is tracing its step (check StepCapture::recording())", "");
  std::vector<const TensorImpl*> ids;
  for (const Tensor& t : refreshes)
    if (t.defined()) ids.push_back(detail::impl_of(t).get());
  t_recording->recording_hooks.push_back({std::move(before), std::move(after), std::move(ids)});
}

std::vector<Tensor> StepCapture::operator()(const std::vector<Tensor>& inputs) {
  Impl& m = *impl_;
  if (t_recording) fail("StepCapture", "a captured step cannot run another StepCapture inside it", "");
  m.replayed = false;
  m.reason.clear();
  if (capture_disabled()) {
    m.reason = "TESSERA_CAPTURE=0";
    m.traces++;
    return realized_outputs(m.fn(inputs));
  }
  if (m.armed) {
    std::string why = m.check(*m.armed, inputs);
    if (why.empty()) {
      m.replayed = true;
      m.replays++;
      return m.replay(*m.armed, inputs);
    }
    m.reason = why;
  }
  return m.trace(inputs);
}

// ---- tracing and recording ----
// Where each parameter of the recorded graph came from and where each result went (rec's
// sources, results and states); temporaries the graph computed go to `temps`. "" when the trace
// can be replayed, else why not.
std::string StepCapture::Impl::classify(Record* rec, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outs,
                                        const detail::SyncReport& rep, const detail::CaptureRecorder& seen,
                                        const std::vector<std::shared_ptr<Buffer>>& params, uint64_t serial0,
                                        std::vector<std::weak_ptr<TensorImpl>>& temps) {
  std::string why;
  std::unordered_map<const TensorImpl*, int> state_of;
  auto state = [&](const std::shared_ptr<TensorImpl>& impl) {
    auto [it, fresh] = state_of.emplace(impl.get(), int(rec->states.size()));
    if (fresh) rec->states.push_back({impl, impl.get(), impl->shape, impl->dtype, impl->device});
    return it->second;
  };
  // Results: one per pending tensor the graph computed, in request order.
  for (const auto& impl : rep.realized) {
    int out = -1;
    for (size_t j = 0; j < outs.size() && out < 0; ++j)
      if (detail::impl_of(outs[j]) == impl) out = int(j);
    if (out >= 0 && impl->serial < serial0) {
      why = "the step returns a tensor that existed before it (" + sig(impl->dtype, impl->shape) +
            ") and gives it a new value: return a copy (clone()) instead";
    } else if (out >= 0) {
      rec->results.push_back({Result::Output, out});
    } else if (impl->serial < serial0) {
      for (const Tensor& in : inputs)
        if (detail::impl_of(in) == impl) why = "the step updates its input " + sig(impl->dtype, impl->shape) + " in place";
      int s = state(impl);
      rec->states[size_t(s)].updated = true;
      rec->results.push_back({Result::State, s});
    } else {
      rec->results.push_back({Result::Temp, -1});
      temps.push_back(impl);
    }
  }
  for (size_t j = 0; j < outs.size() && why.empty(); ++j)
    if (std::none_of(rec->results.begin(), rec->results.end(), [&](const Result& r) { return r.kind == Result::Output && r.index == int(j); }))
      why = "output " + std::to_string(j) + " (" + sig(outs[j].dtype(), outs[j].shape()) + ") is not a value the step's graph computes";
  // Sources: one per parameter of the graph.
  for (size_t p = 0; p < params.size() && why.empty(); ++p) {
    const std::shared_ptr<Buffer>& b = params[p];
    auto it = seen.leaves.find(b.get());
    if (it == seen.leaves.end()) {  // a constant buffer no tensor of the step held
      rec->sources.push_back({Source::Constant, -1, b});
      continue;
    }
    std::shared_ptr<TensorImpl> impl = it->second.impl.lock();
    int input = -1;
    for (size_t k = 0; k < inputs.size() && input < 0 && impl; ++k)
      if (detail::impl_of(inputs[k]) == impl) input = int(k);
    if (input >= 0) {
      rec->sources.push_back({Source::Input, input, nullptr});
      continue;
    }
    if (it->second.serial >= serial0) {
      why = "the step reads a tensor (" + std::to_string(b->nbytes) +
            " bytes) it made from host values (from_vector, a scalar tensor): its value could change between calls unseen; "
            "pass it as an input, or keep it in a tensor that lives across calls";
      break;
    }
    if (!impl) {
      why = "a tensor the step read (" + std::to_string(b->nbytes) + " bytes) was freed during the step";
      break;
    }
    rec->sources.push_back({Source::State, state(impl), nullptr});
    // Given a new value (set_data) by the step before it read it: replays must do the same.
    bool refreshed = !seen.assigned.count(impl.get());
    for (const Hook& h : rec->hooks)
      refreshed |= std::find(h.refreshes.begin(), h.refreshes.end(), impl.get()) != h.refreshes.end();
    if (!refreshed)
      why = "the step gave the tensor " + sig(impl->dtype, impl->shape) +
            " a new value (set_data) before reading it, and no on_replay hook gives it its value at a replay";
  }
  return why;
}

std::vector<Tensor> StepCapture::Impl::trace(const std::vector<Tensor>& inputs) {
  traces++;
  auto keep_reason = [&](const std::string& why) { reason += (reason.empty() ? "" : "; ") + why; };
  // A call that cannot be recorded traces as it would without the capture.
  auto plain = [&](const std::string& why) {
    keep_reason(why);
    return realized_outputs(fn(inputs));
  };
  if (size_t n = detail::pending_count())
    return plain(std::to_string(n) + " tensors were pending before the call (their work would join the step's graph): sync() first");
  if (detail::rng_state().draws) return plain("random draws were pending before the call: sync() first");
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!inputs[k].defined()) return plain("input " + std::to_string(k) + " is undefined");
    const auto& impl = detail::impl_of(inputs[k]);
    if (impl->error || !impl->buffer) return plain("input " + std::to_string(k) + " is not a realized value");
    for (size_t j = 0; j < k; ++j)
      if (detail::impl_of(inputs[j])->buffer == impl->buffer)
        return plain("inputs " + std::to_string(j) + " and " + std::to_string(k) + " are one value (a replay could not tell their uses apart)");
  }
  auto rec = std::make_shared<Record>();
  rec->env = Env::now();
  for (const Tensor& t : inputs) {
    rec->inputs.push_back({t.shape(), t.dtype()});
    rec->input_devices.push_back(t.device());
    rec->input_grads.push_back(wants_grad(*detail::impl_of(t)));
  }
  detail::CaptureRecorder seen;
  recording_hooks.clear();
  const uint64_t serial0 = detail::impl_serial();
  const uint64_t epoch0 = Replay::epoch();
  std::vector<Tensor> outs;
  {
    RecordingScope scope(this, &seen);
    outs = fn(inputs);
  }
  rec->hooks = std::move(recording_hooks);
  recording_hooks.clear();
  const uint64_t epoch1 = Replay::epoch();
  rec->draws = detail::rng_state().draws;
  runtime::CaptureSlot slot;
  detail::SyncReport rep;
  runtime::set_capture_slot(&slot);
  try {
    detail::sync_reported(rep);
  } catch (...) {
    runtime::set_capture_slot(nullptr);
    throw;
  }
  runtime::set_capture_slot(nullptr);

  // What the step returns: realized tensors of their own, no autodiff history.
  std::vector<Tensor> result;
  for (const Tensor& t : outs) {
    if (!t.defined()) fail("StepCapture", "the step returned an undefined tensor", "");
    const auto& impl = detail::impl_of(t);
    if (impl->error) throw Error(*impl->error);
    result.push_back(detail::from_buffer(impl->buffer, impl->shape, impl->dtype));
    rec->outputs.push_back({impl->shape, impl->dtype});
  }

  std::string why;  // why this trace cannot be replayed
  if (epoch1 != epoch0)
    why = "the step read a value back while tracing (item(), to_vector(), a GradScaler's check): its trace may depend on it";
  else if (rep.devices != 1)
    why = rep.devices ? "the step's graph spans " + std::to_string(rep.devices) + " devices" : "the step computed nothing";
  else if (rep.leaf_rebinds)
    why = "the step gave a tensor another realized tensor's value (set_data or copy_ of a value) without computing it";
  else if (!slot.graph)
    why = "internal: the step's graph was not recorded";
  else if (seen.shared_leaf)
    why = "two tensors the step read share one buffer";
  std::vector<std::weak_ptr<TensorImpl>> temps;
  if (why.empty()) why = classify(rec.get(), inputs, outs, rep, seen, slot.params, serial0, temps);
  if (why.empty()) {
    rec->graph = slot.graph;
    rec->donated = slot.donated;
    for (size_t k = 0; k < rec->results.size(); ++k)
      if (rec->donated[k] >= 0 && rec->sources[size_t(rec->donated[k])].kind != Source::State)
        why = "internal: a result overwrites a buffer that is no state tensor";
    for (StateRec& s : rec->states) {
      auto impl = s.impl.lock();
      if (!impl) {
        why = "a tensor the step read (" + sig(s.dtype, s.shape) + ") was freed during the step";
        break;
      }
      auto fv = seen.first_version.find(s.id);
      s.versions = fv == seen.first_version.end() ? 0 : impl->version - fv->second;
      s.shape = impl->shape, s.dtype = impl->dtype, s.device = impl->device;
      s.grad = impl->grad_meta && impl->grad_meta->grad.defined() ? detail::impl_of(impl->grad_meta->grad).get() : nullptr;
      s.requires_grad = wants_grad(*impl);
    }
  }
  outs.clear();  // the traced tensors (and their autodiff history) go
  rep.realized.clear();
  for (const auto& w : temps)
    if (auto t = w.lock(); t && why.empty())
      why = "a value the step made (" + sig(t->dtype, t->shape) +
            ") is still referenced after it (kept outside the step): return it as an output instead";
  if (!why.empty()) {
    keep_reason(why);
    armed.reset();
    candidate.reset();
    return result;
  }
  const std::shared_ptr<Record>& prev = armed ? armed : candidate;
  if (prev && same(*prev, *rec)) {
    if (reason.empty()) reason = "traced; the same step as the previous trace: the next calls replay it";
    armed = rec;
    candidate.reset();
  } else {
    keep_reason(prev ? "this call's trace differs from the previous one (a first step, or the state changed): recorded again"
                     : "traced and recorded (the next call's trace is compared with it)");
    armed.reset();
    candidate = rec;
  }
  return result;
}

bool StepCapture::Impl::same(const Record& a, const Record& b) {
  if (!runtime::same_captured(*a.graph, *b.graph) || !a.env.differs(b.env).empty() || a.inputs != b.inputs ||
      a.input_devices != b.input_devices || a.input_grads != b.input_grads || a.draws != b.draws || a.hooks.size() != b.hooks.size() || a.outputs != b.outputs ||
      a.states.size() != b.states.size() || a.sources.size() != b.sources.size() || a.results.size() != b.results.size() ||
      a.donated != b.donated)
    return false;
  for (size_t s = 0; s < a.states.size(); ++s) {
    const StateRec &x = a.states[s], &y = b.states[s];
    if (x.id != y.id || x.impl.expired() || x.shape != y.shape || x.dtype != y.dtype || x.versions != y.versions ||
        x.updated != y.updated || x.grad != y.grad || x.requires_grad != y.requires_grad)
      return false;
  }
  for (size_t r = 0; r < a.results.size(); ++r)
    if (a.results[r].kind != b.results[r].kind || a.results[r].index != b.results[r].index) return false;
  for (size_t p = 0; p < a.sources.size(); ++p) {
    const Source &x = a.sources[p], &y = b.sources[p];
    if (x.kind != y.kind || x.index != y.index) return false;
    if (x.kind == Source::Constant && x.constant != y.constant) {  // made again by the trace: the same bytes?
      if (x.constant->nbytes != y.constant->nbytes || !(x.constant->device == y.constant->device)) return false;
      std::vector<char> u(x.constant->nbytes), v(y.constant->nbytes);
      runtime::download(*x.constant, u.data(), u.size());
      runtime::download(*y.constant, v.data(), v.size());
      if (u != v) return false;
    }
  }
  return true;
}

// ---- replaying ----
std::string StepCapture::Impl::check(const Record& r, const std::vector<Tensor>& inputs) const {
  if (size_t n = detail::pending_count())
    return std::to_string(n) + " tensors were pending before the call (their work would join the step's graph): sync() first";
  if (detail::rng_state().draws) return "random draws were pending before the call: sync() first";
  if (std::string e = r.env.differs(Env::now()); !e.empty()) return e;
  if (inputs.size() != r.inputs.size())
    return std::to_string(inputs.size()) + " inputs, the recorded step had " + std::to_string(r.inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!inputs[k].defined()) return "input " + std::to_string(k) + " is undefined";
    const auto& impl = detail::impl_of(inputs[k]);
    if (impl->error || !impl->buffer || impl->node) return "input " + std::to_string(k) + " is not a realized value";
    if (impl->shape != r.inputs[k].first || impl->dtype != r.inputs[k].second || impl->device != r.input_devices[k])
      return "input " + std::to_string(k) + " is " + sig(impl->dtype, impl->shape) + " on " + impl->device.str() +
             ", the recorded step's was " + sig(r.inputs[k].second, r.inputs[k].first) + " on " + r.input_devices[k].str();
    for (size_t j = 0; j < k; ++j)
      if (detail::impl_of(inputs[j])->buffer == impl->buffer)
        return "inputs " + std::to_string(j) + " and " + std::to_string(k) + " are one value; the recorded step's were two";
    if (wants_grad(*impl) != r.input_grads[k])
      return "input " + std::to_string(k) + (r.input_grads[k] ? " no longer requires" : " now requires") + " grad";
  }
  for (const StateRec& s : r.states) {
    auto impl = s.impl.lock();
    if (!impl) return "a tensor the step reads or updates (" + sig(s.dtype, s.shape) + ") is gone";
    if (impl->error || impl->node || !impl->buffer)
      return "the state tensor " + sig(s.dtype, s.shape) + " is " + (impl->error ? "failed" : "pending") + " (sync() first)";
    if (impl->shape != s.shape || impl->dtype != s.dtype || impl->device != s.device)
      return "the state tensor " + sig(s.dtype, s.shape) + " is now " + sig(impl->dtype, impl->shape) + " on " + impl->device.str();
    if (wants_grad(*impl) != s.requires_grad)
      return "the state tensor " + sig(s.dtype, s.shape) + (s.requires_grad ? " no longer requires" : " now requires") +
             " grad (a parameter frozen or unfrozen)";
    for (size_t k = 0; k < inputs.size(); ++k)
      if (detail::impl_of(inputs[k])->buffer == impl->buffer)
        return "input " + std::to_string(k) + " is the value of a tensor the step reads or updates (" + sig(s.dtype, s.shape) +
               "); the recorded step's was a tensor of its own";
    const TensorImpl* g = impl->grad_meta && impl->grad_meta->grad.defined() ? detail::impl_of(impl->grad_meta->grad).get() : nullptr;
    if (g != s.grad)
      return "the gradient of the parameter " + sig(s.dtype, s.shape) + " is not as the recorded step left it (" +
             (g ? "set" : "none") + " now)";
  }
  for (size_t k = 0; k < r.results.size(); ++k) {
    if (r.donated[k] < 0) continue;
    const auto impl = r.states[size_t(r.sources[size_t(r.donated[k])].index)].impl.lock();
    if (impl->buffer.use_count() != 1)
      return "the buffer of " + sig(impl->dtype, impl->shape) +
             ", which the step updates in place, is shared with another tensor (tracing writes a new buffer then)";
  }
  return "";
}

std::vector<Tensor> StepCapture::Impl::replay(const Record& r, const std::vector<Tensor>& inputs) {
  detail::claim_graph("StepCapture");
  const bool prof = runtime::prof::on();
  if (prof) runtime::prof::mark(runtime::prof::Region::Lookup);
  for (const Hook& h : r.hooks)
    if (h.before) h.before();
  std::vector<std::shared_ptr<TensorImpl>> states;
  states.reserve(r.states.size());
  for (const StateRec& s : r.states) {
    auto impl = s.impl.lock();
    if (!impl || impl->node || !impl->buffer || impl->shape != s.shape || impl->dtype != s.dtype)
      fail("StepCapture", "an on_replay hook left the state tensor " + sig(s.dtype, s.shape) + " pending, gone or of another shape", "");
    states.push_back(std::move(impl));
  }
  std::vector<std::shared_ptr<Buffer>> params;
  params.reserve(r.sources.size());
  for (const Source& s : r.sources)
    params.push_back(s.kind == Source::Input      ? detail::impl_of(inputs[size_t(s.index)])->buffer
                     : s.kind == Source::State    ? states[size_t(s.index)]->buffer
                                                  : s.constant);
  for (size_t k = 0; k < r.results.size(); ++k)
    if (r.donated[k] >= 0 && params[size_t(r.donated[k])].use_count() != 2)
      fail("StepCapture", "an on_replay hook shared the buffer of a tensor the step updates in place", "");
  const RngState st = detail::rng_state();
  std::vector<std::shared_ptr<Buffer>> bufs;
  try {
    bufs = runtime::run_captured(*r.graph, params, {st.seed, st.offset});
  } catch (const runtime::GraphFailure& f) {
    // All or nothing per updated tensor, as sync(): one whose buffer the failed run wrote is lost.
    for (size_t k = 0; k < r.results.size(); ++k)
      if (r.results[k].kind == Result::State && r.donated[k] >= 0 && k < f.donor_written.size() && f.donor_written[k])
        states[size_t(r.results[k].index)]->set_error(std::string(f.what()) +
                                                       " (the failed graph had written this tensor's buffer in place: its value "
                                                       "before the step is lost; restore it from the last checkpoint)");
    if (r.draws) set_rng_state({st.seed, st.offset + r.draws, 0});
    throw Error(f.what());
  }
  if (r.draws) set_rng_state({st.seed, st.offset + r.draws, 0});  // as sync() moves past the step's draws
  params.clear();
  std::vector<Tensor> out(r.outputs.size());
  for (size_t k = 0; k < r.results.size(); ++k) {
    const Result& res = r.results[k];
    if (res.kind == Result::Output) {
      const auto& [shape, dtype] = r.outputs[size_t(res.index)];
      out[size_t(res.index)] = detail::from_buffer(std::move(bufs[k]), shape, dtype);
    } else if (res.kind == Result::State) {
      detail::set_replayed_value(*states[size_t(res.index)], std::move(bufs[k]), r.states[size_t(res.index)].versions);
    }
  }
  for (const Hook& h : r.hooks)
    if (h.after) h.after();
  if (prof) runtime::prof::mark(runtime::prof::Region::Trace);
  return out;
}

}  // namespace tessera
