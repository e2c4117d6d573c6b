#!/usr/bin/env python3
"""GPT-2-small training step in PyTorch on a GPU: the peer of `bench_gpt_step --preset gpt2-small`.

The same model as Tessera's nn::GPT with that preset (vocab 50257, block 1024, embd 768, 12 heads,
12 layers, pre-norm blocks, qkv Linear(embd, 3*embd), exact erf GELU MLP 4x, final LayerNorm,
head tied to the token embedding, no dropout; 124 M parameters), AdamW (lr 3e-3, weight decay 0.1
on every parameter, as Tessera's), the same splitmix64 token batches (batch 8). Step = forward +
cross entropy + backward + AdamW step, ending with loss.item(). Attention is written out
(masked softmax of q k^T), as Tessera computes it; --attention sdpa uses
F.scaled_dot_product_attention instead.

    python3 bench/gpt2_torch.py [--mode eager|compile ...] [--tf32 off|on ...] [--steps 20] [--warmup 5]

Runs every (mode, tf32) pair given, each on a fresh model, and prints for each a machine-readable
line: RESULT torch mode=... tf32=... median_ms=... tokens_per_s=... peak_mb=... last_loss=...
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, BLOCK, EMBD, HEADS, LAYERS, NBATCHES = 50257, 1024, 768, 12, 12, 4
MASK64 = (1 << 64) - 1


def make_batches(batch):
    """NBATCHES (inputs, targets) of [batch, BLOCK] ids, as bench/bench_common.h's make_batches."""
    s, out = 1234, []
    for _ in range(NBATCHES):
        x, y = [], []
        for _ in range(batch):
            row = []
            for _ in range(BLOCK + 1):
                s = (s + 0x9E3779B97F4A7C15) & MASK64
                z = s
                z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
                z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
                row.append((z ^ (z >> 31)) % VOCAB)
            x.append(row[:-1])
            y.append(row[1:])
        out.append((x, y))
    return out


class Attention(nn.Module):
    def __init__(self, sdpa):
        super().__init__()
        self.sdpa = sdpa
        self.qkv = nn.Linear(EMBD, 3 * EMBD)
        self.proj = nn.Linear(EMBD, EMBD)
        self.register_buffer("mask", torch.ones(BLOCK, BLOCK).triu(1).bool(), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in self.qkv(x).split(EMBD, dim=2))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // HEADS))
            y = att.masked_fill(self.mask[:T, :T], float("-inf")).softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, sdpa):
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(EMBD), Attention(sdpa), nn.LayerNorm(EMBD)
        self.fc, self.proj = nn.Linear(EMBD, 4 * EMBD), nn.Linear(4 * EMBD, EMBD)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))  # exact (erf) GELU


class GPT(nn.Module):
    def __init__(self, sdpa):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, EMBD), nn.Embedding(BLOCK, EMBD)
        self.blocks = nn.ModuleList(Block(sdpa) for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(EMBD)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def run(mode, tf32, a, batches, dev):
    torch.backends.cuda.matmul.allow_tf32 = tf32 == "on"
    torch.backends.cudnn.allow_tf32 = tf32 == "on"
    torch.manual_seed(0)
    model = GPT(a.attention == "sdpa").to(dev)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    fwd = torch.compile(model) if mode == "compile" else model
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times, last, t_first = [], None, None
    for step in range(a.warmup + a.steps):
        hx, hy = batches[step % NBATCHES]
        t0 = time.perf_counter()
        x = torch.tensor(hx, dtype=torch.int64).to(dev, non_blocking=True)
        y = torch.tensor(hy, dtype=torch.int64).to(dev, non_blocking=True)
        loss = fwd(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        last = loss.item()
        dt = (time.perf_counter() - t0) * 1000
        if not math.isfinite(last):
            raise SystemExit(f"loss became {last} at step {step} ({mode}, tf32 {tf32})")
        if step == 0:
            t_first = dt
        if step >= a.warmup:
            times.append(dt)
    med = statistics.median(times)
    peak = torch.cuda.max_memory_allocated() / 2**20
    tok = a.batch * BLOCK / (med / 1000)
    nparams = sum(p.numel() for p in model.parameters())
    print(f"torch {torch.__version__} {mode} tf32 {tf32}: {nparams / 1e6:.1f} M parameters, batch {a.batch}, "
          f"first step {t_first:.0f} ms, median {med:.2f} ms (min {min(times):.2f}), {tok:.0f} tokens/s, "
          f"peak {peak:.0f} MiB, last loss {last:.4f}", flush=True)
    print(f"RESULT torch mode={mode} tf32={tf32} attention={a.attention} median_ms={med:.3f} tokens_per_s={tok:.0f} "
          f"peak_mb={peak:.0f} last_loss={last:.4f}", flush=True)
    del model, opt, fwd
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", nargs="+", choices=["eager", "compile"], default=["eager", "compile"])
    ap.add_argument("--tf32", nargs="+", choices=["off", "on"], default=["off", "on"])
    ap.add_argument("--attention", choices=["math", "sdpa"], default="math")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpt2_torch: no CUDA device visible to torch")
    batches = make_batches(a.batch)
    for mode in a.mode:
        for tf32 in a.tf32:
            run(mode, tf32, a, batches, torch.device("cuda"))


if __name__ == "__main__":
    main()
