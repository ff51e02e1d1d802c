"""How many threads torch computes with in the TUI: the cores other work leaves free, at least one.

torch starts with one intra-op thread per core. On a machine whose cores are busy with other work, every
parallel op then waits for a thread that has no core: on 2 cores at load 2 to 3.5, the first frame's load took a
median 1.9 s (up to 8.1 s) with 2 threads against 0.65 s with 1 (bench/results/bench_tui-startup.txt). The models
the TUI runs are small (hidden size 32 to 128), so a thread that gets no core costs far more than a second thread
could save. On an idle machine nothing changes: torch keeps its own count.

An explicit OMP_NUM_THREADS or MKL_NUM_THREADS is the user's choice and is left as it is.
"""

from __future__ import annotations

import os

import torch

CHOSEN_BY_USER = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def free_cores(threads: int, cpus: int, load: float) -> int:
    """torch's `threads`, at most the `cpus` the 1-minute `load` average leaves free (load rounded), at least 1."""
    return max(1, min(threads, cpus - int(load + 0.5)))


def use_free_cores(environ=None) -> int:
    """Set torch's intra-op threads to free_cores for this machine now, unless the environment names a thread
    count (CHOSEN_BY_USER) or the load cannot be read; returns the count torch computes with."""
    environ = os.environ if environ is None else environ
    if any(environ.get(name) for name in CHOSEN_BY_USER) or not hasattr(os, "getloadavg"):
        return torch.get_num_threads()
    threads = free_cores(torch.get_num_threads(), os.cpu_count() or 1, os.getloadavg()[0])
    torch.set_num_threads(threads)
    return threads
