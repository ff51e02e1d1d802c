"""The participant's set-up check: run it first, before the workshop.

    python lessons/setup_check.py          (from the repository root, with the project's venv active,
                                            or: .venv/bin/python lessons/setup_check.py)

Each line is one check, OK or FAIL with what to do about it. Exit code 0 when everything needed
works. Nothing is downloaded.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))


def _check(results: list, name: str, fn, fix: str, required: bool = True) -> None:
    try:
        detail = fn()
        results.append((True, name, detail or ""))
    except Exception as exc:  # a failed check is reported, never raised
        results.append((False if required else None, name, f"{type(exc).__name__}: {exc}. {fix}"))


def _python():
    if sys.version_info < (3, 10):
        raise RuntimeError(f"Python {sys.version.split()[0]} is too old")
    return f"Python {sys.version.split()[0]} at {sys.executable}"


def _packages():
    from importlib.metadata import version

    found = []
    for name in ("torch", "numpy", "matplotlib", "jupytext", "nbclient", "ipykernel", "ipywidgets", "rich"):
        importlib.import_module(name)
        found.append(f"{name} {version(name)}")
    return ", ".join(found)


def _front_end():
    for name in ("jupyterlab", "notebook"):
        try:
            importlib.import_module(name)
            return f"{name} is installed: `jupyter lab lessons/` (or `jupyter notebook`)"
        except ImportError:
            continue
    raise RuntimeError("neither JupyterLab nor Notebook is installed in this environment")


def _kernel():
    from jupyter_client.kernelspec import KernelSpecManager

    specs = KernelSpecManager().find_kernel_specs()
    if "python3" not in specs:
        raise RuntimeError("no 'python3' Jupyter kernel is registered")
    return f"Jupyter kernel 'python3' at {specs['python3']}"


def _model():
    import torch

    import workshop  # noqa: F401  (puts the repository on sys.path)
    from tiny_k3 import K3Config, TinyK3, parameter_counts

    total, active = parameter_counts(K3Config.preset("k3"))
    torch.manual_seed(0)
    model = TinyK3(K3Config.preset("tiny"))
    t = time.perf_counter()
    with torch.no_grad():
        logits, cache = model(torch.tensor([[256, 104, 105]]))
    ms = 1e3 * (time.perf_counter() - t)
    return (f"tiny_k3 imports; K3 on the meta device: {total / 1e12:.2f}T / {active / 1e9:.0f}B; "
            f"a tiny forward pass took {ms:.0f} ms")


def _simulator():
    from sim import Simulation
    from tiny_k3.weights import available_pretrained

    t = time.perf_counter()
    sim = Simulation("small", "hi", seed=0)
    sim.step()
    shipped = ", ".join(available_pretrained()) or "none yet (lessons use random weights and say so)"
    return f"Simulation('small') built and stepped in {time.perf_counter() - t:.1f} s; trained weights: {shipped}"


def _checks():
    import checks
    import workshop

    return f"{len(checks.ALL_CHECKS)} exercise checks; instructor mode {'ON' if workshop.SOLUTIONS else 'off'}"


def _plots():
    import matplotlib

    import workshop  # noqa: F401

    fig = workshop.plt.figure()
    workshop.plt.close(fig)
    return f"matplotlib backend {matplotlib.get_backend()}"


def _tui():
    importlib.import_module("textual")
    if not (HERE.parent / "tui.py").exists():
        raise RuntimeError("tui.py is missing from the repository root")
    import shutil

    cols, rows = shutil.get_terminal_size((0, 0))
    size = f"this terminal is {cols}x{rows}" if cols else "terminal size unknown here"
    return f"textual imports; open the TUI with `python tui.py` in a terminal of at least 120x36 ({size})"


def main() -> int:
    results: list = []
    _check(results, "python", _python, "Use Python 3.10 or newer.")
    _check(results, "packages", _packages, "Run `python3 dev.py setup` (or `pip install -e '.[dev]'`).")
    _check(results, "jupyter kernel", _kernel, "Run `python -m ipykernel install --user --name python3`.")
    _check(results, "notebook app", _front_end, "Install the lessons' extra: `python3 dev.py setup` (online) or "
           "`python3 dev.py setup --offline WHEELHOUSE` (the instructor's wheel folder); it includes JupyterLab.")
    _check(results, "model", _model, "Check that you run from the repository (tiny_k3/ beside lessons/).")
    _check(results, "simulator", _simulator, "sim/ should be importable from the repository root.")
    _check(results, "exercise checks", _checks, "lessons/checks/ should be beside this file.")
    _check(results, "plots", _plots, "Install matplotlib (`pip install matplotlib`).")
    _check(results, "TUI", _tui, "Install textual (`python3 dev.py setup`); the lessons work without it.",
           required=False)
    for ok, name, detail in results:
        mark = {True: "OK  ", False: "FAIL", None: "WARN"}[ok]
        print(f"[{mark}] {name:16s} {detail}")
    failed = [name for ok, name, _ in results if ok is False]
    print("\nAll set: open the lessons (see lessons/README.md)." if not failed
          else f"\nFix {', '.join(failed)} before the workshop.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
