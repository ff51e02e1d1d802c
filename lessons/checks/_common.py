"""Shared helpers of the exercise checks: the error type, formatting, calling the learner's function, the registry.

Every check is registered with `@register(...)`: its exercise number ("1.1"), the name of its reference solution,
a difficulty (1 = warm-up, 2 = core, 3 = stretch), the minutes a learner typically needs, the spec `try_exercise`
prints while the stub is not written (shapes and meaning, no formula), and three hints, a ladder a learner climbs
only as far as needed: rung 1 names the idea, rung 2 the shape of the computation (shapes and operations in words
or pseudo-maths, no code), rung 3 the code. `hint("1.1")`, `hint("route", 2)` or `hint(check_route, 3)` print
them; tests/test_hints.py keeps the solution's code out of every rung but the last.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

class ExerciseError(AssertionError):
    """A learner's function gave a wrong answer; the message says what, where, and the right value."""


# ---------------------------------------------------------------------------- helpers


def _fmt(x, digits: int = 4, limit: int = 6) -> str:
    """A short printable form of a tensor / list / number."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dim() == 0:
            return f"{x.item():.{digits}g}"
        flat = x.flatten().tolist()
        body = ", ".join(f"{v:.{digits}g}" if isinstance(v, float) else str(v) for v in flat[:limit])
        more = ", …" if len(flat) > limit else ""
        return f"[{body}{more}] (shape {list(x.shape)})" if x.dim() > 1 else f"[{body}{more}]"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return repr(x)


def _call(fn, args: tuple, describe: str, tip: str = ""):
    """Call the learner's function; any exception but NotImplementedError becomes a teaching error."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise
    except ExerciseError:
        raise
    except Exception as exc:  # the learner's bug, reported with the inputs that caused it
        msg = f"Your function raised {type(exc).__name__}: {exc}\n  on input {describe}."
        raise ExerciseError(msg + (f"\n  Hint: {tip}" if tip else "")) from None


def _tensor(x, name: str, shape: tuple, meaning: str) -> torch.Tensor:
    """The learner's output as a tensor of the expected shape, or a message naming the shape."""
    if not isinstance(x, torch.Tensor):
        try:
            x = torch.as_tensor(x)
        except Exception:
            raise ExerciseError(f"{name} should be a tensor of shape {list(shape)} ({meaning}); "
                                f"got a {type(x).__name__}.") from None
    if tuple(x.shape) != tuple(shape):
        raise ExerciseError(f"{name} has shape {list(x.shape)} but should be {list(shape)} ({meaning}).")
    return x


def _close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-6, rtol: float = 1e-5) -> bool:
    return tuple(a.shape) == tuple(b.shape) and torch.allclose(a.to(torch.float64), b.to(torch.float64),
                                                               atol=atol, rtol=rtol)


def _int(x, name: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, float)) and not (isinstance(x, torch.Tensor) and x.numel() == 1):
        raise ExerciseError(f"{name} should be a number of bytes (an int); got {type(x).__name__}.")
    value = float(x)
    if not math.isfinite(value):
        raise ExerciseError(f"{name} should be a finite number of bytes; got {value}.")
    return round(value)


def _passed(name: str, what: str) -> None:
    print(f"✓ {name} passed: {what}")


@dataclass(frozen=True)
class Exercise:
    """One exercise: what the learner writes, how hard it is, and its rungs of hints."""

    number: str          # "1.1": lesson 1, exercise 1
    solution: str        # the name of the reference solution in lessons/solutions/ (and of @exercise(...))
    check: object        # the check function
    difficulty: int      # 1 warm-up, 2 core, 3 stretch
    minutes: int         # typical time for a learner, in minutes
    hints: tuple[str, ...]   # the rungs, in order: the idea, then the shape of the computation, then the code

    @property
    def stars(self) -> str:
        return "★" * self.difficulty + "☆" * (3 - self.difficulty)

    @property
    def label(self) -> str:
        return f"exercise {self.number} · difficulty {self.stars} · about {self.minutes} min"


EXERCISES: dict[str, Exercise] = {}       # by number, in the order the lessons import them


def register(number: str, solution: str, difficulty: int, minutes: int, expects: str, hints: tuple[str, ...]):
    """Register a check: see the module docstring. The spec is attached as `check.expects`."""
    if difficulty not in (1, 2, 3) or minutes < 1 or len(hints) not in (2, 3) or not all(h.strip() for h in hints):
        raise ValueError(f"exercise {number}: difficulty is 1, 2 or 3, minutes >= 1, and two or three non-empty hints.")

    def wrap(check):
        check.expects = expects.strip()
        check.exercise = Exercise(number, solution, check, difficulty, minutes, tuple(h.strip() for h in hints))
        EXERCISES[number] = check.exercise
        return check

    return wrap


def find_exercise(name) -> Exercise:
    """The Exercise for a number ("2.1"), a solution name ("kda_step"), a check name or the check itself."""
    if callable(name) and hasattr(name, "exercise"):
        return name.exercise
    for ex in EXERCISES.values():
        if name in (ex.number, ex.solution, ex.check.__name__, f"my_{ex.solution}"):
            return ex
    known = ", ".join(f"{e.number} ({e.solution})" for e in EXERCISES.values())
    raise ValueError(f"no exercise called {name!r}; the exercises are {known}.")


def hint(name, level: int = 1) -> None:
    """Print hint `level` (1: the idea, then the shape of the computation, then the code) for an exercise,
    e.g. hint("1.1") or hint("kda_step", 2)."""
    ex = find_exercise(name)
    if level not in range(1, len(ex.hints) + 1):
        raise ValueError(f"hint level for {ex.number} is 1 to {len(ex.hints)}, got {level!r}.")
    print(f"hint {level}/{len(ex.hints)} for {ex.label}:\n{ex.hints[level - 1]}")
