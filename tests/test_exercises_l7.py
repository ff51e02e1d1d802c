"""Lesson 7's checks teach: each usual mistake is named (the reference solutions pass in test_exercises.py)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lessons"))

import checks  # noqa: E402
import solutions  # noqa: E402
from checks import ExerciseError  # noqa: E402


def fails_with(check, fn, *fragments):
    with pytest.raises(ExerciseError) as info:
        check(fn)
    for fragment in fragments:
        assert fragment in str(info.value), f"expected {fragment!r} in:\n{info.value}"


def _renorm(scores, ids):
    w = scores.gather(-1, ids)
    return ids, w / w.sum(-1, keepdim=True)


def test_ablated_route_mistakes_are_named():
    def drop_after_topk(scores, bias, k, ablated):
        ids = (scores + bias).topk(k, -1).indices
        w = scores.gather(-1, ids) * ~torch.isin(ids, torch.tensor(ablated))
        return ids, w / w.sum(-1, keepdim=True)

    def fewer(scores, bias, k, ablated):
        b = scores + bias
        b[:, ablated] = -math.inf
        return _renorm(scores, b.topk(k - 1, -1).indices)

    def zero_the_score(scores, bias, k, ablated):
        s = scores.clone()
        s[:, ablated] = 0
        return _renorm(scores, (s + bias).topk(k, -1).indices)

    def scores_only(scores, bias, k, ablated):
        s = scores.clone()
        s[:, ablated] = -math.inf
        return _renorm(scores, s.topk(k, -1).indices)

    def biased_weights(scores, bias, k, ablated):
        b = scores + bias
        b[:, ablated] = -math.inf
        ids = b.topk(k, -1).indices
        w = (scores + bias).gather(-1, ids)
        return ids, w / w.sum(-1, keepdim=True)

    def no_renorm(scores, bias, k, ablated):
        ids, _ = solutions.ablated_route(scores, bias, k, ablated)
        return ids, scores.gather(-1, ids)

    fails_with(checks.check_ablated_route, drop_after_topk, "gave the ablated expert weight 0")
    fails_with(checks.check_ablated_route, fewer, "You return 3 experts per token")
    fails_with(checks.check_ablated_route, zero_the_score, "setting its *score* to 0", "-inf")
    fails_with(checks.check_ablated_route, scores_only, "selected on the scores alone")
    fails_with(checks.check_ablated_route, biased_weights, "weights come from scores + bias")
    fails_with(checks.check_ablated_route, no_renorm, "renormalise")


def test_kl_mistakes_are_named():
    lsm = torch.log_softmax
    fails_with(checks.check_kl, lambda p, q: solutions.kl(q, p), "KL(q || p)")
    fails_with(checks.check_kl, lambda p, q: solutions.kl(p, q) / math.log(2), "bits")
    fails_with(checks.check_kl, lambda p, q: float(-(lsm(p, -1).exp() * lsm(q, -1)).sum()), "cross-entropy")
    fails_with(checks.check_kl, lambda p, q: float((lsm(p, -1) - lsm(q, -1)).sum()), "without weighting it by p")
    fails_with(checks.check_kl, lambda p, q: solutions.kl(p, q) / p.numel(), "mean over the vocabulary")


def test_reset_head_mistakes_are_named():
    def in_place(state, conv, head, H, K):
        state[:, head] = 0
        for part in range(3):
            conv[..., part * H * K + head * K:part * H * K + (head + 1) * K] = 0
        return state, conv

    def all_heads(state, conv, head, H, K):
        return torch.zeros_like(state), torch.zeros_like(conv)

    def state_only(state, conv, head, H, K):
        s = state.clone()
        s[:, head] = 0
        return s, conv.clone()

    def q_only(state, conv, head, H, K):
        s, c = state.clone(), conv.clone()
        s[:, head] = 0
        c[..., head * K:(head + 1) * K] = 0
        return s, c

    def interleaved(state, conv, head, H, K):
        s, c = state.clone(), conv.clone()
        s[:, head] = 0
        c[..., head * 3 * K:(head + 1) * 3 * K] = 0
        return s, c

    fails_with(checks.check_reset_head, in_place, "in place")
    fails_with(checks.check_reset_head, all_heads, "every head")
    fails_with(checks.check_reset_head, state_only, "conv tail is unchanged")
    fails_with(checks.check_reset_head, q_only, "q channels only")
    fails_with(checks.check_reset_head, interleaved, "q | k | v (each head-major)")


@pytest.mark.parametrize("wrap", [lambda v: torch.tensor(v), lambda v: torch.tensor([v]),
                                  lambda v: torch.tensor(v).numpy()], ids=["0-d tensor", "1-element tensor", "numpy 0-d"])
def test_kl_refuses_a_tensor_where_the_spec_asks_for_a_float(wrap):
    """The right value, returned as a tensor or array instead of a float, fails with a message that says so."""
    fails_with(checks.check_kl, lambda p, q: wrap(solutions.kl(p, q)), "plain Python float", ".item()")


def test_kl_refuses_a_bool_and_accepts_a_numpy_float():
    fails_with(checks.check_kl, lambda p, q: True, "Return one number")
    import numpy as np

    checks.check_kl(lambda p, q: np.float64(solutions.kl(p, q)))     # np.float64 is a float: accepted
