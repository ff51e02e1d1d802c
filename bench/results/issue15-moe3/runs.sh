#!/bin/bash
# Before (3766109, `git archive` into /tmp/moe3-before) and after (this tree), alternately, same command,
# 1 thread, CPU time, glibc keeping freed memory. Run under /work/exp/quiet2.sh (other python processes stopped).
after=${1:-.}
for round in $(seq ${2:-3}); do
  for tree in /tmp/moe3-before "$after"; do
    echo "== $tree (round $round)"
    (cd "$tree" && OMP_NUM_THREADS=1 /work/main/.venv/bin/python bench/bench_moe.py --clock cpu --malloc keep)
  done
done
