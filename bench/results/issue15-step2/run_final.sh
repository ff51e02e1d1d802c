#!/bin/bash
# The final tree (step2 head, a copy in $FINAL) beside before and the first after (run1's $AFTER), ab_step.py in
# turns, with every other python process stopped (quiet2.sh): small 3 rounds, k3-topo 2.
BEFORE=${BEFORE:-/tmp/before}; AFTER=${AFTER:-/tmp/after}; FINAL=${FINAL:-/tmp/after2}
py=/work/main/.venv/bin/python; here=$(cd "$(dirname "$0")" && pwd)
export OMP_NUM_THREADS=1
echo "date $(date -u +%FT%TZ); load: $(cat /proc/loadavg)"
for r in 1 2 3; do for tree in $BEFORE $AFTER $FINAL; do $py $here/ab_step.py $tree small; done; done
for r in 1 2; do for tree in $BEFORE $AFTER $FINAL; do $py $here/ab_step.py $tree k3-topo 8; done; done
echo "end $(date -u +%FT%TZ); load: $(cat /proc/loadavg)"
