// Autocast's thread-local setting; matmul and conv read it (ops.cpp, conv_ops.cpp).
#include "tessera/autocast.h"

#include "core/fail.h"

namespace tessera {
namespace {
thread_local std::optional<DType> g_autocast;
}

Autocast::Autocast(DType dtype, bool enabled) : previous_(g_autocast) {
  if (dtype != DType::BFloat16 && dtype != DType::Float16)
    fail("autocast", std::string("runs products in bfloat16 or float16, not ") + dtype_name(dtype));
  g_autocast = enabled ? std::optional<DType>(dtype) : std::nullopt;
}

Autocast::~Autocast() { g_autocast = previous_; }

std::optional<DType> autocast_dtype() { return g_autocast; }

}  // namespace tessera
