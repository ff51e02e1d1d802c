"""FrameRecorder: what one decode step reports through tiny_k3.probe, kept as numpy records for a Frame.

The model calls `record(event, layer, **tensors)` once per sublayer (see tiny_k3/probe.py for the events).
Recording does no tensor work per event: it keeps references to the step's tensors (the model makes new
ones every step and never updates them in place) in a NamedTuple per event. `finish()` then works per
kind of record, not per layer: one stack of every KDA state of the step, one of every score vector, one
reduction for every RMS, ... and one transfer to the CPU per kind, handing out read-only numpy views.

Stored precision: the KDA state display copy is float16 (its norms stay exact, float32). The router's
scores stay float32: views rank them against the chosen ids (which expert won only thanks to the bias)
and lesson 6 checks weights == s[ids] / sum(s[ids]), both of which float16 would break for near-ties.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from tiny_k3.probe import Recorder

from .frame import DepthRecord, KDARecord, RoutingRecord, SublayerRecord

_EMPTY = np.zeros(0, np.float32)
_EMPTY.flags.writeable = False


class EmbedEvent(NamedTuple):
    x: torch.Tensor                       # [D] the input token's embedding


class DepthEvent(NamedTuple):
    layer: int
    site: str                             # "attn", "mlp" or "out"
    weights: torch.Tensor | None          # [N] over the depth sources (None for the standard residual)
    h: torch.Tensor                       # [D] the sublayer input


class KDAEvent(NamedTuple):
    layer: int
    prev_state: torch.Tensor | None       # [H, K, V] before this token (None at the first token)
    state: torch.Tensor                   # [H, K, V] after it
    g: torch.Tensor                       # [H, K] log decay
    beta: torch.Tensor                    # [H] write strength


class MoEEvent(NamedTuple):
    layer: int
    scores: torch.Tensor                  # [E] unbiased sigmoid affinities
    bias: np.ndarray                      # [E] the selection bias (shared between frames while it is unchanged)
    expert_ids: torch.Tensor              # [k]
    weights: torch.Tensor                 # [k]


class SublayerEvent(NamedTuple):
    layer: int
    site: str                             # "attn" or "mlp"
    kind: str                             # "kda", "mla", "dense" or "moe"
    out: torch.Tensor                     # [D] what the sublayer wrote to the stream


class StepRecord(NamedTuple):
    """One decode step as numpy records, in execution order per kind (the parts of a Frame)."""

    embed_norm: float
    depth: tuple[DepthRecord, ...]
    kda: tuple[KDARecord, ...]
    routing: tuple[RoutingRecord, ...]
    sublayers: tuple[SublayerRecord, ...]
    logits: np.ndarray                    # [vocab] float32, the next-token logits


def _numpy(t: torch.Tensor, dtype: torch.dtype = torch.float32) -> np.ndarray:
    """One tensor -> a read-only numpy array of `dtype` (one transfer when it lives on a GPU)."""
    a = t.detach().to(dtype).cpu().numpy()
    a.flags.writeable = False
    return a


class FrameRecorder(Recorder):
    """Keeps what a Frame needs from one decode step (B = 1, T = 1); see the module docstring.

    bias_cache: layer -> ((data_ptr, version), numpy bias), owned by the Simulation, so that frames share
    one bias array per layer for as long as the bias is unchanged.
    """

    def __init__(self, bias_cache: dict):
        self._bias_cache = bias_cache
        self.embed: EmbedEvent | None = None
        self.depth: list[DepthEvent] = []
        self.kda: list[KDAEvent] = []
        self.moe: list[MoEEvent] = []
        self.sublayers: list[SublayerEvent] = []
        self.logits: torch.Tensor | None = None

    def _bias(self, layer: int, bias: torch.Tensor | None, num_experts: int) -> np.ndarray:
        if bias is None:
            bias = torch.zeros(num_experts)
        key = (bias.data_ptr(), bias._version)
        hit = self._bias_cache.get(layer)
        if hit is None or hit[0] != key:
            hit = self._bias_cache[layer] = (key, _numpy(bias.detach().clone()))
        return hit[1]

    def record(self, event: str, layer: int, **d) -> None:
        if event == "embed":
            self.embed = EmbedEvent(d["x"][0, -1])
        elif event == "depth":
            w = d["weights"]
            self.depth.append(DepthEvent(layer, d["site"], None if w is None else w[0, -1], d["h"][0, -1]))
        elif event == "kda":
            prev = d["prev_state"]
            self.kda.append(KDAEvent(layer, None if prev is None else prev[0], d["state"][0], d["g"][0, -1],
                                     d["beta"][0, -1]))
        elif event == "moe":
            scores = d["scores"][0, -1]
            self.moe.append(MoEEvent(layer, scores, self._bias(layer, d["bias"], scores.shape[-1]),
                                     d["expert_ids"][0, -1], d["weights"][0, -1]))
        elif event == "sublayer":
            self.sublayers.append(SublayerEvent(layer, d["site"], d["kind"], d["out"][0, -1]))
        elif event == "logits":
            self.logits = d["logits"][0, -1]

    def finish(self) -> StepRecord:
        """The recorded step as numpy records (one batched computation and transfer per kind of record)."""
        rms_of = [e.x for e in (self.embed,) if e is not None] + [e.h for e in self.depth] + \
                 [e.out for e in self.sublayers]
        rms = (torch.stack(rms_of).float().pow(2).mean(-1).sqrt().tolist() if rms_of else [])
        embed_norm = rms.pop(0) if self.embed is not None else 0.0
        depth_rms, sub_rms = rms[:len(self.depth)], rms[len(self.depth):]
        logits = _numpy(self.logits) if self.logits is not None else _EMPTY
        return StepRecord(embed_norm, self._depth(depth_rms), self._kda(), self._routing(),
                          tuple(SublayerRecord(e.layer, e.site, e.kind, r) for e, r in zip(self.sublayers, sub_rms)),
                          logits)

    def _depth(self, h_norms: list[float]) -> tuple[DepthRecord, ...]:
        read = [e.weights.reshape(-1) for e in self.depth if e.weights is not None]
        flat = _numpy(torch.cat(read)) if read else _EMPTY
        out, offset = [], 0
        for e, h_norm in zip(self.depth, h_norms):
            n = 0 if e.weights is None else e.weights.numel()
            out.append(DepthRecord(e.layer, e.site, flat[offset:offset + n] if n else _EMPTY, h_norm))
            offset += n
        return tuple(out)

    def _kda(self) -> tuple[KDARecord, ...]:
        """State display copies, decay alpha_t = exp(g_t), beta, ||S_t|| and the delta-rule write's norm."""
        if not self.kda:
            return ()
        state = torch.stack([e.state for e in self.kda]).float()                      # [L, H, K, V]
        decay = torch.stack([e.g for e in self.kda]).float().exp()                     # [L, H, K]
        prev = torch.stack([torch.zeros_like(e.state) if e.prev_state is None else e.prev_state
                            for e in self.kda]).float()
        # What this token changed beyond decaying: S_t - Diag(alpha_t) S_{t-1} (kda.md §1).
        write = state - decay[..., None] * prev
        norms = torch.linalg.vector_norm(torch.stack([state, write]), dim=(-2, -1))    # [2, L, H]
        state16, decay, beta = _numpy(state, torch.float16), _numpy(decay), _numpy(torch.stack([e.beta for e in self.kda]))
        norms = _numpy(norms)
        return tuple(KDARecord(e.layer, state16[i], decay[i], beta[i], norms[0, i], norms[1, i])
                     for i, e in enumerate(self.kda))

    def _routing(self) -> tuple[RoutingRecord, ...]:
        if not self.moe:
            return ()
        scores = _numpy(torch.stack([e.scores for e in self.moe]))                     # [L, E]
        ids = torch.stack([e.expert_ids for e in self.moe]).detach().cpu().numpy().astype(np.int64)
        ids.flags.writeable = False
        weights = _numpy(torch.stack([e.weights for e in self.moe]))
        return tuple(RoutingRecord(e.layer, scores[i], e.bias, ids[i], weights[i]) for i, e in enumerate(self.moe))
