"""The lessons' helpers: imports, plots, exercise stubs and the stepping slider.

Every lesson starts with `from workshop import ...`. Importing this module puts the repository root on
sys.path (so `tiny_k3` and `sim` import from a plain clone), picks a quiet matplotlib setup, and
offers:

    @exercise("route")           the decorated function is the learner's stub; with TINY_K3_SOLUTIONS=1
    def my_route(...): ...       (instructors, tests) the reference solution from lessons/solutions/ runs instead
    try_exercise(check, fn)      run a check; print "passed", the teaching message, or "not done yet" + the spec
    step_slider(show_step, n)    an ipywidgets slider over show_step(i) in a notebook; one call to show_step elsewhere
    load_model(preset)           the shipped trained weights when they exist, else a seeded random init
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

LESSONS = Path(__file__).resolve().parent
ROOT = LESSONS.parent
for path in (ROOT, LESSONS):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def in_kernel() -> bool:
    """True inside Jupyter / nbclient (an IPython kernel), False in a plain `python lesson.py` run."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


import matplotlib  # noqa: E402

if in_kernel():
    import torch

    # The lessons' tensors are tiny: one thread is fastest and leaves the other core to the notebook.
    torch.set_num_threads(int(os.environ.get("TINY_K3_THREADS", "1")))
else:
    matplotlib.use("Agg")  # a script run draws off-screen; notebooks keep their inline backend
import matplotlib.pyplot as plt  # noqa: E402

from figures import PROJECTOR_RC, bar_labels, heatmap, integer_ticks  # noqa: E402,F401  (re-exported)

plt.rcParams.update(PROJECTOR_RC)

# ---------------------------------------------------------------------------- solutions switch

SOLUTIONS = os.environ.get("TINY_K3_SOLUTIONS", "") == "1"


def use_solutions(on: bool = True) -> None:
    """Switch instructor mode at run time (exercise cells defined afterwards pick it up)."""
    global SOLUTIONS
    SOLUTIONS = bool(on)


def exercise(solution_name: str):
    """Mark a learner's stub. In instructor mode (TINY_K3_SOLUTIONS=1) it is replaced by the reference
    solution `lessons/solutions/<solution_name>`; otherwise the learner's own code runs, unchanged."""

    def wrap(fn):
        if not SOLUTIONS:
            return fn
        try:
            import solutions
        except ImportError:
            raise ImportError("TINY_K3_SOLUTIONS=1 but lessons/solutions/ is not here "
                              "(it is for instructors; unset the variable to do the exercises).") from None
        reference = getattr(solutions, solution_name)

        @functools.wraps(fn)
        def solved(*args, **kwargs):
            return reference(*args, **kwargs)

        solved.is_reference_solution = True
        return solved

    return wrap


def try_exercise(check, fn) -> None:
    """Run `check(fn)` and report in one readable block; never stops the notebook.

    - fn still raises NotImplementedError: "not done yet", and what the check expects.
    - a wrong answer: the check's teaching message (which term, which shape, the right value here).
    - a right one: the check's own success line.
    """
    from checks import ExerciseError

    name = getattr(check, "__name__", "check")
    info = getattr(check, "exercise", None)
    if info is not None:
        print(f"[{info.label}]")
    if getattr(fn, "is_reference_solution", False):
        print(f"(instructor mode: TINY_K3_SOLUTIONS=1, {name} runs the reference solution)")
    try:
        check(fn)
    except NotImplementedError:
        print(f"… {name}: not done yet — here is what the check expects:\n")
        print(getattr(check, "expects", check.__doc__ or "").strip())
        if info is not None:
            print(f"\nStuck? hint({info.number!r}) names the idea, hint({info.number!r}, 2) the shape of the "
                  f"computation, hint({info.number!r}, {len(info.hints)}) the code.")
    except ExerciseError as err:
        print(f"✗ {name}: not yet right.\n")
        print(str(err))


# ---------------------------------------------------------------------------- stepping


def step_slider(show_step, n: int, start: int = 0, description: str = "step") -> None:
    """A slider over show_step(i), i in [0, n). Outside a notebook (or without ipywidgets) it calls
    show_step(start) once, so a script run or a test still sees that step."""
    if n < 1:
        raise ValueError(f"step_slider needs at least one step, got n={n}.")
    start = min(max(start, 0), n - 1)
    try:
        import ipywidgets as widgets
        from IPython.display import display
    except ImportError:
        widgets = None
    if widgets is None or not in_kernel():
        show_step(start)
        return
    slider = widgets.IntSlider(value=start, min=0, max=n - 1, description=description, continuous_update=False)
    out = widgets.interactive_output(lambda i: show_step(i), {"i": slider})
    box = widgets.VBox([slider, out])
    display(box)


# ---------------------------------------------------------------------------- models


def load_model(preset: str = "small", seed: int = 0, weights: str = "auto"):
    """(model, trained): `tiny_k3.load_model` on the CPU, the shipped trained weights of `preset` when they
    exist (weights="auto"), else a random init seeded with `seed`. The lessons' narrative says which one it got."""
    from tiny_k3 import load_model as build

    model, source = build(preset, weights, seed, "cpu")
    return model, source == "trained"


def expected_answer(prompt: str) -> str | None:
    """The right continuation of a prompt in the training corpus's language (tiny_k3.corpus), or None.

    "…; m=7; … | m="  -> "7"   (recall: the value given to the key before the mark "|")
    "3+4="            -> "7"   (arithmetic: digits, + - * and brackets)
    """
    import re

    if "|" in prompt:
        before, after = prompt.rsplit("|", 1)
        asked = re.search(r"(\w+)=$", after.strip())
        given = asked and re.findall(rf"\b{re.escape(asked.group(1))}=(\d+)", before)
        return given[-1] if given else None
    expr = re.search(r"([0-9+\-*()]+)=$", prompt.strip())
    if expr is None:
        return None
    try:   # only digits, + - * and brackets reach eval: no names, no attributes
        return str(eval(expr.group(1), {"__builtins__": {}}, {}))  # noqa: S307
    except (SyntaxError, ZeroDivisionError):
        return None


def trace(model, text):
    """Run `text` (a string, or a list of token ids) through `model` one token at a time (the real decode
    path) with a TraceRecorder per token. Returns (ids, recorders): recorders[i] holds every event of token i."""
    import torch

    from tiny_k3 import TraceRecorder
    from tiny_k3.tokenizer import encode

    ids = encode(text) if isinstance(text, str) else [int(t) for t in text]
    cache, recorders = None, []
    with torch.no_grad():
        for token in ids:
            rec = TraceRecorder()
            _, cache = model(torch.tensor([[token]]), cache, recorder=rec)
            recorders.append(rec)
    return ids, recorders


def weights_note(trained: bool) -> str:
    return ("trained weights (shipped with tiny_k3)" if trained else
            "random initial weights (no trained checkpoint ships for this preset yet)")
