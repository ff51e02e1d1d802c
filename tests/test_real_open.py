"""A run streamed from a released checkpoint, reopened without its weights: sim.streamed_run.StreamedRun, the TUI's
`--open` (tui_app/driver.py) read-only."""

import pytest

from sim import runfile
from sim.real import RealSimulation
from sim.real_synthetic import write_synthetic_release
from sim.streamed_run import StreamedRun, open_run
from tui_pilot import screen_text, settle, sync, wait_until


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("release")
    _, _, folder = write_synthetic_release(folder)
    sim = RealSimulation(folder, "ab")
    sim.run(3)
    path = folder.parent / "real-run.npz"
    runfile.save(sim, path, cursor=2)
    return sim, path


def test_a_released_run_reopens_read_only_with_every_frame(saved):
    sim, path = saved
    run = open_run(path)
    assert isinstance(run, StreamedRun)
    assert run.cursor == 2 and run.prompt == "ab" and run.config == sim.config
    assert all(a.same_as(b) for a, b in zip(run.frames, sim.frames, strict=True))
    assert run.step().same_as(sim.frames[3])                     # stepping through what was recorded
    views = run.step_into()
    assert [v.kind for v in views][:3] == ["embed", "kda", "dense"] and views[-1].top is not None
    assert (run.expert_load(1) == sim.expert_load(1, upto=3)).all()
    sim.goto(3)
    assert run.text == sim.text                                  # decoded from the stored token bytes
    sim.goto(len(sim.frames) - 1)
    run.goto(len(run.frames) - 1)
    for attempt in (run.step, lambda: run.what_if(), lambda: run.recall_moment(), lambda: run.step(force_token=3)):
        with pytest.raises(ValueError, match=r"real-run.npz was streamed from a released checkpoint \(released "
                                             r".*\) whose weights are not here"):
            attempt()
    again = runfile.save(run, path.with_name("again.npz"))       # a reopened run saves as it was
    assert all(a.same_as(b) for a, b in zip(runfile.read(again).frames, sim.frames, strict=True))


def test_the_driver_opens_it_at_its_end_and_refuses_a_what_if(saved):
    from sim.interventions import UniformDepth
    from tui_app.driver import Driver, RunSpec, weights_label

    _, path = saved
    driver = Driver()
    ticket = driver.begin_load(RunSpec("tiny", "x", 0, "auto", "cpu", str(path)))
    assert driver.finish_load(ticket, driver.run_load(ticket))
    assert driver.at_end and not driver.wants_step()            # no step is ever started on it
    assert "whose weights are not here" in driver.end_reason
    assert weights_label(driver.sim).endswith(", read-only") and "random init" not in weights_label(driver.sim)
    with pytest.raises(ValueError, match="whose weights are not here"):
        driver.request_what_if((UniformDepth(),))


@sync
async def test_tiny_k3_open_shows_the_real_run_and_says_why_it_cannot_go_on(saved):
    from tui import TinyK3App

    sim, path = saved
    app = TinyK3App(open_path=str(path), show_timings=False)
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        assert app.step == 2 and all(a.same_as(b) for a, b in zip(app.sim.frames, sim.frames))
        assert "read-only" in screen_text(app)
        await pilot.press(*"n" * (len(sim.frames) - 2))          # to the last recorded frame, then past it
        await wait_until(pilot, lambda: "whose weights are not here" in str(app.message), timeout=20)
        assert app.step == len(sim.frames) - 1
