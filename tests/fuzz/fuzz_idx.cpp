// libFuzzer: the IDX image reader (Fashion-MNIST's format; gzip or, as zlib reads it too, raw).
// The input is split in two at its first byte's share of the rest: the images file and the
// labels file, written to a scratch folder that FashionMNIST reads. Loads or one tessera::Error.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "tessera/data.h"
#include "tessera/error.h"

namespace {
// A folder of its own, removed at exit.
const std::string& scratch() {
  static const struct Scratch {
    std::string dir;
    Scratch() {
      // In memory where there is a tmpfs: each input is two file writes.
      std::filesystem::path base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
      dir = (base / ("tessera-fuzz-idx-" + std::to_string(getpid()))).string();
      std::filesystem::create_directories(dir);
    }
    ~Scratch() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } s;
  return s.dir;
}
void write(const std::string& path, const uint8_t* p, size_t n) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(p), std::streamsize(n));
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t rest = size - 1, cut = rest * data[0] / 255;
  write(scratch() + "/train-images-idx3-ubyte.gz", data + 1, cut);
  write(scratch() + "/train-labels-idx1-ubyte.gz", data + 1 + cut, rest - cut);
  try {
    tessera::data::FashionMNIST m(tessera::data::FashionMNIST::Part::Train, scratch(), {});
    if (m.size() > 0) m.batch_at({0, m.size() - 1});
  } catch (const tessera::Error&) {
  }
  return 0;
}
