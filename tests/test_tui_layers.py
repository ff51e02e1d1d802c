"""The TUI's house rules, read off the code: tui_app imports nothing from tiny_k3 (sim is its one door to
the model), modules and functions stay short; and the pieces the app's modules share with sim (the prompt
check, the preset list, the job outcome, the timeline text) do what they say."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

import tui
from sim import Simulation, render
from sim.memory import crossover_tokens
from sim.presets import check_device, config_for, has_checkpoint, sim_preset, tui_presets
from sim.prompt import max_prompt_bytes, prompt_ids, prompt_limit
from tiny_k3.config import K3Config
from tiny_k3.model import resolve_device
from tiny_k3.tokenizer import encode, token_text
from tui_app.driver import Cancelled
from tui_app.messages import JobOutcome, run_job

TUI_APP = Path(__file__).resolve().parents[1] / "tui_app"
MODULES = sorted(TUI_APP.glob("*.py"))


def imported_modules(tree: ast.AST) -> set[str]:
    """Every module an `import` or `from ... import` names, at any depth (inside functions too)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_tui_app_reads_the_model_only_through_sim(path):
    tiny = sorted(m for m in imported_modules(ast.parse(path.read_text())) if m.split(".")[0] == "tiny_k3")
    assert not tiny, f"{path.name} imports {tiny}: the UI reads the model through sim (sim.presets, sim.render, ...)"


def test_tui_py_is_the_environment_check_and_nothing_else():
    tree = ast.parse((TUI_APP.parent / "tui.py").read_text())
    assert not {m for m in imported_modules(tree) if m.split(".")[0] in ("tiny_k3", "sim")}
    assert tui.main.__module__ == "tui_app.cli" and tui.parse_args.__module__ == "tui_app.cli"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_modules_classes_and_functions_stay_short(path):
    tree = ast.parse(path.read_text())
    assert len(path.read_text().splitlines()) <= 500, f"{path.name} is over 500 lines"
    for node in ast.walk(tree):
        size = node.end_lineno - node.lineno + 1 if hasattr(node, "end_lineno") else 0
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert size <= 60, f"{path.name}: {node.name} is {size} lines (at most 60)"
        if isinstance(node, ast.ClassDef):
            assert size <= 400, f"{path.name}: class {node.name} is {size} lines (at most 400)"


# ---------------------------------------------------------------------------------------- one prompt check


def test_the_prompt_limit_is_max_seq_len_less_bos_and_one_new_token():
    cfg = K3Config.preset("tiny")
    longest = "x" * max_prompt_bytes(cfg)
    assert len(prompt_ids(longest, cfg)) == cfg.max_seq_len - 1 == len(encode(longest))   # one place left
    with pytest.raises(ValueError, match=f"is {max_prompt_bytes(cfg) + 1} bytes but preset 'tiny' allows 512"):
        prompt_ids(longest + "x", cfg)
    with pytest.raises(ValueError, match="is 512 bytes"):                # bytes, not characters: é is two
        prompt_ids("é" * 256, cfg)
    for empty in ("", None, 7):
        with pytest.raises(ValueError, match="the prompt is empty"):
            prompt_ids(empty, cfg)


def test_simulation_cli_and_dialog_say_the_same_sentence(capsys):
    cfg = K3Config.preset("tiny")
    too_long = "x" * (max_prompt_bytes(cfg) + 1)
    with pytest.raises(ValueError) as raised:
        prompt_ids(too_long, cfg)
    sentence = str(raised.value)
    with pytest.raises(ValueError) as by_sim:
        Simulation("tiny", too_long, weights="random")
    assert str(by_sim.value) == sentence
    assert tui.main(["--preset", "tiny", "--prompt", too_long]) == 2
    assert capsys.readouterr().err == f"tiny-k3: {sentence[0].upper()}{sentence[1:]}\n"
    assert prompt_limit(cfg) in sentence
    assert prompt_limit(cfg, "tokens").endswith(f"{max_prompt_bytes(cfg):,} tokens"), "a BPE run counts tokens"


# ---------------------------------------------------------------------------------------- sim.presets


def test_the_tui_presets_are_the_runnable_ones_then_the_shipped_twins():
    presets = tui_presets()
    runnable = K3Config.runnable_presets()
    assert presets[:len(runnable)] == runnable and "k3" not in presets
    twins = presets[len(runnable):]
    assert "small-twin" in twins and all(t.endswith("-twin") and has_checkpoint(t) for t in twins)
    assert sim_preset("small") == "small"                                    # a preset: its name
    twin = sim_preset("small-twin")                                          # a checkpoint: its config
    assert isinstance(twin, K3Config) and twin == config_for("small-twin") and set(twin.layer_kinds) == {"mla"}
    assert has_checkpoint("small") and not has_checkpoint("tiny")


def test_check_device_refuses_what_resolve_device_refuses():
    check_device(None)
    check_device("cpu")
    for bad in ("tpu", "cuda:x"):
        with pytest.raises(ValueError) as ours:
            check_device(bad)
        with pytest.raises(ValueError) as theirs:
            resolve_device(bad)
        assert str(ours.value) == str(theirs.value)


# ---------------------------------------------------------------------------------------- jobs


def test_run_job_turns_every_ending_into_an_outcome():
    assert run_job(lambda: 42) == JobOutcome(42)
    assert run_job(lambda: int("x")).error == "invalid literal for int() with base 10: 'x'"   # ValueError: as is

    def broken():
        raise KeyError("k")

    def cancelled():
        raise Cancelled()

    assert run_job(broken) == JobOutcome(error="KeyError: 'k'")              # anything else: named
    assert run_job(cancelled) == JobOutcome(cancelled=True)


# ---------------------------------------------------------------------------------------- the timeline line


@pytest.fixture(scope="module")
def run():
    sim = Simulation("tiny", "abc", weights="random")
    sim.run(3)
    return sim


def plain(text) -> str:
    console = Console(width=200, color_system=None, record=True)
    console.print(text)
    return console.export_text().rstrip("\n")


def test_timeline_shows_what_was_visited_and_the_next_token_at_its_end(run):
    frames = run.frames
    inputs = "".join(f.input_text for f in frames)
    at_end = render.timeline_text(frames, run.prompt_len, len(frames) - 1, len(frames) - 1, 200)
    assert plain(at_end) == inputs + " → " + frames[-1].token_text
    cursor = [s for s in at_end.spans if "reverse" in str(s.style)]
    assert [at_end.plain[s.start:s.end] for s in cursor] == [frames[-1].input_text]
    inside = render.timeline_text(frames, run.prompt_len, 1, 2, 200)        # frame 3+ not visited yet: hidden
    assert plain(inside) == "".join(f.input_text for f in frames[:3]) and "→" not in inside.plain


def test_top_tokens_name_the_frames_most_likely_next_tokens(run):
    f = run.frames[-1]
    tops = render.top_tokens(f)
    assert [t for t, _ in tops] == [token_text(int(i)) for i in f.top_ids]
    assert np.allclose([p for _, p in tops], f.top_probs) and tops[0][1] == max(p for _, p in tops)


def test_crossover_line_reads_the_crossover_from_either_side():
    cfg = K3Config.preset("tiny")
    n = crossover_tokens(cfg)
    assert plain(render.crossover_line(cfg, n - 1)) == f"hybrid larger until token {n:,} (now {n - 1:,}); r: watch it cross"
    assert plain(render.crossover_line(cfg, n)).startswith(f"hybrid smaller since token {n:,}")
    assert "grow alike" in plain(render.crossover_line(cfg.twin(), 10))
