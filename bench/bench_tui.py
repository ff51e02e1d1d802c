"""Keypress-to-repaint latency of the TUI: `n` on the default preset and on k3-topo (target: median <= 150 ms).

    python bench/bench_tui.py [--presets small k3-topo] [--presses 15] [--threads 2]

Driven headless with Textual's Pilot, harness included: the clock starts before `pilot.press(key)` and stops
when the screen update that shows the new step has been composed and turned into terminal output (the
headless driver skips that last part, so this script does it into a buffer, as a real terminal driver would).

Scenarios, per preset:
  n, reading pace    press n, wait until the look-ahead is computed (a learner reading the panels), again.
  n, key held down   press n as fast as the harness can: once the look-ahead is used up, each step waits
                     for the model (compute-bound; shows the model's speed, not the interface's).
  j during compute   change layer while a worker computes a token: the interface must not freeze.
And a long-run check: the same keys at step 3000 of a (padded) timeline cost what they cost at step 10.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import pathlib
import statistics
import sys
import time

import torch
from rich.console import Console

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from tui import TinyK3App  # noqa: E402

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


async def press_and_time(pilot, paints, key: str, expect, timeout: float, cpu: list | None = None) -> float:
    """ms from the key press to the first screen update whose drawing satisfies `expect` (wall clock);
    the UI thread's CPU time over the same span goes to `cpu` (what a busy machine cannot inflate)."""
    start, start_cpu = time.perf_counter(), time.thread_time()
    n0 = len(paints)
    await pilot.press(key)
    await wait_for(lambda: any(expect(d) for _, _, d in paints[n0:] if d is not None), timeout)
    t, t_cpu = next((t, c) for t, c, d in paints[n0:] if d is not None and expect(d))
    if cpu is not None:
        cpu.append(1e3 * (t_cpu - start_cpu))
    return 1e3 * (t - start)


async def idle(pilot, timeout: float) -> None:
    app = pilot.app
    await wait_for(lambda: app.idle and app.timeline is not None, timeout)
    await pilot.pause()


def summary(name: str, values: list[float]) -> str:
    if not values:
        return f"  {name:<22} (none)"
    ordered = sorted(values)
    q = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return (f"  {name:<22} median {statistics.median(values):7.1f} ms   p90 {q:7.1f} ms   "
            f"max {max(values):7.1f} ms   (n={len(values)})")


async def bench_preset(preset: str, presses: int, timeout: float) -> None:
    app = TinyK3App(preset=preset, prompt="k=7;", seed=0)
    paints = instrument(app)
    t0 = time.perf_counter()
    async with app.run_test(size=SIZE) as pilot:
        await idle(pilot, timeout)
        load_s = time.perf_counter() - t0
        reading, reading_cpu, held, during = [], [], [], []
        for _ in range(presses):
            await idle(pilot, timeout)
            target = app.step + 1
            reading.append(await press_and_time(pilot, paints, "n", lambda d: d[0] == target, timeout, reading_cpu))
        for _ in range(presses):                      # no waiting: the look-ahead runs dry
            target = app.step + 1
            held.append(await press_and_time(pilot, paints, "n", lambda d: d[0] == target, timeout))
        for _ in range(min(presses, 8)):
            await idle(pilot, timeout)
            base = app.lookahead
            app.lookahead = len(app.timeline) - 1 - app.visited + 2   # make the worker compute two more tokens
            app._pump()
            if app._busy:
                layer = (app.layer + 1) % app.config.num_layers
                # ... and change layer meanwhile
                during.append(await press_and_time(pilot, paints, "j", lambda d: d[1] == layer, timeout))
            app.lookahead = base
        await idle(pilot, timeout)
        steps = [f.step_ms + f.twin_step_ms for f in app.timeline.frames[app.timeline.prompt_len:]]
    print(f"{preset}: {app.config.num_layers} layers, {app.config.top_k} of {app.config.num_experts} experts; "
          f"session loaded in {load_s:.1f} s; model step (hybrid + twin) median {statistics.median(steps):.0f} ms")
    print(summary("n, reading pace", reading))
    print(summary("  UI-thread CPU", reading_cpu))
    print(summary("n, key held down", held))
    print(summary("j during compute", during))
    print(f"  target: n at reading pace median <= 150 ms -> "
          f"{'met' if statistics.median(reading) <= 150 else 'NOT met'}")


async def bench_long_run(preset: str, steps: int, presses: int, timeout: float) -> None:
    """UI cost at step `steps` vs near the start: the timeline is padded with copies of real Frames (no
    model compute), then b / n are pressed back and forth at both places."""
    app = TinyK3App(preset=preset, prompt="k=7;", seed=0, lookahead=0)
    paints = instrument(app)
    async with app.run_test(size=SIZE) as pilot:
        await idle(pilot, timeout)
        app._at_end = True                              # the padded frames are not the model's: compute nothing
        frames = list(app.timeline.frames)
        while len(app.timeline) < steps:
            app.timeline.append(frames[len(app.timeline) % len(frames)])
        result = {}
        for where in (len(frames) - 1, steps - 2):
            app.goto_step(where)
            await idle(pilot, timeout)
            times = []
            for i in range(presses):
                key, target = ("n", app.step + 1) if i % 2 == 0 else ("b", app.step - 1)
                times.append(await press_and_time(pilot, paints, key, lambda d: d[0] == target, timeout))
                await idle(pilot, timeout)
            result[where] = times
    print(f"long run ({preset}, timeline padded to {steps} steps): n / b latency at step "
          f"{min(result)} vs step {max(result)}")
    for where, times in result.items():
        print(summary(f"at step {where}", times))
    print(f"  ratio of medians (long / short): "
          f"{statistics.median(result[max(result)]) / statistics.median(result[min(result)]):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="+", default=["small", "k3-topo"])
    parser.add_argument("--presses", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the target is for 2 cores)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--long", type=int, default=3000, help="steps of the long-run check (0: skip it)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"keypress-to-repaint latency, headless Pilot at {SIZE[0]}x{SIZE[1]}, torch threads {args.threads}, "
          f"{os.cpu_count()} CPUs, load average {load:.1f} (a busy machine inflates wall-clock times)")
    for preset in args.presets:
        asyncio.run(bench_preset(preset, args.presses, args.timeout))
    if args.long:
        asyncio.run(bench_long_run(args.presets[0], args.long, args.presses, args.timeout))


if __name__ == "__main__":
    main()
