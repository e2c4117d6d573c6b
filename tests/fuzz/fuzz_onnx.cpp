// libFuzzer: the ONNX importer's reader (tessera::onnx::load: protobuf parsing, opset and node
// checks, initializers inline or external, every size against the bytes present) on arbitrary
// bytes, and the same bytes as a TensorProto .pb. Every input either loads or raises one
// tessera::Error; anything else (a crash, a sanitizer report, another exception) is a finding.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "tessera/error.h"
#include "tessera/onnx.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::MemFile f(data, size);
  try {
    auto m = tessera::onnx::load(f.path());
    (void)m->named_parameters();
  } catch (const tessera::Error&) {
  }
  try {
    tessera::onnx::load_tensor(f.path());
  } catch (const tessera::Error&) {
  }
  return 0;
}
