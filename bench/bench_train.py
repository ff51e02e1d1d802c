"""Training step: eager vs the compiled path (tiny_k3/compiled.py), tokens/s, FLOPs per token, share of the matmul rate.

    OMP_NUM_THREADS=1 python bench/bench_train.py [--presets small small-twin small-kda tiny] [--batch 24 --seq-len 128]

One step of `tiny_k3.train.train_step` (weighted loss, backward, clipping, AdamW, router-bias update) on rows of the
shipped curriculum's first stage (24 x 128 bytes by default), per preset, in one process on `--threads` threads:
  eager ms / tok/s     best of `--steps` steps, eager (the default path), after `--warmup` steps
  compiled ms / tok/s  the same model from the same start with the compiled path on; `compile s` is the time of the
                       calls that compiled (the first step), printed apart from the steps' time
  MFLOP/token          matmul and convolution FLOPs of one step, forward and backward (torch's FlopCounterMode), per token
  mm GFLOP/s           this machine's rate for the step's own matmuls: each one replayed alone, warm (op_floor.py)
  eager % / compiled % the FLOP rate each step reaches, as a share of that matmul rate
Targets (issue 36): the compiled step of `small` >= 2x eager, on 1 thread and an idle machine (read the load line).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import pathlib
import sys
import tempfile
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from op_floor import RecordedOp, replay_floor  # noqa: E402
from provenance import provenance_line  # noqa: E402
from tiny_k3 import compiled, native  # noqa: E402
from tiny_k3.data import corpus_rows  # noqa: E402
from tiny_k3.fused import keep_freed_memory  # noqa: E402
from tiny_k3.model import TinyK3  # noqa: E402
from tiny_k3.train import CURRICULUM, adamw, train_step  # noqa: E402
from tiny_k3.weights import config_for  # noqa: E402

_MATMULS = {"aten.mm.default": (0, 1), "aten.bmm.default": (0, 1), "aten.addmm.default": (1, 2),
            "aten.baddbmm.default": (1, 2)}   # op -> positions of its two factors


class _MatmulRecorder(TorchDispatchMode):
    """Keeps every matmul of a call (copies of its arguments) with its FLOPs, for `replay_floor`."""

    def __init__(self):
        super().__init__()
        self.ops: list[RecordedOp] = []
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        if name in _MATMULS:
            a, b = (args[i] for i in _MATMULS[name])
            self.flops += 2 * a.numel() * b.shape[-1]
            self.ops.append(RecordedOp(name, func, tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in args),
                                       dict(kwargs)))
        return func(*args, **kwargs)


def step_ms(model, opt, rows, steps: int) -> tuple[float, float]:
    """(best wall ms, best CPU ms) of `steps` training steps."""
    wall, cpu = float("inf"), float("inf")
    for i in range(steps):
        w, c = time.perf_counter(), time.process_time()
        train_step(model, opt, rows, 1.0, True, i)
        wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    return 1e3 * wall, 1e3 * cpu


def measure(preset: str, rows, args) -> dict:
    torch.manual_seed(0)
    start = TinyK3(config_for(preset))
    tokens = rows.tokens[:, 1:].numel()
    found = {"preset": preset, "tokens": tokens}
    with FlopCounterMode(display=False) as counter:                 # one step's FLOPs (no optimiser: it has none)
        probe = copy.deepcopy(start)
        train_step(probe, adamw(probe, 1e-3, 0.1), rows, 1.0, True, 0)
    found["flops"] = counter.get_total_flops()
    with _MatmulRecorder() as recorder:
        train_step(probe, adamw(probe, 1e-3, 0.1), rows, 1.0, True, 1)
    found["mm_rate"] = recorder.flops / (replay_floor(recorder.ops, repeats=3).total_ms / 1e3)
    for mode in ("eager", "compiled"):
        compiled.enable(mode == "compiled")
        model = copy.deepcopy(start)
        opt = adamw(model, 1e-3, 0.1)
        before = compiled.compile_seconds()
        first = time.perf_counter()
        train_step(model, opt, rows, 1.0, True, 0)
        found[f"{mode}_first_s"] = time.perf_counter() - first
        found[f"{mode}_compile_s"] = compiled.compile_seconds() - before
        step_ms(model, opt, rows, args.warmup)
        found[f"{mode}_ms"], found[f"{mode}_cpu_ms"] = step_ms(model, opt, rows, args.steps)
    compiled.enable(False)
    return found


def cold_builds() -> dict[str, str]:
    """Each C source built for float32 in a fresh folder, timed: {name: "0.12 s" or why it could not build}. The
    libraries stay loaded for the rest of the run (the folder goes; a loaded library does not need its file)."""
    found = {}
    before = os.environ.get("TINY_K3_NATIVE_DIR")
    with tempfile.TemporaryDirectory(prefix="tiny_k3_native_") as fresh:
        os.environ["TINY_K3_NATIVE_DIR"] = fresh
        native._library.cache_clear()
        for name in native.SOURCES:
            start = time.perf_counter()
            problem = native.problem(torch.float32, name)
            found[name] = problem or f"{time.perf_counter() - start:.2f} s"
    if before is None:
        del os.environ["TINY_K3_NATIVE_DIR"]
    else:
        os.environ["TINY_K3_NATIVE_DIR"] = before
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["small", "small-twin", "small-kda", "tiny"])
    parser.add_argument("--batch", type=int, default=CURRICULUM[0].batch)
    parser.add_argument("--seq-len", type=int, default=CURRICULUM[0].seq_len)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per preset and path (the best is kept)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kept = keep_freed_memory()    # as tiny_k3.train.train does, for both paths
    print(provenance_line())
    problem = compiled.compiler_problem()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, rows {args.batch} x {args.seq_len} "
          f"(CURRICULUM[0]'s kind of rows), wall clock (CPU ms beside it); compiler: {problem or 'found'}; "
          f"freed memory kept (fused.keep_freed_memory): {kept}")
    rows = corpus_rows(args.batch, args.seq_len, 1, dataclasses.replace(CURRICULUM[0], batch=args.batch,
                                                                         seq_len=args.seq_len))
    print(f"{'preset':>11} {'eager ms':>9} {'(cpu)':>6} {'tok/s':>7} {'compiled ms':>12} {'(cpu)':>6} {'tok/s':>7} "
          f"{'speed-up':>8} {'compile s':>9} {'MFLOP/tok':>9} {'mm GFLOP/s':>10} {'eager %':>7} {'comp. %':>7}")
    for preset in args.presets:
        r = measure(preset, rows, args)
        tok = r["tokens"]
        share = {m: 100 * r["flops"] / (r[f"{m}_ms"] / 1e3) / r["mm_rate"] for m in ("eager", "compiled")}
        print(f"{preset:>11} {r['eager_ms']:>9.1f} {r['eager_cpu_ms']:>6.0f} {tok / r['eager_ms'] * 1e3:>7.0f} "
              f"{r['compiled_ms']:>12.1f} {r['compiled_cpu_ms']:>6.0f} {tok / r['compiled_ms'] * 1e3:>7.0f} "
              f"{r['eager_ms'] / r['compiled_ms']:>7.2f}x {r['compiled_compile_s']:>9.1f} "
              f"{r['flops'] / tok / 1e6:>9.2f} {r['mm_rate'] / 1e9:>10.1f} {share['eager']:>6.1f}% "
              f"{share['compiled']:>6.1f}%", flush=True)
    fell_back = {name: op.failed for name, op in compiled.ops().items() if op.failed}
    print(f"compiled ops: {', '.join(compiled.ops())}; eager instead: {fell_back or 'none'}")
    print("C kernels (tiny_k3/native.py), float32, cold builds in a fresh folder: " + ", ".join(
        f"{native.SOURCES[name].name} {found}" for name, found in cold_builds().items()))
    print(provenance_line())   # the load again, after the run


if __name__ == "__main__":
    main()
