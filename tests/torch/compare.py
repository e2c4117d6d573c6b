#!/usr/bin/env python3
"""Recomputes the expressions of tests/unit/test_torch.cpp in PyTorch (float64) and writes the
values and the input gradients of sum(out * w) back for the C++ side to compare.

Usage: /usr/bin/python3 tests/torch/compare.py DIR

DIR/manifest.txt, written by the test, has one block per expression:
    case NAME NINPUTS
    in KIND GRAD RANK D0 D1 ...     (KIND: f32 | f64 | i64 | bool; GRAD: 0 or 1), NINPUTS times
    out RANK D0 D1 ...              (the output shape; the weight w has this shape)
with NAME.in<I>.bin and NAME.w.bin holding float64 little-endian values. This script writes
NAME.out.bin and NAME.grad<I>.bin (float64) and DIR/results.txt with one line per case:
    ok NAME RANK D0 D1 ...    or    fail NAME MESSAGE
Exit status 77: torch cannot be imported (the test skips outside CI).
"""
import math
import os
import sys
import traceback

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001
    print("cannot import torch: %s" % e, file=sys.stderr)
    sys.exit(77)

torch.set_num_threads(1)


def causal_attention(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    t = s.shape[-1]
    mask = torch.tril(torch.ones(t, t, dtype=torch.float64)) == 0
    return torch.softmax(s.masked_fill(mask, float("-inf")), -1) @ v


def dynamic_update_slice(base, upd, off):
    out = base.clone()
    idx = []
    for d in range(base.dim()):
        o = int(off[d])
        o = max(0, min(o, base.shape[d] - upd.shape[d]))
        idx.append(slice(o, o + upd.shape[d]))
    out[tuple(idx)] = upd
    return out


def chunk_mix(x):
    p = torch.chunk(x, 3, 1)
    return p[0] * p[1] + torch.sin(p[2])


def split_mix(x):
    p = torch.split(x, 2, 1)  # [.,2] [.,2] [.,1]
    return torch.cat([p[0] * p[1], p[2] * p[2]], 1)


def transformer_block(x, g, b, w):
    h = F.layer_norm(x, (x.shape[-1],), g, b, 1e-5)
    s = h @ h.transpose(-2, -1) / math.sqrt(x.shape[-1])
    return x + torch.softmax(s, -1) @ (h @ w)


def manual_softmax(x):
    e = torch.exp(x - x.amax(1, keepdim=True))
    return e / e.sum(1, keepdim=True)


def batch_norm_train(x, w, b):
    rm = torch.zeros(3, dtype=torch.float64)
    rv = torch.ones(3, dtype=torch.float64)
    y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
    return torch.cat([y.reshape(-1), rm, rv])


def index_put_strided(x, v):
    y = x * 1
    y[1::2, :5:3] = v
    return y


EXPRS = {
    "softmax_affine": lambda x, w, b: torch.softmax(x @ w + b, -1),
    "gelu_x_sigmoid": lambda x, y: F.gelu(x) * torch.sigmoid(y),
    "gelu_tanh_silu": lambda x: F.gelu(x, approximate="tanh") + F.silu(x),
    "layer_norm_affine": lambda x, g, b: F.layer_norm(x, (8,), g, b, 1e-5),
    "layer_norm_2d": lambda x: F.layer_norm(x, (3, 4)),
    "cross_entropy": lambda x, t: F.cross_entropy(x, t),
    "logsumexp": lambda x: torch.logsumexp(x, 1),
    "var_std": lambda x: torch.var(x, 1, unbiased=True, keepdim=True) * torch.std(x, 0, unbiased=False, keepdim=True),
    "causal_attention": causal_attention,
    "embedding_mean": lambda w, i: F.embedding(i, w).mean(1),
    "log_softmax_dim0": lambda x: torch.log_softmax(x, 0),
    "softplus_beta": lambda x: F.softplus(x, beta=2, threshold=3),
    "relu_clamp": lambda x, y: torch.relu(x) + torch.clamp(y, -0.3, 0.4),
    "pow_sqrt": lambda x, y, z: torch.pow(x.abs() + 0.5, y) + torch.sqrt(z),
    "trig_erf": lambda x, y: torch.sin(x) * torch.cos(y) + torch.erf(x * y),
    "mlp": lambda x, w1, b1, w2, b2: F.gelu(x @ w1 + b1) @ w2 + b2,
    "matmul_broadcast": lambda a, b: a @ b,
    "gather_exp": lambda x, i: torch.gather(x.exp(), 1, i),
    "scatter_add": lambda base, i, src: torch.scatter_add(base * 2, 0, i, src.sin()),
    "index_select_repeat": lambda x, i: torch.index_select(x, 0, i).repeat(2, 1),
    "cat_stack": lambda a, b: (lambda c: torch.stack([c, c * c], 0))(torch.cat([a, b.exp()], 1)),
    "strided_slice": lambda x: x[0:7:2, 1:9:3] * 2,
    "pad_tanh": lambda x: F.pad(x.tanh(), (2, 1, 1, 0), value=0.5),
    "where_compare": lambda x, y: torch.where(x > y, x * y, x - y),
    "max_amin": lambda x, y: x.amax(1) + y.amin(1),
    "manual_softmax": manual_softmax,
    "batchnorm_like": lambda x: (x - x.mean(0, keepdim=True)) / torch.sqrt(torch.var(x, 0, unbiased=False, keepdim=True) + 1e-5),
    "tril_triu": lambda x, y: torch.triu(x, 1) + torch.tril(y, -1) * x,
    "chunk_mix": chunk_mix,
    "split_mix": split_mix,
    "permute_reshape": lambda x, y: x.permute(2, 0, 1).reshape(4, 6).transpose(0, 1) * y,
    "narrow_squeeze": lambda x, y: x.narrow(1, 1, 1).squeeze(1).unsqueeze(0).flatten() * y.squeeze(),
    "dynamic_update_slice": lambda base, upd, off: dynamic_update_slice(base * base, upd.exp(), off),
    "cross_entropy_linear": lambda x, w, t: F.cross_entropy(x @ w, t),
    "tanh_exp_log": lambda x, y, z: torch.tanh(x) * torch.exp(y) + torch.log(z),
    "reciprocal_rsqrt_square": lambda z, x: torch.reciprocal(z) + torch.rsqrt(z) + torch.square(x),
    "masked_logical": lambda x, y: torch.masked_fill(x * y, (x > 0) & (y < 0), 0.0) + x,
    "broadcast3": lambda x, y, z: x * y + z.expand(3, 4) * x,
    "normalize_rows": lambda x: x / x.sum(1, keepdim=True),
    "transformer_block": transformer_block,
    "scalar_stats": lambda x: torch.std(x) * torch.mean(x) + torch.var(x),
    "pow_scalar": lambda x, y: torch.pow(x, 2.5) + torch.pow(3.0, y),
    "argmax_gather": lambda x: torch.gather(x, 1, x.argmax(1, keepdim=True)),
    "minimum_maximum": lambda x, y, z: torch.maximum(x, y) * torch.minimum(x, z),
    "abs_sign_floor": lambda x, y: x.abs() * torch.sign(y) + torch.floor(x * 3) * y,
    "cast_roundtrip": lambda x, y: (x.double() * y.double()).float() * x,
    "logsumexp_keepdim_sub": lambda x: x - torch.logsumexp(x, (0, 2), keepdim=True),
    "conv2d_bias": lambda x, w, b: F.conv2d(x, w, b),
    "conv2d_stride_pad": lambda x, w: F.conv2d(x, w, stride=(2, 1), padding=(1, 2)),
    "conv2d_dilation_groups": lambda x, w, b: F.conv2d(x, w, b, padding=2, dilation=2, groups=2),
    "conv2d_depthwise_stride": lambda x, w: F.conv2d(x, w, stride=2, padding=1, groups=4),
    "conv1d_stride_dilation": lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1, dilation=2),
    "conv_transpose2d_stride": lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
    "conv_transpose2d_groups_dilation": lambda x, w: F.conv_transpose2d(x, w, stride=(1, 2), padding=(0, 1), groups=2,
                                                                        dilation=(2, 1)),
    "max_pool2d_2": lambda x: F.max_pool2d(x, 2),
    "max_pool2d_3s2p1": lambda x: F.max_pool2d(x, 3, 2, 1),
    "avg_pool2d_pad": lambda x: F.avg_pool2d(x, 3, 2, 1),
    "avg_pool2d_exclude_pad": lambda x: F.avg_pool2d(x, (2, 3), (1, 2), 1, count_include_pad=False),
    "adaptive_avg_pool2d": lambda x: F.adaptive_avg_pool2d(x, (3, 2)),
    "batch_norm2d_train": batch_norm_train,
    "batch_norm2d_eval": lambda x, w, b: F.batch_norm(x, torch.tensor([0.1, -0.2, 0.3], dtype=torch.float64),
                                                      torch.tensor([0.5, 1.5, 2.0], dtype=torch.float64), w, b,
                                                      training=False, eps=1e-5),
    "conv_bn_relu_pool": lambda x, w, g, b: F.max_pool2d(
        torch.relu(F.batch_norm(F.conv2d(x, w, padding=1), None, None, g, b, training=True)), 2),
    # The libtorch-shaped API (issue 20): indexing, index_put, max/min(dim), the losses' options.
    "index_slices": lambda x: torch.cat([x[1:, ::2, 3].reshape(-1), x[..., -1].reshape(-1), x[None, 0, -2:].reshape(-1)]),
    "index_tensor": lambda x, i: x[i, 1:] * 2,
    "index_put_strided": index_put_strided,
    "max_min_dim": lambda x: x.max(1).values * 2 + x.min(1).indices.double() + x.min(0, keepdim=True).values.sum(),
    "cross_entropy_smoothing_ignore": lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1),
    "cross_entropy_none_ignore": lambda x, t: F.cross_entropy(x, t, reduction="none", ignore_index=4),
    "cross_entropy_nd_sum": lambda x, t: F.cross_entropy(x, t, reduction="sum"),
    "nll_mse": lambda x, t, y: F.nll_loss(F.log_softmax(x, 1), t, reduction="sum") + F.mse_loss(x, y, reduction="sum"),
}


def read(path, shape):
    return np.fromfile(path, dtype="<f8").reshape(shape)


def main():
    d = sys.argv[1]
    lines = open(os.path.join(d, "manifest.txt")).read().split("\n")
    results = []
    i = 0
    while i < len(lines):
        parts = lines[i].split()
        i += 1
        if not parts or parts[0] != "case":
            continue
        name, nin = parts[1], int(parts[2])
        ins = []
        for k in range(nin):
            p = lines[i].split()
            i += 1
            kind, grad, rank = p[1], p[2] == "1", int(p[3])
            shape = tuple(int(s) for s in p[4:4 + rank])
            a = read(os.path.join(d, "%s.in%d.bin" % (name, k)), shape)
            if kind in ("f32", "f64"):
                t = torch.tensor(a, dtype=torch.float64, requires_grad=grad)
            elif kind == "i64":
                t = torch.tensor(a.astype(np.int64))
            else:
                t = torch.tensor(a != 0)
            ins.append(t)
        p = lines[i].split()
        i += 1
        oshape = tuple(int(s) for s in p[2:2 + int(p[1])])
        try:
            out = EXPRS[name](*ins)
            if tuple(out.shape) != oshape:
                raise ValueError("torch output shape %s, tessera %s" % (tuple(out.shape), oshape))
            w = torch.tensor(read(os.path.join(d, name + ".w.bin"), oshape), dtype=torch.float64)
            out64 = out.double()
            if any(t.requires_grad for t in ins):
                (out64 * w).sum().backward()
            out64.detach().numpy().astype("<f8").tofile(os.path.join(d, name + ".out.bin"))
            for k, t in enumerate(ins):
                if t.dtype != torch.float64:
                    continue
                g = t.grad if t.grad is not None else torch.zeros_like(t)
                g.detach().numpy().astype("<f8").tofile(os.path.join(d, "%s.grad%d.bin" % (name, k)))
            results.append("ok %s %d %s" % (name, len(oshape), " ".join(str(s) for s in oshape)))
        except Exception as e:  # noqa: BLE001
            msg = ("%s: %s" % (type(e).__name__, e)).replace("\n", " ")
            traceback.print_exc()
            results.append("fail %s %s" % (name, msg))
    with open(os.path.join(d, "results.txt"), "w") as f:
        f.write("\n".join(results) + "\n")


if __name__ == "__main__":
    main()
