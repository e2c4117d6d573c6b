#!/usr/bin/python3
"""Training-step time of the benchmark GPT in PyTorch on the CPU: the peer of bench/gpt_step.cpp.

Same model as Tessera's nn::GPT (vocab 114, block 64, embd 128, 4 heads, 4 layers, batch 16,
pre-norm blocks, qkv Linear(embd, 3*embd), exact erf GELU MLP 4x, final LayerNorm, untied head
without bias, no dropout), AdamW (lr 3e-3, weight decay 0.1 on every parameter, as Tessera's),
the same splitmix64 token batches. Step = forward + cross entropy + backward + AdamW step,
ending with loss.item().

    /usr/bin/python3 bench/gpt_step_torch.py THREADS [--steps N] [--warmup N] [--batch N] [--checkpoint]

--checkpoint wraps every block in torch.utils.checkpoint (activations recomputed in the backward
pass), the peer of Tessera's memory budget (bench/memory_budget.sh).

The last line is machine-readable: RESULT torch threads=... median_ms=... maxrss_mb=...
"""
import argparse
import importlib
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt_data import BATCH, BLOCK, EMBD, HEADS, LAYERS, NBATCHES, VOCAB, make_batches, max_rss_mib, step_stats


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(EMBD, 3 * EMBD)
        self.proj = nn.Linear(EMBD, EMBD)
        self.register_buffer("mask", torch.ones(BLOCK, BLOCK).triu(1).bool(), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(EMBD, dim=2)
        q = q.view(B, T, HEADS, C // HEADS).transpose(1, 2)
        k = k.view(B, T, HEADS, C // HEADS).transpose(1, 2)
        v = v.view(B, T, HEADS, C // HEADS).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // HEADS))
        att = att.masked_fill(self.mask[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(EMBD)
        self.attn = Attention()
        self.ln2 = nn.LayerNorm(EMBD)
        self.fc = nn.Linear(EMBD, 4 * EMBD)
        self.proj = nn.Linear(4 * EMBD, EMBD)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))  # exact (erf) GELU


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, EMBD)
        self.wpe = nn.Embedding(BLOCK, EMBD)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(EMBD)
        self.head = nn.Linear(EMBD, VOCAB, bias=False)

    checkpoint = False  # every block under torch.utils.checkpoint

    def loss(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False) if self.checkpoint else b(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("threads", type=int)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=BATCH)
    ap.add_argument("--checkpoint", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    rss_base = max_rss_mib()
    model = GPT()
    model.checkpoint = a.checkpoint
    if a.checkpoint:  # imported only then: the same file runs on Tessera (gpt_step_tessera.py), which lacks it
        importlib.import_module("torch.utils.checkpoint")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    batches = make_batches(a.batch)

    times, first, last = [], None, None
    for step in range(a.warmup + a.steps):
        hx, hy = batches[step % NBATCHES]
        t0 = time.perf_counter()
        x = torch.tensor(hx, dtype=torch.int64)
        y = torch.tensor(hy, dtype=torch.int64)
        loss = model.loss(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        l = loss.item()
        dt = (time.perf_counter() - t0) * 1000
        if not math.isfinite(l):
            raise SystemExit(f"loss became {l} at step {step}")
        first = l if first is None else first
        last = l
        if step >= a.warmup:
            times.append(dt)

    rss = max_rss_mib()
    med, p10, p90 = step_stats(times)
    nparams = sum(p.numel() for p in model.parameters())
    print(f"torch {torch.__version__} GPT step (vocab {VOCAB}, block {BLOCK}, embd {EMBD}, {HEADS} heads, "
          f"{LAYERS} layers, batch {a.batch}, AdamW{', checkpointed blocks' if a.checkpoint else ''}), "
          f"torch.set_num_threads({a.threads})")
    print(f"  parameters {nparams}, {a.warmup} warm-up + {a.steps} timed steps")
    print(f"  step ms: median {med:.2f}  p10 {p10:.2f}  p90 {p90:.2f}  min {min(times):.2f}")
    print(f"  loss: first {first:.4f}  last {last:.4f}")
    print(f"  process max RSS {rss:.1f} MiB ({rss_base:.1f} MiB after importing torch)")
    print(f"RESULT torch threads={a.threads} median_ms={med:.3f} p10={p10:.3f} p90={p90:.3f} "
          f"maxrss_mb={rss:.1f} base_rss_mb={rss_base:.1f} last_loss={last:.4f} checkpoint={int(a.checkpoint)}")


if __name__ == "__main__":
    main()
