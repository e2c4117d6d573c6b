"""tessera.amp.GradScaler (also tessera.cuda.amp): dynamic loss scaling by PyTorch's rules, checked
by hand (torch 1.13's scaler disables itself without CUDA, so it cannot be the reference here):
gradients come back unscaled, a step with an inf gradient is skipped and halves the scale, good
steps grow it after growth_interval; disabled it passes through. autocast: products in bfloat16
against the same product of bfloat16-rounded operands in torch (float32 accumulation), gradients
float32, nesting and disabling; it refuses dtypes it cannot run."""
import copy

import numpy as np
import pytest

import tessera


def model_and_opt():
    tessera.manual_seed(0)
    m = tessera.nn.Linear(3, 2)
    return m, tessera.optim.SGD(m.parameters(), lr=0.1)


def test_scaled_steps_equal_unscaled_ones():
    x = tessera.randn(4, 3)
    m1, o1 = model_and_opt()
    m2 = copy.deepcopy(m1)
    o2 = tessera.optim.SGD(m2.parameters(), lr=0.1)
    scaler = tessera.cuda.amp.GradScaler(init_scale=1024.0, growth_interval=2)
    for _ in range(3):
        o1.zero_grad()
        m1(x).square().mean().backward()
        o1.step()
        o2.zero_grad()
        loss = m2(x).square().mean()
        np.testing.assert_allclose(scaler.scale(loss).item(), scaler.get_scale() * loss.item(), rtol=1e-6)
        scaler.scale(loss).backward()
        scaler.unscale_(o2)
        np.testing.assert_allclose(m2.weight.grad.numpy(), m1.weight.grad.numpy(), rtol=1e-5, atol=1e-7)
        scaler.step(o2)
        scaler.update()
    np.testing.assert_allclose(m2.weight.detach().numpy(), m1.weight.detach().numpy(), rtol=1e-5)
    assert scaler.get_scale() == 2048.0  # grew once after 2 good steps


def test_inf_gradient_skips_the_step_and_backs_off():
    m, o = model_and_opt()
    before = m.weight.detach().numpy().copy()
    scaler = tessera.amp.GradScaler(init_scale=8.0)
    loss = (m(tessera.randn(2, 3)) * float("inf")).sum()
    scaler.scale(loss).backward()
    assert scaler.step(o) is None
    scaler.update()
    np.testing.assert_array_equal(m.weight.detach().numpy(), before)
    assert scaler.get_scale() == 4.0


def test_disabled_scaler_and_autocast():
    m, o = model_and_opt()
    scaler = tessera.cuda.amp.GradScaler(enabled=False)
    loss = m(tessera.randn(2, 3)).sum()
    assert scaler.scale(loss) is loss and not scaler.is_enabled()
    loss.backward()
    scaler.step(o)
    scaler.update()
    ctx = tessera.autocast("cpu", enabled=False)
    for _ in range(2):  # reusable
        with ctx:
            pass
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        tessera.amp.autocast("cpu", dtype=tessera.int64)


def test_autocast_runs_products_in_bfloat16():
    torch = pytest.importorskip("torch")
    a_np = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    b_np = np.random.default_rng(1).standard_normal((64, 5)).astype(np.float32)
    a = tessera.tensor(a_np, requires_grad=True)
    b = tessera.tensor(b_np)
    assert tessera.get_autocast_dtype() is None
    with tessera.autocast("cpu"):  # bfloat16 by default off cuda, as in PyTorch
        assert tessera.get_autocast_dtype() is tessera.bfloat16
        with tessera.autocast("cpu", enabled=False):
            assert tessera.get_autocast_dtype() is None
            plain = a @ b
        y = a @ b
        with tessera.autocast("cuda"):  # nested: float16 inside, bfloat16 again after
            assert tessera.get_autocast_dtype() is tessera.float16
        assert tessera.get_autocast_dtype() is tessera.bfloat16
    assert tessera.get_autocast_dtype() is None
    assert y.dtype is tessera.float32 and plain.dtype is tessera.float32
    ta, tb = torch.from_numpy(a_np), torch.from_numpy(b_np)
    rounded = (ta.bfloat16().float() @ tb.bfloat16().float()).numpy()  # bf16 operands, float32 sums
    np.testing.assert_allclose(y.detach().numpy(), rounded, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(plain.detach().numpy(), (ta @ tb).numpy(), rtol=1e-5, atol=1e-5)
    assert np.abs(y.detach().numpy() - plain.detach().numpy()).max() > 1e-3  # the rounding is visible: autocast did act
    y.sum().backward()
    assert a.grad.dtype is tessera.float32
    # d(sum(a @ b))/da = rowsums of b, seen through bfloat16 (the cotangent and b rounded)
    expected = np.broadcast_to(tb.bfloat16().float().sum(1).numpy(), a_np.shape)
    np.testing.assert_allclose(a.grad.numpy(), expected, rtol=1e-2, atol=1e-2)
