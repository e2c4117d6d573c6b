// tessera._C._optim: the multi-tensor update kernels of optim.h that tessera.optim's SGD, Adam
// and AdamW call (one call updates a parameter group in place, lazily), and clip_grad_norm for
// tessera.nn.utils. Optional tensors (a gradient, a momentum buffer) are None in Python and
// undefined Tensors in C++.
#include <optional>
#include <vector>

#include "common.h"
#include "tessera/optim.h"

namespace tpy {
namespace {

using OptTensor = std::optional<Tensor>;
Tensor or_undefined(const OptTensor& t) { return t ? *t : Tensor(); }
OptTensor or_none(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }
std::vector<Tensor> or_undefined(const std::vector<OptTensor>& ts) {
  std::vector<Tensor> r;
  r.reserve(ts.size());
  for (auto& t : ts) r.push_back(or_undefined(t));
  return r;
}

void bind_optim_kernels(nb::module_& m) {
  m.def(
      "sgd_update",
      [](const std::vector<Tensor>& params, const std::vector<OptTensor>& grads, const std::vector<OptTensor>& bufs, double lr,
         double momentum, double dampening, double weight_decay, bool nesterov) {
        auto r = tessera::optim::sgd_update(params, or_undefined(grads), or_undefined(bufs),
                                            {.lr = lr, .momentum = momentum, .dampening = dampening,
                                             .weight_decay = weight_decay, .nesterov = nesterov});
        std::vector<OptTensor> out;
        for (auto& t : r) out.push_back(or_none(t));
        return out;
      },
      nb::arg("params"), nb::arg("grads"), nb::arg("momentum_buffers"), nb::arg("lr"), nb::arg("momentum"),
      nb::arg("dampening"), nb::arg("weight_decay"), nb::arg("nesterov"));
  m.def(
      "adam_update",
      [](const std::vector<Tensor>& params, const std::vector<OptTensor>& grads, const std::vector<Tensor>& exp_avg,
         const std::vector<Tensor>& exp_avg_sq, int64_t step, double lr, double beta1, double beta2, double eps,
         double weight_decay, bool decoupled) {
        tessera::optim::adam_update(params, or_undefined(grads), exp_avg, exp_avg_sq, step,
                                    {.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = weight_decay},
                                    decoupled);
      },
      nb::arg("params"), nb::arg("grads"), nb::arg("exp_avg"), nb::arg("exp_avg_sq"), nb::arg("step"), nb::arg("lr"),
      nb::arg("beta1"), nb::arg("beta2"), nb::arg("eps"), nb::arg("weight_decay"), nb::arg("decoupled"));
  m.def("clip_grad_norm", [](const std::vector<Tensor>& params, double max_norm) {
    return tessera::optim::clip_grad_norm(params, max_norm);
  });
}

}  // namespace

void bind_optim(nb::module_& parent) {
  nb::module_ m = parent.def_submodule("_optim", "the multi-tensor update kernels behind tessera.optim");
  bind_optim_kernels(m);
}
}  // namespace tpy
