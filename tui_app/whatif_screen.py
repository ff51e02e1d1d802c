"""The what-if result: the numbers of a sim.whatif.WhatIf beside the focused panel drawn on the branch.

Left: the change, both continuations, this step's next-token top-5 before and after (with probabilities),
and per step the KL(original || branch) and the first sublayer whose output moved. Right: the panel that
was focused when `x` was pressed, drawn from the branch's frames (sim.whatif.branch_timeline), e.g. the
state after a reset or the routing with the expert that took over lit. n / b walk the steps; Escape
returns to the main timeline, which the what-if never touched.
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Static

from sim.interventions import describe
from sim.whatif import WhatIf, branch_timeline

from .footer import K3Footer
from .panel import View, no_twin, quoted, twin_name
from .panels import DepthPanel, MemoryPanel, RoutingPanel, StatePanel
from .screens import Dialog

PANEL_CLASSES = {"routing": RoutingPanel, "state": StatePanel, "depth": DepthPanel, "memory": MemoryPanel}
SAME = "none (identical)"   # first_divergence when no sublayer moved


KL_FLOOR = 1e-6   # below this a KL is float32 rounding between two nearly equal softmaxes, not a change


def fmt_kl(kl: float) -> str:
    """KL in nats to 3 significant digits: a small move (1e-5) stays visible, identical shows 0, and float32
    noise (0 < KL < 1e-6, which moves with the summation order of the machine's kernels) shows as "<1e-6"."""
    return "<1e-6" if 0 < kl < KL_FLOOR else f"{kl:.3g}"


def continuation(frames) -> str:
    """The tokens a run chose, each as the Frame shows it (escaped: a newline stays on one line)."""
    return "".join(f.token_text for f in frames)


def top_table(before, after) -> Table:
    """Top-5 next tokens, the original's beside the branch's: (id, text, probability) each."""
    table = Table(title="next token, top 5", title_justify="left", box=None, pad_edge=False)
    for name, justify in (("before", "left"), ("p", "right"), ("after", "left"), ("p ", "right")):
        table.add_column(name, justify=justify)
    for (_, tb, pb), (_, ta, pa) in zip(before, after):
        table.add_row(quoted(tb), f"{pb:.3f}", quoted(ta), f"{pa:.3f}")
    return table


def carried_sentence(c) -> str:
    """sim.recall_moment.StillCarried in words (its `sentence`)."""
    return c.sentence()


def summary(w: WhatIf, step: int, carried=None, sim=None) -> Group:
    """The what-if in text: the change, both continuations, step `step`'s top-5, KL and divergence per step;
    `carried` (sim.recall_moment.StillCarried) says who still holds an answer that a reset left alone. sim: the
    run it branched from, to say what its twin is (panel.no_twin, panel.twin_name) beside a window's twin KL."""
    changes = ", ".join(describe(c) for c in w.changes) or "nothing (the original, recomputed)"
    head = Text.assemble(("what if: ", "bold"), changes, f"  ·  at step {w.position}, {w.steps} tokens")
    if carried is not None:
        head = Text.assemble(head, "\n", ("still carried: ", "bold yellow"), carried_sentence(carried))
    runs = Text.assemble(("original: ", "bold"), continuation(w.original), "\n",
                         ("what-if:  ", "bold magenta"), continuation(w.frames))
    why = None if sim is None else no_twin(sim.config)
    twin = bool(w.twin_kl) and why is None  # a window: the all-MLA twin under the same window, beside
    name = "twin" if sim is None else twin_name(sim)
    # the title as a line of its own: a table's title wraps to the table's width (3 lines at 80 columns)
    per_step_title = Text("per step: KL(original ‖ what-if) in nats, the first sublayer that diverged"
                          + (f", the {name}'s KL under the same window" if twin else "") + " (n / b move)",
                          style="italic")
    if w.twin_kl and why is not None:
        per_step_title.append(f"\nno twin KL: {why}.", style="italic yellow")
    elif twin and name != "twin":
        per_step_title.append(f"\nthe twin has random weights (no trained twin ships for {sim.config.name}): its "
                              f"KL compares against noise.", style="italic yellow")
    per_step = Table(box=None, pad_edge=False)
    for column in ("step", "pos", "KL", "first diverged") + ((f"{name} KL",) if twin else ()):
        per_step.add_column(column)
    for s in range(w.steps):
        per_step.add_row(str(s), str(w.position + s), fmt_kl(w.kl[s]), w.first_divergence[s] or SAME,
                         *((fmt_kl(w.twin_kl[s]),) if twin else ()), style="reverse" if s == step else "")
    return Group(head, runs, Text(), top_table(w.top_before[step], w.top_after[step]), Text(), per_step_title,
                 per_step)


def lit_expert(w: WhatIf, step: int, layer: int) -> int:
    """The expert the branch chose at `layer` that the original did not (the one that took over), else -1."""
    before, after = w.original[step].routing_for(layer), w.frames[step].routing_for(layer)
    if before is None or after is None:
        return -1
    new = sorted(set(after.expert_ids.tolist()) - set(before.expert_ids.tolist()))
    return new[0] if new else -1


ONE_COLUMN_BELOW = 120   # narrower terminals show the summary or the branch's panel, tab switches


class WhatIfScreen(Dialog):
    """Full screen (modal, so the main timeline's keys are off while it shows). Below ONE_COLUMN_BELOW
    columns (80x24, 100x30) one column at a time: the summary at full width, whole top-5 table and KL
    column, scrolling (↑ ↓, focused) where it is taller than the terminal; tab shows the branch's panel."""

    BINDINGS = [Binding("escape", "close", "back"), Binding("n", "move(1)", "next step"),
                Binding("b", "move(-1)", "previous step"), Binding("tab", "toggle_panel", "panel / summary")]

    def __init__(self, w: WhatIf, sim, panel: str, layer: int, head: int, carried=None):
        super().__init__()
        self.w, self.panel_name, self.panel_layer, self.panel_head = w, panel, layer, head
        self.carried, self.sim = carried, sim
        self.branch = branch_timeline(sim, w)
        self.step = 0

    def compose(self) -> ComposeResult:
        with Horizontal(id="whatif"):
            with VerticalScroll(id="whatif-summary"):
                yield Static(id="whatif-summary-text")
            yield PANEL_CLASSES[self.panel_name](id="whatif-panel")
        yield K3Footer()

    ready = False      # the summary and the panel are mounted and drawn (Dialog.after_composed)

    def on_mount(self) -> None:
        self.after_composed(self._first_draw, "#whatif-summary-text", "#whatif-panel")

    def _first_draw(self) -> None:
        self.query_one("#whatif-summary").border_title = "What if"
        self.ready = True
        self._layout(self.app.size.width)
        self._draw()

    def on_resize(self, event) -> None:
        if self.ready:
            self._layout(event.size.width)

    @property
    def narrow(self) -> bool:
        return self.has_class("-narrow")

    def _layout(self, width: int) -> None:
        self.set_class(width < ONE_COLUMN_BELOW, "-narrow")
        showing_panel = not self.narrow or self.has_class("-show-panel")
        self.query_one("#whatif-panel" if showing_panel else "#whatif-summary").focus()

    def action_toggle_panel(self) -> None:
        """tab: in one column, the summary or the branch's panel; side by side, focus the other one."""
        if not self.ready:
            return
        self.toggle_class("-show-panel")
        self._layout(self.app.size.width)
        if not self.narrow:
            self.query_one("#whatif-summary" if self.has_class("-show-panel") else "#whatif-panel").focus()

    def view(self) -> View:
        """The branch at this step, as the panels read it."""
        cfg = self.branch.config
        return View(self.branch, -1, self.w.position + self.step, self.panel_layer, min(self.panel_head, cfg.kda_heads - 1),
                    None, False, lit_expert(self.w, self.step, self.panel_layer))

    def _draw(self) -> None:
        self.query_one("#whatif-summary-text", Static).update(summary(self.w, self.step, self.carried, self.sim))
        panel = self.query_one("#whatif-panel")
        panel.show(self.view())
        panel.border_subtitle = f"the branch, step {self.step} of {self.w.steps - 1}"

    def action_move(self, delta: int) -> None:
        self.step = min(max(self.step + delta, 0), self.w.steps - 1)
        if self.ready:
            self._draw()

    def action_close(self) -> None:
        self.dismiss(None)
