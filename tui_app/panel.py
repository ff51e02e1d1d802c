"""What a panel draws (`View`), the panel widget they all are (`Panel`), and `SideBySide`, the renderable that
sets columns beside each other without measuring them.

A panel redraws only when what it shows changed (its `key`), so stepping stays cheap on 93-layer presets;
`invalidate()` forces the next draw (after a zoom or a layout switch changed what is visible).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console, ConsoleOptions
from rich.measure import Measurement
from rich.segment import Segment
from rich.text import Text
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from sim import Simulation
from sim.frame import Frame, SublayerView

COLUMN_GAP = 2          # SideBySide's gap between columns


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def quoted(text: str) -> str:
    """A token label in quotes; token_text already escapes \\n and friends, so no repr() on top."""
    return f"'{text}'"


def no_twin(config) -> str | None:
    """Why a preset has no all-MLA twin to compare with, in one sentence that says where one is; None when it has
    one. A preset without KDA layers is all MLA already (small-twin, k2-tiny): the "twin" a Simulation builds
    beside it would be another copy of itself, with random weights."""
    if config.kda_layers:
        return None
    hybrid = config.name.removesuffix("-twin")
    if hybrid != config.name:
        return (f"{config.name} is itself the all-MLA twin of {hybrid}, so it has no twin of its own; p → {hybrid} "
                f"compares the hybrid with it")
    return (f"{config.name} has no KDA layers: it is all MLA already, so there is no all-MLA twin to compare it "
            f"with; p → small compares a hybrid with its twin")


def twin_name(sim) -> str:
    """What the all-MLA twin beside a run is called on screen: "twin", or "random-weight twin" where the hybrid
    runs trained weights but no trained twin ships for it (its numbers then compare against noise)."""
    if getattr(sim, "weights", None) == "trained" and getattr(sim, "twin_weights", None) == "random":
        return "random-weight twin"
    return "twin"


@dataclass(frozen=True)
class View:
    """What the panels show: everything is read from here, nothing from the app."""

    sim: Simulation
    session: int                # bumps with every loaded session: panels key their drawings on it
    step: int
    layer: int
    head: int
    sublayer: SublayerView | None   # the sublayer stepped into (Simulation.step_into), or None at token level
    compare: bool
    expert: int                 # selected expert, -1 none
    sublayers: tuple = ()       # all sublayers of this token when stepped in
    recall: object = None       # sim.recall_moment.RecallMoment when the input is a recall query's "=", else None
    pinned: bool = False        # the state panel shows the recall moment's reading head (until j/k/h/H)

    @property
    def config(self):
        """The preset's K3Config."""
        return self.sim.config

    @property
    def frame(self) -> Frame:
        return self.sim.frames[self.step]

    @property
    def reading_head(self):
        """The recall moment's head that reads the value back (sim.recall_moment), or None."""
        return None if self.recall is None else self.recall.reading_head

    @property
    def pin(self):
        """The head the state panel is pinned to (the reading head at a recall query), or None."""
        return self.reading_head if self.pinned else None

    @property
    def kda_layer(self) -> int | None:
        """The KDA layer the state panel shows: the pinned reading head's, else the selected layer, else the
        nearest KDA layer below it."""
        if self.pin is not None:
            return self.pin.layer
        below = [i for i in self.config.kda_layers if i <= self.layer]
        return below[-1] if below else (self.config.kda_layers[0] if self.config.kda_layers else None)

    @property
    def kda_head(self) -> int:
        """The KDA head the state panel shows: the pinned reading head, else the selected head."""
        return self.pin.head if self.pin is not None else min(self.head, self.config.kda_heads - 1)


class Panel(ScrollView):
    """A focusable, scrollable panel that draws one Rich renderable with the Line API.

    The renderable is turned into lines once per change, at the panel's width; scrolling and repaints
    then only crop those lines. Nothing is measured or laid out again, so a step repaints only what
    changed (a Static would re-measure its content and re-flow the whole screen on every update).
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
    def inner_height(self) -> int:
        return self.scrollable_content_region.height

    @property
    def text(self) -> str:
        """Everything the panel holds as plain text, also what is scrolled out of view."""
        return "\n".join(line.text for line in self._lines)

    def invalidate(self) -> None:
        self._key = None

    def show(self, view: View | None, message: str | None = None) -> None:
        self._shown = (view, message)
        if not self.is_mounted or self.size.width == 0 or not self.display:
            return                          # hidden: drawn when shown again (on_resize / invalidate)
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
        size = Size(width, max(len(self._lines), self.inner_height))
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

    def watch_show_vertical_scrollbar(self) -> None:
        """A vertical scrollbar that comes or goes changes the width the lines fit: draw them again at the new
        width (the key holds it), or lines drawn for the old one would leave a stray horizontal scrollbar."""
        self.call_after_refresh(self.on_resize)

    # Each panel says what it shows (Routing-, State-, Memory-, DepthPanel): Panel itself is never mounted.
    def key(self, view: View) -> tuple:  # pragma: no cover - every panel defines it
        """What this panel's picture depends on: an equal key means nothing to redraw."""
        raise NotImplementedError(f"{type(self).__name__} must define key(view)")

    def draw(self, view: View):  # pragma: no cover - every panel defines it
        """The Rich renderable for view."""
        raise NotImplementedError(f"{type(self).__name__} must define draw(view)")


class SideBySide:
    """Renderables in columns of fixed widths (None: the renderable's own width), drawn line by line.

    Unlike a Table.grid it never measures its cells' content, so a 896-cell grid is built and drawn once.
    """

    def __init__(self, parts: list[tuple[object, int | None]], gap: int = COLUMN_GAP):
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
