"""Runs the StableHLO cases test_stablehlo.cpp wrote (DIR/cases.json) under jax, one process for
all, and writes DIR/results.json: per case id {"ok", "detail", "checks"} where checks are the
flattened index-check results of @main (two int64 per bounds-checked op).

    python run_cases.py DIR
"""
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# The text's meaning is what is tested: LLVM's optimizations off halve XLA's compile time.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")
import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import ml_dtypes  # noqa: E402
from jax.extend.backend import get_backend  # noqa: E402

DTYPES = {
    "bool": np.bool_, "int32": np.int32, "int64": np.int64, "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16, "float32": np.float32, "float64": np.float64,
}


def compare(got, want, tol):
    """'' when got matches want within the normalized tolerance (conformance.cpp's rule)."""
    if got.shape != want.shape:
        return f"shape {got.shape}, want {want.shape}"
    if got.size == 0:
        return ""
    fin = np.isfinite(got) & np.isfinite(want)
    bad = ~fin & ~((got == want) | (np.isnan(got) & np.isnan(want)))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        return f"element {i} is {got.flat[i]!r}, the cpu backend has {want.flat[i]!r}"
    if not fin.any():
        return ""
    diff = np.abs(np.where(fin, got, 0) - np.where(fin, want, 0))
    ref = np.abs(np.where(fin, want, 0)).max()
    err = diff.max() / ref if ref > 0 else diff.max()
    if err <= tol:
        return ""
    i = int(diff.argmax())
    return f"normalized error {err:.3g} > {tol:.3g}; worst element {i}: got {got.flat[i]!r}, want {want.flat[i]!r}"


def run_case(backend, dev, d, c):
    text = open(os.path.join(d, c["id"] + ".mlir")).read()
    exe = backend.compile_and_load(text, [dev])
    args = []
    for p in c["params"]:
        a = np.fromfile(os.path.join(d, p["file"]), dtype=DTYPES[p["dtype"]]).reshape(p["shape"])
        args.append(jax.device_put(a, dev))
    if "rng" in c:
        args.append(jax.device_put(np.array(c["rng"], dtype=np.uint64), dev))
    outs = [np.asarray(o) for o in exe.execute(args)]
    n_out = len(outs) - c["checks"]
    checks = [int(v) for o in outs[n_out:] for v in o.reshape(-1)]
    if c.get("outputs_skipped"):
        return "", checks
    for k, o in enumerate(c["outputs"]):
        want = np.fromfile(os.path.join(d, o["file"]), dtype=np.float64).reshape(o["shape"])
        got = outs[k].astype(np.float64)
        why = compare(got, want, o["tol"])
        if why:
            return f"output {k} ({o['dtype']}{o['shape']}): {why}", checks
    return "", checks


def main():
    d = sys.argv[1]
    cases = json.load(open(os.path.join(d, "cases.json")))
    backend = get_backend("cpu")
    dev = backend.local_devices()[0]
    results, failed, t0 = {}, 0, time.time()

    def one(c):
        try:
            return run_case(backend, dev, d, c)
        except Exception as e:  # a module XLA rejects is a failed case, not a crashed run
            return f"{type(e).__name__}: {str(e)[:2000]}", []

    # XLA compiles outside the GIL: two threads keep both cores busy.
    with ThreadPoolExecutor(max_workers=int(os.environ.get("TESSERA_JAX_THREADS", "2"))) as pool:
        done = list(pool.map(one, cases))
    for c, (why, checks) in zip(cases, done):
        failed += bool(why)
        if why:
            print(f"FAIL {c['name']}: {why}")
        results[c["id"]] = {"ok": not why, "detail": why, "checks": checks}
    json.dump(results, open(os.path.join(d, "results.json"), "w"))
    print(f"jax {jax.__version__}: {len(cases) - failed} passed, {failed} failed in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
