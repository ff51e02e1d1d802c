"""FrameRecorder: what one decode step reports through tiny_k3.probe, kept as numpy records for a Frame.

The model reports once per sublayer, and `on` receives each report as a typed event (tiny_k3/probe.py).
Recording does no tensor work per event: it keeps the events, references to the step's tensors (the model
makes new ones every step and never updates them in place). `finish()` then works per
kind of record, not per layer: one stack of every KDA state of the step, one of every score vector, one
reduction for every RMS, ... and one transfer to the CPU per kind, into one StepArrays (sim/framestore.py)
that the step's records are thin read-only views of.

Stored precision: the KDA state display copy is float16 (its norms stay exact, float32). The router's
scores are exact float32 (packed losslessly): views rank them against the chosen ids (which expert won
only thanks to the bias), show any expert's score, shade the grid by it, and lesson 6 checks
weights == s[ids] / sum(s[ids]); float16 would break near-ties in all of these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from tiny_k3.probe import DepthEvent, EmbedEvent, Event, KDAEvent, LogitsEvent, MoEEvent, Recorder, SublayerEvent

from .frame import DepthRecord, KDARecord, RoutingRecord, SublayerRecord
from .framestore import Layout, PackedFloats, Records, StepArrays, id_dtype, read_only
from .kdastates import KDA_CHAIN, KDAInputs, KDALinks, Keyframe

_PREVIOUS = object()   # a prefill step's kda_from: the step made just before it (sim/recorder.py _kda_chain)
_NO_KDA = (read_only(np.zeros((0, 0, 0, 0), np.float16)), None, None, 0, read_only(np.zeros((0, 0), np.float32)),
           read_only(np.zeros((2, 0, 0), np.float32)))


# Events keep the model's tensors as they come, [B=1, T, ...], and finish() takes position -1 once per kind
# after concatenating them: an index per tensor per event was ~2/3 of recording's cost at k3-topo's 560 events.


def _last(tensors: list[torch.Tensor]) -> torch.Tensor:
    """[1, T, *] each -> [n, *]: every tensor's last position, in one cat and one index."""
    return torch.cat(tensors)[:, -1]


def _steps(tensors: list[torch.Tensor]) -> torch.Tensor:
    """[1, T, *] each -> [T, n, *]: every position's values, in one cat and one view (T = 1: `_last`'s view)."""
    return torch.cat(tensors).transpose(0, 1)


class Tee(Recorder):
    """Hands every event to two recorders (a Frame's and a what-if's), in order."""

    def __init__(self, first: Recorder, second: Recorder):
        self.first, self.second = first, second

    def on(self, event: Event) -> None:
        self.first.on(event)
        self.second.on(event)


class StepRecord(NamedTuple):
    """One decode step as numpy records, in execution order per kind (the parts of a Frame)."""

    embed_norm: float
    depth: Sequence[DepthRecord]          # sim.framestore.Records: a tuple's interface, made on access
    kda: Sequence[KDARecord]
    routing: Sequence[RoutingRecord]
    sublayers: Sequence[SublayerRecord]
    logits: np.ndarray                    # [vocab] float32, the next-token logits


def _numpy(t: torch.Tensor, dtype: torch.dtype = torch.float32) -> np.ndarray:
    """One tensor -> a read-only numpy array of `dtype` (one transfer when it lives on a GPU)."""
    # (each step skipped where it is a no-op: even a no-op .to() or .cpu() costs a dispatch, ~10 a step per kind)
    t = t if t.dtype == dtype else t.to(dtype)
    t = t if t.device.type == "cpu" else t.cpu()
    return read_only((t.detach() if t.requires_grad else t).numpy())


class FrameRecorder(Recorder):
    """Keeps what a Frame needs from one decode step (B = 1, T = 1); see the module docstring.

    bias_cache: layer -> ((data_ptr, version), numpy bias), owned by the Simulation, so that frames share
    one bias array per layer for as long as the bias is unchanged. kda_links: the Simulation's KDALinks, so
    that a step's KDA states are recomputed from the step before (sim/framestore.py); keyframe: layer ->
    KDAState, the session's snapshot of the states this step starts from, where it has one (a chain that
    starts here uses its memory instead of a copy, once checked equal).
    """

    def __init__(self, bias_cache: dict, kda_links: KDALinks | None = None, keyframe: dict | None = None):
        self._bias_cache = bias_cache
        self._links = KDALinks() if kda_links is None else kda_links
        self._keyframe = keyframe
        self.embed: EmbedEvent | None = None
        self.depth: list[DepthEvent] = []
        self.kda: list[KDAEvent] = []
        self.moe: list[MoEEvent] = []
        self.sublayers: list[SublayerEvent] = []
        self.logits: torch.Tensor | None = None

    def _bias(self, layer: int, bias: torch.Tensor | None, num_experts: int) -> np.ndarray:
        if bias is None:   # no selection bias (NoSelectionBias): one shared zero array per layer
            key, bias = ("zeros", num_experts), torch.zeros(num_experts)
        else:   # (an inference tensor, from a model built in inference mode, has no version: never reused)
            key = None if bias.is_inference() else (bias.data_ptr(), bias._version)
        hit = self._bias_cache.get(layer)
        if hit is None or key is None or hit[0] != key:
            hit = self._bias_cache[layer] = (key, _numpy(bias.detach().clone()))
        return hit[1]

    def on(self, event: Event) -> None:
        kind = type(event)
        if kind is DepthEvent:
            self.depth.append(event)
        elif kind is SublayerEvent:
            self.sublayers.append(event)
        elif kind is MoEEvent:   # the bias as numpy, one array per layer while it is unchanged
            self.moe.append(event._replace(bias=self._bias(event.layer, event.bias, event.scores.shape[-1])))
        elif kind is KDAEvent:
            self.kda.append(event)
        elif kind is EmbedEvent:
            self.embed = event
        elif kind is LogitsEvent:
            self.logits = event.logits

    def finish(self) -> StepRecord:
        """The recorded decode step (one token) as numpy records: one batched computation and transfer per
        kind of record into one StepArrays (sim/framestore.py), the records thin views of it."""
        return self.finish_steps()[-1]

    def finish_steps(self) -> list[StepRecord]:
        """One StepRecord per position of the recorded forward, in order: one for a decode step, T for a
        prefill segment of T tokens (sim/prefill.py), every kind still computed once for all T."""
        with torch.inference_mode():   # (~60 small ops, all read only: a tenth less dispatch each, as the model's)
            return self._finish()

    def _finish(self) -> list[StepRecord]:
        T = self.logits.shape[1] if self.logits is not None else 1
        rms_of = [e.x for e in (self.embed,) if e is not None] + [e.h for e in self.depth] + \
                 [e.out for e in self.sublayers]
        rms = (_numpy(_steps(rms_of).float().pow(2).mean(-1).sqrt()) if rms_of         # [T, n]
               else read_only(np.zeros((T, 0), np.float32)))
        first = 1 if self.embed is not None else 0
        depth_weights, depth_offsets = self._depth(T)
        kda = self._kda() if T == 1 else self._kda_chain(T)
        scores, expert_ids, routing_weights = self._routing(T)
        bias = tuple(e.bias for e in self.moe)
        layout = Layout.of([(e.layer,) for e in self.moe], [(e.layer,) for e in self.kda],
                           [(e.layer, e.site) for e in self.depth], [(e.layer, e.site, e.kind) for e in self.sublayers])
        logits = _numpy(self.logits[0]) if self.logits is not None else read_only(np.zeros((T, 0), np.float32))
        out, step = [], None
        for t in range(T):
            state, inputs, kda_from, depth, beta, norms = kda[t]
            if kda_from is _PREVIOUS:          # a prefill's chain: this step's states follow the step before's
                kda_from, depth = step, step.kda_depth + 1
            step = StepArrays(PackedFloats.pack(scores[t]), bias, expert_ids[t], routing_weights[t], state, inputs,
                              kda_from, depth, beta, norms, depth_weights[t], depth_offsets,
                              rms[t, first:first + len(self.depth)], rms[t, first + len(self.depth):], layout)
            out.append(StepRecord(float(rms[t, 0]) if first else 0.0, Records(step, "depth"), Records(step, "kda"),
                                  Records(step, "routing"), Records(step, "sublayers"), logits[t]))
        self.last_step = step
        if T == 1 and self.kda and step.state is None:   # recomputable: the next step may continue from this one
            self._links.add(step, [e.state for e in self.kda])
        return out

    def link(self, states: list[torch.Tensor]) -> None:
        """Let the next step continue the last recorded step's chain from `states` (per KDA layer): the states
        a prefill hands to the decode cache, equal to that step's recomputation (sim/prefill.py)."""
        self._links.add(self.last_step, states)

    def _depth(self, T: int) -> tuple[np.ndarray, np.ndarray]:
        """(every read's weights concatenated, per position [T, sum N] float32, offsets [reads + 1] int64)."""
        read = [e.weights for e in self.depth if e.weights is not None]
        flat = (_numpy(torch.cat(read, -1)[0]) if read                                  # [1, T, sum N] -> [T, sum N]
                else read_only(np.zeros((T, 0), np.float32)))
        sizes = [0 if e.weights is None else e.weights.shape[-1] for e in self.depth]
        return flat, read_only(np.cumsum([0] + sizes, dtype=np.int64))

    def _kda(self) -> list[tuple]:
        """[a decode step's KDA fields]: (state or None, KDAInputs, kda_from, kda_depth, beta [L, H], norms [2, L, H])

        The norms are ||S_t|| and the delta-rule write's norm. The state is kept (float16) only where
        recomputing it from the step's inputs after the state before it is not bit for bit the model's.
        """
        if not self.kda:
            return [_NO_KDA]
        state = torch.cat([e.state for e in self.kda]).float()                        # [L, H, K, V]
        g = _last([e.g for e in self.kda]).float()                                     # [L, H, K]
        prev = torch.cat([torch.zeros_like(e.state) if e.prev_state is None else e.prev_state
                          for e in self.kda]).float()
        # What this token changed beyond decaying: S_t - Diag(alpha_t) S_{t-1} (kda.md §1).
        write = state - g.exp()[..., None] * prev
        norms = _numpy(torch.linalg.vector_norm(torch.stack([state, write]), dim=(-2, -1)))   # [2, L, H]
        inputs = KDAInputs(_numpy(_last([e.k for e in self.kda])), _numpy(_last([e.v for e in self.kda])), _numpy(g))
        beta = _numpy(_last([e.beta for e in self.kda]))
        # The recomputation runs on the CPU; a GPU's kernels round differently, so there the states are kept.
        if all(e.state.device.type == "cpu" for e in self.kda):
            kda_from, depth = self._chain()
            exact = torch.equal(inputs.advance(beta, prev), state)
        else:
            kda_from, depth, exact = None, 0, False
        kept = None if exact else _numpy(state, torch.float16)
        return [(kept, inputs, kda_from, depth, beta, norms)]

    def _kda_chain(self, T: int) -> list[tuple]:
        """[T steps' KDA fields] for a prefill segment: the per-token states are not the model's (its chunked
        form gives only the segment's last), so they are defined as the chain the recomputation walks: kda_step
        after kda_step from the state before the segment (KDAInputs.advance, in the same float32 on the CPU,
        so that a frame's recomputed state is exactly the one measured here). Kept in `chain_states`."""
        if not self.kda:
            return [_NO_KDA] * T
        cpu = [e.state.device.type == "cpu" for e in self.kda]
        g = _steps([e.g for e in self.kda]).float().cpu()                              # [T, L, H, K]
        k, v = (_numpy(_steps([getattr(e, n) for e in self.kda])) for n in ("k", "v"))  # [T, L, H, K|V]
        beta = _numpy(_steps([e.beta for e in self.kda]))                               # [T, L, H]
        prev = torch.cat([torch.zeros_like(e.state) if e.prev_state is None else e.prev_state
                          for e in self.kda]).float().cpu()                             # [L, H, K, V]
        kda_from, depth = self._chain() if all(cpu) else (self._copy_keyframe(), 0)
        gs, inputs, states = _numpy(g), [], []
        state = prev   # (a linked parent's output states are these very tensors, equal to its recomputation)
        for t in range(T):
            inputs.append(KDAInputs(k[t], v[t], gs[t]))
            state = inputs[t].advance(beta[t], state)
            states.append(state)
        self.chain_states = torch.stack(states)                                        # [T, L, H, K, V]
        prevs = torch.cat([prev[None], self.chain_states[:-1]])
        write = self.chain_states - g.exp()[..., None] * prevs                          # kda.md §1, as _kda
        norms = _numpy(torch.linalg.vector_norm(torch.stack([self.chain_states, write], 1), dim=(-2, -1)))
        out = []
        for t in range(T):
            if t == 0:
                start, d = kda_from, depth
            elif (depth + t) % KDA_CHAIN == 0:   # a chain is at most KDA_CHAIN steps: start another here
                start, d = Keyframe(tuple(read_only(s.numpy()) for s in self.chain_states[t - 1])), 0
            else:
                start, d = _PREVIOUS, None
            out.append((None, inputs[t], start, d, beta[t], norms[t]))
        return out

    def _copy_keyframe(self) -> Keyframe:
        return Keyframe(tuple(None if e.prev_state is None else _numpy(e.prev_state[0].clone()) for e in self.kda))

    def _chain(self) -> tuple:
        """(kda_from, kda_depth) for this step: the session's snapshot, the step before, or a copied keyframe."""
        prevs = [e.prev_state for e in self.kda]
        snap = self._keyframe
        if snap is not None and all(
                (p is None and snap.get(e.layer) is None) or
                (p is not None and snap.get(e.layer) is not None and torch.equal(snap[e.layer].state, p))
                for e, p in zip(self.kda, prevs)):
            return Keyframe(tuple(None if p is None else read_only(snap[e.layer].state[0].numpy())
                                  for e, p in zip(self.kda, prevs))), 0
        parent = self._links.parent(prevs)
        if parent is not None and parent.kda_depth + 1 < KDA_CHAIN:
            return parent, parent.kda_depth + 1
        return Keyframe(tuple(None if p is None else _numpy(p[0].clone()) for p in prevs)), 0

    def _routing(self, T: int) -> tuple[list[PackedFloats] | np.ndarray, np.ndarray, np.ndarray]:
        """(scores [T, R, E], expert ids [T, R, k] int16, weights [T, R, k] float32)."""
        if not self.moe:
            empty = read_only(np.zeros((T, 0, 0), np.float32))
            return empty, read_only(np.zeros((T, 0, 0), np.int16)), empty
        scores = _steps([e.scores for e in self.moe]).float().cpu().numpy()                 # [T, R, E]
        ids = read_only(_steps([e.expert_ids for e in self.moe]).cpu().numpy().astype(id_dtype(scores.shape[-1])))
        weights = _numpy(_steps([e.weights for e in self.moe]))
        return scores, ids, weights
