"""`python -m tiny_k3 [--preset NAME] [--prompt TEXT] [--tokens N]`: the model, its counts, a few tokens.

`python -m tiny_k3 diff A B [--changed]`: what changed from preset A to preset B, part by part, with the
parameter and cache-byte deltas (`diff k2 k3`, `diff kimi-linear-48b k3`: what K3 changed).
"""

from __future__ import annotations

import argparse
import sys

import torch
from rich.console import Console
from rich.table import Table

from . import K3Config, generate, load_model, parameter_breakdown, parameter_counts, resolve_device
from .params import selection_bias_count
from .config import COUNTED_ONLY, DEFAULT_PRESET, DEFAULT_PROMPT, ConfigError
from .tokenizer import decode, encode
from .weights import CheckpointError


def diff_main(argv: list[str]) -> int:
    """`python -m tiny_k3 diff A B`: a table of the parts of A and B with their deltas."""
    from .lineage import diff

    parser = argparse.ArgumentParser(prog="python -m tiny_k3 diff", description="What changed from preset A to B.")
    parser.add_argument("a", help=f"one of: {', '.join(K3Config.presets())}")
    parser.add_argument("b")
    parser.add_argument("--changed", action="store_true", help="show only the parts that changed")
    args = parser.parse_args(argv)
    console = Console(width=max(Console().width, 160))
    try:
        a, b = K3Config.preset(args.a), K3Config.preset(args.b)
    except ConfigError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    table = Table(title=f"what changed from {a.name!r} to {b.name!r}")
    for column in ("part", a.name, b.name, "delta"):
        table.add_column(column, justify="right" if column == "delta" else "left", overflow="fold")
    for d in diff(a, b):
        if args.changed and not d.changed:
            continue
        unit = " B" if d.unit == "bytes" else ""
        delta = f"{d.delta:+,}{unit}" if d.unit and d.delta else ("" if d.changed else "same")
        table.add_row(d.part, d.before, d.after if d.changed else "=", delta)
    console.print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "diff":
        return diff_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m tiny_k3", description=__doc__)
    parser.add_argument("--preset", default=DEFAULT_PRESET, help=f"one of: {', '.join(K3Config.presets())}")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    console = Console()
    try:
        cfg = K3Config.preset(args.preset)
        total, active = parameter_counts(cfg)
        table = Table(title=f"tiny-k3 preset {cfg.name!r}: {cfg.num_layers} layers "
                            f"({len(cfg.kda_layers)} KDA + {len(cfg.mla_layers)} MLA), "
                            f"{cfg.top_k} of {cfg.num_experts} experts")
        table.add_column("part")
        table.add_column("parameters", justify="right")
        for part, n in parameter_breakdown(cfg).items():
            table.add_row(part, f"{n:,}")
        table.add_row("[b]total[/b]", f"[b]{total:,}[/b]")
        if bias_values := selection_bias_count(cfg):   # a buffer here, a Parameter in the released code
            table.add_row("(+ router selection bias, a buffer here)", f"{bias_values:,}")
        table.add_row("[b]active per token[/b]", f"[b]{active:,}[/b] ({active / total:.1%})")
        console.print(table)
        if cfg.name in COUNTED_ONLY:
            console.print(f"{cfg.name} is counted on the meta device only; pick a runnable preset to generate text.")
            return 0
        device = resolve_device(args.device)
        model, source = load_model(cfg.name, "auto", args.seed, device)
        prompt = torch.tensor([encode(args.prompt)], device=device)
        out = generate(model, prompt, args.tokens, temperature=0.0, seed=args.seed)
        console.print(f"weights: {'trained (shipped)' if source == 'trained' else f'random (seed {args.seed})'}")
        console.print(f"prompt: {args.prompt!r}\ngreedy continuation: {decode(out[0].tolist())!r}")
    except (ConfigError, CheckpointError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
