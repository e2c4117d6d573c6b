"""Training-step time of the benchmark GPT under jax.jit on the CPU: the peer of bench/gpt_step.cpp
and bench/gpt_step_torch.py, written in plain jax (jax.numpy, jax.random; no flax, no optax).

Same model as Tessera's nn::GPT (vocab 114, block 64, embd 128, 4 heads, 4 layers, batch 16,
pre-norm blocks, qkv Linear(embd, 3*embd), exact erf GELU MLP 4x, final LayerNorm, untied head
without bias, no dropout), initialised as Tessera does (Linear weights and biases U(+-1/sqrt(in)),
embeddings N(0, 1), LayerNorm ones and zeros), AdamW as Tessera's (lr 3e-3, betas 0.9/0.999,
eps 1e-8, decoupled weight decay 0.1 on every parameter, PyTorch's formulation), the same
splitmix64 token batches. One jitted step = forward + cross entropy + gradient + AdamW update,
parameters and moments donated; each step ends with float(loss).

    build/pyenv/bin/python bench/gpt_step_jax.py THREADS [--steps N] [--warmup N]

THREADS: the process pins itself to the first THREADS cores (os.sched_setaffinity before jax is
imported): XLA's CPU thread pools are sized by the affinity mask. XLA_FLAGS does not do it in jax
0.10.2: with "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" a jitted
1500x1500 matmul still used 1.96 CPU-seconds per second on a 2-core machine (1.00 pinned to one
core); the second word is no XLA flag (ignored without dashes, "Unknown flag" abort with them).

The last line is machine-readable: RESULT jax threads=... median_ms=... compile_ms=... last_loss=...
(compile_ms: the first call, i.e. tracing, lowering, XLA's compile and one step).
"""
import argparse
import math
import os
import time

from gpt_data import BATCH, BLOCK, EMBD, HEADS, LAYERS, NBATCHES, VOCAB, make_batches, max_rss_mib, step_stats

LR, BETA1, BETA2, EPS, WEIGHT_DECAY = 3e-3, 0.9, 0.999, 1e-8, 0.1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("threads", type=int)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    if a.threads < 1 or a.steps < 1 or a.warmup < 0:
        raise SystemExit("THREADS and --steps must be positive, --warmup not negative")
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cores[:a.threads])  # before jax starts its thread pools

    import jax
    import jax.numpy as jnp
    import numpy as np

    rss_base = max_rss_mib()

    def init(key):
        keys = iter(jax.random.split(key, 64))
        p = {"wte": jax.random.normal(next(keys), (VOCAB, EMBD)), "wpe": jax.random.normal(next(keys), (BLOCK, EMBD))}

        def linear(name, fan_in, fan_out, bias=True):
            b = 1 / math.sqrt(fan_in)
            p[name + ".w"] = jax.random.uniform(next(keys), (fan_in, fan_out), minval=-b, maxval=b)
            if bias:
                p[name + ".b"] = jax.random.uniform(next(keys), (fan_out,), minval=-b, maxval=b)

        def norm(name):
            p[name + ".g"], p[name + ".b"] = jnp.ones(EMBD), jnp.zeros(EMBD)

        for i in range(LAYERS):
            norm(f"h{i}.ln1")
            linear(f"h{i}.qkv", EMBD, 3 * EMBD)
            linear(f"h{i}.attn_proj", EMBD, EMBD)
            norm(f"h{i}.ln2")
            linear(f"h{i}.fc", EMBD, 4 * EMBD)
            linear(f"h{i}.mlp_proj", 4 * EMBD, EMBD)
        norm("ln_f")
        linear("head", EMBD, VOCAB, bias=False)
        return p

    def layer_norm(p, name, x):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + 1e-5) * p[name + ".g"] + p[name + ".b"]

    def linear(p, name, x):
        return x @ p[name + ".w"] + p[name + ".b"]

    causal = jnp.tril(jnp.ones((BLOCK, BLOCK), dtype=bool))

    def attention(p, i, x):
        B, T, C = x.shape
        D = C // HEADS
        q, k, v = jnp.split(linear(p, f"h{i}.qkv", x), 3, axis=-1)
        q, k, v = (t.reshape(B, T, HEADS, D).transpose(0, 2, 1, 3) for t in (q, k, v))
        att = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(D))
        att = jax.nn.softmax(jnp.where(causal[:T, :T], att, -jnp.inf), axis=-1)
        return linear(p, f"h{i}.attn_proj", (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C))

    def loss_fn(p, idx, targets):
        x = p["wte"][idx] + p["wpe"][: idx.shape[1]]
        for i in range(LAYERS):
            x = x + attention(p, i, layer_norm(p, f"h{i}.ln1", x))
            h = jax.nn.gelu(linear(p, f"h{i}.fc", layer_norm(p, f"h{i}.ln2", x)), approximate=False)
            x = x + linear(p, f"h{i}.mlp_proj", h)
        logits = layer_norm(p, "ln_f", x) @ p["head.w"]
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()

    def train_step(p, opt, idx, targets):
        loss, g = jax.value_and_grad(loss_fn)(p, idx, targets)
        t = opt["t"] + 1
        tf = t.astype(jnp.float32)
        step_size = LR / (1 - BETA1**tf)
        inv_sqrt_bc2 = 1 / jnp.sqrt(1 - BETA2**tf)
        m = jax.tree.map(lambda m, g: BETA1 * m + (1 - BETA1) * g, opt["m"], g)
        v = jax.tree.map(lambda v, g: BETA2 * v + (1 - BETA2) * g * g, opt["v"], g)
        p = jax.tree.map(lambda p, m, v: p * (1 - LR * WEIGHT_DECAY) - m / (jnp.sqrt(v) * inv_sqrt_bc2 + EPS) * step_size,
                         p, m, v)
        return p, {"t": t, "m": m, "v": v}, loss

    step_fn = jax.jit(train_step, donate_argnums=(0, 1))
    params = init(jax.random.key(0))
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)  # noqa: E731
    opt = {"t": jnp.zeros((), jnp.int32), "m": zeros(), "v": zeros()}
    batches = [(np.array(x, np.int32), np.array(y, np.int32)) for x, y in make_batches()]

    times, first, last, compile_ms = [], None, None, None
    for step in range(a.warmup + a.steps):
        hx, hy = batches[step % NBATCHES]
        t0 = time.perf_counter()
        params, opt, loss = step_fn(params, opt, jnp.asarray(hx), jnp.asarray(hy))
        l = float(loss)
        dt = (time.perf_counter() - t0) * 1000
        if not math.isfinite(l):
            raise SystemExit(f"loss became {l} at step {step}")
        if step == 0:
            first, compile_ms = l, dt
        last = l
        if step >= a.warmup:
            times.append(dt)

    rss = max_rss_mib()
    med, p10, p90 = step_stats(times)
    nparams = sum(x.size for x in jax.tree.leaves(params))
    print(f"jax {jax.__version__} jit GPT step on {jax.devices()[0]} (vocab {VOCAB}, block {BLOCK}, embd {EMBD}, "
          f"{HEADS} heads, {LAYERS} layers, batch {BATCH}, AdamW), pinned to cores {cores[:a.threads]}")
    print(f"  parameters {nparams}, {a.warmup} warm-up + {a.steps} timed steps")
    print(f"  step ms: median {med:.2f}  p10 {p10:.2f}  p90 {p90:.2f}  min {min(times):.2f}")
    print(f"  first call (tracing, lowering, XLA compile, one step) {compile_ms:.0f} ms")
    print(f"  loss: first {first:.4f}  last {last:.4f}")
    print(f"  process max RSS {rss:.1f} MiB ({rss_base:.1f} MiB after importing jax)")
    print(f"RESULT jax threads={a.threads} median_ms={med:.3f} p10={p10:.3f} p90={p90:.3f} maxrss_mb={rss:.1f} "
          f"first_loss={first:.4f} last_loss={last:.4f} compile_ms={compile_ms:.1f}")


if __name__ == "__main__":
    main()
