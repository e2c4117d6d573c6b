// Step capture: a training (or any) step traced once, then re-run as its compiled graph on the
// current inputs and state, without tracing the forward pass, autodiff and the optimizer again.
//
//   tessera::StepCapture step([&](const std::vector<Tensor>& in) {
//     Tensor loss = model.loss(in[0], in[1]);
//     loss.backward();
//     opt.step();
//     opt.zero_grad();
//     return std::vector<Tensor>{loss};
//   });
//   for (...) { float l = step({x, y})[0].item<float>(); }
//
// A call traces `fn` and realizes everything it left pending as one graph (as sync() would),
// noting which tensors the graph read (the inputs, tensors that existed before the call: the
// state, such as parameters, optimizer moments and the optimizer's learning-rate scalars) and
// which of them it updated. Once two consecutive traces made the same graph from the same tensors
// (the first step of an optimizer makes its moments, so its graph differs), later calls bind the
// inputs' and the state's current buffers to that compiled graph, run it, and give the updated
// state tensors their new values, with the same results bit for bit as tracing would give. Host
// code registered with on_replay() (the optimizers' step counters and scalars) runs at each replay.
//
// The contract: `fn` must trace the same graph whenever the inputs' shapes and dtypes, the state's
// and the thread's settings (grad mode, autocast, module scope, compile settings) are the same;
// host control flow depending on anything else is not seen (then call reset()). That includes an
// optimizer's options other than its learning rate (betas, eps, momentum, weight decay: constants
// of the recorded graph; set_lr is seen). Random draws (dropout) replay as tracing would draw
// them. A call traces instead of replaying, and last_reason() says why, when: TESSERA_CAPTURE=0;
// something was pending before the call; an input is pending, or differs in shape, dtype, device
// or requires_grad, or is another input's or a state tensor's value; a state tensor is gone,
// pending, failed, changed shape or requires_grad (a parameter frozen); a parameter's gradient
// is not as the traced step left it; a buffer the step updates in place is shared with another
// tensor; the settings differ. A trace is never replayed (and the reason says why) when it read a
// value back mid-step (item(), a GradScaler), read a tensor it made from host values (pass it as
// an input, or keep it in a tensor that lives across steps), ran on several devices, returned a
// tensor that existed before the step and gave it a new value, or left a value it made
// referenced outside (return it instead). A step returning an undefined tensor is an error.
// The outputs are realized tensors without autodiff history (on the traced call too).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessera/tensor.h"

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera {

class StepCapture {
 public:
  using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
  explicit StepCapture(Fn fn);
  ~StepCapture();
  StepCapture(const StepCapture&) = delete;
  StepCapture& operator=(const StepCapture&) = delete;

  // Runs the step on `inputs` (realized tensors); returns fn's outputs, realized.
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs);
  // Whether the last call replayed; if not, why it traced ("" before the first call).
  bool last_replayed() const;
  const std::string& last_reason() const;
  int64_t replays() const;
  int64_t traces() const;
  // Forgets the recorded step: the next two calls trace.
  void reset();

  // While a StepCapture traces its step (recording() is true): `before` runs at each later replay
  // before the graph's inputs are bound, `after` once the state holds its new values. `before` may
  // give the tensors in `refreshes` new values with set_data, as the traced step did before
  // reading them; a tensor the step gave a new value with set_data that no hook refreshes makes
  // the step not replayable. The optimizers register their step counters and their
  // learning-rate and bias-correction scalars this way.
  static bool recording();
  static void on_replay(std::function<void()> before, std::function<void()> after = {}, const std::vector<Tensor>& refreshes = {});

  struct __attribute__((visibility("hidden"))) Impl;  // not exported (check-exports)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
#pragma GCC visibility pop
