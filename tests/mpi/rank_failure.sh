#!/bin/sh
# A 2-rank job where rank 1 fails a collective rank 0 waits in must end non-zero within a limit,
# with a message saying why -- never hang (timeout 90 s), never complete late.
#   lost:  rank 1 killed (SIGKILL) before the collective: ends within 30 s naming the lost rank 1.
#   stuck: rank 1 alive but 20 s late, the collective timeout at 1 s: rank 0's wait (the MPI
#          communicator's MPI_Test loop, sleeping between tests while it waits for the other to
#          arrive) must time out and end the job within 15 s, before the late rank arrives.
# usage: rank_failure.sh MPIRUN PROGRAM lost|stuck
mpirun=$1
prog=$2
case $3 in
  lost) mode=die limit=30 xs="" pattern="process rank 1 |rank\(s\) 1" what="a message naming the lost rank 1" ;;
  stuck) mode=stuck limit=15 xs="-x TESSERA_COLLECTIVE_TIMEOUT_S" pattern="timed out after 1 s waiting for the other ranks"
         what="a message saying the wait timed out"
         export TESSERA_COLLECTIVE_TIMEOUT_S=1 ;;
  *) echo "usage: rank_failure.sh MPIRUN PROGRAM lost|stuck"; exit 2 ;;
esac
start=$(date +%s)
out=$(timeout 90 "$mpirun" --allow-run-as-root --oversubscribe -np 2 $xs "$prog" "$mode" 2>&1)
rc=$?
secs=$(( $(date +%s) - start ))
echo "$out"
echo "exit status $rc after $secs s"
[ "$rc" -ne 0 ] || { echo "FAIL: the job exited 0"; exit 1; }
[ "$rc" -ne 124 ] || { echo "FAIL: the job hung (killed by timeout after 90 s)"; exit 1; }
[ "$secs" -le "$limit" ] || { echo "FAIL: the job took $secs s to end (limit $limit)"; exit 1; }
echo "$out" | grep -Eq "$pattern" || { echo "FAIL: no $what"; exit 1; }
echo "ok: the job ended with status $rc in $secs s, with $what"
