"""The key footer: Textual's compact Footer, showing only the keys that fit the terminal's width.

Textual's Footer lays every shown binding out in one row and docks the palette key on the right over it:
at 80 columns the row ran under the palette key and left stray letters beside it (issue 24: `^p palettep`,
and `x what-if` cut off). Here the keys come in the order of the app's BINDINGS (the most needed first:
n, b, x, ...), each one only if it fits whole, and the palette key is one of them; `?` lists them all.
"""

from __future__ import annotations

from textual.widgets import Footer
from textual.widgets._footer import FooterKey


def key_width(key_display: str, description: str) -> int:
    """Columns of one compact footer key: "key description" and the one-column gap after it."""
    return len(key_display) + 1 + len(description) + 1


class K3Footer(Footer):
    """Footer(compact=True, show_command_palette=False) that yields the bindings that fit, in order."""

    def __init__(self) -> None:
        super().__init__(compact=True, show_command_palette=False)
        self._composed_width: int | None = None

    def fitting(self, width: int) -> list[tuple]:
        """(binding, enabled, tooltip) of the shown bindings that fit in `width` columns, first ones first."""
        out, used, actions = [], 0, set()
        for _, binding, enabled, tooltip in self.screen.active_bindings.values():
            if not binding.show or binding.action in actions:
                continue
            actions.add(binding.action)
            need = key_width(self.app.get_key_display(binding), binding.description)
            if used + need - 1 > width:      # the last key needs no gap after it
                break
            used += need
            out.append((binding, enabled, tooltip))
        return out

    def compose(self):
        if not self._bindings_ready:
            return
        self._composed_width = self.app.size.width
        keys = self.fitting(self._composed_width)
        self.styles.grid_size_columns = len(keys)
        for binding, enabled, tooltip in keys:
            yield FooterKey(binding.key, self.app.get_key_display(binding), binding.description, binding.action,
                            disabled=not enabled, tooltip=tooltip).data_bind(compact=Footer.compact)

    def on_resize(self) -> None:
        """A new terminal width: another set of keys may fit (the same width: nothing to do, and recomposing
        then would resize the footer again, a loop)."""
        if self._bindings_ready and self.app.size.width != self._composed_width:
            self.call_after_refresh(self.recompose)
