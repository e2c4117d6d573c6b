// The public autodiff surface of Tensor; the machinery is in src/autodiff.
#include "autodiff/autograd.h"
#include "core/fail.h"

namespace tessera {

Tensor& Tensor::requires_grad_(bool on) {
  if (!defined()) fail("requires_grad_", "called on an undefined tensor");
  auto& m = impl_->grad_meta;
  if (m && m->grad_fn)
    fail("requires_grad_", "only leaf tensors can change requires_grad; use detach() for a new leaf");
  if (on && !is_floating(dtype()))
    fail("requires_grad_", std::string("only floating tensors can require gradients, got ") + dtype_name(dtype()));
  if (!m) m = std::make_shared<autodiff::Meta>();
  m->requires_grad = on;
  return *this;
}

bool Tensor::requires_grad() const { return autodiff::requires_grad(*this); }
bool Tensor::is_leaf() const { return !defined() || !impl_->grad_meta || !impl_->grad_meta->grad_fn; }

Tensor Tensor::grad() const {
  if (!defined()) fail("grad", "called on an undefined tensor");
  return impl_->grad_meta ? impl_->grad_meta->grad : Tensor();
}

void Tensor::set_grad(const Tensor& g) {
  if (!defined()) fail("set_grad", "called on an undefined tensor");
  if (g.defined() && (g.shape() != shape() || g.device() != device()))
    fail("set_grad", "gradient " + shape_str(g.shape()) + " on " + g.device().str() + " for a tensor " +
                         shape_str(shape()) + " on " + device().str());
  if (!impl_->grad_meta) impl_->grad_meta = std::make_shared<autodiff::Meta>();
  impl_->grad_meta->grad = g;
}

void Tensor::backward(const Tensor& gradient) const { autodiff::backward(*this, gradient); }

// The detached value must be a different IR node than this tensor's: an op reading both
// (x * x.detach()) would otherwise give the detached use a gradient too.
Tensor Tensor::detach() const {
  if (!defined()) fail("detach", "called on an undefined tensor");
  if (const auto& b = impl_->buffer) {  // an alias of the buffer that keeps it alive
    auto alias = std::make_shared<Buffer>(b->device, b->data, b->nbytes, [keep = b](void*, size_t) {});
    return detail::from_buffer(std::move(alias), shape(), dtype());
  }
  return detail::from_node(ir::make(ir::Op::Reshape, {impl_->node}, {}, &shape()));
}

NoGradGuard::NoGradGuard() : prev_(autodiff::grad_enabled()) { autodiff::set_grad_enabled(false); }
NoGradGuard::~NoGradGuard() { autodiff::set_grad_enabled(prev_); }
bool grad_enabled() { return autodiff::grad_enabled(); }
void set_grad_enabled(bool on) { autodiff::set_grad_enabled(on); }

}  // namespace tessera
