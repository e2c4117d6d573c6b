// Mixed precision: which ops run in which dtype while an Autocast is alive on the calling thread.
//
//   { tessera::Autocast ac{tessera::DType::BFloat16};   // forward and loss under autocast
//     loss = cross_entropy(model(x), y); }
//   loss.backward();                                     // gradients flow to float32 parameters
//
// The rule table (docs/architecture.md, "Autocast"):
//   matmul (and every op built on it: linear, bmm, attention's two products, the LM head) and
//   conv (conv1d, conv2d, conv_transpose2d, conv_general): float32 operands are cast to the
//   autocast dtype; the product accumulates in float32 and returns float32.
//   Everything else (elementwise ops, reductions, softmax, norms, pooling, the losses, the
//   optimizers): float32, untouched. Parameters and optimizer state stay float32; a parameter's
//   gradient is float32 (its bfloat16 copy's cotangent, cast back). float64 and integer operands
//   are never cast.
// Nested Autocasts replace the setting until they end; Autocast{t, false} turns it off inside.
#pragma once
#include <optional>

#include "tessera/dtype.h"

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera {

class Autocast {
 public:
  // dtype: BFloat16 or Float16 (anything else is an error); enabled = false: a no-autocast scope.
  explicit Autocast(DType dtype = DType::BFloat16, bool enabled = true);
  ~Autocast();  // restores the setting it replaced
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  std::optional<DType> previous_;
};

// The dtype products take their float32 operands in on this thread, or nullopt outside autocast.
std::optional<DType> autocast_dtype();

}  // namespace tessera
#pragma GCC visibility pop
