"""Shared by the Python suites: PyTorch (Debian's python3-torch) is the reference. Under CI=true a
missing torch or numpy fails the run instead of skipping it."""
import os

import numpy as np
import pytest

try:
    import torch
except ImportError:  # pragma: no cover - exercised only without python3-torch
    torch = None

import tessera

CI = os.environ.get("CI") == "true"


def require(mod, name):
    if mod is None:
        if CI:
            pytest.fail(f"CI=true: {name} is required (Debian package python3-{name})")
        pytest.skip(f"{name} not installed")
    return mod


@pytest.fixture
def th():
    return require(torch, "torch")


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def normalized_error(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, f"shapes differ: {a.shape} vs {b.shape}"
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))


def to_np(t):
    if isinstance(t, tessera.Tensor):
        return t.detach().numpy()
    return t.detach().numpy()


def assert_close(t_out, p_out, tol=1e-5, what="value"):
    if isinstance(p_out, (tuple, list)):
        assert len(t_out) == len(p_out), f"{what}: {len(t_out)} results vs {len(p_out)}"
        for a, b in zip(t_out, p_out):
            assert_close(a, b, tol, what)
        return
    if not hasattr(p_out, "detach"):  # Python scalars
        assert abs(float(t_out) - float(p_out)) <= tol * max(1.0, abs(float(p_out))), f"{what}: {t_out} vs {p_out}"
        return
    assert tuple(t_out.shape) == tuple(p_out.shape), f"{what}: shape {tuple(t_out.shape)} vs {tuple(p_out.shape)}"
    assert str(t_out.dtype).split(".")[-1] == str(p_out.dtype).split(".")[-1], \
        f"{what}: dtype {t_out.dtype} vs {p_out.dtype}"
    err = normalized_error(to_np(t_out), to_np(p_out))
    assert err <= tol, f"{what}: normalized error {err:.3g} > {tol}"


@pytest.fixture(autouse=True)
def _seeded():
    # Debian's torch 1.13 seeds its default generator randomly per process: seed both sides per
    # test, so every run compares the same weights and a failure reproduces.
    if torch is not None:
        torch.manual_seed(0)
    tessera.manual_seed(0)
