"""tessera.nn.Module subclassed in Python: registration by attribute, weight tying, buffers,
state_dict/load_state_dict, modes, apply/to/zero_grad, init, clip_grad_norm_, and module paths
as Tessera scopes (the profiler names Python modules)."""
import numpy as np
import pytest

from nn_ref import close, copy_state, rand, tessera, torch

nn = tessera.nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.body = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 10, bias=False)})
        self.heads["a"].weight = self.emb.weight  # tied
        self.register_buffer("scale", tessera.ones(4))
        self.register_buffer("cache", tessera.zeros(2), persistent=False)
        self.plain = 3

    def forward(self, idx):
        x = self.emb(idx) * self.scale
        for layer in self.body:
            x = layer(x).relu()
        return self.heads["a"](x)


def test_registration_and_tying():
    m = Net()
    names = [n for n, _ in m.named_parameters()]
    assert names == ["emb.weight", "body.0.weight", "body.0.bias", "body.1.weight", "body.1.bias"]
    assert len(list(m.parameters())) == 5
    assert m.heads.a.weight is m.emb.weight
    assert list(m.state_dict()) == ["scale", "emb.weight", "body.0.weight", "body.0.bias", "body.1.weight",
                                    "body.1.bias", "heads.a.weight"]
    assert [n for n, _ in m.named_buffers()] == ["scale", "cache"]
    assert [n for n, _ in m.named_modules()] == ["", "emb", "body", "body.0", "body.1", "heads", "heads.a"]
    assert [n for n, _ in m.named_children()] == ["emb", "body", "heads"]
    assert m.plain == 3 and "plain" not in m._parameters
    assert isinstance(m.emb.weight, tessera.Tensor) and m.emb.weight.requires_grad and m.emb.weight.is_leaf
    with pytest.raises(AttributeError, match="'Net' object has no attribute 'nope'"):
        m.nope
    with pytest.raises(TypeError, match="cannot assign"):
        m.emb.weight = tessera.ones(10, 4)  # a plain tensor over a parameter
    del m.body
    assert [n for n, _ in m.named_children()] == ["emb", "heads"]


def test_tied_weight_gets_both_gradients():
    m = Net()
    idx = tessera.tensor(np.array([[1, 2, 3]], np.int64))
    m(idx).sum().backward()
    g = m.emb.weight.grad
    assert g is not None and tuple(g.shape) == (10, 4)
    # The head's contribution reaches rows the embedding never looked up.
    assert np.abs(g.detach().numpy()[7]).sum() > 0


def test_state_dict_round_trip_and_strict():
    a, b = Net(), Net()
    res = b.load_state_dict(a.state_dict())
    assert res.missing_keys == [] and res.unexpected_keys == []
    for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        np.testing.assert_array_equal(x.detach().numpy(), y.detach().numpy(), err_msg=k)
    sd = a.state_dict()
    del sd["body.0.bias"]
    sd["extra"] = tessera.ones(1)
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "body.0.bias".*\n.*Unexpected key'):
        b.load_state_dict(sd)
    res = b.load_state_dict(sd, strict=False)
    assert res.missing_keys == ["body.0.bias"] and res.unexpected_keys == ["extra"]
    sd = a.state_dict()
    sd["body.0.bias"] = tessera.ones(5)
    with pytest.raises(RuntimeError, match="size mismatch for body.0.bias"):
        b.load_state_dict(sd)


def test_state_dict_keys_match_torch_for_the_same_definition():
    def build(nn):
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(1, 2, 3)
                self.bn = nn.BatchNorm2d(2)
                self.seq = nn.Sequential(nn.Flatten(), nn.Linear(2, 3))
                self.ln = nn.LayerNorm(3)
        return M()
    assert list(build(nn).state_dict()) == list(build(torch.nn).state_dict())


def test_train_eval_apply_requires_grad_zero_grad():
    m = Net()
    assert m.training and m.body[0].training
    m.eval()
    assert not m.training and not m.body[1].training
    m.train()
    seen = []
    assert m.apply(lambda mod: seen.append(type(mod).__name__)) is m
    assert seen == ["Embedding", "Linear", "Linear", "ModuleList", "Linear", "ModuleDict", "Net"]
    m(tessera.tensor(np.array([[1]], np.int64))).sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())
    m.requires_grad_(False)
    assert not any(p.requires_grad for p in m.parameters())


def test_to_keeps_parameter_identity():
    m = nn.Linear(3, 2)
    w = m.weight
    before = m.weight.detach().numpy().copy()
    assert m.to(tessera.float64) is m
    assert m.weight is w and m.weight.dtype == tessera.float64
    np.testing.assert_allclose(m.weight.detach().numpy(), before, rtol=1e-7)
    m.to("cpu").float()
    assert m.weight.dtype == tessera.float32 and m.weight.requires_grad


def test_init_functions_in_place_without_history():
    rng = np.random.default_rng(0)
    w = nn.Parameter(tessera.empty(200, 300))
    assert nn.init.normal_(w, mean=1.0, std=0.5) is w
    v = w.detach().numpy()
    assert abs(v.mean() - 1.0) < 0.01 and abs(v.std() - 0.5) < 0.01
    assert w.is_leaf and w.requires_grad
    nn.init.zeros_(w)
    assert not w.detach().numpy().any()
    nn.init.ones_(w)
    assert (w.detach().numpy() == 1).all()
    nn.init.constant_(w, 0.25)
    assert (w.detach().numpy() == 0.25).all()
    nn.init.uniform_(w, -2, 3)
    v = w.detach().numpy()
    assert v.min() >= -2 and v.max() < 3 and abs(v.mean() - 0.5) < 0.05
    nn.init.xavier_uniform_(w)
    bound = np.sqrt(6 / 500)
    assert np.abs(w.detach().numpy()).max() <= bound and w.detach().numpy().std() > bound / 2
    nn.init.kaiming_uniform_(w, a=np.sqrt(5))
    assert np.abs(w.detach().numpy()).max() <= 1 / np.sqrt(300) + 1e-7
    nn.init.kaiming_normal_(w, nonlinearity="relu")
    assert abs(w.detach().numpy().std() - np.sqrt(2 / 300)) < 0.005
    nn.init.trunc_normal_(w, std=0.02, a=-0.04, b=0.04)
    assert np.abs(w.detach().numpy()).max() <= 0.04 and abs(w.detach().numpy().std() - 0.02) < 0.004
    assert nn.init.calculate_gain("tanh") == torch.nn.init.calculate_gain("tanh")
    del rng


def test_default_init_matches_torch_distribution():
    # PyTorch's Linear/Conv2d defaults: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases.
    lin = nn.Linear(400, 300)
    bound = 1 / np.sqrt(400)
    for t in (lin.weight, lin.bias):
        v = t.detach().numpy()
        assert np.abs(v).max() <= bound and np.abs(v).max() > 0.9 * bound
    emb = nn.Embedding(300, 200)
    assert abs(emb.weight.detach().numpy().std() - 1) < 0.02


def test_clip_grad_norm_matches_torch():
    rng = np.random.default_rng(3)
    tl, sl = torch.nn.Linear(5, 4), nn.Linear(5, 4)
    copy_state(tl, sl)
    x = rand(rng, 6, 5, scale=4)
    tl(torch.tensor(x)).pow(2).sum().backward()
    sl(tessera.tensor(x)).pow(2).sum().backward()
    tn = torch.nn.utils.clip_grad_norm_(tl.parameters(), 0.5)
    sn = nn.utils.clip_grad_norm_(sl.parameters(), 0.5)
    close(sn, tn, what="norm")
    close(sl.weight.grad, tl.weight.grad, what="clipped grad")
    close(sl.bias.grad, tl.bias.grad, what="clipped grad")


def test_module_paths_are_scopes_in_the_profiler():
    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, x):
            return self.proj(x).softmax(-1)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict({"h": nn.ModuleList([Attn(), Attn()])})

        def forward(self, x):
            for block in self.transformer.h:
                x = block(x)
            return x

    m = Model()
    x = tessera.randn(4, 8)
    with tessera.profiler.profile() as prof:
        m(x).sum().item()
    names = {r.name for r in prof.op_table("module")}
    assert {"transformer.h.0.proj", "transformer.h.1.proj"} <= names, names
    assert any(n.startswith("transformer.h.1") for n in names)
    assert tessera.current_scope() == ""


def test_memory_plan_names_python_modules():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 64)

        def forward(self, x):
            return self.fc(x).relu()

    m = nn.Sequential(Block(), nn.Linear(64, 4))
    loss = m(tessera.randn(32, 16)).square().mean()
    loss.backward()
    plan = tessera.memory.plan([loss, m[0].fc.weight.grad])
    scopes = {b.scope for b in plan.buffers}
    assert any(s.startswith("0.fc") for s in scopes), scopes


def test_deepcopy_clones_parameters_and_buffers_keeping_ties():
    import copy
    m = Net()
    c = copy.deepcopy(m)
    assert c.emb.weight is not m.emb.weight and c.heads.a.weight is c.emb.weight
    assert isinstance(c.emb.weight, nn.Parameter) and c.emb.weight.requires_grad
    np.testing.assert_array_equal(c.emb.weight.detach().numpy(), m.emb.weight.detach().numpy())
    assert c.scale is not m.scale and [n for n, _ in c.named_buffers()] == ["scale", "cache"]
    with tessera.no_grad():
        c.emb.weight.add_(1.0)
    assert not np.allclose(c.emb.weight.detach().numpy(), m.emb.weight.detach().numpy())


def test_state_dict_loads_into_torch_and_back():
    def make(lib):
        return lib.nn.Sequential(lib.nn.Conv2d(1, 2, 3), lib.nn.BatchNorm2d(2), lib.nn.Flatten(), lib.nn.Linear(8, 3))
    sm, tm = make(tessera), make(torch)
    x = rand(np.random.default_rng(2), 2, 1, 4, 4)
    sm(tessera.tensor(x))  # training mode: moves the running statistics
    tm.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in sm.state_dict().items()})
    sm.eval(), tm.eval()
    close(sm(tessera.tensor(x)), tm(torch.tensor(x)), what="eval output after loading tessera's state into torch")


def test_errors_name_the_op_shapes_and_module_path():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(4, 4), nn.Linear(5, 2))])

        def forward(self, x):
            return self.blocks[0](x)

    with pytest.raises(RuntimeError) as e:
        Model()(tessera.randn(3, 4)).sum().item()
    msg = str(e.value)
    assert "blocks.0.1" in msg and "[3, 4]" in msg, msg
    assert tessera.current_scope() == ""  # the failed call's scopes were popped


def test_scopes_of_shared_and_foreign_modules_and_threads():
    import threading

    shared = nn.Linear(4, 4)

    class Model(nn.Module):
        def __init__(self, foreign):
            super().__init__()
            self.a = shared
            self.b = shared  # one module under two names: its first path names it
            self.foreign = foreign

        def forward(self, x):
            x = self.b(self.a(x))
            return outsider(self.foreign(x))  # a module outside the tree: named by its class

    outsider = nn.Tanh()
    m = Model(nn.Sequential(nn.ReLU()))
    with tessera.profiler.profile() as prof:
        m(tessera.randn(2, 4)).sum().item()
    names = {r.name for r in prof.op_table("module")}
    assert {"a", "foreign.0", "Tanh"} <= names, names
    # Each thread keeps its own stack of running modules.
    errors = []
    turn = threading.Lock()  # the lazy graph has one owner at a time (docs/architecture.md, Threading)

    def run():
        try:
            with turn:
                for _ in range(20):
                    m(tessera.randn(2, 4))
                # Hand the graph over before the thread ends: join() may return before the
                # thread's exit gives up its unsynced draws.
                tessera.sync()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and tessera.current_scope() == ""


def test_forward_hooks():
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    seen = []
    h1 = m[0].register_forward_hook(lambda mod, args, out: seen.append(("post", type(mod).__name__, tuple(out.shape))))
    h2 = m[0].register_forward_pre_hook(lambda mod, args: (args[0] * 0,))  # replaces the input
    h3 = m[1].register_forward_hook(lambda mod, args, out: out + 1)  # replaces the output
    y = m(tessera.randn(2, 3))
    bias = m[0].bias.detach().numpy()
    np.testing.assert_allclose(y.detach().numpy(), np.maximum(bias, 0)[None, :].repeat(2, 0) + 1, rtol=1e-6)
    assert seen == [("post", "Linear", (2, 3))]
    for h in (h1, h2, h3):
        h.remove()
    x = tessera.randn(2, 3)
    np.testing.assert_allclose(m(x).detach().numpy(), np.maximum(m[0](x).detach().numpy(), 0), rtol=1e-6)
    assert len(seen) == 1
    with pytest.raises(AttributeError, match="register_full_backward_hook is not supported"):
        m.register_full_backward_hook(lambda *a: None)
