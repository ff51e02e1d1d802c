"""`python -m sim`: step a prompt through tiny_k3 without the TUI, for scripts and workshops.

    python -m sim --preset small --prompt "k=4; m=7; a red box. | m=" --steps 16 --layer 3
    python -m sim costs          # K3's serving figures and the corrections, with their sources
    python -m sim measure --quick  # one real-width layer of each kind timed here, composed into K3 and its twin
    python -m sim measure --quick --batch 1,8,64   # the same at each batch, one line per batch
    python -m sim real DIR --synthetic   # a tiny synthetic release in the released format, written, then streamed
    python -m sim real DIR --prompt "Hi" --tokens 4   # a released-format checkpoint, streamed layer by layer

Prints one row per token (the token fed in and the one chosen next, the experts chosen in --layer, the
KDA state norm of --kda-layer, the decode-cache bytes of the hybrid and of its all-MLA twin), then the
memory comparison at the last token with the projection to the real K3 at the same length and at 1M.
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table

from tiny_k3.config import COUNTED_ONLY, DEFAULT_PRESET, DEFAULT_PROMPT, K3Config

from .serving_text import main_costs
from .memory import cache_bytes, format_bytes
from .render import memory_bars
from .session import WEIGHTS, Simulation


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sim", description=__doc__.splitlines()[0],
                                epilog="`python -m sim costs` prints K3's serving figures instead.")
    p.add_argument("--preset", default=DEFAULT_PRESET, help=f"one of: {', '.join(K3Config.runnable_presets())}")
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--steps", type=int, default=16, help="tokens to generate after the prompt")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--device", default=None, help="cpu or cuda (default: $TINY_K3_DEVICE, else cpu)")
    p.add_argument("--weights", default="auto", choices=WEIGHTS)
    p.add_argument("--layer", type=int, default=None, help="MoE layer whose chosen experts are shown (default: the first)")
    p.add_argument("--kda-layer", type=int, default=None, help="KDA layer whose state norm is shown (default: the first)")
    return p


def _check_layers(config: K3Config, layer: int | None, kda_layer: int | None) -> tuple[int, int]:
    moe, kda = config.moe_layers, config.kda_layers
    layer = moe[0] if layer is None else layer
    kda_layer = kda[0] if kda_layer is None else kda_layer
    if layer not in moe:
        raise ValueError(f"--layer {layer} has no MoE; preset {config.name!r} has MoE layers {moe[0]} to {moe[-1]}.")
    if kda_layer not in kda:
        raise ValueError(f"--kda-layer {kda_layer} is not a KDA layer; preset {config.name!r} has KDA layers "
                         f"{', '.join(map(str, kda)) if len(kda) <= 8 else f'{kda[0]} to {kda[-1]} (not every 4th)'}.")
    return layer, kda_layer


def run(args: argparse.Namespace, console: Console) -> None:
    if args.steps < 0:
        raise ValueError(f"--steps must be 0 or more, got {args.steps}.")
    config = K3Config.preset(args.preset)
    layer, kda_layer = _check_layers(config, args.layer, args.kda_layer)
    sim = Simulation(config, args.prompt, seed=args.seed, device=args.device, temperature=args.temperature,
                     weights=args.weights)
    sim.run(args.steps)

    console.print(f"[bold]{config.name}[/]: {config.num_layers} layers ({len(config.kda_layers)} KDA + "
                  f"{len(config.mla_layers)} MLA), {config.top_k} of {config.num_experts} experts · weights "
                  f"{sim.weights} (twin {sim.twin_weights}) · device {sim.device} · seed {sim.seed} · "
                  f"temperature {sim.temperature:g}")
    t = Table(title="one row per token (dim: prompt)", title_justify="left")
    for name, justify in (("pos", "right"), ("in", "left"), ("→ next", "left"), (f"experts L{layer}", "left"),
                          (f"‖S‖ L{kda_layer}", "right"), ("hybrid", "right"), ("twin", "right"), ("ms", "right")):
        t.add_column(name, justify=justify, overflow="fold")
    for f in sim.frames:
        ids = " ".join(str(int(e)) for e in sorted(f.routing_for(layer).expert_ids))
        norm = float(sum(n * n for n in f.kda_for(kda_layer).state_norm) ** 0.5)
        t.add_row(str(f.position), f.input_text, f.token_text, ids, f"{norm:.3f}",
                  format_bytes(f.memory.total_bytes), format_bytes(f.memory.twin_kv_bytes), f"{f.step_ms:.1f}",
                  style="dim" if f.extra.get("prompt") else None)
    console.print(t)
    console.print(f"text: {sim.text!r}")
    for f in sim.frames:
        moment = sim.recall_moment(f.index)
        if moment is not None:
            console.print(recall_line(moment))

    f = sim.frame
    n = f.position + 1
    kv, state = cache_bytes(config, n)
    agree = (kv, state) == (f.memory.kv_bytes, f.memory.state_bytes)
    console.rule(f"[bold]decode cache after {n} tokens[/]")
    console.print(f"hybrid: {format_bytes(f.memory.kv_bytes)} MLA cache (grows) + {format_bytes(f.memory.state_bytes)} "
                  f"KDA state (fixed) · all-MLA twin: {format_bytes(f.memory.twin_kv_bytes)} · measured "
                  f"{'equals' if agree else 'DIFFERS from'} sim.memory.cache_bytes")
    console.print(memory_bars(f, config))


def recall_line(moment) -> str:
    """One line on a recall query: what was asked, what the model said, the head that recalled, the movers."""
    q, head = moment.query, moment.best_head
    said = f"answers {moment.predicted!r} ({'right' if moment.predicted == q.value else 'wrong'})"
    where = (f"KDA L{head.layer} head {head.head} reads back the write at position {head.written_at} "
             f"(cos {head.cosine:.2f})" if head else "no KDA layer")
    movers = ", ".join(f"{m.label} {m.margin:+.2f}" for m in moment.top_moves(3))
    return (f"recall at position {q.position}: {q.key}= asks for {q.value!r}, the model {said}; {where}; "
            f"the answer's margin over other digits {moment.margin:+.2f}, moved most by {movers}")


def _costs(argv: list[str], console: Console) -> int:
    if argv:
        console.print(f"[red]error:[/red] `python -m sim costs` takes no arguments, got {' '.join(argv)!r}.")
        return 2
    main_costs(console)
    return 0


def _measure(argv: list[str], console: Console) -> int:
    from .measure import main_measure

    return main_measure(argv, console)


def _real(argv: list[str], console: Console) -> int:
    from .real import main_real      # a released-format checkpoint streamed from disk (sim/real.py)

    return main_real(argv, console)


# `python -m sim NAME ...`: each subcommand takes (its arguments, the console) and returns the exit status.
SUBCOMMANDS = {"costs": _costs, "measure": _measure, "real": _real}


def main(argv: list[str] | None = None, console: Console | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    console = console or Console()
    if argv[:1] and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]](argv[1:], console)
    args = _parser().parse_args(argv)
    try:
        if args.preset in COUNTED_ONLY:
            raise ValueError(f"preset {args.preset!r} is a full-size model that is only counted, never run; "
                             "`python -m sim costs` prints its serving figures.")
        run(args, console)
    except ValueError as exc:            # ConfigError and CheckpointError are ValueErrors: one sentence each
        console.print(f"[red]error:[/red] {exc}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
