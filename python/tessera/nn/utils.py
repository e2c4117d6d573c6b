"""tessera.nn.utils: gradient clipping (by global norm, by value)."""
import tessera
from tessera import _C


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Scales the gradients in place so their global L2 norm is at most max_norm; returns the norm
    before clipping (a lazy tensor: reading it is a host sync)."""
    if float(norm_type) != 2.0:
        raise TypeError(f"tessera.nn.utils.clip_grad_norm_: norm_type={norm_type} is not supported (only 2)")
    if error_if_nonfinite:
        raise TypeError("tessera.nn.utils.clip_grad_norm_: error_if_nonfinite=True is not supported "
                        "(it would need a host sync every step)")
    if isinstance(parameters, tessera.Tensor):
        parameters = [parameters]
    return _C._optim.clip_grad_norm([p for p in parameters if p.grad is not None], float(max_norm))


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamps every gradient to [-clip_value, clip_value] in place."""
    if isinstance(parameters, tessera.Tensor):
        parameters = [parameters]
    with tessera.no_grad():
        for p in parameters:
            if p.grad is not None:
                p.grad = p.grad.clamp(-clip_value, clip_value)


def __getattr__(name):
    raise AttributeError(f"tessera.nn.utils.{name} is not supported")
