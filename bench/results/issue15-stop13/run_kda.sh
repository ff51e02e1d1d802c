#!/bin/bash
# bench_kda.py (this stop's, with --floor) at T=4096, 1 and 2 threads: before 3766109 (/work/wt/base3), after ($1, default main); rounds in turn
py=/work/main/.venv/bin/python
after=${1:-/work/main}
echo "date $(date -u +%FT%TZ); load: $(cat /proc/loadavg); after $(git -C $after rev-parse --short HEAD), before 3766109"
for round in 1 2; do
for tree in /work/wt/base3 $after; do
  for t in 1 2; do
    echo "=== round $round, $tree: OMP_NUM_THREADS=$t python bench/bench_kda.py --threads $t --lengths 4096 --floor"
    (cd $tree && OMP_NUM_THREADS=$t $py bench/bench_kda.py --threads $t --lengths 4096 --floor 2>&1 | grep -vi warn | grep -v '^$')
  done
done
done
echo "end $(date -u +%FT%TZ); load: $(cat /proc/loadavg)"
