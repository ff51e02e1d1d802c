"""Recording overhead of sim.Simulation and the memory each Frame keeps.

    python bench/bench_sim.py [--presets small,k3-topo] [--device cuda] [--threads 1]

1. step() with full recording vs the bare model decode step (target <= 1.5x). Two ratios:
   hybrid only: Simulation(twin=False).step() / model(token, cache)                  - the price of recording
   with twin:   Simulation().step() / (model step + twin step)                        - what the TUI pays
2. Bytes per Frame: the arrays it holds (Frame.arrays(); the selection bias, one array per MoE layer shared by
   every frame while it is unchanged, is counted once for the run and amortised over its frames), the Python
   objects around them (tracemalloc, less the numpy buffers it also sees), and the amortised KDA snapshots.
3. The cost of a branch: go back 10 tokens and force another token (within the ring of recent snapshots:
   no replay; further back: a replay of up to SNAPSHOT_EVERY - 1 tokens).
4. A what-if of 8 steps (original and branch side by side, off the timeline) vs 8 plain steps (target <= 2x).
5. --prefill-only: loading a prompt (--prefill-bytes, default 1,200) with frames and the twin, in tokens per second
   of process CPU time: stepped token by token (before, Simulation(prefill=False)) and batched (after, the
   default, sim/prefill.py). Issue 24's target: k3-topo >= 20 tokens/s on one thread.
The contenders take turns one step at a time, so a busy machine slows them alike; medians are printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import time
import tracemalloc

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from sim import Simulation  # noqa: E402
from sim.memory import format_bytes  # noqa: E402
from sim import session  # noqa: E402
from sim.session import RECENT_SNAPSHOTS, SNAPSHOT_EVERY  # noqa: E402
from tiny_k3.cache import ModelCache  # noqa: E402
from tiny_k3.config import DEFAULT_PROMPT as PROMPT  # noqa: E402
from provenance import provenance_line  # noqa: E402

# --clock cpu: process CPU time instead of wall time, for a machine that other work keeps busy (a preempted
# process loses wall time but not CPU time). With several threads CPU time adds the threads up: use wall there.
CLOCK = time.perf_counter
MEMORY_TOKENS = 32   # tokens recorded for the bytes per token (the once-per-timeline bias is amortised over them)


def _arrays(frame) -> list[np.ndarray]:
    if hasattr(frame, "arrays"):
        return frame.arrays()
    # frames from before Frame.arrays() (to measure an older tree with this file): their records' fields
    out = [frame.top_ids, frame.top_probs]
    for r in (*frame.routing, *frame.kda, *frame.depth):
        out += [getattr(r, f.name) for f in dataclasses.fields(r) if isinstance(getattr(r, f.name), np.ndarray)]
    return out


def held_arrays(frame) -> dict[int, np.ndarray]:
    """The distinct buffers behind a frame's arrays (views of one buffer count once), by id."""
    roots: dict[int, np.ndarray] = {}
    for a in _arrays(frame):
        while isinstance(a.base, np.ndarray):
            a = a.base
        roots[id(a)] = a
    return roots


def frame_bytes(frames, traced: float, snapshots: dict) -> tuple[float, float, float]:
    """(bytes of the arrays each held by one frame, bytes of the arrays several frames share (the selection
    bias) counted once, bytes of Python objects) for the whole list. traced: what tracemalloc saw while the
    frames were made; it sees numpy's own buffers too (not torch's), so those are taken out of it. A KDA
    keyframe that is a view of a branching snapshot (sim/framestore.py) is the snapshot's memory: the
    snapshots are counted on their own, so such arrays are left out here."""
    in_snapshots = {c.state.data_ptr() for snap in snapshots.values() for c in snap.values() if hasattr(c, "state")}
    roots: dict[int, np.ndarray] = {}
    uses: dict[int, int] = {}
    for f in frames:
        for i, a in held_arrays(f).items():
            if a.__array_interface__["data"][0] not in in_snapshots:
                roots[i], uses[i] = a, uses.get(i, 0) + 1
    own = sum(a.nbytes for i, a in roots.items() if uses[i] == 1)
    shared = sum(a.nbytes for i, a in roots.items() if uses[i] > 1)
    numpy_owned = sum(a.nbytes for a in roots.values() if a.base is None)
    return own, shared, traced - numpy_owned


class Bare:
    """The model decode loop with no recorder: the baseline."""

    def __init__(self, model, device):
        self.model, self.device = model, device
        self.cache = ModelCache(model.config.num_layers)

    @torch.no_grad()
    def step(self, token: int = 65):
        _, self.cache = self.model(torch.tensor([[token]], device=self.device), self.cache)


def median_ms(contenders: dict, steps: int, sync) -> dict[str, float]:
    """Median ms per call; the contenders take turns step by step, so load bursts hit them alike."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(steps):
        for name, fn in contenders.items():
            sync()
            t = CLOCK()
            fn()
            sync()
            times[name].append(1e3 * (CLOCK() - t))
    return {name: float(np.median(v)) for name, v in times.items()}


def bench(preset: str, device: str, steps: int) -> None:
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sim = Simulation(preset, PROMPT, device=device, weights="random")
    solo = Simulation(preset, PROMPT, device=device, weights="random", twin=False)
    hybrid, twin = Bare(sim.model, sim.device), Bare(sim.twin_model, sim.device)
    for tok in [256] + list(PROMPT.encode()):
        hybrid.step(tok), twin.step(tok)
    ms = median_ms({"bare hybrid": hybrid.step, "bare twin": twin.step, "step() no twin": solo.step,
                    "step()": sim.step}, steps, sync)
    print(f"\n== {preset} on {device}: ms per decode step (median of {steps} interleaved steps)")
    for name, v in ms.items():
        print(f"  {name:<16} {v:8.2f} ms")
    print(f"  recording overhead, hybrid only: step() / bare = {ms['step() no twin'] / ms['bare hybrid']:.2f}x "
          f"(target <= 1.5x)")
    print(f"  with the twin: step() / (bare hybrid + bare twin) = "
          f"{ms['step()'] / (ms['bare hybrid'] + ms['bare twin']):.2f}x")

    fresh = bench_memory(preset, device, MEMORY_TOKENS)

    # A branch: back 10 tokens, force another token (restore from a snapshot and replay, then one step).
    fresh.goto(len(fresh.frames) - 11)
    sync()
    t = CLOCK()
    fresh.step(force_token=33 if fresh.frame.token_id != 33 else 34)
    sync()
    print(f"  branch 10 tokens back: {1e3 * (CLOCK() - t):.1f} ms "
          f"(vs {ms['step()']:.1f} ms for a plain step)")
    bench_what_if(fresh, sync)


def bench_memory(preset: str, device: str, n: int) -> Simulation:
    """Bytes per recorded token, on a fresh simulation stepped n tokens, so the counts are of frames alone."""
    tracemalloc.start()
    fresh = Simulation(preset, PROMPT, device=device, weights="random")
    before = tracemalloc.get_traced_memory()[0]
    frames0 = len(fresh.frames)
    fresh.run(n)
    py_bytes = (tracemalloc.get_traced_memory()[0] - before) / n
    tracemalloc.stop()
    new = fresh.frames[frames0:]
    own, shared, objects = (b / len(new) for b in frame_bytes(new, py_bytes * n, fresh._snapshots))
    nominal = np.mean([f.nbytes() for f in new])
    snap = fresh.frame.memory.state_bytes                  # one snapshot = every KDA state of the sequence
    # Kept snapshots: one every SNAPSHOT_EVERY tokens; of those, one every KEYFRAME_EVERY keeps the states
    # whole (the frames' KDA states are recomputed from it), the others only the conv tails (S recomputed
    # from their frame on a restore). Without KEYFRAME_EVERY (an older tree) every kept one is whole.
    every = getattr(session, "KEYFRAME_EVERY", SNAPSHOT_EVERY)
    conv = sum(c.conv.numel() * c.conv.element_size() for c in fresh._snapshots[max(fresh._snapshots)].values())
    lean = conv if every > SNAPSHOT_EVERY else snap
    snap_per_token = (snap + (every // SNAPSHOT_EVERY - 1) * lean) / every
    per_token = own + objects + snap_per_token
    print(f"  bytes per Frame: arrays {format_bytes(own)}, Python objects ~{format_bytes(objects)} (tracemalloc, "
          f"less numpy's own buffers); shared by all frames: {format_bytes(shared * len(new))} once per timeline "
          f"(the selection bias; {format_bytes(shared)} per frame over these {len(new)}; nbytes() "
          f"{format_bytes(nominal)} counts it in every frame)")
    print(f"  KDA snapshots for branching: {format_bytes(snap)} whole, {format_bytes(lean)} with the conv tails only; "
          f"a fixed ring of the last {RECENT_SNAPSHOTS} ({format_bytes(RECENT_SNAPSHOTS * snap)}) + one per "
          f"{SNAPSHOT_EVERY} tokens, whole one per {every} ({format_bytes(snap_per_token)} per token)")
    print(f"  -> ~{format_bytes(per_token)} per recorded token (arrays + objects + snapshots; "
          f"{format_bytes(per_token + shared)} with the shared bias amortised over {len(new)} frames); "
          f"1000 tokens ~ {format_bytes(1000 * per_token + shared * len(new) + RECENT_SNAPSHOTS * snap)}")

    return fresh


def bench_what_if(sim: Simulation, sync, steps: int = 8, reps: int = 5) -> None:
    """sim.what_if(ResetState(), steps=8) from the last frame vs sim.run(8), taking turns; medians."""
    from sim.interventions import ResetState

    times: dict[str, list[float]] = {"what_if": [], "run": []}
    for _ in range(reps):
        sim.goto(len(sim.frames) - 1)
        for name, fn in (("what_if", lambda: sim.what_if(ResetState(), steps=steps)), ("run", lambda: sim.run(steps))):
            sync()
            t = CLOCK()
            fn()
            sync()
            times[name].append(1e3 * (CLOCK() - t))
    w, r = (float(np.median(times[k])) for k in ("what_if", "run"))
    print(f"  what-if of {steps} steps: {w:.1f} ms vs {steps} plain steps {r:.1f} ms = {w / r:.2f}x (target <= 2x)")


def bench_prefill(preset: str, device: str, n_bytes: int, stepped: bool = True) -> None:
    """Tokens/s of CPU time (process_time: this process's threads added up) to build a Simulation of an n-byte
    prompt, stepped and prefilled (tests/test_prefill.py checks that the two hold the same frames)."""
    prompt = (PROMPT * (n_bytes // len(PROMPT) + 1))[:n_bytes]
    rates = {}
    for name, prefill in (("before (stepped)", False), ("after (prefill)", True)) if stepped else \
            (("after (prefill)", True),):
        t0 = time.process_time()
        sim = Simulation(preset, prompt, device=device, prefill=prefill)
        rates[name] = len(sim.frames) / (time.process_time() - t0)
    line = ", ".join(f"{k} {v:.1f} tok/s" for k, v in rates.items())
    print(f"  {preset}: {len(sim.frames)} tokens ({n_bytes} bytes) with frames and twin, CPU time, "
          f"{torch.get_num_threads()} thread(s): {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="small,k3-topo")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=48, help="decode steps per contender (k3-topo: a quarter)")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads (default 1: these sizes are bound by per-op overhead, not FLOPs)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall: perf_counter (a quiet machine); cpu: process_time (a busy one, 1 thread)")
    parser.add_argument("--memory-only", action="store_true", help="only the bytes per recorded token (section 2)")
    parser.add_argument("--prefill-only", action="store_true",
                        help="only the prompt load rate, stepped vs batched prefill (section 5; CPU time)")
    parser.add_argument("--prefill-bytes", type=int, default=1200, help="prompt bytes for --prefill-only")
    parser.add_argument("--after-only", action="store_true", help="with --prefill-only: skip the (slow) stepped run")
    args = parser.parse_args()
    print(provenance_line())
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}, clock {args.clock}")
    for preset in args.presets.split(","):
        steps = max(4, args.steps // 4) if preset == "k3-topo" else args.steps
        if args.prefill_only:
            bench_prefill(preset, args.device, args.prefill_bytes, stepped=not args.after_only)
        elif args.memory_only:
            print(f"\n== {preset} on {args.device}: memory only")
            bench_memory(preset, args.device, MEMORY_TOKENS)
        else:
            bench(preset, args.device, steps)


if __name__ == "__main__":
    main()
