#!/usr/bin/env python3
"""Training-step time of the benchmark GPT written in PyTorch (bench/gpt_step_torch.py's model,
unedited) running on Tessera from Python: torch, torch.nn and torch.nn.functional are pointed at
tessera's modules (examples/python/as_tessera.py) before that file is imported. The same loop as
gpt_step_torch.py (forward + cross entropy + backward + AdamW step + loss.item()), the same
batches; bench/python_vs_cpp.sh runs it beside the C++ API (bench_gpt_step) and PyTorch.

    build/pyvenv/bin/python bench/gpt_step_tessera.py [--steps N] [--warmup N]

The last line is machine-readable: RESULT tessera-py median_ms=... graphs=... (graphs compiled
during the timed steps: 0 when the step is traced and served from the compile cache).
"""
import argparse
import math
import os
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "examples", "python"))
sys.path.insert(0, here)
import as_tessera  # noqa: E402,F401  (the module swap)
import torch  # noqa: E402  (tessera)
import gpt_step_torch as g  # noqa: E402  (the PyTorch model file, now over tessera)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = g.GPT()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    batches = g.make_batches()
    times, traces, last, graphs0 = [], [], None, 0
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            graphs0 = torch.metrics().graphs_compiled
        hx, hy = batches[step % g.NBATCHES]
        t0 = time.perf_counter()
        x = torch.tensor(hx, dtype=torch.int64)
        y = torch.tensor(hy, dtype=torch.int64)
        loss = model.loss(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t1 = time.perf_counter()  # everything above only traced; item() runs the step's graph
        last = loss.item()
        if not math.isfinite(last):
            raise SystemExit(f"loss became {last} at step {step}")
        if step >= a.warmup:
            times.append((time.perf_counter() - t0) * 1000)
            traces.append((t1 - t0) * 1000)
    graphs = torch.metrics().graphs_compiled - graphs0
    med, p10, p90 = g.step_stats(times)
    print(f"tessera (Python, bench/gpt_step_torch.py's model) GPT step: {a.warmup} warm-up + {a.steps} timed steps")
    trace = g.step_stats(traces)[0]
    print(f"  step ms: median {med:.2f}  p10 {p10:.2f}  p90 {p90:.2f}  min {min(times):.2f}; last loss {last:.4f}")
    print(f"  Python tracing (model, loss, backward, AdamW, zero_grad): median {trace:.2f} ms of the step")
    print(f"RESULT tessera-py median_ms={med:.3f} p10={p10:.3f} p90={p90:.3f} trace_ms={trace:.3f} graphs={graphs} "
          f"maxrss_mb={g.max_rss_mib():.1f} last_loss={last:.4f}")


if __name__ == "__main__":
    main()
