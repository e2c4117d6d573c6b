// Umbrella header of the public API (with <iostream>, so std::cout << tensor works, as with
// libtorch's torch/torch.h).
#pragma once
#include <iostream>

#include "tessera/advise.h"
#include "tessera/autocast.h"
#include "tessera/bucket.h"
#include "tessera/capture.h"
#include "tessera/data.h"
#include "tessera/device.h"
#include "tessera/distributed.h"
#include "tessera/dtype.h"
#include "tessera/error.h"
#include "tessera/export.h"
#include "tessera/io.h"
#include "tessera/memory.h"
#include "tessera/metrics.h"
#include "tessera/nn.h"
#include "tessera/ops.h"
#include "tessera/optim.h"
#include "tessera/scope.h"
#include "tessera/shape.h"
#include "tessera/tensor.h"
#include "tessera/version.h"
