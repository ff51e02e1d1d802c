#!/bin/bash
# Decode-step rows of issue 15, before (main 45203bb, a copy in $BEFORE) and after (step2, a copy in $AFTER), the
# same commands, with every other python process on the machine stopped (quiet2.sh), 1 thread.
#   ab_step.py: bare hybrid, bare twin and Simulation.step() in turns, CPU time; the trees alternate ROUNDS times.
#   bench_sim.py --presets small,k3-topo --threads 1: each tree once.
BEFORE=${BEFORE:-/tmp/before}; AFTER=${AFTER:-/tmp/after}; ROUNDS=${ROUNDS:-3}
py=/work/main/.venv/bin/python; here=$(cd "$(dirname "$0")" && pwd)
export OMP_NUM_THREADS=1
echo "date $(date -u +%FT%TZ); load: $(cat /proc/loadavg)"
for preset in small k3-topo; do
  for r in $(seq 1 $ROUNDS); do
    for tree in $BEFORE $AFTER; do $py $here/ab_step.py $tree $preset 10; done
  done
done
echo "mid $(date -u +%FT%TZ); load: $(cat /proc/loadavg)"
for tree in $BEFORE $AFTER; do
  echo "=== $tree: OMP_NUM_THREADS=1 python bench/bench_sim.py --presets small,k3-topo --threads 1"
  (cd $tree && $py bench/bench_sim.py --presets small,k3-topo --threads 1 2>&1 | grep -vi warn)
done
echo "end $(date -u +%FT%TZ); load: $(cat /proc/loadavg)"
