"""Values in and out: numpy (both ways), DLPack with torch (both ways), tolist/item, safetensors
files read by PyPI's safetensors.torch, and tessera.tensor's dtype inference (torch's rules)."""
import os

import numpy as np
import pytest

import tessera
from conftest import CI, require


@pytest.mark.parametrize("np_dtype,t_dtype", [
    (np.float32, tessera.float32), (np.float64, tessera.float64), (np.int64, tessera.int64),
    (np.int32, tessera.int32), (np.bool_, tessera.bool)])
def test_numpy_round_trip(rng, np_dtype, t_dtype):
    a = (rng.standard_normal((3, 4)) * 5).astype(np_dtype)
    t = tessera.tensor(a)
    assert t.dtype is t_dtype and t.shape == (3, 4)
    back = t.numpy()
    assert back.dtype == a.dtype
    np.testing.assert_array_equal(back, a)
    np.testing.assert_array_equal(np.asarray(t), a)
    a[0, 0] = 0  # tessera.tensor copied: the tensor keeps its value
    assert t.numpy()[0, 0] == back[0, 0]


def test_numpy_non_contiguous_and_narrow_ints(rng):
    a = rng.standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_array_equal(tessera.from_numpy(a.T).numpy(), a.T)
    u = np.arange(250, 256, dtype=np.uint8)
    t = tessera.from_numpy(u)
    assert t.dtype is tessera.int32 and t.tolist() == list(range(250, 256))


def test_half_types_through_numpy(rng):
    a = rng.standard_normal(5).astype(np.float16)
    t = tessera.tensor(a)
    assert t.dtype is tessera.float16
    np.testing.assert_array_equal(t.numpy(), a)
    with pytest.raises(TypeError):
        tessera.ones(2, dtype=tessera.bfloat16).numpy()


def test_python_data_dtype_inference():
    assert tessera.tensor([1.5, 2]).dtype is tessera.float32
    assert tessera.tensor([[1, 2], [3, 4]]).dtype is tessera.int64
    assert tessera.tensor([True, False]).dtype is tessera.bool
    assert tessera.tensor(3).dtype is tessera.int64 and tessera.tensor(3).shape == ()
    assert tessera.tensor(2.5).item() == 2.5
    assert tessera.tensor([1, 2], dtype=tessera.float64).dtype is tessera.float64
    assert tessera.tensor([[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
    assert tessera.tensor([0.5, 1.0]).tolist() == [0.5, 1.0]
    assert tessera.tensor([True]).tolist() == [True]
    assert isinstance(tessera.tensor(7).item(), int) and isinstance(tessera.tensor(7.0).item(), float)
    assert float(tessera.tensor([2.5])) == 2.5 and int(tessera.tensor(3)) == 3
    assert [1, 2, 3][tessera.tensor(1)] == 2  # __index__


def test_requires_grad_blocks_numpy():
    x = tessera.ones(2, requires_grad=True)
    with pytest.raises(TypeError, match="detach"):
        x.numpy()
    assert x.detach().numpy().tolist() == [1.0, 1.0]


def test_dlpack_both_ways(th, rng):
    a = rng.standard_normal((2, 3)).astype(np.float32)
    p = th.tensor(a)
    t = tessera.from_dlpack(p)
    assert t.dtype is tessera.float32 and t.shape == (2, 3)
    np.testing.assert_array_equal(t.numpy(), a)
    back = th.from_dlpack(t * 2)
    assert back.dtype == th.float32
    np.testing.assert_array_equal(back.numpy(), a * 2)
    assert t.__dlpack_device__() == (1, 0)
    # non-contiguous torch views, integer and bool tensors
    np.testing.assert_array_equal(tessera.from_dlpack(p.t()).numpy(), a.T)
    assert tessera.from_dlpack(th.arange(5)).tolist() == list(range(5))
    assert tessera.from_dlpack(th.tensor([True, False])).dtype is tessera.bool
    assert tessera.tensor(th.ones(2, dtype=th.bfloat16)).dtype is tessera.bfloat16


def test_safetensors_read_by_safetensors_torch(th, rng, tmp_path):
    try:
        from safetensors.torch import load_file as st_load, save_file as st_save
    except ImportError:
        if CI:
            pytest.fail("CI=true: safetensors (python/requirements-build.txt) is required")
        pytest.skip("safetensors not installed")
    a = rng.standard_normal((3, 4)).astype(np.float32)
    path = str(tmp_path / "w.safetensors")
    tessera.save_file({"w": tessera.tensor(a), "step": tessera.tensor([7]), "m": tessera.tensor([True])}, path)
    loaded = st_load(path)
    np.testing.assert_array_equal(loaded["w"].numpy(), a)
    assert loaded["step"].dtype == th.int64 and loaded["step"].tolist() == [7]
    # and the other way: safetensors.torch writes, tessera reads
    path2 = str(tmp_path / "t.safetensors")
    st_save({"x": th.tensor(a, dtype=th.float64)}, path2)
    x = tessera.load_file(path2)["x"]
    assert x.dtype is tessera.float64
    np.testing.assert_array_equal(x.numpy(), a.astype(np.float64))
    with pytest.raises(RuntimeError, match=r"\[load\]"):
        tessera.load_file(str(tmp_path / "missing.safetensors"))


def test_numpy_and_dlpack_share_the_cpu_buffer(th):
    t = tessera.arange(6, dtype=tessera.float32).reshape(2, 3) * 2  # pending: numpy() realizes it
    a, b = t.numpy(), t.numpy()
    assert np.shares_memory(a, b)  # both views of the tensor's one buffer: no copy
    assert not a.flags.writeable  # writes would reach ops traced earlier (lazy): refused
    with pytest.raises(ValueError):
        a[0, 0] = 1
    p = th.from_dlpack(t)
    assert p.data_ptr() == a.__array_interface__["data"][0]  # torch wraps the same memory
    t.add_(1)  # a shared buffer is never donated: the views keep the old value
    assert a.tolist() == [[0, 2, 4], [6, 8, 10]] and p.tolist() == a.tolist()
    assert t.tolist() == [[1, 3, 5], [7, 9, 11]]
    del t
    assert a.sum() == 30  # still valid after the tensor is gone
    assert th.from_dlpack(tessera.tensor([True, False])).tolist() == [1, 0]  # bool crosses as uint8 (torch 1.13's way)
    for dt, tdt in [(tessera.int32, th.int32), (tessera.float16, th.float16),
                    (tessera.bfloat16, th.bfloat16), (tessera.int64, th.int64), (tessera.float64, th.float64)]:
        x = tessera.tensor([[1, 0, 3]], dtype=dt)
        y = th.from_dlpack(x)
        assert y.dtype == tdt and y.tolist() == th.tensor([[1, 0, 3]], dtype=tdt).tolist()
    assert tessera.zeros(0, 3).numpy().shape == (0, 3)
