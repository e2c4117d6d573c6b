#!/bin/sh
# A rank alive but 20 s late to a collective the other waits in, with the collective timeout at
# 1 s: the waiting rank's wait (the MPI communicator's MPI_Test loop, sleeping between tests while
# it waits for the other to arrive) must still time out, print it and end the job non-zero well
# before the late rank would arrive -- never complete late, never hang.
# usage: stuck_rank.sh MPIRUN PROGRAM
mpirun=$1
prog=$2
start=$(date +%s)
out=$(TESSERA_COLLECTIVE_TIMEOUT_S=1 timeout 90 "$mpirun" --allow-run-as-root --oversubscribe -np 2 -x TESSERA_COLLECTIVE_TIMEOUT_S "$prog" stuck 2>&1)
rc=$?
secs=$(( $(date +%s) - start ))
echo "$out"
echo "exit status $rc after $secs s"
[ "$rc" -ne 0 ] || { echo "FAIL: the job exited 0: the wait did not time out"; exit 1; }
[ "$rc" -ne 124 ] || { echo "FAIL: the job hung (killed by timeout after 90 s)"; exit 1; }
[ "$secs" -le 15 ] || { echo "FAIL: the job took $secs s to end (limit 15; the late rank arrives after 20)"; exit 1; }
echo "$out" | grep -q "timed out after 1 s waiting for the other ranks" || { echo "FAIL: no message says the wait timed out"; exit 1; }
echo "ok: the job ended with status $rc in $secs s, the wait timed out"
