"""Hooks.route (tiny_k3/hooks.py): forced and blocked experts weigh exactly as the router's own choice does,
at every routed_scaling of the presets (1 for K3, 2.446 for Kimi Linear, 2.827 for K2)."""

import pytest
import torch

from tiny_k3.config import K3Config
from tiny_k3.hooks import Hooks
from tiny_k3.moe import LatentMoE, Router, route, situ_glu

F64 = torch.float64
SCALINGS = {"tiny": 1.0, "kimi-linear-tiny": 2.446, "k2-tiny": 2.827}


def _router(preset: str, seed: int = 0) -> tuple[Router, torch.Tensor]:
    """The preset's router in float64 with a nonzero selection bias, and its scores for 2 x 5 tokens."""
    c = K3Config.preset(preset)
    gen = torch.Generator().manual_seed(seed)
    router = Router(c.hidden_size, c.num_experts, c.top_k, renormalize=c.renormalize, scaling=c.routed_scaling,
                    dtype=F64)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=gen, dtype=F64))
        router.bias.copy_(0.1 * torch.randn(c.num_experts, generator=gen))
    x = torch.randn(2, 5, c.hidden_size, generator=gen, dtype=F64)
    return router, router(x).scores.detach()


def test_the_presets_carry_the_scalings_tested_here():
    assert {name: K3Config.preset(name).routed_scaling for name in SCALINGS} == SCALINGS


@pytest.mark.parametrize("preset", list(SCALINGS))
def test_forcing_the_routers_own_choice_gives_the_routers_own_routing(preset):
    router, scores = _router(preset)
    natural = route(scores, router.bias, router.top_k, router.renormalize, router.scaling)
    chosen = natural.expert_ids[0, 0].tolist()
    forced = Hooks(forced_experts={0: tuple(reversed(chosen))}).route(0, scores[:1, :1], router)
    assert forced.expert_ids.tolist() == [[chosen]]                    # reordered by descending biased score
    torch.testing.assert_close(forced.weights, natural.weights[:1, :1], rtol=1e-15, atol=0)
    torch.testing.assert_close(forced.weights.sum(-1), torch.full((1, 1), router.scaling, dtype=F64),
                               rtol=1e-12, atol=0)                    # renormalised, then scaled


@pytest.mark.parametrize("preset", list(SCALINGS))
def test_forced_experts_weigh_their_unbiased_scores_renormalised_and_scaled(preset):
    router, scores = _router(preset, seed=1)
    experts = (3, 0, 11, 7)                                            # not what the router picks: any k
    got = Hooks(forced_experts={2: experts}).route(2, scores, router)
    biased = scores + router.bias
    for row in range(10):
        s, b = scores.view(10, -1)[row], biased.view(10, -1)[row]
        order = sorted(experts, key=lambda e: -float(b[e]))
        total = sum(float(s[e]) for e in experts)
        want = torch.tensor([float(s[e]) / total * router.scaling for e in order], dtype=F64)
        assert got.expert_ids.view(10, -1)[row].tolist() == order
        torch.testing.assert_close(got.weights.view(10, -1)[row], want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("preset", list(SCALINGS))
def test_a_single_forced_expert_keeps_its_score_as_the_released_router_does(preset):
    # released: `if self.top_k > 1 and self.moe_renormalize` (k3_facts.md §3b): one expert is not renormalised
    router, scores = _router(preset, seed=2)
    got = Hooks(forced_experts={0: (5,)}).route(0, scores, router)
    assert got.expert_ids.shape == (2, 5, 1) and (got.expert_ids == 5).all()
    torch.testing.assert_close(got.weights, scores[..., 5:6] * router.scaling, rtol=1e-15, atol=0)
    one = route(scores, router.bias, 1, router.renormalize, router.scaling)   # top-1 itself does the same
    torch.testing.assert_close(one.weights, scores.gather(-1, one.expert_ids) * router.scaling, rtol=1e-15, atol=0)


@pytest.mark.parametrize("preset", list(SCALINGS))
def test_blocking_hands_the_slot_to_the_next_in_line_with_the_same_weighting(preset):
    router, scores = _router(preset, seed=3)
    natural = route(scores, router.bias, router.top_k, router.renormalize, router.scaling)
    first = int(natural.expert_ids[0, 0, 0])
    got = Hooks(blocked_experts={0: (first,)}).route(0, scores[:1, :1], router)
    bias = router.bias.clone()
    bias[first] = float("-inf")
    want = route(scores[:1, :1], bias, router.top_k, router.renormalize, router.scaling)
    assert first not in got.expert_ids.tolist()[0][0]
    assert torch.equal(got.expert_ids, want.expert_ids)
    torch.testing.assert_close(got.weights, want.weights, rtol=1e-15, atol=0)


@pytest.mark.parametrize("scaling", [2.446, 2.827])
@pytest.mark.parametrize("tokens", [1, 6])                          # the one-token and many-token fast paths
def test_a_forced_expert_through_every_moe_path_is_the_sum_by_hand(scaling, tokens):
    torch.manual_seed(0)
    moe = LatentMoE(K3Config.preset("tiny", routed_scaling=scaling), dtype=F64)
    x = torch.randn(1, tokens, moe.config.hidden_size, dtype=F64)
    hooks = Hooks(forced_experts={0: (4,)})
    with torch.no_grad():
        assert moe.fast.forward_path(x)[0] == ("decode" if tokens == 1 else "tokens")
        fast = moe(x, hooks=hooks)
        moe.fast.force(forward="general")
        general = moe(x, hooks=hooks)
        s = moe.router(x).scores[..., 4:5]                             # [1, T, 1]
        z = moe.down(x)
        by_hand = moe.combine(s * scaling * (situ_glu(z @ moe.w1[4].T, z @ moe.w3[4].T) @ moe.w2[4].T), x)
    assert by_hand.abs().mean() > 1e-3
    torch.testing.assert_close(fast, by_hand, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(general, by_hand, rtol=1e-10, atol=1e-12)
