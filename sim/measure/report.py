"""`python -m sim measure`: the measured tables, the GPU rooflines, the reading, and the last line."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..memory import format_bytes
from . import layers as L
from .accelerators import ACCELERATORS, REPORTED_SPEEDUP
from .measurement import MODELS, Measurement, load_saved, measure, save

LABELS = {"kda": "KDA", "mla": "MLA (absorbed)", "moe": "MoE (touched)", "dense": "dense MLP", "head": "norm + head",
          "k2-mla": "K2 MLA", "k2-moe": "K2 MoE", "k2-dense": "K2 dense"}
ORDER = ("kda", "mla", "moe", "dense", "head", "k2-mla", "k2-moe", "k2-dense")


def _rate(value: float, unit: str) -> str:
    """3.35e12, "B/s" -> "3.35 TB/s"; 8.06e10 -> "80.6 GB/s"."""
    for prefix, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if value >= size:
            return f"{value / size:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def timed_keys(m: Measurement) -> list[str]:
    """The timed steps in print order: each layer, the MLA layers once per cache length."""
    return [k for layer in ORDER for k in ([f"{layer}@{t}" for t in m.tokens] if m.work[layer].cache_width
                                          else [layer])]


def kimi_linear_tpot_speedup() -> float:
    from ..costs import KIMI_LINEAR_TPOT_MS

    return KIMI_LINEAR_TPOT_MS["full-MLA"] / KIMI_LINEAR_TPOT_MS["Kimi Linear"]


def cost_model_speedup(tokens: int) -> float:
    """sim.serving's roofline (release format, the full 64-GPU deployment, batch 1): K3's speed over its twin's."""
    from ..serving import FULL, serve

    return serve("twin", FULL, 1, tokens).step_s / serve("K3", FULL, 1, tokens).step_s


def layer_ceiling(m: Measurement) -> float:
    """Twin / K3 when MLA steps are all that costs: 93 / 24 MLA layers (the layer-count ceiling)."""
    return m.schedules["twin"]["mla"] / m.schedules["k3"]["mla"]


def last_line(m: Measurement) -> str:
    n = m.tokens[-1]
    return (f"measured on {m.device}: K3 decodes {m.speedup(n):.2f}x faster than its all-MLA twin at {n:,} tokens "
            f"(bandwidth model: {m.bandwidth_speedup(n):.2f}x; reported: up to {REPORTED_SPEEDUP:g}x)")


def _against_ridge(ratio: float) -> str:
    """Words for a step's FLOP/B divided by a machine's ridge point."""
    if 0.5 <= ratio <= 2:
        return f"near the ridge ({ratio:.2f}x), where moving the bytes and doing the FLOPs take about as long."
    side = "bandwidth" if ratio < 1 else "compute"
    return f"{side}-bound ({ratio:.2f}x the ridge)."


def saved_line(path=None) -> str | None:
    """One line for the TUI's memory panel from this machine's saved real-width measurement (`--save`), or None
    when there is none (or only a tiny-width one, or an unreadable file)."""
    try:
        m = load_saved(path)
    except ValueError:
        return None
    if m is None or m.widths != "k3":
        return None
    n = m.tokens[-1]
    return (f"measured on this machine ({m.device}, {m.dtype}): K3 decodes {m.speedup(n):.2f}x faster than its all-MLA "
            f"twin at {n:,} tokens (bandwidth model {m.bandwidth_speedup(n):.2f}x; python -m sim measure)")


def reading(m: Measurement) -> list[str]:
    """The honest reading of a measurement, every number computed from it."""
    n = m.tokens[-1]
    mla = m.work["mla"]
    intensity = mla.flops_at(n) / mla.bytes_at(n, m.element_bytes)
    bw, fl = m.fractions(f"mla@{n}")
    bound = "compute" if fl > bw else "bandwidth"
    h200 = next(a for a in ACCELERATORS if a.name == "H200")
    gpu_intensity = mla.flops_at(n) / mla.bytes_at(n, 2)
    share = m.parts("k3", n)["mla"] / m.per_token("k3", n)
    twin_share = m.parts("twin", n)["mla"] / m.per_token("twin", n)
    lines = [
        f"At {n:,} cached tokens one MLA step does {intensity:.0f} FLOPs per byte it moves ({m.dtype}); this machine's "
        f"ridge is {m.machine.ridge:.1f} FLOP/B, so the step is {bound}-bound here: it reached {fl:.0%} of the GEMM's "
        f"FLOP/s and {bw:.0%} of the copy bandwidth.",
        f"In bf16 on an H200 the same step does {gpu_intensity:.0f} FLOP/B against a ridge of {h200.ridge:.0f}: "
        + _against_ridge(gpu_intensity / h200.ridge),
        f"MLA layers take {share:.0%} of K3's measured step and {twin_share:.0%} of the twin's; the speed-up can only "
        f"approach the layer-count ceiling {layer_ceiling(m):.2f}x (93 / 24 MLA layers) as MLA comes to dominate both, "
        f"never the reported {REPORTED_SPEEDUP:g}x.",
    ]
    k3_bytes = [m.bytes_per_token("k3", t) for t in (0, 1)]          # both linear in T
    twin_bytes = [m.bytes_per_token("twin", t) for t in (0, 1)]
    grow = (twin_bytes[1] - twin_bytes[0]) - (k3_bytes[1] - k3_bytes[0])
    if grow > 0 and k3_bytes[0] > twin_bytes[0]:
        lines.append(f"A KDA layer holds {m.work['kda'].weights / 1e6:,.0f}M weights, an MLA layer "
                     f"{m.work['mla'].weights / 1e6:,.0f}M: at short context K3 moves more bytes per token than its twin, "
                     f"and the twin's {m.schedules['twin']['mla'] - m.schedules['k3']['mla']} extra latent caches outweigh that only from about "
                     f"{(k3_bytes[0] - twin_bytes[0]) / grow:,.0f} cached tokens (the bytes of these measured layers, every "
                     f"weight in {m.dtype}: not the project's crossover, which `python -m sim costs` gives for the "
                     "release format).")
    rest = [k for k in m.schedules["k3"] if not m.work[k].cache_width]
    rest_bytes = sum(m.schedules["k3"][k] * m.work[k].bytes_at(0, m.element_bytes) for k in rest)
    rest_frac = rest_bytes / sum(m.schedules["k3"][k] * m.seconds[k] for k in rest) / m.machine.bandwidth
    measured, model = m.speedup(n), m.bandwidth_speedup(n)
    if abs(measured / model - 1) > 0.05:
        slower = "MLA ran slower per byte here" if bw < rest_frac else "the other layers ran slower per byte here"
        lines.append(f"Measured {measured:.2f}x vs {model:.2f}x from these layers' bytes: the MLA step at {n:,} reached {bw:.0%} of "
                     f"the copy bandwidth, K3's other layers {rest_frac:.0%} together: {slower}, and the twin has "
                     f"{m.schedules['twin']['mla']} MLA layers to K3's {m.schedules['k3']['mla']}.")
    over = max(m.fractions(k)[0] for k in m.seconds)
    if over > 1:
        lines.append(f"Some steps moved bytes faster than the copy probe did ({over:.0%} of it): the machine was busier "
                     "while the probe ran than during those steps. Under contention read the ratios (one run), not the "
                     "fractions.")
    if m.widths != "k3":
        lines.append("These are tiny widths (--tiny): the numbers test the machinery, not the model.")
    return lines


def report(m: Measurement, console: Console) -> None:
    c = L.widths(m.widths != "k3").k3
    console.rule(f"[bold]K3 decode, measured[/] ({m.widths} widths, random weights, one layer at a time)")
    console.print(f"device {m.device}: {m.device_name} · {m.dtype} · torch {m.torch_version} · {m.machine.threads} "
                  f"threads · median of {m.repeats} after {m.warmup} warm-up · {m.created}", highlight=False)
    console.print(f"this machine: copy {m.machine.bandwidth / 1e9:.1f} GB/s (read + write), GEMM "
                  f"{m.machine.flops / 1e9:.1f} GFLOP/s in {m.dtype}, ridge {m.machine.ridge:.1f} FLOP/B", highlight=False)

    t = Table(title="one decode step of each layer", title_justify="left")
    for col in ("layer", "cached T", "ms", "held", "moves", "GFLOP", "GB/s", "of copy", "GFLOP/s", "of GEMM", "bound"):
        t.add_column(col, justify="left" if col == "layer" else "right")
    for key in timed_keys(m):
        layer, _, tok = key.partition("@")
        tokens = int(tok) if tok else 0
        s, w = m.seconds[key], m.work[layer]
        moved, flops = w.bytes_at(tokens, m.element_bytes), w.flops_at(tokens)
        bw, fl = m.fractions(key)
        held = m.held_bytes[layer] + (w.cache_width * (tokens + 1) * m.element_bytes if w.cache_width else 0)
        t.add_row(LABELS[layer], f"{tokens:,}" if tok else "", f"{1e3 * s:.2f}", format_bytes(held), format_bytes(moved),
                  f"{flops / 1e9:.2f}", f"{moved / s / 1e9:.1f}", f"{bw:.0%}", f"{flops / s / 1e9:.1f}", f"{fl:.0%}",
                  "compute" if fl > bw else "bandwidth")
    console.print(t)
    idle = c.num_experts - c.top_k
    console.print(f"MoE: a decode step reads only its {c.top_k} routed experts (+ {c.num_shared_experts} shared, router, "
                  f"latent projections): {format_bytes(m.held_bytes['moe'])} held here; the whole layer with all "
                  f"{c.num_experts} experts is {format_bytes(m.moe_full_bytes)} in {m.dtype}: the {idle} idle experts count "
                  "in the memory figures (sim.costs), not in the time.", highlight=False)

    slowest = max(m.per_token(k, n) for k in MODELS for n in m.tokens)
    scale, unit = (1.0, "s") if slowest > 10 else (1e3, "ms")
    t = Table(title=f"per-token decode time, composed by the schedules ({unit})", title_justify="left")
    for col in ("cached T", "K3", "twin", "K2-shaped", "twin/K3", "bandwidth model", "K2/K3", "bandwidth model "):
        t.add_column(col, justify="right")
    for n in m.tokens:
        t.add_row(f"{n:,}", *(f"{scale * m.per_token(k, n):.1f}" for k in MODELS), f"{m.speedup(n):.2f}x",
                  f"{m.bandwidth_speedup(n):.2f}x", f"{m.speedup(n, 'k2'):.2f}x", f"{m.bandwidth_speedup(n, 'k2'):.2f}x")
    console.print(t)
    schedule = " + ".join(f"{n} {layer}" for layer, n in m.schedules["k3"].items())
    console.print(f"K3 = {schedule}; twin = {' + '.join(f'{n} {k}' for k, n in m.schedules['twin'].items())}; "
                  f"K2-shaped = {' + '.join(f'{n} {k}' for k, n in m.schedules['k2'].items())}", highlight=False)

    t = Table(title="the measured layers on a GPU roofline: each at max(bytes/BW, FLOPs/peak), every weight bf16, batch 1 "
                    "(the serving table, release format and deployments: python -m sim costs)",
              title_justify="left")
    for col in ("", "bandwidth", "FLOP/s", "ridge", *(f"twin/K3 {n:,}" for n in m.tokens), f"K2/K3 {m.tokens[-1]:,}"):
        t.add_column(col, justify="left" if not col else "right")
    rows = [(a.name, a.bandwidth, a.bf16_flops, 2) for a in ACCELERATORS]
    rows.append((f"this machine ({m.dtype})", m.machine.bandwidth, m.machine.flops, m.element_bytes))
    for name, bw, fl, e in rows:
        t.add_row(name, _rate(bw, "B/s"), _rate(fl, "FLOP/s"), f"{fl / bw:.0f}",
                  *(f"{m.roofline_speedup(n, bw, fl, element_bytes=e):.2f}x" for n in m.tokens),
                  f"{m.roofline_speedup(m.tokens[-1], bw, fl, 'k2', element_bytes=e):.2f}x")
    t.add_row("measured here", "", "", "", *(f"{m.speedup(n):.2f}x" for n in m.tokens), f"{m.speedup(m.tokens[-1], 'k2'):.2f}x")
    console.print(t)
    n = m.tokens[-1]
    console.print(f"reported: up to {REPORTED_SPEEDUP:g}x (Moonshot, k3_facts.md S14), which is Kimi Linear's TPOT at 1M: "
                  f"{kimi_linear_tpot_speedup():.2f}x (S16, S34) · layer-count ceiling {layer_ceiling(m):.2f}x · "
                  f"sim.serving roofline (release format, 64xH200, batch 1) at {n:,}: {cost_model_speedup(n):.2f}x",
                  highlight=False)
    console.print("GPU data: docs/accelerators.md; the GPU rows are per-layer rooflines composed as if one GPU held the "
                  "layers (the ratios do not depend on how many share the work).", highlight=False)
    for line in reading(m):
        console.print(line, highlight=False)
    peak = "peak resident memory of this process" if m.device == "cpu" else "peak CUDA memory allocated"
    console.print(f"{peak}: {format_bytes(m.peak_bytes)}; largest layer held: "
                  f"{format_bytes(max(m.held_bytes.values()))}", highlight=False)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sim measure",
                                description="Time one real-width K3 layer of each kind and compose K3, its all-MLA "
                                            "twin and a K2-shaped model from them.")
    p.add_argument("--tokens", default=None, help="cached tokens for the MLA layers, e.g. 1024,8192,65536 "
                                                  "(default 1024 to 1048576; --quick: to 65536)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: $TINY_K3_DEVICE, else cpu)")
    p.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: float32 on CPU, bfloat16 on CUDA)")
    p.add_argument("--quick", action="store_true", help="at most 65,536 tokens and 3 repeats: a few minutes on 2 cores")
    p.add_argument("--tiny", action="store_true", help="K3's topology at tiny widths: seconds; for tests, not numbers")
    p.add_argument("--save", nargs="?", const="", default=None, metavar="PATH",
                   help="write the measurement as JSON (default bench/results/measure-<device>[-quick].json)")
    return p


def main_measure(argv: list[str], console: Console | None = None) -> int:
    console = console or Console()
    args = _parser().parse_args(argv)
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True) as bar:
            task = None

            def progress(done: int, total: int, what: str) -> None:
                nonlocal task
                if task is None:
                    task = bar.add_task(what, total=total)
                bar.update(task, completed=done, description=what)

            m = measure(args.tokens, device=args.device, dtype=args.dtype, quick=args.quick, tiny=args.tiny,
                        progress=progress)
    except ValueError as exc:        # bad tokens, device, dtype, or too little memory: one sentence each
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        return 2
    report(m, console)
    if args.save is not None:
        console.print(f"saved to {save(m, args.save or None)}", highlight=False)
    console.print(last_line(m), highlight=False, soft_wrap=True)
    return 0
