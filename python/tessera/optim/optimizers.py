"""SGD, Adam and AdamW: Python classes over the multi-tensor C++ kernels."""
import tessera
from tessera import _C
from tessera.optim.optimizer import Optimizer, required


def _grads(group, maximize):
    params = [p for p in group["params"] if p.grad is not None]
    grads = [p.grad for p in params]
    if maximize:
        grads = [-g for g in grads]
    return params, grads


def _unsupported(name, **flags):
    for k, v in flags.items():
        if v:
            raise TypeError(f"tessera.optim.{name}: {k}={v!r} is not supported")


class SGD(Optimizer):
    def __init__(self, params, lr=required, momentum=0, dampening=0, weight_decay=0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False):
        if lr is not required and lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        _unsupported("SGD", differentiable=differentiable)
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize, foreach=foreach,
                                      differentiable=differentiable))

    def step(self, closure=None):
        loss = self._closure(closure)
        for group in self.param_groups:
            params, grads = _grads(group, group["maximize"])
            if not params:
                continue
            bufs = [self.state[p].get("momentum_buffer") for p in params]
            bufs = _C._optim.sgd_update(params, grads, bufs, float(group["lr"]), float(group["momentum"]),
                                     float(group["dampening"]), float(group["weight_decay"]), bool(group["nesterov"]))
            if group["momentum"] != 0:
                for p, b in zip(params, bufs):
                    self.state[p]["momentum_buffer"] = b
        return loss


class Adam(Optimizer):
    _decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, *,
                 foreach=None, maximize=False, capturable=False, differentiable=False, fused=False):
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if eps < 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameters: {betas}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        _unsupported(type(self).__name__, amsgrad=amsgrad, differentiable=differentiable)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize, foreach=foreach, capturable=capturable,
                                      differentiable=differentiable, fused=fused))

    def step(self, closure=None):
        loss = self._closure(closure)
        for group in self.param_groups:
            _unsupported(type(self).__name__, amsgrad=group["amsgrad"])
            params, grads = _grads(group, group["maximize"])
            by_step = {}  # parameters that have seen the same number of steps share one kernel call
            for p, g in zip(params, grads):
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = tessera.zeros_like(p)
                    st["exp_avg_sq"] = tessera.zeros_like(p)
                st["step"] += 1
                by_step.setdefault(st["step"], []).append((p, g, st))
            b1, b2 = group["betas"]
            for step, entries in by_step.items():
                _C._optim.adam_update([e[0] for e in entries], [e[1] for e in entries], [e[2]["exp_avg"] for e in entries],
                                   [e[2]["exp_avg_sq"] for e in entries], step, float(group["lr"]), float(b1),
                                   float(b2), float(group["eps"]), float(group["weight_decay"]), self._decoupled)
        return loss


class AdamW(Adam):
    _decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         foreach=foreach, maximize=maximize, capturable=capturable, differentiable=differentiable,
                         fused=fused)
