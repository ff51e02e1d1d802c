"""The Recorder: how the model reports what happened inside it, to whoever is watching.

The model calls `recorder.record(event, layer, **tensors)` at every event below; without a recorder
it reports into `NO_RECORDER`, which ignores everything (a method call and a few `detach` views per
sublayer, nothing copied). Events, in execution order for one forward call:

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

from typing import Any

import torch


class Recorder:
    """Base recorder: receives every event and ignores it. Subclass and override `record`."""

    def record(self, event: str, layer: int, **data: Any) -> None:
        pass


NO_RECORDER = Recorder()  # the default of every forward: nobody is watching


def detached(t: torch.Tensor) -> torch.Tensor:
    """t as a recorder gets it: detached where it takes part in autograd, else t itself (without autograd, as
    in every decode step, a detach is a new view for nothing: ~900 of them a recorded k3-topo step)."""
    return t.detach() if t.requires_grad else t


class TraceRecorder(Recorder):
    """Keeps every event as (event, layer, data) with tensors detached and copied to the CPU."""

    def __init__(self):
        self.events: list[tuple[str, int, dict[str, Any]]] = []

    def record(self, event: str, layer: int, **data: Any) -> None:
        kept = {k: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v for k, v in data.items()}
        self.events.append((event, layer, kept))

    def of(self, event: str) -> list[tuple[int, dict[str, Any]]]:
        """All (layer, data) pairs of one kind of event, in the order they happened."""
        return [(layer, data) for e, layer, data in self.events if e == event]
