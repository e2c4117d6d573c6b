"""Runs the GPT training step `tessera export --stablehlo gpt` wrote under jax (XLA's CPU
compiler) for the steps the export recorded, feeding each step's updated parameters and AdamW
moments back (the aliased outputs) and the recorded token batches and AdamW scalars in, and
compares the losses with Tessera's cpu backend's. Not part of CI: bench/stablehlo_vs_cpu.sh
exports and runs it.

    build/pyenv/bin/python bench/stablehlo_jax.py step.mlir
"""
import json
import sys
import time

import numpy as np

import jax

jax.config.update("jax_enable_x64", True)
from jax.extend.backend import get_backend  # noqa: E402

DTYPES = {"float32": np.float32, "float64": np.float64, "int64": np.int64, "int32": np.int32}


def main():
    path = sys.argv[1]
    meta = json.load(open(path + ".json"))
    blob = open(path + ".bin", "rb").read()

    def value(spec, at):
        a = np.frombuffer(blob, dtype=DTYPES[spec["dtype"]], count=at["bytes"] // np.dtype(DTYPES[spec["dtype"]]).itemsize,
                          offset=at["offset"])
        return a.reshape(spec["shape"])

    backend = get_backend("cpu")
    dev = backend.local_devices()[0]
    t0 = time.time()
    exe = backend.compile_and_load(open(path).read(), [dev])
    compile_s = time.time() - t0
    args_spec = meta["arguments"]
    args = [jax.device_put(value(s, s["initial"]), dev) for s in args_spec]
    worst, times = 0.0, []
    print(f"jax {jax.__version__}: XLA compiled the step in {compile_s:.2f} s; {len(args)} arguments")
    for t, step in enumerate(meta["steps"]):
        for k, at in step["arguments"].items():
            args[int(k)] = jax.device_put(value(args_spec[int(k)], at), dev)
        t1 = time.time()
        outs = exe.execute(args)
        loss = float(np.asarray(outs[0]))
        times.append(time.time() - t1)
        for a, s in enumerate(args_spec):
            if s["fed_from_output"] >= 0:
                args[a] = outs[s["fed_from_output"]]
        ref = step["cpu_loss"]
        rel = abs(loss - ref) / abs(ref)
        worst = max(worst, rel)
        print(f"step {t + 1}: loss jax {loss:.6f}  tessera cpu {ref:.6f}  relative difference {rel:.2e}")
    times.sort()
    print(f"RESULT stablehlo_jax steps={len(times)} median_ms={1000 * times[len(times) // 2]:.1f} "
          f"compile_s={compile_s:.2f} worst_rel_loss_diff={worst:.2e}")
    sys.exit(0 if worst < 1e-4 else 1)


if __name__ == "__main__":
    main()
