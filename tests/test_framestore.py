"""sim.framestore: the compact store behind recorded Frames loses nothing a view uses.

1. PackedFloats gives back every float32 bit for bit (packed rows, exceptions, the plain fallback).
2. A recorded Frame (StepArrays + thin records) equals, field by field and bit for bit, the plain float32 /
   float16 records built straight from the model's events (TraceRecorder), and every picture (sim.render),
   the TUI's expert line and the what-if menu's runners-up come out the same from both.
"""

import dataclasses

import numpy as np
import pytest
import torch
from rich.console import Console

from sim import Simulation, render
from sim.frame import Choice, DepthRecord, KDARecord, RoutingRecord, SublayerRecord
from sim.framestore import PackedFloats, StoredRouting
from tiny_k3.probe import TraceRecorder


def bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ---------------------------------------------------------------------------- PackedFloats


def test_packed_scores_round_trip_bit_for_bit_in_three_bytes_a_value():
    rng = np.random.default_rng(0)
    a = torch.sigmoid(torch.randn(12, 896) * 0.5).numpy()
    a[3, 7] = 1e-7                               # far below its row's largest: an exception, kept whole
    p = PackedFloats.pack(a)
    assert p.raw is None and len(p.where) >= 1
    assert all(bits_equal(p.row(i), a[i]) for i in range(len(a)))
    assert sum(x.nbytes for x in p.arrays()) < 0.8 * a.nbytes
    assert not p.row(0).flags.writeable
    b = rng.standard_normal((3, 50)).astype(np.float32)
    b[0, :4] = [0.0, -0.0, np.inf, np.nan]
    b[1, :2] = [np.float32(1e-45), -np.float32(1e-45)]   # subnormals
    q = PackedFloats.pack(b)
    assert all(bits_equal(q.row(i), b[i]) for i in range(len(b)))


def test_packing_falls_back_to_plain_float32_when_values_span_too_many_binades():
    a = np.logspace(-30, 0, 64, dtype=np.float32).reshape(2, 32)
    p = PackedFloats.pack(a)
    assert p.raw is not None and all(bits_equal(p.row(i), a[i]) for i in range(2))
    empty = PackedFloats.pack(np.zeros((0, 0), np.float32))
    assert empty.shape == (0, 0)
    with pytest.raises(ValueError, match="rows, columns"):
        PackedFloats.pack(np.zeros(3, np.float32))


# ---------------------------------------------------------------------------- recorded frame vs plain records


@pytest.fixture(scope="module")
def frames():
    """(recorded Frame, the same Frame with plain records from the raw events) for two steps of `small`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    sim = Simulation("small", "k=4; m=", weights="random")
    out = []
    cache, twin = sim._cache, sim._twin_cache
    for token in (ord("7"), ord(";")):
        trace = TraceRecorder()
        frame, _, cache, twin = sim._compute_frame(len(sim.frames) + len(out), token, Choice.forced(65), False,
                                                   cache, twin, watch=trace)
        out.append((frame, plain_frame(frame, trace), trace))
    torch.set_num_threads(before)
    return sim, out


def plain_frame(frame, trace: TraceRecorder):
    """`frame` with every record rebuilt as plain arrays from the model's own tensors (how the recorder kept
    them before the store: scores float32, ids int64, state float16, ...)."""
    routing = tuple(RoutingRecord(layer, d["scores"][0, -1].float().numpy(), d["bias"].float().numpy(),
                                  d["expert_ids"][0, -1].numpy().astype(np.int64), d["weights"][0, -1].float().numpy())
                    for layer, d in trace.of("moe"))
    g = torch.stack([d["g"][0, -1] for _, d in trace.of("kda")]).float()
    decay = g.exp().numpy()                    # as the recorder computes it: one exp over the stacked layers
    kda = tuple(KDARecord(layer, d["state"][0].to(torch.float16).numpy(), decay[i], d["beta"][0, -1].float().numpy(),
                          np.array(r.state_norm), np.array(r.correction_norm))
                for i, ((layer, d), r) in enumerate(zip(trace.of("kda"), frame.kda)))
    depth = tuple(DepthRecord(layer, d["site"],
                              np.zeros(0, np.float32) if d["weights"] is None else d["weights"][0, -1].float().numpy(),
                              r.h_norm) for (layer, d), r in zip(trace.of("depth"), frame.depth))
    subs = tuple(SublayerRecord(r.layer, r.site, r.kind, r.out_norm) for r in frame.sublayers)
    return dataclasses.replace(frame, routing=routing, kda=kda, depth=depth, sublayers=subs)


def test_recorded_records_equal_the_raw_events_bit_for_bit(frames):
    _, pairs = frames
    for stored, plain, trace in pairs:
        assert stored.same_as(plain) and plain.same_as(stored)
        assert all(isinstance(r, StoredRouting) for r in stored.routing)
        for a, b in zip(stored.routing, plain.routing):
            assert all(bits_equal(getattr(a, f), getattr(b, f)) for f in ("scores", "bias", "expert_ids", "weights"))
            assert not a.scores.flags.writeable and not a.expert_ids.flags.writeable
        for a, b in zip(stored.kda, plain.kda):
            assert all(bits_equal(getattr(a, f), getattr(b, f)) for f in ("state", "decay", "beta"))
        for a, b in zip(stored.depth, plain.depth):
            assert (a.layer, a.site) == (b.layer, b.site) and bits_equal(a.weights, b.weights)
        rms = [float(d["h"][0, -1].double().pow(2).mean().sqrt()) for _, d in trace.of("depth")]
        np.testing.assert_allclose([r.h_norm for r in stored.depth], rms, rtol=1e-6)
        rms = [float(d["out"][0, -1].double().pow(2).mean().sqrt()) for _, d in trace.of("sublayer")]
        np.testing.assert_allclose([s.out_norm for s in stored.sublayers], rms, rtol=1e-6)
        assert all(type(s.out_norm) is float and type(d.h_norm) is float for s, d in zip(stored.sublayers, stored.depth))


def test_a_changed_array_is_seen_by_same_as(frames):
    _, [(stored, plain, _), _] = frames
    r = plain.routing[2]
    scores = r.scores.copy()
    scores[5] = np.nextafter(scores[5], np.float32(1))        # one ulp
    changed = dataclasses.replace(plain, routing=plain.routing[:2] + (dataclasses.replace(r, scores=scores),)
                                  + plain.routing[3:])
    assert not stored.same_as(changed)


def _text(renderable, color: bool) -> str:
    console = Console(record=True, width=160, color_system="truecolor" if color else None, force_terminal=color)
    console.print(renderable)
    return console.export_text(styles=color)


def test_every_view_is_the_same_from_the_store_and_from_the_plain_records(frames):
    from tui_app.panels import _expert_line

    sim, pairs = frames
    cfg = sim.config
    for stored, plain, _ in pairs:
        for a, b in zip(stored.routing, plain.routing):
            for pic in (lambda r: render.expert_grid(r, legend=True), render.topk_table):
                assert _text(pic(a), True) == _text(pic(b), True) and _text(pic(a), False) == _text(pic(b), False)
            load = np.arange(cfg.num_experts)
            assert [str(_expert_line(a, load, e)) for e in range(cfg.num_experts)] == \
                   [str(_expert_line(b, load, e)) for e in range(cfg.num_experts)]
            # the what-if menu's "next in line" and lesson 6's checks read these
            runners = [np.argsort(-(r.scores + r.bias), kind="stable")[cfg.top_k:2 * cfg.top_k] for r in (a, b)]
            assert np.array_equal(*runners)
            assert bits_equal(a.scores[a.expert_ids] / a.scores[a.expert_ids].sum(),
                              b.scores[b.expert_ids] / b.scores[b.expert_ids].sum())
        for a, b in zip(stored.kda, plain.kda):
            for h in range(cfg.kda_heads):
                for color in (True, False):
                    assert _text(render.state_heatmap(a.state[h]), color) == _text(render.state_heatmap(b.state[h]), color)
                    assert _text(render.decay_beta_bars(a, h), color) == _text(render.decay_beta_bars(b, h), color)
        for color in (True, False):
            assert _text(render.depth_map(stored), color) == _text(render.depth_map(plain), color)
            assert _text(render.memory_bars(stored, cfg), color) == _text(render.memory_bars(plain, cfg), color)


def test_frame_arrays_and_nbytes_count_the_store_once(frames):
    _, [(stored, plain, _), (second, _, _)] = frames
    held = stored.arrays()
    assert len({id(a) for a in held}) == len(held)
    assert stored.nbytes() == sum(a.nbytes for a in held)
    # the store is smaller than the plain records it stands for, and the bias arrays are shared by both steps
    assert stored.nbytes() < plain.nbytes()
    assert all(a.bias is b.bias for a, b in zip(stored.routing, second.routing))
    assert {id(r.bias) for r in stored.routing} <= {id(a) for a in held}


# ---------------------------------------------------------------------------- KDA states recomputed


def _model_states(model, ids) -> list[list[np.ndarray]]:
    """Per token, every KDA layer's float16 state straight from the model's decode path."""
    out, cache = [], None
    with torch.no_grad():
        for tok in ids:
            trace = TraceRecorder()
            _, cache = model(torch.tensor([[tok]]), cache, recorder=trace)
            out.append([d["state"][0].to(torch.float16).numpy() for _, d in trace.of("kda")])
    return out


@pytest.fixture(scope="module")
def long_run():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    sim = Simulation("tiny", "a long enough prompt", weights="random")
    sim.run(50)                                   # 71 frames: a chain from zeros, one from the snapshot at 64
    yield sim
    torch.set_num_threads(before)


def test_recomputed_states_are_the_models_bit_for_bit_across_chains_and_a_branch(long_run):
    from sim.kdastates import Keyframe, LeanKDAState
    from tiny_k3.cache import KDAState

    sim = long_run
    steps = [f.kda[0]._step for f in sim.frames]
    assert all(s.state is None for s in steps)                       # nothing kept: every step recomputes
    assert [s.kda_depth for s in steps[62:66]] == [62, 63, 0, 1]     # a new chain at the snapshot of 64 tokens
    first = sim.config.kda_layers[0]
    assert isinstance(steps[64].kda_from, Keyframe) and isinstance(sim._snapshots[64][first], KDAState)
    assert steps[64].kda_from.states[0].__array_interface__["data"][0] == sim._snapshots[64][first].state.data_ptr()
    assert isinstance(sim._snapshots[48][first], LeanKDAState)       # only its conv tail: S is frame 47's
    assert sim._snapshots[48][first].nbytes() < sim._snapshots[64][first].nbytes()
    want = _model_states(sim.model, [f.input_id for f in sim.frames])
    for f, states in zip(sim.frames, want):
        assert all(bits_equal(r.state, s) for r, s in zip(f.kda, states))
    sim.goto(50)
    sim.step(force_token="Q")                     # a branch: restored from the lean snapshot at 48, replayed
    sim.run(3)
    want = _model_states(sim.model, [f.input_id for f in sim.frames])
    for f, states in zip(sim.frames[48:], want[48:]):
        assert all(bits_equal(r.state, s) for r, s in zip(f.kda, states))
    fresh = Simulation("tiny", "a long enough prompt", weights="random")
    fresh.run(30)
    fresh.step(force_token="Q")
    fresh.run(3)
    assert len(fresh.frames) == len(sim.frames) and all(a.same_as(b) for a, b in zip(fresh.frames, sim.frames))


def test_a_state_the_recomputation_would_not_reproduce_is_kept_as_recorded(long_run, monkeypatch):
    from sim.kdastates import KDAInputs

    sim = long_run
    sim.goto(len(sim.frames) - 1)
    exact = KDAInputs.advance
    monkeypatch.setattr(KDAInputs, "advance", lambda self, beta, state: exact(self, beta, state) * 1.5)
    f = sim.step(force_token="Z")
    monkeypatch.undo()
    assert f.kda[0]._step.state is not None       # kept, float16, as the model had it
    g = sim.step()
    assert g.kda[0]._step.kda_depth == 0          # and the next step starts a new chain from a keyframe
    want = _model_states(sim.model, [x.input_id for x in sim.frames])
    for frame in (f, g):
        assert all(bits_equal(r.state, s) for r, s in zip(frame.kda, want[frame.index]))


def test_what_if_frames_recompute_the_states_the_changes_made(long_run):
    from sim.interventions import ResetState

    sim = long_run
    sim.goto(20)
    w = sim.what_if(ResetState(layer=sim.config.kda_layers[1]), steps=3)
    layer = 1                                      # the reset layer's row in frame.kda
    for orig, changed in zip(w.original, w.frames):
        assert all(r.state.dtype == np.float16 for r in changed.kda)
        # the recomputed float32 state has the norm the recorder measured from the model's own state
        for r in changed.kda:
            s32 = r._step.state32(r._row)[0]
            np.testing.assert_allclose(torch.linalg.vector_norm(s32, dim=(-2, -1)).numpy(), r.state_norm, rtol=1e-6)
        assert not np.array_equal(orig.kda[layer].state, changed.kda[layer].state)


def test_records_behave_as_a_tuple_and_keep_a_held_record_the_same_object(frames):
    import gc

    from sim.framestore import Records

    _, [(stored, plain, _), _] = frames
    recs = stored.depth
    assert isinstance(recs, Records) and len(recs) == len(plain.depth)
    assert [(d.layer, d.site) for d in recs] == [(d.layer, d.site) for d in plain.depth]
    assert recs[-1].site == "out" and recs[len(recs) - 1] is recs[-1]
    assert [d.layer for d in recs[2:5]] == [d.layer for d in plain.depth[2:5]] and isinstance(recs[2:5], tuple)
    with pytest.raises(IndexError, match="out of range"):
        recs[len(recs)]
    held = recs[3]
    assert recs[3] is held and held in recs                      # `is` (tui's panels) works while held
    layer = stored.routing[1].layer
    assert stored.routing_for(layer) is stored.routing[1] and stored.routing_for(-5) is None
    assert stored.kda_for(stored.kda[0].layer).layer == stored.kda[0].layer
    del held
    gc.collect()
    assert recs[3].layer == plain.depth[3].layer                 # made again once nobody held it
