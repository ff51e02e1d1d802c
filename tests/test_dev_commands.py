"""dev.py's commands: `test` (the suite, then for whole-suite runs the fast-path tests on other BLAS kernels;
`--quick`, a sample with every module imported), and torch from PyTorch's CPU index first with a quick fallback
(the install and the wheelhouse, devkit/; pip is never started here: subprocess.run is a fake)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import dev
from devkit import torch_index, wheelhouse


def test_the_whole_suite_also_runs_the_fast_path_tests_on_mkl_avx2_kernels():
    (suite, suite_env), (fast, fast_env) = dev.test_commands([])
    assert suite[1:] == ["-m", "pytest", "-q"] and suite_env == {}
    assert fast_env == {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    assert fast[fast.index("-k") + 1] == "threads1 or threads2"            # the tests that run at 1 and 2 threads
    for path in dev.FAST_PATH_TESTS:
        assert path in fast and "torch_threads" in (dev.ROOT / path).read_text(), path


def test_a_run_with_pytest_arguments_is_only_that_run():
    ((argv, env),) = dev.test_commands(["-x", "tests/test_moe.py"])
    assert argv[-2:] == ["-x", "tests/test_moe.py"] and env == {}


# ---------------------------------------------------------------------------- torch: PyTorch's CPU index first
CLOSED_INDEX = "http://127.0.0.1:9/simple"      # the discard port, closed: an index that cannot be reached


class FakeRun:
    """subprocess.run for dev.py: records each argv and answers with the next return code (no pip is started)."""

    def __init__(self, *codes: int, report=None):
        self.codes, self.calls, self.report = list(codes), [], report

    def __call__(self, argv, *args, **kwargs):
        self.calls.append(list(argv))
        code = self.codes.pop(0)
        if code == 0 and self.report is not None and "--report" in argv:
            Path(argv[argv.index("--report") + 1]).write_text(json.dumps(self.report))
        return subprocess.CompletedProcess(argv, code, stdout="", stderr="ERROR: No matching distribution found")


def assert_one_quick_try(argv, index=CLOSED_INDEX):
    """A pip command that asks `index` once, briefly: no retries, a timeout of seconds (pip's defaults: 5 retries
    with back-off at 15 s each, minutes before a fallback could start)."""
    assert argv[argv.index("--index-url") + 1] == index
    assert argv[argv.index("--retries") + 1] == "0"
    assert 1 <= int(argv[argv.index("--timeout") + 1]) <= 15


def test_torch_comes_from_the_cpu_index_first_and_nothing_else_when_that_works(monkeypatch, capsys):
    monkeypatch.setattr(torch_index, "TORCH_CPU_INDEX", CLOSED_INDEX)
    run = FakeRun(0)
    monkeypatch.setattr(dev.subprocess, "run", run)
    dev.install_torch(["pip", "install"])
    (argv,) = run.calls
    assert_one_quick_try(argv)
    assert argv[-1] == dev.TORCH and capsys.readouterr().out == ""


def test_an_unreachable_cpu_index_is_one_line_then_the_default_index_at_once(monkeypatch, capsys):
    monkeypatch.setattr(torch_index, "TORCH_CPU_INDEX", CLOSED_INDEX)
    run = FakeRun(1, 0)
    monkeypatch.setattr(dev.subprocess, "run", run)
    dev.install_torch(["pip", "install"])
    first, second = run.calls
    assert_one_quick_try(first)
    assert second == ["pip", "install", dev.TORCH]                      # the default index: no --index-url
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and f"CPU index ({CLOSED_INDEX}) could not be reached" in lines[0]
    assert "default index" in lines[0] and "CUDA" in lines[0]           # what the fallback may cost on Linux


def test_an_unreachable_cpu_index_costs_seconds_with_a_real_pip(monkeypatch, tmp_path):
    """Issue 35: "an unreachable index must cost seconds, not minutes". A real pip (no fake) asks a closed local port
    with dev.py's own options for the CPU index and gives up at once, so the fallback can start. --isolated: no
    pip.conf or PIP_* variable of this machine (a local wheel, another index) answers in the index's place."""
    import time

    monkeypatch.setattr(torch_index, "TORCH_CPU_INDEX", CLOSED_INDEX)
    argv = [sys.executable, "-m", "pip", "download", "--isolated", "--no-cache-dir", "--no-deps", "-d", str(tmp_path),
            *torch_index.cpu_index_options(), torch_index.TORCH]
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - start
    assert done.returncode != 0, done.stdout[-1000:]
    assert seconds < 30, f"pip took {seconds:.0f} s to give up on an unreachable index"


def test_the_wheelhouse_fetches_torch_the_same_way(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch_index, "TORCH_CPU_INDEX", CLOSED_INDEX)
    monkeypatch.setattr(wheelhouse, "_this_platform", lambda: "windows-x86_64")
    torch_cmd, _ = wheelhouse.wheelhouse_commands(tmp_path, "windows-x86_64", "3.11")
    assert_one_quick_try(torch_cmd)
    assert torch_cmd[-1] == "torch==2.13.0+cpu"
    run = FakeRun(0)
    monkeypatch.setattr(dev.subprocess, "run", run)
    assert wheelhouse.fetch_torch(torch_cmd, "windows-x86_64", tmp_path) and len(run.calls) == 1
    assert (tmp_path / "constraints.txt").read_text() == "torch==2.13.0+cpu\n"
    # unreachable: one line, then at once the default index, whose Windows torch is CPU-only (unlabelled)
    run = FakeRun(1, 0)
    monkeypatch.setattr(dev.subprocess, "run", run)
    assert wheelhouse.fetch_torch(torch_cmd, "windows-x86_64", tmp_path)
    fallback = run.calls[1]
    assert "--index-url" not in fallback and "--retries" not in fallback and fallback[-1] == "torch==2.13.0"
    assert fallback[:fallback.index("--no-deps") + 1] == torch_cmd[:torch_cmd.index("--no-deps") + 1]
    assert (tmp_path / "constraints.txt").read_text() == "torch==2.13.0\n"
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "could not be reached" in lines[0] and "using the default index" in lines[0]


@pytest.mark.parametrize("platform, why", [("linux-x86_64", "CUDA build"), ("macos-arm64", "not for macos-arm64")])
def test_the_wheelhouse_does_not_fall_back_where_the_default_index_would_be_wrong(monkeypatch, tmp_path, capsys,
                                                                                   platform, why):
    monkeypatch.setattr(wheelhouse, "_this_platform", lambda: "windows-x86_64")     # macOS: built on another platform
    torch_cmd, _ = wheelhouse.wheelhouse_commands(tmp_path, platform, "3.11")
    run = FakeRun(1)
    monkeypatch.setattr(dev.subprocess, "run", run)
    assert not wheelhouse.fetch_torch(torch_cmd, platform, tmp_path) and len(run.calls) == 1
    assert not (tmp_path / "constraints.txt").exists()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "no fallback" in lines[0] and why in lines[0]


def test_the_dry_run_lists_each_wheel_with_its_size_and_the_total(monkeypatch, tmp_path, capsys):
    big, small = tmp_path / "torch-2.13.0+cpu-cp311-none-win_amd64.whl", tmp_path / "rich-15.0.0-py3-none-any.whl"
    big.write_bytes(b"x" * 3_000_000)
    small.write_bytes(b"x" * 1_000_000)
    urls = [small.as_uri(), big.as_uri(), (tmp_path / "gone-1.0-py3-none-any.whl").as_uri()]
    report = {"install": [{"download_info": {"url": url}} for url in urls]}
    monkeypatch.setattr(torch_index, "TORCH_CPU_INDEX", CLOSED_INDEX)
    monkeypatch.setattr(wheelhouse, "_this_platform", lambda: "windows-x86_64")
    run = FakeRun(0, report=report)
    monkeypatch.setattr(dev.subprocess, "run", run)
    assert wheelhouse.print_kit_sizes("windows-x86_64", "3.11") == 0
    (argv,) = run.calls
    assert "--dry-run" in argv and argv[argv.index("--extra-index-url") + 1] == CLOSED_INDEX
    assert argv[argv.index("--retries") + 1] == "0" and "torch==2.13.0+cpu" in argv and "pywinpty>=2.0.1" in argv
    lines = capsys.readouterr().out.splitlines()
    assert "3.0 MB" in lines[0] and big.name in lines[0] and "1.0 MB" in lines[1] and small.name in lines[1]
    assert "size ?" in lines[2]
    assert lines[-1].startswith("[dev.py] 3 wheels, 4 MB") and "1 sizes unknown" in lines[-1]
    # the CPU index unreachable: one line, then the default index's torch (this machine's platform: CPU-only)
    run = FakeRun(1, 0, report=report)
    monkeypatch.setattr(dev.subprocess, "run", run)
    assert wheelhouse.print_kit_sizes("windows-x86_64", "3.11") == 0
    assert "--extra-index-url" not in run.calls[1] and "torch==2.13.0" in run.calls[1]
    out = capsys.readouterr().out.splitlines()
    assert "could not be reached" in out[0] and "trying the default index" in out[0] and "3 wheels" in out[-1]
    run = FakeRun(1)                                             # Linux: no fallback to a CUDA torch, no sizes
    monkeypatch.setattr(dev.subprocess, "run", run)
    assert wheelhouse.print_kit_sizes("linux-x86_64", "3.11") == 0 and len(run.calls) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "no fallback" in out[0] and "no sizes" in out[1]


# ---------------------------------------------------------------------------- the quick tier
def test_the_quick_tier_is_one_run_of_its_selection_and_ci_keeps_the_whole_suite():
    ((argv, env),) = dev.test_commands(["--quick"])
    assert argv[1:4] == ["-m", "pytest", "-q"] and tuple(argv[4:]) == dev.QUICK_TESTS and env == {}
    ((argv, _),) = dev.test_commands(["--quick", "-x"])
    assert argv[-1] == "-x" and "--quick" not in argv
    ci = (dev.ROOT / ".ci" / "run").read_text()
    assert "python3 dev.py test\n" in ci and "--quick" not in ci            # CI runs the whole suite
    readme = (dev.ROOT / "README.md").read_text()
    assert "python3 dev.py test --quick" in readme and "python3 dev.py test " in readme


def test_the_quick_selection_exists_and_has_an_import_all_a_lesson_and_a_tui_pilot_test():
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *dev.QUICK_TESTS], cwd=dev.ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    collected = [line for line in out.stdout.splitlines() if "::" in line]
    for wanted in ("tests/test_dev_commands.py::test_every_module_imports",
                   "tests/test_lessons.py::test_lesson_runs_top_to_bottom_for_learners_and_instructors[",
                   "tests/test_tui.py::test_opens_steps_forward_and_back"):
        assert any(line.startswith(wanted) for line in collected), wanted
    lessons = [line for line in collected if line.startswith("tests/test_lessons.py")]
    assert len(lessons) == 1, lessons                                    # one lesson, not all nine
    assert "nbclient" in (dev.ROOT / "tests" / "test_lessons.py").read_text()       # in a real Jupyter kernel
    tui = (dev.ROOT / "tests" / "test_tui.py").read_text()
    body = tui[tui.index("async def test_opens_steps_forward_and_back"):][:1500]
    assert "run_test(" in body or "pilot" in body                        # a Pilot drives the real app
    assert len(collected) < 400, len(collected)                          # a sample, not the suite


def test_every_module_imports():
    """Every module of the project imports in a fresh interpreter: tiny_k3, sim, tui_app, devkit, tui.py, dev.py, the
    lessons' helpers (not the notebooks, which run when imported) and bench/. The `__main__` entry points are
    compiled, not run. A broken import anywhere fails here, not only where some test happens to reach."""
    script = r'''
import importlib, pathlib, sys
root = pathlib.Path.cwd()
sys.path[:0] = [str(root), str(root / "lessons"), str(root / "bench")]
names, failed = ["tui", "dev"], []
for folder, package in (("tiny_k3", True), ("sim", True), ("tui_app", True), ("devkit", True), ("lessons", False),
                        ("bench", False)):
    base = root if package else root / folder
    for path in sorted((root / folder).rglob("*.py")):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if folder == "lessons" and parts[0][:2].isdigit():
            continue                                       # a lesson notebook: tests/test_lessons.py runs it
        if parts[-1] == "__main__":
            compile(path.read_text(), str(path), "exec")
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
for name in names:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
print(len(names))
print("\n".join(failed))
'''
    out = subprocess.run([sys.executable, "-c", script], cwd=dev.ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    count, *failed = out.stdout.strip().splitlines()
    assert not failed, "\n".join(failed)
    assert int(count) >= 100                           # every package was walked (121 modules when written)
