#!/bin/bash
py=/work/main/.venv/bin/python
ab=/work/main/bench/results/issue15-step2/ab_step.py
echo "date $(date -u +%FT%TZ); load: $(cat /proc/loadavg); main $(git -C /work/main rev-parse --short HEAD), before 3766109"
for round in 1 2; do
  for preset in small k3-topo; do
    for tree in /work/wt/base3 /work/main; do
      (cd /tmp && OMP_NUM_THREADS=1 $py $ab $tree $preset 10 2>&1 | grep -vi warn)
    done
  done
done
echo "end $(date -u +%FT%TZ); load: $(cat /proc/loadavg)"
