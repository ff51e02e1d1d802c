"""KDA prefill: the chunked WY/UT form vs the token-by-token recurrence (kda.md §1, §2).

    python bench/bench_kda.py [--threads N] [--chunk 64] [--lengths 1024 4096 16384] [--device cuda]

B=1, H=4, K=V=64, float32, chunk 64 (--chunk), K3's lower-bound gate at fla's init. Both forms are timed in
the same run (after a warm-up); chunked is the best of several rounds, the recurrence (slow, one
Python step per token) a single pass, on a prefix when a full pass would take over 30 s (then
scaled to the full length, which is exact for a loop of identical steps, and marked '*').
The last line repeats the longest chunked run with every channel decaying at the bound (g = -5),
the worst case: no chunk can be factored in one piece, so every chunk is split into sub-chunks.
Target: chunked at T=4K well under 50 ms on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from tiny_k3.kda import kda_chunked, kda_gate, kda_recurrent  # noqa: E402

H, K, V, LOWER_BOUND = 4, 64, 64, -5.0


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
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, 1e3 * (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch's default)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--chunk", type=int, default=64)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    print(f"torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}, "
          f"B=1 H={H} K=V={K} float32, chunk {args.chunk}")
    print(f"{'T':>6} {'chunked ms':>11} {'recurrent ms':>13} {'speed-up':>9} {'max |diff|':>11}")
    with torch.inference_mode():
        warm = inputs(256, args.device)
        for _ in range(3):
            kda_chunked(*warm)
            kda_recurrent(*warm)
        for T in args.lengths:
            x = inputs(T, args.device)
            chunked = best_ms(lambda: kda_chunked(*x, chunk_size=args.chunk), args.rounds, sync)
            prefix = min(T, 1024)
            for _ in range(2):  # a 1024-token prefix first; the full length when that projects to < 30 s
                start = time.perf_counter()
                o_rec, _ = kda_recurrent(*(t[:, :prefix] for t in x))
                sync()
                recurrent = 1e3 * (time.perf_counter() - start) * T / prefix
                if prefix == T or recurrent > 30_000:
                    break
                prefix = T
            diff = (kda_chunked(*x, chunk_size=args.chunk)[0][:, :prefix] - o_rec).abs().max().item()
            mark = "*" if prefix < T else " "
            print(f"{T:>6} {chunked:>11.1f} {recurrent:>12.0f}{mark} {recurrent / chunked:>8.0f}x {diff:>11.1e}")
        T = args.lengths[-1]
        x = inputs(T, args.device, strong_decay=True)
        worst = best_ms(lambda: kda_chunked(*x, chunk_size=args.chunk), 3, sync)
        print(f"{T:>6} {worst:>11.1f}   (chunked, worst-case decay g = -5)")


if __name__ == "__main__":
    main()
