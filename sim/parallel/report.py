"""A run's measured traffic beside the analytic figures: for its own preset and for the real K3 on 64 GPUs
(k3_facts.md §6b, computed in sim.costs)."""

from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table

from tiny_k3 import K3Config

from ..costs import expected_destinations, k3_ep_figures, load_imbalance
from ..memory import format_bytes
from .sharded import META_BYTES
from .traffic import EPRun

PRESET_SAMPLES = 1 << 13  # Monte-Carlo tokens for the run's own preset (K3's figures use costs' default)


def comparison(run: EPRun, k3: dict | None = None) -> list[dict]:
    """Measured (the run) vs analytic (its preset, uniform routing) vs analytic (K3 EP64), one dict per quantity.

    Keys: quantity, measured, tiny (the run's preset, analytic), k3, note.
    """
    cfg, N = K3Config.preset(run.preset), run.world_size
    k3 = k3 or k3_ep_figures()
    tr = run.traffic
    tokens = sum(int(t.tokens.sum()) for t in tr)
    copies = sum(int(t.copies.sum()) for t in tr)
    cross = sum(int(t.copies.sum() - np.trace(t.copies)) for t in tr)
    dest = expected_destinations(N, cfg.top_k)
    latent = run.info["latent_row_bytes"]
    meta = 2 * cfg.top_k * META_BYTES
    prefill = [t for t in tr if t.step == 0]
    batch = int(prefill[0].tokens.sum())
    return [
        dict(quantity="distinct ranks per token", measured=copies / tokens, tiny=dest, k3=k3["destinations"],
             note=f"of k = {cfg.top_k} ({run.preset}) and {k3['top_k']} (K3); uniform routing: N(1 - (1 - 1/N)^k)"),
        dict(quantity="cross-rank share of copies", measured=cross / copies, tiny=1 - 1 / N,
             k3=k3["cross_gpu_fraction"], note="copies that leave their rank; uniform routing: 1 - 1/N"),
        dict(quantity="dispatch bytes / token / layer", measured=sum(int(t.dispatch_bytes.sum()) for t in tr) / tokens,
             tiny=dest * (latent + meta), k3=k3["dispatch_per_destination"],
             note=f"one latent row (+ {meta} B of ids and weights here) per distinct rank; K3 with one copy "
                  f"per expert: {k3['dispatch_per_copy']:,} B (FP8 + scales)"),
        dict(quantity="combine bytes / token / layer", measured=sum(int(t.combine_bytes.sum()) for t in tr) / tokens,
             tiny=dest * latent, k3=k3["combine_per_destination"],
             note=f"one pre-summed row back per distinct rank; K3 with one copy per expert: "
                  f"{k3['combine_per_copy']:,} B (BF16)"),
        dict(quantity=f"busiest / mean rank load (prefill, B={batch})",
             measured=float(np.mean([t.imbalance for t in prefill])),
             tiny=load_imbalance(cfg.num_experts, cfg.top_k, N, batch, samples=PRESET_SAMPLES),
             k3=load_imbalance(k3["num_experts"], k3["top_k"], k3["ep"], batch),
             note="analytic columns at the same B; K3 at B = " + ", ".join(
                 f"{b}: {v:.2f}" for b, v in k3["imbalance"].items())),
    ]


def _traffic_table(run: EPRun) -> Table:
    t = Table(title=f"measured per step and MoE layer: {run.world_size} ranks ({run.backend}), "
                    f"{run.info['experts_per_rank']} experts each")
    for col in ("step", "layer", "tokens", "ranks/tok", "cross bytes", "load per rank", "max/mean"):
        t.add_column(col, justify="right")
    for tr in run.traffic:
        cross = int(tr.bytes.sum() - np.trace(tr.bytes))
        t.add_row("prefill" if tr.step == 0 else str(tr.step), str(tr.layer), str(int(tr.tokens.sum())),
                  f"{tr.destinations:.2f}", format_bytes(cross), "/".join(map(str, tr.load)), f"{tr.imbalance:.2f}")
    return t


def _rank_grids(run: EPRun) -> list[Table]:
    """Prefill token copies and bytes sent, rank x rank."""
    grids = []
    for title, what, fmt in (("token copies", "copies", str), ("bytes", "bytes", format_bytes)):
        grid = Table(title=f"prefill: {title} sent, rank -> rank")
        m = run.step_matrix(0, what)
        grid.add_column("from \\ to")
        for d in range(run.world_size):
            grid.add_column(str(d), justify="right")
        for src in range(run.world_size):
            grid.add_row(str(src), *(fmt(int(v)) for v in m[src]))
        grids.append(grid)
    return grids


def print_report(run: EPRun, console: Console | None = None, k3: dict | None = None) -> None:
    """The measured tables (per step and layer, rank x rank) and the measured-vs-analytic comparison."""
    console = console or Console()
    console.print(_traffic_table(run))
    console.print(*_rank_grids(run))
    k3 = k3 or k3_ep_figures()
    t = Table(title=f"per token per MoE layer: {run.preset} measured, {run.preset} analytic (uniform routing), "
                    f"real K3 on {k3['ep']} GPUs (§6b)")
    for col in ("quantity", "measured", "analytic", f"K3 EP{k3['ep']}"):
        t.add_column(col, justify="right")
    notes = []
    for row in comparison(run, k3):
        fmt = (lambda v: format_bytes(v, 1)) if "bytes" in row["quantity"] else (lambda v: f"{v:.2f}")
        t.add_row(row["quantity"], fmt(row["measured"]), fmt(row["tiny"]), fmt(row["k3"]))
        notes.append(f"  {row['quantity']}: {row['note']}")
    console.print(t)
    console.print("\n".join(notes), highlight=False)
    console.print(f"K3 all-to-all per token per step ({k3['moe_layers']} MoE layers): "
                  f"{format_bytes(k3['per_token_step_per_copy'])} one copy per expert, "
                  f"{format_bytes(k3['per_token_step_per_destination'])} one copy per GPU")
    if run.max_diff is not None:
        console.print(f"check: max |EP - single-process| logit = {run.max_diff:.2e}; generated tokens "
                      f"{'equal' if run.tokens_equal else 'DIFFER'}")
