"""tui_app.driver without Textual: coalesced keys, look-ahead, the context limit, cancelled and stale loads,
the corrupt-checkpoint fallback, and progress from a real Simulation's prefill."""

import threading
from types import SimpleNamespace

import pytest

from sim import Simulation
from tiny_k3.weights import CheckpointError
from tui_app.driver import Cancelled, CancelFlag, Driver, Loaded, Progress, RunSpec, weights_label


class FakeSim:
    """Frames are plain ints; step() appends one (optionally waiting on a gate, like a slow k3-topo token)."""

    def __init__(self, prompt_frames=3, max_seq_len=100, gate=None):
        self.frames = list(range(prompt_frames))
        self.config = SimpleNamespace(max_seq_len=max_seq_len, name="fake")
        self.cursor = prompt_frames - 1
        self.prompt_len = prompt_frames
        self.gate = gate
        self.steps = 0

    def step(self):
        if self.gate is not None:
            assert self.gate.wait(10)
        self.steps += 1
        self.frames.append(len(self.frames))
        self.cursor = len(self.frames) - 1
        return self.frames[-1]

    def goto(self, i):
        self.cursor = i


def loaded_driver(sim, lookahead=0) -> Driver:
    d = Driver(lookahead=lookahead)
    ticket = d.begin_load(RunSpec("fake", "p"))
    assert d.finish_load(ticket, Loaded(sim, ticket.spec, "random init, seed 0", len(sim.frames) - 1))
    return d


def run_one_step(d: Driver) -> bool:
    """What the app does: start the job, run it (here on this thread), hand the result back."""
    sim, flag = d.start_step()
    Driver.run_step(sim, flag)
    return d.finish_step(sim)


def test_held_keys_coalesce_into_one_goal():
    sim = FakeSim(prompt_frames=3)
    d = loaded_driver(sim)
    assert d.step == 2 and not d.wants_step()
    outcomes = [d.next() for _ in range(350)]          # a held key while the next frame computes
    assert outcomes == ["waiting"] * 350
    assert d.goal == 3 and d.wants_step()              # "go to step 3": one frame, not 350
    assert run_one_step(d) and d.step == 3
    assert not d.wants_step() and sim.steps == 1       # released: nothing queued behind it


def test_lookahead_and_reading_pace():
    sim = FakeSim(prompt_frames=3)
    d = loaded_driver(sim, lookahead=2)
    while d.wants_step():
        run_one_step(d)
    assert len(sim.frames) == 5 and d.step == 2        # two ahead of what the learner has seen
    assert d.next() == "moved" and d.step == 3 and d.visited == 3
    assert d.wants_step()                              # keep two ahead
    assert d.back() and d.step == 2 and d.visited == 3
    while d.wants_step():                              # ahead of the furthest step seen, not of the cursor
        run_one_step(d)
    assert len(sim.frames) == 6
    d.goto(0)
    assert not d.back() and d.step == 0


def test_context_limit_is_said_not_rung():
    sim = FakeSim(prompt_frames=3, max_seq_len=4)
    d = loaded_driver(sim, lookahead=5)
    run_one_step(d)
    assert len(sim.frames) == 4 and not d.wants_step()
    assert d.next() == "moved" and d.next() == "end"
    assert "the context is full" in d.end_reason and "4 tokens" in d.end_reason


def test_a_failed_step_ends_the_timeline_with_its_reason():
    sim = FakeSim()
    d = loaded_driver(sim)
    d.next()
    sim_, _ = d.start_step()
    assert not d.finish_step(sim_, error="boom")
    assert d.end_reason == "boom; b goes back, e starts a new prompt" and d.next() == "end" and d.goal == d.step


def test_new_load_cancels_the_old_and_stale_results_are_dropped():
    d = Driver()
    first = d.begin_load(RunSpec("small", "a"))
    second = d.begin_load(RunSpec("tiny", "b"))
    assert first.flag.is_set and not second.flag.is_set
    with pytest.raises(Cancelled):
        first.flag.check()
    assert first.flag.observed.is_set()
    stale = Loaded(FakeSim(), first.spec, "x", 0)
    assert not d.finish_load(first, stale) and d.sim is None and not d.report(first, Progress(1, 2, 1.0))
    assert d.cancel_load() and d.loading is None and second.flag.is_set
    assert not d.cancel_load()


def test_a_step_of_the_old_session_is_dropped():
    old = FakeSim()
    d = loaded_driver(old)
    d.next()
    sim, flag = d.start_step()
    new = FakeSim(prompt_frames=5)
    ticket = d.begin_load(RunSpec("fake", "q"))
    d.finish_load(ticket, Loaded(new, ticket.spec, "x", 4))
    assert flag.is_set                                 # the old step stops at its check
    assert not d.finish_step(sim) and d.step == 4 and d.sim is new


def test_run_load_reports_progress_and_stops_between_tokens():
    gate_at = 3
    flag_seen = threading.Event()
    d = Driver()
    ticket = d.begin_load(RunSpec("tiny", "hello world", weights="random"))
    reports = []

    def report(p):
        reports.append(p)
        if p.done >= gate_at:
            d.cancel_load()                            # Esc, as the UI thread would
            flag_seen.set()

    times = iter(range(1000))                          # a clock that moves 1 s per call: every token reports
    d._clock = lambda: float(next(times))
    with pytest.raises(Cancelled):
        d.run_load(ticket, report)
    assert flag_seen.is_set() and ticket.flag.observed.is_set()
    assert [p.done for p in reports] == [1, 2, 3] and reports[0].total == len("hello world") + 1
    assert reports[-1].tokens_per_s == pytest.approx(3 / reports[-1].seconds)


def test_run_load_builds_a_real_session_and_labels_its_weights():
    d = Driver()
    ticket = d.begin_load(RunSpec("tiny", "k=7;", weights="random", seed=4))
    loaded = d.run_load(ticket)
    assert isinstance(loaded.sim, Simulation) and loaded.step == 4 and loaded.weights == "random init, seed 4"
    assert d.finish_load(ticket, loaded) and d.step == 4 and d.weights == "random init, seed 4"


def test_corrupt_checkpoint_falls_back_to_random_init_and_says_so():
    calls = []

    def make_sim(preset, prompt, **kw):
        calls.append(kw["weights"])
        if kw["weights"] != "random":
            raise CheckpointError("checkpoint small.safetensors is corrupt or unreadable (SafetensorError).")
        return Simulation("tiny", prompt, seed=kw["seed"], weights="random", progress=kw["progress"])

    d = Driver(make_sim=make_sim)
    loaded = d.run_load(d.begin_load(RunSpec("small", "ab")))
    assert calls == ["auto", "random"]
    assert loaded.weights == ("random init, seed 0 (fallback: checkpoint small.safetensors is corrupt or "
                              "unreadable (SafetensorError))")
    d2 = Driver(make_sim=make_sim)                     # asked for trained weights explicitly: no fallback
    with pytest.raises(CheckpointError):
        d2.run_load(d2.begin_load(RunSpec("small", "ab", weights="trained")))


def test_weights_label_and_expected_weights():
    trained = SimpleNamespace(weights="trained", config=SimpleNamespace(name="small"), seed=0)
    assert weights_label(trained) == "trained checkpoint small.safetensors"
    assert RunSpec("small", "x").expected_weights() == "trained checkpoint"
    assert RunSpec("small", "x", weights="random", seed=2).expected_weights() == "random init, seed 2"
    assert RunSpec("tiny", "x").expected_weights() == "random init, seed 0"
    flag = CancelFlag()
    flag.check()                                       # not set: no exception
    assert not flag.observed.is_set()


def test_the_time_left_waits_until_a_few_tokens_are_timed():
    """Issue 35: building k3-topo takes about a minute, so the first token's time promised "about 7224 s left".
    No estimate until ETA_AFTER tokens have been timed after the first, and then from their time only."""
    from tui_app.driver import ETA_AFTER
    from tui_app.widgets import load_line

    clock = [0.0]
    total = 271

    def make_sim(preset, prompt, progress=None, **kw):
        clock[0] += 60.0                               # building the model (and its first forward)
        for done in range(1, 12):
            progress(done, total)
            clock[0] += 0.5                            # then a token every half second
        sim = FakeSim(prompt_frames=11)
        sim.weights, sim.seed = "random", 0
        return sim

    d = Driver(make_sim=make_sim, clock=lambda: clock[0])
    ticket = d.begin_load(RunSpec("k3-topo", "x" * (total - 1)))
    reports = []
    d.run_load(ticket, reports.append)
    assert [p.done for p in reports] == list(range(1, 12))        # 0.5 s apart: every token reports
    early = [p for p in reports if p.done <= ETA_AFTER]
    assert early and all(p.seconds_left is None for p in early)
    assert all("left" not in load_line(ticket, p).plain and "timing the first tokens" in load_line(ticket, p).plain
               for p in early)
    for p in reports[ETA_AFTER:]:
        assert p.seconds_left == pytest.approx((total - p.done) * 0.5)    # 2 tokens/s, the build left out
        assert f"2.0 tokens/s · about {(total - p.done) * 0.5:.0f} s left" in load_line(ticket, p).plain
    assert reports[0].seconds == pytest.approx(60.0) and reports[0].timed == 0
