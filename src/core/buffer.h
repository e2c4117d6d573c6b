// A block of device memory owned by whoever holds the shared_ptr; returned to its allocator on
// destruction. Realized tensors and the IR's leaf nodes hold Buffers.
#pragma once
#include <cstddef>
#include <functional>

#include "tessera/device.h"

#pragma GCC visibility push(default)  // the backend SDK: exported for plugins
namespace tessera {

struct Buffer {
  Device device;
  void* data = nullptr;
  size_t nbytes = 0;
  std::function<void(void*, size_t)> release;  // set by the allocator that made it
  Buffer(Device d, void* p, size_t n, std::function<void(void*, size_t)> r)
      : device(std::move(d)), data(p), nbytes(n), release(std::move(r)) {}
  ~Buffer() { if (release) release(data, nbytes); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

}  // namespace tessera
#pragma GCC visibility pop
