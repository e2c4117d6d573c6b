// A backend plugin that exercises everything optional in backend interface v3, over the cpu
// backend (reached through the registry, part of the SDK): "v3test:0" and "v3test:1".
//
// - A stream: one worker thread runs every launch and copy in order; copy_in_async and
//   copy_out_async return at once, events are points in the stream, errors found on the worker
//   (an out-of-range gather) are thrown by synchronize() or wait_event().
// - Library calls: it claims every float32/float64 GEMM and runs it with its own "library" (a
//   plain loop accumulating in double over the Step's index maps), which cannot fuse an
//   epilogue, so the runtime splits epilogues off into Elementwise Steps.
// - Whole executables: it takes every program; a run whose slot pointers equal those of one of
//   its last four captures replays it (as a CUDA graph would), reading the random state from the
//   scalars buffer at replay time, so only a fixed address carries new values.
// info(0).description reports what it did: claims, runs, replays, captures, async copies, events.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "backends/backend.h"
#include "backends/plugin.h"
#include "core/fail.h"

namespace tessera::backends {
namespace {

// A FIFO of tasks run by one worker thread; each task's number is its event.
class Stream {
 public:
  Stream() : worker_([this] { loop(); }) {}
  ~Stream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  uint64_t push(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    cv_.notify_all();
    return ++issued_;
  }
  uint64_t issued() {
    std::lock_guard<std::mutex> lock(mu_);
    return issued_;
  }
  bool done(uint64_t point) {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_ >= point;
  }
  // Waits until `point` has run; throws the first error the worker caught, once.
  void wait(uint64_t point) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return finished_ >= point; });
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      std::function<void()> task = std::move(queue_.front());
      queue_.pop_front();
      bool failed_before = error_ != nullptr;
      lock.unlock();
      std::exception_ptr err;
      if (!failed_before) {  // after an error, the rest of the stream is skipped (as a GPU's would be)
        try {
          task();
        } catch (...) {
          err = std::current_exception();
        }
      }
      lock.lock();
      if (err && !error_) error_ = err;
      ++finished_;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t issued_ = 0, finished_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread worker_;
};

// memcpy, but a zero-size copy may have null pointers.
void copy(void* dst, const void* src, size_t n) {
  if (n) std::memcpy(dst, src, n);
}

struct StreamEvent : Event {
  uint64_t point;
  explicit StreamEvent(uint64_t p) : point(p) {}
};

struct CpuKernel : Kernel {
  std::unique_ptr<Kernel> inner;  // the cpu backend's
};

// The "library" GEMM: out[b, m, n] = sum_k A[b, m, k] * B[b, k, n], in double, reading each
// operand through its index map (offsets found once per batch; a masked element reads 0).
struct LibraryGemm : Kernel {
  void run(const kir::Step& st, void* const* slots) const {
    const size_t r = st.shape.size();
    const int64_t M = st.shape[r - 2], N = st.shape[r - 1], K = st.maps[0].shape()[r - 1];
    const int64_t batches = numel(st.shape) / std::max<int64_t>(M * N, 1);
    const bool f64 = st.dtype == DType::Float64;
    std::vector<int64_t> idx(r);
    // Operand `which` of batch b as a rows x cols matrix of values.
    auto load = [&](int which, int64_t b, int64_t rows, int64_t cols, std::vector<double>& out) {
      const char* base = static_cast<const char*>(slots[st.inputs[size_t(which)]]);
      out.assign(size_t(rows * cols), 0.0);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          idx[r - 2] = i, idx[r - 1] = j;
          int64_t off = 0;
          if (!st.maps[size_t(which)].offset(idx.data(), &off)) continue;
          out[size_t(i * cols + j)] = f64 ? reinterpret_cast<const double*>(base)[off] : reinterpret_cast<const float*>(base)[off];
        }
    };
    std::vector<double> a, bm;
    char* out = static_cast<char*>(slots[st.output]);
    for (int64_t b = 0; b < batches; ++b) {
      int64_t rest = b;
      for (size_t d = r - 2; d-- > 0;) {
        idx[d] = rest % st.shape[d];
        rest /= st.shape[d];
      }
      load(0, b, M, K, a);
      load(1, b, K, N, bm);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double acc = 0;
          for (int64_t k = 0; k < K; ++k) acc += a[size_t(m * K + k)] * bm[size_t(k * N + n)];
          int64_t o = (b * M + m) * N + n;
          if (f64) reinterpret_cast<double*>(out)[o] = acc;
          else reinterpret_cast<float*>(out)[o] = float(acc);
        }
    }
  }
};

struct Program : Executable {
  const std::vector<kir::Step>* steps = nullptr;
  std::vector<const Kernel*> kernels;
  // The slot pointers of the last few captures (a parameter updated out of place alternates
  // between two buffers, as CUDA-graph users keep one graph per buffer set).
  std::deque<std::vector<void*>> captured;
};

class V3TestBackend : public Backend {
 public:
  V3TestBackend() : cpu_(backend_for(Device("cpu"))) {}

  std::string name() const override { return "v3test"; }
  int device_count() const override { return 2; }
  DeviceInfo info(int index) const override {
    std::lock_guard<std::mutex> lock(counts_mu_);
    return {Device("v3test", index),
            "interface v3 test backend over the cpu: " + std::to_string(claims_) + " library GEMMs claimed, " +
                std::to_string(runs_) + " whole runs (" + std::to_string(replays_) + " replays, " + std::to_string(captures_) +
                " captures), " + std::to_string(async_copies_) + " async copies, " + std::to_string(device_copies_) +
                " device copies, " + std::to_string(events_) + " events",
            true, false};
  }
  kir::Target properties(int) const override {
    kir::Target t = cpu_.properties(0);
    // One stream (worker thread) for every caller: in-process ranks launching on it at once
    // would queue one rank's collective behind another's that waits for it.
    t.collectives = false;
    // Its library GEMM writes C dense: products written through strides (Step::out_strides)
    // are not for it; the lowering then keeps the dense product and the permute's copy.
    t.gemm_out_strides = false;
    return t;
  }

  void* allocate(int, size_t nbytes) override { return cpu_.allocate(0, nbytes); }
  void free(int, void* ptr, size_t nbytes) override {
    stream_.wait(stream_.issued());  // nothing queued may still use it
    cpu_.free(0, ptr, nbytes);
  }
  void copy_in(void* dst, const void* host, size_t n) override {
    stream_.wait(stream_.push([=] { copy(dst, host, n); }));
  }
  void copy_out(void* host, const void* src, size_t n) override {
    stream_.wait(stream_.push([=] { copy(host, src, n); }));
  }

  std::unique_ptr<Kernel> compile(const kir::Step& st) override {
    auto k = std::make_unique<CpuKernel>();
    k->inner = cpu_.compile(st);
    return k;
  }
  void launch(const Kernel& k, const kir::Step& st, const LaunchArgs& a) override {
    std::vector<void*> slots(a.slots, a.slots + slot_count(st));
    LaunchArgs mine = a;
    enqueue_launch(k, st, std::move(slots), [mine] { return std::pair{mine.seed, mine.offset}; });
  }
  void synchronize() override { stream_.wait(stream_.issued()); }

  Claim claim(const kir::Step& st, int) override {
    bool ok = st.dtype == DType::Float32 || st.dtype == DType::Float64;
    for (DType t : st.input_dtypes) ok &= t == st.dtype;
    if (ok) {
      std::lock_guard<std::mutex> lock(counts_mu_);
      ++claims_;
    }
    return {ok, false};
  }
  std::unique_ptr<Kernel> compile_library(const kir::Step& st) override {
    if (!st.program.empty()) fail("v3test", "a library GEMM was handed an epilogue it said it cannot fuse: " + st.str(), "");
    return std::make_unique<LibraryGemm>();
  }

  std::unique_ptr<Executable> compile_executable(const ExecutableSpec& spec) override {
    auto p = std::make_unique<Program>();
    p->steps = spec.steps;
    p->kernels = spec.kernels;
    return p;
  }
  void run_executable(Executable& e, const RunArgs& a) override {
    Program& p = static_cast<Program&>(e);
    size_t nslots = 0;
    for (const kir::Step& st : *p.steps) nslots = std::max(nslots, slot_count(st));
    std::vector<void*> now(a.slots, a.slots + nslots);
    bool replay = std::find(p.captured.begin(), p.captured.end(), now) != p.captured.end();
    if (!replay) {
      p.captured.push_back(now);
      if (p.captured.size() > 4) p.captured.pop_front();
    }
    {
      std::lock_guard<std::mutex> lock(counts_mu_);
      ++runs_;
      (replay ? replays_ : captures_)++;
    }
    // Every launch reads the random state where the runtime put it, when it runs.
    const auto* scalars = static_cast<const RunScalars*>(a.scalars);
    auto rng = [scalars] { return std::pair{scalars->seed, scalars->offset}; };
    for (size_t s = 0; s < p.steps->size(); ++s) enqueue_launch(*p.kernels[s], (*p.steps)[s], now, rng);
  }

  bool async_copies() const override { return true; }
  void copy_in_async(void* dst, const void* host, size_t n) override {
    count(async_copies_);
    stream_.push([=] { copy(dst, host, n); });
  }
  void copy_out_async(void* host, const void* src, size_t n) override {
    count(async_copies_);
    stream_.push([=] { copy(host, src, n); });
  }
  void copy_device(void* dst, int, const void* src, int, size_t n) override {
    count(device_copies_);
    stream_.push([=] { copy(dst, src, n); });
  }
  std::unique_ptr<Event> record_event(int) override {
    count(events_);
    return std::make_unique<StreamEvent>(stream_.issued());
  }
  bool event_done(const Event& e) override { return stream_.done(static_cast<const StreamEvent&>(e).point); }
  void wait_event(const Event& e) override { stream_.wait(static_cast<const StreamEvent&>(e).point); }

 private:
  // The slots a Step reads or writes lie below this count.
  static size_t slot_count(const kir::Step& st) {
    int top = st.output;
    for (int x : st.inputs) top = std::max(top, x);
    for (int x : st.more_outputs) top = std::max(top, x);
    return size_t(top + 1);
  }
  void count(int64_t& c) {
    std::lock_guard<std::mutex> lock(counts_mu_);
    ++c;
  }
  // rng() gives the random state when the launch runs.
  template <class Rng>
  void enqueue_launch(const Kernel& k, const kir::Step& st, std::vector<void*> slots, Rng rng) {
    if (auto* lib = dynamic_cast<const LibraryGemm*>(&k)) {
      stream_.push([lib, &st, slots = std::move(slots)] { lib->run(st, slots.data()); });
      return;
    }
    const Kernel& inner = *static_cast<const CpuKernel&>(k).inner;
    stream_.push([this, &inner, &st, slots = std::move(slots), rng] {
      auto [seed, offset] = rng();
      cpu_.launch(inner, st, LaunchArgs{slots.data(), seed, offset, 0});
      cpu_.synchronize();
    });
  }

  Backend& cpu_;
  Stream stream_;
  mutable std::mutex counts_mu_;
  int64_t claims_ = 0, runs_ = 0, replays_ = 0, captures_ = 0, async_copies_ = 0, device_copies_ = 0, events_ = 0;
};

std::shared_ptr<Backend> make_v3test(std::string*) { return std::make_shared<V3TestBackend>(); }

}  // namespace
}  // namespace tessera::backends

TESSERA_BACKEND_PLUGIN(tessera::backends::make_v3test)
