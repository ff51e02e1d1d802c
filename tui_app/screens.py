"""Modal screens: edit the prompt, switch preset, the help. Each returns its answer with `dismiss`.

Every modal screen of the app is a `Dialog`: it dismisses once. A terminal delivers a double Enter (a
double tap, key repeat, or two keys in one write) before the first one has popped the screen, so the
widget's second "selected" / "submitted" message reaches a screen that is already leaving; dismissing
again would pop the screen *under* it (issue 24: ScreenStackError, or the main screen gone).
"""

from __future__ import annotations

from typing import Callable

from textual import on
from textual.app import ComposeResult
from textual.await_complete import AwaitComplete
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from sim.presets import config_for, tui_presets
from sim.prompt import prompt_limit

from .help import help_renderable


class DismissOnce:
    """Mixed into a Screen: it dismisses exactly once, and ignores every key and message once it is leaving.

    `closing` turns True at the first dismiss; later dismisses are no-ops (and so is one of a screen that is
    no longer on top: it must never pop another screen), and `check_action` turns the screen's bindings
    off. Handlers of widget messages (OptionSelected, Submitted) check `closing` first.
    """

    closing = False

    def dismiss(self, result=None) -> AwaitComplete:
        if self.closing or not self.is_current:
            return AwaitComplete.nothing()
        self.closing = True
        return super().dismiss(result)

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        return not self.closing


class Dialog(DismissOnce, ModalScreen):
    """The app's modal screens: prompt, preset, help, the what-if menu and result."""

    def after_composed(self, then: Callable[[], None], *selectors: str) -> None:
        """then() once every selector matches a mounted widget (at once when they already do).

        A screen's Mount can come before its grandchildren have mounted: each container mounts its own children
        in its own turn, and on a loaded machine a what-if result's on_mount found its Horizontal empty and
        crashed on query_one. So a first draw that reaches into containers waits for what it draws into."""
        if not self.is_attached or self.closing:
            return
        if all(self.query(selector) for selector in selectors):
            then()
        else:
            self.call_after_refresh(lambda: self.after_composed(then, *selectors))


class PromptScreen(Dialog):
    """A new prompt (Enter) or nothing (Escape)."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, prompt: str, config):
        super().__init__()
        self.prompt, self.config = prompt, config      # config: the K3Config whose limit the label states

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt-box", classes="dialog"):
            yield Static(f"[b]Prompt[/b]: each UTF-8 byte is a token; {prompt_limit(self.config)} to leave room "
                         f"to generate. Enter runs it, Escape cancels.", classes="dialog-label")
            yield Input(value=self.prompt, id="prompt-input", select_on_focus=False)

    def on_mount(self) -> None:
        self.after_composed(lambda: setattr(self.query_one(Input), "cursor_blink", False), "Input")

    @on(Input.Submitted)
    def submit(self, event: Input.Submitted) -> None:
        if not self.closing:
            self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class PresetScreen(Dialog):
    """Another preset (↑ ↓, Enter) or nothing (Escape). It opens on the current preset, marked, so Enter alone
    (or a double Enter after p) changes nothing."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, current: str):
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        options = []
        for name in tui_presets():
            c = config_for(name)
            mark = " (current)" if name == self.current else ""
            kind = ", all MLA: the shipped all-softmax twin" if name.endswith("-twin") else ""
            options.append(Option(f"{name:<12} {c.num_layers:>3} layers, {c.top_k} of {c.num_experts} experts, "
                                  f"d={c.hidden_size}{kind}{mark}", id=name))
        with Vertical(id="preset-box", classes="dialog"):
            yield Static("[b]Switch preset[/b] (k3 itself is only counted, never run). ↑ ↓ choose, Enter picks, "
                         "Escape cancels.", classes="dialog-label")
            yield OptionList(*options, id="preset-list")

    def on_mount(self) -> None:
        self.after_composed(self._highlight_current, "OptionList")

    def _highlight_current(self) -> None:
        names = tui_presets()
        self.query_one(OptionList).highlighted = names.index(self.current) if self.current in names else 0

    @on(OptionList.OptionSelected)
    def pick(self, event: OptionList.OptionSelected) -> None:
        if not self.closing:
            self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)


class HelpScreen(Dialog):
    """The help, in a box that scrolls where the terminal is shorter than the text (80x24: ↑ ↓, page keys);
    how to close it stays in the box's border, on screen at any size."""

    BINDINGS = [Binding("escape,question_mark,q", "close", "close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box", classes="dialog") as box:
            box.border_subtitle = "↑ ↓ scroll · Escape closes"
            yield Static(help_renderable(), id="help-text")

    def on_mount(self) -> None:
        self.after_composed(lambda: self.query_one("#help-box").focus(), "#help-box")

    def action_close(self) -> None:
        self.dismiss(None)
