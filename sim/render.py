"""Rich renderables from Frames: the pictures the TUI and the notebooks share.

Every function is a pure function of Frame records or arrays and returns something `rich` can print: in a
terminal (`Console().print(x)`), in Textual (`Static(x)`) and in Jupyter (all of them carry rich's
JupyterMixin). Dense pictures draw two cells per text line with the upper half block "▀" (foreground =
upper cell, background = lower cell), so K3's 896 experts fit as 56 x 16 cells in 8 lines. Without colour
(a plain or piped terminal) they fall back to glyphs that still carry the point: █▀▄ mark the chosen
experts, ░▒▓█ the magnitude of a state or a depth weight. The colours, maps and glyphs themselves are
sim.render_cells'.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from tiny_k3.config import K3Config
from tiny_k3.tokenizer import token_text

from .frame import Frame, KDARecord, RoutingRecord
from .memory import MIB_CONTEXT, crossover_tokens, format_bytes, project_to_k3
from .render_cells import (BIAS_CHOSEN, CHOSEN, DARK, SCORE_HIGH, WEIGHT_HIGH, ByColour, bar, half_blocks, lerp,
                           rgb_style, robust_scale, shade, sparkline, state_colour, weight_style)
from .serving import bytes_held_ratio


# ---------------------------------------------------------------------------- routing


def grid_shape(num_experts: int, columns: int | None = None) -> tuple[int, int]:
    """(rows, columns) of the expert grid: 56 columns by default (K3's 896 experts -> 16 rows, 8 lines)."""
    columns = min(num_experts, 56) if columns is None else columns
    if columns < 1:
        raise ValueError(f"columns must be a positive integer, got {columns}.")
    return -(-num_experts // columns), columns


def expert_grid(routing: RoutingRecord, num_experts: int | None = None, columns: int | None = None,
                legend: bool = False) -> ByColour:
    """All E experts of one MoE sublayer: the k chosen lit, the others shaded by their score.

    896 experts = 56 x 16 cells in 8 text lines. Colours: amber = chosen, magenta = chosen only thanks to
    the selection bias, blue shade = unchosen by score. Without colour: █ ▀ ▄ mark chosen cells (upper,
    lower, both), · a pair of unchosen ones. legend=True adds one line under the grid.
    """
    scores = np.asarray(routing.scores, dtype=np.float32)
    E = scores.shape[0] if num_experts is None else num_experts
    if E != scores.shape[0]:
        raise ValueError(f"num_experts is {E} but the routing record has {scores.shape[0]} scores.")
    rows, cols = grid_shape(E, columns)
    k = len(routing.expert_ids)
    chosen = np.zeros(E, bool)
    chosen[routing.expert_ids] = True
    raw_top = np.zeros(E, bool)
    raw_top[np.argsort(-scores, kind="stable")[:k]] = True
    lo, hi = float(scores.min()), float(scores.max())
    shade = (scores - lo) / (hi - lo) if hi > lo else np.full(E, 0.5, np.float32)

    def cell(i: int) -> int | None:
        return i if i < E else None

    def colour() -> Text:
        cells = []
        for r in range(rows):
            row = []
            for c in range(cols):
                i = cell(r * cols + c)
                if i is None:
                    row.append(None)
                elif chosen[i]:
                    row.append(CHOSEN if raw_top[i] else BIAS_CHOSEN)
                else:
                    row.append(lerp(DARK, SCORE_HIGH, shade[i]))
            cells.append(row)
        return _with_legend(half_blocks(cells), "")

    def mono() -> Text:
        lines = []
        for r in range(0, rows, 2):
            line = []
            for c in range(cols):
                up, low = cell(r * cols + c), cell((r + 1) * cols + c) if r + 1 < rows else None
                a, b = up is not None and chosen[up], low is not None and chosen[low]
                line.append("█" if a and b else "▀" if a else "▄" if b else "·" if up is not None else " ")
            lines.append("".join(line))
        return _with_legend(Text("\n".join(lines), no_wrap=True, overflow="crop"), " (█▀▄)")

    def _with_legend(grid: Text, marks: str) -> RenderableType:
        if not legend:
            return grid
        return Group(grid, Text(f"L{routing.layer}: {k} of {E} experts chosen{marks or ' (lit)'} · scores "
                                f"{lo:.3f}..{hi:.3f} (shade) · {int((chosen & ~raw_top).sum())} chosen by the bias",
                                style="dim"))

    return ByColour(colour, mono)


def topk_table(routing: RoutingRecord) -> Table:
    """The k chosen experts in selection order: id, score, bias, score + bias (what top-k ranks), weight."""
    t = Table(title=f"L{routing.layer} top-{len(routing.expert_ids)}", title_justify="left", pad_edge=False)
    for name in ("#", "expert", "score", "bias", "score+bias", "weight"):
        t.add_column(name, justify="right")
    for rank, (e, w) in enumerate(zip(routing.expert_ids, routing.weights)):
        s, b = float(routing.scores[e]), float(routing.bias[e])
        t.add_row(str(rank), str(int(e)), f"{s:.4f}", f"{b:+.4f}", f"{s + b:.4f}", f"{float(w):.4f}")
    return t


def expert_load_bars(load: np.ndarray, top: int = 16, width: int = 24) -> Group:
    """Tokens per expert over a run: a summary line and bars for the `top` busiest experts."""
    load = np.asarray(load).reshape(-1)
    total, used = int(load.sum()), int((load > 0).sum())
    mean = total / len(load) if len(load) else 0.0
    peak = int(load.max()) if len(load) else 0
    head = Text(f"{used} of {len(load)} experts used · {total} routings · max/mean "
                f"{peak / mean if mean else 0:.1f}x", style="bold")
    t = Table.grid(padding=(0, 1))
    t.add_column(justify="right")
    t.add_column()
    t.add_column(justify="right")
    order = np.argsort(-load, kind="stable")[:top]
    for e in order:
        if load[e] == 0:
            break
        t.add_row(f"#{int(e)}", Text(bar(load[e] / peak, width), style=rgb_style(CHOSEN)), str(int(load[e])))
    return Group(head, t)



# ---------------------------------------------------------------------------- KDA


def state_cells(state: np.ndarray, scale: float | None = None) -> ByColour:
    """A K x V state S as half-block cells on the diverging map (state_colour) of ±scale (default: robust_scale).
    Without colour, ░▒▓█ show |S| on the same sqrt scale (of the larger cell of each pair)."""
    S = np.asarray(state, dtype=np.float32)
    if S.ndim != 2:
        raise ValueError(f"state must be one head's [K, V] matrix, got shape {S.shape}.")
    K, V = S.shape
    scale = robust_scale(S) if scale is None else scale

    def colour() -> Text:
        return half_blocks([[state_colour(x, scale) for x in row] for row in S])

    def mono() -> Text:
        mag = np.sqrt(np.minimum(np.abs(S) / scale, 1.0))
        if K % 2:
            mag = np.vstack([mag, np.zeros((1, V), np.float32)])
        pairs = np.maximum(mag[0::2], mag[1::2])
        return Text("\n".join("".join(shade(x) for x in row) for row in pairs), no_wrap=True, overflow="crop")

    return ByColour(colour, mono)


def state_legend(state: np.ndarray, title: str | None = None) -> Text:
    """One line under a state: its shape, min, max and norm."""
    S = np.asarray(state, dtype=np.float32)
    K, V = S.shape
    return Text(f"{title + ' · ' if title else ''}K={K} x V={V} · min {S.min():+.3f} · max {S.max():+.3f}"
                f" · ‖S‖ {np.linalg.norm(S):.3f}", style="dim")


def state_heatmap(state: np.ndarray, title: str | None = None) -> Group:
    """A K x V state S as half-block cells: red to yellow positive, blue to cyan negative, dark zero (state_cells,
    on ±robust_scale(S), the 99th percentile of |S|, which the line under the legend gives), then a legend line
    (shape, min, max, norm). The TUI draws its colour key with numbers beside it (tui_app/keys.py)."""
    S = np.asarray(state, dtype=np.float32)
    cells = state_cells(S)                       # checks the shape
    scale = Text(f"colour ±{robust_scale(S):.3g} (99th percentile of |S|, sqrt-scaled; beyond it: full colour)",
                 style="dim")
    return Group(cells, state_legend(S, title), scale)


def decay_beta_bars(kda: KDARecord, head: int, width: int = 20, norms: bool = True, stats: bool = True) -> Table:
    """One KDA head: the decay alpha per key channel (0..1), the write strength beta, ||S|| and the write
    (norms=False: without that row; stats=False: without the decay's numbers beside its sparkline)."""
    H = kda.decay.shape[0]
    if not 0 <= head < H:
        raise ValueError(f"head {head} is out of range; this layer has heads 0 to {H - 1}.")
    decay, beta = kda.decay[head], float(kda.beta[head])
    t = Table.grid(padding=(0, 1))
    t.add_column(style="bold", no_wrap=True)
    t.add_column(no_wrap=True)
    t.add_column(style="dim")
    t.add_row("decay α", Text(sparkline(decay, 0.0, 1.0), style=rgb_style(WEIGHT_HIGH)),
              f"per key channel, 0..1 · min {decay.min():.3f} mean {decay.mean():.3f} max {decay.max():.3f}"
              if stats else "")
    if stats:
        t.add_row("beta β", Text(bar(beta, width), style=rgb_style(CHOSEN)), f"{beta:.3f}")
    else:                                   # its number right after the bar: the row is no wider than the decay's
        t.add_row("beta β", Text.assemble((bar(beta, width), rgb_style(CHOSEN)), f" {beta:.3f}"), "")
    if norms:
        t.add_row("‖S‖", f"{float(kda.state_norm[head]):.4f}",
                  f"write ‖S - Diag(α) S_prev‖ {float(kda.correction_norm[head]):.4f}")
    return t


# ---------------------------------------------------------------------------- memory and depth


def memory_bars(frame: Frame, config: K3Config, width: int = 30) -> Table:
    """Decode-cache bytes: the hybrid vs its all-MLA twin, measured here, then K3 at this many tokens and at 1M.

    Each group is scaled to its own larger bar; the dim number is twin / hybrid.
    """
    n = frame.position + 1
    now, far = project_to_k3(n), project_to_k3(MIB_CONTEXT)
    groups = [(f"{config.name}, measured, {n:,} tokens", frame.memory.total_bytes, frame.memory.twin_kv_bytes),
              (f"K3 at {n:,} tokens", now.hybrid, now.twin),
              ("K3 at 1M tokens", far.hybrid, far.twin)]
    t = Table(box=None, pad_edge=False, show_header=False, padding=(0, 1))
    t.add_column()
    t.add_column()
    t.add_column(justify="right")
    t.add_column(justify="right", style="dim")
    for title, hybrid, twin in groups:
        top = max(hybrid, twin, 1)
        t.add_row(Text(title, style="bold"), "", "", "")
        t.add_row("  hybrid (KDA + MLA)", Text(bar(hybrid / top, width), style=rgb_style(WEIGHT_HIGH)),
                  format_bytes(hybrid), "")
        t.add_row("  all-MLA twin", Text(bar(twin / top, width), style=rgb_style(SCORE_HIGH)),
                  format_bytes(twin), _ratio(twin / hybrid) if hybrid else "")
    return t


def _ratio(x: float) -> str:
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.2g}x"


def _depth_columns(rows: list[tuple[str, ...]]) -> list[str]:
    """Every source any read names: emb, b1 .. bN (the most completed blocks of any read), partial."""
    blocks = max(sum(n.startswith("b") for n in names) for names in rows)
    return ["emb"] + [f"b{i}" for i in range(1, blocks + 1)] + ["partial"]


def depth_map(frame: Frame, lo: int = 0, rows: int | None = None,
              marks: dict[str, str] | None = None) -> ByColour | Text:
    """AttnRes depth weights of one token, reads lo..lo+rows (all by default), one column per named source.

    Columns: emb (the embedding), b1, b2, ... (completed block sums), partial (the open block's running
    sum, if the read has one); a read that does not see a source shows "·" there. Each row's weights sum
    to 1. A cell is a solid block in weight_colour(w) (weight_key is its key), or without colour one of ░▒▓█,
    its weight on a 0..1 scale. Names: frame.depth_sources.
    marks: row label ("L0 attn") -> a note appended to that row (the recall moment's top sublayers).
    """
    if len(frame.depth_sources) != len(frame.depth):
        raise ValueError(f"the frame names the sources of {len(frame.depth_sources)} depth reads but holds "
                         f"{len(frame.depth)}; build it with sim.frame.depth_source_names.")
    reads = [(d, names) for d, names in zip(frame.depth, frame.depth_sources) if d.weights.size]
    if not reads:
        return Text("standard residual: every sublayer reads the plain running sum (no depth weights).")
    columns = _depth_columns([names for _, names in reads])
    label_w = len(f"L{max(d.layer for d, _ in reads if d.site != 'out')} attn")
    cell = max(len(c) for c in columns[:-1])      # "emb", "b1".. right-aligned in 3 cells over 2 shade cells

    def draw(glyph: Callable[[float], str]) -> Text:
        out = Text(no_wrap=True, overflow="crop")
        out.append(" " * label_w + "".join(c.rjust(cell) for c in columns[:-1]) + " " + columns[-1] + "\n",
                   style="bold")
        for d, names in reads[lo:None if rows is None else lo + rows]:
            label = "out" if d.site == "out" else f"L{d.layer} {d.site}"
            out.append(label.rjust(label_w))
            by_name = dict(zip(names, d.weights.tolist()))
            for c in columns:
                w = by_name.get(c)
                if w is None:
                    out.append("·".rjust(cell), style="dim")
                else:
                    out.append(" ")
                    out.append(glyph(w) * (cell - 1), style=weight_style(w))
            if marks and label in marks:
                out.append(f" ◀ {marks[label]}", style="bold magenta")
            out.append("\n")
        out.rstrip()
        return out

    return ByColour(lambda: draw(lambda w: "█"), lambda: draw(shade))


def crossover_line(config: K3Config, tokens: int) -> Text:
    """Where the hybrid's cache falls below its all-MLA twin's (memory.crossover_tokens), seen from `tokens`."""
    n = crossover_tokens(config)
    if n is None:
        return Text("no KDA layers here: hybrid and twin grow alike", style="bold")
    if tokens < n:
        return Text.assemble(("hybrid larger until token ", "bold yellow"), (f"{n:,}", "bold yellow"),
                             f" (now {tokens:,}); r: watch it cross")
    return Text.assemble(("hybrid smaller since token ", "bold green"), (f"{n:,}", "bold green"),
                         ": from here the twin only pulls away")


def memory_table(frame: Frame, config: K3Config, bar_width: int = 0) -> Table:
    """Measured bytes of this run, then K3 at as many tokens and at 1M: hybrid, twin, the ratio twin ÷ hybrid.

    K3's ratios are sim.serving.bytes_held_ratio's (bytes held, not speed); bar_width > 0 adds a column of
    two bars per row (hybrid green over twin blue, scaled to the larger).
    """
    n = frame.position + 1
    now, far = project_to_k3(n), project_to_k3(MIB_CONTEXT)
    t = Table(box=None, pad_edge=False, padding=(0, 1, 0, 0), show_edge=False)   # one cell between columns
    t.add_column("", no_wrap=True)
    t.add_column("hybrid", justify="right", style="green", no_wrap=True)
    t.add_column("twin", justify="right", style="blue", no_wrap=True)
    t.add_column("twin ÷ hybrid", justify="right", no_wrap=True)
    if bar_width:
        t.add_column("", no_wrap=True)
    rows = [("this run", frame.memory.total_bytes, frame.memory.twin_kv_bytes, None),
            ("K3 now", now.hybrid, now.twin, n), ("K3 at 1M", far.hybrid, far.twin, MIB_CONTEXT)]
    for title, hybrid, twin, k3_tokens in rows:
        r = bytes_held_ratio(k3_tokens) if k3_tokens is not None else twin / hybrid if hybrid else 0.0
        ratio = "-" if not hybrid else f"{r:.2f}x" if twin >= 0.1 * hybrid else f"{r:.2g}x"
        cells = [title, format_bytes(hybrid), format_bytes(twin), ratio]
        if bar_width:
            top = max(hybrid, twin, 1)
            cells.append(Text.assemble((bar(hybrid / top, bar_width), "green"), "\n",
                                       (bar(twin / top, bar_width), "blue")))
        t.add_row(*cells)
    return t


# ---------------------------------------------------------------------------- tokens


def top_tokens(frame: Frame, tokenizer=None) -> list[tuple[str, float]]:
    """The frame's most likely next tokens as (label, probability), most likely first. tokenizer: the run's own
    (a real checkpoint's BPE, sim.real); bytes by default."""
    label = token_text if tokenizer is None else tokenizer.token_text
    return [(label(i), p) for i, p in zip(frame.top_ids.tolist(), frame.top_probs.tolist())]


def timeline_text(frames: list[Frame], prompt_len: int, step: int, visited: int, width: int) -> Text:
    """The tokens around the cursor that fit `width`: prompt dim, generated bold, cursor reversed, then
    " → " and the token chosen at the cursor.

    Only frames up to `visited` are shown (the rest is look-ahead the learner has not asked for).
    """
    end = min(visited, len(frames) - 1)
    pieces, used = [], 0
    for i in range(end, -1, -1):
        f = frames[i]
        style = "reverse bold yellow" if i == step else ("dim" if i < prompt_len else "bold")
        if i > step:
            style = "dim italic"
        pieces.append((f.input_text, style))
        used += len(f.input_text)
        if used > width - 12 and i < step - 4:   # keep 12 cells for " → " and the next token
            break
    pieces.reverse()
    text = Text.assemble(*pieces)
    if end == step:
        text.append(" → ", style="dim")
        text.append(frames[end].token_text, style="bold green")
    return text
