#!/bin/sh
# `tessera train gpt` data parallel, against one rank: the same little training (dropout 0.1) run
# on one device, with --data-parallel 2 (in-process ranks; also with --zero1, AdamW's moments
# sharded) and under mpirun -np 2 --distributed. The per-step losses of the --log-json files must
# agree to 1e-5 relative; under mpirun rank 0 writes FILE and the checkpoint, rank 1 FILE.rank1
# and no checkpoint; also mpirun -np 2 --distributed --tensor-parallel 2 (the GPT's weights split
# over the 2 MPI ranks, dist::sync_partitioned). Then resuming: 2 MPI ranks
# continue rank 0's checkpoint of step 3 to step 5 as one rank continues its own; and ZeRO-1
# (--zero1: sharded moments, MPI rank 1 writing its own to ckpt.safetensors.rank1) resumed from
# step 3, in process and on 2 MPI ranks, gives the uninterrupted --zero1 run's steps 4 and 5.
# One device's and the MPI ranks' steps 4 and 5 replay the captured step (the log's "replayed").
# usage: cli_train.sh MPIRUN TESSERA
mpirun=$1
tessera=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args="train gpt --device cpu --batch 4 --block 16 --layers 1 --embd 32 --heads 2 --warmup 2 --eval-every 100 --dropout 0.1 --seed 3"
"$tessera" $args --steps 5 --log-json "$dir/one.jsonl" > "$dir/one.out" 2>&1 || { cat "$dir/one.out"; echo "FAIL: one rank"; exit 1; }
"$tessera" $args --steps 5 --data-parallel 2 --log-json "$dir/two.jsonl" > "$dir/two.out" 2>&1 || { cat "$dir/two.out"; echo "FAIL: --data-parallel 2"; exit 1; }
"$tessera" $args --steps 5 --data-parallel 2 --zero1 --log-json "$dir/zero.jsonl" > "$dir/zero.out" 2>&1 || { cat "$dir/zero.out"; echo "FAIL: --data-parallel 2 --zero1"; exit 1; }
timeout 120 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$tessera" $args --steps 5 --distributed --log-json "$dir/mpi.jsonl" --out "$dir/ck" \
  > "$dir/mpi.out" 2>&1 || { cat "$dir/mpi.out"; echo "FAIL: mpirun -np 2 --distributed"; exit 1; }
[ -f "$dir/ck/ckpt.safetensors" ] || { echo "FAIL: rank 0 wrote no checkpoint"; exit 1; }
timeout 120 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$tessera" $args --steps 5 --distributed --tensor-parallel 2 --log-json "$dir/tp.jsonl" \
  > "$dir/tp.out" 2>&1 || { cat "$dir/tp.out"; echo "FAIL: mpirun -np 2 --distributed --tensor-parallel 2"; exit 1; }
[ -f "$dir/mpi.jsonl.rank1" ] || { echo "FAIL: rank 1 wrote no mpi.jsonl.rank1"; exit 1; }
"$tessera" $args --steps 3 --out "$dir/ck1" > "$dir/r1.out" 2>&1 && "$tessera" $args --steps 5 --out "$dir/ck1" --resume --log-json "$dir/r1.jsonl" >> "$dir/r1.out" 2>&1 ||
  { cat "$dir/r1.out"; echo "FAIL: one rank, resumed"; exit 1; }
timeout 120 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$tessera" $args --steps 3 --distributed --out "$dir/ck2" > "$dir/r2.out" 2>&1 &&
  timeout 120 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$tessera" $args --steps 5 --distributed --out "$dir/ck2" --resume --log-json "$dir/r2.jsonl" \
    >> "$dir/r2.out" 2>&1 || { cat "$dir/r2.out"; echo "FAIL: mpirun -np 2 --distributed, resumed"; exit 1; }
grep -q "resumed from" "$dir/r2.out" || { cat "$dir/r2.out"; echo "FAIL: the MPI job did not resume"; exit 1; }
"$tessera" $args --steps 3 --data-parallel 2 --zero1 --out "$dir/ck3" > "$dir/r3.out" 2>&1 &&
  "$tessera" $args --steps 5 --data-parallel 2 --zero1 --out "$dir/ck3" --resume --log-json "$dir/r3.jsonl" >> "$dir/r3.out" 2>&1 ||
  { cat "$dir/r3.out"; echo "FAIL: --data-parallel 2 --zero1, resumed"; exit 1; }
timeout 120 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$tessera" $args --steps 3 --distributed --zero1 --out "$dir/ck4" > "$dir/r4.out" 2>&1 &&
  [ -f "$dir/ck4/ckpt.safetensors.rank1" ] &&
  timeout 120 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$tessera" $args --steps 5 --distributed --zero1 --out "$dir/ck4" --resume \
    --log-json "$dir/r4.jsonl" >> "$dir/r4.out" 2>&1 || { cat "$dir/r4.out"; ls "$dir/ck4"; echo "FAIL: mpirun -np 2 --distributed --zero1, resumed"; exit 1; }
grep -q "resumed from" "$dir/r3.out" && grep -q "resumed from" "$dir/r4.out" || { echo "FAIL: a --zero1 run did not resume"; exit 1; }
python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
def losses(f):
    return [json.loads(l)["loss"] for l in open(f"{d}/{f}")]
one = losses("one.jsonl")
assert len(one) == 5, one
bad = 0
for name in ("two.jsonl", "zero.jsonl", "mpi.jsonl", "mpi.jsonl.rank1", "tp.jsonl", "tp.jsonl.rank1"):
    got = losses(name)
    if len(got) != len(one):
        print(f"FAIL: {name} has {len(got)} steps, one rank {len(one)}")
        bad += 1
    for s, (a, b) in enumerate(zip(one, got)):
        if abs(a - b) > 1e-5 * abs(a):
            print(f"FAIL: {name} step {s + 1}: loss {b!r}, one rank {a!r}")
            bad += 1
    print(name, ["%.6f" % x for x in got])
print("one.jsonl", ["%.6f" % x for x in one])
r1, r2 = losses("r1.jsonl"), losses("r2.jsonl")
print("resumed: one rank", ["%.6f" % x for x in r1], "2 MPI ranks", ["%.6f" % x for x in r2])
if len(r1) != 2 or len(r2) != 2 or any(abs(a - b) > 1e-5 * abs(a) for a, b in zip(r1, r2)):
    print("FAIL: resumed losses differ")
    bad += 1
# One device's and each MPI rank's step are captured: steps 4 and 5 replay (tessera/capture.h);
# in-process ranks run their graphs together and trace every step.
for name, want in (("one.jsonl", True), ("mpi.jsonl", True), ("mpi.jsonl.rank1", True), ("two.jsonl", False)):
    got = [json.loads(l)["replayed"] for l in open(f"{d}/{name}")]
    if got != [False, False, False, want, want]:
        print(f"FAIL: {name} replayed {got}")
        bad += 1
zero = losses("zero.jsonl")[3:]
for name in ("r3.jsonl", "r4.jsonl", "r4.jsonl.rank1"):
    got = losses(name)
    print(f"--zero1 resumed ({name})", ["%.6f" % x for x in got], "uninterrupted", ["%.6f" % x for x in zero])
    if len(got) != 2 or any(abs(a - b) > 1e-5 * abs(a) for a, b in zip(zero, got)):
        print(f"FAIL: --zero1 resumed losses ({name}) differ from the uninterrupted run's")
        bad += 1
sys.exit(1 if bad else 0)
PY
