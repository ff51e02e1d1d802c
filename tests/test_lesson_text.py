"""What the lessons' fixed text says, checked against what it refers to, without running a kernel.

INSTRUCTOR.md's lesson range, its blank timing cells and lesson 8's CPU seconds; lesson 2's take-away pointing at the
section that prints what it cites; lesson 1's architecture diagram numbering its layers one way and clipping no box.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "lessons"
sys.path.insert(0, str(LESSONS))


def _lesson_numbers() -> list[int]:
    return sorted(int(p.name[:2]) for p in LESSONS.glob("0[0-9]_*.py"))


def test_instructor_names_the_lessons_the_windows_loop_opens():
    text = (LESSONS / "INSTRUCTOR.md").read_text(encoding="utf-8")
    first, last = re.search(r"every lesson, (\d\d) to (\d\d) and any added later", text).groups()
    numbers = _lesson_numbers()
    assert (int(first), int(last)) == (numbers[0], numbers[-1]), (first, last, numbers)


def test_instructor_says_which_timing_cells_are_blank():
    text = (LESSONS / "INSTRUCTOR.md").read_text(encoding="utf-8")
    table = text[text.index("| lesson | script, load ≤ 2 (s)"):]
    table = table[:table.index("\n\n")]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.splitlines()[2:]]
    blank = sorted(int(r[0]) for r in rows if any(not c for c in r[1:]))
    said = re.search(r"Blank cells were not measured: lessons ([\d, and]+) only at load ≤ 2\.", text)
    assert said, "INSTRUCTOR.md says which lessons' timing cells are blank, and why"
    assert sorted(int(n) for n in re.findall(r"\d+", said.group(1))) == blank, (said.group(0), blank)
    assert "when they land" not in text


def test_instructor_quotes_the_recorded_cpu_seconds_of_lesson_8():
    text = (LESSONS / "INSTRUCTOR.md").read_text(encoding="utf-8")
    record = json.loads((LESSONS / "08_train_it_yourself.full_run.json").read_text(encoding="utf-8"))
    said = re.findall(r"training runs, about two minutes each: (\d+) s of CPU", text)
    assert said == [str(round(sum(record["cpu_seconds"].values())))], (said, record["cpu_seconds"])


def _sections(source: str) -> list[tuple[int, int]]:
    """(offset, number) of each numbered "## N." heading of a lesson."""
    return [(m.start(), int(m.group(1))) for m in re.finditer(r"^# ## (\d+)\. ", source, re.M)]


def _section_at(source: str, offset: int) -> int:
    return max((n for start, n in _sections(source) if start <= offset), default=0)


def test_lesson2_takeaway_points_at_the_section_that_prints_the_half_lives():
    source = (LESSONS / "02_delta_rule.py").read_text(encoding="utf-8")
    cited = int(re.search(r"\(section (\d+) printed the range and the share at each end\)", source).group(1))
    printed = source.index('print(f"half-lives over all')
    assert _section_at(source, printed) == cited, f"the half-lives are printed in section {_section_at(source, printed)}"


def test_the_diagram_numbers_k3_as_it_numbers_the_small_model_and_clips_no_box():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from diagram import draw_architecture, k3_schedule

    from tiny_k3 import K3Config

    k3 = K3Config.preset("k3")
    schedule = k3_schedule()
    named = [int(n) for n in re.findall(r"\bL(\d+)\b", schedule)]
    assert named[:2] == [0, k3.num_layers - 1], "the same L0-based numbering as the small model's labels"
    assert named[2:] == [*k3.mla_layers[:2], *k3.mla_layers[-2:]], (schedule, k3.mla_layers)
    small = K3Config.preset("small")
    fig = draw_architecture(small)
    fig.canvas.draw()
    path_ax, moe_ax = fig.axes
    labels = [t.get_text() for t in path_ax.texts if re.fullmatch(r"L\d+", t.get_text())]
    assert labels == [f"L{i}" for i in range(small.num_layers)]
    assert schedule in " ".join(t.get_text() for t in path_ax.texts)
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        box = ax.get_window_extent(renderer)
        for patch in ax.patches:
            extent = patch.get_window_extent(renderer)
            assert (extent.x0 >= box.x0 - 0.5 and extent.x1 <= box.x1 + 0.5 and extent.y0 >= box.y0 - 0.5
                    and extent.y1 <= box.y1 + 0.5), f"a box of the diagram is clipped at its panel's edge: {extent}"
        for text in ax.texts:                                   # every label inside the figure
            extent = text.get_window_extent(renderer)
            assert extent.x0 >= 0 and extent.x1 <= fig.bbox.x1 + 0.5, (text.get_text(), extent)
    x_box = next(t for t in moe_ax.texts if t.get_text().startswith("x\n["))
    assert x_box.get_text() == f"x\n[{small.hidden_size}]"
    plt.close(fig)


def test_lesson2_says_what_its_heads_are_ranked_by():
    """Issue 35: "best match: layer 0, head 1, cosine 0.85" sat beside a panel where another head's cosine was higher.
    Heads are ranked by the share of their read that the value's write explains; no line may call the first-ranked
    head the best match, as if the ranking were by cosine."""
    source = (LESSONS / "02_delta_rule.py").read_text(encoding="utf-8")
    instructor = (LESSONS / "INSTRUCTOR.md").read_text(encoding="utf-8")
    for name, text in (("lesson 2", source), ("INSTRUCTOR.md", instructor)):
        for wording in ("best match", "best-matching", "best head"):
            assert wording not in text.lower(), f"{name} says {wording!r}: say the head ranks first, and by what"
    assert "ranked first by share" in source and "(the ranking is by share, not by this)" in source


def test_lesson8_counts_the_intervals_it_reads():
    """Lesson 8's section 5 says how many intervals it reads at once: two models at every number of pairs."""
    source = (LESSONS / "08_train_it_yourself.py").read_text(encoding="utf-8")
    pairs = re.search(r"^PAIRS, LINES, PROBE_SEED = \(([\d, ]+)\)", source, re.M).group(1).split(",")
    words = {12: "Twelve", 14: "Fourteen", 16: "Sixteen", 18: "Eighteen"}
    assert f"{words[2 * len(pairs)]} intervals are read at once here" in source, len(pairs)


def test_lesson3_takeaway_quotes_k3s_state_and_cache_bytes():
    """The take-away's "449 MB for K3" and "27.6 KB per token for K3's 24" are K3's config, in sim.memory's words."""
    from sim.memory import format_bytes, kv_bytes_per_token, state_bytes_fixed

    from tiny_k3 import K3Config

    source = (LESSONS / "03_memory_that_does_not_grow.py").read_text(encoding="utf-8")
    source = " ".join(source.replace("#", " ").split())                    # the markdown's lines as one text
    k3 = K3Config.preset("k3")
    fixed = state_bytes_fixed(k3)
    state, per_token = round((fixed.state + fixed.conv) / 1e6), f"{kv_bytes_per_token(k3) / 1e3:.1f} KB"
    assert f"fixed state per sequence ({state} MB for K3)" in source, format_bytes(fixed.state + fixed.conv)
    assert f"({per_token} per token for K3's {len(k3.mla_layers)})" in source, per_token


def test_lesson7_says_how_many_lines_its_many_pairs_cells_rest_on():
    source = (LESSONS / "07_change_it_and_see.py").read_text(encoding="utf-8")
    said = re.search(r"with (\d+) lines at (\d+) pairs they are not (\d+)\s*#?\s*independent draws", source)
    assert said, "lesson 7 says how many lines the many-pairs cells rest on"
    lines, pairs, answers = map(int, said.groups())
    assert f"{pairs}: make_probes({lines}, {pairs}, 16," in source and answers == lines * pairs, said.group(0)
