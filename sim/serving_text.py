"""What the project says about serving, as text: `python -m sim costs`, the corrections of k3_facts.md §0, the
speed-up grid, and the sentences the README, docs and lessons quote.

Every number here comes from sim.costs (bytes, FLOPs, GPUs, prices) and sim.serving (the one speed-up table,
`speedups()`); this module only words and lays them out, so a sentence can never disagree with the table it quotes
(tests/test_serving.py checks the README and docs/k3_facts.md §5c against these functions).

"Up to 6.3x" has one story, told here and nowhere else (`claim_readings()`, `claim_story()`): Moonshot's wording
names no baseline (S14); MarkTechPost's summary reads it as K3 against K2 (S39); the number matches Kimi Linear's
measured time per output token against a full-MLA baseline at 1M (S16, S34); this project's roofline gives K3
against its all-MLA twin and against K2. The README, docs/k3_facts.md §0, lessons 3 and 5 and `python -m sim costs`
print or quote it from here (tests/test_speedup_story.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from tiny_k3 import K3Config, parameter_counts

from .costs import (GPU_MEMORY, KIMI_LINEAR_TPOT_MS, SCHEMES, api_price, ep_traffic_for, gpus_needed,
                    k2_parameters, packed_bytes, total_parameters, weight_bytes)
from .memory import MIB_CONTEXT, format_bytes, project_to_k3
from .serving import (COLUMNS, CONTEXTS, DEPLOYMENTS, ETA, FULL, OVERHEAD, ROWS, Column, Served, ServingTable,
                      context_name, crossover, headline, models, per_sequence_bytes, serve, speedups)

# ---------------------------------------------------------------------------- "up to 6.3x": the one story

@dataclass(frozen=True)
class Reading:
    """One reading of Moonshot's "up to 6.3x": who gives it, the figure, its kind, what it says, its sources."""

    who: str
    value: float
    kind: str           # claim, reading (of the claim), measurement, roofline (this project's table)
    says: str
    sources: str


def _best(row: str):
    """The row's cell with the largest speed-up (the table's `closest` figure), and where it is, in words."""
    t = speedups()
    cell = max((c for c in t.cells if c.row == row and c.speedup is not None), key=lambda c: c.speedup)
    assert cell.speedup == t.closest[row].value
    col = cell.column
    where = (f"{context_name(cell.context)}, the largest batch {col.deployment} holds" if col.batch is None else
             f"{context_name(cell.context)}, batch {col.batch} on {col.deployment}")
    return cell, where


def claim_readings() -> tuple[Reading, ...]:
    """Every reading of "up to 6.3x", in the order a learner should meet them; the figures are sim.serving's."""
    t = speedups()
    (twin, twin_where), (k2, k2_where) = _best("K3 against twin"), _best("K3 against K2")
    twin_one, k2_one = (t.speedup(row, "1M", "batch 1") for row in ROWS)
    return (
        Reading("Moonshot's wording", t.claim.value, "claim",
                f'"up to {t.claim.value:g}x faster decoding in million-token contexts", for Delta Attention: no '
                "baseline named", "S14"),
        Reading("MarkTechPost's summary", t.claim.value, "reading", 'reads it as faster "than predecessor K2"',
                "S39"),
        Reading("Kimi Linear's measurement", t.kimi_linear.value, "measurement",
                f"time per output token at 1M against a full-MLA baseline, {KIMI_LINEAR_TPOT_MS['full-MLA']} -> "
                f"{KIMI_LINEAR_TPOT_MS['Kimi Linear']} ms", "S16, S34"),
        Reading("this project: K3 against its all-MLA twin", twin.speedup, "roofline",
                f"at most {twin.speedup:.2f}x ({twin_where}: {twin.k3.batch:,} sequences against "
                f"{twin.other.batch:,}); {twin_one:.2f}x at 1M, batch 1", "sim.serving.speedups"),
        Reading("this project: K3 against K2", k2.speedup, "roofline",
                f"at most {k2.speedup:.2f}x ({k2_where}: {k2.k3.batch:,} sequences against {k2.other.batch:,}); "
                f"{k2_one:.2f}x at 1M, batch 1", "sim.serving.speedups"),
    )


def claim_story() -> str:
    """The "up to 6.3x" story in two sentences, every figure from `claim_readings()`: what the README, k3_facts.md
    §0, lessons 3 and 5 and the §0 correction say, word for word."""
    said, read, measured, twin, k2 = claim_readings()
    t = speedups()
    _, twin_where = _best("K3 against twin")
    _, k2_where = _best("K3 against K2")
    where = f"both at {twin_where}" if twin_where == k2_where else f"at {twin_where} and {k2_where}"
    return (f"Moonshot's \"up to {said.value:g}x faster decoding in million-token contexts\" names no baseline "
            f"({said.sources}); MarkTechPost's summary reads it as faster \"than predecessor K2\" ({read.sources}); the "
            f"number matches Kimi Linear's measured time per output token against a full-MLA baseline at 1M, "
            f"{KIMI_LINEAR_TPOT_MS['full-MLA']} -> {KIMI_LINEAR_TPOT_MS['Kimi Linear']} ms = {measured.value:.2f}x "
            f"({measured.sources}). This project's roofline (sim.serving) gives K3 at most {twin.value:.2f}x its "
            f"all-MLA twin and {k2.value:.2f}x K2 ({where}), and at 1M and batch 1 "
            f"{t.speedup('K3 against twin', '1M', 'batch 1'):.2f}x its twin and "
            f"{t.speedup('K3 against K2', '1M', 'batch 1'):.2f}x K2.")


# ---------------------------------------------------------------------------- corrections (§0)


def corrections() -> list[dict]:
    """The four corrections of k3_facts.md §0, each with its claim, the figures that settle it and sources.
    The speed-up figures are `sim.serving.speedups()`'s (the one place they are computed)."""
    k3 = K3Config.preset("k3")
    return [_speedup_correction(), _weights_correction(k3), _accelerators_correction(k3), _attention_correction(k3)]


def _speedup_correction() -> dict:
    t = speedups()
    big = f"largest fit, {FULL}"
    return {
        "claim": '6.3x faster decoding at 1M, read as K3 against K2',
        "verdict": claim_story() + f" Against the twin it stays under the same-weights bound, {t.bound.value:.2f}x "
                                   f"({t.bound.where.split(':')[0]}).",
        "figures": {
            "Kimi Linear reported speedup": t.kimi_linear.value,
            "Kimi Linear roofline vs its all-MLA twin, B=1, 1M": t.kimi_linear_model.value,
            "Kimi Linear KV-only limit": t.kimi_linear_bound.value,
            "bound: same weights, KV only, L/L_full": t.bound.value,
            "bound at 1M (B -> inf)": t.kv_only[MIB_CONTEXT],
            "K3 against twin, B=1, 1M": t.speedup("K3 against twin", "1M", "batch 1"),
            f"K3 against twin, {big}, 1M": t.speedup("K3 against twin", "1M", big),
            "K3 against K2, B=1, 1M (K3 slower)": t.speedup("K3 against K2", "1M", "batch 1"),
            f"K3 against K2, {big}, 1M": t.speedup("K3 against K2", "1M", big),
        },
        "sources": ["S14", "S39", "S16", "S34"],
    }


def _weights_correction(k3: K3Config) -> dict:
    k2_experts, k2_rest = k2_parameters()
    return {
        "claim": 'MXFP4 weights "~1.4 TB (or ~594 GB)"',
        "verdict": "1.4 TB is the naive 2.8T x 4 bit; the release (MXFP4 experts, BF16 rest) is 1.56 TB. "
                   "594 GB is K2-Thinking's INT4 checkpoint (or K3's 1-bit GGUF), not K3's MXFP4 release.",
        "figures": {
            "naive 2.8e12 x 4 bit (B)": 2.8e12 * 4 / 8,
            "everything MXFP4, 4.25 bit (B)": weight_bytes(k3, "mxfp4"),
            "K3 release: MXFP4 experts + BF16 rest (B)": weight_bytes(k3, "k3-release"),
            "K2-Thinking INT4 experts + BF16 rest (B)": packed_bytes(k2_experts, "int4") + packed_bytes(k2_rest, "bf16"),
            "594 GB on K3 params (bit/param)": 594e9 * 8 / total_parameters(k3),
        },
        "sources": ["S7", "S13", "S15", "S35"],
    }


def _accelerators_correction(k3: K3Config) -> dict:
    return {
        "claim": '"64+ accelerators / 8xH100 INT4 256K"',
        "verdict": '"64+" is Moonshot\'s recommendation; "8 GPUs, INT4, 256K" is the K2-Thinking guide (H200). '
                   "8xH100 (and 8xH200) cannot hold K3's 1.56 TB; the smallest recipes are 8xB300, 8xMI350X/MI355X, "
                   "16xH200, 16xB200, 32xH100.",
        "figures": {
            "K3 release weights (B)": weight_bytes(k3, "k3-release"),
            **{f"8x{name} memory (B)": 8 * mem for name, mem in GPU_MEMORY.items()},
            **{f"{name} GPUs needed (10% overhead)": gpus_needed(k3, mem) for name, mem in GPU_MEMORY.items()},
        },
        "sources": ["S5", "S11", "S13", "S20"],
    }


def _attention_correction(k3: K3Config) -> dict:
    return {
        "claim": '"attention type on full layers (MLA?)"',
        "verdict": "Yes: gated MLA with NoPE (mla_use_nope, mla_use_output_gate) on 24 of 93 layers.",
        "figures": {
            "MLA layers": len(k3.mla_layers),
            "KDA layers": len(k3.kda_layers),
            "MLA layers (1-based)": [i + 1 for i in k3.mla_layers],
            "cached values per MLA token (kv_lora + rope)": k3.mla_cache_width,
        },
        "sources": ["S1"],
    }


# ---------------------------------------------------------------------------- the report


def main_costs(console=None) -> None:
    """Print K3's serving figures and the §0 corrections (`python -m sim costs`)."""
    console = console or Console()
    k3 = K3Config.preset("k3")
    total, active = parameter_counts(k3)
    console.rule("[bold]Kimi K3 serving figures[/] (k3_facts.md; decimal units)")
    console.print(f"parameters: total {total / 1e12:.4f}T, active per token {active / 1e9:.1f}B "
                  f"({total / active:.0f}x fewer touched than stored)")

    t = Table(title="weights by storage scheme")
    t.add_column("scheme"), t.add_column("bytes", justify="right"), t.add_column("8xH100 / 8xH200 / 8xB300 hold it?")
    for scheme in SCHEMES:
        n = weight_bytes(k3, scheme)
        t.add_row(scheme, format_bytes(n, 3), " / ".join("yes" if 8 * m >= n else "no" for m in GPU_MEMORY.values()))
    console.print(t)

    t = Table(title="decode cache per sequence")
    for col in ("context", "K3 KV", "+ KDA state", "all-MLA twin", "plain MHA"):
        t.add_column(col, justify="right")
    for tokens in (1, 131072, 262144, MIB_CONTEXT):
        p = project_to_k3(tokens)
        t.add_row(f"{tokens:,}", format_bytes(p.kv), format_bytes(p.state), format_bytes(p.twin), format_bytes(p.mha))
    console.print(t)

    print_table(console)

    gpus = ", ".join(f"{name} {gpus_needed(k3, mem)}" for name, mem in GPU_MEMORY.items())
    console.print(f"GPUs to hold the release weights (10% overhead): {gpus}")
    ep = ep_traffic_for(k3, 64)
    console.print(f"EP64 all-to-all per token: {format_bytes(ep.per_token)} over {ep.moe_layers} MoE layers, "
                  f"{ep.destinations:.1f} distinct GPUs per token per layer")
    console.print(f"API example, 100K input (80K cached) + 2K output: ${api_price(100_000, 2_000, 80_000):.4f}")

    console.rule("[bold]Corrections[/] (k3_facts.md §0)")
    for c in corrections():
        console.print(f"[bold]{c['claim']}[/] [dim]({', '.join(c['sources'])})[/]\n  {c['verdict']}")
        for name, value in c["figures"].items():
            shown = (format_bytes(value, 3) if name.endswith("(B)") else f"{value:.2f}" if isinstance(value, float)
                     else str(value))
            console.print(f"    {name}: {shown}")



def _ms(s: float) -> str:
    return f"{1e3 * s:.2f}"


SHORT = {"K3 against twin": "against twin", "K3 against K2": "against K2"}


def _column_label(col: Column) -> str:
    return f"B={col.batch}" if col.batch else f"fit {col.deployment}"


def _side(s: Served) -> str:
    """One model's side of a cell in three short lines."""
    if not s.batch:
        return "none fit"
    fits = f"fits (holds {s.fitting_batch:,})" if s.fits else f"DOES NOT FIT (holds {s.fitting_batch:,})"
    return (f"B={s.batch:,} {fits}\nreads {format_bytes(s.weights_read)} of weights\n"
            f"{_ms(s.t_bytes)} ms bytes, {_ms(s.t_flops)} FLOPs: {s.bound}\n{s.tokens_per_s_per_gpu:,.0f} tok/s per GPU")


def print_table(console, table: ServingTable | None = None) -> None:
    """`python -m sim costs`' serving section: the speed-up grid, each cell's parts, memory, the labelled figures."""
    t = table or speedups()
    console.rule("[bold]Serving: K3's tokens/s per GPU over its all-MLA twin's and K2's[/] (sim.serving.speedups)")
    console.print(f"twin = K3Config.twin(): every attention layer K3's own MLA at K3's widths, with its own weights. "
                  f"Step time = max(bytes / (G BW eta), FLOPs / (G F eta)), eta = {ETA}, no communication; the weights "
                  "read grow with the experts the batch touches. B=1 and B=64 run on the full deployment "
                  f"({FULL}); 'fit D' runs each model at the largest batch D holds. n/a: a model cannot hold that batch.",
                  highlight=False)
    grid = Table(title="speed-up", title_justify="left")
    grid.add_column("")
    for col in COLUMNS:
        grid.add_column(_column_label(col), justify="right")
    for row in ROWS:
        for name, context in CONTEXTS.items():
            cells = [t.cell(row, context, col.name) for col in COLUMNS]
            grid.add_row(f"{SHORT[row]} {name}", *("n/a" if c.speedup is None else f"{c.speedup:.2f}x" for c in cells))
    grid.add_row("bound: same weights, KV only", *[f"{t.bound.value:.2f}x"] * len(COLUMNS), style="dim")
    console.print(grid)
    for name in ("128K", "1M"):
        console.print(latency_and_throughput(name), highlight=False)
    console.print(f"The bound ({t.bound.where}) is no serving figure; its value as the batch grows: "
                  + ", ".join(f"{context_name(n)} {v:.2f}x" for n, v in t.kv_only.items()) + ".", highlight=False)

    detail = Table(title="each cell: the step from bytes and from FLOPs (the larger wins), tokens/s per GPU",
                   title_justify="left", show_lines=True)
    detail.add_column("")
    for name in models():
        detail.add_column(name)
    for name, context in CONTEXTS.items():
        for col in COLUMNS:
            sides = [t.cell("K3 against twin", context, col.name).k3, t.cell("K3 against twin", context, col.name).other,
                     t.cell("K3 against K2", context, col.name).other]
            detail.add_row(f"{name}\n{_column_label(col)}", *(_side(s) for s in sides))
    console.print(detail)

    mem = Table(title=f"memory: each GPU keeps {OVERHEAD:.0%} for activations and runtime; the rest holds weights "
                      "and caches", title_justify="left")
    mem.add_column("deployment")
    mem.add_column("left after weights\nK3 / twin / K2", justify="right")
    for name in models():
        mem.add_column(f"{name}: largest batch\n4K / 128K / 1M", justify="right")
    for d in DEPLOYMENTS.values():
        served = {n: [serve(n, d, None, ctx) for ctx in CONTEXTS.values()] for n in models()}
        mem.add_row(d.name, " / ".join(format_bytes(s[0].memory_left) for s in served.values()),
                    *(" / ".join(f"{x.fitting_batch:,}" for x in s) for s in served.values()))
    console.print(mem)
    for d in DEPLOYMENTS.values():
        console.print(f"  {d.name}: {d.why}", highlight=False)
    console.print("KV + state per sequence at 4K / 128K / 1M: " + "; ".join(
        f"{n} " + " / ".join(format_bytes(per_sequence_bytes(models()[n][0], c)) for c in CONTEXTS.values())
        for n in models()), highlight=False)

    for f in (*t.closest.values(), t.claim, t.kimi_linear, t.kimi_linear_model):
        console.print(f"{f.label}: {f.value:.2f}x ({f.kind}; {f.where}) [{f.source}]", highlight=False)
    console.print(crossover_sentence(), highlight=False)
    console.print(summary(), highlight=False)


def grid_text(table: ServingTable | None = None) -> str:
    """The speed-up grid as plain text (lessons print it; `print_table` prints the same cells with rich)."""
    t = table or speedups()
    labels = [_column_label(c) for c in COLUMNS]
    rows = [["", *labels]]
    for row in ROWS:
        for name, context in CONTEXTS.items():
            rows.append([f"{SHORT[row]} {name}", *("n/a" if c.speedup is None else f"{c.speedup:.2f}x"
                                                   for c in (t.cell(row, context, col.name) for col in COLUMNS))])
    rows.append(["bound: same weights, KV only", *[f"{t.bound.value:.2f}x"] * len(COLUMNS)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(r[0].ljust(widths[0]) + "".join(f"  {v:>{w}}" for v, w in zip(r[1:], widths[1:])) for r in rows)


def latency_and_throughput(context: str = "1M", dep: str = FULL) -> str:
    """Batch-1 latency beside throughput at the largest batch, for the three models: the two stories side by side."""
    t = speedups()
    one, fit = t.cell("K3 against twin", context, "batch 1"), t.cell("K3 against twin", context, f"largest fit, {dep}")
    k2one, k2fit = t.cell("K3 against K2", context, "batch 1").other, t.cell("K3 against K2", context, f"largest fit, {dep}").other
    lat = ", ".join(f"{s.name} {_ms(s.step_s)} ms" for s in (one.k3, one.other, k2one))
    thr = ", ".join(f"{s.name} {s.tokens_per_s_per_gpu:,.0f} ({s.batch:,} sequences)" for s in (fit.k3, fit.other, k2fit))
    return (f"at {context} on {dep}: batch-1 latency per token {lat}; tokens/s per GPU at the largest batch that fits "
            f"{thr}.")


def crossover_sentence() -> str:
    b1, b64, bound = crossover(1), crossover(64), crossover(1, same_weights=True)
    return (f"K3 decodes at least as fast as its twin from {b1:,} tokens at batch 1 and from {b64:,} at batch 64 "
            f"({FULL}); under the same-weights bound (not a serving figure) from {bound:,} at batch 1.")


def summary() -> str:
    """The sentence a learner can repeat, every number from the table."""
    t = speedups()
    big, small = f"largest fit, {FULL}", "largest fit, 16xH200"
    c = {(r, n, col): t.cell(r, n, col) for r in ROWS for n in CONTEXTS for col in (big, small, "batch 1")}
    one = c[("K3 against K2", "4K", "batch 1")]
    return (f"K3 is cheaper to serve than its all-MLA twin when many long sequences share the GPUs: its 24 latent "
            f"caches instead of 93 let {FULL} hold {c[('K3 against twin', '1M', big)].k3.batch} sequences of 1M tokens "
            f"against the twin's {c[('K3 against twin', '1M', big)].other.batch}, for {c[('K3 against twin', '1M', big)].speedup:.2f}x "
            f"the twin's tokens/s per GPU ({c[('K3 against twin', '128K', big)].speedup:.2f}x at 128K). Against K2 it wins only "
            f"at long context: {c[('K3 against K2', '1M', big)].speedup:.2f}x at 1M on {FULL} "
            f"({c[('K3 against K2', '1M', small)].speedup:.2f}x on 16xH200), {c[('K3 against K2', '128K', big)].speedup:.2f}x at "
            f"128K on {FULL} but {c[('K3 against K2', '128K', small)].speedup:.2f}x on 16xH200, where its larger weights leave "
            f"less room for caches. At batch 1 it is slower than K2 at every context "
            f"({c[('K3 against K2', '4K', 'batch 1')].speedup:.2f}x at 4K, {c[('K3 against K2', '1M', 'batch 1')].speedup:.2f}x at "
            f"1M: it reads {format_bytes(one.k3.weights_read)} of weights a step against K2's "
            f"{format_bytes(one.other.weights_read)}) and slower than its twin below {crossover(1):,} tokens "
            f"({c[('K3 against twin', '4K', 'batch 1')].speedup:.2f}x at 4K: a KDA layer holds more weights than an MLA layer).")


def markdown_table(table: ServingTable | None = None) -> str:
    """docs/k3_facts.md §5c's table, as that file prints it (tests/test_serving.py checks the file against this)."""
    t = table or speedups()
    head = "| row | context | " + " | ".join(_column_label(c) for c in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (2 + len(COLUMNS))]
    for row in ROWS:
        for name, context in CONTEXTS.items():
            cells = [t.cell(row, context, c.name) for c in COLUMNS]
            lines.append(f"| {row} | {name} | " + " | ".join(
                "n/a" if c.speedup is None else f"{c.speedup:.2f}x" for c in cells) + " |")
    lines.append(f"| {t.bound.label} | any | " + " | ".join([f"{t.bound.value:.2f}x"] * len(COLUMNS)) + " |")
    batches = ["", "| largest batch (K3 / twin / K2) | context | " + " | ".join(d for d in DEPLOYMENTS) + " |",
               "|" + "---|" * (2 + len(DEPLOYMENTS))]
    for name, context in CONTEXTS.items():
        batches.append(f"| | {name} | " + " | ".join(
            " / ".join(f"{serve(n, d, None, context).fitting_batch:,}" for n in models()) for d in DEPLOYMENTS) + " |")
    batches.append("| memory left after weights and activations | | " + " | ".join(
        " / ".join(format_bytes(serve(n, d, None, 4096).memory_left) for n in models()) for d in DEPLOYMENTS) + " |")
    return "\n".join(lines + batches)


def readme_line() -> str:
    """README's one line of serving figures (tests/test_serving.py checks the README against this)."""
    h, t = headline(), speedups()
    one = t.cell("K3 against K2", "4K", "batch 1")
    return (f"At 1M tokens with the batch full on {FULL}, K3 serves {h['twin_fit_1M']:.2f}x the tokens/s per GPU of its "
            f"all-MLA twin and {h['k2_fit_1M']:.2f}x K2's; at batch 1 it is {h['twin_b1_1M']:.2f}x its twin and "
            f"{h['k2_b1_1M']:.2f}x K2 (slower: it reads {format_bytes(one.k3.weights_read, 0)} of weights a step "
            f"against K2's {format_bytes(one.other.weights_read, 0)}).")
