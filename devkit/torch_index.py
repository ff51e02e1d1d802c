"""torch==2.13.0 from PyTorch's CPU index first, for the install and the wheelhouse alike: one quick try, then one
line saying so before any fallback (PyPI's Linux wheel is a multi-GB CUDA build)."""

from __future__ import annotations

import subprocess

TORCH = "torch==2.13.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
INDEX_TIMEOUT_S = 10      # pip's --timeout: the seconds one connection may stall before pip gives up on it
CPU_INDEX_FAILED = "[dev.py] PyTorch's CPU index ({}) could not be reached or had no {}; {}"   # the one line


def cpu_index_options() -> list[str]:
    """pip's options for PyTorch's CPU index: one try, a short timeout. With pip's defaults (5 retries with
    back-off, 15 s a try) an index that cannot be reached costs minutes before the fallback can start."""
    return ["--index-url", TORCH_CPU_INDEX, "--retries", "0", "--timeout", str(INDEX_TIMEOUT_S)]


def install_torch(pip: list[str]) -> None:
    """torch==2.13.0 from PyTorch's CPU index first (PyPI's Linux x86_64 wheel is the CUDA build: GBs of cudnn, nccl
    and triton a CPU-only project never uses); if it gives nothing, one line says so and the default index follows."""
    if subprocess.run(pip + cpu_index_options() + [TORCH]).returncode != 0:
        print(CPU_INDEX_FAILED.format(TORCH_CPU_INDEX, TORCH, "installing it from the default index instead (on "
                                      "Linux x86_64 that is the CUDA build, a few GB)."), flush=True)
        subprocess.run(pip + [TORCH], check=True)
