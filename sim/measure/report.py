"""`python -m sim measure`: the measured tables, the GPU rooflines, the reading, and the last line."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..memory import format_bytes
from . import layers as L
from .accelerators import ACCELERATORS, REPORTED_SPEEDUP
from .measurement import MODELS, Measurement, load_saved, save
from .run import measure

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
    """The CLI's last line (batch 1): the measured speed-up, or why the machine was too loaded to give one."""
    n = m.tokens[-1]
    why = m.distrust()
    if why:
        return (f"measured on {m.device}: too loaded to trust a ratio ({why}); rerun on a quiet machine "
                f"(reported: up to {REPORTED_SPEEDUP:g}x)")
    return (f"measured on {m.device}: K3 decodes {m.speedup(n):.2f}x faster than its all-MLA twin at {n:,} tokens "
            f"(bandwidth model: {m.bandwidth_speedup(n):.2f}x; reported: up to {REPORTED_SPEEDUP:g}x)")


def batch_line(m: Measurement, batch: int) -> str:
    """One line per measured batch: K3's speed over its twin at the longest cache, beside sim.serving's figure."""
    from ..serving import FULL, serve

    n = m.tokens[-1]
    why = m.distrust()
    model = serve("twin", FULL, batch, n).step_s / serve("K3", FULL, batch, n).step_s if m.widths == "k3" else None
    beside = f"sim.serving at batch {batch}, {FULL}: {model:.2f}x" if model else "tiny widths: no serving figure"
    if why:
        return f"batch {batch}: too loaded to trust a ratio ({why}); {beside}"
    return (f"batch {batch}: K3 decodes {m.speedup(n, batch=batch):.2f}x faster than its all-MLA twin at {n:,} tokens, "
            f"{m.speedup(n, 'k2', batch):.2f}x K2-shaped (measured on {m.device}, {m.dtype}; {beside})")


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
    if m.distrust():
        return f"measured on this machine ({m.device}, {m.dtype}): too loaded to trust a ratio ({m.distrust()})"
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
    if abs(measured / model - 1) > 0.05 and m.distrust() is None:
        slower = "MLA ran slower per byte here" if bw < rest_frac else "the other layers ran slower per byte here"
        lines.append(f"Measured {measured:.2f}x vs {model:.2f}x from these layers' bytes: the MLA step at {n:,} reached {bw:.0%} of "
                     f"the copy bandwidth, K3's other layers {rest_frac:.0%} together: {slower}, and the twin has "
                     f"{m.schedules['twin']['mla']} MLA layers to K3's {m.schedules['k3']['mla']}.")
    over = max(m.fractions(k)[0] for k in m.seconds if "#" not in k)
    if over > 1:
        lines.append(f"Some steps moved bytes faster than the copy probe did ({over:.0%} of it): the machine was busier "
                     "while the probe ran than during those steps. Under contention read the ratios (one run), not the "
                     "fractions.")
    if m.widths != "k3":
        lines.append("These are tiny widths (--tiny): the numbers test the machinery, not the model.")
    return lines


def report(m: Measurement, console: Console) -> None:
    """`python -m sim measure`'s tables and reading, in order."""
    for section in (_header, _layer_table, _per_token_table, _roofline_table, _closing_lines):
        section(m, console)


def _header(m: Measurement, console: Console) -> None:
    """The run's circumstances: device, dtype, load, whether it can be trusted, the machine's probes."""
    console.rule(f"[bold]K3 decode, measured[/] ({m.widths} widths, random weights, one layer at a time)")
    console.print(f"device {m.device}: {m.device_name} · {m.dtype} · torch {m.torch_version} · {m.machine.threads} "
                  f"threads · median of {m.repeats} after {m.warmup} warm-up · {m.created}", highlight=False)
    load = (f"load average {m.load_at_start:.2f} on {m.cpus} CPUs at start" if m.load_at_start >= 0
            else "load at start not recorded")
    busy = m.busy
    console.print(f"{m.dtype}: {m.dtype_reason or 'not recorded'} · {load} · "
                  + (f"CPU time / (wall time x threads) over the steps: {busy:.0%}" if busy is not None
                     else "CPU time not recorded" if m.device == "cpu" else "CUDA: wall time (the host waits)"),
                  highlight=False)
    why = m.distrust()
    if why:
        console.print(f"[bold red]too loaded to trust:[/] {why}; the tables show what was timed, the lines below give "
                      "no ratio.", highlight=False)
    console.print(f"this machine: copy {m.machine.bandwidth / 1e9:.1f} GB/s (read + write), GEMM "
                  f"{m.machine.flops / 1e9:.1f} GFLOP/s in {m.dtype}, ridge {m.machine.ridge:.1f} FLOP/B", highlight=False)


def _layer_table(m: Measurement, console: Console) -> None:
    """One decode step of each layer: time, bytes held and moved, FLOPs, and the bound that wins."""
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
    c = L.widths(m.widths != "k3").k3
    idle = c.num_experts - c.top_k
    console.print(f"MoE: a decode step reads only its {c.top_k} routed experts (+ {c.num_shared_experts} shared, router, "
                  f"latent projections): {format_bytes(m.held_bytes['moe'])} held here; the whole layer with all "
                  f"{c.num_experts} experts is {format_bytes(m.moe_full_bytes)} in {m.dtype}: the {idle} idle experts count "
                  "in the memory figures (sim.costs), not in the time.", highlight=False)


def _per_token_table(m: Measurement, console: Console) -> None:
    """The per-token decode time of each model, composed by its layer schedule, with the ratios."""
    slowest = max(m.per_token(k, n) for k in MODELS for n in m.tokens)
    scale, unit = (1.0, "s") if slowest > 10 else (1e3, "ms")
    t = Table(title=f"per-token decode time, composed by the schedules ({unit})", title_justify="left")
    for col in ("cached T", "K3", "twin", "K2-shaped", "twin/K3", "bandwidth model", "K2/K3", "bandwidth model "):
        t.add_column(col, justify="right")
    untrusted = m.distrust() is not None          # a loaded machine: the times are shown, no measured ratio
    for n in m.tokens:
        t.add_row(f"{n:,}", *(f"{scale * m.per_token(k, n):.1f}" for k in MODELS),
                  "too loaded" if untrusted else f"{m.speedup(n):.2f}x", f"{m.bandwidth_speedup(n):.2f}x",
                  "too loaded" if untrusted else f"{m.speedup(n, 'k2'):.2f}x", f"{m.bandwidth_speedup(n, 'k2'):.2f}x")
    console.print(t)
    if len(m.batches) > 1:
        batch_tables(m, console)
    schedule = " + ".join(f"{n} {layer}" for layer, n in m.schedules["k3"].items())
    console.print(f"K3 = {schedule}; twin = {' + '.join(f'{n} {k}' for k, n in m.schedules['twin'].items())}; "
                  f"K2-shaped = {' + '.join(f'{n} {k}' for k, n in m.schedules['k2'].items())}", highlight=False)


def _roofline_table(m: Measurement, console: Console) -> None:
    """The measured layers on each GPU's roofline, beside this machine's."""
    untrusted = m.distrust() is not None
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
    if not untrusted:
        t.add_row("measured here", "", "", "", *(f"{m.speedup(n):.2f}x" for n in m.tokens),
                  f"{m.speedup(m.tokens[-1], 'k2'):.2f}x")
    console.print(t)


def _closing_lines(m: Measurement, console: Console) -> None:
    """The reported figure beside the layer-count ceiling and sim.serving's, the reading, the memory peak."""
    n = m.tokens[-1]
    console.print(f"reported: up to {REPORTED_SPEEDUP:g}x (Moonshot, no baseline named, S14; its story: k3_facts.md §0), "
                  f"whose number matches Kimi Linear's TPOT at 1M: "
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


def batch_tables(m: Measurement, console: Console) -> None:
    """Each layer kind at each batch (wall and CPU ms per step), then the composed step per batch."""
    t = Table(title="one decode step of each layer kind per batch: wall ms / CPU ms (MoE: shell + experts touched)",
              title_justify="left")
    t.add_column("layer")
    for b in m.batches:
        t.add_column(f"B={b}", justify="right")
    n = m.tokens[-1]
    for layer in ORDER:
        if layer not in m.work:
            continue
        key = f"{layer}@{n}" if m.work[layer].cache_width else layer
        cells = []
        for b in m.batches:
            k = key if b == 1 else f"{key}#{b}"
            wall, cpu = m.seconds.get(k), m.cpu_seconds.get(k)
            cells.append("-" if wall is None else f"{1e3 * wall:.2f} / {1e3 * cpu:.2f}" if cpu is not None
                         else f"{1e3 * wall:.2f}")
        t.add_row(LABELS[layer] + (f" @{n:,}" if m.work[layer].cache_width else ""), *cells)
    console.print(t)
    t = Table(title=f"one decode step per batch at {n:,} cached tokens, composed by the schedules (ms)",
              title_justify="left")
    for col in ("batch", "K3", "twin", "K2-shaped", "K3 tok/s", "twin tok/s"):
        t.add_column(col, justify="right")
    for b in m.batches:
        k3, twin, k2 = (m.per_token(x, n, b) for x in MODELS)
        t.add_row(str(b), f"{1e3 * k3:.1f}", f"{1e3 * twin:.1f}", f"{1e3 * k2:.1f}", f"{b / k3:.2f}", f"{b / twin:.2f}")
    console.print(t)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sim measure",
                                description="Time one real-width K3 layer of each kind and compose K3, its all-MLA "
                                            "twin and a K2-shaped model from them.")
    p.add_argument("--tokens", default=None, help="cached tokens for the MLA layers, e.g. 1024,8192,65536 "
                                                  "(default 1024 to 1048576; --quick: to 65536)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: $TINY_K3_DEVICE, else cpu)")
    p.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: bfloat16 on CUDA and on a CPU with bf16 "
                                                 "instructions, else float32)")
    p.add_argument("--batch", default=None, help="sequences per decode step, e.g. 1,8,64 (default 1; --quick: at most 64)")
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
                        progress=progress, batches=args.batch)
    except ValueError as exc:        # bad tokens, device, dtype, or too little memory: one sentence each
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        return 2
    report(m, console)
    if args.save is not None:
        console.print(f"saved to {save(m, args.save or None)}", highlight=False)
    for b in m.batches:
        console.print(batch_line(m, b), highlight=False, soft_wrap=True)
    console.print(last_line(m), highlight=False, soft_wrap=True)
    return 0
