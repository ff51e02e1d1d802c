"""The workshop kit (20 laptops, no network in the room, no GPU; lessons/INSTRUCTOR.md): a wheelhouse of CPU-only
wheels per platform (`python3 dev.py wheelhouse DIR`, `--dry-run` lists the wheels and sizes) and the offline
set-up from it (`python3 dev.py setup --offline DIR`)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import venv
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import unquote, urlparse
from urllib.request import Request, url2pathname, urlopen

from . import torch_index                  # its TORCH_CPU_INDEX is read at call time: tests point it elsewhere
from .paths import PYTHON, ROOT, VENV
from .torch_index import CPU_INDEX_FAILED, INDEX_TIMEOUT_S, TORCH, cpu_index_options

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
        print(CPU_INDEX_FAILED.format(torch_index.TORCH_CPU_INDEX, wanted,
                                      f"{reason}." if reason else "using the default index."))
        start = command.index("--index-url")
        fallback = command[:start] + command[start + len(cpu_index_options()):-1] + [TORCH]
        wanted = TORCH if not reason and subprocess.run(fallback).returncode == 0 else None
    if wanted:
        (dest / "constraints.txt").write_text(wanted + "\n")
    return wanted is not None


def resolve_kit(platform: str, python: str, torch: str, cpu_index: bool) -> tuple[list[str], str]:
    """(the URL of every wheel the kit needs as pip resolves them now, pip's first error): pip install --dry-run
    --report downloads nothing; no URLs when it fails or takes over RESOLVE_TIMEOUT_S (a stalled index)."""
    index = ["--extra-index-url", torch_index.TORCH_CPU_INDEX] if cpu_index else []
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
        print(CPU_INDEX_FAILED.format(torch_index.TORCH_CPU_INDEX, torch,
                                      f"{reason}." if reason else "trying the default index."))
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
    print(f"[dev.py] wheelhouse for {args.platform}, Python {args.python}: {commands[0][-1]} from "
          f"{torch_index.TORCH_CPU_INDEX}, then {len(reqs)} requirements from the default index: {', '.join(reqs)}")
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
