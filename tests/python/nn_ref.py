"""Helpers of the nn/optim tests: the reference (Debian's torch 1.13, required under CI=true),
tensors made alike on both sides, and the normalized error the issue asks for (<= 1e-5 in float32)."""
import importlib
import os

import numpy as np
import pytest

TOL = 1e-5


def require(name):
    """Imports a test dependency; missing, it skips the test (fails it under CI=true)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"{name} is not installed")


torch = require("torch")
import tessera  # noqa: E402  (after the reference: a missing torch must not hide behind a tessera error)


def rand(rng, *shape, scale=1.0):
    return np.asarray(rng.standard_normal(shape) * scale, dtype=np.float32)


def pair(a, requires_grad=False):
    """The same array as a torch tensor and a tessera tensor."""
    t, s = torch.tensor(a), tessera.tensor(a)
    if requires_grad:
        t.requires_grad_(True)
        s.requires_grad_(True)
    return t, s


def to_np(x):
    if isinstance(x, tessera.Tensor):
        return np.asarray(x.detach().numpy())
    return x.detach().cpu().numpy()


def nerr(got, want):
    """||got - want|| / max(||want||, 1e-30), in float64."""
    got, want = np.asarray(to_np(got), np.float64), np.asarray(to_np(want), np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    if want.size == 0:
        return 0.0
    return float(np.linalg.norm((got - want).ravel()) / max(np.linalg.norm(want.ravel()), 1e-30))


def close(got, want, tol=TOL, what=""):
    e = nerr(got, want)
    assert e <= tol, f"{what}: normalized error {e:.3g} > {tol}"


def copy_state(tmod, smod):
    """Loads the torch module's state into the tessera module (strict: the keys must match)."""
    smod.load_state_dict({k: v.detach().numpy() for k, v in tmod.state_dict().items()})
