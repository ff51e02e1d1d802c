"""Lesson 1 checks: top-k routing with a selection bias, active parameters, the aux-loss-free bias step."""

from __future__ import annotations

import functools
import math

import torch

from ._common import ExerciseError, _call, _close, _fmt, _int, _passed, _tensor, register

@register("1.1", "route", difficulty=1, minutes=10, expects="""
my_route(scores, bias, top_k) -> (expert_ids, weights)
  scores [T, E]  sigmoid affinities s (each in (0, 1)), bias [E] the selection bias b, top_k = k
  expert_ids [T, k] (long): the k experts the router picks for each token (any order)
  weights    [T, k]: how much each chosen expert counts; they add up to 1 per token
Checked against tiny_k3.moe.route on random routers with E = 12, 56 and 896 (k3_facts.md §1c, §3b).
""",
          hints=('The bias decides WHO is chosen; the unbiased scores decide HOW MUCH each chosen expert counts.',
                 'scores [T, E] plus bias [E] (broadcast over the T tokens) gives the biased scores [T, E]. The k '
                 'largest along the expert axis give expert_ids [T, k]. Look up the UNBIASED scores at those ids: '
                 '[T, k]. Divide each row by its own sum, so that the k weights of a token add up to 1. Two '
                 'results, both [T, k].',
                 'expert_ids = (scores + bias).topk(top_k, dim=-1).indices\n'
                 '  chosen = scores.gather(-1, expert_ids);  weights = chosen / chosen.sum(-1, keepdim=True)'))
def check_route(fn) -> None:
    from tiny_k3.moe import route

    gen = torch.Generator().manual_seed(1)
    for T, E, k in [(3, 12, 3), (4, 56, 4), (2, 896, 16)]:
        scores = torch.sigmoid(torch.randn(T, E, generator=gen, dtype=torch.float64))
        bias = 0.4 * torch.randn(E, generator=gen, dtype=torch.float64)
        ref = route(scores, bias, k)
        got = _call(fn, (scores.clone(), bias.clone(), k), f"scores [{T}, {E}], bias [{E}], top_k={k}",
                    "topk(scores + bias, k) gives the ids; scores.gather(-1, ids) the unbiased scores.")
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise ExerciseError("Return two things: (expert_ids [T, k], weights [T, k]).")
        ids = _tensor(got[0], "expert_ids", (T, k), "k expert ids per token")
        w = _tensor(got[1], "weights", (T, k), "one weight per chosen expert")
        ids = ids.long()
        want_ids = ref.expert_ids.sort(-1).values
        if not torch.equal(ids.sort(-1).values, want_ids):
            plain = scores.topk(k, -1).indices.sort(-1).values
            if torch.equal(ids.sort(-1).values, plain):
                raise ExerciseError(
                    "You chose the experts by the score s alone. The selection bias b decides *which* experts "
                    "win: take topk(s + b). (It is DeepSeek-V3's aux-loss-free balancing: b is nudged during "
                    "training so every expert gets its share; k3_facts.md §3b.)\n"
                    f"  token 0: right ids {_fmt(want_ids[0], limit=16)}, yours {_fmt(ids.sort(-1).values[0], limit=16)}.")
            low = (scores + bias).topk(k, -1, largest=False).indices.sort(-1).values
            if torch.equal(ids.sort(-1).values, low):
                raise ExerciseError("You took the k *smallest* biased scores; the router keeps the largest.")
            raise ExerciseError(f"Wrong experts for E={E}, k={k}: token 0 should use {_fmt(want_ids[0], limit=16)} "
                                f"(the k largest s + b), yours are {_fmt(ids.sort(-1).values[0], limit=16)}.")
        # align the learner's weights with the reference order, whatever order the ids came in
        order = [(ids[t].unsqueeze(0) == ref.expert_ids[t].unsqueeze(1)).int().argmax(1) for t in range(T)]
        w = torch.stack([w[t, order[t]] for t in range(T)])
        if _close(w, ref.weights, atol=1e-6):
            continue
        chosen = scores.gather(-1, ref.expert_ids)
        biased = (scores + bias).gather(-1, ref.expert_ids)
        wrong = {
            "biased": biased / biased.sum(-1, keepdim=True),
            "biased_raw": biased,
            "raw": chosen,
            "softmax": chosen.softmax(-1),
            "softmax_all": torch.softmax(scores, -1).gather(-1, ref.expert_ids),
        }
        right = f"for token 0 the right weights are {_fmt(ref.weights[0])}, yours {_fmt(w[0])}."
        if _close(w, wrong["biased"]) or _close(w, wrong["biased_raw"]):
            raise ExerciseError("Your weights include the selection bias. Select with s + b, but weigh with the "
                                "unbiased s only: w = s[ids] / Σ s[ids] (the bias is for balancing, never "
                                "for mixing; k3_facts.md §1c).\n  " + right)
        if _close(w, wrong["raw"]):
            raise ExerciseError(f"Your weights sum to {w[0].sum().item():.3f} for token 0, not 1: renormalise, "
                                "w = s[ids] / Σ s[ids] (K3 config: moe_renormalize = true, "
                                "routed_scaling_factor = 1.0).\n  " + right)
        if _close(w, wrong["softmax"]) or _close(w, wrong["softmax_all"]):
            raise ExerciseError("You took a softmax. K3's router is sigmoid-based: the weights are the chosen "
                                "sigmoid scores divided by their sum (no exponentials).\n  " + right)
        raise ExerciseError("The ids are right but the weights are not: " + right)
    _passed("check_route", "top-k of s + b, weights from s, renormalised — same as tiny_k3.moe.route "
                           "for E = 12, 56 and 896.")


@register("1.2", "active_params", difficulty=1, minutes=8, expects="""
my_active_params(parts, num_experts, top_k) -> int
  parts: tiny_k3.parameter_breakdown(config), parameters per part of the model (a dict), e.g.
         {"routed_experts": ..., "kda": ..., "mla": ..., "shared_experts": ..., "latent_proj": ...,
          "router": ..., "dense_mlp": ..., "embedding": ..., "lm_head": ..., "norms_attnres": ...}
  returns the parameters ONE token touches (the convention behind K3's "104B active", k3_facts.md §1d).
Checked against tiny_k3.parameter_counts for tiny, small, mini-56/1, mini-896/16 and k3.
""",
          hints=('A token multiplies every weight except the idle routed experts; the input embedding is a lookup, '
                 'not a matmul.',
                 "Start from the sum of every part's count. Take away the embedding (a lookup). Of the routed "
                 'experts a token uses top_k out of num_experts: take away the idle share, routed × (num_experts − '
                 'top_k) / num_experts, in whole numbers (floor division). One int out.',
                 "idle = parts['routed_experts'] * (num_experts - top_k) // num_experts\n"
                 "  return sum(parts.values()) - parts['embedding'] - idle"))
def check_active_params(fn) -> None:
    from tiny_k3 import K3Config, parameter_breakdown, parameter_counts

    for name in ["tiny", "small", "mini-56/1", "mini-896/16", "k3"]:
        cfg = K3Config.preset(name)
        parts = dict(parameter_breakdown(cfg))
        total, want = parameter_counts(cfg)
        got = _int(_call(fn, (dict(parts), cfg.num_experts, cfg.top_k),
                         f"parameter_breakdown({name!r}), num_experts={cfg.num_experts}, top_k={cfg.top_k}"),
                   "my_active_params(...)")
        if abs(got - want) <= 1:
            continue
        right = f"For {name!r} the right count is {want:,}; yours is {got:,}."
        experts_on = parts["routed_experts"] * cfg.top_k // cfg.num_experts
        if got == total:
            raise ExerciseError("You returned every parameter (the total). A token runs only top_k of the "
                                "num_experts routed experts: count routed_experts × top_k / num_experts. " + right)
        if abs(got - (want + parts["embedding"])) <= 1:
            raise ExerciseError("You counted the input embedding. It is a table lookup (one row per token), not "
                                "a matmul, so K3's 104B leaves it out; the lm_head *is* a matmul and counts. " + right)
        if abs(got - (want - parts["lm_head"])) <= 1:
            raise ExerciseError("You left out the lm_head: every token multiplies it to get its logits. " + right)
        if abs(got - (want - parts["router"])) <= 1:
            raise ExerciseError("You left out the router: it scores all E experts for every token, so all of it "
                                "is active. " + right)
        if abs(got - (want - parts["shared_experts"])) <= 1:
            raise ExerciseError("You left out the shared experts: they run on every token. " + right)
        if abs(got - experts_on) <= 1:
            raise ExerciseError("You counted only the active routed experts. Attention, shared experts, router, "
                                "latent projections, norms and the head run for every token too. " + right)
        raise ExerciseError(right + " Active = everything except the embedding and the idle "
                                    "(num_experts − top_k) / num_experts of the routed experts.")
    _passed("check_active_params", "matches tiny_k3.parameter_counts (from the real modules on the meta "
                                   f"device) on five presets, K3 included: {want / 1e9:.1f}B active.")


def _loads_with_balanced_experts(E: int, gen: torch.Generator) -> torch.Tensor:
    """Tokens per expert whose mean is an exact integer m, with a quarter of the experts exactly at m."""
    m = 12
    dev = torch.randint(1, m + 1, (E // 2,), generator=gen) * (torch.randint(0, 2, (E // 2,), generator=gen) * 2 - 1)
    dev[: max(1, E // 8)] = 0                                    # these pairs sit exactly at the mean
    load = (m + torch.cat([dev, -dev])).float()                 # deviations cancel: mean(load) == m exactly
    return load[torch.randperm(E, generator=gen)]


@register("1.3", "bias_update", difficulty=1, minutes=6, expects="""
my_bias_update(bias, load, rate) -> new_bias
  bias [E] the selection bias b, load [E] tokens routed to each expert in the last batch, rate = γ.
  One step of DeepSeek-V3's aux-loss-free balancing (k3_facts.md §3b): overloaded experts become less
  attractive, underloaded ones more, and an expert exactly at the mean load keeps its bias.
Checked against tiny_k3.moe.Router.update_bias, on loads where some experts sit exactly at the mean.
""",
          hints=('Every bias moves by the same fixed step γ; only the direction depends on the load (and a balanced '
                 'expert does not move).',
                 "bias [E], load [E], a float rate. Compare each expert's load with the mean over all E experts: "
                 'below the mean gives +1, above gives −1, exactly at the mean gives 0 (the sign of mean − load). '
                 'That [E] vector of +1 / 0 / −1, times the rate, added to the bias, is the new bias [E].',
                 "bias + rate * torch.sign(load.mean() - load)      (sign(0) = 0 keeps a balanced expert's bias)"))
def check_bias_update(fn) -> None:
    from tiny_k3.moe import Router

    gen = torch.Generator().manual_seed(3)
    for E in [8, 56, 896]:
        bias = 0.01 * torch.randn(E, generator=gen)
        load = _loads_with_balanced_experts(E, gen)
        balanced = load == load.mean()
        router = Router(4, E, 1)
        router.bias.copy_(bias)
        want = router.update_bias(load.clone(), rate=1e-3).clone()
        got = _tensor(_call(fn, (bias.clone(), load.clone(), 1e-3), f"bias [{E}], load [{E}], rate=1e-3",
                            "torch.sign(load.mean() - load) is +1 for underloaded experts."),
                      "new_bias", (E,), "one bias per expert")
        if _close(got, want, atol=1e-7):
            continue
        over = int((load - load.mean()).argmax())
        right = (f"Expert {over} took {int(load[over])} tokens (mean {load.mean():.1f}): its bias should go "
                 f"from {bias[over]:.5f} to {want[over]:.5f}; yours is {got[over]:.5f}.")
        if _close(got, bias - 1e-3 * torch.sign(load.mean() - load), atol=1e-7):
            raise ExerciseError("Wrong direction. An overloaded expert must become *less* attractive, so its bias "
                                "goes down: b ← b + γ·sign(mean(load) − load). " + right)
        if _close(got, bias + 1e-3 * (load.mean() - load), atol=1e-7):
            raise ExerciseError("You stepped by the size of the imbalance. The aux-loss-free rule moves every bias "
                                "by the same fixed γ, only the sign depends on the load. " + right)
        if _close(got, bias, atol=1e-9):
            raise ExerciseError("The bias did not change. " + right)
        moved = balanced & ((got - bias).abs() > 1e-7)
        if moved.any():
            e = int(moved.nonzero()[0])
            raise ExerciseError(f"Expert {e} took exactly the mean load ({int(load[e])} tokens): it is balanced and "
                                f"must keep its bias ({bias[e]:.5f}), but yours moved it to {got[e]:.5f}. Only an "
                                "expert above the mean goes down and only one below it goes up — sign(0) = 0.")
        raise ExerciseError(right)
    _passed("check_bias_update", "b ← b + γ·sign(mean(load) − load), as tiny_k3.moe.Router.update_bias.")
