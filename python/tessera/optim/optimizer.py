"""tessera.optim.Optimizer: PyTorch's optimizer protocol (param groups, state, checkpoints).

Subclasses implement step() over the multi-tensor C++ kernels (tessera._C._nn.sgd_update,
adam_update), which update every parameter of a group in place, lazily: the step joins the
training step's graph. Learning rates and step-dependent factors enter that graph as runtime
scalars, so changing group["lr"] between steps never recompiles.
"""
import copy
import functools
from collections import defaultdict

import tessera
from tessera.nn.module import _as_tensor, _zero_grads


class _RequiredParameter:
    def __repr__(self):
        return "<required parameter>"


required = _RequiredParameter()


class Optimizer:
    def __init_subclass__(cls, **kwargs):
        # Every step() (subclasses' too) first takes back what a step whose graph failed left:
        # tessera.sync() restored the parameters and the state it updated in place and errored
        # the state it created (docs/architecture.md, "Failure isolation").
        super().__init_subclass__(**kwargs)
        inner = cls.__dict__.get("step")
        if inner is None or getattr(inner, "_takes_back_failed_steps", False):
            return

        @functools.wraps(inner)
        def step(self, *args, **kw):
            self._take_back_failed_step()
            out = inner(self, *args, **kw)
            self._versions = {id(p): p._version for g in self.param_groups for p in g["params"]}
            return out
        step._takes_back_failed_steps = True
        cls.step = step

    def _take_back_failed_step(self):
        versions = getattr(self, "_versions", None)
        if not versions:
            return
        for p, st in list(self.state.items()):
            if any(isinstance(v, tessera.Tensor) and v._failed() for v in st.values()):
                del self.state[p]  # state the failed step created
            elif p._version < versions.get(id(p), -1) and isinstance(st.get("step"), int) and st["step"] > 0:
                st["step"] -= 1  # its update was taken back
        self._versions = None

    def __init__(self, params, defaults):
        self.defaults = defaults
        self.state = defaultdict(dict)
        self.param_groups = []
        if isinstance(params, tessera.Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, "
                            f"but got {type(params).__name__}")
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)

    def __getstate__(self):
        return {"defaults": self.defaults, "state": self.state, "param_groups": self.param_groups}

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __repr__(self):
        s = type(self).__name__ + " ("
        for i, g in enumerate(self.param_groups):
            s += f"\nParameter Group {i}"
            for k in sorted(g):
                if k != "params":
                    s += f"\n    {k}: {g[k]}"
        return s + "\n)"

    def add_param_group(self, param_group):
        if not isinstance(param_group, dict):
            raise TypeError("param group must be a dict")
        params = param_group["params"]
        params = [params] if isinstance(params, tessera.Tensor) else list(params)
        for p in params:
            if not isinstance(p, tessera.Tensor):
                raise TypeError("optimizer can only optimize Tensors, but one of the params is " + type(p).__name__)
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        group = dict(param_group, params=params)
        for k, v in self.defaults.items():
            if v is required and k not in group:
                raise ValueError(f"parameter group didn't specify a value of required optimization parameter {k}")
            group.setdefault(k, v)
        ids = {id(p) for g in self.param_groups for p in g["params"]}
        if len({id(p) for p in params}) != len(params) or any(id(p) in ids for p in params):
            raise ValueError("some parameters appear in more than one parameter group (or twice in one)")
        self.param_groups.append(group)

    def zero_grad(self, set_to_none=True):
        _zero_grads((p for g in self.param_groups for p in g["params"]), set_to_none)

    def step(self, closure=None):
        raise NotImplementedError

    def _closure(self, closure):
        if closure is None:
            return None
        with tessera.enable_grad():
            return closure()

    # ---- checkpoints (PyTorch's layout: parameters by index through the groups) ----
    def state_dict(self):
        index, groups, n = {}, [], 0
        for g in self.param_groups:
            packed = {k: v for k, v in g.items() if k != "params"}
            packed["params"] = list(range(n, n + len(g["params"])))
            for p in g["params"]:
                index[id(p)] = n
                n += 1
            groups.append(packed)
        state = {index[id(p)]: dict(s) for p, s in self.state.items() if id(p) in index}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(a["params"]) != len(b["params"]) for a, b in zip(self.param_groups, groups)):
            raise ValueError("loaded state dict contains a parameter group that doesn't match the size of "
                             "optimizer's group")
        by_index = {}
        for mine, saved in zip(self.param_groups, groups):
            for p, i in zip(mine["params"], saved["params"]):
                by_index[i] = p
        self.state = defaultdict(dict)
        for i, s in state_dict["state"].items():
            p = by_index[int(i)]
            entry = {}
            for k, v in s.items():
                if k != "step" and hasattr(v, "shape"):
                    v = _as_tensor(v)
                    v = v.to(p.device).to(p.dtype) if v.is_floating_point() else v.to(p.device)
                    v = v.clone()
                elif k == "step":
                    v = int(v.item()) if hasattr(v, "item") else int(v)
                entry[k] = v
            self.state[p] = entry
        for mine, saved in zip(self.param_groups, groups):
            for k, v in saved.items():
                if k != "params":
                    mine[k] = copy.deepcopy(v)
