"""A learner's copy of the repository (`python3 dev.py bundle DIR`): what git tracks, without the solutions, the
instructor's guide and the tests, with a README written for learners."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .paths import ROOT

BUNDLE_EXCLUDED = ("lessons/solutions/", "lessons/INSTRUCTOR.md", "tests/")   # the learner's copy has no answers


def bundle_files() -> list[str]:
    """Repository paths a learner's copy holds: what git tracks (or, outside git, the tree), minus the answers."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "__pycache__", ".pytest_cache", ".ipynb_checkpoints"}
        listed = [str(p.relative_to(ROOT)).replace(os.sep, "/") for p in ROOT.rglob("*")
                  if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]
    return sorted(f for f in listed if not f.startswith(BUNDLE_EXCLUDED) and (ROOT / f).is_file())


LEARNER_README = """# tiny-k3 — the workshop copy

A step-through simulator of a Kimi K3-style model, and {count} lessons that use it. Everything runs on your
laptop's CPU, offline.

## Set up (once)

```bash
python3 dev.py setup --offline wheelhouse   # creates .venv from the wheelhouse folder in this copy, no network
.venv/bin/python lessons/setup_check.py     # one line per check; "All set" when you are ready
```

Windows: `py dev.py setup --offline wheelhouse`, then `.venv\\Scripts\\python.exe lessons\\setup_check.py`.
No `wheelhouse/` folder here? With network, `python3 dev.py setup` fetches the same packages.

## The lessons

```bash
.venv/bin/jupytext --to ipynb lessons/0*.py     # the notebooks (the .py files are the source)
.venv/bin/jupyter lab lessons/
```

Windows (cmd): `for %f in (lessons\\0*.py) do .venv\\Scripts\\jupytext.exe --to ipynb %f`, then
`.venv\\Scripts\\jupyter.exe lab lessons`.

{lessons}

Each exercise cell prints what its check expects until you fill it in; `hint("1.1")` gives the idea, more
rungs follow with `hint("1.1", 2)`. `lessons/README.md` has the details: what each lesson shows, the
exercises and the mistakes their checks recognise.

## The simulator beside the notebooks

```bash
python3 dev.py run          # the step-through TUI (a terminal of at least 120 x 36)
```

`n` next token, `b` back, `i` step into a token's sublayers, `1`-`4` the panels, `?` help, `q` quit.
"""


def learner_readme(root: Path = ROOT) -> str:
    """The README.md of a learner's copy: set-up, the lessons found in root/lessons (one line each, from each
    lesson's title), the TUI; nothing about the test suite, the solutions or the instructor's guide."""
    lessons = sorted((root / "lessons").glob("0[0-9]_*.py"))
    lines = []
    for path in lessons:
        title = next((line[4:].strip() for line in path.read_text(encoding="utf-8").splitlines()
                      if line.startswith("# # ")), path.stem)
        lines.append(f"- `lessons/{path.name}`: {title}")
    words = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}
    return LEARNER_README.format(count=words.get(len(lessons), str(len(lessons))), lessons="\n".join(lines))


def bundle(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dev.py bundle", description="Write a learner's copy of the repository "
                                     "to DIR: no lessons/solutions/, no instructor guide, no tests.")
    parser.add_argument("dir", type=Path)
    parser.add_argument("--wheelhouse", type=Path, help="also copy this wheelhouse into DIR/wheelhouse")
    args = parser.parse_args(argv)
    dest = args.dir.resolve()
    if dest == ROOT or ROOT in dest.parents:
        print(f"[dev.py] {dest} is inside the repository; write the bundle somewhere else.", file=sys.stderr)
        return 2
    if dest.exists() and any(dest.iterdir()):
        print(f"[dev.py] {dest} is not empty; give a new or empty folder.", file=sys.stderr)
        return 2
    files = bundle_files()
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    (dest / "README.md").write_text(learner_readme(), encoding="utf-8")   # the repository's README is for developers
    if args.wheelhouse:
        shutil.copytree(args.wheelhouse, dest / "wheelhouse")
    print(f"[dev.py] {len(files)} files in {dest} (without {', '.join(BUNDLE_EXCLUDED)})"
          + (f", wheels in {dest / 'wheelhouse'}" if args.wheelhouse else ""))
    return 0
