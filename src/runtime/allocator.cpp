#include "runtime/allocator.h"

#include <map>
#include <mutex>
#include <vector>

#include "backends/backend.h"
#include "runtime/metrics_impl.h"

namespace tessera::runtime {
namespace {

constexpr size_t kRound = 256;
constexpr size_t kMaxCached = size_t(4) << 30;  // beyond this, freed blocks go back to the backend

struct Cache {
  std::mutex mu;
  std::map<std::pair<std::string, int>, std::multimap<size_t, void*>> free_blocks;  // device -> size -> ptr
  size_t cached = 0;
};
Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: buffers may die during static destruction
  return *c;
}

void release(const Device& d, void* p, size_t rounded) {
  add_live_bytes(-int64_t(rounded));
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.cached + rounded <= kMaxCached) {
      c.free_blocks[{d.kind, d.index}].emplace(rounded, p);
      c.cached += rounded;
      return;
    }
  }
  backends::backend_for(d).free(d.index, p, rounded);
}

}  // namespace

std::shared_ptr<Buffer> allocate(const Device& d, size_t nbytes) {
  size_t rounded = (nbytes + kRound - 1) / kRound * kRound;
  void* p = nullptr;
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto& blocks = c.free_blocks[{d.kind, d.index}];
    auto it = blocks.find(rounded);
    if (it != blocks.end()) {
      p = it->second;
      blocks.erase(it);
      c.cached -= rounded;
    }
  }
  if (!p) p = backends::backend_for(d).allocate(d.index, rounded);
  add_live_bytes(int64_t(rounded));
  return std::make_shared<Buffer>(d, p, nbytes, [d, rounded](void* ptr, size_t) { release(d, ptr, rounded); });
}

std::shared_ptr<Buffer> upload(const Device& d, const void* bytes, size_t nbytes) {
  auto buf = allocate(d, nbytes);
  backends::backend_for(d).copy_in(buf->data, bytes, nbytes);
  counters().bytes_to_device += int64_t(nbytes);
  return buf;
}

void download(const Buffer& b, void* host, size_t nbytes) {
  backends::backend_for(b.device).copy_out(host, b.data, nbytes);
  counters().bytes_to_host += int64_t(nbytes);
}

void check_device(const Device& d) { backends::backend_for(d); }

}  // namespace tessera::runtime
