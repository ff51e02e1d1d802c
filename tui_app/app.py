"""TinyK3App: step through generation and watch MoE routing, the KDA state, the cache and AttnRes.

Layout. Full (from FULL_WIDTH x FULL_HEIGHT): the token timeline, the routing panel, then the state, depth
and memory panels side by side. Compact (from MIN_WIDTH x MIN_HEIGHT, e.g. an 80x24 terminal): the
timeline, the routing headline (always on screen), a panel switcher and one panel at a time. Below that
a message. The zoomed panel (z) keeps its border, and the status line keeps the step.

Work. The plain-Python `Driver` owns the Simulation, the cursor and what to compute next; this class only
turns keys into driver calls and runs the driver's jobs in Textual thread workers (`run_job`: one load,
one step, one what-if at a time), whose outcomes come back as messages (tui_app/messages.py). Reactive
state is scalars only.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Callable

from rich.text import Text
from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widgets import Static

from sim.memory import crossover_tokens, format_bytes
from sim.presets import DEFAULT_PRESET, DEFAULT_PROMPT, K3Config, config_for

from .commands import K3Commands
from .driver import Driver, RunSpec, runs_dir, save_note
from .footer import K3Footer
from .messages import JobFinished, JobOutcome, JobProgress, WorkerPool, run_job
from .panel import no_twin
from .runs import weights_for, weights_note
from .panels import DepthPanel, MemoryPanel, Panel, RoutingPanel, StatePanel, View, routing_headline
from .dialogs import Dialogs
from .navigation import PANELS, Navigation
from .widgets import PanelTabs, ProgressLine, StatusLine, Timeline, TooSmall

MIN_WIDTH, MIN_HEIGHT = 80, 24      # compact layout from here: tokens, routing headline, one panel at a time
FULL_WIDTH, FULL_HEIGHT = 120, 36   # full layout from here: all four panels
TALL_HEIGHT = 44                    # from here the routing panel shows the whole top-16 table (20 rows)
RUN_INTERVAL = 0.08                 # seconds between steps while running (the display rate)
KEPT = "the current session stays; e for another prompt, p for another preset"     # after a load that failed
NOTHING_LOADED = "nothing loaded: e for a prompt, p for a preset"


# In the footer's order: K3Footer shows the first ones that fit the width (80 columns: n to s), ? all.
KEYS = [
    Binding("n", "next", "next"),
    Binding("right", "next", "next", show=False),
    Binding("b", "back", "back"),
    Binding("left", "back", "back", show=False),
    Binding("x", "what_if", "what-if"),
    Binding("r", "run", "run"),
    Binding("j", "layer(1)", "layer", key_display="j/k"),
    Binding("k", "layer(-1)", "layer-", show=False),
    Binding("e", "edit_prompt", "prompt"),
    Binding("p", "preset", "preset"),
    Binding("question_mark", "help", "help"),
    Binding("q", "quit", "quit"),
    Binding("s", "save", "save"),
    Binding("c", "compare", "compare"),
    Binding("z", "zoom", "zoom"),
    Binding("i", "step_in", "in"),
    Binding("ctrl+p", "command_palette", "palette", key_display="^p"),
    Binding("o", "step_out", "out", show=False),
    Binding("h", "head(1)", "head", show=False),
    Binding("H", "head(-1)", "head-", show=False),
    Binding("tab", "cycle_panel(1)", "panel", show=False, priority=True),
    Binding("shift+tab", "cycle_panel(-1)", "panel", show=False, priority=True),
    Binding("escape", "cancel", "cancel", show=False),
    *(Binding(str(i + 1), f"show_panel('{name}')", name, show=False) for i, name in enumerate(PANELS)),
]


class TinyK3App(Navigation, Dialogs, App):
    """The step-through simulator. `TinyK3App()` opens the default preset and prompt."""

    CSS_PATH = Path(__file__).with_name("tui.tcss")
    TITLE = "tiny-k3"
    COMMANDS = App.COMMANDS | {K3Commands}
    BINDINGS = KEYS       # their actions: here, navigation.py (selection, panels), dialogs.py (modal screens)

    layer: reactive[int] = reactive(1, init=False, repaint=False)
    head: reactive[int] = reactive(0, init=False, repaint=False)
    sublayer_index: reactive[int] = reactive(-1, init=False, repaint=False)   # stepped into; -1 = token level
    expert: reactive[int] = reactive(-1, init=False, repaint=False)
    compare: reactive[bool] = reactive(False, init=False, repaint=False)
    running: reactive[bool] = reactive(False, init=False, repaint=False)

    def __init__(self, preset: str | None = None, prompt: str | None = None, seed: int = 0,
                 device: str | None = None, *, weights: str = "auto", show_timings: bool = True,
                 lookahead: int = 2, open_path: str | None = None, save_dir: str | Path | None = None):
        super().__init__()
        preset = preset or DEFAULT_PRESET
        self.spec = RunSpec(preset, DEFAULT_PROMPT if prompt is None else prompt, seed, weights, device, open_path)
        self.driver = Driver(lookahead=lookahead)
        self.show_timings = show_timings
        self.save_dir = runs_dir() if save_dir is None else Path(save_dir)   # `s` writes here
        try:
            self.config = config_for(preset)
        except ValueError:
            self.config = K3Config.preset(DEFAULT_PRESET)
        self.session = 0                    # bumps with every installed session: panels key on it
        self.message: str | Text = ""       # one line above the status bar: errors and notices
        self.drawn: tuple | None = None     # (step, layer, head, sublayer_index) handed to the panels last
        self.zoomed = False
        self.shown_panel = "routing"        # the one panel of the compact layout (and of the zoom)
        self.layout_mode = "full"           # "full", "compact" or "too-small"
        self._quitting = False
        self._redraw_pending = self._pump_pending = False
        self._crossed = False               # r pauses once where the memory lines cross
        self._tokens_shown = 0              # tokens of the frame on screen, to see a crossing happen
        self._sublayers_key, self._sublayers = None, ()
        self._main = None                   # the main screen, once mounted (queries never hit a modal)
        self._whatif_for: tuple | None = None   # (job, panel, layer, head): where the asked-for what-if draws
        self.pin_recall = True              # the state panel shows a recall query's reading head until j/k/h/H

    # ------------------------------------------------------------------ compatibility views of the state
    @property
    def step(self) -> int:
        return self.driver.step

    @property
    def sim(self):
        return self.driver.sim

    @property
    def preset(self) -> str:
        return (self.driver.spec or self.spec).preset

    @property
    def prompt(self) -> str:
        return (self.driver.spec or self.spec).prompt

    @property
    def idle(self) -> bool:
        """No job running or wanted and nothing left to draw (tests and the benchmark wait for this)."""
        d = self.driver
        return not (d.busy or d.loading is not None or d.whatif is not None or d.wants_step() or d.wants_recall()
                    or self._redraw_pending or self._pump_pending or not getattr(self.screen, "ready", True))

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield Timeline(id="timeline")
        yield Static(id="headline")
        yield PanelTabs(id="tabs")
        with Vertical(id="panels"):
            yield RoutingPanel(id="routing")
            with Horizontal(id="lower"):
                yield StatePanel(id="state")
                yield DepthPanel(id="depth")
                yield MemoryPanel(id="memory")
        yield TooSmall(id="too-small")
        yield ProgressLine(id="progress")
        yield Static(id="message")
        yield StatusLine(id="status")
        yield K3Footer()             # the keys that fit the width, in BINDINGS order

    def on_mount(self) -> None:
        asyncio.get_running_loop().set_default_executor(WorkerPool())
        self._main = self.screen
        q = self._main.query_one
        self._panels: dict[str, Panel] = {name: q(f"#{name}", Panel) for name in PANELS}
        self._timeline, self._headline, self._tabs = q(Timeline), q("#headline", Static), q(PanelTabs)
        self._status, self._message, self._progress = q(StatusLine), q("#message", Static), q(ProgressLine)
        self._too_small = q(TooSmall)
        self._ticker = self.set_interval(RUN_INTERVAL, self._tick, pause=True)
        self._apply_layout(self.size)
        self._panels["routing"].focus()
        self._start_load(self.spec)

    def on_resize(self, event) -> None:
        self._apply_layout(event.size)

    def _apply_layout(self, size) -> None:
        if self._main is None:
            return
        w, h = size
        mode = ("too-small" if w < MIN_WIDTH or h < MIN_HEIGHT else
                "compact" if w < FULL_WIDTH or h < FULL_HEIGHT else "full")
        self.layout_mode = mode
        screen = self._main
        screen.set_class(mode == "too-small", "-too-small")
        screen.set_class(mode == "compact", "-compact")
        screen.set_class(h < TALL_HEIGHT, "-short")
        screen.set_class(self.zoomed, "-zoomed")
        screen.set_class(mode == "compact" or self.zoomed, "-one")
        for name in PANELS:
            screen.set_class(name == self.shown_panel, f"-show-{name}")
        if mode == "too-small":
            self._too_small.show(size, (MIN_WIDTH, MIN_HEIGHT), (FULL_WIDTH, FULL_HEIGHT))
        for panel in self._panels.values():   # what is visible changed: redraw everything once laid out
            panel.invalidate()
        self.call_after_refresh(self._redraw)

    # ------------------------------------------------------------------ loading
    def load_session(self, preset: str | None = None, prompt: str | None = None, seed: int | None = None) -> None:
        """Load a new Simulation; the current one stays on screen until it is ready (or fails)."""
        base = self.driver.spec or self.spec
        preset = preset or base.preset
        self._start_load(RunSpec(preset, base.prompt if prompt is None else prompt, base.seed if seed is None else seed,
                                 weights_for(preset, base, self.spec.weights), base.device))

    def _start_load(self, spec: RunSpec) -> None:
        if self._quitting:
            return
        self.running = False
        ticket = self.driver.begin_load(spec)
        self._set_message("")
        self._redraw()                      # the loading line shows at once, not at the next key

        def progress(p) -> None:
            if self.driver.report(ticket, p):
                self._draw_progress()

        self.run_in_worker("load", lambda report: self.driver.run_load(ticket, report),
                     lambda out: self._load_finished(ticket, out), progress)

    def _load_finished(self, ticket, out: JobOutcome) -> None:
        if out.cancelled:
            return
        if out.value is not None:
            previous = self.preset if self.sim is not None else None
            if not self.driver.finish_load(ticket, out.value):
                return
            self.session += 1
            self.config = self.sim.config
            self._crossed = False
            self._tokens_shown = self.driver.frames[self.step].position + 1
            self.sublayer_index = -1
            self.pin_recall = True
            self.expert = -1
            self.head = min(self.head, self.config.kda_heads - 1)
            self.compare = self.compare and not no_twin(self.config)   # all MLA: no twin to compare (c says why)
            if not 0 <= self.layer < self.config.num_layers or self.preset != previous:
                self.layer = self._start_layer()
            self._set_message(weights_note(self.driver.spec, self.sim) if self.preset != previous else "")
            self._redraw()
            self._pump()
        elif self.driver.fail_load(ticket):
            kept = KEPT if self.sim is not None else NOTHING_LOADED
            self._set_message(Text.assemble(("Not loaded: ", "bold red"), f"{out.error} ({kept})"))
            self._redraw()

    def action_cancel(self) -> None:
        """Escape: stop the what-if being computed, else the load in flight."""
        if self.driver.cancel_what_if():
            self._set_message("what-if cancelled; the timeline is as it was")
            self._draw_progress()
            self._draw_status()
        elif self.driver.cancel_load():
            kept = "the current session stays" if self.sim is not None else NOTHING_LOADED
            self._set_message(f"load cancelled; {kept}")
            self._redraw()

    # ------------------------------------------------------------------ stepping
    def _pump(self) -> None:
        """Start the next job the driver wants, one at a time: a what-if (asked for), the recall moment of the
        cursor's frame (on screen), then a step (look-ahead, or a goal past the computed frames)."""
        self._pump_pending = False
        d = self.driver
        if self._quitting:
            return
        if d.wants_what_if():
            self._start_what_if_job(d.start_what_if())
        elif d.wants_recall():
            sim, index = d.start_recall()
            self.run_in_worker("recall", lambda _: d.run_recall(sim, index), lambda out: self._recall_finished(sim, index, out))
        elif d.wants_step():
            sim, flag = d.start_step()
            self.run_in_worker("step", lambda _: d.run_step(sim, flag), lambda out: self._step_finished(sim, out))

    def _pump_after_paint(self) -> None:
        """Compute ahead only once the new step is on screen (the worker holds the GIL in bursts)."""
        if not self._pump_pending:
            self._pump_pending = True
            self.call_after_refresh(self._pump)

    def run_in_worker(self, group: str, job: Callable[[Callable], object], finished: Callable[[JobOutcome], None],
                progress: Callable[[object], None] | None = None) -> None:
        """Run job(report) in a thread worker, one per group (a new one replaces the old); report(p) hands p
        to progress and the outcome goes to finished, both on the UI thread (messages.JobProgress, JobFinished)."""
        def report(p) -> None:
            self.post_message(JobProgress(p, progress))

        def work() -> None:
            self.post_message(JobFinished(run_job(lambda: job(report)), finished))

        self.run_worker(work, name=group, group=group, thread=True, exclusive=True, exit_on_error=False)

    @on(JobProgress)
    def _job_progress(self, msg: JobProgress) -> None:
        if not self._quitting and msg.then is not None:
            msg.then(msg.progress)

    @on(JobFinished)
    def _job_finished(self, msg: JobFinished) -> None:
        if not self._quitting:
            msg.then(msg.outcome)

    def _step_finished(self, sim, out: JobOutcome) -> None:
        if out.cancelled:
            return
        moved = self.driver.finish_step(sim, out.error)
        if out.error is not None and sim is self.sim:
            self.running = False
            self._set_message(Text.assemble(("Cannot step further: ", "bold red"), out.error.rstrip("."), "; b goes back"))
        if moved:
            self._step_changed()
        else:
            self._draw_status()
            self._pump()

    # ------------------------------------------------------------------ the recall moment
    def _recall_finished(self, sim, index: int, out: JobOutcome) -> None:
        """A failed recall moment leaves the panels without a recall line, never crashes them."""
        if self.driver.finish_recall(sim, index, out.value):
            if out.error:
                self._set_message(Text.assemble(("No recall moment: ", "bold red"), f"{out.error}; n, b and x still work"))
            self._redraw()
        self._pump()

    # ------------------------------------------------------------------ stepping, continued
    def _step_changed(self) -> None:
        self.pin_recall = True              # every recall query opens on the head it names
        if self.sublayer_index >= 0:
            self.sublayer_index = min(self.sublayer_index, len(self._sublayer_views()) - 1)
        if self.message:
            self._set_message("")
        tokens = self.driver.frames[self.step].position + 1
        if self.running:                    # by the ticker or by a frame that arrived for it
            self._pause_at_crossover(self._tokens_shown, tokens)
        self._tokens_shown = tokens
        self._redraw()
        self._pump_after_paint()

    def action_next(self) -> None:
        if self._quitting or self.sim is None:
            return
        outcome = self.driver.next()
        if outcome == "moved":
            self._step_changed()
        elif outcome == "waiting":
            self._set_message(f"computing step {self.driver.goal} …")
            self._pump()
        else:
            self.bell()
            self._set_message(f"n: {self.driver.end_reason}")

    def action_back(self) -> None:
        if self._quitting or self.sim is None:
            return
        if self.driver.back():
            self._step_changed()
        else:
            self._set_message("already at the first token; n goes forward")

    def goto_step(self, i: int) -> None:
        if self.driver.goto(i):
            self._step_changed()

    def action_run(self) -> None:
        if self._quitting or self.sim is None:
            return
        if not self.running and self.driver.at_end and self.step + 1 >= len(self.driver.frames):
            self.bell()
            self._set_message(f"r: {self.driver.end_reason}")
            return
        self.running = not self.running

    def watch_running(self, running: bool) -> None:
        if running:
            self._ticker.resume()
        else:
            self._ticker.pause()
        self._draw_status()

    def _tick(self) -> None:
        if not self.running or self._quitting or self.sim is None:
            return
        outcome = self.driver.next()
        if outcome == "moved":
            self._step_changed()
        elif outcome == "end":
            self.running = False
            self._set_message(f"stopped: {self.driver.end_reason}")
        else:
            self._pump()

    def _pause_at_crossover(self, before: int, now: int) -> None:
        """The `r` demo: pause once where the twin's cache overtakes the hybrid's, and say so."""
        n = crossover_tokens(self.config)
        if n is not None and before < n <= now and not self._crossed:
            self._crossed = True
            self.running = False
            m = self.driver.frames[self.step].memory
            self._set_message(f"token {n:,}: the all-MLA twin's cache ({format_bytes(m.twin_kv_bytes)}) has passed "
                              f"the hybrid's ({format_bytes(m.total_bytes)}), and only pulls away from here; "
                              f"r runs on")

    # ------------------------------------------------------------------ saving, quitting
    def action_save(self) -> None:
        if self._quitting or self.sim is None:
            return
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = self.save_dir / f"tiny-k3-{self.preset.replace('/', '_')}-{stamp}.npz"
        self._set_message(f"saving to {path} …")
        sim, step = self.sim, self.step

        def save(_) -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            sim.save(path, cursor=step)

        self.run_in_worker("save", save, lambda out: self._set_message(
            Text.assemble(("Not saved: ", "bold red"), out.error) if out.error else save_note(path, step)))

    async def action_quit(self) -> None:
        """Quit now, whatever is running: jobs stop at their next cancel check (between two tokens)."""
        self._quitting = True
        self.running = False
        self.driver.cancel_all()
        self.exit()

    # ------------------------------------------------------------------ drawing
    def view(self) -> View | None:
        if self.sim is None:
            return None
        sub, subs = None, ()
        if self.sublayer_index >= 0:
            subs = self._sublayer_views()
            sub = subs[min(self.sublayer_index, len(subs) - 1)]
        return View(self.sim, self.session, self.step, self.layer, min(self.head, self.config.kda_heads - 1),
                    sub, self.compare, self.expert, subs, self.driver.recall_for(self.step), self.pin_recall)

    def _redraw(self) -> None:
        """Redraw once after the current batch of changes (several reactives often change together)."""
        if not self._redraw_pending and not self._quitting:
            self._redraw_pending = True
            self.call_later(self._draw)

    def _draw(self) -> None:
        self._redraw_pending = False
        if self._quitting:
            return
        view = self.view()
        self.drawn = None if view is None else (view.step, view.layer, view.head, self.sublayer_index)
        loading = self.driver.loading
        waiting = (str(self.message) if self.message else
                   f"loading {loading.spec.preset} …" if loading is not None else "nothing loaded")
        for panel in self._panels.values():
            panel.show(view, waiting)
        if view is not None:
            self._timeline.show(view, self.driver.visited)
            self._headline.update(routing_headline(view), layout=False)
        self._tabs.show(PANELS, self.shown_panel)
        self._draw_status()
        self._draw_progress()

    def _draw_status(self) -> None:
        if not self._quitting and self.is_mounted:
            self._status.show(self)

    def _draw_progress(self) -> None:
        if not self._quitting:
            self._progress.show(self.driver)

    def _set_message(self, text: str | Text) -> None:
        if self._quitting:
            return
        self.message = text
        self._message.update(text)
        self._message.display = bool(text)
        if self.sim is None:
            self._redraw()
