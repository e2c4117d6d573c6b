#!/usr/bin/env python3
"""Per-op cost of tracing from Python: how long one op call takes through tessera._C (nanobind),
next to the same call on the C++ side measured by the same loop through a no-op binding, and
to PyTorch 1.13 eager for reference. Ops only trace here (nothing is realized inside the loop),
so this is the Python layer plus tessera's own tracing.

    build/pyvenv/bin/python bench/python_op_overhead.py [--n 20000] [--repeat 7]

Prints one line per op: the median over repeats of the per-call time in microseconds.
"""
import argparse
import statistics
import sys
import time

import tessera


def per_call_us(fn, n, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(times)


def cases(m):
    x = m.randn(8, 16)
    y = m.randn(16)
    w = m.randn(16, 16)
    mask = m.ones(8, 16) > 0
    return [
        ("x + y (tensors)", lambda: x + y),
        ("x * 2.0 (scalar)", lambda: x * 2.0),
        ("x.relu()", lambda: x.relu()),
        ("x.exp()", lambda: x.exp()),
        ("x @ w", lambda: x @ w),
        ("x.sum(dim=1)", lambda: x.sum(dim=1)),
        ("x.softmax(-1)", lambda: x.softmax(-1)),
        ("x.view(4, 32)", lambda: x.view(4, 32)),
        ("x.transpose(0, 1)", lambda: x.transpose(0, 1)),
        ("x[:, -1]", lambda: x[:, -1]),
        ("x.masked_fill(mask, 0)", lambda: x.masked_fill(mask, 0.0)),
        ("x.shape", lambda: x.shape),
        ("chain: z = (z * 0.5).relu() (2 ops)", chain(m, x)),
    ]


def chain(m, x):
    """Each call extends one growing graph (no op is a repeat the IR's interning could serve);
    the graph is dropped and restarted every 500 calls."""
    state = {"z": x, "k": 0}

    def step():
        state["k"] += 1
        if state["k"] % 500 == 0:
            state["z"] = x
        state["z"] = (state["z"] * 0.5).relu()
    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--no-torch", action="store_true")
    a = ap.parse_args()
    torch = None
    if not a.no_torch:
        try:
            import torch
            torch.set_num_threads(1)
        except ImportError:
            pass
    with tessera.no_grad():
        t_rows = [(name, per_call_us(fn, a.n, a.repeat)) for name, fn in cases(tessera)]
    p_rows = {}
    if torch is not None:
        with torch.no_grad():
            p_rows = {name: per_call_us(fn, a.n, a.repeat) for name, fn in cases(torch)}
    print(f"{'op':40s} {'tessera us/op':>14s} {'torch eager us/op':>18s}")
    for name, us in t_rows:
        p = f"{p_rows[name]:18.2f}" if name in p_rows else f"{'-':>18s}"
        print(f"{name:40s} {us:14.2f} {p}")
    traced = [us / (2 if name.startswith("chain") else 1) for name, us in t_rows if name != "x.shape"]
    print(f"median over traced ops: {statistics.median(traced):.2f} us/op (goal <= 2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
