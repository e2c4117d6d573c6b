#!/bin/sh
# A rank killed (SIGKILL) before a collective the other waits in: the job must exit non-zero
# within 30 seconds with a message naming the lost rank -- never hang.
# usage: lost_rank.sh MPIRUN PROGRAM
mpirun=$1
prog=$2
start=$(date +%s)
out=$(timeout 90 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$prog" die 2>&1)
rc=$?
secs=$(( $(date +%s) - start ))
echo "$out"
echo "exit status $rc after $secs s"
[ "$rc" -ne 0 ] || { echo "FAIL: the job exited 0 with a rank lost"; exit 1; }
[ "$rc" -ne 124 ] || { echo "FAIL: the job hung (killed by timeout after 90 s)"; exit 1; }
[ "$secs" -le 30 ] || { echo "FAIL: the job took $secs s to end (limit 30)"; exit 1; }
echo "$out" | grep -Eq "process rank 1 |rank\(s\) 1" || { echo "FAIL: no message names the lost rank 1"; exit 1; }
echo "ok: the job ended with status $rc in $secs s, naming rank 1"
