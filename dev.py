#!/usr/bin/env python3
"""One entry point that sets itself up: `python3 dev.py run` (the TUI) or `python3 dev.py test`.

On first use it creates .venv, installs torch==2.13.0 there when no torch is present (a bare
`torch` requirement would fetch a multi-GB CUDA build), then the project with its dev extra.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PYTHON = VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
STAMP = VENV / ".tiny-k3-installed"
TORCH = "torch==2.13.0"


def _fingerprint() -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()


def ensure_env() -> None:
    if STAMP.exists() and STAMP.read_text() == _fingerprint() and PYTHON.exists():
        return
    if not PYTHON.exists():
        print("[dev.py] creating .venv ...", flush=True)
        venv.create(VENV, with_pip=True)
    pip = [str(PYTHON), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    if subprocess.run([str(PYTHON), "-c", "import torch"], capture_output=True).returncode != 0:
        print(f"[dev.py] installing {TORCH} (CPU) ...", flush=True)
        subprocess.run(pip + [TORCH], check=True)
    print("[dev.py] installing tiny-k3 with its dev extra ...", flush=True)
    subprocess.run(pip + ["-e", f"{ROOT}[dev]"], check=True)
    STAMP.write_text(_fingerprint())


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("run", [])
    if command not in ("run", "test", "setup", "sim", "bench"):
        print(f"unknown command {command!r}; use one of: run, test, setup, sim, bench.", file=sys.stderr)
        return 2
    ensure_env()
    if command == "setup":
        return 0
    if command == "test":
        return subprocess.run([str(PYTHON), "-m", "pytest", "-q", *rest], cwd=ROOT).returncode
    if command == "sim":
        return subprocess.run([str(PYTHON), "-m", "sim", *rest], cwd=ROOT).returncode
    if command == "bench":
        codes = [subprocess.run([str(PYTHON), str(p)], cwd=ROOT).returncode for p in sorted((ROOT / "bench").glob("bench_*.py"))]
        return max(codes, default=0)
    main_job = ["tui.py"] if (ROOT / "tui.py").exists() else ["-m", "tiny_k3"]
    return subprocess.run([str(PYTHON), *main_job, *rest], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
