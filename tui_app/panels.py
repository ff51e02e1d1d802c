"""The TUI's four panels. Each is a pure function of a `View`; the numbers come from the Simulation
(expert_load, state_norm_history, memory_history), the pictures from sim.render (which notebooks print
too), the depth sources' names from the Frame: the panels own only where things go on screen.

Each is a Panel (tui_app/panel.py): it redraws only when its key changes.
"""

from __future__ import annotations

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from sim import render, render_cells
from sim.frame import Frame
from sim.measure import saved_line
from sim.memory import format_bytes, state_bytes_fixed
from sim.render import crossover_line, depth_map, memory_table
from sim.render_cells import rgb_style

from .keys import state_key, weight_key
from .panel import COLUMN_GAP, Panel, SideBySide, View, plural, quoted

SPARK_WIDTH = 48  # values shown in a sparkline: the most recent ones, so long runs cost the same

# Widths of the routing panel's columns, in terminal cells.
GRID_WIDTH = 56         # render.grid_shape's default: K3's 896 experts as 56 columns x 16 rows
TOPK_WIDTH = 44         # render.topk_table: "#  expert  score  bias  score+bias  weight" at 4 decimals
LOAD_WIDTH = 36         # "#123 ████████████████ 42": id, a 16-cell bar (LOAD_BAR), the count
LOAD_BAR = 16


# ---------------------------------------------------------------------------------------- routing


def active_line(config) -> Text:
    """The sparsity in one line, computed for the preset shown (K3: 16 of 896 = 1.8%)."""
    frac = config.top_k / config.num_experts
    return Text(f"{config.top_k} of {config.num_experts} experts = {frac:.1%} of expert parameters active",
                style="bold")


def routing_headline(view: View) -> Text:
    """One line for the compact layout, always on screen: what the selected layer routed this token to."""
    cfg, r = view.config, view.frame.routing_for(view.layer)
    if r is None:
        return Text.assemble((f"layer {view.layer} is dense", "bold"),
                             f": every token runs all of its MLP · MoE layers route {cfg.top_k} of "
                             f"{cfg.num_experts} experts ({cfg.top_k / cfg.num_experts:.1%})")
    ids = " ".join(str(int(e)) for e in r.expert_ids)
    return Text.assemble((f"layer {view.layer}: {cfg.top_k} of {cfg.num_experts} experts", "bold"),
                         f" ({cfg.top_k / cfg.num_experts:.1%}) → {ids}")


class RoutingPanel(Panel):
    """Sparse MoE: the expert grid, the top-k table, the load over the run (k3_facts.md §1c)."""

    TITLE = "Routing"

    def key(self, v: View) -> tuple:
        return (v.session, v.step, v.layer, v.expert, v.compare)

    def draw(self, v: View):
        cfg, frame = v.config, v.frame
        r = frame.routing_for(v.layer)
        title = f"Routing · layer {v.layer}"
        if r is None:
            moe = cfg.moe_layers
            hint = f"the MoE layers are {moe[0]}-{moe[-1]}" if moe else "this preset has no MoE layers"
            return title + " (dense)", Text(
                f"Layer {v.layer} uses a dense SiTU-GLU MLP (soft-capped SwiGLU), like K3's first layer: every "
                f"token runs all of it, so nothing is routed and no experts are active here; {hint} (j/k change "
                f"layer). In an MoE layer {cfg.top_k} of {cfg.num_experts} experts run per token.")
        load = v.sim.expert_load(v.layer, upto=v.step)
        left = [active_line(cfg), render.expert_grid(r, cfg.num_experts, legend=True)]
        if v.expert >= 0:
            left.append(_expert_line(r, load, v.expert))
        if v.compare and v.step > 0:
            prev = v.sim.frames[v.step - 1].routing_for(v.layer)
            same = len(set(r.expert_ids.tolist()) & set(prev.expert_ids.tolist()))
            left.append(Text(f"compare: {same} of {cfg.top_k} also chosen for the previous token", style="cyan"))
        topk = render.topk_table(r)
        topk.box = None                    # k = 16 rows fit the panel without the frame lines
        loads = Group(Text(f"load over {plural(v.step + 1, 'token')}", style="bold"),
                      render.expert_load_bars(load, top=min(12, cfg.num_experts), width=LOAD_BAR))
        grid = min(cfg.num_experts, GRID_WIDTH)
        if self.inner_width >= grid + TOPK_WIDTH + LOAD_WIDTH + 2 * COLUMN_GAP:   # grid | top-k | load
            row = SideBySide([(Group(*left), grid), (topk, None), (loads, LOAD_WIDTH)])
        elif self.inner_width >= grid + TOPK_WIDTH + COLUMN_GAP:                   # load under the grid
            row = SideBySide([(Group(*left, loads), grid), (topk, None)])
        else:                                                                      # one column
            row = Group(*left, topk, loads)
        return title + " (MoE)", row


def _expert_line(r, load: np.ndarray, expert: int) -> Text:
    ids = r.expert_ids.tolist()
    chosen = (f"chosen #{ids.index(expert)}, weight {float(r.weights[ids.index(expert)]):.3f}"
              if expert in ids else "not chosen")
    return Text(f"expert {expert}: score {float(r.scores[expert]):.3f}, bias {float(r.bias[expert]):+.4f}, "
                f"{chosen}, load {int(load[expert])}", style="yellow")


# ---------------------------------------------------------------------------------------- state


SIDE_COLUMN = 34   # the state panel's column beside the heatmap needs this much: the key (33 cells), the numbers


class StatePanel(Panel):
    """KDA: the K x V delta-rule state of one head, its decay and write strength (kda.md §2).

    The heatmap is drawn on a robust symmetric scale (sim.render_cells.robust_scale: the 99th percentile of |S|) with
    its colour key. Where the panel is wide enough (an 80-column terminal's one panel), the numbers, the decay
    and beta and the key sit beside the heatmap, so a 24-row terminal shows them all; otherwise they come first
    and the heatmap under them.
    """

    TITLE = "Recurrent state"

    def key(self, v: View) -> tuple:
        return (v.session, v.step, v.layer, v.head, v.compare, v.recall is None, v.pinned)

    def draw(self, v: View):
        cfg, layer = v.config, v.kda_layer
        if layer is None:
            return "Recurrent state", Text(no_state_note(cfg))
        rec = v.frame.kda_for(layer)
        h = v.kda_head
        title = f"State · KDA layer {layer} · head {h}"
        notes = []
        if v.compare:
            twin_layer = v.frame.memory.twin_kv_bytes // max(cfg.num_layers, 1)
            notes.append(Text(f"compare: in the all-softmax twin this layer is MLA and caches "
                              f"{format_bytes(twin_layer)} at {plural(v.frame.position + 1, 'token')}, + "
                              f"{cfg.mla_cache_width * cfg.dtype_bytes} B per token", style="cyan"))
        if v.recall is not None and v.recall.best_head is not None:
            notes.append(recall_line(v.recall, v.sim.frames, layer, h))
        if v.recall is not None and v.recall.kinds is not None:
            notes.append(carried_line(v.recall))
        if v.pin is not None:
            notes.append(Text(f"showing the head the recall moment names; j/k/h/H go back to layer {v.layer} "
                              f"head {v.head}", style="italic"))
        elif layer != v.layer:
            notes.append(Text(f"layer {v.layer} is gated MLA (softmax, a growing KV cache, no recurrent state); "
                              f"showing the KDA layer below it.", style="italic"))
        S = rec.state[h].astype(np.float32)
        scale = render_cells.robust_scale(S)
        cells = render.state_cells(S, scale)
        side = self.inner_width - S.shape[1] - COLUMN_GAP      # room beside the heatmap
        if side >= SIDE_COLUMN:
            right = Group(*self._numbers(v, rec, h, side, stats_beside=False),
                          state_key(scale, min(33, side)), render.state_legend(S))
            return title, Group(*notes, SideBySide([(cells, S.shape[1]), (right, side)]))
        width = self.inner_width
        return title, Group(*notes, *self._numbers(v, rec, h, width, stats_beside=True), cells,
                            state_key(scale, min(33, width)), render.state_legend(S))

    def _numbers(self, v: View, rec, h: int, width: int, stats_beside: bool) -> list:
        """‖S‖ (and its history), the write, the size, then the decay α and the write strength β, for `width`."""
        cfg = v.config
        per_head = state_bytes_fixed(cfg).state // (len(cfg.kda_layers) * cfg.kda_heads)
        hist = v.sim.state_norm_history(rec.layer, h, upto=v.step)
        top = Table.grid(padding=(0, 1))
        top.add_column(style="bold", no_wrap=True, min_width=len("write"))
        top.add_column(no_wrap=True, min_width=len("0.0000"))
        top.add_column(no_wrap=True, overflow="ellipsis", style="dim", ratio=1)
        spark_room = max(8, width - len("write 0.0000 "))   # after the label and value columns
        top.add_row("‖S‖", f"{float(rec.state_norm[h]):.4f}", render_cells.sparkline(hist[-spark_room:], lo=0.0))
        # the delta-rule write of this token: what it changed beyond decaying the old state (kda.md §2)
        top.add_row("write", f"{float(rec.correction_norm[h]):.4f}", "the delta-rule write")
        top.add_row("size", format_bytes(per_head), "fixed, every token")
        label = len("decay α") + 1
        K = rec.decay.shape[1]
        if width < label + K:                       # a narrow panel: the sparkline gets a line of its own
            return [top, decay_beta_lines(rec, h)]
        beside = stats_beside and width >= label + K + 1 + 24
        bars = render.decay_beta_bars(rec, h, width=12, norms=False, stats=beside)
        if beside:              # the decay's numbers beside its K-cell sparkline: one line, cut with "…" to fit
            for column in bars.columns[2:]:
                column.no_wrap, column.overflow = True, "ellipsis"
                column.max_width = width - label - K - 1
            return [top, bars]
        decay = rec.decay[h]
        return [top, bars, Text(f"α min {decay.min():.3f} · mean {decay.mean():.3f} · max {decay.max():.3f}",
                                style="dim", no_wrap=True, overflow="ellipsis")]


def decay_beta_lines(kda, head: int, width: int = 12) -> Group:
    """render.decay_beta_bars for a narrow column: the decay's label and numbers, its sparkline on a line of its
    own (K cells), then beta."""
    decay, beta = kda.decay[head], float(kda.beta[head])
    return Group(Text.assemble(("decay α ", "bold"), (f"min {decay.min():.3f} · mean {decay.mean():.3f} · max "
                                                      f"{decay.max():.3f}", "dim"), no_wrap=True, overflow="ellipsis"),
                 Text(render_cells.sparkline(decay, 0.0, 1.0), style=rgb_style(render_cells.WEIGHT_HIGH), no_wrap=True,
                      overflow="crop"),
                 Text.assemble(("beta β ", "bold"), (render_cells.bar(beta, width), rgb_style(render_cells.CHOSEN)),
                               f" {beta:.3f}"))


def no_state_note(cfg) -> str:
    """What the state panel says for a preset without KDA layers; for a twin, where the hybrid's state is."""
    if cfg.name.endswith("-twin"):
        hybrid = cfg.name.removesuffix("-twin")
        return (f"{cfg.name} is the all-MLA twin of {hybrid}: it has no KDA layers, so no recurrent state to show; "
                f"p → {hybrid} shows the hybrid's.")
    return "This preset has no KDA layers."


def recall_line(moment, frames: list[Frame], layer: int, head: int) -> Text:
    """At a recall query: the KDA head that reads the value back, i.e. whose read S^T q at the query is
    mostly the write made at the value token of the definition (sim.recall_moment: that write's share of
    the read, and the cosine of the two), or why no head is named (a wrong answer, a weak match)."""
    best, q = moment.reading_head, moment.query
    if best is None:
        return Text.assemble(("recall ", "bold magenta"), f"{q.key}={q.value}: no KDA head reads it back "
                             f"({moment.why_no_head})", needed_clause(moment, None))
    shown = " (this head)" if (best.layer, best.head) == (layer, head) else ""
    return Text.assemble(("recall ", "bold magenta"), (f"L{best.layer} h{best.head} reads back {q.key}={q.value}",
                                                       "bold"),
                         f": the write at the value {quoted(frames[best.written_at].input_text)} (position "
                         f"{best.written_at}) is {best.share:.0%} of its read, cos {best.cosine:.2f}{shown}",
                         needed_clause(moment, best))


def needed_clause(moment, named) -> str:
    """What resetting heads does to p(answer) (sim.recall_moment: HeadMatch.p_reset, the what-if of each head):
    the named head's own reset, and the head whose reset lowers it most when that is another one. A share of the
    read is not a cause; this is. Empty when no reset was measured or the answer is wrong."""
    needed = moment.most_needed_head
    if needed is None or moment.kinds is None or not moment.answered:
        return ""
    p = moment.kinds.p_answer
    own = (f"; its reset alone: p {p:.2f} → {named.p_reset:.2f}"
           if named is not None and named.p_reset is not None else "")
    if named is not None and (needed.layer, needed.head) == (named.layer, named.head):
        return own + " (no other head's reset lowers it more)"
    return own + f"; the reset that lowers it most: L{needed.layer} h{needed.head} (p → {needed.p_reset:.2f})"


def carried_line(moment) -> Text:
    """At a recall query: which layer kind carried the answer, measured by taking each away
    (sim.recall_moment.layer_kinds: the MLA window ending after the value, every KDA state reset)."""
    kinds = moment.kinds
    return Text.assemble(("carried by ", "bold magenta"), (kinds.carrier, "bold"), f": {kinds.sentence()}")


# ---------------------------------------------------------------------------------------- memory


class MemoryPanel(Panel):
    """Cache bytes: the hybrid's fixed KDA states + MLA latents vs the all-softmax twin (k3_facts.md §5a).

    Top to bottom in order of importance, so a short panel cuts only the details: the fixed state, the
    crossover, the table (this run, K3 now, K3 at 1M), the two histories.
    """

    TITLE = "Memory"

    def key(self, v: View) -> tuple:
        return (v.session, v.step, v.compare, v.recall is None)

    def draw(self, v: View):
        cfg, frame = v.config, v.frame
        tokens = frame.position + 1
        fixed = state_bytes_fixed(cfg)
        parts = [
            Text.assemble(("state fixed at ", "bold"), (format_bytes(fixed.total), "bold green"),
                          ", the same at 1 token and at 1M"),
            crossover_line(cfg, tokens),
        ]
        if v.recall is not None and v.recall.kinds is not None:   # which of the two memories held the answer
            parts.insert(1, carried_line(v.recall))
        if v.compare:                      # what the learner just asked for goes on top, in view
            parts.insert(0, _per_layer_table(cfg, frame))
        # the bars column only when it fits beside the label and three numbers (about 44 cells)
        bar_width = min(20, self.inner_width - 46) if self.inner_width >= 46 + 8 else 0
        parts.append(memory_table(frame, cfg, bar_width))
        hist = v.sim.memory_history(upto=v.step)
        hybrid = (hist["kv_bytes"] + hist["state_bytes"])[-SPARK_WIDTH:]
        twin = hist["twin_kv_bytes"][-SPARK_WIDTH:]
        top = float(max(hybrid.max(), twin.max(), 1))   # one scale for both: the twin climbs faster
        spark = Table.grid(padding=(0, 1))
        spark.add_row(Text("hybrid", style="bold green"), render_cells.sparkline(hybrid, 0.0, top))
        spark.add_row(Text("twin", style="bold blue"), render_cells.sparkline(twin, 0.0, top))
        measured = saved_line()            # this machine's `python -m sim measure --save`, when there is one
        if measured:
            parts.append(Text(measured, style="italic cyan"))
        parts += [Text(f"last {plural(len(hybrid), 'token')}, one scale:", style="dim"), spark,
                  Text(f"the state: {len(cfg.kda_layers)} KDA layers x {cfg.kda_heads} heads x {cfg.kda_head_dim}x"
                       f"{cfg.kda_head_dim} fp32 + conv tails", style="dim")]
        return f"Memory · {plural(tokens, 'token')}", Group(*parts)


def _per_layer_table(cfg, frame: Frame) -> Group:
    table = Table(box=None, padding=(0, 1), pad_edge=False)
    table.add_column("layers")
    table.add_column("hybrid", justify="right")
    table.add_column("twin", justify="right")
    twin_each = frame.memory.twin_kv_bytes // max(cfg.num_layers, 1)
    lb = frame.memory.layer_bytes
    for kind, layers in (("KDA", cfg.kda_layers), ("MLA", cfg.mla_layers)):
        if layers:
            each = lb[layers[0]] if lb else 0
            table.add_row(f"{len(layers)} {kind}", f"{format_bytes(each)} each", f"{format_bytes(twin_each)} each")
    return Group(Text("compare: bytes per layer, hybrid vs twin", style="cyan"), table)


# ---------------------------------------------------------------------------------------- depth


class DepthPanel(Panel):
    """Attention Residuals: how each sublayer mixes the depth sources, and |h| by depth (attnres.md §2)."""

    TITLE = "Depth"

    def key(self, v: View) -> tuple:
        return (v.session, v.step, v.layer, None if v.sublayer is None else v.sublayer.index, v.compare,
                self.inner_height, v.recall is None)

    def draw(self, v: View):
        frame = v.frame
        reads = [d for d in frame.depth if d.weights.size]
        parts = []
        if v.compare:
            parts.append(Text("compare: a standard residual gives every source weight 1 (a fixed sum); "
                              "zero-initialised AttnRes starts uniform (1/N) and learns to differ", style="cyan"))
        if v.sublayer is not None:
            parts += _stepped_in(v)
        marks = {}
        if v.recall is not None:
            parts.append(answer_line(v.recall, frame))
            marks = {f"L{m.layer} {m.site}": margin_share(m, v.recall.margin) for m in v.recall.top_moves(3)
                     if m.layer >= 0}
        title = "Depth · AttnRes weights" if v.sublayer is None else f"Depth · {v.sublayer.label}"
        if not reads:
            return title, Group(*parts, Text("standard residual: every sublayer reads the plain running sum "
                                             "(no depth weights)."))
        # the legend first, so a short panel never cuts it: what the rows, columns and shades mean
        parts.append(Text("emb embedding · bN block sums · partial the open block", style="dim"))
        parts.append(weight_key(self.inner_width))
        console = self.app.console
        above = len(console.render_lines(Group(*parts), console.options.update(width=self.inner_width)))
        # what is left for map rows: the panel less the lines above, the column names, the window line, |h|
        rows = max(4, self.inner_height - above - 3)
        lo = max(0, min(2 * v.layer - rows // 2, len(reads) - rows))   # reads 2L and 2L+1 are layer L's
        window = "" if len(reads) <= rows else f"rows {lo}-{min(lo + rows, len(reads)) - 1} of {len(reads)} (j/k move)"
        parts.append(depth_map(frame, lo, rows, marks))
        if window:
            parts.append(Text(window, style="dim"))
        norms = np.array([d.h_norm for d in frame.depth], dtype=np.float32)
        parts.append(Text.assemble(("|h| by depth ", "bold"),
                                   render_cells.sparkline(_resample(norms, max(8, self.inner_width - 14)))))
        return title, Group(*parts)


def margin_share(move, margin: float) -> str:
    """A sublayer's direct push on the answer's margin, and its share of the whole margin."""
    share = f" ({move.margin / margin:.0%})" if abs(margin) > 1e-9 else ""
    return f"{move.margin:+.2f}{share}"


def answer_line(moment, frame: Frame) -> Text:
    """At a recall query: the answer's margin over the other digits and the 3 sublayers that moved it most
    (direct logit attribution, sim.recall_moment: the per-sublayer terms sum to the margin)."""
    q = moment.query
    tops = ", ".join(f"{m.label} {margin_share(m, moment.margin)}" for m in moment.top_moves(3))
    return Text.assemble(("recall ", "bold magenta"), f"{q.key}={q.value}: ",
                         (f"margin {moment.margin:+.2f}", "bold"),
                         f" over the other digits (the model says {quoted(frame.token_text)}); moved most by {tops}")


def _stepped_in(v: View) -> list:
    sub, subs = v.sublayer, v.sublayers
    lo = max(0, min(sub.index - 2, len(subs) - 5))
    lines = Text()
    for s in subs[lo:lo + 5]:
        here = s.index == sub.index
        lines.append(f"{'▶' if here else ' '} {s.index:>3}  {s.label}\n", style="reverse bold" if here else "")
    parts = [Text(f"inside token {quoted(v.frame.input_text)} (pos {v.frame.position}): sublayer {sub.index} of "
                  f"{len(subs) - 1}; j/k move, o steps out", style="bold"), lines]
    detail = Table.grid(padding=(0, 1))
    if sub.depth is not None:
        detail.add_row("input |h|", f"{sub.depth.h_norm:.4f}")
    if sub.kind != "head":
        detail.add_row("output |v|" if sub.kind != "embed" else "embedding |x|", f"{sub.out_norm:.4f}")
    if sub.routing is not None:
        detail.add_row("experts", " ".join(str(int(e)) for e in sub.routing.expert_ids))
    if sub.kda is not None:
        detail.add_row("state |S|", " ".join(f"h{h} {float(n):.3f}" for h, n in enumerate(sub.kda.state_norm)))
    if sub.top:
        detail.add_row("next", "  ".join(f"{quoted(text)} {p:.2f}" for _, text, p in sub.top))
    weights = sub.depth.weights if sub.depth is not None else ()
    if len(weights):
        j = next(i for i, d in enumerate(v.frame.depth) if d is sub.depth)
        names = v.frame.depth_sources[j]
        detail.add_row(Text("AttnRes", style="bold"), Text("weights over the depth sources", style="bold"))
        for name, w in zip(names, weights):
            detail.add_row(f"  {name}", Text(f"{float(w):.3f} " + "█" * int(round(float(w) * 20)), style="magenta"))
    parts.append(detail)
    return parts


def _resample(values: np.ndarray, width: int) -> np.ndarray:
    """At most `width` values (max over equal chunks), so 187 sublayers still fit one line."""
    if len(values) <= width:
        return values
    edges = np.linspace(0, len(values), width + 1).astype(int)
    return np.array([values[a:b].max() for a, b in zip(edges[:-1], edges[1:])])
