"""Lesson 8 checks: the weighted next-byte loss, the learning-rate schedule, the Wilson interval of a recall."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._common import ExerciseError, _call, _fmt, _passed, register


def _number(x, name: str) -> float:
    """A learner's scalar as a float (a Python number or a one-element tensor), or a teaching error."""
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        return float(x)
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ExerciseError(f"{name} should be a number; got {type(x).__name__}.")
    return float(x)


class _FixedLogits(torch.nn.Module):
    """A stand-in model for tiny_k3.train.lm_loss: whatever the tokens, these logits."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = logits

    def forward(self, tokens, **options):        # lm_loss passes the model's options too (hooks=...): unused here
        return self.logits, None


@register("8.1", "weighted_loss", difficulty=2, minutes=8, expects="""
my_weighted_loss(logits, targets, weights) -> loss        the number train() minimises at every step
  logits [B, T, V]: the model's scores for the next byte at every position;  targets [B, T] long: the bytes
  that came next;  weights [B, T] float: how much each target counts (1 for most bytes, 10 for the recalled
  values and the results of sums, 0 where nothing is predicted).
  returns a 0-d tensor: the cross-entropy of each target, averaged with those weights.
Checked against tiny_k3.train.lm_loss, the loss of every training step.
""",
          hints=("Cross-entropy per target first, one number per position; then a weighted mean, so that an answer "
                 "byte with weight 10 counts ten times, and a position of weight 0 not at all.",
                 "Flatten logits to [B·T, V] and targets to [B·T]; the per-position cross-entropy (no reduction) → "
                 "[B·T] nats. Multiply by the flattened weights [B·T], sum, and divide by the sum of the weights "
                 "(not by the number of positions). One 0-d tensor.",
                 "ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction='none')\n"
                 "  w = weights.reshape(-1);  return (ce * w).sum() / w.sum()"))
def check_weighted_loss(fn) -> None:
    from tiny_k3.data import Rows
    from tiny_k3.train import lm_loss

    gen = torch.Generator().manual_seed(8)
    for B, T, V in [(2, 5, 7), (1, 1, 4), (3, 9, 16)]:
        logits = 3 * torch.randn(B, T, V, generator=gen, dtype=torch.float64)
        targets = torch.randint(0, V, (B, T), generator=gen)
        weights = torch.where(torch.rand(B, T, generator=gen) < 0.3, 10.0, 1.0).double()
        weights[0, 0] = 0.0 if T > 1 else 1.0                        # a position that is not predicted
        rows = Rows(torch.cat([torch.zeros(B, 1, dtype=torch.long), targets], 1),
                    torch.cat([torch.zeros(B, 1, dtype=torch.float64), weights], 1))
        want = float(lm_loss(_FixedLogits(logits), rows))
        got = _number(_call(fn, (logits.clone(), targets.clone(), weights.clone()),
                            f"logits [{B}, {T}, {V}], targets [{B}, {T}], weights [{B}, {T}]",
                            "F.cross_entropy wants [N, V] logits and [N] targets: flatten B and T together."),
                      "the loss")
        if math.isclose(got, want, rel_tol=1e-5):        # lm_loss computes in float32
            continue
        right = f"For this input the loss is {want:.6f} nats; yours is {got:.6f}."
        ce = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), reduction="none")
        w = weights.reshape(-1)
        wrong = [
            (ce.mean(), "You took the plain mean: the weights are the point. An answer byte (weight 10) must count "
                        "ten times as much as a filler byte, a weight-0 position not at all: Σ w·ce / Σ w."),
            ((ce * w).mean(), "You divided by the number of positions; a weighted mean divides by the sum of the "
                              "weights, Σ w·ce / Σ w, so the loss stays in nats per byte."),
            ((ce * w).sum(), "That is the weighted sum; divide it by the sum of the weights."),
            ((F.nll_loss(logits.softmax(-1).reshape(-1, V), targets.reshape(-1), reduction="none") * w).sum() / w.sum(),
             "You used probabilities where the cross-entropy takes the log-softmax: ce = −log softmax(logits)"
             "[target]."),
        ]
        for candidate, message in wrong:
            if math.isclose(got, float(candidate), rel_tol=1e-5):
                raise ExerciseError(message + "\n  " + right)
        raise ExerciseError(right)
    _passed("check_weighted_loss", "your loss equals tiny_k3.train.lm_loss: the answer bytes weigh 10x.")


@register("8.2", "lr_at", difficulty=2, minutes=8, expects="""
my_lr_at(step, steps, lr, warmup) -> float                 the learning rate of 0-based `step` of a run of `steps`
  a linear warm-up: the first `warmup` steps climb in equal increments to lr (step 0 already gets lr / warmup,
  never 0), then a half cosine from lr at the end of the warm-up down to lr / 10 at the last step.
Checked against tiny_k3.train.lr_at, the schedule train() uses, at every step of several runs.
""",
          hints=("Two phases: a straight ramp up during the first warmup steps, then half a cosine wave that "
                 "starts at the top (lr) and ends at a floor of a tenth of lr.",
                 "Warm-up: lr times (step + 1) / warmup. After it: progress = the steps done since the warm-up over "
                 "the steps left after it, from 0 to 1 (at least 1 in the denominator); the rate is lr × (0.1 + "
                 "0.9 × ½ (1 + cos(π · progress))), so lr at progress 0 and lr / 10 at 1.",
                 "if step < warmup: return lr * (step + 1) / warmup\n"
                 "  progress = (step - warmup) / max(1, steps - warmup)\n"
                 "  return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))"))
def check_lr_at(fn) -> None:
    from tiny_k3.train import lr_at

    for steps, lr, warmup in [(100, 2e-3, 10), (1200, 3e-3, 100), (7, 1.0, 0), (50, 1e-2, 50)]:
        for step in range(steps):
            want = lr_at(step, steps, lr, warmup)
            got = _number(_call(fn, (step, steps, lr, warmup), f"step={step}, steps={steps}, lr={lr}, warmup={warmup}"),
                          "the learning rate")
            if math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15):
                continue
            right = (f"At step {step} of {steps} (lr={lr}, warmup={warmup}) the rate is {want:.6g}; yours is "
                     f"{got:.6g}.")
            if step < warmup and math.isclose(got, lr * step / warmup, rel_tol=1e-9):
                raise ExerciseError("Your warm-up starts at 0: step 0 would not learn at all. Count the step "
                                    "being taken: lr · (step + 1) / warmup.\n  " + right)
            if step >= warmup:
                progress = (step - warmup) / max(1, steps - warmup)
                if math.isclose(got, lr * 0.5 * (1 + math.cos(math.pi * progress)), rel_tol=1e-9):
                    raise ExerciseError("Your cosine decays to 0; this schedule keeps a floor of lr / 10: "
                                        "lr · (0.1 + 0.9 · ½(1 + cos πp)).\n  " + right)
                if math.isclose(got, lr * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps))), rel_tol=1e-9):
                    raise ExerciseError("Measure the cosine's progress from the end of the warm-up: p = (step − "
                                        "warmup) / (steps − warmup), so it starts at the top.\n  " + right)
            raise ExerciseError(right)
    _passed("check_lr_at", "your schedule equals tiny_k3.train.lr_at at every step (warm-up, cosine, floor lr/10).")


@register("8.3", "wilson_interval", difficulty=2, minutes=10, expects="""
my_wilson_interval(hits, n, z=1.96) -> (low, high)       how sure a measured recall is
  hits of n answers right; returns the Wilson score interval of the proportion hits / n as two floats in
  [0, 1] (the 95 % interval at z = 1.96). Unlike p ± z·√(p(1−p)/n) it does not shrink to a point at 0 or n.
Checked against tiny_k3.recall.wilson_interval, which every recall figure of these lessons uses.
""",
          hints=("The Wilson interval solves for the proportions that the observed p would not reject: its centre "
                 "is pulled from p towards ½, and its width keeps a floor even when p is 0 or 1.",
                 "Wilson's interval is every true share π that the observed share p (hits of n) lies within z standard "
                 "errors of, the error taken at π (not at p): |p − π| ≤ z √(π(1 − π)/n). Square both sides and it is "
                 "a quadratic inequality in π, (1 + z²/n) π² − (2p + z²/n) π + p² ≤ 0; its two roots are low and "
                 "high. Solve it with the quadratic formula, and keep the roots in [0, 1].",
                 "p = hits / n;  centre = (p + z * z / (2 * n)) / (1 + z * z / n)\n"
                 "  half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))\n"
                 "  return max(0.0, centre - half), min(1.0, centre + half)"))
def check_wilson_interval(fn) -> None:
    from tiny_k3.recall import wilson_interval

    for hits, n in [(48, 96), (0, 10), (10, 10), (3, 40), (1, 1000), (71, 120)]:
        want = wilson_interval(hits, n)
        got = _call(fn, (hits, n), f"hits={hits}, n={n}")
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise ExerciseError("Return two numbers: (low, high).")
        low, high = _number(got[0], "low"), _number(got[1], "high")
        if math.isclose(low, want[0], abs_tol=1e-9) and math.isclose(high, want[1], abs_tol=1e-9):
            continue
        right = (f"For {hits} of {n} the 95 % interval is [{want[0]:.4f}, {want[1]:.4f}]; yours is "
                 f"[{low:.4f}, {high:.4f}].")
        p, z = hits / n, 1.96
        wald = z * math.sqrt(p * (1 - p) / n)
        if math.isclose(low, max(0.0, p - wald), abs_tol=1e-9) and math.isclose(high, min(1.0, p + wald), abs_tol=1e-9):
            raise ExerciseError("That is the normal (Wald) interval p ± z√(p(1−p)/n): at 0 or n hits it is a single "
                                "point, as if 10 answers could prove a recall of exactly 0 %. Use Wilson's: centre "
                                "(p + z²/2n)/(1 + z²/n).\n  " + right)
        no_floor = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n)
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        if math.isclose(low, max(0.0, centre - no_floor), abs_tol=1e-9):
            raise ExerciseError("Your half-width misses the z²/(4n²) term under the root: it is what keeps the "
                                "interval open at 0 and n hits.\n  " + right)
        if low > high:
            raise ExerciseError("Your low is above your high: return (low, high).\n  " + right)
        raise ExerciseError(right + f" (For this input the centre is {_fmt(centre)}.)")
    _passed("check_wilson_interval", "your interval equals tiny_k3.recall.wilson_interval, open at 0 and n hits.")
