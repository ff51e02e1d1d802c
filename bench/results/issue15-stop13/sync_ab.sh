#!/bin/bash
# refresh the A/B copies: old = main (or $1), new = the kda worktree (or $2)
cd /work/exp/s13/ab && rm -rf old_k3 new_k3 && mkdir old_k3 new_k3
(cd ${1:-/work/main}/tiny_k3 && tar cf - --exclude weights --exclude __pycache__ .) | tar xf - -C old_k3
(cd ${2:-/work/wt/kda}/tiny_k3 && tar cf - --exclude weights --exclude __pycache__ .) | tar xf - -C new_k3
