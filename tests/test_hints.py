"""Hints are a ladder of three rungs: the idea, the shape of the computation, the code. Only the last holds code.

A learner who asks for hint 2 wants to be told *what* to compute (which shapes, which operations), not handed
the answer. So for every registered exercise:

- there are exactly three rungs, each different from the one before;
- no rung before the last contains a piece of the reference solution's code (lessons/solutions/): no whole
  statement and no expression of it (a call, an operation, a subscript) longer than a few characters, compared
  with white space and quote style folded away;
- no rung before the last has a code-like line: an assignment, a call through torch./F./math., a method call,
  a slice, `return`, `lambda`, `def`, a `for` loop;
- the last rung does show the solution's code (at least one of its expressions), so the ladder ends where the
  solution is.

The detectors are themselves tested: each flags the solution's own source, so they cannot pass by matching
nothing.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import textwrap
from pathlib import Path

import pytest

LESSONS = Path(__file__).resolve().parents[1] / "lessons"
sys.path.insert(0, str(LESSONS))

import checks  # noqa: E402
import solutions  # noqa: E402

RUNGS = 3
MIN_PIECE = 8          # characters (white space removed) a solution expression needs to count as code, not a name

CODE_LIKE = [   # (pattern, what it is): any of these on a line of an early rung makes the line code
    (re.compile(r"(?:^|;)\s*[A-Za-z_]\w*(?:\[[^\]]*\])?(?:\s*,\s*[A-Za-z_]\w*)*\s*(?:[-+*/@]|//)?=(?!=)"),
     "an assignment"),
    (re.compile(r"\b(?:torch|F|nn|np|math)\.\w"), "a call through torch. / F. / nn. / np. / math."),
    (re.compile(r"[\w)\]]\.[A-Za-z_]\w*\("), "a method call"),
    (re.compile(r"\[[^\]\[]*:[^\]\[]*\]"), "a slice"),
    (re.compile(r"(?:^|;)\s*return\b|\blambda\b|\bdef\s+\w+\s*\(|\bfor\s+\w+(?:\s*,\s*\w+)*\s+in\s+\w"),
     "Python syntax (return, lambda, def or a for loop)"),
    (re.compile(r"\b[A-Za-z_]\w{2,}=(?!=)"), "a keyword argument"),
]


def _fold(text: str) -> str:
    """Text with white space removed and double quotes made single: how code is compared."""
    return re.sub(r"\s+", "", text).replace('"', "'")


def solution_pieces(fn) -> list[str]:
    """The code of a reference solution as pieces: every statement of its body and every call, operation,
    comparison and subscript inside them, unparsed and folded, the docstring left out; the longest first."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    body = tree.body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]                                  # the docstring is prose, not code
    pieces = set()
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, (ast.stmt, ast.Call, ast.BinOp, ast.Compare, ast.Subscript, ast.IfExp,
                                 ast.ListComp, ast.BoolOp, ast.UnaryOp)):
                if isinstance(node, (ast.For, ast.If, ast.While)):     # their whole text: the header is enough
                    node = node.iter if isinstance(node, ast.For) else node.test
                piece = _fold(ast.unparse(node))
                if len(piece) >= MIN_PIECE:
                    pieces.add(piece)
    return sorted(pieces, key=len, reverse=True)


def code_like_lines(text: str) -> list[tuple[str, str]]:
    """(line, what makes it code) for each line of `text` that reads as code."""
    found = []
    for line in text.splitlines():
        for pattern, what in CODE_LIKE:
            if pattern.search(line):
                found.append((line.strip(), what))
                break
    return found


EXERCISES = list(checks.EXERCISES.values())


def _name(ex) -> str:
    return f"exercise {ex.number} ({ex.solution})"


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda e: e.number)
def test_every_exercise_has_three_different_rungs(ex):
    assert len(ex.hints) == RUNGS, (
        f"{_name(ex)} has {len(ex.hints)} hint rungs; give it {RUNGS}: the idea, then the shape of the computation "
        "(shapes and operations in words or pseudo-maths), then the code (lessons/checks/_common.py).")
    for level, (before, after) in enumerate(zip(ex.hints, ex.hints[1:]), start=2):
        assert before != after, f"{_name(ex)}: rung {level} repeats rung {level - 1}; each rung must add something."


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda e: e.number)
def test_hint_prints_each_rung_with_its_place_on_the_ladder(ex, capsys):
    for level, rung in enumerate(ex.hints, start=1):
        checks.hint(ex.number, level)
        out = capsys.readouterr().out
        assert out.startswith(f"hint {level}/{len(ex.hints)} for exercise {ex.number}") and rung in out, out


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda e: e.number)
def test_no_rung_before_the_last_shows_the_solutions_code(ex):
    pieces = solution_pieces(getattr(solutions, ex.solution))
    assert pieces, f"lessons/solutions has no code for {ex.solution}"
    for level, rung in enumerate(ex.hints[:-1], start=1):
        folded = _fold(rung)
        shown = [p for p in pieces if p in folded]
        assert not shown, (
            f"hint {level}/{len(ex.hints)} of {_name(ex)} shows the solution's code `{shown[0]}`. A learner who asks "
            f"for rung {level} wants {'the idea' if level == 1 else 'the shape of the computation'}, not the "
            "answer: say it in words or pseudo-maths (which shapes, which operations) and keep the code for the "
            "last rung.")
        lines = code_like_lines(rung)
        assert not lines, (
            f"hint {level}/{len(ex.hints)} of {_name(ex)} has a line that reads as code ({lines[0][1]}): "
            f"{lines[0][0]!r}. Rungs before the last describe; write it as words or maths (→, ×, Σ, exp, "
            "softmax over an axis) and leave the code to the last rung.")


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda e: e.number)
def test_the_last_rung_is_the_solutions_code(ex):
    pieces = solution_pieces(getattr(solutions, ex.solution))
    last = _fold(ex.hints[-1])
    assert any(p in last for p in pieces), (
        f"the last hint of {_name(ex)} does not show the reference solution's code; the ladder ends with the code "
        f"a learner can compare theirs with (lessons/solutions/, e.g. `{pieces[0]}`).")
    assert code_like_lines(ex.hints[-1]), f"the last hint of {_name(ex)} reads as prose, not code."


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda e: e.number)
def test_the_detectors_see_the_solution_as_code(ex):
    """A guard on this file: the solution's own source must trip both detectors, or they test nothing."""
    fn = getattr(solutions, ex.solution)
    source = textwrap.dedent(inspect.getsource(fn))
    body = "\n".join(line for line in source.splitlines()[1:] if line.strip() and '"""' not in line)
    assert any(p in _fold(body) for p in solution_pieces(fn)), ex.solution
    assert code_like_lines(body), f"no line of {ex.solution}'s source reads as code to code_like_lines"


@pytest.mark.parametrize("line, what", [
    ("x = g_raw + dt_bias", "an assignment"), ("S_dec = g.exp()[:, None] * S", "an assignment"),
    ("a, b = 1, 2", "an assignment"), ("out += y", "an assignment"), ("torch.sign(x)", "a call through"),
    ("w / w.sum(-1)", "a method call"), ("conv[..., s:e]", "a slice"), ("return w", "Python syntax"),
    ("for part in range(3)", "Python syntax"), ("softmax(x, dim=-1)", "a keyword argument"),
])
def test_code_like_lines_names_each_kind(line, what):
    assert code_like_lines(line)[0][1].startswith(what), code_like_lines(line)


@pytest.mark.parametrize("prose", [
    "scores [T, E] plus bias [E] → the k largest along the expert axis → ids [T, k]",
    "KL(p ‖ q) = Σ_v p_v (log p_v − log q_v), in nats", "K3: 24 × 576 × 2 = 27,648 B per token",
    "exp(Σ_{s=d+1}^{t} g_s[c]) over the rows after d", "1 + ⌈len(outputs) / S⌉ sources (see k3_facts.md §5a)",
    "returned as a Python float (not a 0-d tensor)",
])
def test_prose_and_maths_are_not_code(prose):
    assert code_like_lines(prose) == []


def test_wilson_rung_2_is_a_middle_step_not_the_formula():
    """8.3's rung 2 gives the route (the inequality whose roots are the interval), not the closed form rung 3 shows;
    and the route is right: the quadratic it states has the Wilson interval as its roots."""
    import math

    from tiny_k3.recall import wilson_interval

    idea, route, code = checks.find_exercise("8.3").hints
    for closed_form in ("z²/(2n)", "z²/(4n²)", "centre =", "half-width =", "/ (1 + z²/n)"):
        assert closed_form not in route, f"8.3's rung 2 gives the closed form ({closed_form!r}): that is rung 3"
    assert "quadratic" in route and "(1 + z²/n) π² − (2p + z²/n) π + p² ≤ 0" in route
    for hits, n in [(0, 10), (3, 40), (48, 96), (10, 10)]:
        z, p = 1.96, hits / n
        a, b, c = 1 + z * z / n, -(2 * p + z * z / n), p * p               # the quadratic of rung 2
        disc = math.sqrt(b * b - 4 * a * c)
        roots = (max(0.0, (-b - disc) / (2 * a)), min(1.0, (-b + disc) / (2 * a)))
        assert roots == pytest.approx(wilson_interval(hits, n), abs=1e-12), (hits, n)
