"""The keys that open a modal screen: the command palette (ctrl+p), help (?), a new prompt (e), another
preset (p), and the what-if menu (x) with the what-if it asks for, whose result opens WhatIfScreen.

Mixed into TinyK3App: each action pushes a screen from its own module (screens.py, whatif_menu.py,
whatif_screen.py) and hands the answer back to the app (load_session, start_what_if).
"""

from __future__ import annotations

from rich.text import Text

from .commands import K3Palette
from .driver import WHAT_IF_STEPS
from .runs import read_only_note
from .messages import JobOutcome, run_job
from .panel import quoted
from .screens import HelpScreen, PresetScreen, PromptScreen
from .whatif_menu import WhatIfMenu, menu_for, unavailable
from .whatif_screen import WhatIfScreen


class Dialogs:
    """TinyK3App's modal screens and the what-if job (see the module docstring)."""

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
        if read_only_note(self.sim):        # no model here to run a prompt with: say so before any dialog
            self.bell()
            self._set_message(Text.assemble(("e: ", "bold red"), f"this run was streamed from a released checkpoint "
                                            f"whose weights are not here, so nothing can run a new prompt on it; p "
                                            f"switches to a preset, then e gives it a prompt."))
            return

        def done(prompt: str | None) -> None:
            if prompt is not None:
                self.load_session(prompt=prompt)

        self.running = False
        self.push_screen(PromptScreen(self.prompt, self.config), done)

    def action_preset(self) -> None:
        if self._quitting:
            return

        def done(name: str | None) -> None:
            if name is not None and name == self.preset and self.sim is not None:
                self._set_message(f"still on {name}: p, then ↑ ↓ to another preset and Enter, switches")
            elif name is not None:
                self.load_session(preset=name)

        self.running = False
        self.push_screen(PresetScreen(self.preset), done)

    def action_what_if(self) -> None:
        """x: the what-if menu for the focused panel at this step, layer and head."""
        if self._quitting or self.sim is None:
            return
        note = read_only_note(self.sim)
        if note:                            # refused at once, before any menu: nothing here can recompute
            self.bell()
            self._set_message(Text.assemble(("What-if not run: ", "bold red"), note))
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
        except ValueError as exc:           # a change that does not fit this preset: say what does
            hint = "" if read_only_note(self.sim) else "; x on a panel lists the what-ifs that fit this preset"
            self._set_message(Text.assemble(("What-if not run: ", "bold red"), str(exc).rstrip("."), hint))
            return
        panel = panel or self._focused_panel()
        self._whatif_for = (job, panel, *self._panel_place(panel))
        self.running = False
        self._set_message("")
        self._draw_progress()
        self._draw_status()
        self._pump()

    def _start_what_if_job(self, job) -> None:
        """The what-if, then (when it ran) who still carries a recall answer it reset (None on any error)."""
        d = self.driver

        def what_if(report):
            result = d.run_what_if(job, report)
            return result, run_job(lambda: d.run_still_carried(job, result)).value

        def progress(p) -> None:
            if d.report_what_if(job, p):
                self._draw_progress()

        self.run_in_worker("whatif", what_if, lambda out: self._what_if_finished(job, out), progress)

    def _what_if_finished(self, job, out: JobOutcome) -> None:
        if self.driver.finish_what_if(job):
            result, carried = out.value or (None, None)
            if result is not None and self._whatif_for is not None and self._whatif_for[0] is job:
                _, panel, layer, head = self._whatif_for
                self.push_screen(WhatIfScreen(result, job.sim, panel, layer, head, carried))
            else:
                why = (out.error or "it was cancelled").rstrip(".")
                self._set_message(Text.assemble(("What-if not run: ", "bold red"), f"{why}; the timeline is "
                                                f"untouched, and x offers the what-ifs of each panel"))
        self._draw_progress()
        self._draw_status()
        self._pump()
