#!/usr/bin/python3
"""Training-step time of the benchmark GPT in PyTorch on the CPU: the peer of bench/gpt_step.cpp.

Same model as Tessera's nn::GPT (vocab 114, block 64, embd 128, 4 heads, 4 layers, batch 16,
pre-norm blocks, qkv Linear(embd, 3*embd), exact erf GELU MLP 4x, final LayerNorm, untied head
without bias, no dropout), AdamW (lr 3e-3, weight decay 0.1 on every parameter, as Tessera's),
the same splitmix64 token batches. Step = forward + cross entropy + backward + AdamW step,
ending with loss.item().

    /usr/bin/python3 bench/gpt_step_torch.py THREADS [--steps N] [--warmup N] [--batch N] [--checkpoint]
                                             [--bf16] [--compile] [--fused-adamw]

--checkpoint wraps every block in torch.utils.checkpoint (activations recomputed in the backward
pass), the peer of Tessera's memory budget (bench/memory_budget.sh).
--bf16: the forward pass and loss under torch.autocast("cpu", dtype=torch.bfloat16) (the peer of
bench_gpt_step --dtype bfloat16; float32 parameters and AdamW state).
--compile: the loss function (forward + cross entropy; its backward through AOTAutograd) under
torch.compile (PyTorch 2.x; the optimizer stays eager). Its first steps compile: give --warmup.
--fused-adamw: AdamW(fused=True) (PyTorch 2.4+ on the CPU), one kernel over all parameters.
PyTorch 1.13 runs the plain options (no --compile or --fused-adamw: a one-line error).
Run with MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=134217728 for PyTorch at its best
(issue 28: glibc otherwise maps and unmaps each step's large activations); the RESULT line says
which allocator settings were in force.

The last line is machine-readable: RESULT torch threads=... median_ms=... maxrss_mb=...
"""
import argparse
import importlib
import math
import os
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
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--fused-adamw", action="store_true")
    a = ap.parse_args()
    if (a.compile or a.fused_adamw) and not hasattr(torch, "compile"):
        raise SystemExit(f"gpt_step_torch: --compile and --fused-adamw need PyTorch 2.x (this is {torch.__version__})")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    rss_base = max_rss_mib()
    model = GPT()
    model.checkpoint = a.checkpoint
    if a.checkpoint:  # imported only then: the same file runs on Tessera (gpt_step_tessera.py), which lacks it
        importlib.import_module("torch.utils.checkpoint")
    model.train()
    opt_args = {"fused": True} if a.fused_adamw else {}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, **opt_args)
    batches = make_batches(a.batch)
    loss_fn = torch.compile(model.loss) if a.compile else model.loss

    def forward(x, y):
        if a.bf16:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return loss_fn(x, y)
        return loss_fn(x, y)

    times, first, last = [], None, None
    for step in range(a.warmup + a.steps):
        hx, hy = batches[step % NBATCHES]
        t0 = time.perf_counter()
        x = torch.tensor(hx, dtype=torch.int64)
        y = torch.tensor(hy, dtype=torch.int64)
        loss = forward(x, y)
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
    mmap, trim = os.environ.get("MALLOC_MMAP_THRESHOLD_", "default"), os.environ.get("MALLOC_TRIM_THRESHOLD_", "default")
    mode = ("compile" if a.compile else "eager") + ("-bf16" if a.bf16 else "-fp32") + ("-fusedadamw" if a.fused_adamw else "")
    print(f"torch {torch.__version__} GPT step (vocab {VOCAB}, block {BLOCK}, embd {EMBD}, {HEADS} heads, "
          f"{LAYERS} layers, batch {a.batch}, AdamW{' (fused)' if a.fused_adamw else ''}"
          f"{', checkpointed blocks' if a.checkpoint else ''}), {mode}, "
          f"torch.set_num_threads({a.threads}), MALLOC_MMAP_THRESHOLD_={mmap} MALLOC_TRIM_THRESHOLD_={trim}")
    print(f"  parameters {nparams}, {a.warmup} warm-up + {a.steps} timed steps")
    print(f"  step ms: median {med:.2f}  p10 {p10:.2f}  p90 {p90:.2f}  min {min(times):.2f}")
    print(f"  loss: first {first:.4f}  last {last:.4f}")
    print(f"  process max RSS {rss:.1f} MiB ({rss_base:.1f} MiB after importing torch)")
    print(f"RESULT torch threads={a.threads} median_ms={med:.3f} p10={p10:.3f} p90={p90:.3f} "
          f"maxrss_mb={rss:.1f} base_rss_mb={rss_base:.1f} last_loss={last:.4f} checkpoint={int(a.checkpoint)} "
          f"version={torch.__version__} mode={mode} malloc_mmap={mmap} malloc_trim={trim}")


if __name__ == "__main__":
    main()
