// Umbrella header of the public API.
#pragma once
#include "tessera/data.h"
#include "tessera/device.h"
#include "tessera/dtype.h"
#include "tessera/error.h"
#include "tessera/io.h"
#include "tessera/metrics.h"
#include "tessera/nn.h"
#include "tessera/ops.h"
#include "tessera/optim.h"
#include "tessera/scope.h"
#include "tessera/shape.h"
#include "tessera/tensor.h"
