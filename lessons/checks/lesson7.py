"""Lesson 7 checks: routing with an ablated expert, the KL between two predictions, wiping one KDA head."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from ._common import ExerciseError, _call, _close, _fmt, _passed, _tensor, register


def _reference_route(scores, bias, top_k, ablated):
    """What `sim.interventions.AblateExpert` does, through the model's own hook (tiny_k3.hooks)."""
    from tiny_k3.hooks import Hooks

    router = SimpleNamespace(bias=bias, top_k=top_k, renormalize=True, scaling=1.0)
    r = Hooks(blocked_experts={0: tuple(ablated)}).route(0, scores, router)
    return r.expert_ids, r.weights


def _by_id(ids: torch.Tensor, weights: torch.Tensor) -> list[dict[int, float]]:
    return [dict(zip(i.tolist(), w.tolist())) for i, w in zip(ids, weights)]


@register("7.1", "ablated_route", difficulty=2, minutes=8, expects="""
my_ablated_route(scores, bias, top_k, ablated) -> (expert_ids, weights)
  scores [T, E] sigmoid affinities, bias [E] the selection bias, top_k an int, ablated a list of expert ids
  that may never be chosen. Return the top_k experts the router picks without them and their weights,
  both [T, top_k] (ids in any order). Everything else is lesson 1's routing.
Checked against what sim.interventions.AblateExpert does inside the model (tiny_k3.hooks).
""",
          hints=('An ablated expert must lose the *selection*, whatever its score and bias: make its biased score '
                 'smaller than every other before top-k, and the next expert in line takes the slot.',
                 'Routing as in 1.1 with one change before the top-k: on a copy of the biased scores [T, E], set '
                 'the columns of the ablated experts to minus infinity, for every token. Then the k largest → ids '
                 '[T, k]; the weights come from the UNBIASED scores at those ids, divided by their row sum → [T, k].',
                 "biased = scores + bias;  biased[:, list(ablated)] = float('-inf')\n"
                 '  ids = biased.topk(top_k, dim=-1).indices;  w = scores.gather(-1, ids);  return ids, w / '
                 'w.sum(-1, keepdim=True)'))
def check_ablated_route(fn) -> None:
    g = torch.Generator().manual_seed(7)
    T, E, k = 6, 24, 4
    scores = torch.sigmoid(torch.randn(T, E, generator=g, dtype=torch.float64))
    bias = 0.6 * torch.rand(E, generator=g, dtype=torch.float64)
    ablated = (scores + bias)[0].topk(2).indices.tolist()          # the two favourites of token 0
    bias[ablated[0]] = 2.0                                          # so large that zeroing its score is not enough
    want_ids, want_w = _reference_route(scores, bias, k, ablated)
    describe = f"scores [{T}, {E}], top_k={k}, ablated={ablated}"
    got = _call(fn, (scores.clone(), bias.clone(), k, list(ablated)), describe)
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise ExerciseError("Return a pair (expert_ids, weights), both of shape [T, top_k].")
    ids, w = got
    ids = torch.as_tensor(ids)
    if ids.dim() == 2 and ids.shape[-1] == k - 1:
        raise ExerciseError(f"You return {k - 1} experts per token: you took the top {k} and then dropped the "
                            f"ablated one. The router still picks {k}; the next in line takes the free slot.")
    if not isinstance(w, torch.Tensor):
        w = torch.as_tensor(w)
    ids = _tensor(ids, "expert_ids", (T, k), "top_k expert ids per token").long()
    w = _tensor(w, "weights", (T, k), "one weight per chosen expert")
    if any(set(r.tolist()) & set(ablated) for r in ids):
        hit = torch.isin(ids, torch.tensor(ablated))
        if torch.all(torch.as_tensor(w)[hit].abs() < 1e-12):
            raise ExerciseError(f"You took the top {k} and then gave the ablated expert weight 0 (or dropped it): "
                                f"that leaves {k - 1} experts working. The router still picks {k}; the next in line "
                                f"takes the free slot.")
        zeroed = scores.clone()
        zeroed[:, ablated] = 0
        if torch.equal((zeroed + bias).topk(k).indices.sort().values, ids.sort().values):
            raise ExerciseError(f"Expert {ablated[0]} is still chosen: setting its *score* to 0 leaves its bias "
                                f"(+{bias[ablated[0]].item():.2f}) to win the selection. Mask the biased score with "
                                f"-inf instead.")
        raise ExerciseError(f"An ablated expert ({ablated}) is still among your choices; it may never be selected.")
    if [set(r.tolist()) for r in ids] != [set(r.tolist()) for r in want_ids]:
        row = next(i for i in range(T) if set(ids[i].tolist()) != set(want_ids[i].tolist()))
        unbiased = scores.clone()
        unbiased[:, ablated] = -math.inf
        if set(ids[row].tolist()) == set(unbiased[row].topk(k).indices.tolist()):
            raise ExerciseError("You selected on the scores alone: the bias still decides *who* wins (lesson 1), "
                                f"only the ablated experts drop out. Token {row}: want {sorted(want_ids[row].tolist())}, "
                                f"yours {sorted(ids[row].tolist())}.")
        raise ExerciseError(f"Token {row} should get experts {sorted(want_ids[row].tolist())}, yours are "
                            f"{sorted(ids[row].tolist())} (top-{k} of scores + bias without {ablated}).")
    mine, ref = _by_id(ids, w.double()), _by_id(want_ids, want_w)
    ok = all(math.isclose(m[e], r[e], rel_tol=1e-6, abs_tol=1e-9) for m, r in zip(mine, ref) for e in r)
    if not ok:
        raw = scores.gather(-1, ids)
        biased = (scores + bias).gather(-1, ids)
        if _close(w.double(), raw):
            raise ExerciseError("The weights are the raw scores: renormalise them over the chosen experts "
                                "(they sum to 1).")
        if _close(w.double(), biased / biased.sum(-1, keepdim=True)):
            raise ExerciseError("The weights come from scores + bias; the bias only selects, the weights are the "
                                "unbiased scores of the winners, renormalised.")
        raise ExerciseError(f"Weights of token 0 should be {_fmt(torch.tensor([ref[0][e] for e in ids[0].tolist()]))} "
                            f"for your ids {ids[0].tolist()}; yours are {_fmt(w[0])}.")
    _passed("check_ablated_route", "the ablated experts are masked before top-k, the next in line takes the slot, "
                                   "weights from the unbiased scores.")


@register("7.2", "kl", difficulty=1, minutes=5, expects="""
my_kl(p_logits, q_logits) -> float
  p_logits, q_logits [V] logits of two next-token predictions (the original and the what-if).
  Return KL(p || q) in nats: how surprised, on average, the original's choices would be under the branch.
Checked against sim.whatif.kl_divergence, the number Simulation.what_if reports as WhatIf.kl.
""",
          hints=('Turn each row of logits into probabilities with a softmax first; KL weights the log-ratio by the '
                 '*original* distribution p and uses the natural log.',
                 'Two logit vectors [V] become two distributions p and q (a softmax over V each; work with '
                 'log-softmax, which stays finite where a probability underflows). KL(p ‖ q) = Σ_v p_v (log p_v − '
                 'log q_v): one number ≥ 0, in nats, returned as a Python float (not a 0-d tensor).',
                 'lp, lq = torch.log_softmax(p_logits, -1), torch.log_softmax(q_logits, -1)\n'
                 '  return float((lp.exp() * (lp - lq)).sum())'))
def check_kl(fn) -> None:
    from sim.whatif import kl_divergence

    g = torch.Generator().manual_seed(3)
    cases = [(torch.randn(11, generator=g, dtype=torch.float64) * 2, torch.randn(11, generator=g, dtype=torch.float64))
             for _ in range(3)]
    p0 = cases[0][0]
    cases.append((p0, p0 + 5.0))          # shifted logits: the same distribution, KL 0
    for p, q in cases:
        want = kl_divergence(p.numpy(), q.numpy())
        got = _call(fn, (p.clone(), q.clone()), f"p_logits {_fmt(p)}, q_logits {_fmt(q)}")
        if isinstance(got, torch.Tensor) or type(got).__module__ == "numpy" and not isinstance(got, float):
            shape = list(getattr(got, "shape", ()))
            raise ExerciseError(f"You returned a {type(got).__module__}.{type(got).__name__} of shape {shape}; the "
                                "spec asks for a plain Python float. A tensor still carries its dtype and device (and "
                                "float() of a 1-element tensor hides a wrong shape): finish with .item() on the "
                                "summed, 0-d result.")
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise ExerciseError(f"Return one number (a float), got {type(got).__name__}.")
        got = float(got)
        if math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9):
            continue
        lp, lq = torch.log_softmax(p, -1), torch.log_softmax(q, -1)
        right = f"Here KL(p || q) = {want:.6g} nats; yours is {got:.6g}."
        if math.isclose(got, float((lq.exp() * (lq - lp)).sum()), rel_tol=1e-6):
            raise ExerciseError("That is KL(q || p): the direction matters. Weight by the original p. " + right)
        if math.isclose(got, want / math.log(2), rel_tol=1e-6):
            raise ExerciseError("That is in bits (log base 2); WhatIf.kl is in nats (natural log). " + right)
        if math.isclose(got, float(-(lp.exp() * lq).sum()), rel_tol=1e-6):
            raise ExerciseError("That is the cross-entropy H(p, q) = KL(p || q) + H(p); subtract the entropy of "
                                "p (use log p - log q). " + right)
        if math.isclose(got, float((lp - lq).sum()), rel_tol=1e-6):
            raise ExerciseError("You summed the log-ratio without weighting it by p. " + right)
        if math.isclose(got, want / p.numel(), rel_tol=1e-6):
            raise ExerciseError("That is a mean over the vocabulary; KL is a sum. " + right)
        raise ExerciseError(right)
    _passed("check_kl", "KL(p || q) in nats from two rows of logits, 0 for the same distribution.")


@register("7.3", "reset_head", difficulty=2, minutes=8, expects="""
my_reset_head(state, conv, head, num_heads, head_dim) -> (state, conv)
  One KDA layer's decode cache: state [B, H, K, V] (the memory S per head) and conv [B, W-1, 3*H*K], the
  last W-1 inputs of the short convolutions of q | k | v (each part head-major: head h owns channels
  h*K .. h*K+K-1 of its part). Return a *new* (state, conv) with everything of `head` wiped, as
  ResetState(layer, head) does; the cache you were given must not change (it belongs to the timeline).
Checked against tiny_k3.hooks.Hooks.reset_state, what ResetState uses inside the model.
""",
          hints=("A head remembers in two places: its matrix S and the short conv's tail of its q, k and v channels "
                 '(the next token still mixes in the last W-1 inputs). Clone before you zero.',
                 'Copy both tensors first. state [B, H, K, V]: zero everything of head `head` on axis 1. conv [B, '
                 'W−1, 3·H·K] holds q | k | v, each part head-major, so head h owns, in part p ∈ {0, 1, 2}, the K '
                 'channels starting at p·H·K + h·K. Zero those three runs of K channels (every batch row, every '
                 'kept step).',
                 'state, conv = state.clone(), conv.clone();  state[:, head] = 0\n'
                 '  for part in range(3):\n'
                 '      start = part * num_heads * head_dim + head * head_dim;  conv[..., start:start + head_dim] = '
                 '0'))
def check_reset_head(fn) -> None:
    from tiny_k3.cache import KDAState
    from tiny_k3.hooks import Hooks

    g = torch.Generator().manual_seed(5)
    B, H, K, W = 1, 3, 4, 4
    state = torch.randn(B, H, K, K, generator=g)
    conv = torch.randn(B, W - 1, 3 * H * K, generator=g)
    head = 1
    want = Hooks(reset_heads={0: (head,)}).reset_state(0, KDAState(state, conv), H, K)
    s_in, c_in = state.clone(), conv.clone()
    got = _call(fn, (s_in, c_in, head, H, K), f"state [{B}, {H}, {K}, {K}], conv [{B}, {W - 1}, {3 * H * K}], head={head}")
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise ExerciseError("Return a pair (state, conv) with the same shapes as the inputs.")
    s, c = (_tensor(got[0], "state", tuple(state.shape), "[B, H, K, V]"),
            _tensor(got[1], "conv", tuple(conv.shape), "[B, W-1, 3*H*K]"))
    if not (torch.equal(s_in, state) and torch.equal(c_in, conv)):
        raise ExerciseError("You changed the cache you were given in place: that cache is the main timeline's, so "
                            "the what-if would wipe the original too. Clone, then zero the copy.")
    if not torch.equal(s, want.state):
        if torch.equal(s, torch.zeros_like(s)):
            raise ExerciseError(f"You zeroed every head; only head {head} is reset, the others keep their memory.")
        raise ExerciseError(f"state[:, {head}] must be all zeros and every other head unchanged.")
    if torch.equal(c, conv):
        raise ExerciseError(f"The conv tail is unchanged: head {head}'s last {W - 1} q, k, v inputs would still "
                            f"flow into the next token through the short convolution. Zero them too.")
    if not torch.equal(c, want.conv):
        only_q = conv.clone()
        only_q[..., head * K:(head + 1) * K] = 0
        if torch.equal(c, only_q):
            raise ExerciseError("You cleared the head's q channels only; the tail holds q | k | v, each with the "
                                "head's K channels: three stretches to zero.")
        interleaved = conv.clone()
        interleaved[..., head * 3 * K:(head + 1) * 3 * K] = 0
        if torch.equal(c, interleaved):
            raise ExerciseError("The channels are laid out q | k | v (each head-major), not head by head with q, k, "
                                "v together: head h's k channels start at H*K + h*K.")
        zeroed = (c != conv).any(0).any(0).nonzero().flatten().tolist()
        raise ExerciseError(f"Wrong conv channels zeroed (yours: {zeroed[:6]}{'…' if len(zeroed) > 6 else ''}); "
                            f"head {head} owns {[p * H * K + head * K for p in range(3)]} (+0..{K - 1}).")
    _passed("check_reset_head", "the head's S and its q, k, v conv tail wiped, a copy made, the other heads kept.")
