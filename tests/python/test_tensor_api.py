"""Factories, metadata, in-place ops, assignment, autodiff handles, grad mode, devices and the
runtime queries (metrics, profiler module paths, memory plans, seeds)."""
import numpy as np
import pytest

import tessera
from conftest import assert_close


def test_factories_shapes_dtypes(th):
    for name in ["zeros", "ones", "empty", "rand", "randn"]:
        t, p = getattr(tessera, name)(2, 3), getattr(th, name)(2, 3)
        assert t.shape == tuple(p.shape) and str(t.dtype) == str(p.dtype).replace("torch", "tessera")
        assert getattr(tessera, name)((4, 1)).shape == (4, 1)
        assert getattr(tessera, name + "_like")(t).shape == (2, 3)
    assert tessera.zeros(2, dtype=tessera.long).dtype is tessera.int64 and tessera.ones(size=(2, 1)).shape == (2, 1)
    assert tessera.ones([2, 2], dtype=tessera.float64, requires_grad=True).requires_grad
    assert tessera.zeros(3).tolist() == [0.0] * 3 and tessera.ones(2, dtype=tessera.bool).tolist() == [True, True]
    assert tessera.full((2,), 7).dtype is tessera.int64 and tessera.full((2,), 7.5).tolist() == [7.5, 7.5]
    assert tessera.full_like(tessera.ones(2), 3).tolist() == [3.0, 3.0]
    assert tessera.arange(5).tolist() == th.arange(5).tolist() and tessera.arange(5).dtype is tessera.int64
    assert tessera.arange(1, 2, 0.25).tolist() == th.arange(1, 2, 0.25).tolist()
    assert tessera.arange(0, 10, 3, dtype=tessera.float32).dtype is tessera.float32
    assert_close(tessera.linspace(0, 1, 5), th.linspace(0, 1, 5))
    assert_close(tessera.eye(3), th.eye(3))
    r = tessera.randint(3, 7, (1000,))
    assert r.dtype is tessera.int64 and r.min().item() >= 3 and r.max().item() <= 6
    assert tessera.randint(5, size=(2, 2)).shape == (2, 2)
    x = tessera.rand(20000)
    assert 0 <= x.min().item() and x.max().item() < 1 and abs(x.mean().item() - 0.5) < 0.01
    n = tessera.randn(20000)
    assert abs(n.mean().item()) < 0.03 and abs(n.std().item() - 1) < 0.03


def test_manual_seed_reproduces():
    tessera.manual_seed(3)
    a = tessera.randn(5).tolist()
    tessera.manual_seed(3)
    assert tessera.randn(5).tolist() == a
    state = tessera.get_rng_state()
    b = tessera.rand(3).tolist()
    tessera.set_rng_state(state)
    assert tessera.rand(3).tolist() == b


def test_manual_seed_and_rng_state_with_pending_draws():
    # Values are fixed when drawn, as in PyTorch, though the tensors are still pending (lazy).
    tessera.manual_seed(0)
    a = tessera.rand(4)
    tessera.manual_seed(0)
    b = tessera.rand(4)
    assert a.tolist() == b.tolist()
    tessera.manual_seed(1)
    c = tessera.rand(4)
    state = tessera.get_rng_state()  # after c's draw, though c is pending
    d = tessera.rand(4)
    tessera.set_rng_state(state)
    e = tessera.rand(4)
    assert d.tolist() == e.tolist() and c.tolist() != d.tolist() and a.tolist() != c.tolist()


def test_python_numbers_are_data_not_constants():
    # tessera.tensor(0.01) each step (a learning rate, a scale) must not compile a graph per value.
    x = tessera.randn(16)
    total = x.sum().item()  # realizes x too: a leaf from here on
    (x * tessera.tensor(0.5)).sum().item()
    before = tessera.metrics().graphs_compiled
    for v in (0.25, 2.0, 3.5):
        got = (x * tessera.tensor(v)).sum().item()
        assert abs(got - v * total) < 1e-4
    assert tessera.metrics().graphs_compiled == before  # every value hits the first product's graph
    assert tessera.tensor(True).dtype is tessera.bool and tessera.tensor(7).item() == 7
    assert tessera.tensor(2 ** 40).dtype is tessera.int64 and tessera.tensor(2 ** 40).item() == 2 ** 40


def test_metadata(th):
    x = tessera.ones(2, 3, 4)
    assert x.shape == (2, 3, 4) and x.size() == (2, 3, 4) and x.size(-1) == 4 and x.size(1) == 3
    assert x.dim() == 3 and x.ndim == 3 and x.numel() == 24 and len(x) == 2
    assert x.dtype is tessera.float32 and x.dtype == tessera.float and repr(x.dtype) == "tessera.float32"
    assert x.device == tessera.device("cpu") and str(x.device) == "cpu" and x.device.type == "cpu"
    assert x.is_floating_point() and not tessera.ones(1, dtype=tessera.long).is_floating_point()
    assert tessera.long is tessera.int64 and tessera.half is tessera.float16 and tessera.double is tessera.float64
    assert tessera.int is tessera.int32 and tessera.float is tessera.float32
    assert x.element_size() == 4 and tessera.is_tensor(x) and not tessera.is_tensor(1)
    assert "tensor(" in repr(tessera.tensor([1.0, 2.0]))
    assert len({x, tessera.ones(1)}) == 2  # hashable by identity, like torch


def test_in_place_ops_match_torch(th, rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((4,)).astype(np.float32)
    ops = [
        lambda m, x, y: x.add_(y),
        lambda m, x, y: x.add_(y, alpha=2),
        lambda m, x, y: x.sub_(y, alpha=0.5),
        lambda m, x, y: x.mul_(y),
        lambda m, x, y: x.div_(2.0),
        lambda m, x, y: x.zero_(),
        lambda m, x, y: x.fill_(1.5),
        lambda m, x, y: x.copy_(y),
        lambda m, x, y: x.masked_fill_(x > 0, 0.0),
        lambda m, x, y: x.clamp_(-0.1, 0.2),
        lambda m, x, y: x.clamp_(min=0.0),
    ]
    for op in ops:
        x, px = tessera.tensor(a), th.tensor(a)
        res = op(tessera, x, tessera.tensor(b))
        op(th, px, th.tensor(b))
        assert res is x  # in-place returns self
        assert_close(x, px)
    x, px = tessera.tensor(a), th.tensor(a)
    y = x
    x += 1
    x *= tessera.tensor(b)
    x -= 0.5
    x /= 2
    px += 1
    px *= th.tensor(b)
    px -= 0.5
    px /= 2
    assert x is y
    assert_close(x, px)


def test_setitem_matches_torch(th, rng):
    a = rng.standard_normal((4, 5)).astype(np.float32)
    cases = [
        lambda m, x: x.__setitem__((slice(None), 0), 7.0),
        lambda m, x: x.__setitem__(x > 0, 0.0),
        lambda m, x: x.__setitem__((1, slice(1, 3)), m.tensor([1.0, 2.0])),
        lambda m, x: x.__setitem__(Ellipsis, 3.0),
        lambda m, x: x.__setitem__(x[:, 0] > 0, -1.0),
        lambda m, x: x.__setitem__(-1, m.arange(5).float()),
    ]
    for c in cases:
        x, px = tessera.tensor(a), th.tensor(a)
        c(tessera, x)
        c(th, px)
        assert_close(x, px)


def test_autodiff_handles(th):
    x = tessera.tensor([1.0, 2.0, 3.0], requires_grad=True)
    assert x.requires_grad and x.is_leaf and x.grad is None
    y = (x * x).sum()
    assert y.requires_grad and not y.is_leaf
    y.backward()
    assert x.grad.tolist() == [2.0, 4.0, 6.0]
    (x * 2).backward(tessera.tensor([1.0, 0.0, 1.0]))  # accumulates, like torch
    assert x.grad.tolist() == [4.0, 4.0, 8.0]
    x.grad = None
    assert x.grad is None
    x.grad = tessera.zeros(3)
    assert x.grad.tolist() == [0.0] * 3
    d = x.detach()
    assert not d.requires_grad and d.tolist() == [1.0, 2.0, 3.0]
    z = tessera.ones(2)
    z.requires_grad = True
    assert z.requires_grad
    assert z.requires_grad_(False) is z and not z.requires_grad
    x.data = tessera.tensor([5.0, 5.0, 5.0])  # set_data keeps identity and requires_grad
    assert x.tolist() == [5.0] * 3 and x.requires_grad
    with pytest.raises(RuntimeError):
        tessera.ones(2, dtype=tessera.long).requires_grad_()


def test_tensor_subclass_like_parameter():
    class Parameter(tessera.Tensor):
        def __init__(self, data, requires_grad=True):
            super().__init__(data.detach())
            self.requires_grad_(requires_grad)

    w = Parameter(tessera.ones(2, 2))
    w.tag = "weight"  # Python subclasses carry attributes
    assert isinstance(w, tessera.Tensor) and w.requires_grad and w.is_leaf and w.tag == "weight"
    (w @ tessera.ones(2)).sum().backward()
    assert w.grad.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    with tessera.no_grad():
        w.sub_(w.grad, alpha=0.5)
    assert w.tolist() == [[0.5, 0.5], [0.5, 0.5]]


def test_grad_modes():
    x = tessera.ones(2, requires_grad=True)
    with tessera.no_grad():
        assert not (x * 2).requires_grad
        with tessera.enable_grad():
            assert (x * 2).requires_grad
        assert not tessera.is_grad_enabled()
    assert tessera.is_grad_enabled()

    @tessera.no_grad()
    def f(t):
        return t * 2

    @tessera.no_grad
    def g(t):
        return t * 2

    assert not f(x).requires_grad and not g(x).requires_grad and (x * 2).requires_grad
    with tessera.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert tessera.is_grad_enabled()
    tessera.set_grad_enabled(False)
    assert not tessera.is_grad_enabled()
    tessera.set_grad_enabled(True)


def test_devices_answer_truthfully():
    kinds = {d.type for d, _, can_run, _ in tessera.devices() if can_run}
    assert "cpu" in kinds
    assert tessera.cuda.is_available() == ("cuda" in kinds)
    assert tessera.cuda.device_count() == sum(1 for d, _, c, _ in tessera.devices() if d.type == "cuda" and c)
    if not tessera.cuda.is_available():
        with pytest.raises(RuntimeError):
            tessera.ones(2).to("cuda")
    assert tessera.ones(2).to("cpu").device.type == "cpu" and tessera.ones(2).cpu().device == "cpu"


def test_multinomial_distribution():
    tessera.manual_seed(0)
    probs = tessera.tensor([0.2, 0.0, 0.8])
    s = tessera.multinomial(probs, 4000, replacement=True)
    counts = np.bincount(s.numpy(), minlength=3) / 4000
    assert counts[1] == 0 and abs(counts[0] - 0.2) < 0.03
    one = probs.multinomial(1)
    assert one.shape == (1,) and one.item() in (0, 2)
    rows = tessera.softmax(tessera.randn(3, 6), dim=-1).multinomial(num_samples=6)
    assert all(sorted(r) == list(range(6)) for r in rows.tolist())


def test_metrics_profiler_and_memory_name_python_scopes():
    w = tessera.randn(16, 16, requires_grad=True)
    x = tessera.randn(8, 16)
    before = tessera.metrics().graphs_compiled
    with tessera.profiler.profile() as prof:
        for _ in range(3):
            with tessera.scope("mlp"):
                with tessera.scope("fc"):
                    h = (x @ w).relu()
            loss = h.sum()
            loss.backward()
            loss.item()
            w.grad = None
    modules = [r.name for r in prof.op_table("module")]
    assert any(n.startswith("mlp.fc") for n in modules), modules
    assert "mlp.fc" in prof.table()
    m = tessera.metrics()
    assert m.graphs_compiled - before <= 2 and m.cache_hits >= 1 and "graphs compiled" in m.report()
    plan = tessera.memory.last_plan()
    assert plan.peak_bytes > 0 and "peak" in plan.report()
    y = x @ w
    planned = tessera.memory.plan([y])
    assert planned.num_steps >= 1
    tessera.sync()


def test_python_level_helpers(th):
    x = tessera.ones(2, 3, dtype=tessera.float64)
    z = x.new_zeros(4)
    assert z.dtype is tessera.float64 and z.shape == (4,) and x.new_ones((2, 2)).tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert x.new_full((2,), 3).tolist() == [3.0, 3.0] and x.new_tensor([1, 2]).dtype is tessera.float64
    assert x.pin_memory() is x
    tessera.manual_seed(5)
    p = tessera.randperm(10)
    assert p.dtype is tessera.int64 and sorted(p.tolist()) == list(range(10))
    tessera.manual_seed(5)
    assert tessera.randperm(10).tolist() == p.tolist()
    a = tessera.tensor([1.0, 2.0])
    assert tessera.allclose(a, a + 1e-7) and not tessera.allclose(a, a + 1e-3)
    assert tessera.isclose(a, tessera.tensor([1.0, 2.1])).tolist() == [True, False]
    f = lambda t: t * 2  # noqa: E731
    assert tessera.compile(f) is f


def test_data_writes_through_like_torch(th):
    for m in (tessera, th):
        p = m.ones(3, requires_grad=True)
        (p * 2).sum().backward()
        p.data.add_(m.ones(3), alpha=-0.5)  # the old optimizer idiom
        p.grad.data.zero_()
        d = p.data
        d[0] = 5.0
        p.data *= 2
        assert p.tolist() == [10.0, 1.0, 1.0] and p.grad.tolist() == [0.0, 0.0, 0.0], m
        assert p.requires_grad and not p.data.requires_grad
        q = p.data * 3  # no history reaches p
        assert not q.requires_grad


def test_slice_bounds_from_tensors_and_numpy(th):
    data = tessera.arange(100)
    ix = tessera.tensor([3, 50])
    batch = tessera.stack([data[i:i + 4] for i in ix])
    assert batch.tolist() == [[3, 4, 5, 6], [50, 51, 52, 53]]
    assert data[np.int64(7)].item() == 7 and data[np.int32(2):np.int64(4)].tolist() == [2, 3]


def test_misc_torch_names(th):
    x = tessera.tensor([[3.0, -4.0]])
    assert x.norm().item() == 5.0 and tessera.norm(x, p=1).item() == 7.0
    assert_close(x.norm(dim=1, keepdim=True), th.tensor([[3.0, -4.0]]).norm(dim=1, keepdim=True))
    assert x.type() == "tessera.FloatTensor" and x.type(tessera.long).dtype is tessera.int64
    assert tessera.LongTensor([1, 2]).dtype is tessera.int64 and tessera.FloatTensor(2, 3).shape == (2, 3)
    assert tessera.finfo(tessera.float32).min == th.finfo(th.float32).min
    assert tessera.finfo(tessera.bfloat16).eps == th.finfo(th.bfloat16).eps
    assert tessera.iinfo(tessera.int64).max == th.iinfo(th.int64).max
    assert tessera.inf == float("inf") and tessera.pi == th.pi
    with pytest.raises(AttributeError, match="tessera.cuda.nccl is not supported"):
        tessera.cuda.nccl  # (tessera.cuda.amp is tessera.amp: GradScaler)


def test_in_place_keeps_the_dtype_like_torch(th):
    for m in (tessera, th):
        x = m.tensor([1, 2, 3])
        x += 2
        x *= 3
        assert x.dtype == m.int64 and x.tolist() == [9, 12, 15]
        with pytest.raises(RuntimeError):
            x += 0.5
        with pytest.raises(RuntimeError):
            x.add_(m.ones(3))
        y = m.ones(3)
        y.add_(m.tensor([1, 2, 3]))  # integers into a float tensor are fine
        y.copy_(m.tensor([7, 8, 9]))  # copy_ casts
        assert y.dtype == m.float32 and y.tolist() == [7.0, 8.0, 9.0]
        y.fill_(m.tensor(2.5))
        assert y.tolist() == [2.5] * 3


class _Parameter(tessera.Tensor):  # module level: pickle finds classes by name
    def __init__(self, data, requires_grad=True):
        super().__init__(data.detach())
        self.requires_grad_(requires_grad)


def test_deepcopy_pickle_save_load(tmp_path):
    import copy
    import pickle

    w = _Parameter(tessera.tensor([[1.0, 2.0]]))
    w.tag = "w"
    c = copy.deepcopy(w)
    assert type(c) is _Parameter and c.requires_grad and c.tag == "w" and c.tolist() == [[1.0, 2.0]]
    with tessera.no_grad():
        c.add_(1.0)
    assert w.tolist() == [[1.0, 2.0]]  # the copy is independent
    d = copy.deepcopy({"a": w, "b": w})
    assert d["a"] is d["b"]  # memo: one copy per tensor
    state = {"w": w, "step": tessera.tensor(3), "h": tessera.ones(2, dtype=tessera.bfloat16), "lr": 0.1}
    r = pickle.loads(pickle.dumps(state))
    assert type(r["w"]) is _Parameter and r["w"].requires_grad and r["step"].item() == 3
    assert r["h"].dtype is tessera.bfloat16 and r["lr"] == 0.1
    path = tmp_path / "ckpt.pt"
    tessera.save(state, str(path))
    back = tessera.load(str(path), map_location="cpu")
    assert back["w"].tolist() == [[1.0, 2.0]] and back["step"].dtype is tessera.int64


def test_repr_like_torch(th):
    cases = [lambda m: m.tensor([[1.5, -2.25], [3.0, 4.125]]), lambda m: m.tensor([1.0, 2.0]),
             lambda m: m.arange(5), lambda m: m.tensor([True, False]),
             lambda m: m.tensor([1.5, 2.0], dtype=m.float64), lambda m: m.tensor([1, 2], dtype=m.int32),
             lambda m: m.tensor([0.5, 1.5], requires_grad=True), lambda m: m.tensor(2.5), lambda m: m.zeros(2, 0)]
    for c in cases:
        assert repr(c(tessera)) == repr(c(th)).replace("torch.", "tessera."), repr(c(th))
    x = tessera.tensor([1.0], requires_grad=True)
    assert x.grad_fn is None and (x * 2).grad_fn is not None and "grad_fn" in repr(x * 2)


def test_more_in_place_methods(th):
    for m in (tessera, th):
        x = m.tensor([-1.0, 0.25, 4.0])
        assert x.relu_() is x and x.tolist() == [0.0, 0.25, 4.0]
        x.sqrt_()
        x.pow_(2)
        assert x.tolist() == [0.0, 0.25, 4.0]
    assert tessera.get_default_dtype() is tessera.float32
    with pytest.raises(TypeError):
        tessera.set_default_dtype(tessera.float64)


def test_every_executable_device_agrees_with_cpu(rng):
    """The wheel carries the backend plugins beside libtessera: every device that can run (PoCL's
    OpenCL device in CI, a GPU where there is one) computes what the cpu computes."""
    a = rng.standard_normal((8, 16)).astype(np.float32)
    w = rng.standard_normal((16, 4)).astype(np.float32)
    want = (tessera.tensor(a) @ tessera.tensor(w)).relu().sum(dim=0).numpy()
    for d, _, can_run, _ in tessera.devices():
        if not can_run or d.type == "cpu":
            continue
        x, y = tessera.tensor(a, device=d), tessera.tensor(w).to(d)
        got = (x @ y).relu().sum(dim=0)
        assert got.device == d
        np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-4, atol=1e-4, err_msg=str(d))


def test_why_a_backend_is_unavailable_is_said():
    if not tessera.cuda.is_available():
        why = tessera.cuda.why_unavailable()
        assert all(line.startswith("cuda") or "cuda" in line for line in why)
    assert isinstance(tessera.unavailable_backends(), list) and isinstance(tessera.plugin_errors(), list)
