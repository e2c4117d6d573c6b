// Placeholder translation unit replaced by the emitter (this commit publishes the interface).
#include "backends/stablehlo/emit.h"
