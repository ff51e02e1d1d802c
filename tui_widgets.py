"""The TUI's panels and the small index it keeps over a run. Knows Frames and Textual; never the model.

Each panel is a pure function of a `View` (the Frame under the cursor, the selected layer/head and the
run's `Timeline`) drawn with sim.render where a renderable exists. Panels redraw only when what they
show changed (a key per panel), so stepping stays cheap on 93-layer presets and long runs.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np
from rich.console import Console, ConsoleOptions, Group
from rich.measure import Measurement
from rich.segment import Segment
from rich.table import Table
from rich.text import Text
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from sim import render as R
from sim.frame import Frame, SublayerView
from sim.measure import saved_line
from sim.memory import format_bytes, kv_bytes_per_token, state_bytes_fixed
from tiny_k3.config import K3Config

SPARK_WIDTH = 48  # values shown in a sparkline: the most recent ones, so long runs cost the same


class _Buffer:
    """A growing [n, *shape] numpy array (capacity doubles), so appends are O(1) amortised."""

    def __init__(self, shape: tuple[int, ...], dtype):
        self._data = np.zeros((64, *shape), dtype=dtype)
        self.n = 0

    def append(self, row) -> None:
        if self.n == len(self._data):
            self._data = np.concatenate([self._data, np.zeros_like(self._data)])
        self._data[self.n] = row
        self.n += 1

    def upto(self, i: int) -> np.ndarray:
        """Rows 0..i (inclusive)."""
        return self._data[: min(i + 1, self.n)]


class Timeline:
    """The frames of one run and per-step histories in flat arrays.

    Histories up to any step are slices, not loops over Frames, so the panels cost the same at step 5
    and at step 5000. Owned by the UI thread; the worker only hands it finished Frames.
    """

    _serials = itertools.count()

    def __init__(self, config: K3Config, prompt_len: int):
        self.serial = next(self._serials)    # panels key their drawings on it (id() may be reused)
        self.config = config
        self.prompt_len = prompt_len
        self.frames: list[Frame] = []
        self._ids = {layer: _Buffer((config.top_k,), np.int32) for layer in config.moe_layers}
        self._norms = {layer: _Buffer((config.kda_heads,), np.float32) for layer in config.kda_layers}
        self._memory = _Buffer((4,), np.int64)       # position, kv, state, twin kv

    def __len__(self) -> int:
        return len(self.frames)

    def append(self, frame: Frame) -> None:
        self.frames.append(frame)
        for layer, buf in self._ids.items():
            r = frame.routing_for(layer)
            buf.append(r.expert_ids if r is not None else -1)
        for layer, buf in self._norms.items():
            r = frame.kda_for(layer)
            buf.append(r.state_norm if r is not None else np.nan)
        m = frame.memory
        self._memory.append((frame.position, m.kv_bytes, m.state_bytes, m.twin_kv_bytes))

    def expert_load(self, layer: int, upto: int) -> np.ndarray:
        """[E] tokens routed to each expert of `layer` over steps 0..upto."""
        ids = self._ids[layer].upto(upto).ravel()
        return np.bincount(ids[ids >= 0], minlength=self.config.num_experts)

    def state_norms(self, layer: int, head: int, upto: int) -> np.ndarray:
        return self._norms[layer].upto(upto)[:, head]

    def memory(self, upto: int) -> dict[str, np.ndarray]:
        m = self._memory.upto(upto)
        return {"position": m[:, 0], "kv_bytes": m[:, 1], "state_bytes": m[:, 2], "twin_kv_bytes": m[:, 3]}


# ---------------------------------------------------------------------------------------- sublayers


def source_labels(config: K3Config, layer: int, site: str, n: int) -> list[str]:
    """Names of the n AttnRes sources read by one sublayer (attnres.md §2, Block AttnRes):
    the embedding, the completed block sums B1.., then the current block's partial sum "cur" if it has one."""
    s = 2 * layer + (site == "mlp")                     # sublayers before this one; the head reads all 2L
    block = 1 if config.residual == "full" else config.attnres_block_size
    partial = s % block > 0
    names = ["emb"] + [f"B{i}" for i in range(1, n - partial)] + (["cur"] if partial else [])
    return names[:n]


@dataclass(frozen=True)
class View:
    """What the panels show: everything is read from here, nothing from the app."""

    config: K3Config
    timeline: Timeline
    step: int
    layer: int
    head: int
    sub: SublayerView | None    # the sublayer stepped into (Simulation.step_into), or None at token level
    compare: bool
    expert: int                 # selected expert, -1 none
    subs: tuple = ()            # all sublayers of this token when stepped in

    @property
    def frame(self) -> Frame:
        return self.timeline.frames[self.step]

    @property
    def kda_layer(self) -> int | None:
        """The KDA layer the state panel shows: the selected one, else the nearest KDA layer below it."""
        below = [i for i in self.config.kda_layers if i <= self.layer]
        return below[-1] if below else (self.config.kda_layers[0] if self.config.kda_layers else None)


# ---------------------------------------------------------------------------------------- panels


class Panel(ScrollView):
    """A focusable, scrollable, maximisable panel that draws one Rich renderable with the Line API.

    The renderable is turned into lines once per change, at the panel's width; scrolling and repaints
    then only crop those lines. Nothing is measured or laid out again, so a step repaints only what
    changed (a Static would re-measure its content and re-flow the whole screen on every update).
    It redraws only when its key (what it shows, and its width) changes.
    """

    can_focus = True
    TITLE = ""

    def __init__(self, **kwargs):
        super().__init__(classes="panel", **kwargs)
        self.border_title = self.TITLE
        self._key = None
        self._shown: tuple = (None, None)
        self._lines: list[Strip] = []

    @property
    def inner_width(self) -> int:
        return max(self.scrollable_content_region.width, 20)

    @property
    def text(self) -> str:
        """Everything the panel holds as plain text, also what is scrolled out of view."""
        return "\n".join(line.text for line in self._lines)

    def show(self, view: View | None, message: str | None = None) -> None:
        self._shown = (view, message)
        if not self.is_mounted or self.size.width == 0:
            return
        key = ("msg", message, self.inner_width) if view is None else (self.inner_width, *self.key(view))
        if key == self._key:
            return
        self._key = key
        if view is None:
            return self._set(Text(message or "", style="italic"))
        try:
            title, renderable = self.draw(view)
        except Exception as exc:  # noqa: BLE001 - a drawing bug must not take the session down
            title = self.TITLE
            renderable = Text(f"could not draw this panel: {type(exc).__name__}: {exc}", style="bold red")
        if title != self.border_title:
            self.border_title = title
        self._set(renderable)

    def _set(self, renderable) -> None:
        console, width = self.app.console, self.inner_width
        options = console.options.update(width=width, highlight=False)
        lines = console.render_lines(renderable, options, pad=True, new_lines=False)
        self._lines = [Strip(line, width) for line in lines]   # padded to `width`: no need to measure
        # a virtual size change re-flows the whole screen: keep it at least the panel's height
        size = Size(width, max(len(self._lines), self.scrollable_content_region.height))
        if size != self.virtual_size:
            self.virtual_size = size
        self.refresh()

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width, style = self.scrollable_content_region.width, self.rich_style
        i = scroll_y + y
        if i >= len(self._lines):
            return Strip.blank(width, style)
        return self._lines[i].crop_extend(scroll_x, scroll_x + width, style).apply_style(style)

    def on_resize(self) -> None:
        self.show(*self._shown)

    def key(self, view: View) -> tuple:  # pragma: no cover - overridden
        raise NotImplementedError

    def draw(self, view: View):  # pragma: no cover - overridden
        raise NotImplementedError


class SideBySide:
    """Renderables in columns of fixed widths (None: the renderable's own width), drawn line by line.

    Unlike a Table.grid it never measures its cells' content, so a 896-cell grid is built and drawn once.
    """

    def __init__(self, parts: list[tuple[object, int | None]], gap: int = 2):
        self.parts, self.gap = parts, gap

    def __rich_console__(self, console: Console, options: ConsoleOptions):
        columns = []
        for renderable, width in self.parts:
            if width is None:
                width = Measurement.get(console, options, renderable).maximum
            lines = console.render_lines(renderable, options.update(width=width), pad=True)
            columns.append((width, lines))
        gap = Segment(" " * self.gap)
        for y in range(max(len(lines) for _, lines in columns)):
            for i, (width, lines) in enumerate(columns):
                if i:
                    yield gap
                yield from lines[y] if y < len(lines) else [Segment(" " * width)]
            yield Segment.line()

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        widths = [w if w is not None else Measurement.get(console, options, r).maximum for r, w in self.parts]
        total = sum(widths) + self.gap * (len(widths) - 1)
        return Measurement(total, total)


def active_line(config: K3Config) -> Text:
    """The sparsity in one line, computed for the preset shown (K3: 16 of 896 = 1.8%)."""
    frac = config.top_k / config.num_experts
    return Text(f"{config.top_k} of {config.num_experts} experts = {frac:.1%} of expert parameters active",
                style="bold")


class RoutingPanel(Panel):
    """Sparse MoE: the expert grid, the top-k table, the load over the run (k3_facts.md §1c)."""

    TITLE = "Routing"

    def key(self, v: View) -> tuple:
        return (v.timeline.serial, v.step, v.layer, v.expert, v.compare)

    def draw(self, v: View):
        cfg, frame = v.config, v.frame
        r = frame.routing_for(v.layer)
        title = f"Routing · layer {v.layer}"
        if r is None:
            moe = cfg.moe_layers
            hint = f"MoE layers: {moe[0]}-{moe[-1]}" if moe else "this preset has no MoE layers"
            return title + " (dense)", Group(
                active_line(cfg),
                Text(f"Layer {v.layer} uses a dense SiTU-GLU MLP (soft-capped SwiGLU), like K3's first layer: every token uses all of "
                     f"it, so there is nothing to route. {hint} (j/k to change layer)."))
        load = v.timeline.expert_load(v.layer, v.step)
        tokens = v.step + 1
        left = [active_line(cfg), R.expert_grid(r, cfg.num_experts), _grid_legend(r)]
        if v.expert >= 0:
            left.append(_expert_line(r, load, v.expert))
        if v.compare and v.step > 0:
            prev = v.timeline.frames[v.step - 1].routing_for(v.layer)
            if prev is not None:
                same = len(set(r.expert_ids.tolist()) & set(prev.expert_ids.tolist()))
                left.append(Text(f"compare: {same} of {cfg.top_k} also chosen for the previous token",
                                 style="cyan"))
        topk = R.topk_table(r)
        topk.box = None                    # k = 16 rows fit the panel without the frame lines
        loads = Group(Text(f"load over {tokens} token{'s' * (tokens != 1)}", style="bold"),
                      R.expert_load_bars(load, top=min(12, cfg.num_experts), width=16))
        grid_width = max(min(cfg.num_experts, 56), 52)    # long lines wrap under the grid
        if self.inner_width >= grid_width + 94:           # grid | top-k | load side by side
            row = SideBySide([(Group(*left), grid_width), (topk, None), (loads, 36)])
        else:                                             # narrower: the load goes under the grid
            row = SideBySide([(Group(*left, loads), grid_width), (topk, None)])
        return title + " (MoE)", row


def _grid_legend(r) -> Text:
    scores = r.scores
    k = len(r.expert_ids)
    by_bias = len(set(r.expert_ids.tolist()) - set(np.argsort(-scores, kind="stable")[:k].tolist()))
    return Text(f"lit: the {k} chosen (magenta: chosen thanks to the bias, {by_bias} now); "
                f"blue shade: score {float(scores.min()):.3f} .. {float(scores.max()):.3f}", style="dim")


def _expert_line(r, load: np.ndarray, expert: int) -> Text:
    ids = r.expert_ids.tolist()
    chosen = (f"chosen #{ids.index(expert)}, weight {float(r.weights[ids.index(expert)]):.3f}"
              if expert in ids else "not chosen")
    return Text(f"expert {expert}: score {float(r.scores[expert]):.3f}, bias {float(r.bias[expert]):+.4f}, "
                f"{chosen}, load {int(load[expert])}", style="yellow")


class StatePanel(Panel):
    """KDA: the K x V delta-rule state of one head, its decay and write strength (kda.md §2)."""

    TITLE = "Recurrent state"

    def key(self, v: View) -> tuple:
        return (v.timeline.serial, v.step, v.layer, v.head, v.compare)

    def draw(self, v: View):
        cfg, layer = v.config, v.kda_layer
        if layer is None:
            return "Recurrent state", Text("This preset has no KDA layers.")
        rec = v.frame.kda_for(layer)
        h = min(v.head, cfg.kda_heads - 1)
        k = cfg.kda_head_dim
        title = f"State · KDA layer {layer} · head {h} · {format_bytes(k * k * 4)} fixed"
        parts = []
        if v.compare:
            twin_layer = v.frame.memory.twin_kv_bytes // max(cfg.num_layers, 1)
            parts.append(Text(f"compare: in the all-softmax twin this layer is MLA and caches "
                              f"{format_bytes(twin_layer)} at {v.frame.position + 1} tokens, + "
                              f"{cfg.mla_cache_width * cfg.dtype_bytes} B per token", style="cyan"))
        if layer != v.layer:
            parts.append(Text(f"layer {v.layer} is gated MLA (softmax, a growing KV cache, no recurrent state); "
                              f"showing the KDA layer below it.", style="italic"))
        if rec is None:
            return title, Group(*parts, Text("no KDA record for this token"))
        hist = v.timeline.state_norms(layer, h, v.step)
        bars = R.decay_beta_bars(rec, h, width=12)
        for column in bars.columns[2:]:    # one line per row: the numbers that matter are on top already
            column.no_wrap, column.overflow = True, "ellipsis"
            column.max_width = max(8, self.inner_width - 9 - max(k, 12) - 2)
        parts += [
            Text.assemble(("delta-rule correction ", "bold"),   # what this token wrote (kda.md §2)
                          f"‖S_t - Diag(α) S_t-1‖ = {float(rec.correction_norm[h]):.4f}"),
            Text.assemble(("state ", "bold"), f"‖S‖ = {float(rec.state_norm[h]):.4f}, over time ",
                          R.sparkline(hist[-max(8, self.inner_width - 40):], lo=0.0)),
            R.state_heatmap(rec.state[h].astype(np.float32)),
            bars,
        ]
        return title, Group(*parts)


class MemoryPanel(Panel):
    """Cache bytes: the hybrid's fixed KDA states + MLA latents vs the all-softmax twin (k3_facts.md §5a)."""

    TITLE = "Memory"

    def key(self, v: View) -> tuple:
        return (v.timeline.serial, v.step, v.compare)

    def draw(self, v: View):
        cfg, frame = v.config, v.frame
        m = frame.memory
        hist = v.timeline.memory(v.step)
        hybrid = (hist["kv_bytes"] + hist["state_bytes"])[-SPARK_WIDTH:]
        twin = hist["twin_kv_bytes"][-SPARK_WIDTH:]
        top = float(max(hybrid.max(), twin.max(), 1))   # one scale for both: the twin climbs faster
        tokens = frame.position + 1
        fixed = state_bytes_fixed(cfg)
        spark_w = max(8, self.inner_width - 22)
        grid = Table.grid(padding=(0, 1))
        grid.add_row(Text("hybrid", style="bold green"), R.sparkline(hybrid[-spark_w:], 0.0, top),
                     format_bytes(m.total_bytes))
        grid.add_row(Text("twin", style="bold blue"), R.sparkline(twin[-spark_w:], 0.0, top),
                     format_bytes(m.twin_kv_bytes))
        parts = [
            R.memory_bars(frame, cfg, width=max(6, min(30, self.inner_width - 50))),
            grid,
            Text(f"KDA state: fixed {format_bytes(fixed.total)} ({len(cfg.kda_layers)} layers x {cfg.kda_heads} "
                 f"heads x {cfg.kda_head_dim}x{cfg.kda_head_dim} fp32 + conv tails), the same at 1 token and at 1M"),
            Text(_crossover(cfg), style="italic"),
        ]
        measured = saved_line()            # this machine's `python -m sim measure --save`, when there is one
        if measured:
            parts.append(Text(measured, style="italic cyan"))
        if v.compare:                      # what the learner just asked for goes on top, in view
            parts.insert(0, _per_layer_table(cfg, frame))
        return f"Memory · {tokens} tokens", Group(*parts)


def _crossover(cfg: K3Config) -> str:
    """From how many tokens the hybrid's cache is smaller than the twin's: its fixed KDA states are a
    head start that the twin's faster-growing KV cache overtakes (k3_facts.md §5a)."""
    fixed = state_bytes_fixed(cfg).total
    per_token = kv_bytes_per_token(cfg.twin()) - kv_bytes_per_token(cfg)
    if per_token <= 0:
        return "this preset has no KDA layers: hybrid and twin grow alike"
    return (f"per token the twin grows by {format_bytes(kv_bytes_per_token(cfg.twin()))}, the hybrid by "
            f"{format_bytes(kv_bytes_per_token(cfg))}: the hybrid is smaller from {fixed // per_token + 1:,} "
            f"tokens on")


def _per_layer_table(cfg: K3Config, frame: Frame) -> Group:
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


class DepthPanel(Panel):
    """Attention Residuals: how each sublayer mixes the depth sources, and |h| by depth (attnres.md §2)."""

    TITLE = "Depth"

    def key(self, v: View) -> tuple:
        return (v.timeline.serial, v.step, v.layer, None if v.sub is None else v.sub.index, v.compare,
                self.scrollable_content_region.height)

    def draw(self, v: View):
        frame = v.frame
        norms = np.array([d.h_norm for d in frame.depth], dtype=np.float32)
        heatmap, window = _depth_window(frame, v.layer, max(8, self.scrollable_content_region.height - 4))
        parts = []
        if v.compare:
            parts.append(Text("compare: a standard residual gives every source weight 1 (a fixed sum); "
                              "zero-initialised AttnRes starts uniform (1/N) and learns to differ", style="cyan"))
        if v.sub is not None:
            parts += _stepped_in(v)
        parts += [
            Text.assemble(("|h| by depth ", "bold"), R.sparkline(_resample(norms, max(8, self.inner_width - 14)))),
            R.depth_heatmap(heatmap),
        ]
        if window:
            parts.insert(-1, Text(window, style="dim"))
        title = "Depth · AttnRes" if v.sub is None else f"Depth · {v.sub.label}"
        return title, Group(*parts)


def _depth_window(frame: Frame, layer: int, rows: int) -> tuple[Frame, str]:
    """The frame cut to `rows` depth reads around `layer`, so 93 layers cost what 8 do (j/k moves the window)."""
    reads = [d for d in frame.depth if d.weights.size]
    if len(reads) <= rows:
        return frame, ""
    lo = max(0, min(2 * layer - rows // 2, len(reads) - rows))
    shown = reads[lo:lo + rows]
    first, last = shown[0], shown[-1]
    name = lambda d: "out" if d.site == "out" else f"L{d.layer} {d.site}"  # noqa: E731
    return (dataclasses.replace(frame, depth=tuple(shown)),
            f"rows {name(first)} .. {name(last)} of {len(reads)} (j/k moves)")


def _stepped_in(v: View) -> list:
    sub, subs = v.sub, v.subs
    lo = max(0, min(sub.index - 2, len(subs) - 5))
    lines = Text()
    for s in subs[lo:lo + 5]:
        here = s.index == sub.index
        lines.append(f"{'▶' if here else ' '} {s.index:>3}  {s.label}\n", style="reverse bold" if here else "")
    parts = [Text(f"inside token '{v.frame.input_text}' (pos {v.frame.position}): sublayer {sub.index} of "
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
        detail.add_row("next", "  ".join(f"{text!r} {p:.2f}" for _, text, p in sub.top))
    weights = sub.depth.weights if sub.depth is not None else ()
    if len(weights):
        detail.add_row(Text("AttnRes", style="bold"), Text("weights over the depth sources", style="bold"))
        for name, w in zip(source_labels(v.config, sub.layer, sub.site, len(weights)), weights):
            detail.add_row(f"  {name}", Text(f"{float(w):.3f} " + "█" * int(round(float(w) * 20)), style="magenta"))
    parts.append(detail)
    return parts


def _resample(values: np.ndarray, width: int) -> np.ndarray:
    """At most `width` values (max over equal chunks), so 187 sublayers still fit one line."""
    if len(values) <= width:
        return values
    edges = np.linspace(0, len(values), width + 1).astype(int)
    return np.array([values[a:b].max() for a, b in zip(edges[:-1], edges[1:])])


# ---------------------------------------------------------------------------------------- tokens


def timeline_text(timeline: Timeline, step: int, visited: int, width: int) -> Text:
    """The tokens around the cursor that fit `width`: prompt dim, generated bold, cursor reversed.

    Only frames up to `visited` are shown (the rest is look-ahead the learner has not asked for).
    """
    frames = timeline.frames
    end = min(visited, len(frames) - 1)
    pieces, used = [], 0
    for i in range(end, -1, -1):
        f = frames[i]
        style = "reverse bold yellow" if i == step else ("dim" if i < timeline.prompt_len else "bold")
        if i > step:
            style = "dim italic"
        pieces.append((f.input_text, style))
        used += len(f.input_text)
        if used > width - 12 and i < step - 4:
            break
    pieces.reverse()
    last = frames[end]
    text = Text.assemble(*pieces)
    if end == step:
        text.append(" → ", style="dim")
        text.append(last.token_text, style="bold green")
    return text
