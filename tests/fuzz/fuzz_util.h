// Shared by the libFuzzer harnesses: the input as a file the readers open by path, without
// touching the disk (a memfd, named through /proc/self/fd).
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace fuzz {

class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) : fd_(memfd_create("tessera-fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) std::abort();
    for (size_t done = 0; done < size;) {
      ssize_t w = write(fd_, data + done, size - done);
      if (w <= 0) std::abort();
      done += size_t(w);
    }
  }
  ~MemFile() { close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

}  // namespace fuzz
