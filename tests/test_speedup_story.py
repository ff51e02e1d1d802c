""""Up to 6.3x" has one story, told in sim/serving_text.py and taken from there by every place that tells it.

Moonshot's wording names no baseline (S14); MarkTechPost's summary reads it as K3 against K2 (S39); the number matches
Kimi Linear's measured time per output token against a full-MLA baseline at 1M (S16, S34); the project's roofline
gives K3 against its twin and against K2. The README and docs/k3_facts.md §0 quote `claim_story()` word for word,
lessons 3 and 5 print it (and say nothing of the claim's baseline in their own words), `python -m sim costs` prints
it as its first correction, and the TUI tells no story of its own.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from sim import serving, serving_text

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ("lessons/03_memory_that_does_not_grow.py", "lessons/05_serving_economics.py")
# words that say what the 6.3x is measured against: only claim_story() may put them beside the claim
BASELINE = re.compile(r"\bK2\b|Kimi Linear|full[- ]MLA|\bTPOT\b|baseline|predecessor", re.I)
CLAIM = re.compile(r"6\.3 ?[x×]|REPORTED_SPEEDUP|table\.claim\b")


def _flat(text: str) -> str:
    return " ".join(text.replace("#", " ").split())


def _sources() -> set[str]:
    listed = (ROOT / "docs" / "k3_facts.md").read_text(encoding="utf-8").split("## Sources", 1)[1]
    return set(re.findall(r"^\* (S\d+) ", listed, re.M))


def test_the_story_has_its_four_readings_and_only_the_tables_figures():
    t = serving.speedups()
    said, read, measured, twin, k2 = serving_text.claim_readings()
    assert [r.kind for r in (said, read, measured, twin, k2)] == ["claim", "reading", "measurement", "roofline", "roofline"]
    assert said.value == read.value == t.claim.value == 6.3
    assert "no baseline named" in said.says and "K2" in read.says
    assert round(measured.value, 2) == 6.24 == round(11.48 / 1.84, 2)
    assert twin.value == t.closest["K3 against twin"].value and k2.value == t.closest["K3 against K2"].value
    story = serving_text.claim_story()
    assert set(re.findall(r"(\d+\.\d\d)x", story)) <= t.figures()
    for figure in (twin.value, k2.value, t.speedup("K3 against twin", "1M", "batch 1"),
                   t.speedup("K3 against K2", "1M", "batch 1"), measured.value):
        assert f"{figure:.2f}x" in story
    cited = set(re.findall(r"\bS\d+\b", story))
    assert cited == {"S14", "S39", "S16", "S34"} and cited <= _sources(), cited - _sources()
    # the project's own figures stay far from the claim, and K3 is slower than K2 at batch 1
    assert max(twin.value, k2.value) < measured.value and t.speedup("K3 against K2", "1M", "batch 1") < 1


def test_the_readme_quotes_the_story_and_says_no_other_6_3x():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    story = _flat(serving_text.claim_story())
    assert _flat(readme).count(story) == 1, "README.md: quote sim.serving_text.claim_story() word for word, once"
    assert len(CLAIM.findall(_flat(readme))) == len(CLAIM.findall(story)), \
        "README.md names the 6.3x outside the sentence it takes from sim.serving_text.claim_story()"


def test_k3_facts_section_0_quotes_the_story():
    facts = (ROOT / "docs" / "k3_facts.md").read_text(encoding="utf-8")
    section0 = facts[facts.index("## 0. Corrections"):facts.index("## 1. ")]
    assert _flat(serving_text.claim_story()) in _flat(section0)


def test_the_correction_python_m_sim_costs_prints_is_the_story():
    first = serving_text.corrections()[0]
    assert first["verdict"].startswith(serving_text.claim_story())
    assert {"S14", "S39", "S16", "S34"} <= set(first["sources"])


def _strings(tree) -> list[tuple[int, str]]:
    """(line, text) of every string literal and f-string of a module, implicit concatenation joined, the
    formatted parts written as their expressions."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            found.append((node.lineno, "".join(v.value if isinstance(v, ast.Constant) else ast.unparse(v.value)
                                               for v in node.values)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append((node.lineno, node.value))
    return found


def _markdown_sentences(source: str) -> list[tuple[int, str]]:
    """(first line, sentence) of the lesson's prose: its comment lines joined into paragraphs, split at '. '."""
    found, paragraph, start = [], [], 0
    for number, line in enumerate(source.splitlines() + [""], start=1):
        if line.startswith("#") and not line.startswith("# %%") and line.strip("# "):
            start = start or number
            paragraph.append(line.lstrip("#").strip())
            continue
        for sentence in re.split(r"(?<=[.!?])\s+", " ".join(paragraph)):
            found.append((start, sentence))
        paragraph, start = [], 0
    return found


@pytest.mark.parametrize("name", LESSONS)
def test_lessons_3_and_5_print_the_story_and_tell_none_of_their_own(name):
    source = (ROOT / name).read_text(encoding="utf-8")
    tree = ast.parse(source)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "claim_story"]
    assert calls, f"{name} prints sim.serving_text.claim_story()"
    own = [(line, text) for line, text in _strings(tree) + _markdown_sentences(source)
           if CLAIM.search(text) and BASELINE.search(text)]
    assert not own, (f"{name}:{own[0][0]} says what the 6.3x is measured against in its own words: {own[0][1]!r}; "
                     "print sim.serving_text.claim_story() instead")


def test_the_checker_sees_a_sentence_of_its_own():
    """A guard on the test above: the sentences the lessons used to say are caught."""
    old = ('# the reported\n# 6.3x is Kimi Linear\'s measured speed-up over a full-MLA baseline, beyond any model.\n'
           'print(f"far from {REPORTED_SPEEDUP:g}x, "\n      "which compares Kimi Linear with a full-MLA model.")\n')
    caught = [t for _, t in _strings(ast.parse(old)) + _markdown_sentences(old) if CLAIM.search(t) and BASELINE.search(t)]
    assert len(caught) == 2, caught


def test_the_tui_tells_no_6_3x_story_of_its_own():
    """The TUI prints no 6.3x sentence (its memory panel's one K3 ratio is the table's bytes-held figure,
    tests/test_serving.py); if it ever tells the story, it must take it from sim.serving_text.claim_story()."""
    for path in sorted((ROOT / "tui_app").rglob("*.py")) + [ROOT / "tui.py"]:
        text = path.read_text(encoding="utf-8")
        if CLAIM.search(text):
            assert "claim_story" in text, f"{path.relative_to(ROOT)} names the 6.3x: take it from claim_story()"
