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
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import venv
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import unquote, urlparse
from urllib.request import Request, url2pathname, urlopen

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PYTHON = VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
STAMP = VENV / ".tiny-k3-installed"
TORCH = "torch==2.13.0"


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


# ---------------------------------------------------------------------------- workshop kit (offline set-up)

# pip tags per named platform. torch's CPU builds carry the local label +cpu on Linux and Windows; macOS
# wheels are CPU-only and unlabelled. Wheels for older manylinux tags install on newer systems too.
PLATFORMS = {
    "linux-x86_64": (["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64"], "+cpu"),
    "linux-aarch64": (["manylinux_2_28_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64"], ""),
    "macos-arm64": (["macosx_14_0_arm64", "macosx_13_0_arm64", "macosx_12_0_arm64", "macosx_11_0_arm64"], ""),
    "windows-x86_64": (["win_amd64"], "+cpu"),
}
# pip evaluates environment markers (sys_platform == "win32", ...) for the machine it runs on, not for --platform:
# the packages a target platform needs only through such markers are named here.
PLATFORM_EXTRAS = {"windows-x86_64": ["pywinpty>=2.0.1", "colorama"], "macos-arm64": ["appnope"]}
KIT_TOOLS = ("setuptools>=68", "wheel")   # what `pip install -e` builds the project with, offline too
KIT_EXTRAS = ("lessons",)      # the lessons' stack (jupyterlab included); the TUI's textual is a core dependency
CUDA_MARKERS = ("nvidia_", "nvidia-", "+cu", "triton")
RESOLVE_TIMEOUT_S = 90                      # a dry run's whole resolution, so a stalled index cannot hang it


def _this_platform() -> str:
    import platform

    machine = platform.machine().lower()
    if sys.platform.startswith("win"):
        return "windows-x86_64"
    if sys.platform == "darwin":
        return "macos-arm64"
    return "linux-aarch64" if machine in ("aarch64", "arm64") else "linux-x86_64"


def _kit_requirements() -> list[str]:
    """The project's runtime dependencies and its lessons extra, without torch (its CPU wheel is pinned apart).
    Read from pyproject.toml with a regex: tomllib is Python 3.11+, and dev.py runs on 3.10."""
    import re

    text = (ROOT / "pyproject.toml").read_text()
    reqs = []
    for key in ("dependencies", *KIT_EXTRAS):
        block = re.search(rf"^{key} = \[(.*?)\]", text, re.M | re.S)
        if block is None:
            raise RuntimeError(f"pyproject.toml has no `{key} = [...]` list")
        reqs += re.findall(r'"([^"]+)"', block.group(1))
    return [r for r in reqs if not r.startswith(("torch", "tiny-k3"))]


def target_options(platform: str, python: str) -> list[str]:
    """pip's options that fetch wheels for `platform` and Python `python` (e.g. "3.11") from any machine."""
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; use one of: {', '.join(PLATFORMS)}.")
    target = [a for tag in PLATFORMS[platform][0] for a in ("--platform", tag)]
    return target + ["--python-version", python, "--implementation", "cp", "--only-binary=:all:"]


def wheelhouse_commands(dest: Path, platform: str, python: str) -> list[list[str]]:
    """The pip commands that fill `dest` with CPU-only wheels for `platform` and Python `python`: torch from
    PyTorch's CPU index (one quick try: cpu_index_options), then the rest from the default index."""
    target = target_options(platform, python)
    pip = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--dest", str(dest)]
    return [
        pip + target + ["--no-deps", *cpu_index_options(), f"{TORCH}{PLATFORMS[platform][1]}"],
        # torch's own dependencies and everything else; the constraint keeps torch the wheel fetched first
        pip + target + ["--find-links", str(dest), "--constraint", str(dest / "constraints.txt"),
                        "--requirement", str(dest / "requirements.txt"), "torch", *KIT_TOOLS,
                        *PLATFORM_EXTRAS.get(platform, [])],
    ]


def no_fallback(platform: str) -> str | None:
    """Why the default index cannot stand in for PyTorch's CPU index in a wheelhouse for `platform`, or None."""
    if platform.startswith("linux"):
        return f"no fallback for {platform}, where the default index's torch is (or may be) a CUDA build"
    if platform != _this_platform():     # torch's Linux-only CUDA dependencies would be read for this machine
        return f"no fallback: pip reads the default index's torch for this machine, not for {platform}"
    return None


def fetch_torch(command: list[str], platform: str, dest: Path) -> bool:
    """Run the torch download `command`; when PyTorch's CPU index gives nothing, say so in one line and fall back
    at once to the default index where its torch is CPU-only too (macOS and Windows, built there). The torch
    fetched goes into dest/constraints.txt, which keeps the second command on it; False when none was fetched."""
    wanted, reason = command[-1], no_fallback(platform)
    if subprocess.run(command).returncode != 0:
        print(CPU_INDEX_FAILED.format(TORCH_CPU_INDEX, wanted, f"{reason}." if reason else "using the default index."))
        start = command.index("--index-url")
        fallback = command[:start] + command[start + len(cpu_index_options()):-1] + [TORCH]
        wanted = TORCH if not reason and subprocess.run(fallback).returncode == 0 else None
    if wanted:
        (dest / "constraints.txt").write_text(wanted + "\n")
    return wanted is not None


def resolve_kit(platform: str, python: str, torch: str, cpu_index: bool) -> tuple[list[str], str]:
    """(the URL of every wheel the kit needs as pip resolves them now, pip's first error): pip install --dry-run
    --report downloads nothing; no URLs when it fails or takes over RESOLVE_TIMEOUT_S (a stalled index)."""
    index = ["--extra-index-url", TORCH_CPU_INDEX] if cpu_index else []
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                   "--disable-pip-version-check", "--report", str(report), "--target", str(Path(tmp) / "t"),
                   *target_options(platform, python), *index, "--retries", "0", "--timeout", str(INDEX_TIMEOUT_S),
                   torch, *_kit_requirements(), *KIT_TOOLS, *PLATFORM_EXTRAS.get(platform, [])]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return [], f"no answer in {RESOLVE_TIMEOUT_S} s"
        if done.returncode != 0 or not report.exists():
            return [], ([line for line in done.stderr.splitlines() if line.startswith("ERROR")] or ["no report"])[0]
        return [item["download_info"]["url"] for item in json.loads(report.read_text())["install"]], ""


def wheel_size(url: str) -> int | None:
    """A wheel's bytes, not downloading it: a local file's size, else an HTTP HEAD's Content-Length (or None)."""
    try:
        if url.startswith("file:"):
            return Path(url2pathname(urlparse(url).path)).stat().st_size
        with urlopen(Request(url, method="HEAD"), timeout=INDEX_TIMEOUT_S) as answer:
            return int(answer.headers["Content-Length"])
    except (OSError, ValueError, TypeError):
        return None


def print_kit_sizes(platform: str, python: str) -> int:
    """The dry run's list: each wheel pip would fetch for `platform` (torch as a real run fetches it), its size and
    the total; nothing is downloaded. 0, sized or not: the commands a real run makes are printed either way."""
    torch, reason = f"{TORCH}{PLATFORMS[platform][1]}", no_fallback(platform)
    urls, error = resolve_kit(platform, python, torch, cpu_index=True)
    if not urls:
        print(CPU_INDEX_FAILED.format(TORCH_CPU_INDEX, torch, f"{reason}." if reason else "trying the default index."))
        urls, error = ([], "") if reason else resolve_kit(platform, python, TORCH, cpu_index=False)
    if not urls:
        print(f"[dev.py] no sizes: pip could not resolve the wheels from here{f' ({error})' if error else ''}.")
        return 0
    with ThreadPoolExecutor(16) as pool:
        sizes = list(pool.map(wheel_size, urls))
    for url, size in sorted(zip(urls, sizes), key=lambda pair: -(pair[1] or 0)):     # the largest first
        print(f"  {f'{size / 1e6:7.1f} MB' if size is not None else '   size ?'}  {unquote(url.rsplit('/', 1)[-1])}"
              f"  from {urlparse(url).hostname or 'a local file (pip configuration)'}")
    print(f"[dev.py] {len(urls)} wheels, {sum(s or 0 for s in sizes) / 1e6:.0f} MB as pip resolves them now"
          f"{f' ({sizes.count(None)} sizes unknown, not counted)' if None in sizes else ''}; nothing was downloaded.")
    return 0


def wheelhouse(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dev.py wheelhouse", description="Download every wheel the lessons and "
                                     "the TUI need into DIR, for one platform, CPU-only torch.")
    parser.add_argument("dir", type=Path)
    parser.add_argument("--platform", default=_this_platform(), help=f"one of {', '.join(PLATFORMS)} "
                        "(default: this machine)")
    parser.add_argument("--python", default=f"{sys.version_info.major}.{sys.version_info.minor}",
                        help="the learners' Python version, e.g. 3.11 (default: this one)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, then the wheels pip would "
                        "fetch with their sizes (asks the indexes), download nothing")
    args = parser.parse_args(argv)
    try:
        commands = wheelhouse_commands(args.dir.resolve(), args.platform, args.python)
    except ValueError as exc:
        print(f"[dev.py] {exc}", file=sys.stderr)
        return 2
    reqs = _kit_requirements()
    print(f"[dev.py] wheelhouse for {args.platform}, Python {args.python}: {commands[0][-1]} from {TORCH_CPU_INDEX}, "
          f"then {len(reqs)} requirements from the default index: {', '.join(reqs)}")
    for command in commands:
        print("  " + " ".join(command[2:]))
    if args.dry_run:
        return print_kit_sizes(args.platform, args.python)
    return fill_wheelhouse(args.dir, args.platform, commands, reqs)


def fill_wheelhouse(dest: Path, platform: str, commands: list[list[str]], reqs: list[str]) -> int:
    """Run the wheelhouse commands into `dest` (torch first, with its fallback), then refuse any CUDA wheel."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "requirements.txt").write_text("\n".join(reqs) + "\n")
    if not fetch_torch(commands[0], platform, dest) or subprocess.run(commands[1]).returncode != 0:
        print("[dev.py] a download failed (network, or no wheel for this platform/Python); see above.", file=sys.stderr)
        return 1
    cuda = [p.name for p in dest.iterdir() if any(m in p.name for m in CUDA_MARKERS)]
    if cuda:
        print(f"[dev.py] CUDA wheels got in ({', '.join(cuda)}); delete them: the workshop is CPU-only.",
              file=sys.stderr)
        return 1
    size = sum(p.stat().st_size for p in dest.glob("*.whl"))
    print(f"[dev.py] {len(list(dest.glob('*.whl')))} wheels, {size / 1e6:.0f} MB in {dest}; on each laptop: "
          f"python3 dev.py setup --offline {dest}")
    return 0


def setup_offline(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dev.py setup --offline", description="Create .venv and install the "
                                     "lessons and the TUI from a wheelhouse, with no network.")
    parser.add_argument("--offline", type=Path, required=True, metavar="DIR")
    args = parser.parse_args(argv)
    wheels = args.offline.resolve()
    if not any(wheels.glob("torch-*.whl")):
        print(f"[dev.py] {wheels} holds no torch wheel; fill it first with `python3 dev.py wheelhouse {wheels}` "
              "on a machine with network.", file=sys.stderr)
        return 2
    if not PYTHON.exists():
        print("[dev.py] creating .venv ...", flush=True)
        venv.create(VENV, with_pip=True)
    pip = [str(PYTHON), "-m", "pip", "install", "--disable-pip-version-check", "--no-index", "--find-links", str(wheels)]
    constraints = ["--constraint", str(wheels / "constraints.txt")] if (wheels / "constraints.txt").exists() else []
    print(f"[dev.py] installing torch (CPU) and tiny-k3 with its lessons extra from {wheels}, offline ...", flush=True)
    steps = [pip + constraints + ["torch"], pip + constraints + ["-e", f"{ROOT}[{','.join(KIT_EXTRAS)}]"]]
    for step in steps:
        if subprocess.run(step).returncode != 0:
            print("[dev.py] the offline install failed: the wheelhouse lacks a package for this platform or Python "
                  "(see above); rebuild it with --platform/--python for this laptop.", file=sys.stderr)
            return 1
    print(f"[dev.py] done; check with: {PYTHON.relative_to(ROOT)} lessons/setup_check.py")
    return 0


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


# The fast-path tests (each at 1 and 2 threads: tests/conftest.py's torch_threads) once more with Intel MKL held
# to its AVX2 kernels. On an AVX-512 machine, as CI's is, that is the rounding another CPU's BLAS gives: the
# fused and separate router products of issue 24 differed by 6e-16 on an AVX-512 EPYC and differ so here.
# MKL reads the variable when it loads, hence a second process; a torch without MKL ignores it.
FAST_PATH_TESTS = ("tests/test_moe.py", "tests/test_fast_paths.py", "tests/test_decode_paths.py")
OTHER_KERNELS = {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}


# `python3 dev.py test --quick`: a first check in a few minutes, not CI's (CI and `dev.py test` run the whole
# suite): every module imported (test_dev_commands.py), the core maths, one lesson in a real Jupyter kernel, one
# Pilot test of the TUI. tests/test_dev_commands.py checks that each part is there.
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
