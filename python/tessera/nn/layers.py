"""The layers of tessera.nn (PyTorch's names, arguments and default initializations)."""
import math
from collections import OrderedDict

import tessera
from tessera.nn import functional as F
from tessera.nn import init
from tessera.nn.module import Module, Parameter, _structure_changed


def _factory(device, dtype):
    return {"device": device if device is not None else "cpu", "dtype": dtype if dtype is not None else tessera.float32}


class Identity(Module):
    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, input):
        return input


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(tessera.empty((out_features, in_features), **_factory(device, dtype)))
        self.bias = Parameter(tessera.empty(out_features, **_factory(device, dtype))) if bias else None
        if not bias:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input):
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, sparse=False, _weight=None, _freeze=False, device=None, dtype=None):
        super().__init__()
        if max_norm is not None or scale_grad_by_freq or sparse:
            raise TypeError("tessera.nn.Embedding: max_norm, scale_grad_by_freq and sparse are not supported")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        if padding_idx is not None and padding_idx < 0:
            padding_idx += num_embeddings
        self.padding_idx = padding_idx
        if _weight is None:
            self.weight = Parameter(tessera.empty((num_embeddings, embedding_dim), **_factory(device, dtype)),
                                    requires_grad=not _freeze)
            self.reset_parameters()
        else:
            self.weight = Parameter(_weight, requires_grad=not _freeze)

    def reset_parameters(self):
        init.normal_(self.weight)
        if self.padding_idx is not None:
            with tessera.no_grad():
                self.weight[self.padding_idx] = 0

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, **kwargs):
        rows, cols = embeddings.shape
        return cls(rows, cols, padding_idx=padding_idx, _weight=embeddings, _freeze=freeze, **kwargs)

    def forward(self, input):
        return F.embedding(input, self.weight, self.padding_idx)

    def extra_repr(self):
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        return s + (f", padding_idx={self.padding_idx}" if self.padding_idx is not None else "")


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape, self.eps, self.elementwise_affine = tuple(normalized_shape), eps, elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(tessera.ones(self.normalized_shape, **_factory(device, dtype)))
            if bias:
                self.bias = Parameter(tessera.zeros(self.normalized_shape, **_factory(device, dtype)))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, input):
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class Dropout(Module):
    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if p < 0 or p > 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, input):
        return F.dropout(input, self.p, self.training, self.inplace)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


def _activation(name, fn, args=()):
    """A parameterless activation module calling fn(input, *its arguments)."""

    def __init__(self, *a, **k):
        Module.__init__(self)
        values = dict(args)
        names = [n for n, _ in args]
        if len(a) > len(names):
            raise TypeError(f"{name}.__init__() takes {len(names)} positional arguments, got {len(a)}")
        for n, v in zip(names, a):
            values[n] = v
        for n, v in k.items():
            if n not in values:
                raise TypeError(f"{name}.__init__() got an unexpected keyword argument '{n}'")
            values[n] = v
        for n, v in values.items():
            setattr(self, n, v)

    def forward(self, input):
        return fn(input, *[getattr(self, n) for n, _ in args])

    def extra_repr(self):
        return ", ".join(f"{n}={getattr(self, n)!r}" for n, _ in args if n != "inplace")

    return type(name, (Module,), {"__init__": __init__, "forward": forward, "extra_repr": extra_repr,
                                  "__doc__": f"PyTorch's nn.{name}."})


ReLU = _activation("ReLU", F.relu, [("inplace", False)])
ELU = _activation("ELU", F.elu, [("alpha", 1.0), ("inplace", False)])
ReLU6 = _activation("ReLU6", F.relu6, [("inplace", False)])
LeakyReLU = _activation("LeakyReLU", F.leaky_relu, [("negative_slope", 0.01), ("inplace", False)])
GELU = _activation("GELU", F.gelu, [("approximate", "none")])
SiLU = _activation("SiLU", F.silu, [("inplace", False)])
Tanh = _activation("Tanh", F.tanh)
Sigmoid = _activation("Sigmoid", F.sigmoid)
Softplus = _activation("Softplus", F.softplus, [("beta", 1), ("threshold", 20)])
Softmax = _activation("Softmax", F.softmax, [("dim", None)])
LogSoftmax = _activation("LogSoftmax", F.log_softmax, [("dim", None)])
Hardtanh = _activation("Hardtanh", F.hardtanh, [("min_val", -1.0), ("max_val", 1.0), ("inplace", False)])
Hardsigmoid = _activation("Hardsigmoid", F.hardsigmoid, [("inplace", False)])
Hardswish = _activation("Hardswish", F.hardswish, [("inplace", False)])
Mish = _activation("Mish", F.mish, [("inplace", False)])
Softsign = _activation("Softsign", F.softsign)
LogSigmoid = _activation("LogSigmoid", F.logsigmoid)
GLU = _activation("GLU", F.glu, [("dim", -1)])


class PReLU(Module):
    def __init__(self, num_parameters=1, init=0.25, device=None, dtype=None):
        super().__init__()
        self.num_parameters = num_parameters
        self.weight = Parameter(tessera.full((num_parameters,), float(init), **_factory(device, dtype)))

    def forward(self, input):
        return F.prelu(input, self.weight)


class RMSNorm(Module):
    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape, self.eps, self.elementwise_affine = tuple(normalized_shape), eps, elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(tessera.ones(self.normalized_shape, **_factory(device, dtype)))
        else:
            self.register_parameter("weight", None)

    def forward(self, input):
        return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)


class Upsample(Module):
    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None):
        super().__init__()
        if mode != "nearest":
            raise TypeError(f"tessera.nn.Upsample: mode={mode!r} is not supported (only 'nearest')")
        self.size, self.scale_factor, self.mode = size, scale_factor, mode

    def forward(self, input):
        return F.interpolate(input, self.size, self.scale_factor, self.mode)


class Dropout2d(Dropout):
    def forward(self, input):
        return F.dropout2d(input, self.p, self.training, self.inplace)


class Unflatten(Module):
    def __init__(self, dim, unflattened_size):
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, input):
        d = self.dim % input.dim()
        shape = tuple(input.shape)
        return input.reshape(shape[:d] + self.unflattened_size + shape[d + 1:])


class Flatten(Module):
    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, input):
        return input.flatten(self.start_dim, self.end_dim)

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


def _conv_init(m):
    """PyTorch's default: kaiming-uniform weights and U(-1/sqrt(fan_in), 1/sqrt(fan_in)) biases,
    fan_in from the weight's dim 1 and kernel (so a transposed weight counts its output side)."""
    fan_in = init._calculate_fan_in_and_fan_out(m.weight)[0]
    init.kaiming_uniform_(m.weight, a=math.sqrt(5))
    if m.bias is not None:
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        init.uniform_(m.bias, -bound, bound)


class _ConvNd(Module):
    _dims = 2

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 padding_mode="zeros", device=None, dtype=None):
        super().__init__()
        if padding_mode != "zeros":
            raise TypeError(f"tessera.nn.{type(self).__name__}: padding_mode={padding_mode!r} is not supported")
        if in_channels % groups or out_channels % groups:
            raise ValueError("in_channels and out_channels must be divisible by groups")
        n = self._dims
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = tuple(F._pair(kernel_size, n))
        self.stride, self.dilation = tuple(F._pair(stride, n)), tuple(F._pair(dilation, n))
        self.padding = padding if isinstance(padding, str) else tuple(F._pair(padding, n))
        self.padding_mode = padding_mode
        self.weight = Parameter(tessera.empty(self._weight_shape(), **_factory(device, dtype)))
        if bias:
            self.bias = Parameter(tessera.empty(out_channels, **_factory(device, dtype)))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def _weight_shape(self):  # [out, in / groups, kH, kW]
        return (self.out_channels, self.in_channels // self.groups) + self.kernel_size

    def reset_parameters(self):
        _conv_init(self)

    def extra_repr(self):
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * self._dims:
            s += f", padding={self.padding}"
        if self.dilation != (1,) * self._dims:
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        return s + (", bias=False" if self.bias is None else "")


class Conv1d(_ConvNd):
    _dims = 1

    def forward(self, input):
        return F.conv1d(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Conv2d(_ConvNd):
    def forward(self, input):
        return F.conv2d(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class ConvTranspose2d(_ConvNd):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 bias=True, dilation=1, padding_mode="zeros", device=None, dtype=None):
        if isinstance(padding, str):
            raise TypeError("tessera.nn.ConvTranspose2d: string padding is not supported")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, device, dtype)
        self.output_padding = tuple(F._pair(output_padding))

    def _weight_shape(self):  # [in, out / groups, kH, kW]
        return (self.in_channels, self.out_channels // self.groups) + self.kernel_size

    def forward(self, input):
        return F.conv_transpose2d(input, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                  self.groups, self.dilation)


class GroupNorm(Module):
    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, device=None, dtype=None):
        super().__init__()
        if num_channels % num_groups:
            raise ValueError("num_channels must be divisible by num_groups")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        if affine:
            self.weight = Parameter(tessera.ones(num_channels, **_factory(device, dtype)))
            self.bias = Parameter(tessera.zeros(num_channels, **_factory(device, dtype)))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, input):
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        super().__init__()
        if dilation not in (1, (1, 1)) or return_indices or ceil_mode:
            raise TypeError("tessera.nn.MaxPool2d: dilation, return_indices and ceil_mode are not supported")
        self.kernel_size, self.stride, self.padding = kernel_size, stride if stride is not None else kernel_size, padding
        self.dilation, self.return_indices, self.ceil_mode = dilation, return_indices, ceil_mode

    def forward(self, input):
        return F.max_pool2d(input, self.kernel_size, self.stride, self.padding)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        super().__init__()
        if ceil_mode or divisor_override is not None:
            raise TypeError("tessera.nn.AvgPool2d: ceil_mode and divisor_override are not supported")
        self.kernel_size, self.stride, self.padding = kernel_size, stride if stride is not None else kernel_size, padding
        self.count_include_pad = count_include_pad

    def forward(self, input):
        return F.avg_pool2d(input, self.kernel_size, self.stride, self.padding, count_include_pad=self.count_include_pad)


class MaxPool1d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        super().__init__()
        if dilation != 1 or return_indices or ceil_mode:
            raise TypeError("tessera.nn.MaxPool1d: dilation, return_indices and ceil_mode are not supported")
        self.kernel_size, self.stride, self.padding = kernel_size, stride if stride is not None else kernel_size, padding

    def forward(self, input):
        return F.max_pool1d(input, self.kernel_size, self.stride, self.padding)


class AvgPool1d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
        super().__init__()
        if ceil_mode:
            raise TypeError("tessera.nn.AvgPool1d: ceil_mode is not supported")
        self.kernel_size, self.stride, self.padding = kernel_size, stride if stride is not None else kernel_size, padding
        self.count_include_pad = count_include_pad

    def forward(self, input):
        return F.avg_pool1d(input, self.kernel_size, self.stride, self.padding, count_include_pad=self.count_include_pad)


class AdaptiveAvgPool1d(Module):
    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, input):
        return F.adaptive_avg_pool1d(input, self.output_size)


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, input):
        return F.adaptive_avg_pool2d(input, self.output_size)


class _BatchNorm(Module):
    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, device=None,
                 dtype=None):
        super().__init__()
        if momentum is None:
            raise TypeError(f"tessera.nn.{type(self).__name__}: momentum=None (a cumulative average) is not supported")
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        f = _factory(device, dtype)
        if affine:
            self.weight = Parameter(tessera.ones(num_features, **f))
            self.bias = Parameter(tessera.zeros(num_features, **f))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", tessera.zeros(num_features, **f))
            self.register_buffer("running_var", tessera.ones(num_features, **f))
            self.register_buffer("num_batches_tracked", tessera.zeros((), dtype=tessera.int64, device=f["device"]))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def _check_input_dim(self, input):
        pass

    def forward(self, input):
        self._check_input_dim(input)
        use_batch_stats = self.training or not self.track_running_stats
        if self.training and self.track_running_stats:
            with tessera.no_grad():
                self.num_batches_tracked.add_(1)
        return F.batch_norm(input, self.running_mean if self.track_running_stats else None,
                            self.running_var if self.track_running_stats else None, self.weight, self.bias,
                            use_batch_stats, self.momentum, self.eps)

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    def _check_input_dim(self, input):
        if input.dim() not in (2, 3):
            raise ValueError(f"expected 2D or 3D input (got {input.dim()}D input)")


class BatchNorm2d(_BatchNorm):
    def _check_input_dim(self, input):
        if input.dim() != 4:
            raise ValueError(f"expected 4D input (got {input.dim()}D input)")


# ---- containers ----
class Sequential(Module):
    def __init__(self, *args):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for name, m in args[0].items():
                self.add_module(name, m)
        else:
            for i, m in enumerate(args):
                self.add_module(str(i), m)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return Sequential(OrderedDict(list(self._modules.items())[idx]))
        keys = list(self._modules)
        if not -len(keys) <= idx < len(keys):
            raise IndexError(f"index {idx} is out of range")
        return self._modules[keys[idx]]

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def forward(self, input):
        for m in self._modules.values():
            input = m(input)
        return input


class ModuleList(Module):
    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _index(self, idx):
        n = len(self._modules)
        if not -n <= idx < n:
            raise IndexError(f"index {idx} is out of range")
        return str(idx % n)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return ModuleList(list(self._modules.values())[idx])
        return self._modules[self._index(idx)]

    def __setitem__(self, idx, module):
        self.add_module(self._index(idx), module)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __iadd__(self, modules):
        return self.extend(modules)

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules):
        for m in modules:
            self.append(m)
        return self

    def insert(self, index, module):
        mods = list(self._modules.values())
        mods.insert(index, module)
        self._modules.clear()
        for i, m in enumerate(mods):
            self._modules[str(i)] = m
        _structure_changed()

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleList is not callable: iterate over its modules")


class ModuleDict(Module):
    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key):
        return self._modules[key]

    def __setitem__(self, key, module):
        self.add_module(key, module)

    def __delitem__(self, key):
        del self._modules[key]
        _structure_changed()

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key):
        return key in self._modules

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()

    def pop(self, key):
        m = self._modules.pop(key)
        _structure_changed()
        return m

    def update(self, modules):
        items = modules.items() if hasattr(modules, "items") else modules
        for k, m in items:
            self[k] = m

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleDict is not callable: index it for a module")


class ParameterList(Module):
    def __init__(self, values=None):
        super().__init__()
        for v in values or []:
            self.append(v)

    def append(self, value):
        self.register_parameter(str(len(self._parameters)),
                                value if isinstance(value, Parameter) else Parameter(value))
        return self

    def __getitem__(self, idx):
        return list(self._parameters.values())[idx]

    def __len__(self):
        return len(self._parameters)

    def __iter__(self):
        return iter(self._parameters.values())


# ---- losses ----
class CrossEntropyLoss(Module):
    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                 label_smoothing=0.0):
        super().__init__()
        if weight is not None or size_average is not None or reduce is not None:
            raise TypeError("tessera.nn.CrossEntropyLoss: weight, size_average and reduce are not supported")
        self.ignore_index, self.reduction, self.label_smoothing = ignore_index, reduction, label_smoothing

    def forward(self, input, target):
        return F.cross_entropy(input, target, ignore_index=self.ignore_index, reduction=self.reduction,
                               label_smoothing=self.label_smoothing)


class NLLLoss(Module):
    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
        super().__init__()
        if weight is not None or size_average is not None or reduce is not None:
            raise TypeError("tessera.nn.NLLLoss: weight, size_average and reduce are not supported")
        self.ignore_index, self.reduction = ignore_index, reduction

    def forward(self, input, target):
        return F.nll_loss(input, target, ignore_index=self.ignore_index, reduction=self.reduction)


class MSELoss(Module):
    def __init__(self, size_average=None, reduce=None, reduction="mean"):
        super().__init__()
        if size_average is not None or reduce is not None:
            raise TypeError("tessera.nn.MSELoss: size_average and reduce are not supported")
        self.reduction = reduction

    def forward(self, input, target):
        return F.mse_loss(input, target, reduction=self.reduction)


class L1Loss(MSELoss):
    def forward(self, input, target):
        return F.l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(Module):
    def __init__(self, size_average=None, reduce=None, reduction="mean", beta=1.0):
        super().__init__()
        F._reduction(reduction, size_average, reduce, "SmoothL1Loss")
        self.reduction, self.beta = reduction, beta

    def forward(self, input, target):
        return F.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(Module):
    def __init__(self, reduction="mean", delta=1.0):
        super().__init__()
        self.reduction, self.delta = reduction, delta

    def forward(self, input, target):
        return F.huber_loss(input, target, reduction=self.reduction, delta=self.delta)


class BCELoss(Module):
    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean"):
        super().__init__()
        F._reduction(reduction, size_average, reduce, "BCELoss")
        self.register_buffer("weight", weight)
        self.reduction = reduction

    def forward(self, input, target):
        return F.binary_cross_entropy(input, target, weight=self.weight, reduction=self.reduction)


class BCEWithLogitsLoss(Module):
    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean", pos_weight=None):
        super().__init__()
        F._reduction(reduction, size_average, reduce, "BCEWithLogitsLoss")
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)
        self.reduction = reduction

    def forward(self, input, target):
        return F.binary_cross_entropy_with_logits(input, target, weight=self.weight, reduction=self.reduction,
                                                  pos_weight=self.pos_weight)
