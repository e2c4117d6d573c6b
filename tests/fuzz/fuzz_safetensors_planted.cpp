// The proof that the safetensors harness reaches the reader's checks: a copy of the reader,
// compiled here with TESSERA_FUZZ_PLANTED_BUG (it then trusts a tensor's shape without checking
// it against its data_offsets, and copies past the file), must be caught by ASan within the
// bounded run that finds nothing in the real reader. Its ctest passes only when it is caught.
// The copy lives in namespace tessera::io_planted so that it does not collide with the library's.
#define TESSERA_FUZZ_PLANTED_BUG 1
#define io io_planted
#include "io/safetensors.cpp"
#undef io

#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::MemFile f(data, size);
  try {
    tessera::io_planted::load_safetensors(f.path());
  } catch (const tessera::Error&) {
  }
  return 0;
}
