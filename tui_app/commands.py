"""The command palette (ctrl+p): go to layer / expert / step / head, presets and the toggles."""

from __future__ import annotations

from functools import partial

from textual import on
from textual.command import CommandPalette, DiscoveryHit, Hit, Provider
from textual.widgets import Button, Input, OptionList

from sim.presets import tui_presets

from .screens import DismissOnce
from .whatif_menu import PALETTE


class K3Palette(DismissOnce, CommandPalette):
    """Textual's command palette, closing once: a double Enter selects the command twice before the first
    pops the palette (issue 24), so once it is closing its own handlers of Enter, a click on "go" and a
    selection are skipped (prevent_default stops the base class's handlers) and the command runs once.
    Its search worker may still finish after the palette's widgets are gone; the two watchers that query
    them then do nothing (found by tests/test_tui_keys.py: NoMatches 'LoadingIndicator')."""

    async def _watch__show_busy(self) -> None:
        if not self.closing:
            await super()._watch__show_busy()

    def _watch__list_visible(self) -> None:
        if not self.closing:
            super()._watch__list_visible()

    @on(Input.Submitted)
    @on(Button.Pressed)
    @on(OptionList.OptionSelected)
    def _ignore_once_closing(self, event) -> None:
        if self.closing:
            event.stop()
            event.prevent_default()


class K3Commands(Provider):
    """Numbers typed in the query offer "Go to layer N", "Go to expert N", ...; each title appears once."""

    def _commands(self, query: str):
        app = self.app
        cfg = app.config
        seen: set[str] = set()

        def once(title: str, help_text: str, callback):
            if title not in seen:
                seen.add(title)
                yield title, help_text, callback

        numbers = [int(tok) for tok in query.replace("/", " ").split() if tok.isdigit()]
        for n in numbers:
            if n < cfg.num_layers:
                yield from once(f"Go to layer {n}", f"{cfg.layer_kinds[n].upper()} layer", partial(app.select_layer, n))
            if n < cfg.num_experts:
                yield from once(f"Go to expert {n}", "highlight this expert in the routing panel",
                                partial(app.select_expert, n))
            if n < len(app.driver.frames):
                yield from once(f"Go to step {n}", "move the cursor to this token", partial(app.goto_step, n))
            if n < cfg.kda_heads:
                yield from once(f"Head {n}", "show this KDA head", partial(app.select_head, n))
        for layer in range(cfg.num_layers):
            yield from once(f"Go to layer {layer}", f"{cfg.layer_kinds[layer].upper()} layer",
                            partial(app.select_layer, layer))
        for name in tui_presets():
            yield from once(f"Preset {name}", "restart on this preset", partial(app.load_session, preset=name))
        yield "Toggle compare mode", "hybrid vs the all-softmax twin", app.action_compare
        yield "Run / pause", "generate continuously", app.action_run
        yield "Edit prompt", "type a new prompt", app.action_edit_prompt
        yield "Save the run", "write it to a file that --open reopens", app.action_save
        yield "Clear expert", "stop highlighting an expert", partial(app.select_expert, -1)
        yield "What if … (this panel)", "change the model at this token and compare (x)", app.action_what_if
        for title, changes in PALETTE:
            yield f"What if: {title}", "recompute this token and the next ones with the change", \
                partial(app.start_what_if, changes)

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
