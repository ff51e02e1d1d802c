#!/bin/bash
# before (/tmp/moe2-before = 89d6314) and after (this worktree) alternately, same command, 1 thread, CPU time.
for i in 1 2 3; do
  for side in before after; do
    dir=/tmp/moe2-before; [ $side = after ] && dir=/work/wt/moe2
    echo "== $side run $i $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
    (cd $dir && OMP_NUM_THREADS=1 /work/main/.venv/bin/python bench/bench_moe.py --clock cpu --malloc keep)
  done
done
for side in before after; do
  dir=/tmp/moe2-before; [ $side = after ] && dir=/work/wt/moe2
  echo "== $side default malloc $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
  (cd $dir && OMP_NUM_THREADS=1 /work/main/.venv/bin/python bench/bench_moe.py --clock cpu)
done
