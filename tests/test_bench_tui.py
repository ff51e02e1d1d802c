"""bench/bench_tui.py --startup: the clock stops when the marks of the TUI's first screen and first frame appear
in a pseudo-terminal, through the escape sequences a terminal app writes; the marks are the ones the TUI draws."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import bench_tui  # noqa: E402

# A stand-in for `python3 dev.py run`: the two marks, styled and split by escape sequences as Textual writes them,
# then it waits for the q the bench sends.
FAKE_DEV = r'''
import sys, time, tty
tty.setraw(0)                        # as Textual does: a key arrives without Enter
out = sys.stdout.buffer
out.write(b"\x1b[?1049h\x1b[2J\x1b[1;1H\x1b[38;2;255;255;0mloading\x1b[0m small ...")
out.flush()
time.sleep(0.2)
out.write(b"\x1b[2;1Hstep 44 \xc2\xb7 position 44\x1b]0;title\x07")
out.flush()
sys.stdin.read(1)
'''


@pytest.mark.skipif(os.name != "posix", reason="the startup bench runs through a POSIX pseudo-terminal")
def test_startup_sees_the_first_screen_then_the_first_frame_and_quits(tmp_path):
    (tmp_path / "dev.py").write_text(FAKE_DEV)
    seen = bench_tui.startup(tmp_path, timeout=60)
    assert list(seen) == ["first screen", "first frame"]
    assert 0 < seen["first screen"] < seen["first frame"]


@pytest.mark.skipif(os.name != "posix", reason="the startup bench runs through a POSIX pseudo-terminal")
def test_startup_says_which_mark_never_came(tmp_path):
    (tmp_path / "dev.py").write_text(FAKE_DEV.replace("position", "nothing"))
    with pytest.raises(TimeoutError, match="no first screen or first frame within"):
        bench_tui.startup(tmp_path / "gone", timeout=60)         # no such checkout: the command exits at once
    with pytest.raises(TimeoutError, match="no first frame within 1 s"):
        bench_tui.startup(tmp_path, timeout=1)


def test_the_marks_are_what_the_tui_draws():
    widgets = (ROOT / "tui_app" / "widgets.py").read_text()
    assert "[b yellow]loading {d.loading.spec.preset}" in widgets        # the status line while the load runs
    assert 'f"step {view.step} · position {f.position}' in widgets       # the timeline's subtitle, with a frame
    assert [mark.decode() for mark in bench_tui.SCREEN_MARKS.values()] == ["loading", "· position"]
