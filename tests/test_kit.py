"""The workshop kit (dev.py, devkit/): a wheelhouse of CPU-only wheels per platform (the dry run with its index
lookup replaced: no network in tests), the offline set-up's refusals, and a learner's bundle without the
solutions."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import dev as dev_module
from devkit import wheelhouse
from devkit.bundle import learner_readme

ROOT = Path(__file__).resolve().parents[1]


def dev(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "dev.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("platform, tags, torch", [
    ("windows-x86_64", ["win_amd64"], "torch==2.13.0+cpu"),
    ("linux-x86_64", ["manylinux_2_28_x86_64", "manylinux2014_x86_64"], "torch==2.13.0+cpu"),
    ("macos-arm64", ["macosx_11_0_arm64"], "torch==2.13.0"),
])
def test_wheelhouse_dry_run_names_the_platform_and_only_cpu_torch(monkeypatch, capsys, tmp_path, platform, tags,
                                                                   torch):
    asked = []

    def unreachable_index(platform, python, torch, cpu_index):      # pip's resolution, as if no index answered
        asked.append(torch)
        return [], "no index in tests"

    monkeypatch.setattr(wheelhouse, "resolve_kit", unreachable_index)
    code = dev_module.main(["wheelhouse", str(tmp_path / "wh"), "--platform", platform, "--python", "3.11",
                            "--dry-run"])
    assert code == 0
    text = capsys.readouterr().out
    assert asked[0] == torch and "no sizes" in text             # the sizes were looked up, the commands printed
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
    for needed in ("dev.py", "devkit/__init__.py", "devkit/wheelhouse.py", "devkit/bundle.py", "pyproject.toml",
                   "lessons/workshop.py", "lessons/setup_check.py", "lessons/checks/__init__.py", "lessons/01_sixteen_of_896.py", "docs/k3_facts.md", "tui.py"):
        assert needed in files, needed
    assert any(f.startswith("tiny_k3/weights/") and f.endswith(".safetensors") for f in files)
    solutions = [p.read_text() for p in (ROOT / "lessons" / "solutions").glob("lesson*.py")]
    body = solutions[0].split('"""', 2)[2].strip().splitlines()[-1]      # a line of a reference solution
    assert not any(body in (dest / f).read_text(errors="ignore") for f in files if f.endswith(".py"))
    for readme in ("README.md", "lessons/README.md"):        # what a learner reads first speaks to learners only
        text = (dest / readme).read_text()
        for absent in ("dev.py test", "tests/", "INSTRUCTOR", "solutions/", "TINY_K3_SOLUTIONS", "pytest"):
            assert absent not in text, f"the learners' {readme} mentions {absent!r}, which their copy does not have"
        named = set(re.findall(r"`((?:lessons|docs)/[\w./-]+\.(?:py|md))`", text))
        assert all((dest / path).is_file() for path in named), (readme, sorted(named))   # it points at what is there
        assert named or readme != "README.md", "the bundle's README names the lesson files"
    assert (dest / "README.md").read_text() == learner_readme_of(dest)
    again = dev("bundle", str(dest))
    assert again.returncode == 2 and "is not empty" in again.stderr


def learner_readme_of(root: Path) -> str:
    return learner_readme(root)


def test_the_learners_readme_lists_every_lesson_and_counts_them(tmp_path):
    """The bundle's README names each lesson file once, with the title its first heading gives, and its count word
    is the number of lessons; lessons/README.md's table has one row per lesson file and says the same count."""
    (tmp_path / "lessons").mkdir()
    for name, title in (("01_a.py", "Lesson 1 — A"), ("02_b.py", "Lesson 2 — B"), ("03_c.py", "Lesson 3 — C")):
        (tmp_path / "lessons" / name).write_text(f"# %% [markdown]\n# # {title}\n")
    text = learner_readme(tmp_path)
    assert "and three lessons that use it" in text
    assert [line for line in text.splitlines() if line.startswith("- `lessons/")] == [
        "- `lessons/01_a.py`: Lesson 1 — A", "- `lessons/02_b.py`: Lesson 2 — B", "- `lessons/03_c.py`: Lesson 3 — C"]
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    lessons = sorted(p.name for p in (ROOT / "lessons").glob("0[0-9]_*.py"))
    guide = (ROOT / "lessons" / "README.md").read_text()
    rows = re.findall(r"^\| \d+ \| `(0\d_\w+\.py)` \|", guide, re.M)
    assert rows == lessons, f"lessons/README.md's table lists {rows}; lessons/ has {lessons}"
    assert guide.split("\n\n")[1].lower().startswith(f"{words[len(lessons)]} lessons"), guide[:200]


def test_bundle_refuses_a_folder_inside_the_repository():
    out = dev("bundle", str(ROOT / "lessons" / "copy"))
    assert out.returncode == 2 and "inside the repository" in out.stderr
    assert not (ROOT / "lessons" / "copy").exists()
