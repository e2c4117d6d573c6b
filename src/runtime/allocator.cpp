#include "runtime/allocator.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <vector>

#include "backends/backend.h"
#include "compiler/lower.h"
#include "core/fail.h"
#include "runtime/metrics_impl.h"
#include "tessera/memory.h"

namespace tessera::runtime {
namespace {

using compiler::mib;

constexpr size_t kMaxCached = size_t(4) << 30;  // beyond this, freed blocks go back to the backend

using DeviceKey = std::pair<std::string, int>;
struct Cache {
  std::mutex mu;
  std::map<DeviceKey, std::multimap<size_t, void*>> free_blocks;  // device -> size -> ptr
  size_t cached = 0;
  std::map<DeviceKey, size_t> live;  // rounded bytes of live buffers per device (the memory limit's count)
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
    c.live[{d.kind, d.index}] -= rounded;
    if (c.cached + rounded <= kMaxCached) {
      c.free_blocks[{d.kind, d.index}].emplace(rounded, p);
      c.cached += rounded;
      return;
    }
  }
  backends::backend_for(d).free(d.index, p, rounded);
}

// The memory limit: set_memory_limit's value, else TESSERA_MEMORY_LIMIT's (read once), else none.
std::atomic<size_t> g_limit_set{0};
size_t env_limit() {
  static const size_t v = [] {
    const char* e = std::getenv("TESSERA_MEMORY_LIMIT");
    if (!e || !*e) return size_t(0);
    MemoryBudget b = MemoryBudget::parse(e);
    if (!b.bytes) fail("memory", std::string("TESSERA_MEMORY_LIMIT='") + e + "' must be bytes (200MB, 1.5GiB, 1048576), not a fraction", "");
    return b.bytes;
  }();
  return v;
}

// Returns d's cached blocks to its backend (under c.mu); the bytes released.
size_t release_cached(Cache& c, const Device& d) {
  auto it = c.free_blocks.find({d.kind, d.index});
  if (it == c.free_blocks.end()) return 0;
  size_t freed = 0;
  backends::Backend& be = backends::backend_for(d);
  for (auto& [size, p] : it->second) be.free(d.index, p, size), freed += size;
  c.cached -= freed;
  c.free_blocks.erase(it);
  return freed;
}

// ---- sentinel mode (debug) ----
// A guarded block is [guard][nbytes of data][slack to a multiple of kAllocRound][guard]; the caller
// gets base + guard. Guarded blocks bypass the cache: each comes from and goes back to the backend.
struct Guarded {
  Device device;
  void* base;
  size_t nbytes, guard, total;
};
struct Sentinels {
  std::mutex mu;
  std::atomic<size_t> bytes{0};
  std::map<void*, Guarded> live;  // by the pointer handed out
  std::vector<std::string> violations;
  int64_t checked = 0;
};
Sentinels& sentinels() {
  static Sentinels* s = new Sentinels();
  return *s;
}

// The guard ranges of a block, relative to its base: before the data and after it.
std::vector<std::pair<size_t, size_t>> guard_ranges(const Guarded& g) {
  return {{0, g.guard}, {g.guard + g.nbytes, g.total}};
}

// Reads a block's guards back; returns a description of the first changed byte ("" when intact).
std::string check_block(const Guarded& g) {
  backends::Backend& be = backends::backend_for(g.device);
  be.synchronize();
  for (auto [b, e] : guard_ranges(g)) {
    std::vector<unsigned char> seen(e - b);
    be.copy_out(seen.data(), static_cast<char*>(g.base) + b, e - b);
    for (size_t i = 0; i < seen.size(); ++i)
      if (seen[i] != kSentinelByte) {
        int64_t at = int64_t(b + i) - int64_t(g.guard);
        char what[200];
        std::snprintf(what, sizeof what,
                      "a %zu-byte buffer on %s: the sentinel byte %lld byte(s) %s it changed (0x%02x, expected 0x%02x)",
                      g.nbytes, g.device.str().c_str(), (long long)(at < 0 ? -at : at - int64_t(g.nbytes) + 1),
                      at < 0 ? "before the start of" : "past the end of", seen[i], kSentinelByte);
        return what;
      }
  }
  return "";
}

void record_check(Sentinels& s, const Guarded& g, const std::string& why) {
  s.checked += int64_t(g.total - g.nbytes);
  if (!why.empty()) s.violations.push_back(why);
}

std::shared_ptr<Buffer> allocate_guarded(const Device& d, size_t nbytes, size_t guard) {
  backends::Backend& be = backends::backend_for(d);
  size_t rounded = allocated_size(nbytes);
  Guarded g{d, nullptr, nbytes, guard, guard + rounded + guard};
  g.base = be.allocate(d.index, g.total);
  for (auto [b, e] : guard_ranges(g)) {
    std::vector<unsigned char> pattern(e - b, kSentinelByte);
    be.copy_in(static_cast<char*>(g.base) + b, pattern.data(), e - b);
  }
  void* p = static_cast<char*>(g.base) + guard;
  {
    Sentinels& s = sentinels();
    std::lock_guard<std::mutex> lock(s.mu);
    s.live.emplace(p, g);
  }
  add_live_bytes(int64_t(rounded));
  return std::make_shared<Buffer>(d, p, nbytes, [rounded](void* ptr, size_t) {
    add_live_bytes(-int64_t(rounded));
    Sentinels& s = sentinels();
    Guarded blk;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      auto it = s.live.find(ptr);
      blk = it->second;
      s.live.erase(it);
    }
    std::string why;
    try {
      why = check_block(blk);
    } catch (const std::exception& e) {  // a deleter must not throw
      why = std::string("sentinels of a buffer could not be read back: ") + e.what();
    }
    {
      std::lock_guard<std::mutex> lock(s.mu);
      record_check(s, blk, why.empty() ? why : why + " (found when it was freed)");
    }
    backends::backend_for(blk.device).free(blk.device.index, blk.base, blk.total);
  });
}

}  // namespace

std::shared_ptr<Buffer> allocate(const Device& d, size_t nbytes) {
  if (size_t guard = sentinels().bytes.load()) return allocate_guarded(d, nbytes, guard);
  size_t rounded = allocated_size(nbytes);
  void* p = nullptr;
  Cache& c = cache();
  const DeviceKey key{d.kind, d.index};
  const size_t limit = memory_limit();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    const size_t live = c.live[key];
    if (limit && live + rounded > limit)
      fail("memory", "out of memory on " + d.str() + ": allocating " + mib(rounded) + " beside the " + mib(live) +
                         " live there would cross the memory limit of " + mib(limit) + " (" + memory_limit_source() + ")",
           "");
    // The block of this size freed last: a loop's buffers come back at the same addresses (a
    // replayed whole executable finds its pointers again) and still warm in cache.
    auto& blocks = c.free_blocks[key];
    auto [first, last] = blocks.equal_range(rounded);
    if (first != last) {
      auto it = std::prev(last);
      p = it->second;
      blocks.erase(it);
      c.cached -= rounded;
    }
  }
  if (!p) {
    try {
      p = backends::backend_for(d).allocate(d.index, rounded);
    } catch (const Error&) {  // the cached blocks back to the backend, then once more
      size_t freed = 0, live = 0;
      {
        std::lock_guard<std::mutex> lock(c.mu);
        freed = release_cached(c, d);
        live = c.live[key];
      }
      try {
        if (!freed) throw;
        p = backends::backend_for(d).allocate(d.index, rounded);
      } catch (const Error& e) {
        fail("memory", "out of memory on " + d.str() + ": allocating " + mib(rounded) + " beside the " + mib(live) +
                           " live there failed (" + e.what() + "), also after returning " + mib(freed) + " of cached blocks",
             "");
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.live[key] += rounded;
  }
  add_live_bytes(int64_t(rounded));
  return std::make_shared<Buffer>(d, p, nbytes, [d, rounded](void* ptr, size_t) { release(d, ptr, rounded); });
}

size_t live_bytes_on(const Device& d) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.live.find({d.kind, d.index});
  return it == c.live.end() ? 0 : it->second;
}

size_t memory_limit() {
  size_t set = g_limit_set.load();
  return set ? set : env_limit();
}

const char* memory_limit_source() { return g_limit_set.load() ? "set_memory_limit" : "TESSERA_MEMORY_LIMIT"; }

}  // namespace tessera::runtime

namespace tessera {
void set_memory_limit(size_t bytes) { runtime::g_limit_set = bytes; }
size_t memory_limit() { return runtime::memory_limit(); }
}  // namespace tessera

namespace tessera::runtime {
namespace {

// Uploads still in flight on backends with asynchronous copies: the host bytes they read, kept
// until an event recorded after the copy has passed.
struct InFlight {
  backends::Backend* be;
  std::unique_ptr<backends::Event> done;
  std::vector<char> bytes;
};
std::mutex g_flight_mu;
std::deque<InFlight>& in_flight() {
  static auto* q = new std::deque<InFlight>();
  return *q;
}
// Drops the uploads whose copies have completed (under g_flight_mu).
void reap_uploads() {
  auto& q = in_flight();
  while (!q.empty() && q.front().be->event_done(*q.front().done)) q.pop_front();
}

}  // namespace

std::shared_ptr<Buffer> upload(const Device& d, const void* bytes, size_t nbytes) {
  auto buf = allocate(d, nbytes);
  backends::Backend& be = backends::backend_for(d);
  if (be.async_copies() && nbytes) {
    std::vector<char> staged(static_cast<const char*>(bytes), static_cast<const char*>(bytes) + nbytes);
    be.copy_in_async(buf->data, staged.data(), nbytes);
    std::unique_ptr<backends::Event> done = be.record_event(d.index);
    std::lock_guard<std::mutex> lock(g_flight_mu);
    reap_uploads();
    if (done) in_flight().push_back({&be, std::move(done), std::move(staged)});  // the vector's bytes do not move
  } else {
    be.copy_in(buf->data, bytes, nbytes);
  }
  counters().bytes_to_device += int64_t(nbytes);
  device_counters(d.kind).bytes_to_device += int64_t(nbytes);
  return buf;
}

void download(const Buffer& b, void* host, size_t nbytes) {
  backends::Backend& be = backends::backend_for(b.device);
  if (be.async_copies() && nbytes) {
    be.copy_out_async(host, b.data, nbytes);
    if (std::unique_ptr<backends::Event> done = be.record_event(b.device.index)) be.wait_event(*done);
  } else {
    be.copy_out(host, b.data, nbytes);
  }
  counters().bytes_to_host += int64_t(nbytes);
  device_counters(b.device.kind).bytes_to_host += int64_t(nbytes);
}

std::shared_ptr<Buffer> copy_between_devices(const Buffer& src, const Device& d) {
  auto buf = allocate(d, src.nbytes);
  backends::backend_for(d).copy_device(buf->data, d.index, src.data, src.device.index, src.nbytes);
  return buf;
}

void check_device(const Device& d) { backends::backend_for(d); }

void set_sentinels(size_t bytes) { sentinels().bytes = allocated_size(bytes); }

std::vector<std::string> check_sentinels() {
  Sentinels& s = sentinels();
  std::vector<Guarded> blocks;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    for (auto& [p, g] : s.live) blocks.push_back(g);
  }
  std::vector<std::string> found;
  for (const Guarded& g : blocks) found.push_back(check_block(g));
  std::lock_guard<std::mutex> lock(s.mu);
  for (size_t i = 0; i < blocks.size(); ++i) record_check(s, blocks[i], found[i]);
  std::vector<std::string> v;
  v.swap(s.violations);
  return v;
}

int64_t sentinel_bytes_checked() {
  std::lock_guard<std::mutex> lock(sentinels().mu);
  return sentinels().checked;
}

}  // namespace tessera::runtime
