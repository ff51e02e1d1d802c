#!/bin/bash
# bench_kda.py (this stop's version in both trees) at T=4096, 1 and 2 threads: before 89d6314 (/work/wt/base2), after main; 3 rounds in turn
py=/work/main/.venv/bin/python
echo "date $(date -u +%FT%TZ); load: $(cat /proc/loadavg); main $(git -C /work/main rev-parse --short HEAD), before 89d6314"
for round in 1 2 3; do
for tree in /work/wt/base2 /work/main; do
  for t in 1 2; do
    echo "=== round $round, $tree: OMP_NUM_THREADS=$t python bench/bench_kda.py --threads $t --lengths 4096"
    (cd $tree && OMP_NUM_THREADS=$t $py bench/bench_kda.py --threads $t --lengths 4096 2>&1 | grep -vi warn | grep -v '^$')
  done
done
done
echo "end $(date -u +%FT%TZ); load: $(cat /proc/loadavg)"
