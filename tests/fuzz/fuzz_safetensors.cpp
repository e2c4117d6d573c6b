// libFuzzer: the safetensors reader on arbitrary bytes. Every input either loads or raises one
// tessera::Error; anything else (a crash, a sanitizer report, another exception) is a finding.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "tessera/error.h"
#include "tessera/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::MemFile f(data, size);
  try {
    tessera::io::Metadata meta;
    tessera::io::load_safetensors(f.path(), &meta);
  } catch (const tessera::Error&) {
  }
  return 0;
}
