"""Every lesson is also a plain Python script: `python lessons/0N_*.py` runs it top to bottom.

A jupytext py:percent file keeps its markdown in `# ` comments, so one lost `# ` (a table row, a formula) makes
the file invalid Python while jupytext still reads it as a notebook; tests/test_lessons.py, which executes the
notebooks, would not notice. Here each lesson file is parsed, then run as a script in a fresh interpreter from
the repository root, in the learner's mode (every exercise prints "not done yet") and in the instructor's
(TINY_K3_SOLUTIONS=1: every check passes). A script run draws off-screen (workshop.py picks Agg) and calls
show_step once where a notebook shows the slider. The glob takes every lesson there is, so a new one is covered
the day it lands. Each run's wall time is printed (pytest -s); timings are not asserted.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "lessons").glob("0[0-9]_*.py"))
SCRIPT_TIMEOUT_S = 600          # a hang guard for a loaded 2-core machine, not a budget


def test_there_are_lessons_to_run():
    assert len(LESSONS) >= 7, f"expected at least lessons 01-07 in lessons/, found {[p.name for p in LESSONS]}"


@pytest.mark.parametrize("path", LESSONS, ids=[p.name for p in LESSONS])
def test_lesson_file_is_valid_python(path):
    source = path.read_text()
    try:
        ast.parse(source, filename=str(path))
    except SyntaxError as exc:        # the usual cause: a markdown line that lost its leading "# "
        line = source.splitlines()[exc.lineno - 1] if exc.lineno else ""
        pytest.fail(f"lessons/{path.name}:{exc.lineno} is not Python ({exc.msg}): {line!r} "
                    "(a markdown line in a py:percent file must start with '# ')")


def _run(path: Path, solutions: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TINY_K3_SOLUTIONS", "MPLBACKEND")}
    env.setdefault("OMP_NUM_THREADS", "1")               # the lessons' own setting in a kernel (TINY_K3_THREADS=1)
    env["PYTHONWARNINGS"] = "default"                    # every warning reaches stderr, once
    env["TINY_K3_LESSON_FAST"] = "1"                     # lesson 8 trains 48 steps, not its two-minute run
    if solutions:
        env["TINY_K3_SOLUTIONS"] = "1"
    return subprocess.run([sys.executable, str(path.relative_to(ROOT))], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=SCRIPT_TIMEOUT_S)


@pytest.mark.parametrize("mode", ["learner", "instructor"])
@pytest.mark.parametrize("path", LESSONS, ids=[p.name for p in LESSONS])
def test_lesson_runs_as_a_script(path, mode):
    start = time.perf_counter()
    done = _run(path, solutions=mode == "instructor")
    print(f"\n  python lessons/{path.name} ({mode}): {time.perf_counter() - start:.1f} s")
    assert done.returncode == 0, f"python lessons/{path.name} ({mode}) exited {done.returncode}:\n{done.stderr[-3000:]}"
    warned = [line for line in done.stderr.splitlines() if "Warning" in line]
    assert not warned, f"lessons/{path.name} ({mode}) warned: {warned[:3]}"
    out = done.stdout
    if mode == "learner":
        assert "not done yet" in out and " passed: " not in out, f"{path.name}: a learner's stub passed or said nothing"
    else:
        assert " passed: " in out and "not done yet" not in out and "✗" not in out, \
            f"{path.name}: in instructor mode every check passes:\n{out[-2000:]}"
