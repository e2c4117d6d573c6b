#!/usr/bin/env python3
"""onnxruntime's side of bench/onnx_vs_ort.sh: inference latency of MODEL on INPUT (.npy) with
the CPU execution provider on THREADS intra-op threads, median of RUNS timed runs after WARMUP,
printed as
  RESULT ort batch=B threads=T runs=N median_ms=.. min_ms=..
With --save OUT.npy it writes the first output (to check it against Tessera's).
usage: onnx_ort.py MODEL INPUT RUNS WARMUP THREADS [--save OUT.npy]"""
import sys
import time

import numpy as np
import onnxruntime as ort

model, inp, runs, warmup, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
x = np.load(inp)
opts = ort.SessionOptions()
opts.intra_op_num_threads = threads
opts.inter_op_num_threads = 1
sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
name = sess.get_inputs()[0].name
times = []
for i in range(warmup + runs):
    t0 = time.perf_counter()
    y = sess.run(None, {name: x})
    t1 = time.perf_counter()
    if i >= warmup:
        times.append((t1 - t0) * 1e3)
if "--save" in sys.argv:
    np.save(sys.argv[sys.argv.index("--save") + 1], y[0])
print(f"RESULT ort batch={x.shape[0]} threads={threads} runs={runs} median_ms={np.median(times):.4f} min_ms={min(times):.4f}")
