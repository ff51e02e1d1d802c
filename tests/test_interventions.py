"""sim.interventions and Simulation.what_if: each change against an independent oracle, and bad input.

The oracles never go through tiny_k3.hooks: a masked selection bias written into the router, a fresh
forward from a cache whose KDA layer was dropped, an MLA layer run on a cut cache (NoPE: a window is a
shorter cache), depth weights read off the recorder.
"""

import copy
from unittest import mock

import numpy as np
import pytest
import torch

from sim import Simulation
from sim import session as session_module
from sim.interventions import (AblateExpert, ForceExperts, InterventionError, NoSelectionBias, ResetState,
                               ScaleDecay, TruncateContext, UniformDepth, check_changes, describe, to_hooks)
from sim.frame import Choice
from sim.whatif import WhatIfPlan, kl_divergence
from tiny_k3 import K3Config, TraceRecorder
from tiny_k3.cache import ModelCache
from tiny_k3.hooks import Hooks
from tiny_k3.kda import KDALayer
from tiny_k3.mla import GatedMLA
from tiny_k3.tokenizer import decode, token_text

PROMPT = "k=7;3+4=xyzw"


def _trained_looking(config, weights="auto", seed=0, device=None):
    """The random tiny model, with what training would give it: depth queries that are not zero (so the
    weights are not uniform to begin with) and a selection bias large enough to change choices."""
    loaded = LOAD_MODEL(config, weights, seed, device)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        for name, p in loaded[0].named_parameters():
            if name.endswith("_res.query"):
                p.normal_(0.0, 0.3)
        for moe in loaded[0].moe_layers():
            moe.router.bias.copy_(0.02 * torch.randn_like(moe.router.bias))
    return loaded


LOAD_MODEL = session_module.load_model


def make(**kw):
    # stepped prompts: the oracles below (forward_from) feed tokens one at a time, so the what-ifs' caches are
    # made by the same ops in the same order and compare exactly
    kw.setdefault("prefill", False)
    with mock.patch.object(session_module, "load_model", _trained_looking):
        return Simulation("tiny", PROMPT, weights="random", **kw)


@pytest.fixture(scope="module")
def sim():
    s = make()
    s.run(6)
    s.goto(s.prompt_len - 1)          # the last prompt frame: step 0 samples, the rest are generated
    return s


@torch.no_grad()
def forward_from(model, before: list[int], after: list[int], edit=None, prefix_model=None):
    """Logits [len(after), vocab] of `after` fed one at a time after `before`; edit(cache) may change the cache
    between the two (the oracle for a reset); prefix_model (default: model) runs `before`."""
    cache = ModelCache(model.config.num_layers)
    for t in before:
        _, cache = (prefix_model or model)(torch.tensor([[t]]), cache)
    if edit is not None:
        edit(cache)
    out = []
    for t in after:
        logits, cache = model(torch.tensor([[t]]), cache)
        out.append(logits[0, -1, :258].numpy())
    return np.stack(out)


def inputs(sim):
    return [f.input_id for f in sim.frames]


# ---------------------------------------------------------------------------- no change


def test_no_change_equals_the_original_exactly_and_leaves_the_timeline_alone(sim):
    frames_before, cursor = list(sim.frames), sim.cursor
    w = sim.what_if(steps=4)
    assert w.steps == 4 and w.kl == (0.0,) * 4 and w.first_divergence == (None,) * 4
    for s in range(4):
        assert w.frames[s].same_as(sim.frames[cursor + s]) and w.original[s].same_as(sim.frames[cursor + s])
        assert np.array_equal(w.logits_after[s], sim._logits[cursor + s])
    assert w.text_before == w.text_after == decode([f.token_id for f in sim.frames[cursor:cursor + 4]])
    assert w.top_before == w.top_after
    assert w.top_before[0] == tuple((int(t), token_text(int(t)), float(p))
                                    for t, p in zip(sim.frame.top_ids, sim.frame.top_probs))
    assert sim.cursor == cursor and len(sim.frames) == len(frames_before)
    assert all(a is b for a, b in zip(sim.frames, frames_before))


def test_a_what_if_past_the_timeline_equals_stepping_on():
    a, b = make(), make()
    w = a.what_if(steps=5)          # the cursor is the last frame: 4 of the 5 steps are new
    b.run(4)
    assert len(a.frames) == a.prompt_len
    for s in range(5):
        assert w.frames[s].same_as(b.frames[a.cursor + s])


def test_a_what_if_at_another_frame_leaves_the_cursor_and_equals_one_made_there(sim):
    """what_if(at=i) moves nothing: it is the what-if that goto(i) then what_if() makes, the same computation."""
    cursor, at = sim.cursor, sim.cursor - 3
    here = sim.what_if(ResetState(layer=0), AblateExpert(1, 0), at=at, steps=3)
    assert sim.cursor == cursor and here.position == at
    sim.goto(at)
    try:
        there = sim.what_if(ResetState(layer=0), AblateExpert(1, 0), steps=3)
    finally:
        sim.goto(cursor)
    assert here.kl == there.kl and here.first_divergence == there.first_divergence
    assert all(a.same_as(b) for a, b in zip(here.frames + here.original, there.frames + there.original))
    assert all(np.array_equal(a, b) for a, b in zip(here.logits_after, there.logits_after))
    with pytest.raises(ValueError, match="frame 999 is out of range"):
        sim.what_if(at=999)


def test_a_plan_is_checked_and_hooked_once_and_gives_the_same_what_if(sim):
    changes = (ResetState(layer=0), ScaleDecay(1, 0.5))
    plan = WhatIfPlan.of(changes, sim.config)
    assert WhatIfPlan.of(plan, sim.config) is plan and plan.changes == changes
    assert plan.first == to_hooks(changes, sim.config) and plan.later == to_hooks(changes, sim.config, reset=False)
    assert WhatIfPlan.of((), sim.config) == WhatIfPlan((), None, None)
    a, b = sim.what_if(plan, steps=2), sim.what_if(*changes, steps=2)
    assert a.changes == b.changes == changes and a.kl == b.kl
    with pytest.raises(InterventionError, match="two ForceExperts for layer 1"):
        WhatIfPlan.of([ForceExperts(1, [3, 5]), ForceExperts(1, [4, 5])], sim.config)


def test_caches_at_and_compute_frame_say_what_they_need(sim):
    with pytest.raises(ValueError, match="caches_at: tokens must be a whole number from 0 to"):
        sim.caches_at(len(sim.frames) + 1)
    cache, _ = sim.caches_at(3)
    with pytest.raises(ValueError, match="needs the cache after 4 tokens, got one after 3"):
        sim.compute_frame(4, 65, Choice.forced(66), False, cache, None)
    frame, _, _, _ = sim.compute_frame(3, sim.frames[3].input_id, sim.frames[3].choice, True, cache, None)
    assert frame.same_as(sim.frames[3])      # the same decode step from the same caches (stepped prompt)


def test_the_timeline_steps_on_unchanged_after_a_what_if():
    a, b = make(), make()
    a.what_if(ResetState(), UniformDepth(), AblateExpert(1, 0), steps=3)
    a.run(3), b.run(3)
    assert all(x.same_as(y) for x, y in zip(a.frames, b.frames))


# ---------------------------------------------------------------------------- routing


def test_ablate_expert_is_never_chosen_and_equals_a_masked_router(sim):
    layer = 2
    chosen = sim.frame.routing_for(layer)
    expert = int(chosen.expert_ids[0])
    w = sim.what_if(AblateExpert(layer, expert), steps=3)
    assert all(expert not in f.routing_for(layer).expert_ids for f in w.frames)
    # who takes over: the next in line by biased score
    biased = chosen.scores + chosen.bias
    biased[expert] = -np.inf
    assert set(w.frames[0].routing_for(layer).expert_ids) == set(np.argsort(-biased)[:2])
    assert w.first_divergence[0] == f"L{layer} mlp · MoE"
    masked = copy.deepcopy(sim.model)
    with torch.no_grad():
        masked.blocks[layer].mlp.router.bias[expert] = float("-inf")
    before = inputs(sim)[:sim.cursor]
    oracle = forward_from(masked, before, [f.input_id for f in w.frames], prefix_model=sim.model)
    assert np.array_equal(oracle, np.stack(w.logits_after))


def test_force_experts_selects_exactly_the_list_with_renormalised_unbiased_weights(sim):
    forced = (5, 77)
    w = sim.what_if(ForceExperts(3, forced), steps=2)
    for f in w.frames:
        r = f.routing_for(3)
        assert sorted(r.expert_ids.tolist()) == sorted(forced)
        np.testing.assert_allclose(r.weights, r.scores[r.expert_ids] / r.scores[r.expert_ids].sum(), rtol=1e-6)
        assert (r.scores + r.bias)[r.expert_ids[0]] >= (r.scores + r.bias)[r.expert_ids[1]]


def test_no_selection_bias_selects_topk_of_the_unbiased_scores():
    s = make()
    w = s.what_if(NoSelectionBias(), steps=2)
    for f in w.frames:
        for r in f.routing:
            assert set(r.expert_ids) == set(np.argsort(-r.scores)[:2])
    # the bias did change some choice in the original, so the test above is not passing by accident
    assert any(set(r.expert_ids) != set(np.argsort(-r.scores)[:2]) for f in w.original for r in f.routing)
    one = s.what_if(NoSelectionBias(layer=2))
    r1, r3 = one.frames[0].routing_for(1), one.frames[0].routing_for(3)
    assert set(r1.expert_ids) == set(np.argsort(-(r1.scores + r1.bias))[:2])   # other layers keep the bias
    assert set(r3.expert_ids) == set(np.argsort(-(r3.scores + r3.bias))[:2])


# ---------------------------------------------------------------------------- KDA state and decay


@pytest.mark.parametrize("layer", [0, 2])
def test_reset_state_equals_a_fresh_forward_from_a_zero_state_for_that_layer(sim, layer):
    w = sim.what_if(ResetState(layer=layer), steps=3)
    before = inputs(sim)[:sim.cursor]

    def drop(cache):
        cache.layers[layer] = None          # a layer with no cache starts from S = 0 and a zero conv tail

    oracle = forward_from(sim.model, before, [f.input_id for f in w.frames], edit=drop)
    assert np.array_equal(oracle, np.stack(w.logits_after))
    assert w.first_divergence[0] == f"L{layer} attn · KDA"


def test_reset_of_every_kda_layer_is_all_of_them_at_once(sim):
    w = sim.what_if(ResetState(), steps=2)
    before = inputs(sim)[:sim.cursor]

    def drop(cache):
        for i in sim.config.kda_layers:
            cache.layers[i] = None

    assert np.array_equal(forward_from(sim.model, before, [f.input_id for f in w.frames], edit=drop),
                          np.stack(w.logits_after))


@torch.no_grad()
def test_a_head_reset_zeroes_that_head_only():
    cfg = K3Config.preset("tiny")
    torch.manual_seed(0)
    layer = KDALayer(cfg)
    x = torch.randn(1, 7, cfg.hidden_size)
    _, cache = layer(x)                     # a non-zero state and conv tail to start from
    step = torch.randn(1, 3, cfg.hidden_size)
    rec, fresh, kept = TraceRecorder(), TraceRecorder(), TraceRecorder()
    layer(step, cache.clone(), recorder=rec, hooks=Hooks(reset_heads={0: (1,)}))
    layer(step, None, recorder=fresh)
    layer(step, cache.clone(), recorder=kept)
    state = rec.of("kda")[0][1]["state"]
    assert torch.equal(state[:, 1], fresh.of("kda")[0][1]["state"][:, 1])    # head 1 as from zero
    assert torch.equal(state[:, 0], kept.of("kda")[0][1]["state"][:, 0])     # head 0 untouched
    assert not torch.equal(state[:, 0], fresh.of("kda")[0][1]["state"][:, 0])


def test_scale_decay_one_is_the_original_and_zero_forgets_nothing(sim):
    same = sim.what_if(ScaleDecay(factor=1.0), steps=2)
    assert all(a.same_as(b) for a, b in zip(same.frames, same.original))
    w = sim.what_if(ScaleDecay(layer=1, factor=0.0), steps=2)
    for f in w.frames:
        assert np.all(f.kda_for(1).decay == 1.0)           # alpha = exp(0 * g) = 1: nothing fades
        assert np.all(f.kda_for(0).decay < 1.0)            # other layers as trained
    double = sim.what_if(ScaleDecay(layer=1, factor=2.0))
    orig = double.original[0].kda_for(1).decay
    np.testing.assert_allclose(double.frames[0].kda_for(1).decay, orig ** 2, rtol=1e-5)


# ---------------------------------------------------------------------------- depth and context


def test_uniform_depth_gives_uniform_weights(sim):
    w = sim.what_if(UniformDepth(), steps=2)
    for f in w.frames:
        for d in f.depth:
            np.testing.assert_array_equal(d.weights, np.full(d.weights.size, 1 / d.weights.size, np.float32))
    one = sim.what_if(UniformDepth(layer=2))
    for d in one.frames[0].depth:
        uniform = np.allclose(d.weights, 1 / d.weights.size, atol=1e-7)
        assert uniform == (d.layer == 2) or d.weights.size == 1
    head = sim.what_if(UniformDepth(layer=sim.config.num_layers))
    out = next(d for d in head.frames[0].depth if d.site == "out")
    np.testing.assert_allclose(out.weights, 1 / out.weights.size, atol=1e-7)
    assert head.first_divergence[0] == "head"


def test_a_window_that_covers_the_context_is_the_original(sim):
    steps = 3
    w = sim.what_if(TruncateContext(sim.cursor + steps), steps=steps)   # the last step sees cursor+steps tokens
    assert all(a.same_as(b) for a, b in zip(w.frames, w.original)) and w.kl == (0.0,) * steps
    short = sim.what_if(TruncateContext(sim.cursor), steps=1)            # one token too few
    assert short.first_divergence[0] == f"L{sim.config.mla_layers[0]} attn · MLA"
    assert short.twin_kl and short.twin_kl[0] > 0 and w.twin_kl == (0.0,) * steps


@torch.no_grad()
def test_a_window_is_the_same_as_a_cut_cache_because_mla_has_no_positions():
    cfg = K3Config.preset("tiny")
    torch.manual_seed(1)
    mla = GatedMLA(cfg)
    _, cache = mla(torch.randn(1, 9, cfg.hidden_size))
    x = torch.randn(1, 1, cfg.hidden_size)
    window = 4
    y, _ = mla(x, cache, hooks=Hooks(attention_window=window))
    cut = type(cache)(cache.latent[:, -(window - 1):], cache.k_rope[:, -(window - 1):])
    y_cut, _ = mla(x, cut)
    torch.testing.assert_close(y, y_cut, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------- measures and labels


def test_kl_divergence_is_kl():
    p, q = np.array([1.0, 2.0, 0.5]), np.array([0.0, 1.0, 3.0])
    pp, qq = np.exp(p) / np.exp(p).sum(), np.exp(q) / np.exp(q).sum()
    assert kl_divergence(p, q) == pytest.approx(float((pp * np.log(pp / qq)).sum()), rel=1e-12)
    assert kl_divergence(p, p) == 0.0 and kl_divergence(p, p + 7) == pytest.approx(0.0, abs=1e-15)


def test_to_hooks_and_describe():
    cfg = K3Config.preset("tiny")
    h = to_hooks([AblateExpert(1, 3), AblateExpert(1, 4), ResetState(head=1), ScaleDecay(0, 0.5),
                  ScaleDecay(factor=2.0), TruncateContext(9), TruncateContext(5), UniformDepth(1)], cfg)
    assert h.blocked_experts == {1: (3, 4)} and h.reset_heads == {0: (1,), 1: (1,), 2: (1,)}
    assert h.decay_scale == {0: 1.0, 1: 2.0, 2: 2.0} and h.attention_window == 5 and h.uniform_depth == {1}
    assert to_hooks([ResetState()], cfg, reset=False).reset_heads == {}
    assert describe(AblateExpert(3, 17)) == "ablate expert 17 at L3"
    assert describe(ResetState(2, 1)) == "reset state (L2, head 1)"
    assert describe(TruncateContext(8)) == "MLA window 8"


def test_changes_are_frozen():
    with pytest.raises(Exception):
        AblateExpert(1, 2).expert = 3


# ---------------------------------------------------------------------------- bad input


TWIN = K3Config.preset("tiny").twin()


@pytest.mark.parametrize("change, config, message", [
    (AblateExpert(0, 1), None, "AblateExpert: layer 0 is not an MoE layer; MoE layers are 1, 2, 3."),
    (AblateExpert(None, 1), None, "AblateExpert: layer must be a layer number, got None."),
    (AblateExpert(2, 112), None, "AblateExpert: expert 112 is out of range; layer 2 has experts 0 to 111."),
    (ForceExperts(1, [4]), None, "ForceExperts needs exactly top_k = 2 expert ids for layer 1, got 1."),
    (ForceExperts(1, [4, 4]), None, "ForceExperts lists expert 4 more than once; the 2 experts must all be different."),
    (ForceExperts(1, [4, -1]), None, "ForceExperts: expert -1 is out of range; layer 1 has experts 0 to 111."),
    (NoSelectionBias(7), None, "NoSelectionBias: layer 7 is not an MoE layer; MoE layers are 1, 2, 3."),
    (ResetState(3), None, "ResetState: layer 3 is not a KDA layer; KDA layers are 0, 1, 2."),
    (ResetState(1, head=2), None, "ResetState: head 2 is out of range; KDA heads are 0 to 1."),
    (ResetState(), TWIN, "ResetState acts on KDA layers and preset 'tiny-twin' has none."),
    (ScaleDecay(3, 0.5), None, "ScaleDecay: layer 3 is not a KDA layer; KDA layers are 0, 1, 2."),
    (ScaleDecay(factor=-1), None, "ScaleDecay: factor must be a finite number 0 or more (0: no forgetting, "
                                  "1: as trained), got -1."),
    (ScaleDecay(0.5), None, "ScaleDecay: layer must be a layer number or None, got 0.5; to scale every KDA layer "
                            "write ScaleDecay(factor=0.5)."),
    (UniformDepth(5), None, "UniformDepth: layer 5 is not a depth-read layer; depth-read layers are 0, 1, 2, 3, 4."),
    (UniformDepth(), K3Config.preset("tiny", residual="standard"),
     "UniformDepth needs Attention Residuals and preset 'tiny' uses the standard residual."),
    (TruncateContext(0), None, "TruncateContext: window must be a whole number of tokens, 1 or more, got 0."),
    ("reset", None, "what_if takes changes from sim.interventions (AblateExpert, ForceExperts, NoSelectionBias, "
                    "ResetState, ScaleDecay, UniformDepth, TruncateContext), got 'reset'."),
])
def test_each_bad_change_is_one_clear_sentence(change, config, message):
    with pytest.raises(InterventionError) as err:
        check_changes([change], config or K3Config.preset("tiny"))
    assert str(err.value) == message


def test_conflicting_changes_and_bad_steps_are_clear(sim):
    cfg = sim.config
    with pytest.raises(InterventionError, match="expert 4 is both ablated and forced at layer 1"):
        check_changes([AblateExpert(1, 4), ForceExperts(1, [4, 5])], cfg)
    with pytest.raises(InterventionError, match="two ForceExperts for layer 1"):
        check_changes([ForceExperts(1, [3, 5]), ForceExperts(1, [4, 5])], cfg)
    with pytest.raises(InterventionError, match="fewer than top_k = 2; ablate fewer"):
        check_changes([AblateExpert(1, e) for e in range(111)], cfg)
    with pytest.raises(ValueError, match="steps must be 1 or more"):
        sim.what_if(steps=0)
    with pytest.raises(ValueError, match="would pass the last position"):
        sim.what_if(steps=cfg.max_seq_len)
    with pytest.raises(InterventionError, match="ForceExperts: experts must be a list of expert ids, got 3"):
        ForceExperts(1, 3)
