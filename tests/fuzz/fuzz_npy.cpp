// libFuzzer: the .npy reader (tessera::io::load_npy: the magic, version, header dictionary, dtype,
// order and shape, and the data's size against the file) on arbitrary bytes. Every input either
// loads -- and its values are read back -- or raises one tessera::Error; anything else (a crash,
// a sanitizer report, another exception) is a finding.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "tessera/error.h"
#include "tessera/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::MemFile f(data, size);
  try {
    tessera::Tensor t = tessera::io::load_npy(f.path());
    (void)t.to_vector<double>();
  } catch (const tessera::Error&) {
  }
  return 0;
}
