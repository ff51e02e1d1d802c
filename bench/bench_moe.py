"""Latent MoE (top-16 of 896) vs a dense SiTU-GLU FFN with the same active parameters.

    python bench/bench_moe.py [--device cuda] [--repeats 200] [--force experts=columns ...]

Active parameters of the MoE layer = router + latent down/up + latent norm + shared experts + top_k routed
experts; the dense FFN gets hidden width active / (3 D), so both layers do about the same multiply-adds per
token. The ratio (MoE time / dense time) is the price of sparsity in a framework: routing, gathering the
chosen experts' weights and scattering back. Target (issue 15): <= 3x at decode (B=1, T=1) and prefill-256.
--force STAGE=PATH times one path of the MoE's decision table (tiny_k3/moe_fast.py, `FastPaths.choose`)
wherever it applies, e.g. to check or refit its `CostModel` on another machine.
"""

from __future__ import annotations

import argparse
import pathlib
import resource
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from tiny_k3.config import ConfigError, K3Config  # noqa: E402
from tiny_k3.moe import GatedMLP, LatentMoE  # noqa: E402
from tiny_k3.moe_fast import STAGES  # noqa: E402
from provenance import provenance_line  # noqa: E402

# --clock cpu: process CPU time instead of wall time, for a machine that other work keeps busy (a preempted
# process loses wall time but not CPU time). With several threads CPU time adds the threads up: use wall there.
CLOCK = time.perf_counter


def keep_freed_memory() -> None:
    """Ask glibc's malloc (mallopt) to keep what is freed: no heap trimming, no mmap below 32 MB. Then no
    call pays page faults for another's frees, and both layers are timed on their arithmetic alone."""
    import ctypes
    import ctypes.util

    m_trim_threshold, m_mmap_threshold = -1, -3                   # <malloc.h>
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        ok = libc.mallopt(m_trim_threshold, 1 << 30) == 1 and libc.mallopt(m_mmap_threshold, 1 << 25) == 1
    except (OSError, AttributeError):
        ok = False
    if not ok:
        sys.exit("--malloc keep needs glibc's mallopt, which this system's C library does not offer.")


def active_params(moe: LatentMoE) -> int:
    c = moe.config
    per_expert = moe.w1[0].numel() + moe.w3[0].numel() + moe.w2[0].numel()
    non_expert = sum(p.numel() for name, p in moe.named_parameters() if name not in ("w1", "w2", "w3"))
    return non_expert + c.top_k * per_expert


def time_pair(fns, x, repeats: int, device: str, rounds: int = 7) -> tuple[list[float], list[float]]:
    """Best-of-rounds mean time in ms of each fn(x), and its minor page faults per call. Rounds alternate
    between the functions, so a busy machine slows them alike and the ratio measured in one run stays
    meaningful. Page faults: glibc serves megabyte buffers from fresh pages when it has just trimmed its
    heap, and which calls pay for that depends on the others' allocations (shown so a reader can tell)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    best, faults = [float("inf")] * len(fns), [0] * len(fns)
    for fn in fns:
        for _ in range(3):
            fn(x)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            sync()
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = CLOCK()
            for _ in range(repeats):
                fn(x)
            sync()
            best[i] = min(best[i], 1e3 * (CLOCK() - start) / repeats)
            faults[i] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    return best, [f / (rounds * repeats) for f in faults]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads (default 1: these sizes are bound by per-op overhead, not FLOPs)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall: perf_counter (a quiet machine); cpu: process_time (a busy one, 1 thread)")
    parser.add_argument("--malloc", choices=["default", "keep"], default="default",
                        help="keep: glibc keeps freed memory (no page faults from heap trims): arithmetic alone")
    parser.add_argument("--presets", nargs="+", default=["small", "mini-896/16"],
                        help="K3Config presets to time (default: the two of issue 15's table)")
    parser.add_argument("--force", nargs="+", default=[], metavar="STAGE=PATH",
                        help="take these paths of the decision table wherever they apply; "
                             + "; ".join(f"{stage}: {'|'.join(paths)}" for stage, paths in STAGES.items()))
    args = parser.parse_args()
    if any("=" not in item for item in args.force):
        parser.error(f"--force takes STAGE=PATH items, got {' '.join(args.force)!r}.")
    forced = dict(item.partition("=")[::2] for item in args.force)
    print(provenance_line())
    try:
        configs = {preset: K3Config.preset(preset) for preset in args.presets}
    except ConfigError as error:
        parser.error(str(error))
    if args.malloc == "keep":
        keep_freed_memory()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}, clock {args.clock}, "
          f"malloc {args.malloc}" + (f", forced {' '.join(args.force)}" if args.force else ""))
    print(f"{'preset':<12} {'shape':<10} {'active':>8} {'dense h':>8} {'moe ms':>8} {'dense ms':>9} {'ratio':>6}"
          f" {'faults/call moe, dense':>23}")
    for preset in args.presets:
        c = configs[preset]
        moe = LatentMoE(c, device=args.device)  # built outside inference mode, as a model is: run inside it
        try:
            moe.fast.force(**forced)
        except ValueError as error:
            parser.error(str(error))
        active = active_params(moe)
        hidden = round(active / (3 * c.hidden_size))
        dense = GatedMLP(c.hidden_size, hidden, c, device=args.device)
        with torch.inference_mode():
            for batch, tokens in ((1, 1), (1, 256)):
                x = torch.randn(batch, tokens, c.hidden_size, device=args.device)
                repeats = args.repeats if tokens == 1 else max(5, args.repeats // 20)
                (t_moe, t_dense), (f_moe, f_dense) = time_pair([moe, dense], x, repeats, args.device)
                print(f"{preset:<12} {f'{batch}x{tokens}':<10} {active:>8,} {hidden:>8} "
                      f"{t_moe:>8.3f} {t_dense:>9.3f} {t_moe / t_dense:>5.2f}x {f_moe:>14.1f}, {f_dense:.1f}")


if __name__ == "__main__":
    main()
