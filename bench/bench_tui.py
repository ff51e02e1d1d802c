"""The TUI's latency: `n` keypress to the new step on screen, the warm first frame, a 2,000-byte prompt's load;
and with --startup, `python3 dev.py run` from the shell to its first screen and its first frame.

    python bench/bench_tui.py [--presets small k3-topo] [--presses 15] [--threads 2] [--prompt-bytes 2000]
    python bench/bench_tui.py --startup 5 [--tree DIR ...]      # POSIX: through a pseudo-terminal, nothing else

Driven headless with Textual's Pilot at 160x48. The clock starts before `pilot.press("n")` and stops at the
first screen update that shows the new step, turned into terminal output as a real terminal driver would
(the headless driver skips that part, so this script renders it into a buffer), with the UI idle again.
The look-ahead the driver computes in the background afterwards is not counted: that is the point of it.

--startup runs what a learner types, `python3 dev.py run` (python3 from PATH, .venv already set up), in a
pseudo-terminal of the same size, with OMP_NUM_THREADS and MKL_NUM_THREADS removed as a plain shell has them:
the clock runs from the start to the first screen (the status line's "loading") and to the first frame on it
(the timeline's "· position"), then q quits. Each --tree (a checkout with its .venv; default this one) is run
in turn, round after round, so trees compared in one run see the same load.

Targets (issue 13): small median <= 100 ms and p90 <= 150 ms; k3-topo median <= 200 ms; warm first frame
<= 2 s. Wall-clock numbers on a shared machine are inflated by its load, printed first; the UI thread's CPU
time per press is printed beside them, which that load cannot inflate much.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import pathlib
import re
import shutil
import signal
import statistics
import sys
import time

import torch
from rich.console import Console

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from tui import TinyK3App  # noqa: E402
from provenance import provenance_line  # noqa: E402

SIZE = (160, 48)


def instrument(app: TinyK3App) -> list[tuple[float, float, tuple | None]]:
    """Record (wall time, UI-thread CPU time, what was drawn) for every screen update, rendered as a terminal would."""
    paints: list[tuple[float, float, tuple | None]] = []
    sink = Console(file=io.StringIO(), force_terminal=True, color_system="truecolor", width=SIZE[0],
                   height=SIZE[1], legacy_windows=False)
    original = app._display

    def display(screen, renderable):
        original(screen, renderable)
        if renderable is not None:
            sink.file.seek(0)
            sink.file.truncate()
            sink.print(renderable, end="")
            paints.append((time.perf_counter(), time.thread_time(), app.drawn))

    app._display = display
    return paints


async def wait_for(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the app did not get there in time")
        await asyncio.sleep(0.002)


async def idle(pilot, timeout: float) -> None:
    app = pilot.app
    await wait_for(lambda: app.idle and app.sim is not None, timeout)
    await pilot.pause()


def summary(name: str, values: list[float], unit: str = "ms") -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return (f"  {name:<26} median {statistics.median(values):7.1f} {unit}   p90 {p90:7.1f} {unit}   "
            f"max {max(values):7.1f} {unit}   (n={len(values)})")


async def bench_n(preset: str, presses: int, timeout: float) -> tuple[float, float]:
    """`n` at reading pace (the look-ahead ready): ms to the new step painted; returns (median, p90)."""
    app = TinyK3App(preset=preset, prompt="k=7;", seed=0)
    paints = instrument(app)
    async with app.run_test(size=SIZE) as pilot:
        await idle(pilot, timeout)
        wall, cpu = [], []
        for _ in range(presses):
            await idle(pilot, timeout)
            target, n0 = app.step + 1, len(paints)
            start, start_cpu = time.perf_counter(), time.thread_time()
            await pilot.press("n")
            await wait_for(lambda: any(d is not None and d[0] == target for _, _, d in paints[n0:]), timeout)
            t, c = next((t, c) for t, c, d in paints[n0:] if d is not None and d[0] == target)
            wall.append(1e3 * (t - start))
            cpu.append(1e3 * (c - start_cpu))
        steps = [f.step_ms + f.twin_step_ms for f in app.sim.frames[app.sim.prompt_len:]]
    cfg = app.config
    print(f"{preset}: {cfg.num_layers} layers, {cfg.top_k} of {cfg.num_experts} experts; model step (hybrid + "
          f"twin, in the background) median {statistics.median(steps):.0f} ms")
    print(summary("n -> new step on screen", wall))
    print(summary("  UI-thread CPU per press", cpu))
    ordered = sorted(wall)
    return statistics.median(wall), ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


async def first_frame(preset: str, timeout: float) -> float:
    """Seconds from constructing the app to the first screen update that shows a frame."""
    t0 = time.perf_counter()
    app = TinyK3App(preset=preset, seed=0)
    paints = instrument(app)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(lambda: any(d is not None for _, _, d in paints), timeout)
        t = next(t for t, _, d in paints if d is not None)
        await idle(pilot, timeout)
    return t - t0


async def long_prompt(preset: str, nbytes: int, timeout: float) -> None:
    """A prompt of `nbytes` bytes: load time, prefill tokens/s, and `n` at the end of the long timeline."""
    prompt = ("The quick brown fox jumps over the lazy dog. " * (nbytes // 45 + 1))[:nbytes]
    app = TinyK3App(preset=preset, prompt=prompt, seed=0, lookahead=0)
    paints = instrument(app)
    t0 = time.perf_counter()
    async with app.run_test(size=SIZE) as pilot:
        await idle(pilot, timeout)
        load = time.perf_counter() - t0
        times = []
        for _ in range(5):
            key, target = ("b", app.step - 1)
            n0 = len(paints)
            start = time.perf_counter()
            await pilot.press(key)
            await wait_for(lambda: any(d is not None and d[0] == target for _, _, d in paints[n0:]), timeout)
            times.append(1e3 * (next(t for t, _, d in paints[n0:] if d is not None and d[0] == target) - start))
            await idle(pilot, timeout)
    tokens = len(prompt.encode()) + 1
    print(f"{preset}, {nbytes}-byte prompt: loaded in {load:.1f} s ({tokens / load:.0f} tokens/s, with the twin "
          f"and the recording); then b at step ~{tokens}:")
    print(summary("b -> step on screen", times))


SCREEN_MARKS = {"first screen": "loading".encode(), "first frame": "· position".encode()}
ESCAPES = re.compile(rb"\x1b(\[[0-9;?<>=]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[()][0-9A-B]|[=>78MDEc])")


def startup(tree: pathlib.Path, timeout: float) -> dict[str, float]:
    """Seconds from `python3 dev.py run` started in `tree` (a pseudo-terminal of SIZE) to each of SCREEN_MARKS
    appearing on its screen; then q, and the process group is ended should it not quit."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["TERM"] = "xterm-256color"
    start = time.perf_counter()
    pid, fd = pty.fork()
    if pid == 0:                                          # the child: the terminal's size, then dev.py
        try:
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", SIZE[1], SIZE[0], 0, 0))
            os.chdir(tree)
            os.execvpe(shutil.which("python3") or "python3", ["python3", "dev.py", "run"], env)
        finally:
            os._exit(127)                                 # never back into the caller's code in a forked copy
    seen, screen, deadline, exited = {}, b"", time.monotonic() + timeout, False
    try:
        while len(seen) < len(SCREEN_MARKS) and time.monotonic() < deadline:
            if not select.select([fd], [], [], 0.1)[0]:
                continue
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:                               # the terminal closed: the command has exited
                break
            if not chunk:
                break
            screen += chunk
            text = ESCAPES.sub(b"", screen)
            for name, mark in SCREEN_MARKS.items():
                if name not in seen and mark in text:
                    seen[name] = time.perf_counter() - start
        try:
            os.write(fd, b"q")
        except OSError:
            pass                                          # it has exited already
        quit_by = time.monotonic() + 10
        while time.monotonic() < quit_by and not exited:
            exited = os.waitpid(pid, os.WNOHANG) != (0, 0)
            if not exited and select.select([fd], [], [], 0.1)[0]:
                try:
                    os.read(fd, 1 << 16)                  # keep draining: a full terminal would block its exit
                except OSError:
                    pass
    finally:
        if not exited and os.waitpid(pid, os.WNOHANG) == (0, 0):
            os.killpg(pid, signal.SIGTERM)                # the group this call started (dev.py and its TUI)
            os.waitpid(pid, 0)
        os.close(fd)
    missing = [name for name in SCREEN_MARKS if name not in seen]
    if missing:
        raise TimeoutError(f"{tree}: no {' or '.join(missing)} within {timeout:.0f} s")
    return seen


def bench_startup(trees: list[pathlib.Path], rounds: int, timeout: float) -> None:
    """`python3 dev.py run` to the first screen and the first frame, each tree in turn, `rounds` times; medians."""
    times: dict[pathlib.Path, list[dict[str, float]]] = {tree: [] for tree in trees}
    for r in range(rounds):
        for tree in trees:
            load = os.getloadavg()[0]
            times[tree].append(startup(tree, timeout))
            marks = ", ".join(f"{name} {t:.2f} s" for name, t in times[tree][-1].items())
            print(f"  round {r + 1} {tree}: {marks} (load average {load:.1f} at its start)", flush=True)
    for tree in trees:
        medians = ", ".join(f"{name} {statistics.median(t[name] for t in times[tree]):.2f} s" for name in SCREEN_MARKS)
        print(f"median of {rounds}, {tree}: {medians}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="+", default=["small", "k3-topo"])
    parser.add_argument("--presses", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the targets are for 2 cores)")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--prompt-bytes", type=int, default=2000, help="the long prompt's size (0: skip it)")
    parser.add_argument("--startup", type=int, default=0, metavar="ROUNDS",
                        help="only `python3 dev.py run` to its first screen and frame, ROUNDS times per tree")
    parser.add_argument("--tree", type=pathlib.Path, action="append",
                        help="with --startup: a checkout to start (repeatable; default: this one)")
    args = parser.parse_args()
    print(provenance_line())
    if args.startup:
        print(f"`python3 dev.py run` to the first screen and frame, pseudo-terminal {SIZE[0]}x{SIZE[1]}, "
              f"{os.cpu_count()} CPUs, no OMP_NUM_THREADS (load averages per run below)")
        bench_startup(args.tree or [pathlib.Path(__file__).resolve().parents[1]], args.startup, args.timeout)
        return
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"TUI latency, headless Pilot at {SIZE[0]}x{SIZE[1]}, torch threads {args.threads}, {os.cpu_count()} CPUs, "
          f"load average {load:.1f} (a busy machine inflates wall-clock times)")
    results = {p: asyncio.run(bench_n(p, args.presses, args.timeout)) for p in args.presets}
    cold = asyncio.run(first_frame(args.presets[0], args.timeout))
    warm = asyncio.run(first_frame(args.presets[0], args.timeout))
    print(f"first frame of {args.presets[0]}: cold (imports, first load) {cold:.2f} s, warm {warm:.2f} s")
    if args.prompt_bytes:
        asyncio.run(long_prompt(args.presets[0], args.prompt_bytes, args.timeout))
    targets = {"small": (100, 150), "k3-topo": (200, None)}
    for preset, (median, p90) in results.items():
        if preset in targets:
            m, p = targets[preset]
            met = median <= m and (p is None or p90 <= p)
            print(f"target {preset}: median <= {m} ms" + (f", p90 <= {p} ms" if p else "") +
                  f" -> {'met' if met else 'NOT met'} ({median:.0f} / {p90:.0f} ms)")
    print(f"target warm first frame <= 2 s -> {'met' if warm <= 2 else 'NOT met'} ({warm:.2f} s)")


if __name__ == "__main__":
    main()
