"""The workshop kit in dev.py: a wheelhouse of CPU-only wheels per platform (dry run: no network in tests), the
offline set-up's refusals, and a learner's bundle without the solutions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def dev(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "dev.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("platform, tags, torch", [
    ("windows-x86_64", ["win_amd64"], "torch==2.13.0+cpu"),
    ("linux-x86_64", ["manylinux_2_28_x86_64", "manylinux2014_x86_64"], "torch==2.13.0+cpu"),
    ("macos-arm64", ["macosx_11_0_arm64"], "torch==2.13.0"),
])
def test_wheelhouse_dry_run_names_the_platform_and_only_cpu_torch(tmp_path, platform, tags, torch):
    out = dev("wheelhouse", str(tmp_path / "wh"), "--platform", platform, "--python", "3.11", "--dry-run")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    commands = [line for line in text.splitlines() if line.strip().startswith("pip download")]
    assert len(commands) == 2, text
    for command in commands:
        for tag in tags:
            assert f"--platform {tag}" in command
        assert "--python-version 3.11" in command and "--only-binary=:all:" in command
    torch_cmd, rest_cmd = commands
    assert "--index-url https://download.pytorch.org/whl/cpu" in torch_cmd and torch_cmd.endswith(torch)
    assert "--no-deps" in torch_cmd
    assert "--constraint" in rest_cmd and "--find-links" in rest_cmd     # torch stays the CPU wheel fetched first
    for needed in ("jupyterlab", "textual==8.2.8", "ipykernel", "matplotlib", "jupytext"):
        assert needed in text
    assert "cu12" not in text and "cu11" not in text and "nvidia" not in text
    assert not (tmp_path / "wh").exists(), "a dry run writes nothing"
    if platform == "windows-x86_64":
        assert "pywinpty" in rest_cmd       # needed there only through a marker pip evaluates for this machine


def test_wheelhouse_and_offline_setup_refuse_bad_input_in_one_sentence(tmp_path):
    out = dev("wheelhouse", str(tmp_path), "--platform", "plan9", "--dry-run")
    assert out.returncode == 2 and "unknown platform 'plan9'; use one of: linux-x86_64" in out.stderr
    assert "Traceback" not in out.stderr
    out = dev("setup", "--offline", str(tmp_path / "empty"))
    assert out.returncode == 2 and "holds no torch wheel" in out.stderr and "Traceback" not in out.stderr


def test_bundle_is_a_learner_copy_without_solutions(tmp_path):
    dest = tmp_path / "learner"
    out = dev("bundle", str(dest))
    assert out.returncode == 0, out.stderr
    files = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}
    assert not any(f.startswith("lessons/solutions") for f in files), "no solution file in the learner's copy"
    assert "lessons/INSTRUCTOR.md" not in files
    for needed in ("dev.py", "pyproject.toml", "lessons/workshop.py", "lessons/setup_check.py",
                   "lessons/checks/__init__.py", "lessons/01_sixteen_of_896.py", "docs/k3_facts.md", "tui.py"):
        assert needed in files, needed
    assert any(f.startswith("tiny_k3/weights/") and f.endswith(".safetensors") for f in files)
    solutions = [p.read_text() for p in (ROOT / "lessons" / "solutions").glob("lesson*.py")]
    body = solutions[0].split('"""', 2)[2].strip().splitlines()[-1]      # a line of a reference solution
    assert not any(body in (dest / f).read_text(errors="ignore") for f in files if f.endswith(".py"))
    again = dev("bundle", str(dest))
    assert again.returncode == 2 and "is not empty" in again.stderr


def test_bundle_refuses_a_folder_inside_the_repository():
    out = dev("bundle", str(ROOT / "lessons" / "copy"))
    assert out.returncode == 2 and "inside the repository" in out.stderr
    assert not (ROOT / "lessons" / "copy").exists()
