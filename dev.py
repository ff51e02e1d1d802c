#!/usr/bin/env python3
"""One entry point that sets itself up: `python3 dev.py run` (the TUI) or `python3 dev.py test [--quick]`.

On first use it creates .venv, installs torch==2.13.0 there when no torch is present (from PyTorch's CPU index
first: PyPI's Linux wheel is a multi-GB CUDA build), then the project: `run` with only what the TUI
needs, `serve` with textual-serve (the TUI in a browser, for a projector), the rest with the dev extra.

The workshop kit (20 laptops, no network in the room, no GPU; lessons/INSTRUCTOR.md):
    python3 dev.py wheelhouse DIR [--platform windows-x86_64] [--python 3.11] [--dry-run]
                                    download every wheel the lessons and the TUI need (CPU torch only)
    python3 dev.py setup --offline DIR   create .venv and install from DIR with no network
    python3 dev.py bundle DIR [--wheelhouse WH]   a learner's copy of the repository without lessons/solutions/
Those live in devkit/ (standard library only, as this file: it runs on the system Python before .venv exists).
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import venv

from devkit.bundle import bundle
from devkit.paths import PYTHON, ROOT, VENV
from devkit.torch_index import TORCH, install_torch
from devkit.wheelhouse import setup_offline, wheelhouse

STAMP = VENV / ".tiny-k3-installed"


def _fingerprint() -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()


def ensure_env(extras: tuple[str, ...] = ("dev",)) -> None:
    """Set up .venv with the project and `extras` on first use, saying at each step what it does.

    `run` asks for no extra (only what the TUI needs: numpy, rich, textual, safetensors, torch), `serve` for
    "serve" (textual-serve), the rest for "dev". The stamp records the pyproject.toml it installed and the
    extras, so a later command installs only what it adds. pip's own progress is shown, not hidden.
    """
    stamp = STAMP.read_text().split() if STAMP.exists() else []
    current = stamp[:1] == [_fingerprint()] and PYTHON.exists()
    installed = set(stamp[1:]) if current else set()
    if current and set(extras) <= installed:
        return
    if not PYTHON.exists():
        print("[dev.py] step 1/3: creating .venv ...", flush=True)
        venv.create(VENV, with_pip=True)
    pip = [str(PYTHON), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "on"]
    if subprocess.run([str(PYTHON), "-c", "import torch"], capture_output=True).returncode != 0:
        print(f"[dev.py] step 2/3: installing {TORCH} (CPU; the largest download, a few minutes) ...", flush=True)
        install_torch(pip)
    wanted = sorted(installed | set(extras))
    target = f"{ROOT}[{','.join(wanted)}]" if wanted else str(ROOT)
    what = f"with its {', '.join(wanted)} extra{'s' * (len(wanted) > 1)}" if wanted else "(the TUI's needs only)"
    print(f"[dev.py] step 3/3: installing tiny-k3 {what} ...", flush=True)
    subprocess.run(pip + ["-e", target], check=True)
    STAMP.write_text(" ".join([_fingerprint(), *wanted]))


def serve(rest: list[str]) -> int:
    """`python3 dev.py serve [--host H] [--port P] [-- TUI options]`: the TUI in a browser (textual-serve)."""
    ensure_env(("serve",))
    return run_forwarding([str(PYTHON), "-m", "tui_app.serve", *rest])


FORWARDED = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))


def run_forwarding(argv: list[str]) -> int:
    """Run argv in ROOT and return its exit status, passing SIGTERM, SIGINT and SIGHUP on to it: stopping this
    process by its pid stops the child too (the server would otherwise keep serving its port). The child has
    a process group of its own, so a terminal's Ctrl+C reaches it once, through here."""
    own_group = {"preexec_fn": os.setpgrp} if os.name == "posix" else {}
    child = subprocess.Popen(argv, cwd=ROOT, **own_group)

    def forward(signum, _frame):
        if child.poll() is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        return child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_tui(rest: list[str]) -> int:
    """`python3 dev.py run [TUI options]`: installs only what the TUI needs, then starts it."""
    ensure_env(())
    return subprocess.run([str(PYTHON), "tui.py", *rest], cwd=ROOT).returncode


# The fast-path tests (each at 1 and 2 threads: tests/conftest.py's torch_threads) once more with Intel MKL held
# to its AVX2 kernels. On an AVX-512 machine, as CI's is, that is the rounding another CPU's BLAS gives: the
# fused and separate router products of issue 24 differed by 6e-16 on an AVX-512 EPYC and differ so here.
# MKL reads the variable when it loads, hence a second process; a torch without MKL ignores it.
FAST_PATH_TESTS = ("tests/test_moe.py", "tests/test_fast_paths.py", "tests/test_decode_paths.py")
OTHER_KERNELS = {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}


# `python3 dev.py test --quick`: a first check in about half a minute (30 s on 2 cores at load 2.4), not CI's
# (CI and `dev.py test` run the whole suite): every module imported (test_dev_commands.py), the core maths, one
# lesson in a real Jupyter kernel, one Pilot test of the TUI. tests/test_dev_commands.py checks each is there.
QUICK_LESSON = "tests/test_lessons.py::test_lesson_runs_top_to_bottom_for_learners_and_instructors"
QUICK_TESTS = ("tests/test_dev_commands.py", "tests/test_config.py", "tests/test_kda.py", "tests/test_mla.py",
               "tests/test_attnres.py", "tests/test_mxfp4.py", "tests/test_sim_cli.py", "tests/test_released_stream.py",
               f"{QUICK_LESSON}[00_attention_and_its_cache.py]", "tests/test_tui.py::test_opens_steps_forward_and_back")


def test_commands(rest: list[str]) -> list[tuple[list[str], dict[str, str]]]:
    """(argv, extra environment) of each pytest run `python3 dev.py test [--quick] [pytest args]` makes: the suite
    (or QUICK_TESTS), and for the whole suite as CI runs it the fast-path tests on MKL's AVX2 kernels."""
    quick, rest = "--quick" in rest, [a for a in rest if a != "--quick"]
    runs = [([str(PYTHON), "-m", "pytest", "-q", *(QUICK_TESTS if quick else ()), *rest], {})]
    if not rest and not quick:
        runs.append(([str(PYTHON), "-m", "pytest", "-q", "-k", "threads1 or threads2", *FAST_PATH_TESTS],
                     OTHER_KERNELS))
    return runs


def run_tests(rest: list[str]) -> int:
    """Every pytest run of test_commands, in order; the exit status of the first that failed (pytest's 5, no
    tests collected, included), else 0."""
    codes = []
    for argv, extra in test_commands(rest):
        if extra:
            print(f"[dev.py] the fast-path tests again with {' '.join(f'{k}={v}' for k, v in extra.items())} "
                  "(another CPU's BLAS rounding)", flush=True)
        codes.append(subprocess.run(argv, cwd=ROOT, env={**os.environ, **extra}).returncode)
    return next((code for code in codes if code != 0), 0)


KIT_COMMANDS = {"wheelhouse": wheelhouse, "bundle": bundle}
TUI_COMMANDS = {"run": run_tui, "serve": serve}


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("run", [])
    if command in KIT_COMMANDS:
        return KIT_COMMANDS[command](rest)
    if command in TUI_COMMANDS:
        return TUI_COMMANDS[command](rest)
    if command == "setup" and any(a == "--offline" or a.startswith("--offline=") for a in rest):
        return setup_offline(rest)
    if command not in ("test", "setup", "sim", "bench"):
        print(f"unknown command {command!r}; use one of: {', '.join(TUI_COMMANDS)}, test, setup, sim, bench, "
              f"{', '.join(KIT_COMMANDS)}.", file=sys.stderr)
        return 2
    ensure_env()
    if command == "setup":
        return 0
    if command == "test":
        return run_tests(rest)
    if command == "sim":
        return subprocess.run([str(PYTHON), "-m", "sim", *rest], cwd=ROOT).returncode
    if command == "bench":
        codes = [subprocess.run([str(PYTHON), str(p)], cwd=ROOT).returncode for p in sorted((ROOT / "bench").glob("bench_*.py"))]
        return max(codes, default=0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
