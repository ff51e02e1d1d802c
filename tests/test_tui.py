"""The TUI, driven headless with Pilot: what a learner sees after each key (numbers and labels), the
compact, full and too-small layouts, loading (progress, cancel, quit), saving, and fixed-size snapshots
(tiny preset, random init, seed 0)."""

import dataclasses
import threading
import time

import numpy as np
import pytest

import sim as sim_pkg
from sim.memory import cache_bytes, crossover_tokens, format_bytes
from tiny_k3.tokenizer import token_text
from tiny_k3.weights import CheckpointError
from tui import TinyK3App
from tui_app import FULL_HEIGHT, FULL_WIDTH, MIN_HEIGHT, MIN_WIDTH
from tui_app.commands import K3Commands
from sim import Simulation
from tiny_k3.config import DEFAULT_PROMPT, K3Config
from tiny_k3.tokenizer import encode
from tui_app.driver import Driver
from tui_app.footer import K3Footer
from sim.render import memory_table
from tui_app.panels import View, routing_headline
from tui_app.screens import HelpScreen, PresetScreen, PromptScreen
from tui_app.whatif_screen import fmt_kl
from tui_pilot import PROMPT, make_app, screen_text, settle, sync, wait_until

SIZE = (160, 48)
SMALL = K3Config.runnable_presets().index("small")


@sync
async def test_opens_steps_forward_and_back():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.step == 4 and app.sim.prompt_len == 5
        text = screen_text(app)
        assert "2 of 112 experts = 1.8% of expert parameters active" in text
        assert "step 4/4" in text and "tiny" in text and "random init, seed 0" in text
        assert "Routing · layer 1 (MoE)" in text and "KDA layer 1 · head 0" in text
        first = app.sim.frames[4]
        assert f"input '{first.input_text}' → '{first.token_text}'" in text

        await pilot.press("n")
        await settle(pilot)
        assert app.step == 5
        text = screen_text(app)
        assert "step 5/5" in text and f"input '{first.token_text}'" in text   # step 4's choice is step 5's input
        assert "Memory · 6 tokens" in text
        assert format_bytes(app.sim.frames[5].memory.twin_kv_bytes) in text

        await pilot.press("n", "n")
        await settle(pilot)
        assert app.step == 7
        await pilot.press("b")
        await settle(pilot)
        assert app.step == 6 and "step 6/7" in screen_text(app)
        before = len(app.sim.frames)                    # back then forward replays: nothing is recomputed
        frame7 = app.sim.frames[7]
        await pilot.press("n")
        await settle(pilot)
        assert app.step == 7 and app.sim.frames[7] is frame7 and len(app.sim.frames) == before

        app.goto_step(0)
        await pilot.press("b")
        await settle(pilot)
        text = screen_text(app)
        assert app.step == 0 and "already at the first token; n goes forward" in text
        assert "Memory · 1 token " in text and "load over 1 token " in text    # never "1 tokens"


@sync
async def test_layers_stop_at_the_ends_and_say_so():
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
        await pilot.press("j")                          # the last layer: no silent wrap to 0
        await settle(pilot)
        assert app.layer == 3 and "already at the last layer (3); k goes back" in screen_text(app)
        await pilot.press("k", "k", "k", "k")
        await settle(pilot)
        text = screen_text(app)
        assert app.layer == 0 and "already at the first layer (0)" in text
        assert "Routing · layer 0 (dense)" in text and "dense SiTU-GLU" in text
        routing = app.query_one("#routing").text
        assert "experts = 1.8% of expert parameters active" not in routing   # a dense layer has no active experts
        await pilot.press("j", "j", "h")
        await settle(pilot)
        rec = app.sim.frames[app.step].kda_for(2)
        text = screen_text(app)
        assert app.head == 1 and "KDA layer 2 · head 1" in text
        assert f"write {float(rec.correction_norm[1]):.4f}" in text
        assert f"‖S‖   {float(rec.state_norm[1]):.4f}" in text


@sync
async def test_step_into_a_token_and_out():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("i")
        await settle(pilot)
        text = screen_text(app)
        assert app.sublayer_index == 3 and "inside token ';'" in text and "▶   3  L1 attn · KDA" in text
        await pilot.press("j")
        await settle(pilot)
        text = screen_text(app)
        ids = app.sim.frames[4].routing_for(1).expert_ids
        assert "▶   4  L1 mlp · MoE" in text and "experts    " + " ".join(map(str, ids)) in text
        # L1 mlp is sublayer 3 of the stream: block size 2 -> emb, b1 and the open block's partial sum
        depth = app.query_one("#depth").text
        weights = app.sim.frames[4].depth[3].weights
        lines = depth.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("AttnRes"))
        rows = [line.split()[:2] for line in lines[at + 1:at + 4]]
        assert rows == [[n, f"{w:.3f}"] for n, w in zip(("emb", "b1", "partial"), weights)]
        await pilot.press("j", "j", "j", "j", "j")      # to the head: the top next tokens
        await settle(pilot)
        head = app.query_one("#depth").text
        top = app.sim.frames[4]
        assert app.sublayer_index == 9 and "▶   9  head" in head
        assert f"'{token_text(int(top.top_ids[0]))}' {float(top.top_probs[0]):.2f}" in head
        await pilot.press("j")
        await settle(pilot)
        assert app.sublayer_index == 9 and "already at the head, the last sublayer" in screen_text(app)
        await pilot.press("n")                          # the next token keeps the learner inside
        await settle(pilot)
        assert app.step == 5 and app.sublayer_index == 9 and "inside token" in screen_text(app)
        await pilot.press("o")
        await settle(pilot)
        assert app.sublayer_index == -1 and "inside token" not in screen_text(app)


@sync
async def test_depth_panel_names_its_columns_and_scale():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        depth = app.query_one("#depth")
        text = depth.text
        assert "emb embedding · bN block sums · partial the open block" in " ".join(text.split())
        assert "Depth · AttnRes weights" in screen_text(app)
        assert "weight ██ 0 ██ 0.05 ██ 0.25 ██ 0.5 ██ 1" in text       # the colour key, with its numbers
        header = next(line for line in text.splitlines() if "partial" in line and "emb" in line and "b1" in line)
        assert header.split() == ["emb", "b1", "b2", "b3", "b4", "partial"]   # tiny: 8 sublayers, blocks of 2


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

        titles = [t for t, _, _ in K3Commands(app.screen)._commands("layer 2")]
        assert titles.count("Go to layer 2") == 1 and len(titles) == len(set(titles))
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
        r = app.sim.frames[app.step].routing_for(2)
        assert app.expert == 100 and f"expert 100: score {float(r.scores[100]):.3f}" in screen_text(app)


@sync
async def test_run_pause_and_unknown_keys():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        state = (app.step, app.layer, app.head, app.sublayer_index, app.compare, app.running, app.expert)
        before = screen_text(app)
        await pilot.press("X", "%", "f5", "ctrl+t", "9")
        await settle(pilot)
        assert (app.step, app.layer, app.head, app.sublayer_index, app.compare, app.running, app.expert) == state
        assert screen_text(app) == before

        await pilot.press("r")
        await wait_until(pilot, lambda: app.step >= 8, 60, "running")
        await pilot.press("r")
        await settle(pilot)
        stopped = app.step
        assert not app.running and "running" not in screen_text(app)
        await pilot.pause(0.3)
        assert app.step == stopped


@sync
async def test_memory_panel_states_the_crossover_and_r_pauses_there():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        cfg = app.config
        # the first token count where the hybrid's bytes are below the twin's, by a plain scan
        first = next(n for n in range(1, 10_000) if sum(cache_bytes(cfg, n)) < sum(cache_bytes(cfg.twin(), n)))
        assert crossover_tokens(cfg) == first
        memory = app.query_one("#memory").text
        assert f"hybrid larger until token {first} (now 5); r: watch it cross" in memory
        assert "twin ÷ hybrid" in memory and "K3 at 1M" in memory
        fixed = memory.splitlines()[0]                     # the fixed state, first line, above the fold
        assert fixed.startswith("state fixed at ") and "the same at 1 token and at 1M" in fixed

        await pilot.press("r")
        await wait_until(pilot, lambda: not app.running, 120, "the r demo")
        await settle(pilot)
        assert app.sim.frames[app.step].position + 1 == first
        text = screen_text(app)
        assert f"token {first}: the all-MLA twin's cache" in text
        assert f"hybrid smaller since token {first}" in app.query_one("#memory").text
        m = app.sim.frames[app.step].memory
        assert m.twin_kv_bytes > m.total_bytes                              # measured: it really crossed


@sync
async def test_bad_prompt_keeps_the_session_then_a_good_one_replaces_it():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        sim, step = app.sim, app.step
        for bad, says in (("", "the prompt is empty"), ("x" * 600, "allows 512 tokens")):
            await pilot.press("e")
            assert isinstance(app.screen, PromptScreen)
            app.screen.query_one("Input").value = bad
            await pilot.press("enter")
            await wait_until(pilot, lambda: app.driver.loading is None)
            await settle(pilot)
            text = screen_text(app)
            assert "Not loaded:" in text and says in text
            assert "the current session stays; e for another prompt, p for another preset" in " ".join(text.split())
            assert app.sim is sim and app.step == step and app.prompt == PROMPT
        await pilot.press("e")
        app.screen.query_one("Input").value = "a\nb"
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.sim is not sim)
        await settle(pilot)
        assert app.prompt == "a\nb" and app.step == 3
        assert "Not loaded" not in screen_text(app)
        app.goto_step(2)                                # the input of frame 2 is the newline
        await settle(pilot)
        text = screen_text(app)
        assert "input '\\n' → 'b'" in text and "'\\\\n'" not in text     # shown escaped once, not twice
        await pilot.press("e", "escape")               # cancelling changes nothing
        await settle(pilot)
        assert app.prompt == "a\nb" and not isinstance(app.screen, PromptScreen)


@sync
async def test_preset_dialog_opens_on_the_current_preset_and_enter_alone_changes_nothing():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        sim = app.sim
        await pilot.press("p")
        assert isinstance(app.screen, PresetScreen)
        text = screen_text(app)
        assert "tiny " in text and "(current)" in text
        assert app.screen.query_one("OptionList").highlighted_option.id == "tiny"   # the current one
        await pilot.press("enter")                     # p, Enter (or a double Enter): nothing changes
        await settle(pilot)
        assert not isinstance(app.screen, PresetScreen) and app.driver.loading is None
        assert app.sim is sim and app.preset == "tiny"
        assert "still on tiny: p, then ↑ ↓ to another preset and Enter, switches" in screen_text(app)
        await pilot.press("p", "down")                 # one down is the next preset: ↑ ↓ then Enter switch
        names = [app.screen.query_one("OptionList").get_option_at_index(i).id
                 for i in range(app.screen.query_one("OptionList").option_count)]
        assert app.screen.query_one("OptionList").highlighted_option.id == names[names.index("tiny") + 1]
        app.screen.query_one("OptionList").highlighted = SMALL      # ... the list is in preset order
        assert app.screen.query_one("OptionList").highlighted_option.id == "small"
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.preset == "small")
        await settle(pilot)
        text = screen_text(app)
        assert app.config.num_experts == 896 and "16 of 896 experts = 1.8% of expert parameters active" in text
        await pilot.press("?")
        assert isinstance(app.screen, HelpScreen) and "step into / out" in screen_text(app)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


@pytest.mark.parametrize("size", [(MIN_WIDTH, MIN_HEIGHT), (FULL_WIDTH, FULL_HEIGHT)], ids=["80x24", "120x36"])
@sync
async def test_the_state_panel_keeps_its_decay_beta_and_colour_key_on_screen(size):
    """Issue 35: at 80x24 the state panel cut off its decay and beta lines. The default prompt (a recall query,
    whose notes take lines too) on small's 32 x 32 state: decay and beta are on screen, and at 80x24, where the
    numbers sit beside the heatmap, the colour key's numbers too."""
    from sim import render_cells
    from tui_app.keys import number

    app = make_app(preset="small", prompt=None)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        await pilot.press("2")                          # the state panel (the one shown at 80x24)
        await settle(pilot)
        view = app.view()
        rec = view.frame.kda_for(view.kda_layer)
        scale = render_cells.robust_scale(rec.state[view.kda_head].astype(np.float32))
        text = screen_text(app)
        assert "decay α" in text and "beta β" in text and f"{float(rec.beta[view.kda_head]):.3f}" in text
        key = f"{number(-scale)} " in text and f" {number(scale)}" in text     # the colour key's numbers
        assert key or size != (MIN_WIDTH, MIN_HEIGHT)   # at 120x36 the panel is 33 columns: the key is below, scrolled


@sync
async def test_compact_layout_at_80x24():
    app = make_app()
    async with app.run_test(size=(MIN_WIDTH, MIN_HEIGHT)) as pilot:
        await settle(pilot)
        assert app.layout_mode == "compact"
        text = screen_text(app)
        ids = " ".join(map(str, app.sim.frames[4].routing_for(1).expert_ids))
        assert f"layer 1: 2 of 112 experts (1.8%) → {ids}" in text         # the routing headline
        assert "1 Routing" in text and "4 Memory" in text and "Routing · layer 1 (MoE)" in text
        assert "q quit" in text and "? help" in text and "Memory ·" not in text
        await pilot.press("4")
        await settle(pilot)
        text = screen_text(app)
        assert "Memory · 5 tokens" in text and "Routing · layer" not in text
        assert f"layer 1: 2 of 112 experts (1.8%) → {ids}" in text         # always visible
        await pilot.press("tab")
        await settle(pilot)
        assert "Routing · layer 1 (MoE)" in screen_text(app)               # tab wraps to the first panel
        app._set_message("line one\nline two of a two-line message")
        await settle(pilot)
        text = screen_text(app)
        assert "line two" in text and "q quit" in text                     # the footer stays on screen
        await pilot.press("e")
        assert "Escape cancels." in screen_text(app)                        # the dialog's label is not cut
        await pilot.press("escape")


@sync
async def test_full_layout_at_120x36_cuts_nothing_important():
    app = make_app(preset="small", prompt=None)        # the default preset and prompt, random weights
    async with app.run_test(size=(FULL_WIDTH, FULL_HEIGHT)) as pilot:
        await settle(pilot)
        assert app.layout_mode == "full"
        text = screen_text(app)
        for must in ("Tokens", "Routing · layer 1 (MoE)", "16 of 896 experts", "KDA layer 1 · head 0",
                     "Depth · AttnRes weights", "state fixed at 63.0 KB", f"hybrid larger until token {crossover_tokens(app.config)}",
                     "twin ÷ hybrid", "K3 at 1M", "c compare", "z zoom", "q quit",
                     f"step {len(encode(DEFAULT_PROMPT)) - 1}/"):
            assert must in text, must


@sync
async def test_too_small_then_recovery():
    app = make_app()
    async with app.run_test(size=(70, 20)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert f"needs at least {MIN_WIDTH} x {MIN_HEIGHT}" in text and "this one is 70 x 20" in text
        assert "Routing" not in text
        await pilot.resize_terminal(*SIZE)
        await settle(pilot)
        text = screen_text(app)
        assert "Terminal too small" not in text and "Routing · layer 1" in text
        await pilot.press("n")                          # and the session kept working meanwhile
        await settle(pilot)
        assert app.step == 5


@sync
async def test_panels_draw_at_the_width_their_scrollbars_leave():
    """A vertical scrollbar that comes or goes redraws the panel at the width left, so no panel keeps lines
    of the old width (a stray horizontal scrollbar, a row of content hidden under it)."""
    app = make_app()
    async with app.run_test(size=(FULL_WIDTH, FULL_HEIGHT)) as pilot:
        await settle(pilot)
        for name, panel in app._panels.items():
            region = panel.scrollable_content_region
            assert panel.virtual_size.width == region.width and not panel.show_horizontal_scrollbar, name
            assert panel.show_vertical_scrollbar == (panel.virtual_size.height > region.height), name


@sync
async def test_panels_redraw_on_unzoom():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("z")
        await settle(pilot)
        text = screen_text(app)
        assert app.zoomed and "Routing · layer 1 (MoE)" in text and "Memory ·" not in text
        assert "step 4/4" in text                       # the status stays
        await pilot.press("n", "n", "n")
        await settle(pilot)
        await pilot.press("z")
        await settle(pilot)
        text = screen_text(app)
        assert not app.zoomed and "Memory · 8 tokens" in text     # not the 5 tokens from before the zoom
        rec = app.sim.frames[7].kda_for(1)
        assert f"‖S‖   {float(rec.state_norm[0]):.4f}" in text


def gated_builder(gate: threading.Event, started: threading.Event):
    """A make_sim for the Driver that waits for `gate` before building (a slow checkpoint, a big preset)."""
    def make_sim(preset, prompt, **kw):
        started.set()
        assert gate.wait(30)
        return sim_pkg.Simulation(preset, prompt, **kw)

    return make_sim


@sync
async def test_loading_line_at_once_then_status_says_what_is_loaded():
    gate, started = threading.Event(), threading.Event()
    app = make_app()
    app.driver = Driver(make_sim=gated_builder(gate, started))
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, started.is_set)
        await pilot.pause(0.1)
        text = screen_text(app)
        assert "loading tiny (random init, seed 0): building the model … · Esc cancels" in text
        gate.set()
        await settle(pilot)
        assert "random init, seed 0" in screen_text(app) and "loading" not in screen_text(app)
        await pilot.press("p")
        app.screen.query_one("OptionList").highlighted = SMALL
        gate.clear()
        started.clear()
        app.driver._make_sim = gated_builder(gate, started)
        await pilot.press("enter")                      # small, with its trained weights (weights="random" here)
        await wait_until(pilot, started.is_set)
        await pilot.pause(0.1)
        assert "loading small (random init, seed 0): building the model" in screen_text(app)
        assert "tiny" in screen_text(app)               # the old session stays on screen meanwhile
        gate.set()
        await wait_until(pilot, lambda: app.preset == "small")


@sync
async def test_status_after_a_corrupt_checkpoint():
    def make_sim(preset, prompt, **kw):
        if kw["weights"] != "random":
            raise CheckpointError("checkpoint small.safetensors is corrupt or unreadable (SafetensorError).")
        return sim_pkg.Simulation(preset, prompt, **kw)

    app = make_app(preset="small", weights="auto")
    app.driver = Driver(make_sim=make_sim)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.sim.weights == "random"
        status = app.query_one("#status").render()
        assert "random init, seed 0 (fallback: checkpoint small.safetensors is corrupt" in str(status)


@sync
async def test_trained_weights_are_named_in_the_status():
    app = make_app(preset="small", weights="auto")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.sim.weights == "trained"
        assert "trained checkpoint small.safetensors" in str(app.query_one("#status").render())


LONG = "the quick brown fox jumps over the lazy dog; " * 6     # 270 bytes: minutes of k3-topo prefill


@sync
async def test_escape_cancels_a_k3_topo_prefill_and_a_new_prompt_replaces_a_load():
    app = make_app(preset="k3-topo", prompt=LONG)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.driver.progress is not None, 120, "the prefill")
        first = app.driver.loading
        text = screen_text(app)
        assert f"/{len(LONG) + 1} tokens" in text and "Esc cancels" in text
        assert "timing the first tokens" in text or "tokens/s" in text     # no time left from the first token
        await pilot.press("escape")
        assert first.flag.observed.wait(30)             # the worker saw the flag between two tokens
        await pilot.pause(0.1)
        text = screen_text(app)
        assert "load cancelled; nothing loaded" in text and app.driver.loading is None and app.sim is None

        app.load_session(prompt=LONG)                   # a new load, then another prompt before it is done
        await wait_until(pilot, lambda: app.driver.progress is not None, 120, "the second prefill")
        second = app.driver.loading
        app.load_session(preset="tiny", prompt="ab")
        assert second.flag.observed.wait(30)
        await settle(pilot)
        assert app.preset == "tiny" and app.prompt == "ab" and app.step == 2


@sync
async def test_quit_during_a_k3_topo_prefill_stops_the_worker():
    app = make_app(preset="k3-topo", prompt=LONG)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.driver.progress is not None, 120, "the prefill")
        ticket = app.driver.loading
        pressed = time.monotonic()
        await pilot.press("q")
    exited = time.monotonic() - pressed
    assert ticket.flag.observed.wait(30)                # the prefill stopped at its next token
    assert exited < 10                                  # generous: the app does not wait for the prefill


@sync
async def test_quick_quit_then_keys_never_traceback():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q", "e", "p", "n", "s")
        app.action_edit_prompt()
        app.action_preset()
        app.action_next()
        app._draw()
    assert app.return_code in (0, None) and app._exception is None


@sync
async def test_context_limit_says_why():
    app = make_app(lookahead=0)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        # a context of 8 positions instead of tiny's 512: the same rule, without a 500-token prefill
        app.sim.config = dataclasses.replace(app.sim.config, max_seq_len=8)
        for _ in range(3):
            await pilot.press("n")
            await settle(pilot)
        assert app.step == 7 and len(app.sim.frames) == 8
        await pilot.press("n")
        assert "n: the context is full: preset 'tiny' holds 8 tokens" in screen_text(app)
        await pilot.press("r")
        assert "r: the context is full" in screen_text(app) and not app.running


@sync
async def test_save_then_open_at_the_same_step(tmp_path):
    app = make_app(save_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("n", "n", "n", "b")
        await settle(pilot)
        await pilot.press("s")
        await wait_until(pilot, lambda: list(tmp_path.glob("*.npz")) and "saved at step" in str(app.message))
        saved_frames = list(app.sim.frames)
        assert "saved at step 6" in screen_text(app)
    (path,) = tmp_path.glob("*.npz")
    assert path.name.startswith("tiny-k3-tiny-")
    reopened = TinyK3App(open_path=str(path), show_timings=False)
    async with reopened.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert reopened.step == 6 and reopened.preset == "tiny" and reopened.prompt == PROMPT
        assert all(a.same_as(b) for a, b in zip(reopened.sim.frames, saved_frames))
        assert "step 6/6" in screen_text(reopened) and "random init, seed 0" in screen_text(reopened)
        await pilot.press("n")                          # it steps on from there
        await settle(pilot)
        assert reopened.step == 7 and reopened.sim.frames[7].same_as(saved_frames[7])


@sync
async def test_held_n_while_a_step_computes_coalesces():
    app = make_app(lookahead=0)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        gate = threading.Event()
        real_step = app.sim.step
        calls = []

        def slow_step(*args, **kwargs):
            calls.append(1)
            assert gate.wait(30)
            return real_step(*args, **kwargs)

        app.sim.step = slow_step                       # the next token takes as long as the test wants
        await pilot.press(*["n"] * 40)                  # a held key
        assert app.driver.goal == 5 and len(calls) == 1 and "computing step 5" in screen_text(app)
        gate.set()
        await settle(pilot)
        assert app.step == 5 and len(calls) == 1 and len(app.sim.frames) == 6     # one step, not forty


def test_every_runnable_preset_draws_its_first_frame():
    """Each panel draws without its error line on every preset's first frame (no Textual needed for the View)."""
    for name in K3Config.runnable_presets():
        if name == "k3-topo":
            continue                                   # covered by the k3-topo load tests above
        s = Simulation(name, "ab", weights="random")
        v = View(s, 1, 2, s.config.moe_layers[0] if s.config.moe_layers else 0, 0, None, False, -1)
        assert f"{s.config.top_k} of {s.config.num_experts} experts" in routing_headline(v).plain
        table = memory_table(v.frame, s.config, 0)
        assert [c.header for c in table.columns] == ["", "hybrid", "twin", "twin ÷ hybrid"]
        crossing = crossover_tokens(s.config)
        if s.config.kda_layers:                        # fixed states: the growing twin overtakes them somewhere
            assert crossing is not None and crossing > 0, name
        else:                                          # all MLA (k2-tiny): the model is its own twin
            assert crossing is None, name


# ------------------------------------------------------------------------------------------ snapshots


def test_snapshot_default_view(snap_compare):
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=settle)


def test_snapshot_stepped_in_compare(snap_compare):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("n", "i", "j", "c")
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)


def test_snapshot_compact_80x24(snap_compare):
    assert snap_compare(make_app(), terminal_size=(MIN_WIDTH, MIN_HEIGHT), run_before=settle)


def test_snapshot_full_120x36(snap_compare):
    assert snap_compare(make_app(), terminal_size=(FULL_WIDTH, FULL_HEIGHT), run_before=settle)


def test_snapshot_recall_moment(snap_compare):
    """A recall query ("| k=" after "k=7;"): the state panel names the head, the depth panel marks sublayers."""
    assert snap_compare(make_app(prompt="k=7; | k="), terminal_size=SIZE, run_before=settle)


async def open_routing_what_if(pilot) -> None:
    """x on the routing panel, the first entry (ablate the top expert), until the result screen is drawn."""
    await settle(pilot)
    await pilot.press("1", "x")
    await pilot.pause()
    await pilot.press("enter")
    await wait_until(pilot, lambda: type(pilot.app.screen).__name__ == "WhatIfScreen", what="the what-if")
    await settle(pilot)


def test_snapshot_what_if_result(snap_compare):
    """x on the routing panel, the first entry (ablate the top expert): the result screen, step 1 of the branch."""
    async def run_before(pilot):
        await open_routing_what_if(pilot)
        await pilot.press("n")
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)


# ------------------------------------------------------------------------------- small terminals (issue 24)

SMALL_SIZES = [(MIN_WIDTH, MIN_HEIGHT), (100, 30)]


@pytest.mark.parametrize("size", SMALL_SIZES)
@sync
async def test_the_footer_shows_whole_keys_x_among_them(size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        footer = screen_text(app).splitlines()[-1].rstrip()
        shown = app.query_one(K3Footer).fitting(size[0])
        expected = " ".join(f"{app.get_key_display(b)} {b.description}" for b, _, _ in shown)
        assert footer == expected                      # whole keys only, nothing after them ("^p palettep")
        assert "x what-if" in footer and "q quit" in footer and "? help" in footer


@pytest.mark.parametrize("size", SMALL_SIZES)
@sync
async def test_help_scrolls_to_its_end_on_a_small_terminal(size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        await pilot.press("?")
        await pilot.pause()
        text = screen_text(app)
        assert "Escape closes" in text                 # the border says how to close it, at any size
        box = app.screen.query_one("#help-box")
        assert box.max_scroll_y > 0 and app.screen.focused is box
        last = "Escape or ? closes this help"
        assert last not in text
        await pilot.press("end")
        await pilot.pause(0.2)
        assert last in screen_text(app) and box.scroll_y == box.max_scroll_y
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)


@pytest.mark.parametrize("size", SMALL_SIZES)
@sync
async def test_the_what_if_result_shows_the_whole_top_5_and_the_kl_column(size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await open_routing_what_if(pilot)
        w = app.screen.w
        text = screen_text(app)
        lines = text.splitlines()
        head = next(i for i, line in enumerate(lines) if "before" in line and "after" in line)
        for row, ((_, tb, pb), (_, ta, pa)) in enumerate(zip(w.top_before[0], w.top_after[0]), start=1):
            assert f"{pb:.3f}" in lines[head + row] and f"{pa:.3f}" in lines[head + row]
        assert " KL " in text and fmt_kl(w.kl[0]) in text
        summary = app.screen.query_one("#whatif-summary")
        if summary.max_scroll_y > 0:                   # the rest of the per-step table scrolls into view
            summary.focus()
            await pilot.press("end")
            await pilot.pause(0.2)
            row = f"{w.steps - 1}     {w.position + w.steps - 1}"
            assert row in screen_text(app)
        await pilot.press("tab")                        # one column at a time: the branch's panel
        await pilot.pause()
        assert "the branch, step 0" in screen_text(app) and "next token, top 5" not in screen_text(app)


def test_snapshot_compact_100x30(snap_compare):
    assert snap_compare(make_app(), terminal_size=(100, 30), run_before=settle)


@pytest.mark.parametrize("size", SMALL_SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_help(snap_compare, size):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("?")
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SMALL_SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_what_if_result_small(snap_compare, size):
    assert snap_compare(make_app(), terminal_size=size, run_before=open_routing_what_if)
