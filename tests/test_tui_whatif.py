"""The TUI's what-if (x): the driver's job is Simulation.what_if (checked against a separate Simulation), a
no-op leaves the timeline identical, cancel stops between tokens; the menu fits the focused panel, the result
screen shows the numbers WhatIf has, and Escape returns to a main view that did not change."""

import threading

import numpy as np
import pytest

from sim import Simulation
from sim.interventions import AblateExpert, NoSelectionBias, ResetState, TruncateContext, describe
from sim.whatif import branch_timeline
from tui_app.driver import WHAT_IF_STEPS, Cancelled, Driver, Loaded, RunSpec
from tui_app.panels import View
from tui_app.whatif_menu import WhatIfMenu, menu_for, unavailable
from tui_app.whatif_screen import SAME, WhatIfScreen, continuation, fmt_kl
from tui_pilot import PROMPT, make_app, screen_text, settle, sync, wait_until

SIZE = (160, 48)


def tiny_sim(**kw) -> Simulation:
    return Simulation("tiny", PROMPT, seed=0, weights="random", **kw)


def driver_on(sim) -> Driver:
    d = Driver(lookahead=0)
    ticket = d.begin_load(RunSpec(sim.config.name, PROMPT))
    assert d.finish_load(ticket, Loaded(sim, ticket.spec, "random init, seed 0", len(sim.frames) - 1))
    return d


def run_job(d: Driver, changes, report=None):
    """What the app does: ask, start when the driver wants it, run (here on this thread), hand it back."""
    d.request_what_if(changes)
    assert d.wants_what_if() and not d.wants_step()
    job = d.start_what_if()
    try:
        return job, d.run_what_if(job, report)
    finally:
        d.finish_what_if(job)


def same_whatif(a, b) -> bool:
    return (a.position == b.position and a.kl == b.kl and a.top_before == b.top_before
            and a.top_after == b.top_after and a.first_divergence == b.first_divergence
            and all(x.same_as(y) for x, y in zip(a.frames, b.frames)) and len(a.frames) == len(b.frames))


def test_the_driver_job_is_simulation_what_if_and_leaves_the_timeline_alone():
    sim = tiny_sim()
    sim.run(3)                                         # generated frames too: the job works at the driver's step
    d = driver_on(sim)
    d.goto(3)
    frames, cursor = list(sim.frames), sim.cursor
    expert = int(sim.frames[3].routing_for(1).expert_ids[0])
    job, w = run_job(d, (AblateExpert(1, expert),))
    assert job.steps == WHAT_IF_STEPS and d.whatif is None and not d.busy
    assert sim.cursor == cursor and len(sim.frames) == len(frames)
    assert all(a is b for a, b in zip(sim.frames, frames))
    ref = tiny_sim()
    ref.run(3)
    ref.goto(3)
    assert same_whatif(w, ref.what_if(AblateExpert(1, expert), steps=WHAT_IF_STEPS))
    assert all(expert not in f.routing_for(1).expert_ids for f in w.frames)


def test_a_no_op_what_if_is_the_timeline_itself():
    sim = tiny_sim(prefill=False)    # stepped prompt: a what-if's decode steps are the frames' own computation
                                     # (prefilled prompt frames are equal to rounding: tests/test_prefill.py)
    sim.run(WHAT_IF_STEPS)
    d = driver_on(sim)
    d.goto(2)
    before = [f for f in sim.frames]
    _, w = run_job(d, ())
    assert w.kl == (0.0,) * WHAT_IF_STEPS and w.first_divergence == (None,) * WHAT_IF_STEPS
    assert all(a.same_as(b) for a, b in zip(w.frames, sim.frames[2:2 + WHAT_IF_STEPS]))
    assert all(a is b for a, b in zip(sim.frames, before)) and len(sim.frames) == len(before)


def test_cancel_stops_between_tokens_and_the_result_is_never_shown():
    sim = tiny_sim()
    d = driver_on(sim)
    frames, cursor = list(sim.frames), sim.cursor
    done = []

    def esc_after_the_first_token(p):           # the UI thread's Escape, while the worker runs
        done.append(p.done)
        assert d.cancel_what_if()

    with pytest.raises(Cancelled):
        run_job(d, (ResetState(),), esc_after_the_first_token)
    assert done == [1] and d.whatif is None and d.whatif_running is None and not d.busy
    assert sim.cursor == cursor and all(a is b for a, b in zip(sim.frames, frames))
    assert not d.cancel_what_if()               # nothing left to cancel


def test_one_job_at_a_time_and_bad_changes_are_one_sentence():
    sim = tiny_sim()
    d = driver_on(sim)
    d.lookahead = 1
    assert d.wants_step()
    sim_, flag = d.start_step()                 # a step in flight: the what-if waits for it
    d.request_what_if((NoSelectionBias(),))
    assert not d.wants_what_if() and not d.wants_step()
    Driver.run_step(sim_, flag)
    d.finish_step(sim_)
    assert d.wants_what_if()
    job = d.start_what_if()
    assert d.busy and not d.wants_step() and not d.wants_recall()
    d.finish_what_if(job)
    with pytest.raises(ValueError, match=r"^ResetState: layer 3 is not a KDA layer"):
        d.request_what_if((ResetState(3),))     # the MLA layer
    mla_only = Simulation("k2-tiny", "ab", weights="random", twin=False)
    with pytest.raises(ValueError, match="KDA") as err:
        driver_on(mla_only).request_what_if((ResetState(),))
    assert "\n" not in str(err.value) and str(err.value).endswith(".")


def test_menus_fit_each_panel_and_every_offered_change_runs():
    sim = tiny_sim()
    cfg = sim.config
    view = lambda layer, head=1: View(sim, 1, sim.cursor, layer, head, None, False, -1)  # noqa: E731
    labels = lambda panel, layer=1: [label for label, _ in menu_for(panel, view(layer))]  # noqa: E731
    r = sim.frame.routing_for(1)
    assert labels("routing")[0] == f"ablate expert {int(r.expert_ids[0])} at L1 (chosen #0, weight {float(r.weights[0]):.3f})"
    assert any(label.startswith(f"force the next {cfg.top_k} in line at L1") for label in labels("routing"))
    assert labels("routing", layer=0) == [] and "Layer 0 has a dense MLP" in unavailable("routing", view(0))
    assert labels("state", layer=3)[0] == "reset head 1 of KDA layer 2"      # MLA layer 3: the KDA layer below
    assert labels("depth") == ["uniform depth weights at L1", "uniform depth weights everywhere"]
    tokens = sim.frame.position + 1
    assert labels("memory") == [f"MLA layers see only the last 1 token (of {tokens})",
                                f"MLA layers see only the last 4 tokens (of {tokens})"]
    for panel in ("routing", "state", "depth", "memory"):
        for _, changes in menu_for(panel, view(1)):
            sim.what_if(*changes)               # every offered change is valid here
    mla_only = Simulation("k2-tiny", "ab", weights="random", twin=False)
    v = View(mla_only, 1, 1, 1, 0, None, False, -1)
    assert menu_for("state", v) == [] and menu_for("depth", v) == []
    assert unavailable("state", v) == ("Preset 'k2-tiny' has no KDA layers, so there is no recurrent state to "
                                       "reset or rescale.")


def test_branch_timeline_is_the_timeline_before_then_the_branch():
    sim = tiny_sim()
    sim.goto(2)
    w = sim.what_if(AblateExpert(1, int(sim.frames[2].routing_for(1).expert_ids[0])), steps=4)
    b = branch_timeline(sim, w)
    assert [f for f in b.frames[:2]] == sim.frames[:2] and list(b.frames[2:]) == list(w.frames)
    assert b.cursor == 5 and sim.cursor == 2 and len(sim.frames) == 5
    chosen = np.concatenate([f.routing_for(1).expert_ids for f in b.frames])
    assert np.array_equal(b.expert_load(1), np.bincount(chosen, minlength=sim.config.num_experts))
    assert not np.array_equal(b.expert_load(1), sim.expert_load(1, upto=4))   # the ablated expert's tokens moved


# ------------------------------------------------------------------------------------------ Pilot


def reference(changes, step: int, steps: int = WHAT_IF_STEPS):
    sim = tiny_sim()
    assert sim.cursor == step                   # the app opens on the last prompt token, as a fresh Simulation
    return sim.what_if(*changes, steps=steps)


def normal(text: str) -> str:
    return " ".join(text.split())


@sync
async def test_x_on_the_routing_panel_ablates_the_top_expert_and_escape_returns():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        step, layer, frames, cursor = app.step, app.layer, list(app.sim.frames), app.sim.cursor
        main_view = screen_text(app)
        top = int(app.sim.frames[step].routing_for(layer).expert_ids[0])
        await pilot.press("1", "x")
        await pilot.pause()
        assert isinstance(app.screen, WhatIfMenu)
        assert f"ablate expert {top} at L{layer} (chosen #0" in screen_text(app)
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, WhatIfScreen), what="the what-if")
        await settle(pilot)
        w = reference((AblateExpert(layer, top),), step)
        assert same_whatif(app.screen.w, w)
        text = screen_text(app)
        assert f"what if: {describe(AblateExpert(layer, top))}" in text
        for s in range(w.steps):                # the per-step row: step, position, KL, first divergence
            assert f"{s} {step + s} {fmt_kl(w.kl[s])} {w.first_divergence[s] or SAME}" in normal(text)
        assert continuation(w.original) in text and continuation(w.frames) in text
        for (_, tb, pb), (_, ta, pa) in zip(w.top_before[0], w.top_after[0]):
            assert f"'{tb}' {pb:.3f} '{ta}' {pa:.3f}" in normal(text)
        assert f"Routing · layer {layer} (MoE)" in text and "the branch, step 0 of 7" in text
        await pilot.press("n")
        await pilot.pause()
        assert app.screen.step == 1 and "the branch, step 1 of 7" in screen_text(app)
        await pilot.press("escape")
        await settle(pilot)
        assert not isinstance(app.screen, (WhatIfScreen, WhatIfMenu))
        assert app.step == step and app.sim.cursor == cursor and len(app.sim.frames) == len(frames)
        assert all(a is b for a, b in zip(app.sim.frames, frames))
        assert screen_text(app) == main_view


@sync
async def test_x_on_the_state_panel_resets_every_layer_and_draws_the_branch_state():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        step = app.step
        await pilot.press("2", "x")
        await pilot.pause()
        assert "reset every KDA layer" in screen_text(app)
        await pilot.press("down", "down", "enter")          # the third entry: every KDA layer
        await wait_until(pilot, lambda: isinstance(app.screen, WhatIfScreen), what="the what-if")
        await settle(pilot)
        w = reference((ResetState(),), step)
        text = screen_text(app)
        assert "what if: reset state (all layers)" in text and fmt_kl(w.kl[0]) in text
        norm = float(w.frames[0].kda_for(1).state_norm[0])  # the state panel shows KDA layer 1, head 0
        assert f"‖S‖   {norm:.4f}" in text
        await pilot.press("escape")
        await settle(pilot)
        assert app.step == step


@sync
async def test_palette_what_ifs_and_choices_that_do_not_fit():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.start_what_if((TruncateContext(4),), "memory")
        await wait_until(pilot, lambda: isinstance(app.screen, WhatIfScreen), what="the what-if")
        await settle(pilot)
        text = screen_text(app)
        assert "what if: MLA window 4" in text and "Memory ·" in text
        w = reference((TruncateContext(4),), app.step)
        assert w.twin_kl and all(f"{fmt_kl(w.kl[s])} {w.first_divergence[s] or SAME} {fmt_kl(w.twin_kl[s])}"
                                 in normal(text) for s in range(w.steps))   # the twin under the same window
        await pilot.press("escape")
        await settle(pilot)
        app.start_what_if((ResetState(3),))                  # layer 3 is MLA: one sentence, nothing runs
        await settle(pilot)
        text = screen_text(app)
        assert "What-if not run: ResetState: layer 3 is not a KDA layer" in text and "Traceback" not in text
        assert "x on a panel lists the what-ifs that fit this preset" in normal(text)   # what the app offers
        app.select_layer(0)                                  # the dense layer: nothing to route
        await pilot.press("1", "x")
        await pilot.pause()
        assert "Layer 0 has a dense MLP, so nothing is routed there" in normal(screen_text(app))
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, WhatIfMenu)


@sync
async def test_escape_cancels_a_what_if_in_flight():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        frames = list(app.sim.frames)
        gate, real = threading.Event(), app.sim.what_if

        def slow(*changes, at=None, steps=1, progress=None):      # a long what-if: the worker waits here
            assert gate.wait(30)
            return real(*changes, at=at, steps=steps, progress=progress)

        app.sim.what_if = slow
        app.start_what_if((ResetState(),), "state")
        await wait_until(pilot, lambda: app.driver.whatif_running is not None, what="the worker")
        await pilot.pause()
        assert "what-if (reset state (all layers)) at step 4: token 0/8" in screen_text(app)
        await pilot.press("escape")
        await pilot.pause()
        assert "what-if cancelled; the timeline is as it was" in screen_text(app)
        gate.set()
        await settle(pilot)
        assert not isinstance(app.screen, WhatIfScreen) and app.driver.whatif_running is None
        assert all(a is b for a, b in zip(app.sim.frames, frames)) and len(app.sim.frames) == len(frames)
        assert app.step == 4 and app.driver.whatif is None and "what-if (" not in screen_text(app)


def test_fmt_kl_keeps_real_moves_and_hides_float32_noise():
    assert fmt_kl(0.0) == "0"
    assert fmt_kl(1.5e-5) == "1.5e-05" and fmt_kl(2.2616) == "2.26"
    assert fmt_kl(4.62e-10) == fmt_kl(4.61e-10) == "<1e-6"     # two machines' rounding read the same


def summary_text(w, sim) -> str:
    from rich.console import Console

    from tui_app.whatif_screen import summary

    console = Console(width=200, record=True, color_system=None)
    console.print(summary(w, 0, None, sim))
    return " ".join(console.export_text().split())


@sync
async def test_a_twin_has_no_twin_of_its_own_and_says_so():
    """Issue 35: on small-twin the "twin" beside it was another all-MLA model with random weights, so `c` and the
    what-if's "twin KL" compared against noise without a word. Now c refuses and says where a twin is, the state
    panel says what small-twin is, and the what-if leaves the twin KL out with the reason."""
    app = make_app(preset="small-twin", prompt="k=7; k=")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("c")
        await settle(pilot)
        assert not app.compare and "compare: hybrid" not in screen_text(app)
        assert normal(str(app.message)) == ("c: small-twin is itself the all-MLA twin of small, so it has no twin of "
                                            "its own; p → small compares the hybrid with it.")
        assert "small-twin is the all-MLA twin of small: it has no KDA layers" in normal(app._panels["state"].text)
    # the what-if's twin KL on a preset that is all MLA already (k2-tiny: no conv tails, so windows run on it)
    sim = Simulation("k2-tiny", PROMPT, seed=0, weights="random")
    w = sim.what_if(TruncateContext(2), steps=2)
    assert w.twin_kl                                   # the library computed one against the random "twin" ...
    text = summary_text(w, sim)
    assert "twin KL" not in text.replace("no twin KL", "")          # ... and the screen does not show it
    assert "no twin KL: k2-tiny has no KDA layers: it is all MLA already, so there is no all-MLA twin" in text


def test_a_twin_with_random_weights_beside_a_trained_hybrid_is_named_so():
    sim = tiny_sim()
    w = sim.what_if(TruncateContext(2), steps=2)
    assert w.twin_kl
    plain = summary_text(w, sim)                       # random beside random: the twin is just "the twin"
    assert "twin KL" in plain and "random-weight" not in plain
    sim.weights, sim.twin_weights = "trained", "random"    # as small-kda runs: trained, no twin ships
    text = summary_text(w, sim)
    assert "random-weight twin KL" in text and "the random-weight twin's KL under the same window" in text
    assert "the twin has random weights (no trained twin ships for tiny): its KL compares against noise" in text
