"""Reopened runs in the TUI (issue 35): a read-only run streamed from a released checkpoint refuses x and e at
once, each refusal naming what the app can do instead, and its status line names where it was streamed from;
any reopened run switches preset as a fresh session does, also to a preset without shipped weights."""

import pytest

from sim import Simulation, runfile
from sim.real import RealSimulation
from sim.real_synthetic import write_synthetic_release
from tui import TinyK3App
from tui_app.screens import PresetScreen, PromptScreen
from tui_app.whatif_menu import WhatIfMenu
from tui_pilot import make_app, screen_text, settle, sync, wait_until

SIZE = (160, 48)


@pytest.fixture(scope="module")
def released_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("reopen")
    _, _, folder = write_synthetic_release(base / "release")   # the folder name the header doubled
    sim = RealSimulation(folder, "ab")
    sim.run(2)
    path = base / "real-run.npz"
    runfile.save(sim, path, cursor=2)
    return folder, path


def normal(text: str) -> str:
    return " ".join(text.split())


async def pick_preset(pilot, name: str) -> None:
    """p, the preset `name` highlighted, Enter: as a learner switches."""
    app = pilot.app
    await pilot.press("p")
    assert isinstance(app.screen, PresetScreen)
    options = app.screen.query_one("OptionList")
    options.highlighted = [options.get_option_at_index(i).id for i in range(options.option_count)].index(name)
    await pilot.press("enter")
    await wait_until(pilot, lambda: app.preset == name and app.driver.loading is None, what=f"the switch to {name}")
    await settle(pilot)


@sync
async def test_a_read_only_run_refuses_x_and_e_at_once_and_says_what_the_app_can_do(released_run):
    folder, path = released_run
    app = TinyK3App(open_path=str(path), show_timings=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        status = str(app.query_one("#status").render())
        assert f"streamed from {folder.name}, read-only" in status and "released release" not in status
        await pilot.press("x")
        await pilot.pause()
        assert not isinstance(app.screen, WhatIfMenu) and app.screen is app._main      # no menu first
        message = normal(str(app.message))
        assert message.startswith("What-if not run:") and "whose weights are not here" in message
        assert "n and b walk its recorded frames" in message and "p switches to a preset that computes" in message
        await pilot.press("e")
        await pilot.pause()
        assert not isinstance(app.screen, PromptScreen) and app.screen is app._main
        assert "p switches to a preset, then e gives it a prompt" in normal(str(app.message))
        app.start_what_if(())                          # the palette's what-ifs: the same refusal, nothing queued
        assert "p switches to a preset that computes" in normal(str(app.message)) and app.driver.whatif is None
        app.goto_step(len(app.sim.frames) - 1)
        await pilot.press("n")                         # past the last recorded frame: the same words
        await pilot.pause()
        assert "p switches to a preset that computes" in normal(str(app.message))

        await pick_preset(pilot, "tiny")               # p still works: a preset that computes
        assert app.sim.weights == "random" and "weights=" not in str(app.message)
        assert str(app.message).startswith("tiny ships no trained weights, so it runs a random init (seed 0)")


@sync
async def test_a_reopened_trained_run_switches_to_a_preset_without_weights_as_a_fresh_session_does(tmp_path):
    """A run saved with trained weights reopened with --open asked for "trained" again on the next preset, and a
    preset without shipped weights failed with "use weights='auto' or 'random'" (a Python argument)."""
    path = tmp_path / "kda.npz"
    Simulation("small-kda", "k=7;", weights="trained").save(path)
    reopened = TinyK3App(open_path=str(path), show_timings=False)
    async with reopened.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert reopened.driver.spec.weights == "trained"
        await pick_preset(pilot, "tiny")
        note = str(reopened.message)
        assert reopened.sim.weights == "random" and "Not loaded" not in note and "weights=" not in note
    fresh = make_app(preset="small-kda", prompt="k=7;", weights="auto")
    async with fresh.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert fresh.sim.weights == "trained"
        await pick_preset(pilot, "tiny")
        assert str(fresh.message) == note              # the same switch, the same note
    assert note.startswith("tiny ships no trained weights, so it runs a random init (seed 0); p picks ")
    assert "small-kda" in note and note.endswith("for trained ones")
