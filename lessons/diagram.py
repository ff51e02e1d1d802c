"""The architecture diagram of lesson 1, drawn from a config: a token's path and where the memory lives.

    draw_architecture(config)   left: the token's path through the layers (KDA/MLA attention, dense/MoE MLP),
                                each sublayer's input read by AttnRes, the KDA states (fixed) and MLA caches
                                (growing) under their layers; right: inside one latent-MoE sublayer.

Nothing is hard-coded but the layout: layer kinds, widths and expert counts come from the config.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch

COLORS = {"kda": "#4c9f70", "mla": "#d1495b", "dense": "#8e6fb5", "moe": "#3a7dc9", "embed": "#888888",
          "head": "#333333", "state": "#f0a202", "cache": "#d1495b"}


def _box(ax, x, y, w, h, text, color, fontsize=10, text_color="white", alpha=1.0):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08", fc=color, ec="none",
                                alpha=alpha))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, color=text_color)


def _arrow(ax, x0, y0, x1, y1, color="#444444"):
    ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops=dict(arrowstyle="->", color=color, lw=1.3))


def _path(ax, config) -> None:
    """The token's path, bottom to top: embedding, every layer's two sublayers, the head."""
    n = config.num_layers
    ax.set_xlim(-0.3, n + 1.6), ax.set_ylim(-3.0, 3.6), ax.axis("off")
    _box(ax, -0.25, 0.0, 0.8, 2.2, "embed", COLORS["embed"])
    for i, kind in enumerate(config.layer_kinds):
        x = i + 0.8
        mlp = "dense" if i < config.first_k_dense else "moe"
        _box(ax, x, 0.0, 0.8, 1.0, kind.upper(), COLORS[kind])
        _box(ax, x, 1.2, 0.8, 1.0, "MoE" if mlp == "moe" else "MLP", COLORS[mlp])
        ax.text(x + 0.4, 2.35, f"L{i}", ha="center", va="bottom", fontsize=10)
        if kind == "kda":        # a fixed K x V state per head
            _box(ax, x + 0.15, -1.05, 0.5, 0.5, "S", COLORS["state"], fontsize=10)
        else:                    # a latent cache that grows by one row per token
            for r in range(4):
                _box(ax, x + 0.1, -0.55 - 0.32 * (r + 1), 0.6, 0.24, "", COLORS["cache"], alpha=0.35 + 0.15 * r)
        _arrow(ax, x - 0.18, 1.1, x - 0.02, 1.1)
    _box(ax, n + 0.8, 0.0, 0.75, 2.2, "head", COLORS["head"])
    ax.text(-0.25, 3.3, f"one token through {config.name!r}: {n} layers, attention then MLP in each; "
            "before every sublayer AttnRes reads the depth sources", fontsize=10, va="top")
    ax.text(-0.25, -2.1, "KDA: fixed state S per head (never grows)     MLA: latent cache, one row per token "
            "(grows)", fontsize=10, va="top")
    kinds = config.layer_kinds
    pattern = "".join("M" if k == "mla" else "K" for k in kinds)
    ax.text(-0.25, -2.55, f"schedule {pattern} (K = KDA, M = MLA); {k3_schedule()}", fontsize=10, va="top")


def k3_schedule() -> str:
    """K3's schedule in the diagram's numbering: layers count from 0, as in the code (K3Config.mla_layers) and the
    L0, L1, … labels above; the released config.json counts from 1 (k3_facts.md §1)."""
    from tiny_k3 import K3Config

    k3 = K3Config.preset("k3")
    mla = k3.mla_layers
    head = ", ".join(f"L{i}" for i in mla[:2])
    return (f"K3: the same 3:1 pattern over {k3.num_layers} layers L0 … L{k3.num_layers - 1}, MLA at {head}, …, "
            f"L{mla[-2]} and L{mla[-1]}")


def _moe(ax, config) -> None:
    """One latent-MoE sublayer, left to right (moe.md §4)."""
    d, l, E, k = config.hidden_size, config.latent_dim, config.num_experts, config.top_k
    ax.set_xlim(-0.3, 12.3), ax.set_ylim(-0.7, 6.7), ax.axis("off")    # a margin: no box is clipped at the edge
    _box(ax, 0.0, 2.6, 1.0, 0.8, f"x\n[{d}]", COLORS["embed"])
    _box(ax, 1.4, 4.5, 3.2, 0.9, f"router σ(W_r x) + b\ntop-{k} of {E}", "#555555", fontsize=10)
    _box(ax, 1.4, 2.6, 1.8, 0.8, f"W_down\n{d}→{l}", COLORS["moe"], fontsize=10)
    for j in range(6):           # a few of the experts; the lit ones stand for the k chosen
        lit = j in (1, 4)
        _box(ax, 3.8, 0.9 + 0.55 * j, 1.6, 0.42, f"E{j}" + (" ✓" if lit else ""),
             COLORS["moe"] if lit else "#c8d6e8", fontsize=10, text_color="white" if lit else "#444444")
    ax.text(4.6, 0.45, f"{k} of {E} run, in width {l}", ha="center", fontsize=10)
    _box(ax, 6.0, 2.6, 1.8, 0.8, "Σ w_j E_j", COLORS["moe"], fontsize=10)
    _box(ax, 8.2, 2.6, 1.8, 0.8, f"RMSNorm,\nW_up {l}→{d}", COLORS["moe"], fontsize=10)
    _box(ax, 6.0, -0.4, 4.0, 0.8, f"shared experts\n(every token, width {d})", COLORS["dense"], fontsize=10)
    _box(ax, 10.5, 2.6, 1.4, 0.8, "+  → out", "#333333", fontsize=10)
    _arrow(ax, 1.0, 3.0, 1.4, 3.0), _arrow(ax, 0.5, 3.4, 1.4, 4.8), _arrow(ax, 3.2, 3.0, 3.8, 3.0)
    _arrow(ax, 5.4, 3.0, 6.0, 3.0), _arrow(ax, 7.8, 3.0, 8.2, 3.0), _arrow(ax, 10.0, 3.0, 10.5, 3.0)
    _arrow(ax, 0.5, 2.6, 6.0, 0.0), _arrow(ax, 10.0, 0.0, 11.2, 2.6)
    _arrow(ax, 4.6, 4.5, 4.8, 4.1, color="#555555")
    ax.text(5.0, 5.0, "ids pick who;\nw = s[ids] / Σ s[ids] weighs how much", fontsize=10, va="center")
    ax.text(0.0, 6.5, "inside one MoE sublayer (latent MoE, moe.md §4)", fontsize=11, va="top")


def draw_architecture(config):
    """The diagram for `config` (a tiny_k3.K3Config); returns the figure."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(16, 5.2), gridspec_kw={"width_ratios": [1.2, 1]})
    _path(a1, config)
    _moe(a2, config)
    fig.tight_layout()
    return fig
