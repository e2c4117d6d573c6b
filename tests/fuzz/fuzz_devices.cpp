// libFuzzer: the advisor's device-file parser (JSON: one device or an array of them). Every input
// gives devices or one tessera::Error.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "tessera/advise.h"
#include "tessera/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::MemFile f(data, size);
  try {
    tessera::advise::load_devices_json(f.path());
  } catch (const tessera::Error&) {
  }
  return 0;
}
