"""sim/prefill.py: a prompt recorded from batched forwards equals the same prompt stepped token by token.

Both runs are in float64 (weights, activations and the MLA cache; the frames store float32 and the KDA chain
is float32, as sim/kdastates.py recomputes it), so the two differ by rounding only. TOL is the stated bound:
relative to the value, with an absolute floor for values near zero. The KDA state display copy is float16,
whose rounding step is 2^-11 of the value: STATE_TOL.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from sim import Simulation, runfile
from sim.frame import Choice
from sim.kdastates import LeanKDAState
from sim.prefill import SEGMENT, layer_bytes_at, segments
from tiny_k3.cache import KDAState, MLACache, ModelCache
from tiny_k3.weights import config_for

TOL = 1e-5          # float32 storage of float64 values computed two ways, and the float32 KDA chain
STATE_TOL = 2e-3    # the float16 display copy of S_t
MARGIN = 1e-6       # a routing choice is decisive when the k-th biased score leads the next by more than this

PROMPT = ("k=4; m=7; a red box. | m=7; q=2; w=9; " * 8)[:150]   # 151 tokens: segments 64 + 64 + 23


def float64(preset: str):
    return dataclasses.replace(config_for(preset), dtype="float64")


@pytest.fixture(scope="module")
def pair():
    cfg = float64("small")
    return (Simulation(cfg, PROMPT, seed=3, prefill=True), Simulation(cfg, PROMPT, seed=3, prefill=False))


def close(a, b, tol=TOL) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= tol * np.maximum(np.abs(b), 1e-2)))


def decisive(record) -> bool:
    """The k chosen experts lead every other by more than MARGIN in biased score (no near-tie to break)."""
    biased = np.sort(record.scores.astype(np.float64) + record.bias)[::-1]
    k = len(record.expert_ids)
    return biased[k - 1] - biased[k] > MARGIN


def test_segments_cover_the_prompt_in_order_cut_at_multiples_of_the_segment():
    assert segments(1) == [(0, 1)]
    assert segments(151) == [(0, 64), (64, 128), (128, 151)]
    assert segments(128) == [(0, 64), (64, 128)]
    assert SEGMENT == 64


def test_prefilled_frames_equal_stepped_frames_frame_by_frame(pair):
    fast, slow = pair
    assert len(fast.frames) == len(slow.frames) == len(PROMPT) + 1
    decisive_seen = 0
    for a, b in zip(fast.frames, slow.frames):
        where = f"frame {a.index}"
        assert (a.index, a.position, a.input_id, a.token_id, a.forced, a.prompt) == \
               (b.index, b.position, b.input_id, b.token_id, b.forced, b.prompt), where
        assert a.memory == b.memory, where                      # bytes: exact
        assert close(a.top_probs, b.top_probs) and close(a.embed_norm, b.embed_norm), where
        for ra, rb in zip(a.routing, b.routing, strict=True):
            assert ra.layer == rb.layer and close(ra.scores, rb.scores) and close(ra.bias, rb.bias), where
            if decisive(rb):
                decisive_seen += 1
                assert np.array_equal(ra.expert_ids, rb.expert_ids), where
                assert close(ra.weights, rb.weights), where
        for ra, rb in zip(a.kda, b.kda, strict=True):
            assert ra.layer == rb.layer, where
            assert close(ra.state, rb.state, STATE_TOL), where
            for f in ("decay", "beta", "state_norm", "correction_norm"):
                assert close(getattr(ra, f), getattr(rb, f)), (where, f)
        for ra, rb in zip(a.depth, b.depth, strict=True):
            assert (ra.layer, ra.site) == (rb.layer, rb.site), where
            assert close(ra.weights, rb.weights) and close(ra.h_norm, rb.h_norm), where
        for ra, rb in zip(a.sublayers, b.sublayers, strict=True):
            assert (ra.layer, ra.site, ra.kind) == (rb.layer, rb.site, rb.kind) and close(ra.out_norm, rb.out_norm)
    assert decisive_seen > 0.9 * sum(len(f.routing) for f in slow.frames)   # the check above did run


def test_prefilled_kda_states_are_their_own_recomputation_and_chain_from_a_snapshot(pair):
    """A frame's S_t is recomputed from its chain (sim/kdastates.py); a segment's first frame chains from the
    whole snapshot before it, so nothing is copied, and the chain is never longer than KDA_CHAIN."""
    fast, _ = pair
    for f in (fast.frames[0], fast.frames[63], fast.frames[64], fast.frames[149]):   # (150, the last, steps)
        step = f.kda[0]._step
        assert step.state is None and step.kda_depth == f.index % SEGMENT
    first = fast.frames[64].kda[0]._step.kda_from
    snap = fast._snapshots[64]
    for row, layer in enumerate(fast.config.kda_layers):
        assert np.shares_memory(first.states[row], snap[layer].state.numpy())


def test_snapshots_are_the_ones_stepping_keeps(pair):
    """The same positions, whole every 64 tokens and for the last 16, the others lean (their S recomputed from
    their frame); a float64 stepped run keeps those whole too, since its frames keep their float64 states."""
    fast, slow = pair
    assert sorted(fast._snapshots) == sorted(slow._snapshots)
    last = len(fast.frames)
    for p, snap in slow._snapshots.items():
        for layer, b in snap.items():
            a = fast._snapshots[p][layer]
            whole = p % 64 == 0 or p > last - 16
            assert isinstance(a, KDAState if whole else LeanKDAState), (p, layer)
            assert close(a.conv, b.conv), (p, layer)
            assert close(a.clone().state, b.clone().state), (p, layer)


@pytest.mark.parametrize("tokens", [1, 64, 100, 151])
def test_restored_caches_equal_a_forward_over_the_same_tokens(pair, tokens):
    """cached == recompute: the caches a branch restores after `tokens` tokens (a snapshot, a replay, a cut KV
    cache) equal one forward of the model over those tokens, to float64 rounding."""
    fast, _ = pair
    cache, twin = fast.caches_at(tokens)     # (KDA's S is a float32 chain, and what is replayed after it
                                              # sees that rounding: hence TOL beyond the first layer)
    ids = torch.tensor([[f.input_id for f in fast.frames[:tokens]]])
    with torch.no_grad():
        _, ref = fast.model(ids, ModelCache(fast.config.num_layers))
        _, twin_ref = fast.twin_model(ids, ModelCache(fast.config.num_layers))
    assert cache.position == twin.position == tokens
    for c, r in [*zip(cache.layers, ref.layers), *zip(twin.layers, twin_ref.layers)]:
        if isinstance(r, MLACache):
            assert close(c.latent, r.latent) and close(c.k_rope, r.k_rope)
        else:
            assert close(c.state, r.state) and close(c.conv, r.conv)
        if isinstance(r, MLACache) and r.conv is not None:      # the twin's short-conv tails, from the kept ones
            assert close(c.conv, r.conv)
    assert any(isinstance(r, MLACache) and r.conv is not None for r in twin_ref.layers)


@pytest.mark.parametrize("tokens", [1, 30, 64, 100])
def test_a_twin_session_restores_its_own_conv_tails(tokens):
    """--preset small-twin: the timeline's own model keeps short-conv tails, and a restore (what a branch, a
    what-if and `back` then a new choice use) equals a forward over the same tokens."""
    sim = Simulation(float64("small-twin"), PROMPT[:120], seed=3)
    cache, _ = sim.caches_at(tokens)
    ids = torch.tensor([[f.input_id for f in sim.frames[:tokens]]])
    with torch.no_grad():
        _, ref = sim.model(ids)
    for c, r in zip(cache.layers, ref.layers):
        assert close(c.latent, r.latent) and (r.conv is None or close(c.conv, r.conv))
    sim.goto(tokens - 1)
    sim.step(force_token="Z")                        # a branch: the next frame continues the restored cache
    assert sim.frames[tokens].input_id == ord("Z")


def test_a_branch_in_the_prompt_equals_the_stepped_runs_branch(pair):
    fast, slow = (Simulation(float64("small"), PROMPT, seed=3, prefill=p) for p in (True, False))
    for sim in (fast, slow):
        sim.goto(100)
        sim.step(force_token="Z")
        sim.run(3)
    assert [f.token_id for f in fast.frames] == [f.token_id for f in slow.frames]
    for a, b in zip(fast.frames[100:], slow.frames[100:]):
        assert close(a.top_probs, b.top_probs) and a.memory == b.memory
        assert all(close(ra.state_norm, rb.state_norm) for ra, rb in zip(a.kda, b.kda))


def test_memory_bytes_after_each_token_are_read_off_a_longer_cache():
    mla = MLACache(torch.zeros(1, 10, 4), torch.zeros(1, 10, 2))
    assert layer_bytes_at(mla, 3) == mla.truncate(3).nbytes() and layer_bytes_at(None, 3) == 0
    kda = KDAState(torch.zeros(1, 2, 4, 4), torch.zeros(1, 3, 8))
    assert layer_bytes_at(kda, 1) == kda.nbytes()


@pytest.mark.parametrize("n", [1, 63, 64, 65])
def test_ragged_prompts_record_every_token_as_stepping_does(n):
    """Prompts around a segment boundary (a last segment of one token takes the decode path)."""
    prompt = ("abcdefgh" * 10)[:n]
    fast, slow = (Simulation(float64("tiny"), prompt, seed=1, prefill=p) for p in (True, False))
    assert len(fast.frames) == len(slow.frames) == n + 1
    for a, b in zip(fast.frames, slow.frames):
        assert a.memory == b.memory and close(a.top_probs, b.top_probs)
        assert all(close(ra.state_norm, rb.state_norm) for ra, rb in zip(a.kda, b.kda))
    assert sorted(fast._snapshots) == sorted(slow._snapshots)


def test_progress_counts_every_prompt_token_and_its_exception_abandons_the_build():
    seen = []
    Simulation("tiny", "x" * 70, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(i, 71) for i in range(1, 72)]

    class Stop(Exception):
        pass

    def stop(done, total):
        if done == 64:
            raise Stop
    with pytest.raises(Stop):
        Simulation("tiny", "x" * 70, progress=stop)


def test_a_stepped_run_file_replays_stepwise_and_a_prefilled_one_by_prefill(tmp_path):
    """A file saved before the prefill (no "prefill" in its header) was stepped; it reopens the way it was made,
    so its frames replay bit for bit; a prefilled run's file reopens by prefill."""
    fast, slow = (Simulation("tiny", PROMPT[:80], seed=2, prefill=p) for p in (True, False))
    for sim in (fast, slow):
        sim.run(2)
    old = runfile.save(slow, tmp_path / "stepped.npz")
    with np.load(old) as z:
        members = {k: z[k] for k in z.files}
    meta = runfile.read(old).meta
    assert meta["prefill"] is False
    del meta["prefill"]                                       # as every file written before this field existed
    members["meta.json"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(tmp_path / "old.npz", **members)
    for path, made in ((tmp_path / "old.npz", slow), (runfile.save(fast, tmp_path / "fast.npz"), fast)):
        again = Simulation.from_run(path)
        assert again.prefilled == made.prefilled
        assert len(again.frames) == len(made.frames) and all(a.same_as(b) for a, b in zip(again.frames, made.frames))


def test_choices_after_a_prefill_are_the_timelines_rule():
    sim = Simulation("tiny", "hello there", temperature=0.7, seed=5)
    last = sim.frames[-1]
    assert last.choice == Choice.sampled(0.7, 5) and all(f.forced for f in sim.frames[:-1])
    assert all(f.token_id == sim.frames[i + 1].input_id for i, f in enumerate(sim.frames[:-1]))


def test_a_float32_prefill_hands_its_chain_to_the_cache_and_the_next_step_continues_it():
    """In float32 the decode cache goes on from the frames' own last states (sim/prefill.py), so the cache after
    the prefill is what its last frame recomputes, and the prompt's last frame (a decode step) links to it."""
    sim = Simulation("tiny", "y" * 40, seed=0)
    prefilled, stepped = sim.frames[-2].kda[0]._step, sim.frames[-1].kda[0]._step
    assert stepped.state is None and stepped.kda_from is prefilled
    assert stepped.kda_depth == prefilled.kda_depth + 1 == 40
    cache, _ = sim.caches_at(len(sim.frames) - 1)
    for row, layer in enumerate(sim.config.kda_layers):
        assert torch.equal(cache.layers[layer].state[0], prefilled.states32()[row])
