"""The Recorder: how the model reports what happened inside it, to whoever is watching.

The model calls `recorder.record(event, layer, **tensors)` at every event below, and a Recorder receives each
as a typed NamedTuple in `on(event)` (EmbedEvent, DepthEvent, ... below: their fields are the columns of
this table, after `layer`); without a recorder it reports into `NO_RECORDER`, which ignores everything (a
method call and a few `detach` views per sublayer, nothing copied). Events, in execution order for one
forward call:

| event        | layer            | tensors                                                                  |
|--------------|------------------|--------------------------------------------------------------------------|
| "embed"      | -1               | x [B,T,D]                                                                |
| "depth"      | layer index      | site ("attn", "mlp" or "out"), weights [B,T,N] (None for "standard"), h [B,T,D] |
| "kda"        | layer index      | prev_state [B,H,K,V] (None at the start), state [B,H,K,V], g [B,T,H,K], beta [B,T,H], q, k [B,T,H,K] (L2-normalised), v [B,T,H,V], conv_in [B,T,C] (the short convolution's inputs) |
| "mla"        | layer index      | probs [B,H,T,S] (softmax over the S cached keys), cache_len              |
| "moe"        | layer index      | scores [B,T,E], bias [E], expert_ids [B,T,k], weights [B,T,k]            |
| "sublayer"   | layer index      | site ("attn" or "mlp"), kind ("kda", "mla", "moe", "dense"), out [B,T,D] |
| "logits"     | num_layers       | logits [B,T,vocab]                                                       |

Layer indices are 0-based. Tensors are detached; a recorder that keeps them must copy what it needs.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Union

import torch

# ---------------------------------------------------------------------------- the events, typed


class EmbedEvent(NamedTuple):
    layer: int                            # -1
    x: torch.Tensor                       # [B, T, D] the input tokens' embeddings


class DepthEvent(NamedTuple):
    layer: int                            # num_layers for the read before the head
    site: str                             # "attn", "mlp" or "out"
    weights: torch.Tensor | None          # [B, T, N] over the depth sources (None for the standard residual)
    h: torch.Tensor                       # [B, T, D] the sublayer input


class KDAEvent(NamedTuple):
    layer: int
    prev_state: torch.Tensor | None       # [B, H, K, V] before these tokens (None at the first token)
    state: torch.Tensor                   # [B, H, K, V] after them
    g: torch.Tensor                       # [B, T, H, K] log decay
    beta: torch.Tensor                    # [B, T, H] write strength
    q: torch.Tensor                       # [B, T, H, K] L2-normalised query
    k: torch.Tensor                       # [B, T, H, K] the key kda_step wrote under (L2-normalised)
    v: torch.Tensor                       # [B, T, H, V] the value
    conv_in: torch.Tensor | None = None   # [B, T, C] the short convolution's inputs (q|k|v before it)


class MLAEvent(NamedTuple):
    layer: int
    probs: torch.Tensor                   # [B, H, T, S] softmax over the S cached keys
    cache_len: int


class MoEEvent(NamedTuple):
    layer: int
    scores: torch.Tensor                  # [B, T, E] unbiased sigmoid affinities
    bias: torch.Tensor | None             # [E] the selection bias (None without one)
    expert_ids: torch.Tensor              # [B, T, k]
    weights: torch.Tensor                 # [B, T, k]


class SublayerEvent(NamedTuple):
    layer: int
    site: str                             # "attn" or "mlp"
    kind: str                             # "kda", "mla", "dense" or "moe"
    out: torch.Tensor                     # [B, T, D] what the sublayer wrote to the stream


class LogitsEvent(NamedTuple):
    layer: int                            # num_layers
    logits: torch.Tensor                  # [B, T, vocab]


Event = Union[EmbedEvent, DepthEvent, KDAEvent, MLAEvent, MoEEvent, SublayerEvent, LogitsEvent]
EVENTS: dict[str, type] = {"embed": EmbedEvent, "depth": DepthEvent, "kda": KDAEvent, "mla": MLAEvent,
                           "moe": MoEEvent, "sublayer": SublayerEvent, "logits": LogitsEvent}


class Recorder:
    """Base recorder: the model calls `record(name, layer, **tensors)`; `on` receives it as a typed event
    (EVENTS[name]). Subclass and override `on` (dispatch on the event's type); this one ignores everything."""

    def record(self, event: str, layer: int, **data: Any) -> None:
        self.on(EVENTS[event](layer, **data))

    def on(self, event: Event) -> None:
        pass


class _Nobody(Recorder):
    def record(self, event: str, layer: int, **data: Any) -> None:   # (not even the event is made)
        pass


NO_RECORDER = _Nobody()  # the default of every forward: nobody is watching


def detached(t: torch.Tensor) -> torch.Tensor:
    """t as a recorder gets it: detached where it takes part in autograd, else t itself (without autograd, as
    in every decode step, a detach is a new view for nothing: ~900 of them a recorded k3-topo step)."""
    return t.detach() if t.requires_grad else t


class TraceRecorder(Recorder):
    """Keeps every event as (name, layer, data) with tensors detached and copied to the CPU."""

    def __init__(self):
        self.events: list[tuple[str, int, dict[str, Any]]] = []

    def on(self, event: Event) -> None:
        kept = {k: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v
                for k, v in event._asdict().items() if k != "layer"}
        self.events.append((_NAMES[type(event)], event.layer, kept))

    def of(self, event: str) -> list[tuple[int, dict[str, Any]]]:
        """All (layer, data) pairs of one kind of event ("kda", ...: the EVENTS names), in the order they happened."""
        return [(layer, data) for e, layer, data in self.events if e == event]


_NAMES = {kind: name for name, kind in EVENTS.items()}
