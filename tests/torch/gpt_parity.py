#!/usr/bin/env python3
"""The PyTorch side of tests/unit/test_gpt.cpp (GptTorch.SameLossAndGradientsAsPyTorch).

Usage: /usr/bin/python3 tests/torch/gpt_parity.py DIR

DIR/cases.txt names one case per line. For each NAME the test wrote
    NAME.model.safetensors   the GPT's state_dict, with the configuration in __metadata__
                             (vocab, block, embd, heads, layers, bias, tied_head)
    NAME.batch.safetensors   "idx" and "targets", int64 [B, T]
This script builds the same GPT as src/nn/gpt.cpp in PyTorch (float64), loads the weights,
computes the mean next-token cross entropy and the gradients of every parameter, and writes
    NAME.result.json         {"loss": float, "dtype": "float32",
                              "grads": {param: {"file": NAME.grad.<param>.f32, "shape": [...]}}}
    NAME.grad.<param>.f32    raw little-endian float32, row-major
Exit status 77: torch cannot be imported (the test skips outside CI).

The model (read src/nn/gpt.cpp): x = wte[idx] + wpe[0..T); per block (pre-norm)
x = x + attn(ln1(x)); x = x + mlp(ln2(x)); logits = head(ln_f(x)) (no bias; or x @ wte^T when
tied). attn: qkv = Linear(E, 3E) split q | k | v, heads by reshape [B, T, H, D] -> [B, H, T, D],
causal softmax(q k^T / sqrt(D)), back to [B, T, E], proj = Linear(E, E). mlp: fc = Linear(E, 4E),
exact (erf) GELU, proj = Linear(4E, E). LayerNorm eps 1e-5. No dropout.
"""
import json
import math
import os
import struct
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001
    print("cannot import torch: %s" % e, file=sys.stderr)
    sys.exit(77)

torch.set_num_threads(1)
DTYPE = torch.float64

# safetensors dtype -> (struct code, element size, torch dtype)
ST_DTYPES = {
    "F32": ("f", 4, torch.float32),
    "F64": ("d", 8, torch.float64),
    "I64": ("q", 8, torch.int64),
    "I32": ("i", 4, torch.int32),
}


def load_safetensors(path):
    """Parses the format by hand (the safetensors package is not assumed)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError("%s: truncated" % path)
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    body = data[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, e in header.items():
        code, size, tdt = ST_DTYPES[e["dtype"]]
        begin, end = e["data_offsets"]
        shape = list(e["shape"])
        count = 1
        for d in shape:
            count *= d
        if end - begin != count * size:
            raise ValueError("%s: %s has %d bytes for shape %s" % (path, name, end - begin, shape))
        vals = struct.unpack("<%d%s" % (count, code), body[begin:end])
        out[name] = torch.tensor(vals, dtype=tdt).reshape(shape)
    return out, meta


class CausalSelfAttention(nn.Module):
    def __init__(self, embd, heads, bias):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(embd, 3 * embd, bias=bias)
        self.proj = nn.Linear(embd, embd, bias=bias)

    def forward(self, x):
        B, T, C = x.shape
        H = self.heads
        D = C // H
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.reshape(B, T, H, D).transpose(1, 2)
        k = k.reshape(B, T, H, D).transpose(1, 2)
        v = v.reshape(B, T, H, D).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)  # key after query
        att = att.masked_fill(mask, float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, embd, bias):
        super().__init__()
        self.fc = nn.Linear(embd, 4 * embd, bias=bias)
        self.proj = nn.Linear(4 * embd, embd, bias=bias)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))  # exact erf GELU


class Block(nn.Module):
    def __init__(self, embd, heads, bias):
        super().__init__()
        self.ln1 = nn.LayerNorm(embd, eps=1e-5)
        self.attn = CausalSelfAttention(embd, heads, bias)
        self.ln2 = nn.LayerNorm(embd, eps=1e-5)
        self.mlp = MLP(embd, bias)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, block, embd, heads, layers, bias, tied_head):
        super().__init__()
        self.vocab = vocab
        self.wte = nn.Embedding(vocab, embd)
        self.wpe = nn.Embedding(block, embd)
        self.blocks = nn.ModuleList([Block(embd, heads, bias) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(embd, eps=1e-5)
        self.tied = tied_head
        if not tied_head:
            self.head = nn.Linear(embd, vocab, bias=False)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x)
        h = self.ln_f(x)
        return h @ self.wte.weight.t() if self.tied else self.head(h)

    def loss(self, idx, targets):
        logits = self(idx)
        return F.cross_entropy(logits.reshape(-1, self.vocab), targets.reshape(-1))


def run_case(d, name):
    weights, meta = load_safetensors(os.path.join(d, name + ".model.safetensors"))
    batch, _ = load_safetensors(os.path.join(d, name + ".batch.safetensors"))
    cfg = {k: int(meta[k]) for k in ("vocab", "block", "embd", "heads", "layers", "bias", "tied_head")}
    model = GPT(cfg["vocab"], cfg["block"], cfg["embd"], cfg["heads"], cfg["layers"], bool(cfg["bias"]),
                bool(cfg["tied_head"])).to(DTYPE)
    model.load_state_dict({k: v.to(DTYPE) for k, v in weights.items()}, strict=True)
    loss = model.loss(batch["idx"].long(), batch["targets"].long())
    loss.backward()
    grads = {}
    for pname, p in model.named_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        fname = "%s.grad.%s.f32" % (name, pname)
        flat = g.detach().to(torch.float32).contiguous().reshape(-1).tolist()
        with open(os.path.join(d, fname), "wb") as f:
            f.write(struct.pack("<%df" % len(flat), *flat))
        grads[pname] = {"file": fname, "shape": list(p.shape)}
    with open(os.path.join(d, name + ".result.json"), "w") as f:
        json.dump({"loss": loss.item(), "dtype": "float32", "grads": grads}, f)
    print("%s: loss %.6f, %d gradients" % (name, loss.item(), len(grads)))


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    d = sys.argv[1]
    with open(os.path.join(d, "cases.txt")) as f:
        names = [line.strip() for line in f if line.strip()]
    for name in names:
        run_case(d, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
