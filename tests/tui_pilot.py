"""Helpers for the Pilot tests of the TUI: the screen as text, waiting until the app is idle, an app factory."""

import asyncio
import functools
import io
import time

from rich.console import Console
from textual import events
from textual.keys import _character_to_key

from tui import TinyK3App

PROMPT = "k=7;"          # BOS + 4 bytes: 5 prompt frames, the cursor starts on frame 4


def screen_text(app) -> str:
    """The screen as plain text, exactly what the compositor would paint."""
    w, h = app.size
    console = Console(width=w, height=h, file=io.StringIO(), record=True, force_terminal=True,
                      color_system="truecolor", legacy_windows=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


async def wait_until(pilot, condition, timeout: float = 120.0, what: str = "the app") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not get there in time"
        await pilot.pause(0.02)


async def settle(pilot, timeout: float = 120.0) -> None:
    """Wait until no job runs or is wanted and every change is drawn (look-ahead included)."""
    app = pilot.app
    calm = 0
    deadline = time.monotonic() + timeout
    while calm < 2:
        assert time.monotonic() < deadline, f"the app did not settle: {unsettled(app)}"
        await pilot.pause()
        calm = calm + 1 if app.idle and app.sim is not None else 0
        await asyncio.sleep(0.01)
    await pilot.pause()


def unsettled(app) -> str:
    """Which of the app's idle conditions still holds (what `settle` waits for), for its failure message."""
    d = app.driver
    named = {"a job runs": d.busy, "a load is open": d.loading is not None, "a what-if is open": d.whatif is not None,
             "a step is wanted": d.wants_step(), "a recall moment is wanted": d.wants_recall(),
             "a redraw is pending": app._redraw_pending, "a pump is pending": app._pump_pending,
             "the screen is not drawn yet": not getattr(app.screen, "ready", True),
             "no simulation": app.sim is None}
    return ", ".join(name for name, holds in named.items() if holds) or "nothing (it settled as the time ran out)"


def sync(test):
    """Run an async Pilot test with asyncio.run (no pytest-asyncio needed)."""
    @functools.wraps(test)          # keeps the signature, so pytest still passes fixtures (tmp_path)
    def wrapper(*args, **kwargs):
        asyncio.run(test(*args, **kwargs))

    return wrapper


CHARACTERS = {"enter": "\r", "escape": "\x1b", "tab": "\t", "space": " "}


def burst(app, *keys: str) -> None:
    """Deliver `keys` the way a terminal does: every Key event is in the app's queue before the app handles
    the first (Pilot's press waits until the app is idle after each key, so it cannot see a double Enter).
    Key names as Pilot's: "enter", "ctrl+p", "?", "x"."""
    for key in keys:
        char = key if len(key) == 1 else CHARACTERS.get(key)
        if len(key) == 1 and not key.isalnum():
            key = _character_to_key(key)          # "?" -> "question_mark", as a terminal driver names it
        event = events.Key(key, char)
        event.set_sender(app)
        app._driver.send_message(event)


def make_app(**kwargs) -> TinyK3App:
    # random weights: retraining the shipped checkpoints must not change what these tests see
    kwargs = {"preset": "tiny", "prompt": PROMPT, "seed": 0, "weights": "random", "show_timings": False, **kwargs}
    return TinyK3App(**kwargs)
