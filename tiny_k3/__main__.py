"""`python -m tiny_k3 [--preset NAME] [--prompt TEXT] [--tokens N]`: the model, its counts, a few tokens."""

from __future__ import annotations

import argparse
import sys

import torch
from rich.console import Console
from rich.table import Table

from . import K3Config, generate, load_model, parameter_breakdown, parameter_counts, resolve_device
from .config import COUNTED_ONLY, DEFAULT_PRESET, DEFAULT_PROMPT, ConfigError
from .tokenizer import decode, encode
from .weights import CheckpointError


def main(argv: list[str] | None = None) -> int:
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
