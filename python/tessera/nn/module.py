"""tessera.nn.Module and Parameter: PyTorch's module protocol, subclassed in Python.

Parameters, buffers and submodules register themselves by attribute assignment. While a module
runs (``module(x)``), its path below the outermost module called ("transformer.h.0.attn") is the
Tessera scope, so the profiler's op table and the memory report name Python modules.
"""
import itertools
import threading
from collections import OrderedDict, namedtuple

import tessera
from tessera import _C

__all__ = ["Module", "Parameter", "Buffer"]


_scope_push, _scope_pop = _C.push_scope, _C.pop_scope


class Parameter(tessera.Tensor):
    """A tensor that a Module registers as a parameter (a leaf requiring grad by default)."""

    def __init__(self, data=None, requires_grad=True):
        if data is None:
            data = tessera.empty(0)
        if not isinstance(data, tessera.Tensor):
            raise TypeError(f"Parameter: data must be a tessera.Tensor, got {type(data).__name__}")
        super().__init__(data.detach())
        self.requires_grad_(requires_grad)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()



class Buffer:
    """Marks a tensor assigned to a module attribute as a buffer (torch >= 2.5's nn.Buffer)."""

    def __init__(self, data, persistent=True):
        self.data, self.persistent = data, persistent


_hook_ids = itertools.count()


class _RemovableHandle:
    def __init__(self, hooks, key):
        self._hooks, self.id = hooks, key

    def remove(self):
        self._hooks.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    def __repr__(self):
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


# Bumped whenever a module gains or loses a submodule: the outermost module called reassigns the
# scope paths of its tree when it has changed since it last did.
_structure_version = itertools.count(1)
_current_version = [0]
_running = threading.local()  # .stack: paths of the modules running in this thread, outermost first


def _structure_changed():
    _current_version[0] = next(_structure_version)


def _zero_grads(params, set_to_none):
    """Module.zero_grad and Optimizer.zero_grad: drops each gradient, or zeroes it in place."""
    for p in params:
        if p.grad is None:
            continue
        if set_to_none:
            p.grad = None
        else:
            with tessera.no_grad():
                p.grad = tessera.zeros_like(p.grad)


def _as_tensor(value):
    """value as a tessera tensor: a tessera tensor as is; a torch tensor (even one that requires
    grad) or anything numpy reads, copied. For checkpoints made by either library."""
    if isinstance(value, tessera.Tensor):
        return value
    if hasattr(value, "detach"):
        value = value.detach()
    return tessera.as_tensor(value)


class Module:
    """Base class of every network module (PyTorch's nn.Module protocol)."""

    training: bool

    def __init__(self, *args, **kwargs):
        if args or kwargs:
            raise TypeError(f"{type(self).__name__}.__init__() got unexpected arguments (Module takes none)")
        d = self.__dict__
        d["training"] = True
        d["_parameters"] = OrderedDict()
        d["_buffers"] = OrderedDict()
        d["_non_persistent_buffers_set"] = set()
        d["_modules"] = OrderedDict()
        d["_tsr_path"] = None
        d["_tsr_version"] = 0

    # ---- registration by attribute ----
    def __setattr__(self, name, value):
        d = self.__dict__
        if "_parameters" not in d:
            raise AttributeError("cannot assign attributes before Module.__init__() call")
        params, buffers, modules = d["_parameters"], d["_buffers"], d["_modules"]
        if isinstance(value, Parameter):
            self._discard(name)
            params[name] = value
        elif isinstance(value, Module):
            self._discard(name)
            modules[name] = value
            _structure_changed()
        elif isinstance(value, Buffer):
            self._discard(name)
            self.register_buffer(name, value.data, value.persistent)
        elif name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                                "(torch.nn.Parameter or None expected)")
            params[name] = None
        elif name in modules:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as child module '{name}' "
                                "(torch.nn.Module or None expected)")
            modules[name] = None
            _structure_changed()
        elif name in buffers:
            if value is not None and not isinstance(value, tessera.Tensor):
                raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                                "(torch.Tensor or None expected)")
            buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def _discard(self, name):
        d = self.__dict__
        d.pop(name, None)
        for k in ("_parameters", "_buffers", "_modules"):
            d[k].pop(name, None)
        d["_non_persistent_buffers_set"].discard(name)

    def __getattr__(self, name):
        d = self.__dict__
        for k in ("_parameters", "_buffers", "_modules"):
            table = d.get(k)
            if table is not None and name in table:
                return table[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        d = self.__dict__
        for k in ("_parameters", "_buffers", "_modules"):
            if name in d[k]:
                del d[k][name]
                d["_non_persistent_buffers_set"].discard(name)
                if k == "_modules":
                    _structure_changed()
                return
        object.__delattr__(self, name)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules))

    def register_parameter(self, name, param):
        if "." in name or name == "":
            raise KeyError(f'parameter name can\'t contain "." or be empty, got "{name}"')
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter '{name}' "
                            "(torch.nn.Parameter or None required)")
        self._discard(name)
        self._parameters[name] = param

    def register_buffer(self, name, tensor, persistent=True):
        if "." in name or name == "":
            raise KeyError(f'buffer name can\'t contain "." or be empty, got "{name}"')
        if tensor is not None and not isinstance(tensor, tessera.Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                            "(torch Tensor or None required)")
        self._discard(name)
        self._buffers[name] = tensor
        if not persistent:
            self._non_persistent_buffers_set.add(name)

    def add_module(self, name, module):
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        if "." in name or name == "":
            raise KeyError(f'module name can\'t contain "." or be empty, got "{name}"')
        self._discard(name)
        self._modules[name] = module
        _structure_changed()

    register_module = add_module

    def get_submodule(self, target):
        m = self
        for part in target.split(".") if target else []:
            if part not in m._modules:
                raise AttributeError(f"{type(m).__name__} has no attribute `{part}`")
            m = m._modules[part]
        return m

    def get_parameter(self, target):
        mod, _, name = target.rpartition(".")
        m = self.get_submodule(mod)
        if name not in m._parameters:
            raise AttributeError(f"{type(m).__name__} has no parameter `{name}`")
        return m._parameters[name]

    # ---- running ----
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    def _assign_paths(self):
        for path, m in self.named_modules():
            m.__dict__["_tsr_path"] = path
        self.__dict__["_tsr_version"] = _current_version[0]

    def _forward_with_hooks(self, args, kwargs):
        d = self.__dict__
        for hook in tuple(d.get("_forward_pre_hooks", {}).values()):
            r = hook(self, args)
            if r is not None:
                args = r if isinstance(r, tuple) else (r,)
        out = self.forward(*args, **kwargs)
        for hook in tuple(d.get("_forward_hooks", {}).values()):
            r = hook(self, args, out)
            if r is not None:
                out = r
        return out

    def __call__(self, *args, **kwargs):
        if "_forward_pre_hooks" in self.__dict__ or "_forward_hooks" in self.__dict__:
            run = self._forward_with_hooks
            args, kwargs = (args, kwargs), {}
        else:
            run = self.forward
        stack = getattr(_running, "stack", None)
        if stack is None:
            stack = _running.stack = []
        if not stack:  # the outermost module: the root of the paths
            if self.__dict__["_tsr_version"] != _current_version[0] or self._tsr_path != "":
                self._assign_paths()
            stack.append("")
            try:
                return run(*args, **kwargs)
            finally:
                stack.pop()
        parent, path = stack[-1], self.__dict__["_tsr_path"]
        if path and parent == "":
            scope = path
        elif path and path.startswith(parent + "."):
            scope = path[len(parent) + 1:]
        else:  # not below the running module (called from elsewhere): its type names it
            scope, path = type(self).__name__, (parent + "." if parent else "") + type(self).__name__
        _scope_push(scope)
        stack.append(path)
        try:
            return run(*args, **kwargs)
        finally:
            stack.pop()
            _scope_pop()

    # ---- traversal ----
    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is None:
                continue
            yield from m.named_modules(memo, prefix + ("." if prefix else "") + name, remove_duplicate)

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_children(self):
        seen = set()
        for name, m in self._modules.items():
            if m is not None and id(m) not in seen:
                seen.add(id(m))
                yield name, m

    def children(self):
        for _, m in self.named_children():
            yield m

    def _named_members(self, table, prefix, recurse, remove_duplicate=True):
        seen = set()
        mods = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for mp, m in mods:
            for name, t in m.__dict__[table].items():
                if t is None or (remove_duplicate and id(t) in seen):
                    continue
                seen.add(id(t))
                yield mp + ("." if mp else "") + name, t

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        yield from self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse=True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        yield from self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse=True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    # ---- state ----
    def state_dict(self, *args, destination=None, prefix="", keep_vars=False):
        if args:  # the old positional form (destination, prefix, keep_vars)
            destination = args[0]
            prefix = args[1] if len(args) > 1 else prefix
            keep_vars = args[2] if len(args) > 2 else keep_vars
        if destination is None:
            destination = OrderedDict()
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else p.detach()
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = b if keep_vars else b.detach()
        for name, m in self._modules.items():
            if m is not None:
                m.state_dict(destination=destination, prefix=prefix + name + ".", keep_vars=keep_vars)
        return destination

    def load_state_dict(self, state_dict, strict=True):
        own = self.state_dict(keep_vars=True)
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            parts = []
            if missing:
                parts.append("Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + ".")
            if unexpected:
                parts.append("Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + ".")
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t" + "\n\t".join(parts))
        errors = []
        values = {}
        for k, t in own.items():
            if k not in state_dict:
                continue
            v = _as_tensor(state_dict[k])
            if tuple(v.shape) != tuple(t.shape):
                errors.append(f"size mismatch for {k}: copying a param with shape {list(v.shape)} from checkpoint, "
                              f"the shape in current model is {list(t.shape)}.")
            values[k] = v
        if errors:
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t" + "\n\t".join(errors))
        params = {id(p) for p in self.parameters()}
        with tessera.no_grad():
            for k, v in values.items():
                t = own[k]
                if id(t) in params:
                    t.copy_(v.to(t.device))  # in place: the parameter keeps its identity and grad state
                else:  # a buffer (possibly a view, which copy_ refuses): its value replaced
                    t.data = v.to(t.device).to(t.dtype)
        return _IncompatibleKeys(missing, unexpected)

    # ---- modes and conversions ----
    def train(self, mode=True):
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        for m in self.modules():
            m.__dict__["training"] = mode
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, requires_grad=True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none=True):
        _zero_grads(self.parameters(), set_to_none)

    def apply(self, fn):
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def _apply(self, fn, floating_only=False):
        """Replaces every parameter's and buffer's value by fn(value), keeping their identities."""
        with tessera.no_grad():
            for m in self.modules():
                for p in m._parameters.values():
                    if p is not None and (not floating_only or p.is_floating_point()):
                        new = fn(p.detach())
                        if new is not p:
                            p.data = new
                for name, b in m._buffers.items():
                    if b is not None and (not floating_only or b.is_floating_point()):
                        new = fn(b)
                        if new is not b:
                            b.data = new
        return self

    def to(self, *args, **kwargs):
        device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
        kwargs.pop("non_blocking", None)
        if kwargs:
            raise TypeError(f"Module.to() got unexpected keyword arguments {sorted(kwargs)}")
        for a in args:
            if isinstance(a, tessera.dtype):
                dtype = a
            elif isinstance(a, tessera.Tensor):
                device, dtype = a.device, a.dtype
            else:
                device = a
        if dtype is not None and not dtype.is_floating_point:
            raise TypeError(f"nn.Module.to only accepts floating point dtypes, but got desired dtype={dtype}")

        def convert(t):
            if device is not None and str(t.device) != str(tessera.device(device)):
                t = t.to(device)
            if dtype is not None and t.is_floating_point() and t.dtype != dtype:
                t = t.to(dtype)
            return t

        return self._apply(convert)

    def cpu(self):
        return self.to("cpu")

    def cuda(self, device=None):
        return self.to("cuda" if device is None else f"cuda:{device}" if isinstance(device, int) else device)

    def float(self):
        return self._apply(lambda t: t.to(tessera.float32), floating_only=True)

    def double(self):
        return self._apply(lambda t: t.to(tessera.float64), floating_only=True)

    def half(self):
        return self._apply(lambda t: t.to(tessera.float16), floating_only=True)

    def bfloat16(self):
        return self._apply(lambda t: t.to(tessera.bfloat16), floating_only=True)

    def type(self, dst_type):
        return self._apply(lambda t: t.to(dst_type), floating_only=True)

    # ---- printing ----
    def extra_repr(self):
        return ""

    def _get_name(self):
        return type(self).__name__

    def __repr__(self):
        lines = []
        extra = self.extra_repr()
        if extra:
            lines = extra.split("\n")
        for name, m in self._modules.items():
            sub = repr(m).replace("\n", "\n  ")
            lines.append(f"({name}): {sub}")
        main = self._get_name() + "("
        if lines:
            if len(lines) == 1 and not self._modules:
                main += lines[0]
            else:
                main += "\n  " + "\n  ".join(lines) + "\n"
        return main + ")"

    def __getstate__(self):
        return self.__dict__.copy()

    def __setstate__(self, state):
        self.__dict__.update(state)

    # ---- hooks: forward ones (they run in Python around forward); backward hooks are not supported ----
    def _add_hook(self, table, hook, prepend, with_kwargs, what):
        if with_kwargs:
            raise TypeError(f"tessera.nn.Module.{what}: with_kwargs=True is not supported")
        hooks = self.__dict__.setdefault(table, OrderedDict())
        key = next(_hook_ids)
        hooks[key] = hook
        if prepend:
            hooks.move_to_end(key, last=False)
        return _RemovableHandle(hooks, key)

    def register_forward_pre_hook(self, hook, *, prepend=False, with_kwargs=False):
        """hook(module, args) runs before forward; a non-None result replaces args."""
        return self._add_hook("_forward_pre_hooks", hook, prepend, with_kwargs, "register_forward_pre_hook")

    def register_forward_hook(self, hook, *, prepend=False, with_kwargs=False, always_call=False):
        """hook(module, args, output) runs after forward; a non-None result replaces output."""
        return self._add_hook("_forward_hooks", hook, prepend, with_kwargs, "register_forward_hook")

    def _unsupported(self, what):
        raise AttributeError(f"tessera.nn.Module.{what} is not supported")

    def register_full_backward_hook(self, *a, **k):
        self._unsupported("register_full_backward_hook")

    def register_backward_hook(self, *a, **k):
        self._unsupported("register_backward_hook")
