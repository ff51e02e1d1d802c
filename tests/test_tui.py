"""The TUI, driven headless with Pilot: what a learner sees after each key (numbers and labels), the
small-terminal message, the bad-prompt path, and three fixed-size snapshots (tiny preset, seed 0)."""

import asyncio
import io
import time

import numpy as np
from rich.console import Console

from sim import Simulation
from sim.memory import format_bytes
from tui import MIN_HEIGHT, MIN_WIDTH, HelpScreen, PresetScreen, PromptScreen, TinyK3App, main
from tui_widgets import Timeline

SIZE = (160, 48)
PROMPT = "k=7;"          # BOS + 4 bytes: 5 prompt frames, the cursor starts on frame 4


def screen_text(app) -> str:
    """The screen as plain text, exactly what the compositor would paint."""
    w, h = app.size
    console = Console(width=w, height=h, file=io.StringIO(), record=True, force_terminal=True,
                      color_system="truecolor", legacy_windows=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


async def settle(pilot, timeout: float = 120.0) -> None:
    """Wait until no worker runs or waits and every change is drawn (look-ahead included)."""
    app = pilot.app
    deadline = time.monotonic() + timeout
    calm = 0
    while calm < 2:
        assert time.monotonic() < deadline, "the app did not settle"
        await pilot.pause()
        await app.workers.wait_for_complete()
        calm = calm + 1 if app.idle and app.timeline is not None else 0
        await asyncio.sleep(0.01)
    await pilot.pause()


def sync(test):
    """Run an async Pilot test with asyncio.run (no pytest-asyncio needed)."""
    def wrapper(*args, **kwargs):
        asyncio.run(test(*args, **kwargs))

    wrapper.__name__, wrapper.__doc__ = test.__name__, test.__doc__
    return wrapper


def make_app(**kwargs) -> TinyK3App:
    # random weights: retraining the shipped checkpoints must not change what these tests see
    kwargs = {"preset": "tiny", "prompt": PROMPT, "seed": 0, "weights": "random", "show_timings": False, **kwargs}
    return TinyK3App(**kwargs)


@sync
async def test_opens_steps_forward_and_back():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.step == 4 and app.timeline.prompt_len == 5
        text = screen_text(app)
        assert "2 of 112 experts = 1.8% of expert parameters active" in text
        assert "step 4/4" in text and "tiny" in text and "random init, seed 0" in text
        assert "Routing · layer 1 (MoE)" in text and "KDA layer 1 · head 0" in text
        first = app.timeline.frames[4]
        assert f"input '{first.input_text}' → '{first.token_text}'" in text

        await pilot.press("n")
        await settle(pilot)
        assert app.step == 5
        text = screen_text(app)
        assert "step 5/5" in text
        # the token predicted at step 4 is the input of step 5
        assert f"input '{first.token_text}'" in text
        frame = app.timeline.frames[5]
        assert "Memory · 6 tokens" in text
        assert format_bytes(frame.memory.twin_kv_bytes) in text

        await pilot.press("n", "n")
        await settle(pilot)
        assert app.step == 7
        await pilot.press("b")
        await settle(pilot)
        assert app.step == 6 and "step 6/7" in screen_text(app)
        # back then forward replays the same frame: nothing is recomputed
        before = len(app.timeline)
        await pilot.press("n")
        await settle(pilot)
        assert app.step == 7 and app.timeline.frames[7] is app.sim.frames[7]
        assert len(app.timeline) == before

        app.goto_step(0)
        await pilot.press("b")
        await settle(pilot)
        assert app.step == 0 and "already at the first token" in screen_text(app)


@sync
async def test_layer_head_and_panel_selection():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.layer == 1 and app.focused.id == "routing"
        await pilot.press("j")
        await settle(pilot)
        text = screen_text(app)
        assert "Routing · layer 2 (MoE)" in text and "KDA layer 2 · head 0" in text
        await pilot.press("j")                          # layer 3 is gated MLA: the state panel says so
        await settle(pilot)
        text = screen_text(app)
        assert "layer 3 (MLA · MoE)" in text and "layer 3 is gated MLA" in text and "KDA layer 2" in text
        await pilot.press("j")                          # wraps to layer 0: dense, nothing to route
        await settle(pilot)
        text = screen_text(app)
        assert app.layer == 0 and "Routing · layer 0 (dense)" in text and "dense SiTU-GLU" in text
        await pilot.press("k", "h")
        await settle(pilot)
        assert app.layer == 3 and app.head == 1
        await pilot.press("k")
        await settle(pilot)
        text = screen_text(app)
        assert "KDA layer 2 · head 1" in text
        rec = app.timeline.frames[app.step].kda_for(2)
        assert f"‖S_t - Diag(α) S_t-1‖ = {float(rec.correction_norm[1]):.4f}" in text
        assert f"‖S‖ = {float(rec.state_norm[1]):.4f}" in text

        await pilot.press("tab")
        assert app.focused.id == "state"
        await pilot.press("3")
        assert app.focused.id == "depth"
        await pilot.press("z")
        assert app.screen.maximized is app.query_one("#depth")
        await pilot.press("z")
        assert app.screen.maximized is None


@sync
async def test_step_into_a_token_and_out():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("i")
        await settle(pilot)
        text = screen_text(app)
        assert app.sub == 3 and "inside token ';'" in text and "▶   3  L1 attn · KDA" in text
        await pilot.press("j")
        await settle(pilot)
        text = screen_text(app)
        ids = app.timeline.frames[4].routing_for(1).expert_ids
        assert "▶   4  L1 mlp · MoE" in text and "experts    " + " ".join(map(str, ids)) in text
        await pilot.press("j", "j", "j", "j", "j")     # to the head: the top next tokens
        await settle(pilot)
        text = screen_text(app)
        assert app.sub == 9 and "▶   9  head" in text and "next" in text and "cur" not in text.split("head")[-1][:0]
        await pilot.press("n")                          # the next token keeps the learner inside
        await settle(pilot)
        assert app.step == 5 and app.sub == 9 and "inside token" in screen_text(app)
        await pilot.press("o")
        await settle(pilot)
        assert app.sub == -1 and "inside token" not in screen_text(app)


@sync
async def test_compare_mode_and_palette():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("c")
        await settle(pilot)
        text = screen_text(app)
        assert "compare: hybrid vs twin" in text and "compare: bytes per layer, hybrid vs twin" in text
        assert "also chosen for the previous token" in text
        await pilot.press("c")
        await settle(pilot)
        assert "compare:" not in screen_text(app)

        await pilot.press("ctrl+p")
        await pilot.press(*"layer 2")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await settle(pilot)
        assert app.layer == 2
        await pilot.press("ctrl+p")
        await pilot.press(*"expert 100")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await settle(pilot)
        r = app.timeline.frames[app.step].routing_for(2)
        assert app.expert == 100 and f"expert 100: score {float(r.scores[100]):.3f}" in screen_text(app)


@sync
async def test_run_pause_and_unknown_keys():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        state = (app.step, app.layer, app.head, app.sub, app.compare, app.running, app.expert)
        before = screen_text(app)
        await pilot.press("x", "X", "%", "f5", "ctrl+t", "9")
        await settle(pilot)
        assert (app.step, app.layer, app.head, app.sub, app.compare, app.running, app.expert) == state
        assert screen_text(app) == before

        await pilot.press("r")
        deadline = time.monotonic() + 60
        while app.step < 8:
            assert time.monotonic() < deadline, "running did not advance"
            await pilot.pause(0.05)
        await pilot.press("r")
        await settle(pilot)
        stopped = app.step
        assert not app.running and "running" not in screen_text(app)
        await pilot.pause(0.3)
        assert app.step == stopped


@sync
async def test_bad_prompt_keeps_the_session_then_a_good_one_replaces_it():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        timeline, step = app.timeline, app.step
        for bad, says in (("", "the prompt is empty"), ("x" * 600, "allows 512 tokens")):
            await pilot.press("e")
            assert isinstance(app.screen, PromptScreen)
            app.screen.query_one("Input").value = bad
            await pilot.press("enter")
            await settle(pilot)
            text = screen_text(app)
            assert "Not loaded:" in text and says in text and "kept the current session" in text
            assert app.timeline is timeline and app.step == step and app.prompt == PROMPT
        await pilot.press("e")
        app.screen.query_one("Input").value = "ab"
        await pilot.press("enter")
        await settle(pilot)
        assert app.prompt == "ab" and app.step == 2 and app.timeline is not timeline
        assert "Not loaded" not in screen_text(app)
        await pilot.press("e", "escape")               # cancelling changes nothing
        await settle(pilot)
        assert app.prompt == "ab" and not isinstance(app.screen, PromptScreen)


@sync
async def test_switch_preset_to_the_896_expert_grid():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("p")
        assert isinstance(app.screen, PresetScreen)
        await pilot.press("up", "enter")               # the list is in preset order: ..., small, tiny
        await settle(pilot)
        text = screen_text(app)
        assert app.preset == "small" and app.config.num_experts == 896
        assert "16 of 896 experts = 1.8% of expert parameters active" in text and "small" in text
        await pilot.press("?")
        assert isinstance(app.screen, HelpScreen) and "step into / out" in screen_text(app)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


@sync
async def test_small_terminal_message_and_recovery():
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert f"needs at least {MIN_WIDTH} x {MIN_HEIGHT}" in text and "this one is 80 x 24" in text
        assert "Routing" not in text
        await pilot.resize_terminal(*SIZE)
        await settle(pilot)
        text = screen_text(app)
        assert "Terminal too small" not in text and "Routing · layer 1" in text
        await pilot.press("n")                          # and the session kept working meanwhile
        await settle(pilot)
        assert app.step == 5


def test_timeline_histories_stay_exact_over_thousands_of_steps():
    """The per-step index the panels read equals a direct recount, at step 3000 as at step 3."""
    sim = Simulation("tiny", PROMPT, seed=0)
    sim.run(11)
    timeline = Timeline(sim.config, sim.prompt_len)
    frames = sim.frames * (3000 // len(sim.frames) + 1)
    for f in frames[:3000]:
        timeline.append(f)
    cfg = sim.config
    for upto in (0, 7, 2999):
        for layer in cfg.moe_layers:
            ids = np.concatenate([f.routing_for(layer).expert_ids for f in frames[:upto + 1]])
            load = timeline.expert_load(layer, upto)
            assert load.sum() == (upto + 1) * cfg.top_k
            np.testing.assert_array_equal(load, np.bincount(ids, minlength=cfg.num_experts))
        norms = [f.kda_for(0).state_norm[1] for f in frames[:upto + 1]]
        np.testing.assert_array_equal(timeline.state_norms(0, 1, upto), norms)
        mem = timeline.memory(upto)
        assert mem["twin_kv_bytes"].tolist() == [f.memory.twin_kv_bytes for f in frames[:upto + 1]]


def test_main_refuses_an_unknown_preset(capsys):
    assert main(["--preset", "nope"]) == 2
    assert "valid presets are" in capsys.readouterr().err
    assert TinyK3App().preset == "small" and TinyK3App().prompt


# ------------------------------------------------------------------------------------------ snapshots


def test_snapshot_default_view(snap_compare):
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=settle)


def test_snapshot_stepped_in_compare(snap_compare):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("n", "i", "j", "c")
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)


def test_snapshot_small_terminal(snap_compare):
    assert snap_compare(make_app(), terminal_size=(100, 30), run_before=settle)
