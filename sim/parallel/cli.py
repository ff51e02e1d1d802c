"""`python -m sim.parallel`: spawn N ranks (or join torchrun's), serve a few prompts, print the traffic."""

from __future__ import annotations

import argparse
import os

from rich.console import Console

from tiny_k3 import DEFAULT_PROMPT
from tiny_k3.tokenizer import decode, encode

from . import __doc__ as PACKAGE_DOC
from .launch import ParallelError, run_expert_parallel, run_under_torchrun
from .report import print_report

DEFAULT_PROMPTS = [DEFAULT_PROMPT, "The experts live on", "all_to_all", "K3 on 64 GPUs"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sim.parallel", description=PACKAGE_DOC.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=PACKAGE_DOC[PACKAGE_DOC.index("Run it:"):])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--ranks", type=int, default=None, help="processes to spawn (default 2; torchrun sets it)")
    parser.add_argument("--prompt", action="append", default=None,
                        help="one request per rank, dealt round-robin; repeat for several (default: four prompts)")
    parser.add_argument("--tokens", type=int, default=4, help="tokens to decode after the prompt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default=None, choices=("float32", "float64"))
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, one GPU per rank)")
    parser.add_argument("--port", type=int, default=None, help="rendezvous port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds a MoE collective may wait")
    parser.add_argument("--no-check", action="store_true", help="skip the single-process comparison")
    parser.add_argument("--fail-rank", type=int, default=None, help="drill: this rank dies (or hangs) ...")
    parser.add_argument("--fail-step", type=int, default=1, help="... at the start of this step (0 = prefill)")
    parser.add_argument("--hang", action="store_true", help="drill: the --fail-rank stalls instead of dying")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console()
    prompts = args.prompt or DEFAULT_PROMPTS
    fail = None if args.fail_rank is None else (args.fail_rank, args.fail_step) + (("hang",) if args.hang else ())
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    try:
        ranks = int(os.environ["WORLD_SIZE"]) if torchrun else (args.ranks or 2)
        if torchrun and args.ranks not in (None, ranks):
            raise ValueError(f"--ranks {args.ranks} disagrees with torchrun's WORLD_SIZE {ranks}; leave --ranks out.")
        sequences = [encode(prompts[r % len(prompts)]) for r in range(ranks)]
        common = dict(new_tokens=args.tokens, seed=args.seed, dtype=args.dtype, check=not args.no_check, fail=fail)
        if torchrun:
            run = run_under_torchrun(args.preset, ranks, sequences, args.device, args.timeout, common)
            if run is None:
                return 0
        else:
            run = run_expert_parallel(args.preset, ranks, sequences, device=args.device, port=args.port,
                                      timeout=args.timeout, **common)
    except (ValueError, ParallelError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 1
    print_report(run, console)
    for seq, gen, r in zip(run.sequences, run.generated, run.ranks_of):
        console.print(f"rank {r}: {decode(seq)!r} -> {decode(gen.tolist())!r}")
    return 0
