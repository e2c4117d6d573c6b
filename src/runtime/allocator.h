// The caching device allocator: buffers freed by their owners go back to a per-device cache of
// exact (rounded) sizes and are reused; live and high-water bytes feed tessera::metrics().
#pragma once
#include <memory>

#include "core/buffer.h"

namespace tessera::runtime {

std::shared_ptr<Buffer> allocate(const Device& d, size_t nbytes);
// Host transfers (counted by the backend's device): a new buffer holding a copy of `bytes`,
// and a buffer's first `nbytes` copied to the host.
std::shared_ptr<Buffer> upload(const Device& d, const void* bytes, size_t nbytes);
void download(const Buffer& b, void* host, size_t nbytes);
// Throws the registry's clear error for unknown devices.
void check_device(const Device& d);

}  // namespace tessera::runtime
