"""The keys that move what the panels show: layer (j/k), head (h/H), into a token's sublayers (i/o), an
expert, compare (c), and which panel is shown (1-4, tab) or zoomed (z).

Mixed into TinyK3App, whose reactives (layer, head, sublayer_index, expert, compare) these set; their
watchers redraw. Stepping into a token walks Simulation.step_into's sublayers of the cursor's frame.
"""

from __future__ import annotations

from .panel import no_twin

PANELS = ("routing", "state", "depth", "memory")


class Navigation:
    """TinyK3App's selection keys and panel switching (see the module docstring)."""

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
                self._set_message("already at the " + ("embedding, the first sublayer; j goes deeper" if target < 0
                                                       else "head, the last sublayer; k goes back") + ", o steps out")
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
        why = no_twin(self.config)
        if why and not self.compare:        # nothing to compare with: say so rather than compare against noise
            self.bell()
            self._set_message(f"c: {why}.")
            return
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

    def _focused_panel(self) -> str:
        return self.focused.id if self.focused is not None and self.focused.id in PANELS else self.shown_panel

    def _sublayer_views(self) -> tuple:
        """The current token's sublayers (Simulation.step_into reads only the Frame), cached per step."""
        key = (self.session, self.step)
        if self._sublayers_key != key:
            self._sublayers_key, self._sublayers = key, tuple(self.sim.step_into(self.step))
        return self._sublayers

    def _start_layer(self) -> int:
        cfg = self.config
        both = [i for i in cfg.kda_layers if i in cfg.moe_layers]
        return both[0] if both else 0

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """tab / shift+tab are priority keys (panels are focusable): on a modal screen they are not ours."""
        if action == "cycle_panel" and self._main is not None and self.screen is not self._main:
            return False
        return True
