// The NCCL communicator: GPU ranks, buffers in CUDA device memory. Compiled against nccl.h
// (TESSERA_HAVE_NCCL) but linked against nothing: libnccl.so.2 and the CUDA driver are opened
// with dlopen at the first use, as the cuda plugin opens its libraries, so libtessera loads on
// machines without them. Calls are issued on the legacy default stream of the calling thread's
// current device and polled (cuStreamQuery, ncclCommGetAsyncError) until done or past the
// timeout, which aborts the communicator (ncclCommAbort) and throws naming the collective.
// all_to_all is grouped ncclSend/ncclRecv. Ranks' signatures are not exchanged (that needs a
// host channel): NCCL's own checks apply. Built in CI; run only where there is a GPU.
#include "backends/communicator.h"
#include "core/fail.h"

#ifndef TESSERA_HAVE_NCCL
namespace tessera::backends {
bool nccl_built() { return false; }
std::vector<std::shared_ptr<Communicator>> make_nccl_group(int) {
  fail("nccl", "this libtessera was built without NCCL (nccl.h was not found at configure time)", "");
}
}  // namespace tessera::backends
#else
#include <dlfcn.h>
#include <nccl.h>

#include <thread>

namespace tessera::backends {
namespace {

struct Api {
  void* lib = nullptr;
  void* cuda = nullptr;
  ncclResult_t (*CommInitAll)(ncclComm_t*, int, const int*) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*GroupStart)() = nullptr;
  ncclResult_t (*GroupEnd)() = nullptr;
  int (*StreamQuery)(void*) = nullptr;  // the driver's cuStreamQuery: 0 done, 600 not ready
};

template <typename F>
void sym(void* lib, F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (!f) fail("nccl", std::string("symbol ") + name + " missing from the library", "");
}

const Api& api() {
  static Api a = [] {
    Api x;
    x.lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!x.lib) x.lib = dlopen("/usr/local/cuda/lib/libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!x.lib) fail("nccl", std::string("cannot open libnccl.so.2: ") + dlerror(), "");
    x.cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!x.cuda) fail("nccl", "cannot open the CUDA driver (libcuda.so.1): no GPU driver here", "");
    sym(x.lib, x.CommInitAll, "ncclCommInitAll");
    sym(x.lib, x.CommAbort, "ncclCommAbort");
    sym(x.lib, x.CommDestroy, "ncclCommDestroy");
    sym(x.lib, x.CommGetAsyncError, "ncclCommGetAsyncError");
    sym(x.lib, x.GetErrorString, "ncclGetErrorString");
    sym(x.lib, x.AllReduce, "ncclAllReduce");
    sym(x.lib, x.AllGather, "ncclAllGather");
    sym(x.lib, x.ReduceScatter, "ncclReduceScatter");
    sym(x.lib, x.Broadcast, "ncclBroadcast");
    sym(x.lib, x.Reduce, "ncclReduce");
    sym(x.lib, x.Send, "ncclSend");
    sym(x.lib, x.Recv, "ncclRecv");
    sym(x.lib, x.GroupStart, "ncclGroupStart");
    sym(x.lib, x.GroupEnd, "ncclGroupEnd");
    sym(x.cuda, x.StreamQuery, "cuStreamQuery");
    return x;
  }();
  return a;
}

ncclDataType_t type(DType t) {
  switch (t) {
    case DType::Bool: return ncclUint8;
    case DType::Int32: return ncclInt32;
    case DType::Int64: return ncclInt64;
    case DType::Float16: return ncclFloat16;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
  }
  return ncclFloat32;
}

class Nccl final : public Communicator {
 public:
  Nccl(ncclComm_t c, int rank, int size) : c_(c), rank_(rank), size_(size) {}
  ~Nccl() override {
    if (!aborted_) api().CommDestroy(c_);
  }
  std::string name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(const void* s, void* r, size_t n, DType t, ir::ReduceKind k) override {
    live("all_reduce");
    ncclRedOp_t op = k == ir::ReduceKind::Max ? ncclMax : k == ir::ReduceKind::Mean ? ncclAvg : ncclSum;
    run("all_reduce", api().AllReduce(s, r, n, type(t), op, c_, nullptr));
  }
  void all_gather(const void* s, void* r, size_t n, DType t) override {
    live("all_gather");
    run("all_gather", api().AllGather(s, r, n, type(t), c_, nullptr));
  }
  void reduce_scatter(const void* s, void* r, size_t n, DType t) override {
    live("reduce_scatter");
    run("reduce_scatter", api().ReduceScatter(s, r, n, type(t), ncclSum, c_, nullptr));
  }
  void all_to_all(const void* s, void* r, size_t n, DType t) override {
    live("all_to_all");
    const size_t b = n * itemsize(t);
    ncclResult_t rc = api().GroupStart();
    for (int p = 0; p < size_ && rc == ncclSuccess; ++p) {
      rc = api().Send(static_cast<const char*>(s) + size_t(p) * b, n, type(t), p, c_, nullptr);
      if (rc == ncclSuccess) rc = api().Recv(static_cast<char*>(r) + size_t(p) * b, n, type(t), p, c_, nullptr);
    }
    ncclResult_t end = api().GroupEnd();
    run("all_to_all", rc != ncclSuccess ? rc : end);
  }
  void broadcast(const void* s, void* r, size_t n, DType t, int root) override {
    live("broadcast");
    run("broadcast", api().Broadcast(s, r, n, type(t), root, c_, nullptr));
  }
  void reduce(const void* s, void* r, size_t n, DType t, int root) override {
    live("reduce");
    run("reduce", api().Reduce(s, r, n, type(t), ncclSum, root, c_, nullptr));
  }
  void permute(const void* s, void* r, size_t n, DType t, int to, int from) override {
    live("permute");
    ncclResult_t rc = api().GroupStart();
    if (rc == ncclSuccess && to >= 0) rc = api().Send(s, n, type(t), to, c_, nullptr);
    if (rc == ncclSuccess && from >= 0) rc = api().Recv(r, n, type(t), from, c_, nullptr);
    ncclResult_t end = api().GroupEnd();
    run("collective_permute", rc != ncclSuccess ? rc : end);
  }

 private:
  ncclComm_t c_;
  int rank_, size_;
  bool aborted_ = false;

  // After a timeout aborted the communicator, every call fails at once (its state is gone).
  void live(const char* what) const {
    if (aborted_) fail(what, "the communicator was aborted after an earlier collective timed out" + who(), "");
  }
  std::string who() const { return " (nccl communicator, rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ")"; }
  void run(const char* what, ncclResult_t rc) {
    if (rc != ncclSuccess) fail(what, std::string("NCCL error: ") + api().GetErrorString(rc) + who(), "");
    auto deadline = std::chrono::steady_clock::now() + timeout();
    for (;;) {
      int q = api().StreamQuery(nullptr);
      if (q == 0) return;
      if (q != 600) fail(what, "CUDA error " + std::to_string(q) + " while waiting" + who(), "");
      ncclResult_t async = ncclSuccess;
      api().CommGetAsyncError(c_, &async);
      if (async != ncclSuccess && async != ncclInProgress)
        fail(what, std::string("NCCL error: ") + api().GetErrorString(async) + who(), "");
      if (std::chrono::steady_clock::now() > deadline) {
        api().CommAbort(c_);
        aborted_ = true;
        fail(what, "timed out after " + std::to_string(double(timeout().count()) / 1000) +
                       " s waiting for the other ranks (the communicator is aborted)" + who(), "");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
};

}  // namespace

bool nccl_built() { return true; }

std::vector<std::shared_ptr<Communicator>> make_nccl_group(int n) {
  if (n < 1) fail("nccl", "a group needs at least one rank, got " + std::to_string(n), "");
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  std::vector<int> devs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) devs[size_t(i)] = i;
  ncclResult_t rc = api().CommInitAll(comms.data(), n, devs.data());
  if (rc != ncclSuccess) fail("nccl", std::string("ncclCommInitAll over ") + std::to_string(n) + " devices: " + api().GetErrorString(rc), "");
  std::vector<std::shared_ptr<Communicator>> v;
  for (int i = 0; i < n; ++i) v.push_back(std::make_shared<Nccl>(comms[size_t(i)], i, n));
  return v;
}

}  // namespace tessera::backends
#endif
