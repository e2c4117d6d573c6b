"""Every tessera.nn layer against torch.nn 1.13: outputs, input gradients and parameter
gradients (normalized error <= 1e-5 in float32), with the torch layer's weights loaded into
tessera's through load_state_dict."""
import numpy as np
import pytest

from nn_ref import close, copy_state, pair, rand, tessera, torch, to_np

tnn, snn = torch.nn, tessera.nn


def check_layer(make, x_np, rng, integer_input=False, extra=None, train=True):
    """Runs make(torch.nn) and make(tessera.nn) on x; compares forward, backward and state."""
    tm, sm = make(tnn), make(snn)
    copy_state(tm, sm)
    tm.train(train)
    sm.train(train)
    tx, sx = pair(x_np, requires_grad=not integer_input)
    targs, sargs = ((), ()) if extra is None else extra
    ty, sy = tm(tx, *targs), sm(sx, *sargs)
    close(sy, ty, what="forward")
    w = rand(rng, *ty.shape)
    (ty * torch.tensor(w)).sum().backward()
    (sy * tessera.tensor(w)).sum().backward()
    if not integer_input:
        close(sx.grad, tx.grad, what="input grad")
    sparams = dict(sm.named_parameters())
    for name, p in tm.named_parameters():
        assert sparams[name].grad is not None, name
        close(sparams[name].grad, p.grad, what=f"grad of {name}")
    for (name, b), (sname, sb) in zip(tm.named_buffers(), sm.named_buffers()):
        assert name == sname
        close(sb, b, what=f"buffer {name}")
    return tm, sm


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.mark.parametrize("bias", [True, False])
def test_linear(rng, bias):
    check_layer(lambda nn: nn.Linear(6, 5, bias=bias), rand(rng, 3, 4, 6), rng)


def test_embedding(rng):
    idx = rng.integers(0, 11, size=(3, 7)).astype(np.int64)
    check_layer(lambda nn: nn.Embedding(11, 5), idx, rng, integer_input=True)


def test_embedding_padding_idx(rng):
    idx = np.array([[0, 2, 2, 1], [2, 3, 0, 2]], np.int64)
    tm, sm = check_layer(lambda nn: nn.Embedding(4, 3, padding_idx=2), idx, rng, integer_input=True)
    assert np.all(to_np(sm.weight)[2] == 0)


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(rng, affine):
    check_layer(lambda nn: nn.LayerNorm(8, eps=1e-4, elementwise_affine=affine), rand(rng, 2, 3, 8, scale=3), rng)
    check_layer(lambda nn: nn.LayerNorm((3, 8)), rand(rng, 2, 3, 8), rng)


@pytest.mark.parametrize("name,kw", [("ReLU", {}), ("GELU", {}), ("GELU", {"approximate": "tanh"}), ("SiLU", {}),
                                     ("Tanh", {}), ("Sigmoid", {}), ("Softmax", {"dim": -1}),
                                     ("LogSoftmax", {"dim": 1}), ("LeakyReLU", {"negative_slope": 0.2}),
                                     ("Softplus", {}), ("ReLU6", {}), ("Identity", {}), ("Flatten", {}),
                                     ("Dropout", {"p": 0.0})])
def test_elementwise_layers(rng, name, kw):
    check_layer(lambda nn: getattr(nn, name)(**kw), rand(rng, 4, 3, 5, scale=3), rng)


def test_dropout_eval_is_identity_and_train_drops(rng):
    check_layer(lambda nn: nn.Dropout(0.5), rand(rng, 4, 5), rng, train=False)
    d = snn.Dropout(0.25)
    y = to_np(d(tessera.ones(200, 100)))
    kept = y != 0
    assert abs(kept.mean() - 0.75) < 0.02
    np.testing.assert_allclose(y[kept], 1 / 0.75, rtol=1e-6)


def test_sequential(rng):
    def make(nn):
        return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    tm, sm = check_layer(make, rand(rng, 4, 5), rng)
    assert len(sm) == 3 and isinstance(sm[1], snn.ReLU) and len(sm[1:]) == 2
    assert [k for k, _ in sm.named_parameters()] == [k for k, _ in tm.named_parameters()]


@pytest.mark.parametrize("kw", [{}, {"padding": 1}, {"stride": 2, "padding": 1}, {"groups": 2, "bias": False},
                                {"dilation": 2}, {"padding": "same"}])
def test_conv2d(rng, kw):
    check_layer(lambda nn: nn.Conv2d(4, 6, 3, **kw), rand(rng, 2, 4, 9, 8), rng)


def test_conv1d(rng):
    check_layer(lambda nn: nn.Conv1d(3, 4, 3, stride=2, padding=1), rand(rng, 2, 3, 11), rng)


@pytest.mark.parametrize("train", [True, False])
def test_batch_norm2d(rng, train):
    tm, sm = check_layer(lambda nn: nn.BatchNorm2d(3, momentum=0.2), rand(rng, 4, 3, 5, 5, scale=2) + 1, rng,
                         train=train)
    assert int(sm.num_batches_tracked.item()) == int(tm.num_batches_tracked.item())


def test_batch_norm1d(rng):
    check_layer(lambda nn: nn.BatchNorm1d(6), rand(rng, 8, 6), rng)


@pytest.mark.parametrize("kw", [{"kernel_size": 2}, {"kernel_size": 3, "stride": 2, "padding": 1}])
def test_max_pool2d(rng, kw):
    check_layer(lambda nn: nn.MaxPool2d(**kw), rand(rng, 2, 3, 8, 8), rng)


def test_avg_pools(rng):
    check_layer(lambda nn: nn.AvgPool2d(2), rand(rng, 2, 3, 8, 8), rng)
    check_layer(lambda nn: nn.AdaptiveAvgPool2d((1, 1)), rand(rng, 2, 3, 8, 8), rng)


@pytest.mark.parametrize("kw", [{}, {"reduction": "sum"}, {"reduction": "none"}, {"ignore_index": 1},
                                {"label_smoothing": 0.1}])
def test_cross_entropy_loss(rng, kw):
    y = rng.integers(0, 5, size=(6,)).astype(np.int64)
    check_layer(lambda nn: nn.CrossEntropyLoss(**kw), rand(rng, 6, 5), rng,
                extra=((torch.tensor(y),), (tessera.tensor(y),)))


def test_cross_entropy_loss_classes_on_dim1(rng):
    y = rng.integers(0, 5, size=(2, 3)).astype(np.int64)
    check_layer(lambda nn: nn.CrossEntropyLoss(), rand(rng, 2, 5, 3), rng,
                extra=((torch.tensor(y),), (tessera.tensor(y),)))


def test_nll_loss(rng):
    y = rng.integers(0, 5, size=(6,)).astype(np.int64)
    check_layer(lambda nn: nn.NLLLoss(), rand(rng, 6, 5), rng, extra=((torch.tensor(y),), (tessera.tensor(y),)))


@pytest.mark.parametrize("cls", ["MSELoss", "L1Loss"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses(rng, cls, reduction):
    t = rand(rng, 4, 3)
    check_layer(lambda nn: getattr(nn, cls)(reduction=reduction), rand(rng, 4, 3), rng,
                extra=((torch.tensor(t),), (tessera.tensor(t),)))


def test_unsupported_arguments_fail_loudly():
    with pytest.raises(TypeError, match="ceil_mode"):
        snn.MaxPool2d(2, ceil_mode=True)
    with pytest.raises(TypeError, match="weight"):
        snn.CrossEntropyLoss(weight=tessera.ones(3))
    with pytest.raises(TypeError, match="padding_mode"):
        snn.Conv2d(1, 1, 3, padding_mode="reflect")
    with pytest.raises(AttributeError, match="tessera.nn.TransformerDecoder is not supported"):
        snn.TransformerDecoder
    with pytest.raises(AttributeError, match="not supported"):
        snn.functional.unfold


def test_elu_groupnorm_unflatten_convtranspose(rng):
    check_layer(lambda nn: nn.ELU(alpha=0.7), rand(rng, 3, 4), rng)
    check_layer(lambda nn: nn.GroupNorm(2, 6), rand(rng, 3, 6, 4, 4, scale=2), rng)
    check_layer(lambda nn: nn.GroupNorm(3, 6, affine=False), rand(rng, 2, 6, 5), rng)
    check_layer(lambda nn: nn.Unflatten(1, (2, 6)), rand(rng, 3, 12), rng)
    check_layer(lambda nn: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1), rand(rng, 2, 4, 5, 5),
                rng)
    check_layer(lambda nn: nn.ConvTranspose2d(4, 6, 2, groups=2, bias=False), rand(rng, 2, 4, 3, 3), rng)
    check_layer(lambda nn: nn.Dropout2d(0.3), rand(rng, 2, 3, 4, 4), rng, train=False)


def check_mha(make, L, S, N, E, rng, batch_first=False, **call):
    tm, sm = make(tnn), make(snn)
    copy_state(tm, sm)
    shape = (lambda T: (N, T, E)) if batch_first else (lambda T: (T, N, E))
    arrays = [rand(rng, *shape(L)), rand(rng, *shape(S)), rand(rng, *shape(S))]
    tq, sq = zip(*[pair(a, requires_grad=True) for a in arrays])
    tcall = {k: (torch.tensor(v) if isinstance(v, np.ndarray) else v) for k, v in call.items()}
    scall = {k: (tessera.tensor(v) if isinstance(v, np.ndarray) else v) for k, v in call.items()}
    (ty, tw), (sy, sw) = tm(*tq, **tcall), sm(*sq, **scall)
    close(sy, ty, what="output")
    if tw is not None:
        close(sw, tw, what="weights")
    w = rand(rng, *ty.shape)
    (ty * torch.tensor(w)).sum().backward()
    (sy * tessera.tensor(w)).sum().backward()
    for i in range(3):
        close(sq[i].grad, tq[i].grad, what=f"grad of input {i}")
    sparams = dict(sm.named_parameters())
    for name, p in tm.named_parameters():
        close(sparams[name].grad, p.grad, what=f"grad of {name}")


@pytest.mark.parametrize("case", ["plain", "bool_mask", "float_mask", "padding", "batch_first", "no_bias"])
def test_multihead_attention(rng, case):
    L, S, N, E = 4, 5, 2, 8
    call = {}
    if case == "bool_mask":
        m = rng.random((L, S)) > 0.7
        m[:, 0] = False
        call["attn_mask"] = m
    elif case == "float_mask":
        call["attn_mask"] = rand(rng, L, S)
    elif case == "padding":
        call["key_padding_mask"] = np.array([[False, False, True, False, True], [False] * 5])
        call["average_attn_weights"] = False
    check_mha(lambda nn: nn.MultiheadAttention(E, 2, bias=case != "no_bias", batch_first=case == "batch_first"),
              L, S, N, E, rng, batch_first=case == "batch_first", **call)


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder(rng, norm_first):
    def make(nn):
        layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=norm_first)
        return nn.TransformerEncoder(layer, 2)
    tm, sm = make(tnn), make(snn)
    assert list(sm.state_dict()) == list(tm.state_dict())
    mask = np.triu(np.ones((5, 5), bool), 1)
    check_layer(make, rand(rng, 3, 5, 8), rng, extra=((torch.tensor(mask),), (tessera.tensor(mask),)))


def check_rnn(make, x_np, rng, with_state=False):
    tm, sm = make(tnn), make(snn)
    assert list(sm.state_dict()) == list(tm.state_dict())
    copy_state(tm, sm)
    tx, sx = pair(x_np, requires_grad=True)
    targs, sargs = (), ()
    if with_state:
        L = tm.num_layers * (2 if tm.bidirectional else 1)
        shape = (L, x_np.shape[0 if tm.batch_first else 1], tm.hidden_size) if x_np.ndim == 3 else (L, tm.hidden_size)
        states = [rand(rng, *shape) for _ in range(2 if isinstance(tm, tnn.LSTM) else 1)]
        tstates, sstates = zip(*[pair(s) for s in states])
        targs = (tuple(tstates),) if len(states) == 2 else (tstates[0],)
        sargs = (tuple(sstates),) if len(states) == 2 else (sstates[0],)
    ty, th = tm(tx, *targs)
    sy, sh = sm(sx, *sargs)
    close(sy, ty, what="output")
    th, sh = (th if isinstance(th, tuple) else (th,)), (sh if isinstance(sh, tuple) else (sh,))
    for a, b in zip(sh, th):
        close(a, b, what="final state")
    w = rand(rng, *ty.shape)
    loss_t = (ty * torch.tensor(w)).sum() + sum(t.sum() for t in th)
    loss_s = (sy * tessera.tensor(w)).sum() + sum(t.sum() for t in sh)
    loss_t.backward()
    loss_s.backward()
    close(sx.grad, tx.grad, what="input grad")
    sparams = dict(sm.named_parameters())
    for name, p in tm.named_parameters():
        close(sparams[name].grad, p.grad, what=f"grad of {name}")


@pytest.mark.parametrize("cls", ["RNN", "LSTM", "GRU"])
@pytest.mark.parametrize("kw", [{}, {"num_layers": 2, "batch_first": True}, {"bidirectional": True, "bias": False}])
def test_recurrent_layers(rng, cls, kw):
    x = rand(rng, 5, 3, 4) if not kw.get("batch_first") else rand(rng, 3, 5, 4)
    check_rnn(lambda nn: getattr(nn, cls)(4, 6, **kw), x, rng)


@pytest.mark.parametrize("cls", ["LSTM", "GRU"])
def test_recurrent_layers_with_initial_state_and_unbatched(rng, cls):
    check_rnn(lambda nn: getattr(nn, cls)(4, 6, num_layers=2), rand(rng, 5, 3, 4), rng, with_state=True)
    check_rnn(lambda nn: getattr(nn, cls)(4, 6), rand(rng, 5, 4), rng, with_state=True)
    check_rnn(lambda nn: nn.RNN(4, 6, nonlinearity="relu"), rand(rng, 5, 3, 4), rng)


@pytest.mark.parametrize("name,kw", [("Hardtanh", {"min_val": -0.5, "max_val": 2.0}), ("Hardsigmoid", {}),
                                     ("Hardswish", {}), ("Mish", {}), ("Softsign", {}), ("LogSigmoid", {}),
                                     ("GLU", {"dim": 1}), ("PReLU", {}), ("PReLU", {"num_parameters": 4, "init": 0.1})])
def test_more_activations(rng, name, kw):
    check_layer(lambda nn: getattr(nn, name)(**kw), rand(rng, 3, 4, 6, scale=3), rng)


def test_pools_1d_and_upsample(rng):
    check_layer(lambda nn: nn.MaxPool1d(3, stride=2, padding=1), rand(rng, 2, 3, 11), rng)
    check_layer(lambda nn: nn.AvgPool1d(2), rand(rng, 2, 3, 10), rng)
    check_layer(lambda nn: nn.AdaptiveAvgPool1d(1), rand(rng, 2, 3, 10), rng)
    check_layer(lambda nn: nn.Upsample(scale_factor=2), rand(rng, 2, 3, 4, 5), rng)
    check_layer(lambda nn: nn.Upsample(size=(8, 15)), rand(rng, 2, 3, 4, 5), rng)
    with pytest.raises(TypeError, match="whole upsampling factors"):
        snn.functional.interpolate(tessera.ones(1, 1, 4, 4), scale_factor=1.5)
    with pytest.raises(TypeError, match="bilinear"):
        snn.Upsample(scale_factor=2, mode="bilinear")


@pytest.mark.parametrize("eps", [None, 1e-3])
def test_rms_norm_against_its_definition(rng, eps):
    # torch 1.13 has no RMSNorm: PyTorch 2.4's definition written in torch ops is the reference.
    a, w = rand(rng, 3, 5, 8, scale=2), rand(rng, 8)
    tx, sx = pair(a, requires_grad=True)
    tw, sw = pair(w, requires_grad=True)
    e = torch.finfo(torch.float32).eps if eps is None else eps
    ty = tx * torch.rsqrt(tx.pow(2).mean(-1, keepdim=True) + e) * tw
    m = snn.RMSNorm(8, eps=eps)
    m.load_state_dict({"weight": w})
    sy = m(sx)
    close(sy, ty, what="forward")
    g = rand(rng, 3, 5, 8)
    (ty * torch.tensor(g)).sum().backward()
    (sy * tessera.tensor(g)).sum().backward()
    close(sx.grad, tx.grad, what="input grad")
    close(m.weight.grad, tw.grad, what="weight grad")


def test_orthogonal_init():
    for shape in ((6, 4), (3, 8), (4, 2, 3)):
        w = snn.Parameter(tessera.empty(*shape))
        snn.init.orthogonal_(w, gain=2.0)
        q = w.detach().numpy().reshape(shape[0], -1)
        small = min(q.shape)
        gram = q @ q.T if q.shape[0] == small else q.T @ q
        np.testing.assert_allclose(gram, 4.0 * np.eye(small), atol=1e-5)
