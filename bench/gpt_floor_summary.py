#!/usr/bin/python3
"""The summary of bench/gpt_floor.sh: reads its raw records and prints the floor, each configuration
at its best, the ratios and the profiled breakdown. Run again on a kept run's records:

    /usr/bin/python3 bench/gpt_floor_summary.py BUILD/gpt_floor/results.txt BUILD/gpt_floor/profiles.txt STEPS

results.txt: bench_machine_limits' LIMIT lines and one `RUN label t=THREADS round=R <RESULT fields>`
line per process; profiles.txt: the profiled processes' PROFILE and RESULT lines, each prefixed
`fp32|bf16 t=THREADS`. Limits are the machine's: the floor is at the highest thread count's FMA
peak (per CPU-second: what the cores retire while they run) and the rest's bytes are set against
the best triad bandwidth of any thread count.
"""
import re, statistics, sys
steps = int(sys.argv[3])
kv = lambda s: dict(re.findall(r'(\w+)=(\S+)', s))
limits, runs = {}, {}
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "LIMIT":
        d = kv(line); limits[(f[1], int(d["threads"]))] = d
    elif f[0] == "RUN":
        d = kv(line); runs.setdefault(f[1], {}).setdefault(int(d["t"]), []).append(d)
prof = {}
for line in open(sys.argv[2]):
    f = line.split(); d = kv(line)
    p = prof.setdefault(f[0], {"t": int(d["t"]), "kind": {}, "region": {}})
    if "kind" in d: p["kind"][d["kind"]] = {k: float(d[k]) for k in ("ms", "med_ms", "flops", "bytes", "calls")}
    elif "region" in d: p["region"][d["region"]] = (float(d["med_ms"]), float(d["ms"]))
    elif f[2] == "PROFILE" and f[3] == "products": p["products"] = float(d["flops"]); p["wall"] = float(d["wall_ms"])
    elif f[2] == "RESULT": p["result"] = d

fma = {t: float(d["cpu_gflops"]) for (k, t), d in limits.items() if k == "fma_f32"}
fma_wall = {t: float(d["gflops"]) for (k, t), d in limits.items() if k == "fma_f32"}
dot = {t: float(d["cpu_gflops"]) for (k, t), d in limits.items() if k == "dot_bf16"}
triad = {t: float(d["gbs"]) for (k, t), d in limits.items() if k == "triad"}
tmax = max(fma)
peak = fma[tmax]

def best(label):
    """(best process median, its thread count, median over that thread count's processes, every process)"""
    out = None
    for t, rs in runs.get(label, {}).items():
        ms = [float(r["median_ms"]) for r in rs]
        cand = (min(ms), t, statistics.median(ms), ms)
        if out is None or cand[0] < out[0]: out = cand
    return out

print("== this machine's limits (best of 20 repetitions each)")
for t in sorted(fma):
    print(f"  {t} thread(s): float32 FMA {fma[t]:.1f} GFLOP/s per CPU-second ({fma_wall[t]:.1f} by the wall clock under this load),"
          f" bf16 dot {dot.get(t, 0):.1f}, triad {triad.get(t, 0):.1f} GB/s")

fp = prof.get("fp32")
if not fp:
    sys.exit("gpt_floor_summary: no profiled fp32 process in the records: no floor")
# The floor is the model's matrix products, 2mnk over its matmuls, however the compiler groups them
# (a fused attention Step holds the attention's four products per layer outside the Gemm Steps).
mm_flops = fp["products"]
floor = mm_flops / peak / 1e6
print(f"\n== the floor: the step's matmuls {mm_flops / 1e9:.3f} GFLOP (2mnk; its Gemm Steps hold "
      f"{fp['kind']['gemm']['flops'] / 1e9:.3f}, the rest runs inside attention Steps; profiler, per step) at the {tmax}-thread FMA peak {peak:.1f} GFLOP/s")
print(f"  floor {floor:.2f} ms; goal 1.4x = {1.4 * floor:.2f} ms; resolves at 1.6x = {1.6 * floor:.2f} ms")

print("\n== the step, each configuration at its best (fastest process median at its best thread count)")
print(f"  {'configuration':<22} {'best ms':>8} {'thr':>4} {'median ms':>10} {'x floor':>8}  every process (ms) per thread count")
table = {}
for label in runs:
    b = best(label)
    table[label] = b
    every = "; ".join(f"{t}: " + " ".join(f"{float(r['median_ms']):.1f}" for r in runs[label][t]) for t in sorted(runs[label]))
    print(f"  {label:<22} {b[0]:8.2f} {b[1]:4d} {b[2]:10.2f} {b[0] / floor:8.2f}  {every}")
modes = {l: sorted({f"{r.get('version', '')} {r.get('mode', '')} malloc_mmap={r.get('malloc_mmap', '-')}".strip()
                    for rs in runs[l].values() for r in rs}) for l in runs if l.startswith("torch")}
for l, m in modes.items(): print(f"  ({l}: {', '.join(m)})")

f32, b16 = table.get("tessera-fp32"), table.get("tessera-bf16")
if f32:
    v = f32[0] / floor
    print(f"\n== Tessera float32 step {f32[0]:.2f} ms = {v:.2f}x the floor: 1.6x {'met' if v <= 1.6 else 'NOT met'}, 1.4x {'met' if v <= 1.4 else 'NOT met'}")
    for l in table:
        if not l.startswith("tessera"):
            print(f"  tessera-fp32 / {l:<20} {f32[0] / table[l][0]:.2f}" + (f"   tessera-bf16 / {l}: {b16[0] / table[l][0]:.2f}" if b16 else ""))
if f32 and b16:
    print(f"  bf16 step / fp32 step = {b16[0] / f32[0]:.2f} (goal <= 0.7; medians over processes: {b16[2] / f32[2]:.2f})")

for d, p in prof.items():
    t = p["t"]
    k = p["kind"]
    gemm = k.get("gemm", {"ms": 0, "med_ms": 0, "flops": 0, "bytes": 0})
    rest = {n: v for n, v in k.items() if n != "gemm" and not n.startswith("<")}
    rest_ms = sum(v["med_ms"] for v in rest.values())
    rest_bytes = sum(v["bytes"] for v in rest.values())
    host = k.get("<runtime>", {"med_ms": 0, "ms": 0})
    pk = dot.get(t) if d == "bf16" else fma.get(t)
    rate = gemm["flops"] / gemm["med_ms"] / 1e6 if gemm["med_ms"] else 0
    print(f"\n== profiled {d} step at {t} thread(s) (every Step waited for; per step, the median over its {steps} timed steps"
          f" of each step's sum, mean in brackets; profile wall {p['wall']:.2f} ms/step, unprofiled median {float(p['result']['median_ms']):.2f} ms)")
    print(f"  products (Gemm Steps): {gemm['med_ms']:.2f} ms ({gemm['ms']:.2f}), {gemm['flops'] / 1e9:.3f} GFLOP, {rate:.1f} GFLOP/s ="
          f" {100 * rate / fma[t]:.0f}% of the {t}-thread float32 FMA peak ({fma[t]:.1f})"
          + (f", {100 * rate / pk:.0f}% of the bf16 dot peak ({pk:.1f})" if d == "bf16" else "") + " (goal >= 83% in float32)")
    bw = max(triad.values())
    print(f"  the rest (every other Step): {rest_ms:.2f} ms for {rest_bytes / 1e6:.1f} MB by the cost rules ="
          f" {rest_bytes / bw / 1e6:.2f} ms at the best triad {bw:.1f} GB/s ({rest_ms / (rest_bytes / bw / 1e6):.1f}x it;"
          f" goal ~5 ms)")
    print("    " + "; ".join(f"{n} {v['med_ms']:.2f} ms ({v['calls']:.0f} Steps, {v['bytes'] / 1e6:.1f} MB)" for n, v in sorted(rest.items(), key=lambda x: -x[1]["ms"])))
    r = p["region"]
    print(f"  host time outside Steps on a cache hit (goal <= 1 ms): {sum(v[0] for v in r.values()):.3f} ms per step, the sum of"
          f" the regions' medians (the median of each step's total {host['med_ms']:.3f}, the mean {host['ms']:.3f}: preemptions"
          f" on a loaded machine land in them); by region, each its median (mean): "
          + "; ".join(f"{n} {v[0]:.3f} ({v[1]:.3f})" for n, v in sorted(r.items())))
    print("    (trace: the model's forward, loss, backward and AdamW traced by the caller, and from_vector; graph: gathering the"
          " pending tensors and the graph's key; lookup: the cache; launch: arena and slots; copy: item()'s copy and rebinding)")
    exec_gap = [float(x["host_ms"]) for x in runs.get(f"tessera-{d}", {}).get(t, [])]
    if exec_gap:
        print(f"  unprofiled: each step minus its 'running the compiled graph' (arena, slots and Steps) {statistics.median(exec_gap):.3f} ms"
              f" (median over steps, then over processes: {' '.join(f'{g:.3f}' for g in exec_gap)})")
    prof[d]["gemm_ms"], prof[d]["gemm_flops"] = gemm["med_ms"], gemm["flops"]
if "fp32" in prof and "bf16" in prof:
    b, f = prof["bf16"], prof["fp32"]
    ratio = b["gemm_ms"] / f["gemm_ms"]
    if abs(b["gemm_flops"] - f["gemm_flops"]) > 0.01 * f["gemm_flops"]:
        # Not the same products (float32 fuses attention, autocast does not): time per flop.
        per_flop = (b["gemm_ms"] / b["gemm_flops"]) / (f["gemm_ms"] / f["gemm_flops"])
        print(f"\n  bf16 products / fp32 products = {per_flop:.2f} per flop (goal <= 0.55; their Gemm Steps hold different products,"
              f" {b['gemm_flops'] / 1e9:.3f} and {f['gemm_flops'] / 1e9:.3f} GFLOP: the time ratio {ratio:.2f} is not like for like)")
    else:
        print(f"\n  bf16 products / fp32 products = {ratio:.2f} (goal <= 0.55)")
