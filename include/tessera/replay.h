// A recorded trace, replayed: the lazy graph that computed some outputs from some argument
// tensors, kept so that the same computation on new arguments of the same shapes, dtypes and
// devices is rebuilt node by node without running the ops' frontends (broadcasting, promotion,
// shape rules, decompositions) again. The nodes rebuilt equal those tracing would have made
// (ops, attributes, shapes, scopes), so sync() builds the same graph and hits the compile cache.
// tessera::onnx's models use it for repeated inference calls (docs/architecture.md, ONNX import).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/tensor.h"

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera {

class Replay {
 public:
  // A counter of values realized so far (every sync, item(), ...): take it before tracing and
  // pass it to record(), which refuses a trace during which anything was computed (a value read
  // back mid-trace may have steered it).
  static uint64_t epoch();
  // Records how `outputs` were computed from `args` (the tensors a replay substitutes: inputs and
  // parameters; any other realized tensor the trace read is kept as a constant). nullptr when the
  // trace cannot be replayed: gradients are being recorded for an argument (grad mode on and an
  // argument requires grad), an output is neither pending nor one of the args, the graph draws
  // random numbers, or a value was realized since `since`. The caller promises that tracing
  // depends on nothing else that can change: the arguments' shapes, dtypes and devices are
  // checked at replay, their values are read when the graph runs, and thread-local state that
  // steers tracing (autocast, the module scope) must be part of the caller's key.
  static std::shared_ptr<const Replay> record(const std::vector<Tensor>& args, const std::vector<Tensor>& outputs, uint64_t since);
  // The outputs for `args` (pending tensors, as tracing would give: an output that was an argument
  // is that argument's handle). Empty when the arguments do not match the recorded ones in count,
  // shape, dtype or device, or gradients would be recorded for one of them: trace instead.
  std::vector<Tensor> run(const std::vector<Tensor>& args) const;
  size_t nodes() const;  // the nodes one replay rebuilds

  struct Impl;
  explicit Replay(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace tessera
#pragma GCC visibility pop
