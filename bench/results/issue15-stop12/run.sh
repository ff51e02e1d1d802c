#!/bin/bash
# Issue 15's benches, before (89d6314, /work/wt/base2) and after (main), interleaved, with other processes stopped.
out=${1:-/work/exp/final2/out.txt}
py=/work/main/.venv/bin/python
{
echo "date $(date -u +%FT%TZ); load: $(cat /proc/loadavg); main $(git -C /work/main rev-parse --short HEAD), before 89d6314"
for tree in /work/wt/base2 /work/main; do
  echo "=== $tree: OMP_NUM_THREADS=T python bench/bench_kda.py --threads T --lengths 4096"
  (cd $tree && OMP_NUM_THREADS=1 $py bench/bench_kda.py --threads 1 --lengths 4096 2>&1 | grep -vi warn)
  (cd $tree && OMP_NUM_THREADS=2 $py bench/bench_kda.py --threads 2 --lengths 4096 2>&1 | grep -vi warn)
done
for malloc in default keep; do
for tree in /work/wt/base2 /work/main; do
  echo "=== $tree: OMP_NUM_THREADS=1 python bench/bench_moe.py --threads 1 --malloc $malloc"
  (cd $tree && OMP_NUM_THREADS=1 $py bench/bench_moe.py --threads 1 --malloc $malloc 2>&1 | grep -vi warn)
done
done
for tree in /work/wt/base2 /work/main; do
  echo "=== $tree: OMP_NUM_THREADS=1 python bench/bench_sim.py --presets small,k3-topo --threads 1"
  (cd $tree && OMP_NUM_THREADS=1 $py bench/bench_sim.py --presets small,k3-topo --threads 1 2>&1 | grep -vi warn)
done
echo "end $(date -u +%FT%TZ); load: $(cat /proc/loadavg)"
} > $out 2>&1
