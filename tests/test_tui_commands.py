"""Commands as printed (issue 24): every command the app and the README print works from the checkout after
`python3 dev.py run`; `small-twin` is a preset of the TUI and of its `p` menu; the README's key table has every
key the footer shows; the lesson count is the number of lessons; saved runs go to the git-ignored runs/ and
the save line says so; a run reopened inside its prompt shows the whole prompt."""

import importlib.util
import re
import shlex
from pathlib import Path

import tui
from tiny_k3.config import K3Config
from tui_app.app import TinyK3App
from tui_app.commands import K3Commands
from sim.presets import tui_presets
from tui_app.driver import REPO, runs_dir, save_note
from tui_app.help import KEYS
from tui_app.screens import PresetScreen
from tui_pilot import PROMPT, make_app, screen_text, settle, sync, wait_until

SIZE = (160, 48)
README = (REPO / "README.md").read_text()
NUMBER_WORDS = {6: "six", 7: "seven", 8: "eight", 9: "nine"}


def dev_py_commands() -> set[str]:
    """The subcommands `python3 dev.py <sub>` accepts: dev.main's tables, and the ones it runs in .venv."""
    spec = importlib.util.spec_from_file_location("dev", REPO / "dev.py")
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    return set(dev.KIT_COMMANDS) | set(dev.TUI_COMMANDS) | {"test", "setup", "sim", "bench"}


def test_the_save_line_is_a_command_that_reopens_the_run_from_the_checkout():
    path = runs_dir() / "tiny-k3-tiny-20260101-000000.npz"
    line = save_note(path, 6)
    assert line.startswith("saved at step 6 to runs/tiny-k3-tiny-20260101-000000.npz (runs/ is git-ignored)")
    command = shlex.split(line.split("reopen with: ")[1])
    assert command[:3] == ["python3", "dev.py", "run"] and "run" in dev_py_commands()
    # dev.py run passes the rest to tui.py with the checkout as working directory: the path resolves there
    args = command[3:]
    assert args == ["--open", "runs/tiny-k3-tiny-20260101-000000.npz"]
    assert (REPO / args[1]) == path
    outside = save_note(Path("/tmp/elsewhere/run.npz"), 2)        # a run saved elsewhere: its absolute path
    assert outside.endswith("reopen with: python3 dev.py run --open /tmp/elsewhere/run.npz")
    assert "git-ignored" not in outside


def test_runs_go_to_a_git_ignored_folder_of_the_checkout():
    assert runs_dir() == REPO / "runs"
    assert "runs/" in (REPO / ".gitignore").read_text().splitlines()
    assert TinyK3App().save_dir == runs_dir()                     # the default of `s`


def test_every_dev_py_command_the_readme_prints_exists():
    printed = set(re.findall(r"python3 dev\.py ([a-z-]+)", README))
    assert {"run", "test", "serve"} <= printed
    assert printed <= dev_py_commands(), printed - dev_py_commands()


def test_every_preset_the_readme_passes_to_the_tui_is_accepted():
    for name in set(re.findall(r"--preset ([a-z0-9/-]+)", README)):
        assert name in K3Config.presets() or name in tui_presets(), name
    assert tui.parse_args(["--preset", "small-twin"]).preset == "small-twin"


def test_the_readme_key_table_has_every_key_the_footer_and_help_show():
    table = README[README.index("| key | action | key | action |"):README.index("On a projector:")]
    in_table = set(re.findall(r"`([^`]+)`", table))
    names = {"question_mark": "?", "ctrl+p": "ctrl+p"}
    for binding in TinyK3App.BINDINGS:
        if binding.show:
            assert names.get(binding.key, binding.key) in in_table, binding.key
    for keys, _ in KEYS:                                          # the help's key column, split into keys
        for key in re.split(r" / |, ", keys):
            key = {"escape": "Esc"}.get(key, key)
            assert key in in_table or key == "1-4" and "`1`-`4`" in table, key
    assert "`x`" in table and "what if" in table


def test_the_lesson_count_is_the_number_of_lessons():
    lessons = sorted(p.name for p in (REPO / "lessons").glob("0[0-9]_*.py"))
    word = NUMBER_WORDS[len(lessons)]
    assert f"{word} jupytext lessons" in README and f"| `lessons/` | {word} lessons" in README
    guide = (REPO / "lessons/README.md").read_text()
    assert guide.startswith(f"# tiny-k3 lessons\n\n{word.title()} lessons")
    rows = re.findall(r"^\| (\d) \| `(0\d_[a-z_0-9]+\.py)`", guide, flags=re.M)
    assert [name for _, name in rows] == lessons
    for other in set(NUMBER_WORDS.values()) - {word}:
        assert f"{other} lessons" not in README.lower() and f"{other} lessons" not in guide.lower()


@sync
async def test_small_twin_is_in_the_preset_menu_and_loads_the_shipped_twin():
    app = make_app(weights="auto")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("p")
        assert isinstance(app.screen, PresetScreen)
        options = app.screen.query_one("OptionList")
        ids = [options.get_option_at_index(i).id for i in range(options.option_count)]
        assert ids == tui_presets() and "small-twin" in ids
        assert "all MLA: the shipped all-softmax twin" in screen_text(app)
        options.highlighted = ids.index("small-twin")
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.preset == "small-twin")
        await settle(pilot)
        assert app.sim.weights == "trained" and app.sim.config.kda_layers == []
        assert app.sim.config == K3Config.preset("small").twin()
        assert "trained checkpoint small-twin.safetensors" in screen_text(app)
        assert "Preset small-twin" in [t for t, _, _ in K3Commands(app.screen)._commands("")]


@sync
async def test_a_run_saved_inside_its_prompt_reopens_with_the_whole_prompt_shown(tmp_path):
    app = make_app(save_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        last = app.sim.prompt_len - 1
        await pilot.press("b", "b")                   # two tokens back, inside the prompt
        await settle(pilot)
        await pilot.press("s")
        await wait_until(pilot, lambda: "saved at step" in str(app.message))
        assert f"saved at step {last - 2} to {tmp_path}" in str(app.message)
        assert "reopen with: python3 dev.py run --open " in str(app.message)
    (path,) = tmp_path.glob("*.npz")
    reopened = TinyK3App(open_path=str(path), show_timings=False)
    async with reopened.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert reopened.step == last - 2 and reopened.driver.visited == last
        assert f"step {last - 2}/{last}" in screen_text(reopened) and reopened.prompt == PROMPT
