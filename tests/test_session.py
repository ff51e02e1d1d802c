"""sim.Simulation: determinism, the timeline, branching, measured bytes, a golden trace, bad inputs.

Golden trace: tests/golden/sim_tiny.json holds token ids and a few numbers of two fixed runs of the
"tiny" preset (random weights, seed 0; greedy and sampled). When the model's math changes on purpose,
regenerate it and review the diff:

    TINY_K3_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/test_session.py -k golden
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from sim import Frame, Simulation
from sim.memory import cache_bytes
from sim import session as session_module
from sim.session import sample_token
from tiny_k3 import K3Config
from tiny_k3.tokenizer import BOS, encode

PROMPT = "k=7;3+4="
GOLDEN = Path(__file__).parent / "golden" / "sim_tiny.json"


def make(prompt=PROMPT, preset="tiny", **kw):
    kw.setdefault("weights", "random")
    return Simulation(preset, prompt, **kw)


def assert_same_frames(a: list[Frame], b: list[Frame]):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.same_as(y), f"frame {i} differs"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These models are tiny: every op is overhead, and a second thread only adds contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def base():
    """One tiny run shared by the read-only tests: the prompt plus 8 generated tokens."""
    sim = make()
    sim.run(8)
    return sim


def test_prompt_frames_follow_the_timeline_rule(base):
    ids = encode(PROMPT)
    assert base.prompt_len == len(ids)
    frames = base.frames
    assert [f.input_id for f in frames[:len(ids)]] == ids
    assert frames[0].input_id == BOS
    for i, f in enumerate(frames):
        assert f.index == f.position == i
        if i + 1 < len(frames):
            assert frames[i + 1].input_id == f.token_id          # frame.token_id is the next input
    assert all(f.forced and f.extra["prompt"] for f in frames[:len(ids) - 1])
    assert not frames[len(ids) - 1].forced                         # the last prompt frame's token is sampled
    assert base.text.startswith(PROMPT)


def test_frame_contents_have_the_contract_shapes(base):
    cfg = base.config
    f = base.frames[-1]
    assert [r.layer for r in f.routing] == cfg.moe_layers
    assert [r.layer for r in f.kda] == cfg.kda_layers
    for r in f.routing:
        assert r.scores.shape == r.bias.shape == (cfg.num_experts,)
        assert r.expert_ids.shape == r.weights.shape == (cfg.top_k,) and r.expert_ids.dtype == np.int64
        # the chosen ids are the top-k of scores + bias, and the weights renormalise their unbiased scores
        assert set(r.expert_ids) == set(np.argsort(-(r.scores + r.bias))[:cfg.top_k])
        np.testing.assert_allclose(r.weights, r.scores[r.expert_ids] / r.scores[r.expert_ids].sum(), rtol=1e-5)
    H, K = cfg.kda_heads, cfg.kda_head_dim
    for r in f.kda:
        assert r.state.shape == (H, K, K) and r.state.dtype == np.float16
        assert r.decay.shape == (H, K) and ((r.decay > 0) & (r.decay <= 1)).all()
        np.testing.assert_allclose(r.state_norm, np.linalg.norm(r.state.astype(np.float32).reshape(H, -1), axis=1),
                                   rtol=2e-3)
    assert len(f.depth) == 2 * cfg.num_layers + 1 and f.depth[-1].site == "out"
    for d in f.depth:
        assert d.weights.ndim == 1 and abs(d.weights.sum() - 1) < 1e-5
    assert [(s.layer, s.site) for s in f.sublayers] == [(i, s) for i in range(cfg.num_layers) for s in ("attn", "mlp")]
    assert f.top_ids.shape == (5,) and np.all(np.diff(f.top_probs) <= 0)
    assert not f.routing[0].scores.flags.writeable          # frames are immutable, arrays included


def test_correction_norm_is_the_delta_rule_write(base):
    """||S_t - Diag(alpha_t) S_{t-1}|| recomputed from two consecutive frames' (float16) states."""
    a, b = base.frames[-2].kda[0], base.frames[-1].kda[0]
    write = b.state.astype(np.float32) - b.decay[..., None] * a.state.astype(np.float32)
    np.testing.assert_allclose(np.linalg.norm(write.reshape(len(write), -1), axis=1), b.correction_norm,
                               rtol=0.05, atol=1e-3)


def test_same_seed_gives_identical_frames(base):
    other = make()
    other.run(8)
    assert_same_frames(base.frames, other.frames)
    sampled = [make(temperature=1.0, seed=3) for _ in range(2)]
    for s in sampled:
        s.run(4)
    assert_same_frames(sampled[0].frames, sampled[1].frames)
    assert [f.token_id for f in sampled[0].frames] != [f.token_id for f in base.frames[:len(sampled[0].frames)]]


def test_back_and_forward_replays_without_recomputing():
    sim = make(prompt="ab")
    sim.run(5)
    frames = list(sim.frames)
    end = sim.cursor
    for _ in range(3):
        sim.back()
    assert sim.cursor == end - 3 and sim.frame is frames[end - 3]
    for i in range(3):
        assert sim.step() is frames[end - 2 + i]              # same objects: a replay, not a re-run
    assert sim.frames == frames and sim.cursor == end
    assert sim.goto(2) is frames[2]
    assert sim.run(2) == frames[3:5]
    assert sim.step(seed=9) is frames[5]           # greedy: another seed changes no choice, so no branch
    assert sim.sample_seed == 9


def test_branch_with_a_forced_token_equals_a_fresh_run(monkeypatch):
    # Snapshots every 4 tokens and after the last 2, so a short run exercises restore-and-replay.
    monkeypatch.setattr(session_module, "SNAPSHOT_EVERY", 4)
    monkeypatch.setattr(session_module, "RECENT_SNAPSHOTS", 2)
    a = make()
    a.run(6)                                       # frames 0..14: snapshots after 4, 8, 12 and the last 2 tokens
    assert sorted(a._snapshots) == [4, 8, 12, 14, 15]
    a.goto(9)                                      # restore to 10 tokens: KDA from the snapshot at 8, replay 2
    forced = 33 if a.frame.token_id != 33 else 34
    a.step(force_token=forced)
    a.run(2)
    b = make()
    b.run(1)
    b.step(force_token=forced)
    b.run(2)
    assert a.frames[9].forced and a.frames[10].input_id == forced
    assert_same_frames(a.frames, b.frames)


def test_branch_with_another_temperature_and_seed_equals_a_fresh_run():
    a = make()
    a.run(6)
    a.goto(a.prompt_len + 2)                       # the default snapshots: replay from the start
    a.step(temperature=1.0, seed=5)
    a.run(3)
    b = make()
    b.run(3)
    b.step(temperature=1.0, seed=5)
    b.run(3)
    assert_same_frames(a.frames, b.frames)
    assert b.temperature == 1.0 and b.sample_seed == 5
    # sampling at this position is reproducible from (seed, position) alone
    f = b.frames[b.prompt_len + 2]
    assert f.token_id == sample_token(b._logits[f.index], 1.0, 5, f.position)


def test_branch_inside_the_prompt_equals_a_shorter_prompt():
    # stepped prompts: a prefill cuts a longer prompt into other forwards than a shorter one (equal to rounding,
    # tests/test_prefill.py), and this compares bit for bit
    a = make(prefill=False)
    a.run(2)
    a.goto(3)
    a.step(force_token="Z")
    a.run(2)
    b = make(prompt=PROMPT[:3], prefill=False)     # BOS + 3 bytes: its last prompt frame is frame 3
    b.step(force_token="Z")
    b.run(2)
    assert a.prompt_len == b.prompt_len == 4
    assert_same_frames(a.frames, b.frames)


def test_branch_at_the_end_needs_no_restore_and_still_matches():
    a = make(prompt="ab")
    a.run(2)
    a.step(force_token=66)
    b = make(prompt="ab")
    b.run(2)
    b.step(force_token=66)
    assert a.frames[-2].forced and a.frames[-1].input_id == 66
    assert_same_frames(a.frames, b.frames)


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_measured_bytes_equal_the_analytic_cache_bytes(preset):
    sim = make(preset=preset, prompt="ab")
    sim.run(3)
    sim.goto(1)
    sim.step(force_token=120)                     # the restored caches are measured too
    twin = sim.config.twin()
    for f in sim.frames:
        kv, state = cache_bytes(sim.config, f.position + 1)
        assert (f.memory.kv_bytes, f.memory.state_bytes) == (kv, state)
        assert f.memory.twin_kv_bytes == sum(cache_bytes(twin, f.position + 1))
        assert sum(f.memory.layer_bytes) == f.memory.total_bytes
    no_twin = make(preset=preset, prompt="ab", twin=False)
    assert no_twin.twin_model is None and no_twin.frame.memory.twin_kv_bytes == sim.frames[2].memory.twin_kv_bytes


def test_step_into_walks_the_sublayers_in_execution_order(base):
    cfg = base.config
    views = base.step_into()
    assert [v.index for v in views] == list(range(2 * cfg.num_layers + 2))
    assert (views[0].site, views[-1].site) == ("embed", "head")
    for layer in range(cfg.num_layers):
        attn, mlp = views[1 + 2 * layer], views[2 + 2 * layer]
        assert (attn.layer, attn.site, attn.kind) == (layer, "attn", cfg.layer_kinds[layer])
        assert (attn.kda is not None) == (attn.kind == "kda")
        assert (mlp.routing is not None) == (mlp.kind == "moe")
        assert attn.depth.site == "attn" and mlp.depth.site == "mlp"
    assert views[4].label == "L1 mlp · MoE" and views[7].label == "L3 attn · MLA"
    assert [t[0] for t in views[-1].top] == list(base.frame.top_ids)
    assert base.step_into(0)[0].label.startswith("embed")


def test_histories_cover_the_frames_up_to_the_cursor(base):
    layer = base.config.moe_layers[0]
    load = base.expert_load(layer)
    assert load.sum() == (base.cursor + 1) * base.config.top_k
    norms = base.state_norm_history(base.config.kda_layers[0], 1)
    assert norms.shape == (base.cursor + 1,) and norms[-1] == base.frame.kda[0].state_norm[1]
    mem = base.memory_history()
    assert list(mem["position"]) == list(range(base.cursor + 1))
    assert np.all(np.diff(mem["kv_bytes"]) > 0) and len(set(mem["state_bytes"])) == 1


def _trace(sim) -> dict:
    moe, kda = sim.config.moe_layers[0], sim.config.kda_layers[0]
    return {
        "token_ids": [f.token_id for f in sim.frames],
        "experts_layer1": [f.routing_for(moe).expert_ids.tolist() for f in sim.frames],
        "state_norm_layer0": [round(float(f.kda_for(kda).state_norm.sum()), 6) for f in sim.frames],
        "top_prob": [round(float(f.top_probs[0]), 6) for f in sim.frames],
        "kv_bytes": [f.memory.kv_bytes for f in sim.frames],
        "twin_kv_bytes": [f.memory.twin_kv_bytes for f in sim.frames],
    }


def test_golden_trace():
    runs = {}
    for name, temperature in (("greedy", 0.0), ("sampled", 1.0)):
        sim = make(temperature=temperature, seed=0)
        sim.run(8)
        runs[name] = _trace(sim)
    doc = {"preset": "tiny", "prompt": PROMPT, "seed": 0, "weights": "random", "steps": 8, "runs": runs}
    if os.environ.get("TINY_K3_REGEN_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(doc, indent=1) + "\n")
    golden = json.loads(GOLDEN.read_text())
    for name, trace in golden["runs"].items():
        got = runs[name]
        for key in ("token_ids", "experts_layer1", "kv_bytes", "twin_kv_bytes"):
            assert got[key] == trace[key], f"{name}: {key} differs from the golden trace"
        for key in ("state_norm_layer0", "top_prob"):
            np.testing.assert_allclose(got[key], trace[key], rtol=1e-4, err_msg=f"{name}: {key}")


@pytest.mark.parametrize("call, message", [
    (lambda: make(prompt=""), "the prompt is empty"),
    (lambda: make(preset="nope"), "unknown preset 'nope'"),
    (lambda: make(preset="k3"), "only counted, never run"),
    (lambda: make(prompt="x" * 511), "allows 512 tokens in all"),
    (lambda: make(weights="best"), "weights must be one of"),
    (lambda: make(temperature=-1), "temperature must be 0"),
    (lambda: make(weights="trained", preset=K3Config.preset("tiny").replace(name="custom-test")),
     "no trained weights ship"),
])
def test_bad_construction_gives_one_clear_sentence(call, message):
    with pytest.raises(ValueError) as info:
        call()
    text = str(info.value)
    assert message in text and text.endswith(".") and "\n" not in text


def test_bad_navigation_gives_one_clear_sentence():
    sim = make(prompt="a")
    sim.goto(0)
    with pytest.raises(ValueError, match="already at the first token"):
        sim.back()
    for i in (2, -1, "x"):
        with pytest.raises(ValueError, match="0 to 1"):
            sim.goto(i)
    with pytest.raises(ValueError, match="token id in"):
        sim.step(force_token=9999)
    with pytest.raises(ValueError, match="one byte-sized character"):
        sim.step(force_token="ab")
    with pytest.raises(ValueError, match="at most"):
        sim.run(10_000)
    with pytest.raises(ValueError, match="temperature must be 0"):
        sim.step(temperature=-0.5, seed=3)
    assert (sim.temperature, sim.sample_seed) == (0.0, 0)  # a refused step changes no setting
    with pytest.raises(ValueError, match="no MoE"):
        sim.expert_load(0)
    assert len(sim.frames) == 2 and sim.cursor == 0        # nothing was lost by the failed calls


def test_a_full_timeline_refuses_one_more_step():
    sim = make(prompt="abcde", preset=K3Config.preset("tiny").replace(max_seq_len=8))   # BOS + 5 = 6 tokens
    sim.run(2)
    assert len(sim.frames) == 8
    last = sim.frames[-1]
    for call in (sim.step, lambda: sim.step(force_token="q")):
        with pytest.raises(ValueError, match="the timeline is full"):
            call()
    assert sim.frames[-1] is last                  # the refused step changed nothing
    sim.back()
    sim.step(force_token="q")                      # a branch inside the limit still works
    assert sim.frames[-1].input_id == ord("q")


def test_auto_weights_take_the_shipped_checkpoints_of_both_models(monkeypatch):
    import tiny_k3.model as model_module
    from tiny_k3 import TinyK3
    from tiny_k3.weights import config_for

    loaded = []

    def fake_from_pretrained(name, device=None):
        loaded.append(name)
        return TinyK3(config_for(name))

    monkeypatch.setattr(model_module, "available_pretrained", lambda: ["tiny", "tiny-twin"])
    monkeypatch.setattr(TinyK3, "from_pretrained", staticmethod(fake_from_pretrained))
    sim = make(prompt="a", weights="auto")
    assert loaded == ["tiny", "tiny-twin"] and (sim.weights, sim.twin_weights) == ("trained", "trained")
    assert all(k == "mla" for k in sim.twin_model.config.layer_kinds)
    loaded.clear()
    monkeypatch.setattr(model_module, "available_pretrained", lambda: ["tiny"])
    sim = make(prompt="a", weights="trained")
    assert loaded == ["tiny"] and (sim.weights, sim.twin_weights) == ("trained", "random")
    loaded.clear()
    assert make(prompt="a", weights="random").weights == "random" and not loaded


def test_a_checkpoint_name_opens_its_config_and_trained_weights():
    """`Simulation("small-twin")` (the README's name for the twin) builds the all-MLA twin of `small` with its
    shipped weights, and a saved run of it reopens (Simulation.from_run resolves the same name)."""
    sim = Simulation("small-twin", "b=5; | b=", seed=0, twin=False)
    assert sim.config == K3Config.preset("small").twin() and sim.weights == "trained", sim.weights
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        Simulation("nope", "hi")
