// tessera::plan_memory, pending_memory_plan, last_memory_plan: the plan of the graph sync()
// would run (or ran last), compiled through the cache without running.
#include "core/fail.h"
#include "runtime/memory_plan.h"
#include "runtime/realize.h"
#include "tensor/tensor_impl.h"
#include "tessera/memory.h"

namespace tessera {
namespace {

MemoryPlan plan_of(const std::vector<runtime::Request>& req) {
  if (req.empty()) return {};
  for (auto& r : req)
    if (r.node->device != req.front().node->device)
      fail("plan_memory", "pending tensors on two devices ('" + req.front().node->device.str() + "' and '" +
                              r.node->device.str() + "') run as two graphs; ask for one device's tensors at a time");
  return runtime::memory_plan_of(*runtime::compile_only(req));
}

}  // namespace

MemoryPlan plan_memory(const std::vector<Tensor>& outputs) {
  for (auto& t : outputs)
    if (!t.defined()) fail("plan_memory", "called with an undefined tensor");
  return outputs.empty() ? MemoryPlan{} : plan_of(detail::pending_requests(outputs));
}

MemoryPlan pending_memory_plan() { return plan_of(detail::pending_requests()); }

MemoryPlan last_memory_plan() {
  auto plan = runtime::last_executed_plan();
  return plan ? runtime::memory_plan_of(*plan) : MemoryPlan{};
}

}  // namespace tessera
