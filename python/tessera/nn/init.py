"""tessera.nn.init: PyTorch's initializers, in place and without autodiff history."""
import math

import tessera

__all__ = ["calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_",
           "orthogonal_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_"]


def _fill(tensor, value):
    with tessera.no_grad():
        tensor.copy_(value)
    return tensor


def _like(tensor, factory):
    return factory(tuple(tensor.shape), dtype=tensor.dtype, device=tensor.device)


def calculate_gain(nonlinearity, param=None):
    linear = ["linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
              "sigmoid"]
    if nonlinearity in linear:
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _calculate_fan_in_and_fan_out(tensor):
    if tensor.dim() < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer than 2 dimensions")
    receptive = math.prod(tensor.shape[2:]) if tensor.dim() > 2 else 1
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _fan(tensor, mode):
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(tensor, a=0.0, b=1.0, generator=None):
    if generator is not None:
        raise TypeError("tessera.nn.init.uniform_: generator= is not supported")
    return _fill(tensor, _like(tensor, tessera.rand) * (b - a) + a)


def normal_(tensor, mean=0.0, std=1.0, generator=None):
    if generator is not None:
        raise TypeError("tessera.nn.init.normal_: generator= is not supported")
    return _fill(tensor, _like(tensor, tessera.randn) * std + mean)


def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    """Normal values inside [a, b]: those outside are drawn again (eight rounds leave fewer than
    one in 10^10 at the usual two sigmas; what is left is clamped)."""
    if generator is not None:
        raise TypeError("tessera.nn.init.trunc_normal_: generator= is not supported")
    v = _like(tensor, tessera.randn) * std + mean
    for _ in range(8):
        v = tessera.where((v < a).logical_or(v > b), _like(tensor, tessera.randn) * std + mean, v)
    return _fill(tensor, v.clamp(min=a, max=b))


def constant_(tensor, val):
    with tessera.no_grad():
        tensor.fill_(val)
    return tensor


def ones_(tensor):
    return constant_(tensor, 1.0)


def zeros_(tensor):
    return constant_(tensor, 0.0)


def eye_(tensor):
    if tensor.dim() != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    return _fill(tensor, tessera.eye(tensor.shape[0], tensor.shape[1], dtype=tensor.dtype, device=tensor.device))


def orthogonal_(tensor, gain=1, generator=None):
    """A (semi-)orthogonal matrix from the QR decomposition of a normal draw (PyTorch's method;
    the QR runs on the host through numpy, once, at initialization)."""
    import numpy as np
    if generator is not None:
        raise TypeError("tessera.nn.init.orthogonal_: generator= is not supported")
    if tensor.dim() < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    rows, cols = tensor.shape[0], tensor.numel() // tensor.shape[0]
    flat = tessera.randn(rows, cols).numpy().astype(np.float64)
    if rows < cols:
        flat = flat.T
    q, r = np.linalg.qr(flat)
    q = q * np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    return _fill(tensor, tessera.tensor((q * gain).reshape(tuple(tensor.shape)), dtype=tensor.dtype,
                                        device=tensor.device))


def xavier_uniform_(tensor, gain=1.0, generator=None):
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    a = gain * math.sqrt(6.0 / float(fan_in + fan_out))
    return uniform_(tensor, -a, a, generator)


def xavier_normal_(tensor, gain=1.0, generator=None):
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)), generator)


def kaiming_uniform_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    bound = math.sqrt(3.0) * calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    return normal_(tensor, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode)), generator)


def __getattr__(name):
    raise AttributeError(f"tessera.nn.init.{name} is not supported")
