"""tessera.nn.functional: PyTorch's functional API over Tessera's ops (lazy: every call traces)."""
import math

import tessera
from tessera import _C

_nn = _C._nn

def _reduction(reduction, size_average=None, reduce=None, op="loss"):
    if size_average is not None or reduce is not None:
        raise TypeError(f"tessera.nn.functional.{op}: size_average and reduce are not supported (use reduction=)")
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    return reduction


def _pair(v, n=2):
    if isinstance(v, (int, float)):
        return [v] * n
    v = list(v)
    if len(v) == 1:
        return v * n
    return v


def _result(input, result, inplace):
    """inplace=True: input takes the result's value and history (copy_), as PyTorch's in-place
    ops do; refused on views and on leaves that require grad, like any in-place op here."""
    if not inplace:
        return result
    input.copy_(result)
    return input


# ---- activations ----
def relu(input, inplace=False):
    return _result(input, input.relu(), inplace)


def relu6(input, inplace=False):
    return _result(input, input.clamp(0, 6), inplace)


def leaky_relu(input, negative_slope=0.01, inplace=False):
    return _result(input, tessera.where(input >= 0, input, input * negative_slope), inplace)


def elu(input, alpha=1.0, inplace=False):
    return _result(input, tessera.where(input > 0, input, (input.exp() - 1) * alpha), inplace)


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    return _result(input, input.clamp(min_val, max_val), inplace)


def hardsigmoid(input, inplace=False):
    return _result(input, (input + 3).clamp(0, 6) * (1.0 / 6), inplace)


def hardswish(input, inplace=False):
    return _result(input, input * (input + 3).clamp(0, 6) * (1.0 / 6), inplace)


def mish(input, inplace=False):
    return _result(input, input * _nn.softplus(input, 1.0, 20.0).tanh(), inplace)


def softsign(input):
    return input / (input.abs() + 1)


def logsigmoid(input):
    return -_nn.softplus(-input, 1.0, 20.0)


def glu(input, dim=-1):
    a, b = input.chunk(2, dim)
    return a * b.sigmoid()


def prelu(input, weight):
    if weight.numel() != 1 and input.dim() > 1:  # one slope per channel (dim 1)
        weight = weight.reshape((1, -1) + (1,) * (input.dim() - 2))
    return tessera.where(input >= 0, input, input * weight)


def gelu(input, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate argument must be either none or tanh, got {approximate!r}")
    return _nn.gelu(input, approximate == "tanh")


def silu(input, inplace=False):
    return _result(input, _nn.silu(input), inplace)


def softplus(input, beta=1, threshold=20):
    return _nn.softplus(input, float(beta), float(threshold))


def tanh(input):
    return input.tanh()


def sigmoid(input):
    return input.sigmoid()


def _dim_or_default(input, dim):
    if dim is None:  # PyTorch's legacy implicit dim (with a warning there)
        dim = 0 if input.dim() in (0, 1, 3) else 1
    return dim


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    if dtype is not None:
        input = input.to(dtype)
    return input.softmax(_dim_or_default(input, dim))


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    if dtype is not None:
        input = input.to(dtype)
    return input.log_softmax(_dim_or_default(input, dim))


def dropout(input, p=0.5, training=True, inplace=False):
    if p < 0 or p > 1:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0:
        return input
    if p == 1:
        return _result(input, input * 0, inplace)
    keep = tessera.rand(tuple(input.shape), dtype=input.dtype, device=input.device) >= p
    return _result(input, input * keep.to(input.dtype) * (1.0 / (1.0 - p)), inplace)


def dropout2d(input, p=0.5, training=True, inplace=False):
    """Zeroes whole channels of [N, C, H, W] (or [C, H, W]) inputs."""
    if p < 0 or p > 1:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0:
        return input
    if input.dim() not in (3, 4):
        raise ValueError(f"dropout2d expects a 3-D or 4-D input, got {input.dim()}-D")
    mask_shape = tuple(input.shape[:-2]) + (1, 1)
    keep = tessera.rand(mask_shape, dtype=input.dtype, device=input.device) >= p
    return _result(input, input * keep.to(input.dtype) * (1.0 / (1.0 - p)), inplace)


# ---- layers ----
def linear(input, weight, bias=None):
    y = input.matmul(weight.t() if weight.dim() == 2 else weight)
    return y if bias is None else y + bias


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False):
    if max_norm is not None or scale_grad_by_freq or sparse:
        raise TypeError("tessera.nn.functional.embedding: max_norm, scale_grad_by_freq and sparse are not supported")
    out = _nn.embedding(input, weight)
    if padding_idx is not None:  # no gradient reaches the padding row (PyTorch's rule)
        if padding_idx < 0:
            padding_idx += weight.shape[0]
        out = out * (input != padding_idx).unsqueeze(-1).to(out.dtype)
    return out


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    if isinstance(normalized_shape, int):
        normalized_shape = [normalized_shape]
    return _nn.layer_norm(input, list(normalized_shape), weight, bias, float(eps))


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    N, C = input.shape[0], input.shape[1]
    if C % num_groups:
        raise ValueError(f"group_norm: {C} channels are not divisible into {num_groups} groups")
    x = input.reshape(N, num_groups, -1)
    mean = x.mean(-1, keepdim=True)
    d = x - mean
    y = (d * ((d * d).mean(-1, keepdim=True) + eps).rsqrt()).reshape(tuple(input.shape))
    shape = (1, C) + (1,) * (input.dim() - 2)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """x / sqrt(mean(x^2 over the trailing normalized_shape dims) + eps) * weight (PyTorch 2.4's
    rms_norm; eps=None means the dtype's machine epsilon, as there)."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    if eps is None:
        eps = tessera.finfo(input.dtype).eps
    dims = tuple(range(-len(normalized_shape), 0))
    y = input * ((input * input).mean(dims, keepdim=True) + eps).rsqrt()
    return y if weight is None else y * weight


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    if momentum is None:
        raise TypeError("tessera.nn.functional.batch_norm: momentum=None (a cumulative average) is not supported")
    return _nn.batch_norm(input, running_mean, running_var, weight, bias, bool(training), float(momentum), float(eps))


def _conv_padding(padding, kernel, dilation, stride, op):
    if isinstance(padding, str):
        if padding == "valid":
            return [0] * len(kernel)
        if padding == "same":
            if any(s != 1 for s in stride):
                raise ValueError(f"padding='same' is not supported for strided convolutions ({op})")
            pads = []
            for k, d in zip(kernel, dilation):
                total = d * (k - 1)
                if total % 2:
                    raise TypeError(f"tessera.nn.functional.{op}: padding='same' with an even kernel is not supported")
                pads.append(total // 2)
            return pads
        raise ValueError(f"Invalid padding string {padding!r}")
    return _pair(padding, len(kernel))


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    s, d = _pair(stride, 1), _pair(dilation, 1)
    p = _conv_padding(padding, [weight.shape[2]], d, s, "conv1d")
    return _nn.conv1d(input, weight, bias, s[0], p[0], d[0], groups)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    s, d = _pair(stride), _pair(dilation)
    p = _conv_padding(padding, list(weight.shape[2:]), d, s, "conv2d")
    return _nn.conv2d(input, weight, bias, s, p, d, groups)


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    return _nn.conv_transpose2d(input, weight, bias, _pair(stride), _pair(padding), _pair(output_padding), groups,
                                _pair(dilation))


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    if dilation not in (1, (1, 1), [1, 1]) or ceil_mode or return_indices:
        raise TypeError("tessera.nn.functional.max_pool2d: dilation, ceil_mode and return_indices are not supported")
    return _nn.max_pool2d(input, _pair(kernel_size), None if stride is None else _pair(stride), _pair(padding))


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    if ceil_mode or divisor_override is not None:
        raise TypeError("tessera.nn.functional.avg_pool2d: ceil_mode and divisor_override are not supported")
    return _nn.avg_pool2d(input, _pair(kernel_size), None if stride is None else _pair(stride), _pair(padding),
                          count_include_pad)


def adaptive_avg_pool2d(input, output_size):
    size = _pair(output_size)
    if any(s is None for s in size):
        size = [input.shape[-2 + i] if s is None else s for i, s in enumerate(size)]
    return _nn.adaptive_avg_pool2d(input, size)


def pad(input, pad, mode="constant", value=None):
    if mode != "constant":
        raise TypeError(f"tessera.nn.functional.pad: mode={mode!r} is not supported (only 'constant')")
    pad = list(pad)
    if len(pad) % 2 or len(pad) > 2 * input.dim():
        raise ValueError(f"Padding length must be divisible by 2 and at most twice the input's dims, got {len(pad)}")
    # F.pad's pairs start at the last dim; tessera's list has one pair per dim from the first.
    pairs = [pad[i:i + 2] for i in range(0, len(pad), 2)]
    pads = [0, 0] * (input.dim() - len(pairs)) + [v for p in reversed(pairs) for v in p]
    return _nn.pad(input, pads, 0.0 if value is None else float(value))


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    """Nearest-neighbour upsampling by whole factors (the spatial dims after [N, C])."""
    if mode != "nearest" or antialias:
        raise TypeError(f"tessera.nn.functional.interpolate: mode={mode!r} is not supported (only 'nearest' "
                        "by whole factors)")
    spatial = list(input.shape[2:])
    n = len(spatial)
    if size is not None:
        sizes = _pair(size, n)
        factors = [o // i if i and o % i == 0 else None for o, i in zip(sizes, spatial)]
    else:
        factors = [int(f) if float(f).is_integer() else None for f in _pair(scale_factor, n)]
    if any(f is None or f < 1 for f in factors):
        raise TypeError("tessera.nn.functional.interpolate: only whole upsampling factors are supported, got "
                        f"size={size}, scale_factor={scale_factor} for spatial dims {spatial}")
    out = input
    for d, f in enumerate(factors):
        if f == 1:
            continue
        axis = 2 + d
        shape = list(out.shape)
        out = out.unsqueeze(axis + 1).expand(*shape[:axis + 1], f, *shape[axis + 1:])
        out = out.reshape(*shape[:axis], shape[axis] * f, *shape[axis + 1:])
    return out


def _pool1d(pool2d, input, kernel_size, stride, padding, **kw):
    k, s = _pair(kernel_size, 1)[0], None if stride is None else _pair(stride, 1)[0]
    p = _pair(padding, 1)[0]
    y = pool2d(input.unsqueeze(-2), (1, k), None if s is None else (1, s), (0, p), **kw)
    return y.squeeze(-2)


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return _pool1d(max_pool2d, input, kernel_size, stride, padding, dilation=dilation, ceil_mode=ceil_mode,
                   return_indices=return_indices)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    return _pool1d(avg_pool2d, input, kernel_size, stride, padding, ceil_mode=ceil_mode,
                   count_include_pad=count_include_pad)


def adaptive_avg_pool1d(input, output_size):
    return adaptive_avg_pool2d(input.unsqueeze(-2), (1, _pair(output_size, 1)[0])).squeeze(-2)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    L, S = query.shape[-2], key.shape[-2]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    att = query.matmul(key.transpose(-2, -1)) * scale
    if is_causal:
        if attn_mask is not None:
            raise ValueError("scaled_dot_product_attention: attn_mask and is_causal cannot both be set")
        qpos = tessera.arange(L, device=query.device).reshape(L, 1)
        kpos = tessera.arange(S, device=query.device).reshape(1, S)
        att = att.masked_fill(kpos > qpos, float("-inf"))
    elif attn_mask is not None:
        if attn_mask.dtype == tessera.bool:
            att = att.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            att = att + attn_mask
    att = att.softmax(-1)
    if dropout_p > 0:
        att = dropout(att, dropout_p)
    return att.matmul(value)


# ---- losses ----
def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                  label_smoothing=0.0):
    if weight is not None:
        raise TypeError("tessera.nn.functional.cross_entropy: class weights are not supported")
    if target.is_floating_point():
        raise TypeError("tessera.nn.functional.cross_entropy: probability targets are not supported "
                        "(integer class targets only)")
    r = _reduction(reduction, size_average, reduce, "cross_entropy")
    return _nn.cross_entropy(input, target, int(ignore_index), r, float(label_smoothing))


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    if weight is not None:
        raise TypeError("tessera.nn.functional.nll_loss: class weights are not supported")
    return _nn.nll_loss(input, target, int(ignore_index), _reduction(reduction, size_average, reduce, "nll_loss"))


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    return _nn.mse_loss(input, target, _reduction(reduction, size_average, reduce, "mse_loss"))


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    return _reduce((input - target).abs(), _reduction(reduction, size_average, reduce, "l1_loss"))


def _reduce(loss, reduction):
    return loss if reduction == "none" else loss.mean() if reduction == "mean" else loss.sum()


def _weighted(loss, weight):
    return loss if weight is None else loss * weight


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    r = _reduction(reduction, size_average, reduce, "binary_cross_entropy")
    # PyTorch clamps each log at -100 so that 0 and 1 give finite losses.
    loss = -(target * input.log().clamp(min=-100) + (1 - target) * (1 - input).log().clamp(min=-100))
    return _reduce(_weighted(loss, weight), r)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None, reduction="mean",
                                     pos_weight=None):
    r = _reduction(reduction, size_average, reduce, "binary_cross_entropy_with_logits")
    softplus_neg = (1 + (-input.abs()).exp()).log() + (-input).relu()  # log(1 + e^-x), stably
    if pos_weight is None:
        loss = (1 - target) * input + softplus_neg
    else:
        loss = (1 - target) * input + ((pos_weight - 1) * target + 1) * softplus_neg
    return _reduce(_weighted(loss, weight), r)


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    r = _reduction(reduction, size_average, reduce, "smooth_l1_loss")
    d = (input - target).abs()
    if beta == 0:
        return _reduce(d, r)
    return _reduce(tessera.where(d < beta, d * d * (0.5 / beta), d - 0.5 * beta), r)


def huber_loss(input, target, reduction="mean", delta=1.0):
    r = _reduction(reduction, op="huber_loss")
    d = (input - target).abs()
    return _reduce(tessera.where(d < delta, d * d * 0.5, (d - 0.5 * delta) * delta), r)


def one_hot(tensor, num_classes=-1):
    if num_classes < 0:
        num_classes = int(tensor.max().item()) + 1
    return (tensor.unsqueeze(-1) == tessera.arange(num_classes, device=tensor.device)).to(tessera.int64)


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    if out is not None or p != 2:
        raise TypeError("tessera.nn.functional.normalize: only p=2 without out= is supported")
    n = (input * input).sum(dim, keepdim=True).sqrt().clamp(min=eps)
    return input / n


def __getattr__(name):
    raise AttributeError(f"tessera.nn.functional.{name} is not supported")
