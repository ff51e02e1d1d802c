"""tiny-k3's main job: step through generation and watch MoE routing, the KDA state, the cache and AttnRes.

    python tui.py [--preset small] [--prompt "key=7; 3+4="] [--seed 0] [--device cpu]

Layout: the token timeline on top, the routing panel, then the recurrent state, depth and memory panels
side by side, a status bar and the keys.
The Simulation runs in a worker thread, one job at a time (it is not thread-safe), and hands finished
Frames to the UI thread; the UI keeps only scalars reactive (step, layer, head) and reads arrays from
Frames. To keep `n` instant it computes a couple of tokens ahead while the learner reads.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

from rich.text import Text
from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Provider
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from tiny_k3.config import COUNTED_ONLY, DEFAULT_PRESET, DEFAULT_PROMPT, K3Config
from tiny_k3.model import resolve_device
from tui_widgets import DepthPanel, MemoryPanel, RoutingPanel, StatePanel, Timeline, View, timeline_text

MIN_WIDTH, MIN_HEIGHT = 120, 36   # below this the four panels cannot show the 896-expert grid
LOOKAHEAD = 2                     # tokens computed ahead of the cursor, so `n` needs no compute
RUN_INTERVAL = 0.08               # seconds between steps while running (the display rate)
PANELS = ("routing", "state", "depth", "memory")


class SimReady(Message):
    def __init__(self, sim, timeline: Timeline, spec: dict, generation: int):
        super().__init__()
        self.sim, self.timeline, self.spec, self.generation = sim, timeline, spec, generation


class FrameReady(Message):
    def __init__(self, sim, frame):
        super().__init__()
        self.sim, self.frame = sim, frame


class SimFailed(Message):
    """A job raised: `sim` is None when building a session failed, else the session that could not step."""

    def __init__(self, text: str, generation: int, sim=None):
        super().__init__()
        self.text, self.generation, self.sim = text, generation, sim


# ---------------------------------------------------------------------------------------- modals


class PromptScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, prompt: str, max_len: int):
        super().__init__()
        self.prompt, self.max_len = prompt, max_len

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt-box", classes="dialog"):
            yield Label(f"Prompt (UTF-8 bytes are tokens; this preset allows {self.max_len} tokens in all). "
                        "Enter runs it, Escape cancels.")
            yield Input(value=self.prompt, id="prompt-input", select_on_focus=False)

    def on_mount(self) -> None:
        self.query_one(Input).cursor_blink = False

    @on(Input.Submitted)
    def submit(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class PresetScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, current: str):
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        options = []
        for name in K3Config.runnable_presets():
            c = K3Config.preset(name)
            options.append(Option(f"{name:<12} {c.num_layers:>3} layers, {c.top_k} of {c.num_experts} experts, "
                                  f"d={c.hidden_size}", id=name))
        with Vertical(id="preset-box", classes="dialog"):
            yield Label("Switch preset (k3 itself is only counted, never run). Enter picks, Escape cancels.")
            yield OptionList(*options, id="preset-list")

    def on_mount(self) -> None:
        ol = self.query_one(OptionList)
        ol.highlighted = ol.get_option_index(self.current) if self.current not in COUNTED_ONLY else 0

    @on(OptionList.OptionSelected)
    def pick(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)


HELP = """\
[b]tiny-k3[/b]: a Kimi K3-style model, one token and one layer at a time.

[b]Keys[/b]
  n / →      next token (computed ahead, so it is instant)     b / ←   back one token
  r          run / pause                                       i / o   step into / out of the token's layers
  j / k      next / previous layer (inside a token: sublayer)  h / H   next / previous KDA head
  tab, 1-4   focus a panel                                     z       maximise / restore the focused panel
  e          edit the prompt                                   p       switch preset
  c          compare mode (hybrid vs the all-softmax twin)     ctrl+p  command palette (go to layer/expert/step)
  ?          this help                                         q       quit

[b]Panels[/b]
  Routing    all E experts of the selected MoE layer; the k chosen are lit, the rest shaded by score.
             Only k of E experts run per token: total parameters set the memory bill, active ones the compute.
  State      a KDA head's K x V memory S after this token, its per-channel decay alpha and write strength beta,
             and the delta-rule correction this token wrote. Its size never grows.
  Memory     measured cache bytes of this hybrid vs the same model with every layer softmax (MLA),
             and the projection to the real K3 at this context and at 1M tokens.
  Depth      Attention Residuals: each sublayer reads a softmax mix of the earlier blocks, not a fixed sum.

Escape or ? closes this help."""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "close", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box", classes="dialog"):
            yield Static(HELP, id="help-text")

    def action_close(self) -> None:
        self.dismiss(None)


# ---------------------------------------------------------------------------------------- palette


class K3Commands(Provider):
    """Command palette: go to layer / expert / step, head, preset, and the toggles."""

    def _commands(self, query: str):
        app: TinyK3App = self.app  # type: ignore[assignment]
        cfg = app.config
        numbers = [int(tok) for tok in query.replace("/", " ").split() if tok.isdigit()]
        for n in numbers:
            if n < cfg.num_layers:
                yield f"Go to layer {n}", f"{cfg.layer_kinds[n].upper()} layer", partial(app.select_layer, n)
            if n < cfg.num_experts:
                yield f"Go to expert {n}", "highlight this expert in the routing panel", partial(app.select_expert, n)
            if app.timeline is not None and n < len(app.timeline):
                yield f"Go to step {n}", "move the cursor to this token", partial(app.goto_step, n)
            if n < cfg.kda_heads:
                yield f"Head {n}", "show this KDA head", partial(app.select_head, n)
        for layer in range(cfg.num_layers):
            yield f"Go to layer {layer}", f"{cfg.layer_kinds[layer].upper()} layer", partial(app.select_layer, layer)
        for name in K3Config.runnable_presets():
            yield f"Preset {name}", "restart on this preset", partial(app.load_session, preset=name)
        yield "Toggle compare mode", "hybrid vs the all-softmax twin", app.action_compare
        yield "Run / pause", "generate continuously", app.action_run
        yield "Edit prompt", "type a new prompt", app.action_edit_prompt
        yield "Clear expert", "stop highlighting an expert", partial(app.select_expert, -1)

    async def discover(self):
        for title, help_text, callback in self._commands(""):
            if not title.startswith("Go to layer") or title.endswith(" 0"):
                yield DiscoveryHit(title, callback, help=help_text)

    async def search(self, query: str):
        matcher = self.matcher(query)
        for title, help_text, callback in self._commands(query):
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), callback, help=help_text)


# ---------------------------------------------------------------------------------------- app


class TinyK3App(App):
    """The step-through simulator. `TinyK3App()` opens the default preset and prompt."""

    CSS_PATH = Path(__file__).with_name("tui.tcss")
    TITLE = "tiny-k3"
    COMMANDS = App.COMMANDS | {K3Commands}
    BINDINGS = [
        Binding("n", "next", "next"),
        Binding("right", "next", "next", show=False),
        Binding("b", "back", "back"),
        Binding("left", "back", "back", show=False),
        Binding("r", "run", "run/pause"),
        Binding("i", "step_in", "step in"),
        Binding("o", "step_out", "step out"),
        Binding("j", "layer(1)", "layer+"),
        Binding("k", "layer(-1)", "layer-"),
        Binding("h", "head(1)", "head"),
        Binding("H", "head(-1)", "head-", show=False),
        Binding("e", "edit_prompt", "prompt"),
        Binding("p", "preset", "preset"),
        Binding("c", "compare", "compare"),
        Binding("z", "zoom", "zoom"),
        Binding("question_mark", "help", "help"),
        Binding("q", "quit", "quit"),
        *(Binding(str(i + 1), f"focus_panel('{name}')", name, show=False) for i, name in enumerate(PANELS)),
    ]

    step: reactive[int] = reactive(0, init=False, repaint=False)
    layer: reactive[int] = reactive(1, init=False, repaint=False)
    head: reactive[int] = reactive(0, init=False, repaint=False)
    sub: reactive[int] = reactive(-1, init=False, repaint=False)        # sublayer stepped into; -1 = token level
    expert: reactive[int] = reactive(-1, init=False, repaint=False)
    compare: reactive[bool] = reactive(False, init=False, repaint=False)
    running: reactive[bool] = reactive(False, init=False, repaint=False)

    def __init__(self, preset: str | None = None, prompt: str | None = None, seed: int = 0,
                 device: str | None = None, *, weights: str = "auto", show_timings: bool = True,
                 lookahead: int = LOOKAHEAD):
        super().__init__()
        self.weights = weights              # "auto": the shipped trained weights where a preset has them
        self.preset = preset or DEFAULT_PRESET
        self.prompt = DEFAULT_PROMPT if prompt is None else prompt
        self.seed, self.device_name = seed, device
        self.show_timings, self.lookahead = show_timings, lookahead
        try:
            self.config = K3Config.preset(self.preset)
        except ValueError:
            self.config = K3Config.preset(DEFAULT_PRESET)
        self.sim = None                     # steps only inside worker jobs; the UI reads its Frames
        self.timeline: Timeline | None = None
        self.visited = 0                    # furthest step the learner has seen
        self.goal = 0                       # step the learner asked for (n pressed while computing)
        self.message = ""                   # one line above the status bar: errors and notices
        self._loading: str | None = None    # preset being loaded
        self._generation = 0                # bumps with every new session; stale results are dropped
        self._busy = False
        self._pending: dict | None = None   # a session waiting to be built
        self._at_end = False                # the sim cannot grow (max_seq_len reached or a step failed)
        self._redraw_pending = False
        self.drawn: tuple | None = None     # (step, layer, head, sub) handed to the panels last
        self._pump_scheduled = False
        self._subs_key, self._subs = None, ()

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        with Vertical(id="main"):
            yield Static(id="timeline")
            yield RoutingPanel(id="routing")
            with Horizontal(id="lower"):
                yield StatePanel(id="state")
                yield DepthPanel(id="depth")
                yield MemoryPanel(id="memory")
            yield Static(id="message")
            yield Static(id="status")
        yield Static(id="too-small")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#timeline").border_title = "Tokens"
        self._ticker = self.set_interval(RUN_INTERVAL, self._tick, pause=True)
        self._check_size()
        self.query_one("#routing").focus()
        self.load_session(self.preset, self.prompt, self.seed)
        self._redraw()

    def on_resize(self, event) -> None:
        self._check_size(event.size)

    def _check_size(self, size=None) -> None:
        w, h = size or self.size
        small = w < MIN_WIDTH or h < MIN_HEIGHT
        self.screen.set_class(small, "-too-small")
        if small:
            self.query_one("#too-small", Static).update(
                f"Terminal too small\n\ntiny-k3 needs at least {MIN_WIDTH} x {MIN_HEIGHT} characters; "
                f"this one is {w} x {h}.\nEnlarge the window or make the font smaller:\n"
                "the simulator keeps its place and comes back when there is room.\n\nq quits.")

    # ------------------------------------------------------------------ sessions and workers
    def load_session(self, preset: str | None = None, prompt: str | None = None, seed: int | None = None) -> None:
        """Ask for a new Simulation; the current one stays on screen until it is ready (or fails)."""
        self._pending = {"preset": preset or self.preset, "prompt": self.prompt if prompt is None else prompt,
                         "seed": self.seed if seed is None else seed}
        self._generation += 1
        self.running = False
        self._loading = self._pending["preset"]
        self._pump()

    def _pump(self) -> None:
        """Start the next job if none is running: a pending session first, else a look-ahead step."""
        self._pump_scheduled = False
        if self._busy:
            return
        if self._pending is not None:
            spec, self._pending = self._pending, None
            self._busy = True
            self.run_worker(partial(self._build_job, spec, self._generation), thread=True, group="sim",
                            exit_on_error=False)
            return
        tl = self.timeline
        if self.sim is None or tl is None or self._at_end:
            return
        want = max(self.goal, self.visited + self.lookahead)
        if len(tl) - 1 < want:
            self._busy = True
            self.run_worker(partial(self._step_job, self.sim), thread=True, group="sim", exit_on_error=False)

    def _build_job(self, spec: dict, generation: int) -> None:
        from sim import Simulation

        try:
            sim = Simulation(spec["preset"], spec["prompt"], seed=spec["seed"], device=self.device_name,
                             weights=self.weights)
            timeline = Timeline(sim.config, sim.prompt_len)
            for frame in sim.frames:
                timeline.append(frame)
            self.post_message(SimReady(sim, timeline, spec, generation))
        except ValueError as exc:
            self.post_message(SimFailed(str(exc), generation))
        except Exception as exc:  # noqa: BLE001 - shown, never a crash of the interface
            self.post_message(SimFailed(f"{type(exc).__name__}: {exc}", generation))

    def _step_job(self, sim) -> None:
        try:
            self.post_message(FrameReady(sim, sim.step()))
        except ValueError as exc:
            self.post_message(SimFailed(str(exc), -1, sim))
        except Exception as exc:  # noqa: BLE001
            self.post_message(SimFailed(f"{type(exc).__name__}: {exc}", -1, sim))

    @on(SimReady)
    def _sim_ready(self, msg: SimReady) -> None:
        self._busy = False
        if msg.generation == self._generation:
            previous = self.preset if self.sim is not None else None
            spec = msg.spec
            self.sim, self.timeline = msg.sim, msg.timeline
            self.preset, self.prompt, self.seed = spec["preset"], spec["prompt"], spec["seed"]
            self.config = msg.sim.config
            self._at_end = False
            start = len(msg.timeline) - 1
            self.visited = self.goal = start
            self.sub = -1
            self.expert = -1
            self.head = min(self.head, self.config.kda_heads - 1)
            if not 0 <= self.layer < self.config.num_layers or spec["preset"] != previous:
                self.layer = self._start_layer()
            self.step = start
            self._loading = None
            self._set_message("")
            self._redraw()
        self._pump()

    @on(FrameReady)
    def _frame_ready(self, msg: FrameReady) -> None:
        self._busy = False
        if msg.sim is self.sim and self.timeline is not None:
            self.timeline.append(msg.frame)
            if self.goal > self.step:
                self.step = min(self.goal, len(self.timeline) - 1)
            self._redraw_status()
        self._pump()

    @on(SimFailed)
    def _sim_failed(self, msg: SimFailed) -> None:
        self._busy = False
        if msg.sim is None and msg.generation == self._generation:
            self._loading = None
            kept = "kept the current session" if self.sim is not None else "nothing loaded"
            self._set_message(Text.assemble(("Not loaded: ", "bold red"), f"{msg.text} ({kept})"))
        elif msg.sim is not None and msg.sim is self.sim:
            self._at_end = True
            self.goal = min(self.goal, len(self.timeline) - 1) if self.timeline else 0
            self.running = False
            self._set_message(Text.assemble(("Cannot step further: ", "bold red"), msg.text))
        self._pump()

    def _start_layer(self) -> int:
        cfg = self.config
        both = [i for i in cfg.kda_layers if i in cfg.moe_layers]
        return both[0] if both else 0

    # ------------------------------------------------------------------ actions
    @property
    def idle(self) -> bool:
        """No job running or waiting and nothing left to draw (tests and the benchmark wait for this)."""
        return not (self._busy or self._pending is not None or self._redraw_pending or self._pump_scheduled)

    def _has_frames(self) -> bool:
        return self.timeline is not None and len(self.timeline) > 0

    def action_next(self) -> None:
        if not self._has_frames():
            return
        self.goal = max(self.goal, self.step) + 1
        if self.step + 1 < len(self.timeline):
            self.step = min(self.goal, len(self.timeline) - 1)
        elif self._at_end:
            self.goal = self.step
            self.bell()
        else:
            self._set_message("computing the next token …")
        self._pump()

    def action_back(self) -> None:
        if not self._has_frames():
            return
        if self.step == 0:
            self._set_message("already at the first token")
            return
        self.goal = self.step - 1
        self.step -= 1

    def goto_step(self, i: int) -> None:
        if self._has_frames() and 0 <= i < len(self.timeline):
            self.goal = i
            self.step = i

    def action_run(self) -> None:
        if self._has_frames():
            self.running = not self.running

    def watch_running(self, running: bool) -> None:
        if running:
            self._ticker.resume()
        else:
            self._ticker.pause()
        self._redraw_status()

    def _tick(self) -> None:
        if not self.running or not self._has_frames():
            return
        if self.step + 1 < len(self.timeline):
            self.step += 1
            self.goal = self.step
        elif self._at_end:
            self.running = False
        self._pump()

    def action_step_in(self) -> None:
        if not self._has_frames():
            return
        if self.sub < 0:
            self.sub = self._sub_for_layer(self.layer)
        self.query_one("#depth").focus()

    def action_step_out(self) -> None:
        self.sub = -1

    def _sub_for_layer(self, layer: int) -> int:
        subs = self._sublayers()
        return next((s.index for s in subs if s.layer == layer), 0)

    def action_layer(self, delta: int) -> None:
        if not self._has_frames():
            return
        if self.sub >= 0:
            subs = self._sublayers()
            self.sub = max(0, min(len(subs) - 1, self.sub + delta))
            s = subs[self.sub]
            if 0 <= s.layer < self.config.num_layers:
                self.layer = s.layer
        else:
            self.layer = (self.layer + delta) % self.config.num_layers

    def select_layer(self, layer: int) -> None:
        self.layer = max(0, min(self.config.num_layers - 1, layer))
        if self.sub >= 0 and self._has_frames():
            self.sub = self._sub_for_layer(self.layer)

    def action_head(self, delta: int) -> None:
        self.head = (self.head + delta) % max(self.config.kda_heads, 1)

    def select_head(self, head: int) -> None:
        self.head = max(0, min(self.config.kda_heads - 1, head))

    def select_expert(self, expert: int) -> None:
        self.expert = expert if 0 <= expert < self.config.num_experts else -1
        if self.expert >= 0 and self.layer not in self.config.moe_layers and self.config.moe_layers:
            self.layer = self.config.moe_layers[0]

    def action_compare(self) -> None:
        self.compare = not self.compare

    def action_focus_panel(self, name: str) -> None:
        self.query_one(f"#{name}").focus()

    def action_zoom(self) -> None:
        if self.screen.maximized is not None:
            self.screen.minimize()
        elif self.focused is not None:
            panel = self.focused if self.focused.id in PANELS else self.query_one("#routing")
            self.screen.maximize(panel)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_edit_prompt(self) -> None:
        def done(prompt: str | None) -> None:
            if prompt is not None:
                self.load_session(prompt=prompt)

        self.running = False
        self.push_screen(PromptScreen(self.prompt, self.config.max_seq_len), done)

    def action_preset(self) -> None:
        def done(name: str | None) -> None:
            if name is not None:
                self.load_session(preset=name)

        self.running = False
        self.push_screen(PresetScreen(self.preset), done)

    # ------------------------------------------------------------------ drawing
    def watch_step(self, step: int) -> None:
        self.visited = max(self.visited, step)
        if self.sub >= 0 and self._has_frames():
            self.sub = min(self.sub, len(self._sublayers()) - 1)
        if self.message:
            self._set_message("")
        self._redraw()
        if not self._pump_scheduled:          # compute ahead only once the new step is on screen
            self._pump_scheduled = True
            self.call_after_refresh(self._pump)

    def watch_layer(self) -> None:
        self._redraw()

    def watch_head(self) -> None:
        self._redraw()

    def watch_sub(self, sub: int) -> None:
        self.screen.set_class(sub >= 0, "-inside")
        self._redraw()

    def watch_expert(self) -> None:
        self._redraw()

    def watch_compare(self) -> None:
        self._redraw()

    def _sublayers(self) -> tuple:
        """The current token's sublayers (Simulation.step_into reads only the Frame), cached per step."""
        key = (self.timeline.serial, self.step)
        if self._subs_key != key:
            self._subs_key, self._subs = key, tuple(self.sim.step_into(self.step))
        return self._subs

    def view(self) -> View | None:
        if not self._has_frames():
            return None
        sub, subs = None, ()
        if self.sub >= 0:
            subs = self._sublayers()
            sub = subs[min(self.sub, len(subs) - 1)]
        return View(self.config, self.timeline, min(self.step, len(self.timeline) - 1), self.layer,
                    min(self.head, self.config.kda_heads - 1), sub, self.compare, self.expert, subs)

    def _redraw(self) -> None:
        """Redraw once after the current batch of changes (several reactives often change together)."""
        if not self._redraw_pending:
            self._redraw_pending = True
            self.call_later(self._draw)

    def _draw(self) -> None:
        self._redraw_pending = False
        view = self.view()
        self.drawn = None if view is None else (view.step, view.layer, view.head, self.sub)  # what is on screen
        waiting = str(self.message) or f"loading {self._loading or self.preset} …"
        for name in PANELS:
            self.query_one(f"#{name}").show(view, waiting)
        timeline = self.query_one("#timeline", Static)
        if view is not None:
            timeline.update(timeline_text(self.timeline, view.step, self.visited, max(self.size.width - 4, 20)),
                            layout=False)
            f = view.frame
            tops = "  ".join(f"{_tok(i)} {p:.3f}" for i, p in zip(f.top_ids.tolist(), f.top_probs.tolist()))
            prompt = " (prompt)" if view.step < self.timeline.prompt_len - 1 else ""
            timeline.border_subtitle = (f"step {view.step} · position {f.position} · input {_tok(f.input_id)} → "
                                        f"{_tok(f.token_id)}{prompt} · next: {tops}")
        self._redraw_status()

    def _redraw_status(self) -> None:
        if not self.is_mounted:
            return
        parts = [f"[b]{self.preset}[/]"]
        if self._has_frames():
            f = self.timeline.frames[min(self.step, len(self.timeline) - 1)]
            parts.append(f"step {self.step}/{self.visited}")
            mlp = "MoE" if self.layer in self.config.moe_layers else "dense"
            parts.append(f"layer {self.layer} ({self.config.layer_kinds[self.layer].upper()} · {mlp})")
            parts.append(f"head {self.head}")
            ms = f"{f.step_ms:.1f} ms/step" if self.show_timings else "-- ms/step"
            if self.compare:
                ms += f" (twin {f.twin_step_ms:.1f})" if self.show_timings else " (twin --)"
            parts.append(ms)
        parts.append(f"device {self._device_label()}")
        parts.append(self._weights_label())
        if self.running:
            parts.append("[b green]▶ running[/]")
        if self.compare:
            parts.append("[b cyan]compare: hybrid vs twin[/]")
        if self._loading:
            parts.append(f"[b yellow]loading {self._loading} …[/]")
        self.query_one("#status", Static).update(" │ ".join(parts), layout=False)

    def _set_message(self, text: str | Text) -> None:
        self.message = text
        line = self.query_one("#message", Static)
        line.update(text)
        line.display = bool(text)
        if self.timeline is None:
            self._redraw()

    def _device_label(self) -> str:
        sim = self.sim
        return str(getattr(sim, "device", None) or self.device_name or "cpu")

    def _weights_label(self) -> str:
        source = getattr(self.sim, "weights", None)
        return "trained weights" if source == "trained" else f"random init, seed {self.seed}"


def _tok(i: int) -> str:
    from tiny_k3.tokenizer import token_text

    return repr(token_text(i))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tiny-k3", description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default=DEFAULT_PRESET,
                        help=f"one of: {', '.join(K3Config.runnable_presets())}")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="cpu (default) or cuda; also $TINY_K3_DEVICE")
    args = parser.parse_args(argv)
    valid = ", ".join(K3Config.runnable_presets())
    if args.preset in COUNTED_ONLY:
        print(f"tiny-k3: preset {args.preset!r} is a full-size model, only counted, never run; "
              f"pick one of: {valid}.", file=sys.stderr)
        return 2
    if args.preset not in K3Config.presets():
        print(f"tiny-k3: unknown preset {args.preset!r}; valid presets are: {valid}.", file=sys.stderr)
        return 2
    try:
        resolve_device(args.device)
    except ValueError as exc:
        print(f"tiny-k3: {exc}", file=sys.stderr)
        return 2
    TinyK3App(args.preset, args.prompt, args.seed, args.device).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
