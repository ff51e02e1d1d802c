"""sim.recorder.FrameRecorder against the raw events (TraceRecorder), and the Choice / Frame choice fields."""

import numpy as np
import pytest
import torch

from sim.frame import Choice
from sim.recorder import FrameRecorder, KDAEvent, MoEEvent, StepRecord
from tiny_k3 import K3Config, TinyK3
from tiny_k3.probe import Recorder, TraceRecorder


class Tee(Recorder):
    def __init__(self, *recorders):
        self.recorders = recorders

    def record(self, event, layer, **data):
        for r in self.recorders:
            r.record(event, layer, **data)


def _rms(t: torch.Tensor) -> float:
    return float(t.double().pow(2).mean().sqrt())


@pytest.fixture(scope="module")
def step():
    """A tiny model's third decode step, seen by both recorders."""
    torch.manual_seed(0)
    model = TinyK3(K3Config.preset("tiny")).eval()
    with torch.no_grad():
        _, cache = model(torch.tensor([[256, 70]]))
        frame_rec, trace = FrameRecorder({}), TraceRecorder()
        model(torch.tensor([[71]]), cache, recorder=Tee(frame_rec, trace))
    assert all(isinstance(e, KDAEvent) for e in frame_rec.kda) and all(isinstance(e, MoEEvent) for e in frame_rec.moe)
    return model.config, frame_rec.finish(), trace


def test_records_equal_what_the_events_say(step):
    cfg, rec, trace = step
    assert isinstance(rec, StepRecord)
    kda = trace.of("kda")
    assert [r.layer for r in rec.kda] == [layer for layer, _ in kda] == cfg.kda_layers
    for r, (_, d) in zip(rec.kda, kda):
        state, prev, g = d["state"][0], d["prev_state"][0], d["g"][0, 0]
        np.testing.assert_array_equal(r.state, state.to(torch.float16).numpy())
        np.testing.assert_allclose(r.decay, g.exp().numpy(), rtol=1e-6)
        np.testing.assert_allclose(r.beta, d["beta"][0, 0].numpy(), rtol=1e-6)
        np.testing.assert_allclose(r.state_norm, state.flatten(1).norm(dim=-1).numpy(), rtol=1e-5)
        write = state - g.exp()[..., None] * prev
        np.testing.assert_allclose(r.correction_norm, write.flatten(1).norm(dim=-1).numpy(), rtol=1e-5)
        assert r.correction_norm.max() > 0 and not np.allclose(r.correction_norm, r.state_norm)
    moe = trace.of("moe")
    assert [r.layer for r in rec.routing] == [layer for layer, _ in moe] == cfg.moe_layers
    for r, (_, d) in zip(rec.routing, moe):
        np.testing.assert_array_equal(r.scores, d["scores"][0, 0].numpy())
        np.testing.assert_array_equal(r.bias, d["bias"].numpy())
        np.testing.assert_array_equal(r.expert_ids, d["expert_ids"][0, 0].numpy())
        np.testing.assert_array_equal(r.weights, d["weights"][0, 0].numpy())
        assert r.expert_ids.dtype == np.int64 and not r.scores.flags.writeable
    depth = trace.of("depth")
    assert [(r.layer, r.site) for r in rec.depth] == [(layer, d["site"]) for layer, d in depth]
    for r, (_, d) in zip(rec.depth, depth):
        np.testing.assert_allclose(r.weights, d["weights"][0, 0].numpy(), rtol=1e-6)
        assert r.h_norm == pytest.approx(_rms(d["h"]), rel=1e-5)
    subs = trace.of("sublayer")
    assert [(r.layer, r.site, r.kind) for r in rec.sublayers] == [(layer, d["site"], d["kind"]) for layer, d in subs]
    for r, (_, d) in zip(rec.sublayers, subs):
        assert r.out_norm == pytest.approx(_rms(d["out"]), rel=1e-5)
    assert rec.embed_norm == pytest.approx(_rms(trace.of("embed")[0][1]["x"]), rel=1e-5)
    np.testing.assert_array_equal(rec.logits, trace.of("logits")[0][1]["logits"][0, -1].numpy())


def test_the_bias_array_is_shared_until_the_bias_changes():
    torch.manual_seed(0)
    model = TinyK3(K3Config.preset("tiny")).eval()
    cache_of_bias: dict = {}
    runs = []
    with torch.no_grad():
        for _ in range(2):
            rec = FrameRecorder(cache_of_bias)
            model(torch.tensor([[256]]), recorder=rec)
            runs.append(rec.finish())
        model.moe_layers()[0].router.bias += 0.5
        rec = FrameRecorder(cache_of_bias)
        model(torch.tensor([[256]]), recorder=rec)
        runs.append(rec.finish())
    assert runs[0].routing[0].bias is runs[1].routing[0].bias
    assert runs[2].routing[0].bias is not runs[1].routing[0].bias
    np.testing.assert_allclose(runs[2].routing[0].bias - runs[1].routing[0].bias, 0.5)


def test_choice_agreement():
    assert Choice.forced(7).is_forced and not Choice.sampled(1.0, 3).is_forced
    assert Choice.sampled(0.0, 1).same_as(Choice.sampled(0.0, 2))          # argmax: the seed plays no part
    assert not Choice.sampled(1.0, 1).same_as(Choice.sampled(1.0, 2))
    assert not Choice.forced(7).same_as(Choice.sampled(0.0, 0))
    assert Choice.forced(7).same_as(Choice.forced(7)) and not Choice.forced(7).same_as(Choice.forced(8))


def test_frames_carry_their_choice_as_fields():
    from sim import Simulation

    sim = Simulation("tiny", "ab", weights="random", twin=False, temperature=0.5, seed=3)
    first, last = sim.frames[0], sim.frames[-1]
    assert first.prompt and first.forced and first.choice == Choice.forced(first.token_id)
    assert first.extra == {"prompt": True, "temperature": None, "seed": None}
    assert last.prompt and not last.forced and last.choice == Choice.sampled(0.5, 3)
    sim.step(force_token="z")
    assert sim.frames[-2].choice == Choice.forced(ord("z")) and sim.frames[-2].prompt


def test_a_model_built_in_inference_mode_records_and_its_bias_changes_are_seen():
    # its buffers are inference tensors, which have no version counter: the bias array is made afresh each step
    torch.manual_seed(0)
    with torch.inference_mode():
        model = TinyK3(K3Config.preset("tiny")).eval()
        cache_of_bias: dict = {}
        runs = []
        for shift in (0.0, 0.5):
            model.moe_layers()[0].router.bias += shift
            rec = FrameRecorder(cache_of_bias)
            model(torch.tensor([[256]]), recorder=rec)
            runs.append(rec.finish())
    np.testing.assert_allclose(runs[1].routing[0].bias - runs[0].routing[0].bias, 0.5)


def test_recorded_tensors_never_take_part_in_autograd():
    # with autograd on the model hands detached tensors to the recorder; without it, the tensors themselves
    from tiny_k3.probe import detached

    class Keep(Recorder):
        def __init__(self):
            self.tensors = []

        def record(self, event, layer, **data):
            self.tensors += [v for v in data.values() if isinstance(v, torch.Tensor)]

    torch.manual_seed(0)
    model = TinyK3(K3Config.preset("tiny"))
    keep = Keep()
    logits, _ = model(torch.tensor([[256, 70]]), recorder=keep)
    assert logits.requires_grad and len(keep.tensors) > 20
    assert not any(t.requires_grad for t in keep.tensors)
    x = torch.ones(2, requires_grad=True)
    y = x * 2
    assert detached(y).grad_fn is None and torch.equal(detached(y), y)
    with torch.no_grad():
        z = x * 2
    assert detached(z) is z


def test_every_reported_event_reaches_on_as_its_typed_event_with_the_reported_fields():
    """tiny_k3.probe: the model's record(name, layer, **tensors) arrives in `on` as EVENTS[name], field for field;
    NO_RECORDER makes no event at all."""
    from tiny_k3.probe import EVENTS, NO_RECORDER

    class Raw(Recorder):                       # what the model reports, before any typing
        def __init__(self):
            self.reports = []

        def record(self, event, layer, **data):
            self.reports.append((event, layer, data))
            super().record(event, layer, **data)

        def on(self, event):
            self.reports[-1] += (event,)

    torch.manual_seed(1)
    model = TinyK3(K3Config.preset("tiny")).eval()
    raw = Raw()
    with torch.no_grad():
        model(torch.tensor([[256, 70, 71]]), recorder=raw)
    assert {name for name, *_ in raw.reports} == set(EVENTS) - {"mla"} | ({"mla"} if model.config.mla_layers else set())
    for name, layer, data, event in raw.reports:
        assert type(event) is EVENTS[name] and event.layer == layer
        assert all(getattr(event, k) is v for k, v in data.items()), name
    made = []
    NO_RECORDER.on = made.append               # (an instance attribute: undone below)
    try:
        with torch.no_grad():
            model(torch.tensor([[256, 70]]))
    finally:
        del NO_RECORDER.on
    assert made == []
