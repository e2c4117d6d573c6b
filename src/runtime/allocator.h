// The caching device allocator: buffers freed by their owners go back to a per-device cache of
// exact (rounded) sizes and are reused, the last freed first; live and high-water bytes feed
// tessera::metrics().
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/buffer.h"

namespace tessera::runtime {

// Fails "[memory] out of memory on <device>: ..." when nbytes on top of what is live there would
// cross the memory limit (tessera::set_memory_limit), or when the backend cannot allocate even
// after the allocator's cached blocks of that device went back to it.
std::shared_ptr<Buffer> allocate(const Device& d, size_t nbytes);
constexpr size_t kAllocRound = 256;  // every allocation is rounded up to this
constexpr size_t allocated_size(size_t nbytes) { return (nbytes + kAllocRound - 1) / kAllocRound * kAllocRound; }
// The bytes of live buffers on d (rounded as allocated); the memory limit in force (0: none) and
// where it came from ("TESSERA_MEMORY_LIMIT", "set_memory_limit").
size_t live_bytes_on(const Device& d);
size_t memory_limit();
const char* memory_limit_source();
// Host transfers (counted by the backend's device): a new buffer holding a copy of `bytes`,
// and a buffer's first `nbytes` copied to the host.
std::shared_ptr<Buffer> upload(const Device& d, const void* bytes, size_t nbytes);
void download(const Buffer& b, void* host, size_t nbytes);
// A new buffer on d, another device of src's backend, holding src's bytes (Backend::copy_device).
std::shared_ptr<Buffer> copy_between_devices(const Buffer& src, const Device& d);
// Throws the registry's clear error for unknown devices.
void check_device(const Device& d);

// Sentinel mode (debug, any backend): while set_sentinels(bytes > 0) is on, every buffer
// allocated gets `bytes` (rounded up to 256) of kSentinelByte right before its first byte and
// from right after its last byte, written with the backend's copy_in; it bypasses the cache.
// The guards are read back with copy_out when the buffer is freed and by check_sentinels(),
// which checks every live guarded buffer and returns (and forgets) every violation found
// since the last call, each naming the buffer's size and device and the byte that changed.
constexpr unsigned char kSentinelByte = 0x5A;
void set_sentinels(size_t bytes);  // 0: off (buffers already guarded stay guarded)
std::vector<std::string> check_sentinels();
int64_t sentinel_bytes_checked();  // guard bytes verified so far

}  // namespace tessera::runtime
