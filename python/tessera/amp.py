"""tessera.amp (also tessera.cuda.amp): GradScaler, PyTorch's dynamic loss scaling, and autocast.

GradScaler: scale(loss) multiplies by the scale (a 0-d tensor input of the graph, so a changed
scale never recompiles), unscale_(optimizer) divides the gradients back and notes whether any is
inf/NaN, step(optimizer) skips the update when one was (reading that flag is a host sync, as
PyTorch's is), update() halves the scale after a skipped step and doubles it after
growth_interval good ones. enabled=False passes everything through (nanoGPT builds its scaler
that way on a CPU).

autocast: the C++ tessera::Autocast (docs/architecture.md, "Autocast"). While it is entered on a
thread, matrix products and convolutions traced there take bfloat16 (or float16) copies of their
float32 operands, accumulate in float32 and return float32; everything else, the parameters,
gradients and optimizer state stay float32. The dtype defaults as PyTorch's do: float16 for
device_type "cuda", bfloat16 otherwise. enabled=False (or dtype float32, which PyTorch's CPU
autocast also turns into a disabled one) makes a scope without autocast inside an enabled one.
Other dtypes raise TypeError.
"""
import contextlib

import tessera

__all__ = ["GradScaler", "autocast"]


class GradScaler:
    def __init__(self, device="cuda", init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True):
        if isinstance(device, (int, float)):  # the positional form of torch.cuda.amp.GradScaler
            device, init_scale = "cuda", float(device)
        self._enabled = bool(enabled)
        self._scale, self._growth_factor, self._backoff_factor = float(init_scale), growth_factor, backoff_factor
        self._growth_interval, self._growth_tracker = growth_interval, 0
        self._found_inf = {}  # per optimizer (by id): a lazy 0-d bool tensor from unscale_, or None
        self._unscaled = set()

    def is_enabled(self):
        return self._enabled

    def get_scale(self):
        return self._scale if self._enabled else 1.0

    def _scale_tensor(self, like):
        return tessera.tensor([self._scale], dtype=like.dtype, device=like.device).reshape(())

    def scale(self, outputs):
        if not self._enabled:
            return outputs
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        return outputs * self._scale_tensor(outputs)

    def unscale_(self, optimizer):
        if not self._enabled:
            return
        if id(optimizer) in self._unscaled:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        found = None
        with tessera.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    g = p.grad * (1.0 / self._scale_tensor(p.grad))
                    p.grad = g
                    bad = (g != g).logical_or(g.abs() == float("inf")).any()  # NaN or inf
                    found = bad if found is None else found.logical_or(bad)
        self._found_inf[id(optimizer)] = found
        self._unscaled.add(id(optimizer))

    def step(self, optimizer, *args, **kwargs):
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if id(optimizer) not in self._unscaled:
            self.unscale_(optimizer)
        found = self._found_inf[id(optimizer)]
        if found is not None and bool(found.item()):
            return None
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale=None):
        if not self._enabled:
            return
        if new_scale is not None:
            self._scale = float(new_scale.item() if hasattr(new_scale, "item") else new_scale)
        else:
            found = any(f is not None and bool(f.item()) for f in self._found_inf.values())
            if found:
                self._scale *= self._backoff_factor
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self._growth_interval:
                    self._scale *= self._growth_factor
                    self._growth_tracker = 0
        self._found_inf, self._unscaled = {}, set()

    def state_dict(self):
        if not self._enabled:
            return {}
        return {"scale": self._scale, "growth_factor": self._growth_factor, "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval, "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state_dict):
        if state_dict:
            self._scale = float(state_dict["scale"])
            self._growth_factor, self._backoff_factor = state_dict["growth_factor"], state_dict["backoff_factor"]
            self._growth_interval, self._growth_tracker = state_dict["growth_interval"], state_dict["_growth_tracker"]


class autocast(contextlib.ContextDecorator):
    """Reusable and nestable, like PyTorch's (`ctx = autocast(...)` then `with ctx:` every step)."""

    def __init__(self, device_type="cuda", dtype=None, enabled=True, cache_enabled=None):
        if dtype is None:
            dtype = tessera.float16 if str(device_type).startswith("cuda") else tessera.bfloat16
        if dtype == tessera.float32:
            dtype, enabled = tessera.bfloat16, False
        if dtype not in (tessera.bfloat16, tessera.float16):
            raise TypeError(f"tessera.autocast: products run in bfloat16 or float16 (or float32: no autocast), got {dtype}")
        self.fast_dtype, self._enabled = dtype, bool(enabled)

    def __enter__(self):
        tessera._C._push_autocast(self.fast_dtype, self._enabled)
        return self

    def __exit__(self, *exc):
        tessera._C._pop_autocast()
        return False
