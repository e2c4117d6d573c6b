"""Tessera from Python, shaped like PyTorch: `import tessera as torch` for the common surface.

Tensors are the C++ tessera::Tensor bound directly (tessera._C, nanobind): ops trace lazily and
run as one compiled graph when a value is read (item(), tolist(), numpy(), printing) or on
tessera.sync(). docs/python.md lists what is supported and what copies.
"""
import contextlib as _contextlib
import functools as _functools
import builtins as _builtins
import types as _types

from . import _C
from ._C import (Tensor, dtype, device, TesseraError, TesseraIndexError,
                 tensor, as_tensor, from_numpy, from_dlpack, save_file, load_file,
                 zeros, ones, empty, full, arange, rand, randn, randint, linspace, eye,
                 zeros_like, ones_like, empty_like, full_like, rand_like, randn_like,
                 cat, stack, where, sync, manual_seed, get_rng_state, set_rng_state,
                 is_grad_enabled, get_autocast_dtype, metrics, reset_peak_bytes, push_scope, pop_scope, current_scope,
                 unavailable_backends, plugin_errors,
                 float32, float64, float16, bfloat16, int32, int64)
from ._C import bool as bool  # noqa: A001  (tessera.bool, like torch.bool)

__version__ = _C.__version__

# dtype aliases as torch spells them
float = float32  # noqa: A001
double = float64
half = float16
long = int64
int = int32  # noqa: A001
concat = cat
Size = tuple

# ---- free functions: the Tensor methods of the same name (torch.exp(x) is x.exp()) ----
_METHOD_FUNCTIONS = (
    "abs neg negative sign sqrt rsqrt square reciprocal exp log sin cos tanh sigmoid relu floor "
    "ceil round erf logical_not logical_and logical_or logical_xor add sub mul multiply div "
    "divide true_divide floor_divide remainder pow matmul mm bmm eq ne lt le gt ge maximum "
    "minimum clamp clip masked_fill sum mean max min amax amin argmax argmin all any var std "
    "logsumexp softmax log_softmax cumsum sort argsort topk multinomial reshape permute flatten "
    "squeeze unsqueeze transpose swapaxes t split chunk unbind narrow gather index_select "
    "scatter_add tril triu flip clone detach numel lerp norm").split()
for _name in _METHOD_FUNCTIONS:
    globals()[_name] = getattr(Tensor, _name)
del _name


def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    if equal_nan:
        raise TypeError("tessera.isclose(equal_nan=True) is not supported")
    return abs(a - b) <= atol + rtol * abs(b)


def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    """Reads the result (a host sync), like torch.allclose."""
    return _builtins.bool(isclose(a, b, rtol, atol, equal_nan).all().item())


def randperm(n, *, dtype=None, device=None, requires_grad=False):
    """A random permutation of 0..n-1 from tessera's generator (seeded by manual_seed): uniform
    draws ranked on the host, as torch.randperm runs on the host for CPU tensors."""
    keys = rand(n).numpy()
    return tensor(keys.argsort(kind="stable"), dtype=dtype or int64, device=device)


def compile(model=None, **kwargs):  # noqa: A001
    """Tessera always traces lazily and compiles each distinct graph once: torch.compile's job is
    already done, so this returns the model (or function) unchanged."""
    if model is None:
        return lambda m: m
    return model


def _new_factory(make):
    def new(self, *size, dtype=None, device=None, requires_grad=False):
        return make(*size, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)
    return new


Tensor.new_zeros = _new_factory(zeros)
Tensor.new_ones = _new_factory(ones)
Tensor.new_empty = _new_factory(empty)
Tensor.new_full = lambda self, size, fill_value, dtype=None, device=None, requires_grad=False: full(
    size, fill_value, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)
Tensor.new_tensor = lambda self, data, dtype=None, device=None, requires_grad=False: tensor(
    data, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)
Tensor.pin_memory = lambda self: self  # host tensors are already where a copy starts

_TYPE_NAMES = {float32: "FloatTensor", float64: "DoubleTensor", float16: "HalfTensor", bfloat16: "BFloat16Tensor",
               int64: "LongTensor", int32: "IntTensor", bool: "BoolTensor"}


def _type(self, dtype=None, non_blocking=False):
    """x.type() names the type ('tessera.FloatTensor'); x.type(dtype) casts."""
    if dtype is None:
        return "tessera." + _TYPE_NAMES[self.dtype]
    return self.to(dtype)


Tensor.type = _type


def _legacy_constructor(dt):
    def make(*args):
        """tessera.LongTensor([1, 2]) (data) or tessera.LongTensor(2, 3) (zeros of that size)."""
        if args and _builtins.all(isinstance(a, _builtins.int) for a in args):
            return zeros(*args, dtype=dt)
        return tensor(args[0] if args else [], dtype=dt)
    return make


for _dt, _n in _TYPE_NAMES.items():
    globals()[_n] = _legacy_constructor(_dt)
del _dt, _n


class _DataAlias(Tensor):
    """What `x.data` returns: x's value without history, whose in-place ops write through to x
    (as `p.data.add_(...)` / `p.grad.data.zero_()` do in PyTorch, where .data shares storage)."""

    def __init__(self, base):
        super().__init__(base.detach())
        self._base = base


def _write_through(name):
    op = getattr(Tensor, name)

    def method(self, *args, **kwargs):
        op(self, *args, **kwargs)
        _data_property.__set__(self._base, self)
        return self
    method.__name__ = name
    return method


for _n in ("add_ sub_ mul_ div_ copy_ fill_ zero_ masked_fill_ clamp_ normal_ uniform_ "
           "__iadd__ __isub__ __imul__ __itruediv__ __setitem__").split():
    setattr(_DataAlias, _n, _write_through(_n))
del _n
_data_property = Tensor.data
Tensor.data = property(lambda self: _DataAlias(self), lambda self, v: _data_property.__set__(self, v),
                       doc="The value without autodiff history; in-place ops on it write through to this tensor")


inf = _builtins.float("inf")
nan = _builtins.float("nan")
pi = 3.141592653589793
e = 2.718281828459045


class finfo:
    """torch.finfo for tessera's floating dtypes: bits, eps, max, min, tiny."""
    _TABLE = {"float32": (32, 1.1920928955078125e-07, 3.4028234663852886e+38, 1.1754943508222875e-38),
              "float64": (64, 2.220446049250313e-16, 1.7976931348623157e+308, 2.2250738585072014e-308),
              "float16": (16, 0.0009765625, 65504.0, 6.103515625e-05),
              "bfloat16": (16, 0.0078125, 3.3895313892515355e+38, 1.1754943508222875e-38)}

    def __init__(self, dtype=float32):
        name = repr(dtype).split(".")[-1]
        if name not in self._TABLE:
            raise TypeError(f"finfo: {dtype} is not a floating dtype")
        self.dtype = dtype
        self.bits, self.eps, self.max, self.tiny = self._TABLE[name]
        self.min = -self.max
        self.smallest_normal = self.tiny


class iinfo:
    def __init__(self, dtype):
        bits = {"int32": 32, "int64": 64}.get(repr(dtype).split(".")[-1])
        if bits is None:
            raise TypeError(f"iinfo: {dtype} is not an integer dtype")
        self.dtype, self.bits = dtype, bits
        self.max = 2 ** (bits - 1) - 1
        self.min = -(2 ** (bits - 1))


# ---- printing, as torch prints ----
def _repr(self):
    """torch's format: values (4 decimals, or integral floats as '1.'), then the dtype when it is
    not the default of its kind, the device when not cpu, and requires_grad. Reads the value."""
    import numpy as np
    if self.dtype in (bfloat16, float16):
        values = self.detach().float().numpy()
    else:
        values = self.detach().numpy()
    if values.dtype.kind == "f" and values.size and np.isfinite(values).all() and (values != np.round(values)).any():
        body = np.array2string(values, precision=4, floatmode="fixed", separator=", ", prefix="tensor(",
                               threshold=1000, edgeitems=3)
    else:
        body = np.array2string(values, separator=", ", prefix="tensor(", threshold=1000, edgeitems=3)
    extra = []
    if self.dtype not in (float32, int64, bool):
        extra.append(f"dtype={self.dtype!r}")
    if self.device.type != "cpu":
        extra.append(f"device='{self.device}'")
    if self.requires_grad:
        extra.append("requires_grad=True" if self.is_leaf else "grad_fn=<tessera>")
    if self.dim() > 0 and values.size == 0:
        extra.insert(0, f"size={self.shape}")
    return "tensor(" + body + "".join(", " + e for e in extra) + ")"


Tensor.__repr__ = _repr
Tensor.__str__ = _repr


class _GradFn:
    """What x.grad_fn is for a tensor with history (None for leaves): tessera records history as
    lazy IR beside the value, so there is no per-op node object to inspect."""

    def __repr__(self):
        return "<tessera grad_fn>"


Tensor.grad_fn = property(lambda self: None if self.is_leaf else _GradFn())


def _in_place_of(name):
    op = getattr(Tensor, name)

    def method(self, *args, **kwargs):
        return self.copy_(op(self, *args, **kwargs))
    method.__name__ = name + "_"
    method.__doc__ = f"x.{name}_(...): x.copy_(x.{name}(...)), returning x"
    return method


for _n in "exp log sqrt rsqrt relu sigmoid tanh neg abs floor ceil round sin cos pow sign reciprocal square tril triu".split():
    setattr(Tensor, _n + "_", _in_place_of(_n))
del _n


# ---- einsum: permutes, sums and batched matmuls (so autodiff and every backend have it) ----
def _einsum_one(spec, x, keep):
    """Sums x's dims that are in neither `keep` nor repeated; returns the reduced tensor and spec."""
    if len(set(spec)) != len(spec):
        raise TypeError(f"tessera.einsum: repeated index in one operand ('{spec}', a diagonal) is not supported")
    drop = [d for d, c in enumerate(spec) if c not in keep]
    if drop:
        x = x.sum(dim=tuple(drop))
        spec = "".join(c for c in spec if c in keep)
    return x, spec


def _einsum_pair(sa, a, sb, b, keep):
    """a (indices sa) times b (sb), contracted over what both have and `keep` lacks: one matmul
    of [batch, left, contracted] by [batch, contracted, right]."""
    a, sa = _einsum_one(sa, a, keep + sb)
    b, sb = _einsum_one(sb, b, keep + sa)
    batch = [c for c in sa if c in sb and c in keep]
    contract = [c for c in sa if c in sb and c not in keep]
    left = [c for c in sa if c not in sb]
    right = [c for c in sb if c not in sa]
    size = {c: a.shape[i] for i, c in enumerate(sa)}
    size.update({c: b.shape[i] for i, c in enumerate(sb)})
    n = lambda cs: _functools.reduce(lambda p, c: p * size[c], cs, 1)  # noqa: E731
    a = a.permute(*[sa.index(c) for c in batch + left + contract]).reshape(n(batch), n(left), n(contract))
    b = b.permute(*[sb.index(c) for c in batch + contract + right]).reshape(n(batch), n(contract), n(right))
    out = (a @ b).reshape(*[size[c] for c in batch + left + right])
    return out, "".join(batch + left + right)


def einsum(equation, *operands):
    """torch.einsum for explicit or implicit output ('ij,jk->ik', 'ij,jk'); no '...' or diagonals."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    eq = equation.replace(" ", "")
    if "." in eq:
        raise TypeError("tessera.einsum: '...' is not supported")
    ins, arrow, out = eq.partition("->")
    specs = ins.split(",")
    if len(specs) != len(operands):
        raise TypeError(f"tessera.einsum: '{equation}' names {len(specs)} operands, {len(operands)} given")
    for sp, t in zip(specs, operands):
        if len(sp) != t.dim():
            raise RuntimeError(f"[einsum] '{sp}' has {len(sp)} indices for a tensor of shape {list(t.shape)}")
    if not arrow:  # implicit output: the indices seen once, sorted
        counts = {}
        for c in ins.replace(",", ""):
            counts[c] = counts.get(c, 0) + 1
        out = "".join(sorted(c for c, k in counts.items() if k == 1))
    x, sx = operands[0], specs[0]
    for k in range(1, len(operands)):
        rest = out + "".join(specs[k + 1:])
        x, sx = _einsum_pair(sx, x, specs[k], operands[k], rest)
    x, sx = _einsum_one(sx, x, out)
    return x.permute(*[sx.index(c) for c in out]) if out else x


def get_default_dtype():
    return float32


def set_default_dtype(d):
    if d is not float32:
        raise TypeError(f"tessera.set_default_dtype({d!r}) is not supported: the default dtype is tessera.float32")


# ---- copying and pickling (copy.deepcopy of modules, multiprocessing, tessera.save/load) ----
_load_device = [None]  # tessera.load's map_location while it unpickles


def _rebuild(array, dtype_name, requires_grad):
    t = tensor(array).to(getattr(_C, dtype_name))
    if _load_device[0] is not None:
        t = t.to(_load_device[0])
    return t.requires_grad_(requires_grad) if requires_grad else t


def _reduce_ex(self, protocol):
    value = self.detach()
    if value.dtype is bfloat16:  # numpy has none: through float32, exact
        value = value.float()
    if type(self) is not Tensor:  # a Python subclass (nn.Parameter): rebuilt as one, its attributes kept
        return (_rebuild_subclass, (type(self), value.numpy().copy(), repr(self.dtype).split(".")[-1],
                                    self.requires_grad, self.__dict__))
    return (_rebuild, (value.numpy().copy(), repr(self.dtype).split(".")[-1], self.requires_grad))


def _rebuild_subclass(cls, array, dtype_name, requires_grad, state):
    obj = cls.__new__(cls)
    Tensor.__init__(obj, _rebuild(array, dtype_name, False))
    if requires_grad:
        obj.requires_grad_(True)
    obj.__dict__.update(state)
    return obj


def _deepcopy(self, memo):
    """A new tensor with this value (copied when it is computed: clone) and no history; leaves keep
    requires_grad; subclasses stay subclasses. (detach alone would share the buffer, as in torch.)"""
    import copy
    value = self.detach().clone()
    if type(self) is Tensor:
        out = value
    else:
        out = type(self).__new__(type(self))
        Tensor.__init__(out, value)
        out.__dict__.update(copy.deepcopy(self.__dict__, memo))
    if self.requires_grad and self.is_leaf:
        out.requires_grad_(True)
    memo[id(self)] = out
    return out


Tensor.__reduce_ex__ = _reduce_ex
Tensor.__deepcopy__ = _deepcopy


def save(obj, f):
    """Pickles obj (tensors, dicts of them, optimizer state ...) to a path or file: a Tessera file,
    not PyTorch's zip format (use save_file/load_file for safetensors both read)."""
    import pickle
    if isinstance(f, (str, bytes)) or hasattr(f, "__fspath__"):
        with open(f, "wb") as fh:
            pickle.dump(obj, fh, protocol=4)
    else:
        pickle.dump(obj, f, protocol=4)


def load(f, map_location=None, weights_only=False):
    """Reads what tessera.save wrote; map_location puts every tensor on that device."""
    import pickle
    _load_device[0] = None if map_location is None else device(map_location) if isinstance(map_location, str) else map_location
    try:
        if isinstance(f, (str, bytes)) or hasattr(f, "__fspath__"):
            with open(f, "rb") as fh:
                return pickle.load(fh)
        return pickle.load(f)
    finally:
        _load_device[0] = None


def is_tensor(obj):
    return isinstance(obj, Tensor)


def is_floating_point(t):
    return t.is_floating_point()


# ---- grad mode: context managers that are also decorators ----
class _GradMode(_contextlib.ContextDecorator):
    _mode = None

    def __enter__(self):
        self._prev = _C.is_grad_enabled()
        _C._set_grad_enabled(self._mode)
        return self

    def __exit__(self, *exc):
        _C._set_grad_enabled(self._prev)
        return False

    def __call__(self, fn=None):  # @no_grad() and @no_grad both work
        if fn is None:
            return self
        return super().__call__(fn)


class no_grad(_GradMode):
    """Ops record no autodiff history inside (a context manager and a decorator)."""
    _mode = False

    def __new__(cls, fn=None):
        self = super().__new__(cls)
        if callable(fn):  # bare @tessera.no_grad
            return _GradMode.__call__(self, fn)
        return self

    def __init__(self, fn=None):
        pass


class enable_grad(no_grad):
    """Recording back on inside a no_grad region."""
    _mode = True


class set_grad_enabled(_GradMode):
    def __init__(self, mode):
        self._mode = _builtins.bool(mode)
        self._prev = _C.is_grad_enabled()
        _C._set_grad_enabled(self._mode)  # takes effect at once, like torch.set_grad_enabled(False)

    def __enter__(self):
        return self


inference_mode = no_grad


@_contextlib.contextmanager
def scope(name):
    """Ops traced inside are attributed to `name` (joined with '.' when nested) in the profiler
    and the memory plan; tessera.nn.Module.__call__ pushes each module's path this way."""
    _C.push_scope(name)
    try:
        yield
    finally:
        _C.pop_scope()


# ---- devices ----
def _kind_available(kind):
    return _builtins.any(d.type == kind and can_run for d, _, can_run, _ in _C.devices())


class _DeviceModule(_types.ModuleType):
    def __init__(self, kind):
        super().__init__(f"tessera.{kind}")
        self._kind = kind

    def is_available(self):
        """True when a `kind` device is registered and can run programs (a real answer)."""
        return _kind_available(self._kind)

    def device_count(self):
        return _builtins.sum(1 for d, _, can_run, _ in _C.devices() if d.type == self._kind and can_run)

    def why_unavailable(self):
        return [l for l in _C.unavailable_backends() if l.startswith(self._kind + ":")] + \
               [l for l in _C.plugin_errors() if self._kind in l]

    def synchronize(self, device=None):
        _C.sync()

    def manual_seed(self, seed):
        _C.manual_seed(seed)

    manual_seed_all = manual_seed


    def is_bf16_supported(self):
        return self.is_available()  # bfloat16 is a storage type on every tessera device

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"tessera.{self._kind}.{name} is not supported (a torch.{self._kind} name Tessera lacks)")


cuda = _DeviceModule("cuda")
opencl = _DeviceModule("opencl")


class _Backends(_types.SimpleNamespace):
    pass


# Flags scripts set for PyTorch's CUDA libraries; Tessera uses neither TF32 nor cuDNN, so they are
# accepted and change nothing. mps: Tessera has no Metal backend.
backends = _Backends(mps=_types.SimpleNamespace(is_available=lambda: False),
                     cuda=_types.SimpleNamespace(matmul=_types.SimpleNamespace(allow_tf32=False)),
                     cudnn=_types.SimpleNamespace(allow_tf32=False, benchmark=False, deterministic=False))


def devices():
    """Every registered device as (tessera.device, description, can_execute, accelerator)."""
    return _C.devices()


# ---- profiler and memory ----
profiler = _types.ModuleType("tessera.profiler", "tessera.profiler.profile(): the C++ Profiler")
profiler.Profiler = _C.Profiler
profiler.profile = _C.Profiler  # `with tessera.profiler.profile() as p: ...; print(p.table())`

memory = _types.ModuleType("tessera.memory", "The static memory plan of compiled graphs")
memory.plan = _C.plan_memory
memory.pending_plan = _C.pending_memory_plan
memory.last_plan = _C.last_memory_plan
memory.write_viewer = _C.write_memory_viewer
memory.MemoryPlan = _C.MemoryPlan


# ---- what Tessera lacks fails loudly ----
def _tensor_getattr(self, name):
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    raise AttributeError(f"tessera.Tensor.{name} is not supported (a torch.Tensor attribute Tessera lacks; "
                         "docs/python.md lists the surface)")


Tensor.__getattr__ = _tensor_getattr


def __getattr__(name):
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    raise AttributeError(f"tessera.{name} is not supported (a torch name Tessera lacks; docs/python.md lists the surface)")


# ---- the Python layers over the binding (after everything above: they import from it) ----
from . import amp, nn, onnx, optim, utils  # noqa: E402

cuda.amp = amp  # torch.cuda.amp.GradScaler / autocast, as nanoGPT's train.py spells them
autocast = amp.autocast


def is_autocast_enabled(device_type=None):
    """Whether products traced on this thread run under autocast (tessera.get_autocast_dtype())."""
    return get_autocast_dtype() is not None
