"""KDA prefill: the chunked WY/UT form vs the token-by-token recurrence (kda.md §1, §2).

    python bench/bench_kda.py [--threads 1 2] [--chunk 64] [--lengths 1024 4096 16384] [--device cuda]

B=1, H=4, K=V=64, float32, K3's lower-bound gate at fla's init. For each thread count, in one run:
`kda_chunked` (best of `--rounds`; without autograd on CPU it takes its segment-by-segment form, whose chunks
are at most 32 tokens: `--chunk` sets the other forms' chunk), fla-core's pure-torch `naive_recurrent_kda` (the
public reference, best of `--reference-rounds` passes taken in turn with the chunked rounds: one pass alone moved
by up to 40 % with the 2-core machine's phase; loaded from its file, since fla's package import needs triton)
and our own `kda_recurrent` (the definition, one pass). faults/call: the chunked form's minor page faults. A recurrence is timed on a prefix when a full pass would take over 30 s (then scaled to
the full length, which is exact for a loop of identical steps, and marked '*'). The last line per thread
count repeats the longest chunked run with every channel decaying at the bound (g = -5), the worst case:
no chunk can be factored in one piece, so every chunk is split into sub-chunks. `--floor` adds the chunked
call's op floor (bench/op_floor.py): what its ops take when each runs alone with its operands in cache.
Target (issue 15): chunked at T=4096 >= 25x fla's naive recurrence on 1 thread, >= 35x on 2. `--compiled` adds what
TINY_K3_COMPILE=1 runs (tiny_k3/compiled.py) at each length, eager beside it: without autograd the C recurrence
(tiny_k3/kda_native.c) with its build time and its ratio to fla's naive (issue 36's target: >= 25x at T=4096 on 1
thread, never slower than eager at T=64), and the inductor kernel that training uses, with its compile time.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import resource
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from op_floor import record_ops, replay_floor  # noqa: E402
from tiny_k3 import compiled, native  # noqa: E402
from tiny_k3.kda_chunk import kda_chunked_compiled  # noqa: E402
from tiny_k3.kda import kda_chunked, kda_gate, kda_recurrent  # noqa: E402
from provenance import provenance_line  # noqa: E402

H, K, V, LOWER_BOUND = 4, 64, 64, -5.0

# --clock cpu: process CPU time instead of wall time, for a machine that other work keeps busy (a preempted
# process loses wall time but not CPU time). With several threads CPU time adds the threads up: use wall there.
CLOCK = time.perf_counter


def fla_naive_recurrent():
    """fla-core's `naive_recurrent_kda` (pure torch + einops), or None when fla-core is not installed.

    `import fla` pulls in triton for the GPU kernels; the naive reference file itself needs only torch and
    einops, so it is loaded by path from the installed package.
    """
    spec = importlib.util.find_spec("fla")
    if spec is None or spec.origin is None:
        return None
    path = pathlib.Path(spec.origin).parent / "ops" / "kda" / "naive.py"
    naive_spec = importlib.util.spec_from_file_location("fla_kda_naive", path)
    module = importlib.util.module_from_spec(naive_spec)
    try:
        naive_spec.loader.exec_module(module)
    except (ImportError, FileNotFoundError):
        return None
    return module.naive_recurrent_kda


def inputs(T: int, device: str, strong_decay: bool = False):
    q = F.normalize(torch.randn(1, T, H, K, device=device), dim=-1)
    k = F.normalize(torch.randn(1, T, H, K, device=device), dim=-1)
    v = torch.randn(1, T, H, V, device=device)
    dt = torch.empty(H * K, device=device).uniform_(-6.9, -2.3).exp()  # fla's dt_bias init
    g = kda_gate(torch.randn(1, T, H, K, device=device), torch.zeros(H, device=device),
                 dt + torch.log(-torch.expm1(-dt)), LOWER_BOUND)
    if strong_decay:
        g = torch.full_like(g, LOWER_BOUND)
    beta = torch.rand(1, T, H, device=device)
    return q, k, v, g, beta


def best_ms(fn, rounds: int, sync) -> float:
    best = float("inf")
    for _ in range(rounds):
        sync()
        start = CLOCK()
        fn()
        sync()
        best = min(best, 1e3 * (CLOCK() - start))
    return best


def chunked_vs_reference(chunked, reference, x, rounds: int, reference_rounds: int, sync):
    """Best ms of `chunked()` over `rounds`, of the recurrence `reference` over `reference_rounds` passes, the two
    taking turns (a slow phase of the machine then slows both), and the chunked form's minor page faults per call.
    -> (chunked ms, reference ms or None, whether the reference was timed on a prefix, faults per call)."""
    best, theirs, cut, faults = float("inf"), None, False, 0
    for r in range(rounds):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        best = min(best, best_ms(chunked, 1, sync))
        faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        if reference is not None and r < reference_rounds:
            ms, cut, _ = recurrence_ms(reference, x, sync)
            theirs = ms if theirs is None else min(theirs, ms)
    return best, theirs, cut, faults / rounds


def recurrence_ms(fn, x, sync) -> tuple[float, bool, torch.Tensor]:
    """ms of one pass of a recurrence over x (a 1024-token prefix, scaled, when the full one projects past 30 s)."""
    T = x[0].shape[1]
    prefix = min(T, 1024)
    while True:
        sync()
        start = CLOCK()
        o, _ = fn(*(t[:, :prefix] for t in x))
        sync()
        ms = 1e3 * (CLOCK() - start) * T / prefix
        if prefix == T or ms > 30_000:
            return ms, prefix < T, o
        prefix = T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="CPU thread counts to run")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reference-rounds", type=int, default=3,
                        help="passes of fla's recurrence, interleaved with the chunked rounds (its best is used)")
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--floor", action="store_true",
                        help="also the longest length's op floor: each op of one chunked call replayed alone, warm")
    parser.add_argument("--compiled", action="store_true",
                        help="also the compiled kernel (tiny_k3/compiled.py) at each length, its compile time apart")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall: perf_counter (a quiet machine); cpu: process_time (a busy one, 1 thread)")
    args = parser.parse_args()
    print(provenance_line())
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    fla = fla_naive_recurrent()
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    if fla is None:
        print("fla-core is not installed (pip install 'tiny-k3[dev]'): the fla column is skipped")
    for threads in args.threads:
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        print(f"\ntorch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}, clock {args.clock}, "
              f"B=1 H={H} K=V={K} float32, chunk {args.chunk}")
        print(f"{'T':>6} {'chunked ms':>11} {'fla naive ms':>13} {'vs fla':>7} {'ours rec ms':>12} {'vs ours':>8} "
              f"{'max |diff|':>11} {'faults/call':>12}")
        with torch.inference_mode():
            warm = inputs(256, args.device)
            for _ in range(3):
                kda_chunked(*warm)
                kda_recurrent(*warm)
                if fla is not None:
                    fla(*warm)
            fla_ms = {}
            for T in args.lengths:
                x = inputs(T, args.device)
                chunked, theirs, cut_fla, faults = chunked_vs_reference(
                    lambda: kda_chunked(*x, chunk_size=args.chunk), fla, x, args.rounds, args.reference_rounds, sync)
                ours, cut, o_rec = recurrence_ms(kda_recurrent, x, sync)
                diff = (kda_chunked(*x, chunk_size=args.chunk)[0][:, :o_rec.shape[1]] - o_rec).abs().max().item()
                fla_ms[T] = theirs
                if theirs is not None:
                    fla_cols = f"{theirs:>12.0f}{'*' if cut_fla else ' '} {theirs / chunked:>6.1f}x"
                else:
                    fla_cols = f"{'-':>13} {'-':>7}"
                print(f"{T:>6} {chunked:>11.1f} {fla_cols} {ours:>11.0f}{'*' if cut else ' '} "
                      f"{ours / chunked:>7.1f}x {diff:>11.1e} {faults:>12.0f}")
            T = args.lengths[-1]
            x = inputs(T, args.device, strong_decay=True)
            worst = best_ms(lambda: kda_chunked(*x, chunk_size=args.chunk), 3, sync)
            print(f"{T:>6} {worst:>11.1f}   (chunked, worst-case decay g = -5)")
            if args.floor:
                x = inputs(T, args.device)
                print_floor(lambda: kda_chunked(*x, chunk_size=args.chunk), T, sync)
            if args.compiled:
                print_compiled(args.lengths, args.rounds, args.device, sync, fla_ms)


def print_compiled(lengths, rounds: int, device: str, sync, fla_ms: dict) -> None:
    """What TINY_K3_COMPILE=1 runs for KDA, beside eager `kda_chunked`, without autograd: `kda_chunked_compiled`,
    which on the CPU is the C recurrence (tiny_k3/kda_native.c; build s: its first build, cold, in a fresh
    folder), and the inductor kernel `kda_factored` that training uses (with autograd; compile s: its first call at
    that length, in this process's inductor cache)."""
    compiled.enable(True)
    with tempfile.TemporaryDirectory(prefix="tiny_k3_native_") as fresh:   # a cold build (the loaded library stays)
        before, os.environ["TINY_K3_NATIVE_DIR"] = os.environ.get("TINY_K3_NATIVE_DIR"), fresh
        start = time.perf_counter()
        problem = native.problem(torch.float32)
        build_s = time.perf_counter() - start
        if before is None:
            del os.environ["TINY_K3_NATIVE_DIR"]
        else:
            os.environ["TINY_K3_NATIVE_DIR"] = before
    if problem is not None or device != "cpu":
        print(f"(the C recurrence does not run here: {problem or 'it is for the CPU'})")
    else:
        print(f"{'T':>6} {'chunked ms':>11} {'C rec. ms':>10} {'vs eager':>9} {'vs fla':>7} {'max |diff|':>11}"
              f"   (TINY_K3_COMPILE=1: the C recurrence, built in {build_s:.1f} s)")
        for T in lengths:
            x = inputs(T, device)
            ms = best_ms(lambda: kda_chunked_compiled(*x), rounds, sync)
            eager = best_ms(lambda: kda_chunked(*x), rounds, sync)
            diff = (kda_chunked_compiled(*x)[0] - kda_chunked(*x)[0]).abs().max().item()
            vs_fla = f"{fla_ms[T] / ms:>6.1f}x" if fla_ms.get(T) else f"{'-':>7}"
            print(f"{T:>6} {eager:>11.1f} {ms:>10.1f} {eager / ms:>8.2f}x {vs_fla} {diff:>11.1e}")
        x = inputs(lengths[-1], device, strong_decay=True)
        worst, eager = best_ms(lambda: kda_chunked_compiled(*x), 3, sync), best_ms(lambda: kda_chunked(*x), 3, sync)
        print(f"{lengths[-1]:>6} {eager:>11.1f} {worst:>10.1f} {eager / worst:>8.2f}x   (worst-case decay g = -5)")
    kernel = compiled.ops()["kda_chunked"]
    print(f"{'T':>6} {'chunked ms':>11} {'compiled ms':>12} {'vs eager':>9} {'compile s':>10}"
          "   (inductor kernel, as in training)")
    for T in lengths:
        x = inputs(T, device)
        S0 = x[0].new_zeros(H, K, V)
        call = lambda: kernel(*x, S0, K ** -0.5, 32)  # noqa: E731
        first = time.perf_counter()
        call()
        compile_s = time.perf_counter() - first
        ms, eager = best_ms(call, rounds, sync), best_ms(lambda: kda_chunked(*x), rounds, sync)
        print(f"{T:>6} {eager:>11.1f} {ms:>12.1f} {eager / ms:>8.2f}x {compile_s:>10.1f}")
    compiled.enable(False)
    if kernel.failed:
        print(f"(the kernel ran eager: {kernel.failed})")


def print_floor(call, T: int, sync) -> None:
    """The op floor of one call (bench/op_floor.py) beside that call's best time, and where the floor goes."""
    call()
    ms = best_ms(call, 5, sync)
    floor = replay_floor(record_ops(call))
    print(f"{T:>6} {ms:>11.1f}   (chunked) vs its op floor {floor.total_ms:.1f} ms: every op of the call replayed "
          f"alone with warm caches, the Python between ops left out")
    for name, calls, op_ms in floor.by_op[:8]:
        print(f"{'':>8}{op_ms:>7.2f} ms  {calls:>4} x {name}")


if __name__ == "__main__":
    main()
