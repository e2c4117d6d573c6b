"""RMSprop, Adagrad and Adadelta: update rules written in tessera ops under no_grad (no C++
kernel of their own). Rates and step-dependent factors are 0-d tensors (graph inputs, not
constants), so changing them between steps does not recompile, as with the kernel optimizers."""
import tessera
from tessera.optim.optimizer import Optimizer


def _scalar(v, like):
    # A one-element list becomes a realized buffer (a graph input); a bare Python float would be
    # folded into the graph as a constant and recompile it whenever it changes.
    return tessera.tensor([float(v)], dtype=like.dtype, device=like.device).reshape(())


def _check(name, lr, eps, weight_decay, **flags):
    if lr < 0.0:
        raise ValueError(f"Invalid learning rate: {lr}")
    if eps < 0.0:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if weight_decay < 0.0:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")
    for k, v in flags.items():
        if v:
            raise TypeError(f"tessera.optim.{name}: {k}={v!r} is not supported")


class _PythonRule(Optimizer):
    """step(): for each parameter with a gradient, self._update(p, grad, state, group)."""

    @tessera.no_grad()
    def step(self, closure=None):
        loss = self._closure(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = -p.grad if group.get("maximize") else p.grad
                if group["weight_decay"] != 0:
                    g = g + p * group["weight_decay"]
                self._update(p, g, self.state[p], group)
        return loss


class RMSprop(_PythonRule):
    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False,
                 foreach=None, maximize=False, differentiable=False):
        _check("RMSprop", lr, eps, weight_decay, differentiable=differentiable)
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                      centered=centered, foreach=foreach, maximize=maximize,
                                      differentiable=differentiable))

    def _update(self, p, g, st, group):
        if not st:
            st["step"] = 0
            st["square_avg"] = tessera.zeros_like(p)
            if group["momentum"] > 0:
                st["momentum_buffer"] = tessera.zeros_like(p)
            if group["centered"]:
                st["grad_avg"] = tessera.zeros_like(p)
        st["step"] += 1
        alpha, lr = group["alpha"], _scalar(group["lr"], p)
        sq = st["square_avg"]
        sq.mul_(alpha).add_(g * g * (1 - alpha))
        if group["centered"]:
            ga = st["grad_avg"]
            ga.mul_(alpha).add_(g * (1 - alpha))
            avg = (sq - ga * ga).sqrt() + group["eps"]
        else:
            avg = sq.sqrt() + group["eps"]
        if group["momentum"] > 0:
            buf = st["momentum_buffer"]
            buf.mul_(group["momentum"]).add_(g / avg)
            p.sub_(buf * lr)
        else:
            p.sub_(g / avg * lr)


class Adagrad(_PythonRule):
    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10,
                 foreach=None, *, maximize=False, differentiable=False):
        _check("Adagrad", lr, eps, weight_decay, differentiable=differentiable)
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value, foreach=foreach,
                                      maximize=maximize, differentiable=differentiable))
        for group in self.param_groups:  # PyTorch creates the state at construction
            for p in group["params"]:
                self.state[p]["step"] = 0
                self.state[p]["sum"] = tessera.full_like(p, float(group["initial_accumulator_value"]))

    def _update(self, p, g, st, group):
        st["step"] += 1
        clr = _scalar(group["lr"] / (1 + (st["step"] - 1) * group["lr_decay"]), p)
        st["sum"].add_(g * g)
        p.sub_(g / (st["sum"].sqrt() + group["eps"]) * clr)


class Adadelta(_PythonRule):
    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0, foreach=None, *, maximize=False,
                 differentiable=False):
        _check("Adadelta", lr, eps, weight_decay, differentiable=differentiable)
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, foreach=foreach,
                                      maximize=maximize, differentiable=differentiable))

    def _update(self, p, g, st, group):
        if not st:
            st["step"] = 0
            st["square_avg"] = tessera.zeros_like(p)
            st["acc_delta"] = tessera.zeros_like(p)
        st["step"] += 1
        rho, eps = group["rho"], group["eps"]
        sq, acc = st["square_avg"], st["acc_delta"]
        sq.mul_(rho).add_(g * g * (1 - rho))
        delta = (acc + eps).sqrt() / (sq + eps).sqrt() * g
        acc.mul_(rho).add_(delta * delta * (1 - rho))
        p.sub_(delta * _scalar(group["lr"], p))
