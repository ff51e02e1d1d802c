"""The first line of every bench's output: the command, the machine and the load that produced it.

    from provenance import provenance_line
    print(provenance_line())
    # command: python bench/bench_kda.py --threads 1; machine: Intel Xeon ..., 2 CPUs, torch 2.13.0+cpu;
    # load: 0.42 0.80 1.10 (1/5/15-min averages) at 2026-12-02T16:20:00Z

A result kept in bench/results/ is then self-describing: its first line says how to make it again, and the load
says how far to trust its times (a loaded machine inflates wall clock; CPU time much less).
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys

import torch


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo where there is one, else platform.processor()."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance_line(argv: list[str] | None = None) -> str:
    """`command: ...; machine: ...; load: ...` for the running process (argv: sys.argv by default)."""
    argv = sys.argv if argv is None else argv
    command = "python " + " ".join(shlex.quote(a) for a in argv)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "unknown"
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (f"command: {command}; machine: {cpu_model()}, {os.cpu_count()} CPUs, torch {torch.__version__}; "
            f"load: {load} (1/5/15-min averages) at {when}")
