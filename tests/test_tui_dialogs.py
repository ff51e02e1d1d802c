"""Dialog.after_composed: a screen's first draw waits until what it draws into is mounted.

A screen's Mount can come before its grandchildren's (each container mounts its own children in its own turn);
on a loaded machine a what-if result's on_mount once found its Horizontal empty and crashed. The contract tested
here: then() runs at once when every selector already matches, else not before they do, and then exactly once."""

from textual.app import App
from textual.widgets import Static

from tui_app.screens import Dialog
from tui_pilot import sync


class Empty(Dialog):
    def compose(self):
        yield Static(id="here")


@sync
async def test_then_runs_once_what_it_needs_is_mounted_and_not_before():
    app = App()
    async with app.run_test() as pilot:
        screen = Empty()
        await app.push_screen(screen)
        await pilot.pause()
        now, later = [], []
        screen.after_composed(lambda: now.append(1), "#here")
        assert now == [1], "every selector matches already: then() runs at once"
        screen.after_composed(lambda: later.append(1), "#here", "#later")
        assert later == [], "then() must wait while '#later' is not mounted"
        await screen.mount(Static(id="later"))      # (it asks again after each refresh until this is there)
        for _ in range(5):
            await pilot.pause()
        assert later == [1], "once '#later' is mounted then() runs, exactly once"


@sync
async def test_a_dialog_that_closed_before_its_parts_mounted_never_draws():
    app = App()
    async with app.run_test() as pilot:
        screen = Empty()
        await app.push_screen(screen)
        await pilot.pause()
        drawn = []
        screen.after_composed(lambda: drawn.append(1), "#never")
        screen.dismiss()
        for _ in range(5):
            await pilot.pause()
        assert drawn == [] and screen.closing
