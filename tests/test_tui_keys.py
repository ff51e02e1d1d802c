"""Keys as a terminal delivers them: several Key events already queued before the app handles the first
(a double tap, key repeat, two keys in one write). Pilot's press waits for the app between keys and cannot
see this (issue 24: a double Enter in e, p or x popped the main screen, ScreenStackError, rc 1).

Every dialog closes exactly once; a few hundred random keys from the bindings, sent without waiting, leave
the app running with no exception."""

import random

import pytest

from tui_app.screens import Dialog, HelpScreen, PresetScreen, PromptScreen
from tui_app.whatif_menu import WhatIfMenu
from tui_app.whatif_screen import WhatIfScreen
from tui_pilot import burst, make_app, settle, sync, wait_until

SIZE = (100, 30)


def count_calls(obj, name: str) -> list:
    """Replace obj.name by a wrapper that records each call's arguments (and still calls it)."""
    calls, real = [], getattr(obj, name)

    def wrapper(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    setattr(obj, name, wrapper)
    return calls


def on_main(app) -> bool:
    return app.screen is app._main and len(app.screen_stack) == 1


async def drain(pilot, rounds: int = 20) -> None:
    """Let the queued events run (several hops each: app -> screen -> widget -> message -> handler)."""
    for _ in range(rounds):
        await pilot.pause()


@pytest.mark.parametrize("finish", ["enter", "escape"])
@pytest.mark.parametrize("key, screen, answer", [("e", PromptScreen, "load_session"),
                                                  ("p", PresetScreen, "load_session"),
                                                  ("x", WhatIfMenu, "start_what_if")])
@sync
async def test_a_double_key_closes_a_dialog_once(key, screen, answer, finish):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        answers = count_calls(app, answer)
        pushed = count_calls(app, "push_screen")
        burst(app, key, finish, finish, finish)         # open, then three of Enter (or Escape) in one write
        await drain(pilot)
        assert app._exception is None and app.is_running
        assert [type(args[0]) for args, _ in pushed][:1] == [screen]
        # p opens on the current preset, so its Enter keeps it: nothing is loaded (issue 35)
        assert len(answers) == (1 if finish == "enter" and key != "p" else 0)
        if key == "x" and finish == "enter":            # the what-if ran once and its result is on top
            await wait_until(pilot, lambda: isinstance(app.screen, WhatIfScreen), what="the what-if result")
            await settle(pilot)
            assert len(app.screen_stack) == 2 and len(answers) == 1
            burst(app, "escape", "escape", "escape")    # the result screen closes once, too
            await drain(pilot)
        await settle(pilot)
        assert on_main(app) and app._exception is None
        assert sum(isinstance(args[0], Dialog) for args, _ in pushed) == (1 + (key == "x" and finish == "enter"))


@sync
async def test_help_closes_once_and_a_queued_key_goes_to_the_main_screen():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        step = app.step
        burst(app, "?", "escape", "escape", "escape")
        await drain(pilot)
        assert on_main(app) and app._exception is None
        burst(app, "?", "?", "b")                        # ? closes it; b after it is the timeline's again
        await drain(pilot)
        await settle(pilot)
        assert on_main(app) and app.step == step - 1 and app._exception is None


# ---------------------------------------------------------------------------------------------- abuse

ABUSE_KEYS = 300
ABUSE_SEED = 24


def binding_keys(app) -> list[str]:
    """Every key the app binds (q left out: it quits, and the app must still run at the end), the palette's
    ctrl+p, and Enter and Escape for the dialogs."""
    keys = {k.strip() for b in app.BINDINGS for k in b.key.split(",")} - {"q"}
    return sorted(keys | {"ctrl+p", "enter", "escape"})


@sync
async def test_hundreds_of_random_keys_without_waiting_leave_the_app_running(tmp_path):
    app = make_app(save_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        keys = binding_keys(app)
        rng = random.Random(ABUSE_SEED)
        sent = 0
        while sent < ABUSE_KEYS:                        # bursts of 1-30 keys, each in one write, a few ms apart
            n = min(rng.randint(1, 30), ABUSE_KEYS - sent)
            burst(app, *(rng.choice(keys) for _ in range(n)))
            sent += n
            await pilot.pause(rng.choice((0, 0, 0.01, 0.05)))
            assert app._exception is None, f"after {sent} keys"
        assert sent == ABUSE_KEYS
        burst(app, *["escape"] * 4)                    # out of any dialog, what-if or load
        await drain(pilot, 40)
        assert app._exception is None and app.is_running
        await wait_until(pilot, lambda: app.driver.loading is None and app.driver.whatif is None
                         and not app.driver.busy, 300, "the last job")
        while not on_main(app):                         # whatever is still open closes with Escape
            burst(app, "escape")
            await drain(pilot)
        if app.running:                                 # r may have left it generating: pause it
            burst(app, "r")
            await drain(pilot)
        await settle(pilot, 300)
        assert on_main(app) and app.sim is not None and app._exception is None and app.is_running
        await pilot.press("n")                          # and it still steps
        await settle(pilot, 300)
        assert app._exception is None
