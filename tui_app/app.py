"""TinyK3App: step through generation and watch MoE routing, the KDA state, the cache and AttnRes.

Layout. Full (from FULL_WIDTH x FULL_HEIGHT): the token timeline, the routing panel, then the state, depth
and memory panels side by side. Compact (from MIN_WIDTH x MIN_HEIGHT, e.g. an 80x24 terminal): the
timeline, the routing headline (always on screen), a panel switcher and one panel at a time. Below that
a message. The zoomed panel (z) keeps its border, and the status line keeps the step.

Work. The plain-Python `Driver` owns the Simulation, the cursor and what to compute next; this class only
turns keys into driver calls and runs the driver's jobs in Textual thread workers (one load, one step at a
time), whose results come back as dataclass messages. Reactive state is scalars only.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Static

from sim import render
from sim.interventions import describe
from sim.memory import format_bytes
from tiny_k3.config import DEFAULT_PRESET, DEFAULT_PROMPT, K3Config
from tiny_k3.weights import config_for

from .commands import K3Commands, K3Palette
from .driver import (WHAT_IF_STEPS, Cancelled, Driver, Loaded, LoadTicket, Progress, RunSpec, WhatIfJob, runs_dir,
                     save_note)
from .footer import K3Footer
from .panels import (DepthPanel, MemoryPanel, Panel, RoutingPanel, StatePanel, View, crossover_tokens, plural,
                     quoted, routing_headline, timeline_text)
from .screens import HelpScreen, PresetScreen, PromptScreen
from .whatif_menu import WhatIfMenu, menu_for, unavailable
from .whatif_screen import WhatIfScreen

MIN_WIDTH, MIN_HEIGHT = 80, 24      # compact layout from here: tokens, routing headline, one panel at a time
FULL_WIDTH, FULL_HEIGHT = 120, 36   # full layout from here: all four panels
TALL_HEIGHT = 44                    # from here the routing panel shows the whole top-16 table (20 rows)
RUN_INTERVAL = 0.08                 # seconds between steps while running (the display rate)
PANELS = ("routing", "state", "depth", "memory")
WORKER_THREAD = "tiny-k3-worker"    # name prefix of the worker threads (tui.main waits for them on exit)


# ---------------------------------------------------------------------------------------- messages


@dataclass
class LoadProgress(Message):
    ticket: LoadTicket
    progress: Progress


class JobOutcome(NamedTuple):
    """How a driver job run in a worker thread ended: its value, or one sentence, or cancelled."""

    value: object = None
    error: str | None = None
    cancelled: bool = False


def run_job(job: Callable[[], object]) -> JobOutcome:
    """Run job(); a ValueError keeps its own sentence, any other exception is named (shown in the status
    line, never a crash of the interface), Cancelled is cancelled."""
    try:
        return JobOutcome(job())
    except Cancelled:
        return JobOutcome(cancelled=True)
    except ValueError as exc:
        return JobOutcome(error=str(exc))
    except Exception as exc:  # noqa: BLE001
        return JobOutcome(error=f"{type(exc).__name__}: {exc}")


@dataclass
class LoadFinished(Message):
    ticket: LoadTicket
    loaded: Loaded | None = None
    error: str | None = None
    cancelled: bool = False


@dataclass
class StepFinished(Message):
    sim: object
    error: str | None = None


@dataclass
class WhatIfProgress(Message):
    job: WhatIfJob
    progress: Progress


@dataclass
class WhatIfFinished(Message):
    job: WhatIfJob
    result: object = None           # sim.whatif.WhatIf
    error: str | None = None
    cancelled: bool = False
    carried: object = None          # sim.recall_moment.StillCarried: a reset that left the answer, and who holds it


@dataclass
class RecallFinished(Message):
    sim: object
    index: int
    moment: object = None           # sim.recall_moment.RecallMoment, None when it failed
    error: str | None = None


@dataclass
class SaveFinished(Message):
    path: str
    step: int
    error: str | None = None


class _PromptExecutor(ThreadPoolExecutor):
    """The workers' thread pool. Its shutdown does not wait: quitting must not wait for a token in flight
    (the jobs stop at their next cancel check; tui.main gives them a moment, then exits anyway)."""

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait=False, cancel_futures=True)


# ---------------------------------------------------------------------------------------- the app


class TinyK3App(App):
    """The step-through simulator. `TinyK3App()` opens the default preset and prompt."""

    CSS_PATH = Path(__file__).with_name("tui.tcss")
    TITLE = "tiny-k3"
    COMMANDS = App.COMMANDS | {K3Commands}
    # In the footer's order: K3Footer shows the first ones that fit the width (80 columns: n to s), ? all.
    BINDINGS = [
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
    # modal screens: each is one action that pushes a screen from its own module (screens.py, whatif_menu.py,
    # whatif_screen.py)

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
                    or self._redraw_pending or self._pump_pending)

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield Static(id="timeline")
        yield Static(id="headline")
        yield Static(id="tabs")
        with Vertical(id="panels"):
            yield RoutingPanel(id="routing")
            with Horizontal(id="lower"):
                yield StatePanel(id="state")
                yield DepthPanel(id="depth")
                yield MemoryPanel(id="memory")
        yield Static(id="too-small")
        yield Static(id="progress")
        yield Static(id="message")
        yield Static(id="status")
        yield K3Footer()             # the keys that fit the width, in BINDINGS order

    def on_mount(self) -> None:
        asyncio.get_running_loop().set_default_executor(
            _PromptExecutor(max_workers=4, thread_name_prefix=WORKER_THREAD))
        self._main = self.screen
        q = self._main.query_one
        self._panels: dict[str, Panel] = {name: q(f"#{name}", Panel) for name in PANELS}
        self._timeline, self._headline, self._tabs = q("#timeline", Static), q("#headline", Static), q("#tabs", Static)
        self._status, self._message, self._progress = q("#status", Static), q("#message", Static), q("#progress", Static)
        self._too_small = q("#too-small", Static)
        self._timeline.border_title = "Tokens"
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
            self._too_small.update(
                f"Terminal too small\n\ntiny-k3 needs at least {MIN_WIDTH} x {MIN_HEIGHT} characters "
                f"({FULL_WIDTH} x {FULL_HEIGHT} shows all panels at once); this one is {w} x {h}.\n"
                "Enlarge the window or make the font smaller:\nthe simulator keeps its place and comes back "
                "when there is room.\n\nq quits.")
        for panel in self._panels.values():   # what is visible changed: redraw everything once laid out
            panel.invalidate()
        self.call_after_refresh(self._redraw)

    # ------------------------------------------------------------------ loading
    def load_session(self, preset: str | None = None, prompt: str | None = None, seed: int | None = None) -> None:
        """Load a new Simulation; the current one stays on screen until it is ready (or fails)."""
        base = self.driver.spec or self.spec
        spec = RunSpec(preset or base.preset, base.prompt if prompt is None else prompt,
                       base.seed if seed is None else seed, base.weights, base.device)
        self._start_load(spec)

    def _start_load(self, spec: RunSpec) -> None:
        if self._quitting:
            return
        self.running = False
        ticket = self.driver.begin_load(spec)
        self._set_message("")
        self._redraw()                      # the loading line shows at once, not at the next key
        self._load_worker(ticket)

    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def _load_worker(self, ticket: LoadTicket) -> None:
        out = run_job(lambda: self.driver.run_load(ticket, lambda p: self.post_message(LoadProgress(ticket, p))))
        self.post_message(LoadFinished(ticket, loaded=out.value, error=out.error, cancelled=out.cancelled))

    @on(LoadProgress)
    def _load_progress(self, msg: LoadProgress) -> None:
        if not self._quitting and self.driver.report(msg.ticket, msg.progress):
            self._draw_progress()

    @on(LoadFinished)
    def _load_finished(self, msg: LoadFinished) -> None:
        if self._quitting or msg.cancelled:
            return
        if msg.loaded is not None:
            previous = self.preset if self.sim is not None else None
            if not self.driver.finish_load(msg.ticket, msg.loaded):
                return
            self.session += 1
            self.config = self.sim.config
            self._crossed = False
            self._tokens_shown = self.driver.frames[self.step].position + 1
            self.sublayer_index = -1
            self.pin_recall = True
            self.expert = -1
            self.head = min(self.head, self.config.kda_heads - 1)
            if not 0 <= self.layer < self.config.num_layers or self.preset != previous:
                self.layer = self._start_layer()
            self._set_message("")
            self._redraw()
            self._pump()
        elif self.driver.fail_load(msg.ticket):
            kept = "kept the current session" if self.sim is not None else "nothing loaded: e for a prompt, p for a preset"
            self._set_message(Text.assemble(("Not loaded: ", "bold red"), f"{msg.error} ({kept})"))
            self._redraw()

    def action_cancel(self) -> None:
        """Escape: stop the what-if being computed, else the load in flight."""
        if self.driver.cancel_what_if():
            self._set_message("what-if cancelled; the timeline is as it was")
            self._draw_progress()
            self._draw_status()
        elif self.driver.cancel_load():
            kept = "the current session stays" if self.sim is not None else "nothing loaded: e for a prompt, p for a preset"
            self._set_message(f"load cancelled; {kept}")
            self._redraw()

    def _start_layer(self) -> int:
        cfg = self.config
        both = [i for i in cfg.kda_layers if i in cfg.moe_layers]
        return both[0] if both else 0

    # ------------------------------------------------------------------ stepping
    def _pump(self) -> None:
        """Start the next job the driver wants, one at a time: a what-if (asked for), the recall moment of the
        cursor's frame (on screen), then a step (look-ahead, or a goal past the computed frames)."""
        self._pump_pending = False
        d = self.driver
        if self._quitting:
            return
        if d.wants_what_if():
            self._what_if_worker(d.start_what_if())
        elif d.wants_recall():
            self._recall_worker(*d.start_recall())
        elif d.wants_step():
            self._step_worker(*d.start_step())

    def _pump_after_paint(self) -> None:
        """Compute ahead only once the new step is on screen (the worker holds the GIL in bursts)."""
        if not self._pump_pending:
            self._pump_pending = True
            self.call_after_refresh(self._pump)

    @work(thread=True, exclusive=True, group="step", exit_on_error=False)
    def _step_worker(self, sim, flag) -> None:
        out = run_job(lambda: self.driver.run_step(sim, flag))
        if not out.cancelled:
            self.post_message(StepFinished(sim, error=out.error))

    @on(StepFinished)
    def _step_finished(self, msg: StepFinished) -> None:
        if self._quitting:
            return
        moved = self.driver.finish_step(msg.sim, msg.error)
        if msg.error is not None and msg.sim is self.sim:
            self.running = False
            self._set_message(Text.assemble(("Cannot step further: ", "bold red"), msg.error))
        if moved:
            self._step_changed()
        else:
            self._draw_status()
            self._pump()

    # ------------------------------------------------------------------ the recall moment
    @work(thread=True, exclusive=True, group="recall", exit_on_error=False)
    def _recall_worker(self, sim, index: int) -> None:
        try:
            moment = self.driver.run_recall(sim, index)
        except Exception as exc:  # noqa: BLE001 - the panels then show no recall line, never a crash
            self.post_message(RecallFinished(sim, index, error=f"{type(exc).__name__}: {exc}"))
        else:
            self.post_message(RecallFinished(sim, index, moment))

    @on(RecallFinished)
    def _recall_finished(self, msg: RecallFinished) -> None:
        if self._quitting:
            return
        if self.driver.finish_recall(msg.sim, msg.index, msg.moment):
            if msg.error:
                self._set_message(Text.assemble(("No recall moment: ", "bold red"), msg.error))
            self._redraw()
        self._pump()

    # ------------------------------------------------------------------ what-if
    def _focused_panel(self) -> str:
        return self.focused.id if self.focused is not None and self.focused.id in PANELS else self.shown_panel

    def action_what_if(self) -> None:
        """x: the what-if menu for the focused panel at this step, layer and head."""
        if self._quitting or self.sim is None:
            return
        panel, view = self._focused_panel(), self.view()
        items = menu_for(panel, view)
        steps = max(1, min(WHAT_IF_STEPS, self.config.max_seq_len - self.step))
        layer, head = self._panel_place(panel)
        title = (f"[b]What if[/b] … at step {self.step}, input {quoted(view.frame.input_text)} ({panel} panel, "
                 f"layer {layer}, head {head})")
        self.running = False
        self.push_screen(WhatIfMenu(title, items, "" if items else unavailable(panel, view), steps),
                         lambda changes: None if changes is None else self.start_what_if(changes, panel))

    def _panel_place(self, panel: str) -> tuple[int, int]:
        """(layer, head) a panel shows now; the state panel's may be the pinned reading head."""
        view = self.view()
        if panel == "state" and view is not None and view.kda_layer is not None:
            return view.kda_layer, view.kda_head
        return self.layer, self.head

    def start_what_if(self, changes: tuple, panel: str | None = None) -> None:
        """Compute Simulation.what_if(*changes) at the cursor's frame in a worker; the result opens WhatIfScreen."""
        if self._quitting or self.sim is None:
            return
        try:
            job = self.driver.request_what_if(changes)
        except ValueError as exc:
            self._set_message(Text.assemble(("What-if not run: ", "bold red"), str(exc)))
            return
        panel = panel or self._focused_panel()
        self._whatif_for = (job, panel, *self._panel_place(panel))
        self.running = False
        self._set_message("")
        self._draw_progress()
        self._draw_status()
        self._pump()

    @work(thread=True, exclusive=True, group="whatif", exit_on_error=False)
    def _what_if_worker(self, job: WhatIfJob) -> None:
        out = run_job(lambda: self.driver.run_what_if(job, lambda p: self.post_message(WhatIfProgress(job, p))))
        carried = None
        if out.value is not None:
            carried = run_job(lambda: self.driver.run_still_carried(job, out.value)).value
        self.post_message(WhatIfFinished(job, result=out.value, error=out.error, cancelled=out.cancelled,
                                         carried=carried))

    @on(WhatIfProgress)
    def _what_if_progress(self, msg: WhatIfProgress) -> None:
        if not self._quitting and self.driver.report_what_if(msg.job, msg.progress):
            self._draw_progress()

    @on(WhatIfFinished)
    def _what_if_finished(self, msg: WhatIfFinished) -> None:
        if self._quitting:
            return
        if self.driver.finish_what_if(msg.job):
            if msg.result is not None and self._whatif_for is not None and self._whatif_for[0] is msg.job:
                _, panel, layer, head = self._whatif_for
                self.push_screen(WhatIfScreen(msg.result, msg.job.sim, panel, layer, head, msg.carried))
            else:
                self._set_message(Text.assemble(("What-if not run: ", "bold red"), msg.error or "it was cancelled"))
        self._draw_progress()
        self._draw_status()
        self._pump()

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """tab / shift+tab are priority keys (panels are focusable): on a modal screen they are not ours."""
        if action == "cycle_panel" and self._main is not None and self.screen is not self._main:
            return False
        return True

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
            self._set_message("already at the first token")

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

    # ------------------------------------------------------------------ layers, heads, sublayers
    def action_step_in(self) -> None:
        if self.sim is None or self._quitting:
            return
        if self.sublayer_index < 0:
            self.sublayer_index = next((s.index for s in self._sublayer_views() if s.layer == self.layer), 0)
        self.action_show_panel("depth")

    def action_step_out(self) -> None:
        self.sublayer_index = -1

    def _unpin(self) -> None:
        """The learner picks a layer or head: the state panel follows the selection again."""
        if self.pin_recall:
            self.pin_recall = False
            self._redraw()

    def action_layer(self, delta: int) -> None:
        if self.sim is None or self._quitting:
            return
        self._unpin()
        if self.sublayer_index >= 0:
            subs = self._sublayer_views()
            target = self.sublayer_index + delta
            if not 0 <= target < len(subs):
                self._set_message("already at the " + ("embedding" if target < 0 else "head") +
                                  ", the first sublayer" * (target < 0) + ", the last sublayer" * (target > 0))
                return
            self.sublayer_index = target
            layer = subs[target].layer
            if 0 <= layer < self.config.num_layers:
                self.layer = layer
            return
        target = self.layer + delta
        if not 0 <= target < self.config.num_layers:
            edge = "first layer (0); j goes deeper" if target < 0 else \
                f"last layer ({self.config.num_layers - 1}); k goes back"
            self._set_message(f"already at the {edge}")
            return
        self.layer = target

    def select_layer(self, layer: int) -> None:
        self._unpin()
        self.layer = max(0, min(self.config.num_layers - 1, layer))
        if self.sublayer_index >= 0 and self.sim is not None:
            self.sublayer_index = next((s.index for s in self._sublayer_views() if s.layer == self.layer), 0)

    def action_head(self, delta: int) -> None:
        self._unpin()
        self.head = (self.head + delta) % max(self.config.kda_heads, 1)

    def select_head(self, head: int) -> None:
        self._unpin()
        self.head = max(0, min(self.config.kda_heads - 1, head))

    def select_expert(self, expert: int) -> None:
        self.expert = expert if 0 <= expert < self.config.num_experts else -1
        if self.expert >= 0 and self.layer not in self.config.moe_layers and self.config.moe_layers:
            self.layer = self.config.moe_layers[0]

    def action_compare(self) -> None:
        self.compare = not self.compare

    def watch_layer(self) -> None:
        self._redraw()

    def watch_head(self) -> None:
        self._redraw()

    def watch_sublayer_index(self, index: int) -> None:
        self._main.set_class(index >= 0, "-inside")
        self._redraw()

    def watch_expert(self) -> None:
        self._redraw()

    def watch_compare(self) -> None:
        self._redraw()

    # ------------------------------------------------------------------ panels, zoom
    def action_show_panel(self, name: str) -> None:
        if self._quitting:
            return
        self.shown_panel = name
        self._apply_layout(self.size)
        self._panels[name].focus()

    def action_cycle_panel(self, delta: int) -> None:
        i = PANELS.index(self.shown_panel if self.focused is None or self.focused.id not in PANELS
                         else self.focused.id)
        self.action_show_panel(PANELS[(i + delta) % len(PANELS)])

    def action_zoom(self) -> None:
        if self._quitting:
            return
        if not self.zoomed and self.focused is not None and self.focused.id in PANELS:
            self.shown_panel = self.focused.id
        self.zoomed = not self.zoomed
        self._apply_layout(self.size)

    # ------------------------------------------------------------------ modal screens
    def action_command_palette(self) -> None:
        """ctrl+p: the palette (K3Palette: it closes once, whatever keys are queued behind the Enter). Only
        over the main screen: its commands act on the timeline, not on a dialog or a what-if result."""
        if self.use_command_palette and not self._quitting and self.screen is self._main:
            self.push_screen(K3Palette(id="--command-palette"))

    def action_help(self) -> None:
        if not self._quitting:
            self.push_screen(HelpScreen())

    def action_edit_prompt(self) -> None:
        if self._quitting:
            return

        def done(prompt: str | None) -> None:
            if prompt is not None:
                self.load_session(prompt=prompt)

        self.running = False
        self.push_screen(PromptScreen(self.prompt, self.config.max_seq_len), done)

    def action_preset(self) -> None:
        if self._quitting:
            return

        def done(name: str | None) -> None:
            if name is not None and name == self.preset and self.sim is not None:
                self._set_message(f"already on {name}")
            elif name is not None:
                self.load_session(preset=name)

        self.running = False
        self.push_screen(PresetScreen(self.preset), done)

    # ------------------------------------------------------------------ saving, quitting
    def action_save(self) -> None:
        if self._quitting or self.sim is None:
            return
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = self.save_dir / f"tiny-k3-{self.preset.replace('/', '_')}-{stamp}.npz"
        self._set_message(f"saving to {path} …")
        self._save_worker(self.sim, path, self.step)

    @work(thread=True, exclusive=True, group="save", exit_on_error=False)
    def _save_worker(self, sim, path: Path, step: int) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            sim.save(path, cursor=step)
        except (OSError, ValueError) as exc:
            self.post_message(SaveFinished(str(path), step, error=f"{type(exc).__name__}: {exc}"))
        else:
            self.post_message(SaveFinished(str(path), step))

    @on(SaveFinished)
    def _save_finished(self, msg: SaveFinished) -> None:
        if self._quitting:
            return
        if msg.error:
            self._set_message(Text.assemble(("Not saved: ", "bold red"), msg.error))
        else:
            self._set_message(save_note(Path(msg.path), msg.step))

    async def action_quit(self) -> None:
        """Quit now, whatever is running: jobs stop at their next cancel check (between two tokens)."""
        self._quitting = True
        self.running = False
        self.driver.cancel_all()
        self.exit()

    # ------------------------------------------------------------------ drawing
    def _sublayer_views(self) -> tuple:
        """The current token's sublayers (Simulation.step_into reads only the Frame), cached per step."""
        key = (self.session, self.step)
        if self._sublayers_key != key:
            self._sublayers_key, self._sublayers = key, tuple(self.sim.step_into(self.step))
        return self._sublayers

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
            frames = self.sim.frames
            self._timeline.update(timeline_text(frames, self.sim.prompt_len, view.step, self.driver.visited,
                                                max(self.size.width - 4, 20)), layout=False)
            f = view.frame
            label = self.sim.tokenizer.token_text          # a real run's labels are its BPE's (sim.real)
            tops = "  ".join(f"{quoted(label(i))} {p:.3f}" for i, p in zip(f.top_ids.tolist(), f.top_probs.tolist()))
            prompt = " (prompt)" if view.step < self.sim.prompt_len - 1 else ""
            self._timeline.border_subtitle = (f"step {view.step} · position {f.position} · input "
                                              f"{quoted(f.input_text)} → {quoted(f.token_text)}{prompt} · next: {tops}")
            self._headline.update(routing_headline(view), layout=False)
        self._tabs.update(Text.from_markup("  ".join(
            (f"[reverse b] {i + 1} {name.title()} [/]" if name == self.shown_panel else
             f"[@click=app.show_panel('{name}')] {i + 1} {name.title()} [/]") for i, name in enumerate(PANELS))
            + "   [dim]tab / 1-4 switch · z zoom[/]"), layout=False)
        self._draw_status()
        self._draw_progress()

    def _draw_status(self) -> None:
        if self._quitting or not self.is_mounted:
            return
        d = self.driver
        parts = [f"[b]{self.preset}[/]"]
        if d.sim is not None:
            f = d.frames[self.step]
            parts.append(f"step {self.step}/{d.visited}")
            mlp = "MoE" if self.layer in self.config.moe_layers else "dense"
            parts.append(f"layer {self.layer} ({self.config.layer_kinds[self.layer].upper()} · {mlp})")
            parts.append(f"head {self.head}")
            ms = f"{f.step_ms:.1f} ms/step" if self.show_timings else "-- ms/step"
            if self.compare:
                ms += f" (twin {f.twin_step_ms:.1f})" if self.show_timings else " (twin --)"
            parts.append(ms)
            parts.append(d.weights)
            parts.append(f"device {d.sim.device}")
        if self.running:
            parts.append("[b green]▶ running[/]")
        if self.compare:
            parts.append("[b cyan]compare: hybrid vs twin[/]")
        if d.loading is not None:
            parts.append(f"[b yellow]loading {d.loading.spec.preset} …[/]")
        if d.whatif is not None:
            parts.append("[b magenta]what-if …[/]")
        self._status.update(Text.from_markup(" │ ".join(parts)), layout=False)

    def _draw_progress(self) -> None:
        if self._quitting:
            return
        ticket, p = self.driver.loading, self.driver.progress
        self._progress.display = ticket is not None or self.driver.whatif is not None
        if ticket is None:
            if self.driver.whatif is not None:
                self._progress.update(self._what_if_line())
            return
        what = f"loading {ticket.spec.open_path or ticket.spec.preset} ({ticket.spec.expected_weights()})"
        if p is None:
            line = Text(f"{what}: building the model … · Esc cancels", style="bold yellow")
        else:
            rate = p.tokens_per_s
            left = f" · about {(p.total - p.done) / rate:.0f} s left" if rate > 0 and p.done < p.total else ""
            line = Text.assemble((f"{what}: ", "bold yellow"), f"{p.done:,}/{plural(p.total, 'token')} ",
                                 (render.bar(p.done / max(p.total, 1), 20), "yellow"),
                                 f" {p.done / max(p.total, 1):.0%} · {rate:.1f} tokens/s{left} · Esc cancels")
        self._progress.update(line)

    def _what_if_line(self) -> Text:
        job, p = self.driver.whatif, self.driver.whatif_progress
        what = ", ".join(describe(c) for c in job.changes) or "nothing"
        done = 0 if p is None else p.done
        return Text.assemble((f"what-if ({what}) at step {job.step}: ", "bold magenta"),
                             f"token {done}/{job.steps} ", (render.bar(done / job.steps, 20), "magenta"),
                             " · Esc cancels; the timeline is untouched")

    def _set_message(self, text: str | Text) -> None:
        if self._quitting:
            return
        self.message = text
        self._message.update(text)
        self._message.display = bool(text)
        if self.sim is None:
            self._redraw()
