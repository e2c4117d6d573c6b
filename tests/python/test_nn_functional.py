"""tessera.nn.functional against torch.nn.functional 1.13 (values and gradients, normalized
error <= 1e-5 in float32); scaled_dot_product_attention, which torch 1.13 lacks, against its
definition written in torch ops."""
import math

import numpy as np
import pytest

from nn_ref import close, pair, rand, tessera, torch

TF, SF = torch.nn.functional, tessera.nn.functional


def check(fn_t, fn_s, arrays, rng, grads=None):
    """fn_t(*torch tensors) vs fn_s(*tessera tensors): value and the gradients of the float inputs."""
    pairs = [pair(a, requires_grad=(a.dtype == np.float32) if grads is None else g) for a, g in
             zip(arrays, grads or [None] * len(arrays))]
    ty = fn_t(*[p[0] for p in pairs])
    sy = fn_s(*[p[1] for p in pairs])
    close(sy, ty, what="value")
    if not any(p[0].requires_grad for p in pairs):
        return
    w = rand(rng, *ty.shape)
    (ty * torch.tensor(w)).sum().backward()
    (sy * tessera.tensor(w)).sum().backward()
    for i, (tp, sp) in enumerate(pairs):
        if tp.requires_grad:
            close(sp.grad, tp.grad, what=f"grad of input {i}")


@pytest.fixture
def rng():
    return np.random.default_rng(1)


@pytest.mark.filterwarnings("ignore:nn.functional.(tanh|sigmoid) is deprecated")
@pytest.mark.parametrize("name,kw", [("relu", {}), ("gelu", {}), ("gelu", {"approximate": "tanh"}), ("silu", {}),
                                     ("softmax", {"dim": 1}), ("log_softmax", {"dim": -1}), ("tanh", {}),
                                     ("sigmoid", {}), ("softplus", {"beta": 2.0}), ("leaky_relu", {}),
                                     ("dropout", {"p": 0.3, "training": False}), ("normalize", {"dim": -1})])
def test_unary(rng, name, kw):
    check(lambda x: getattr(TF, name)(x, **kw), lambda x: getattr(SF, name)(x, **kw), [rand(rng, 3, 4, 5, scale=2)], rng)


def test_linear(rng):
    check(TF.linear, SF.linear, [rand(rng, 2, 3, 4), rand(rng, 5, 4), rand(rng, 5)], rng)
    check(TF.linear, SF.linear, [rand(rng, 3, 4), rand(rng, 5, 4)], rng)


def test_embedding(rng):
    idx = rng.integers(0, 6, size=(2, 5)).astype(np.int64)
    check(lambda i, w: TF.embedding(i, w), lambda i, w: SF.embedding(i, w), [idx, rand(rng, 6, 3)], rng)


def test_layer_norm(rng):
    check(lambda x, w, b: TF.layer_norm(x, (6,), w, b, 1e-5), lambda x, w, b: SF.layer_norm(x, (6,), w, b, 1e-5),
          [rand(rng, 4, 6, scale=3), rand(rng, 6), rand(rng, 6)], rng)
    check(lambda x: TF.layer_norm(x, [3, 6]), lambda x: SF.layer_norm(x, [3, 6]), [rand(rng, 2, 3, 6)], rng)


def test_conv2d_and_pools(rng):
    check(lambda x, w, b: TF.conv2d(x, w, b, stride=2, padding=1), lambda x, w, b: SF.conv2d(x, w, b, stride=2, padding=1),
          [rand(rng, 2, 3, 7, 7), rand(rng, 4, 3, 3, 3), rand(rng, 4)], rng)
    check(lambda x: TF.max_pool2d(x, 2), lambda x: SF.max_pool2d(x, 2), [rand(rng, 2, 3, 6, 6)], rng)
    check(lambda x: TF.avg_pool2d(x, 3, 1, 1), lambda x: SF.avg_pool2d(x, 3, 1, 1), [rand(rng, 2, 3, 6, 6)], rng)
    check(lambda x: TF.adaptive_avg_pool2d(x, 1), lambda x: SF.adaptive_avg_pool2d(x, 1), [rand(rng, 2, 3, 6, 6)], rng)


@pytest.mark.parametrize("pad", [(1, 2), (1, 0, 2, 1), (0, 1, 1, 0, 2, 0)])
def test_pad(rng, pad):
    check(lambda x: TF.pad(x, pad, value=0.5), lambda x: SF.pad(x, pad, value=0.5), [rand(rng, 2, 3, 4)], rng)


@pytest.mark.parametrize("kw", [{}, {"ignore_index": 2}, {"reduction": "sum"}, {"reduction": "none"},
                                {"ignore_index": -1, "label_smoothing": 0.2}])
def test_cross_entropy(rng, kw):
    y = rng.integers(0, 7, size=(9,)).astype(np.int64)
    y[3] = -1 if kw.get("ignore_index") == -1 else y[3]
    check(lambda x, t: TF.cross_entropy(x, t, **kw), lambda x, t: SF.cross_entropy(x, t, **kw), [rand(rng, 9, 7), y],
          rng)


def test_losses(rng):
    y = rng.integers(0, 7, size=(9,)).astype(np.int64)
    check(lambda x, t: TF.nll_loss(TF.log_softmax(x, -1), t), lambda x, t: SF.nll_loss(SF.log_softmax(x, -1), t),
          [rand(rng, 9, 7), y], rng)
    check(TF.mse_loss, SF.mse_loss, [rand(rng, 4, 5), rand(rng, 4, 5)], rng)
    check(lambda a, b: TF.mse_loss(a, b, reduction="sum"), lambda a, b: SF.mse_loss(a, b, reduction="sum"),
          [rand(rng, 4, 5), rand(rng, 4, 5)], rng)
    check(TF.l1_loss, SF.l1_loss, [rand(rng, 4, 5), rand(rng, 4, 5)], rng)


def test_one_hot():
    y = np.array([0, 3, 1], np.int64)
    check(lambda t: TF.one_hot(t, 5), lambda t: SF.one_hot(t, 5), [y], None)


def sdpa_reference(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """PyTorch 2's documented definition of scaled_dot_product_attention, in torch 1.13 ops."""
    L, S = q.size(-2), k.size(-2)
    scale = 1 / math.sqrt(q.size(-1)) if scale is None else scale
    bias = torch.zeros(L, S)
    if is_causal:
        bias = bias.masked_fill(torch.ones(L, S, dtype=torch.bool).tril().logical_not(), float("-inf"))
    if attn_mask is not None:
        bias = bias.masked_fill(attn_mask.logical_not(), float("-inf")) if attn_mask.dtype == torch.bool else bias + attn_mask
    return torch.softmax(q @ k.transpose(-2, -1) * scale + bias, dim=-1) @ v


@pytest.mark.parametrize("case", ["plain", "causal", "bool_mask", "float_mask", "scale", "cross"])
def test_scaled_dot_product_attention(rng, case):
    L, S = 5, (7 if case == "cross" else 5)
    arrays = [rand(rng, 2, 3, L, 4), rand(rng, 2, 3, S, 4), rand(rng, 2, 3, S, 4)]
    kw = {"causal": {"is_causal": True}, "scale": {"scale": 0.3}}.get(case, {})
    mask = None
    if case == "bool_mask":
        mask = rng.random((L, S)) > 0.3
        mask[:, 0] = True
    elif case == "float_mask":
        mask = rand(rng, L, S)
    if mask is not None:
        arrays.append(mask)
        check(lambda q, k, v, m: sdpa_reference(q, k, v, attn_mask=m, **kw),
              lambda q, k, v, m: SF.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw), arrays, rng,
              grads=[True, True, True, False])
    else:
        check(lambda q, k, v: sdpa_reference(q, k, v, **kw),
              lambda q, k, v: SF.scaled_dot_product_attention(q, k, v, **kw), arrays, rng)


def test_dropout_training_statistics():
    x = tessera.ones(100, 200)
    y = SF.dropout(x, 0.4).numpy()
    assert abs((y != 0).mean() - 0.6) < 0.02
    assert np.allclose(y[y != 0], 1 / 0.6)
    assert SF.dropout(x, 0.4, training=False) is x


def test_inplace_activations_take_the_value_and_the_gradient(rng):
    a = rand(rng, 3, 4)
    tx, sx = pair(a, requires_grad=True)
    th, sh = tx * 2, sx * 2
    assert TF.relu(th, inplace=True) is th and SF.relu(sh, inplace=True) is sh
    close(sh, th, what="value")
    th.sum().backward()
    sh.sum().backward()
    close(sx.grad, tx.grad, what="grad")
    with pytest.raises(Exception, match="in place"):
        SF.relu(sx, inplace=True)  # a leaf that requires grad


def test_unsupported_fail_loudly():
    x = tessera.ones(2, 3)
    with pytest.raises(TypeError, match="mode='reflect'"):
        SF.pad(x, (1, 1), mode="reflect")
    with pytest.raises(AttributeError, match="tessera.nn.functional.unfold is not supported"):
        SF.unfold


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_and_robust_losses(rng, reduction):
    x, y = rand(rng, 4, 5, scale=3), (rng.random((4, 5)) > 0.5).astype(np.float32)
    p = 1 / (1 + np.exp(-x))
    w, pw = np.abs(rand(rng, 5)) + 0.1, np.abs(rand(rng, 5)) + 0.5
    kw = {"reduction": reduction}
    check(lambda a, b: TF.binary_cross_entropy(a, b, **kw), lambda a, b: SF.binary_cross_entropy(a, b, **kw),
          [p.astype(np.float32), y], rng, grads=[True, False])
    check(lambda a, b, c: TF.binary_cross_entropy(a, b, weight=c, **kw),
          lambda a, b, c: SF.binary_cross_entropy(a, b, weight=c, **kw), [p.astype(np.float32), y, w], rng,
          grads=[True, False, False])
    for extra in ({}, {"weight": w}, {"pos_weight": pw}):
        check(lambda a, b: TF.binary_cross_entropy_with_logits(a, b, **{k: torch.tensor(v) for k, v in extra.items()},
                                                               **kw),
              lambda a, b: SF.binary_cross_entropy_with_logits(a, b, **{k: tessera.tensor(v) for k, v in extra.items()},
                                                               **kw), [x, y], rng, grads=[True, False])
    t = rand(rng, 4, 5, scale=3)
    for beta in (1.0, 0.5):
        check(lambda a, b: TF.smooth_l1_loss(a, b, beta=beta, **kw), lambda a, b: SF.smooth_l1_loss(a, b, beta=beta, **kw),
              [x, t], rng)
    check(lambda a, b: TF.huber_loss(a, b, delta=2.0, **kw), lambda a, b: SF.huber_loss(a, b, delta=2.0, **kw), [x, t],
          rng)


def test_loss_modules_and_clip_grad_value(rng):
    x, y = rand(rng, 3, 4), (rng.random((3, 4)) > 0.5).astype(np.float32)
    pw = np.abs(rand(rng, 4)) + 0.5
    tl = torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor(pw))
    sl = tessera.nn.BCEWithLogitsLoss(pos_weight=tessera.tensor(pw))
    close(sl(tessera.tensor(x), tessera.tensor(y)), tl(torch.tensor(x), torch.tensor(y)), what="BCEWithLogitsLoss")
    close(tessera.nn.SmoothL1Loss(beta=0.3)(tessera.tensor(x), tessera.tensor(y)),
          torch.nn.SmoothL1Loss(beta=0.3)(torch.tensor(x), torch.tensor(y)), what="SmoothL1Loss")
    tx, sx = pair(x, requires_grad=True)
    (tx * 5).sum().backward()
    (sx * 5).sum().backward()
    torch.nn.utils.clip_grad_value_([tx], 2.0)
    tessera.nn.utils.clip_grad_value_([sx], 2.0)
    close(sx.grad, tx.grad, what="clip_grad_value_")
