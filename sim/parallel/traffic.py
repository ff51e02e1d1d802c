"""What the MoE all_to_alls moved: one record per rank and MoE call, assembled per (step, layer) over ranks.

`RankTraffic` is what one rank logs in one MoE call (plain ints, so it travels through gather_object);
`assemble_traffic` stacks the N ranks' records of the same call into a `LayerTraffic` of numpy arrays;
`EPRun` is a whole run as rank 0 gathers it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np


class RankTraffic(NamedTuple):
    """One MoE call on one rank. Lists are indexed by the other rank (length N) unless said otherwise."""

    step: int                    # 0 = prefill, s = decode step s
    layer: int
    tokens: int                  # tokens this rank holds
    copies_to: list[int]         # token copies sent to each rank (one per token per distinct destination)
    pairs_to: list[int]          # (token, expert) pairs whose expert lives on each rank
    distinct: list[int]          # [N+1] tokens touching 0, 1, ... N distinct ranks
    pairs_here: int              # expert evaluations this rank computed for all senders
    dispatch_bytes_to: list[int]  # bytes handed to all_to_all_single, per destination (rows + metadata)
    combine_bytes_to: list[int]   # bytes of the pre-summed rows sent back, per destination


@dataclass(frozen=True)
class LayerTraffic:
    """What one MoE layer moved in one step (0 = prefill, s = decode step s), over all N ranks. numpy arrays.

    tokens [N]          tokens each rank holds (its own sequences: attention is data parallel)
    copies [N, N]       token copies dispatched src -> dst (one per token per distinct destination rank)
    pairs [N, N]        (token, expert) pairs src -> dst (k per token)
    distinct [N+1]      tokens that touch 1, 2, ... N distinct ranks (index = number of ranks)
    dispatch_bytes, combine_bytes [N, N]  bytes src -> dst as handed to all_to_all_single: dispatch = latent rows
                        + routing metadata; combine = the pre-summed latent rows going back from the expert rank
    """

    step: int
    layer: int
    tokens: np.ndarray
    copies: np.ndarray
    pairs: np.ndarray
    distinct: np.ndarray
    dispatch_bytes: np.ndarray
    combine_bytes: np.ndarray

    @property
    def load(self) -> np.ndarray:
        """[N] expert evaluations (token, expert pairs) computed on each rank."""
        return self.pairs.sum(0)

    @property
    def imbalance(self) -> float:
        """Busiest rank's load / mean load (1.0 = perfectly even)."""
        return float(self.load.max() / self.load.mean())

    @property
    def destinations(self) -> float:
        """Mean distinct ranks a token touches."""
        return float((self.distinct * np.arange(len(self.distinct))).sum() / self.distinct.sum())

    @property
    def bytes(self) -> np.ndarray:
        """[N, N] all bytes src -> dst (dispatch + combine); the diagonal never leaves the rank."""
        return self.dispatch_bytes + self.combine_bytes

    def as_dict(self) -> dict:
        return dict(step=self.step, layer=self.layer, tokens=self.tokens, copies=self.copies, pairs=self.pairs,
                    dispatch_bytes=self.dispatch_bytes, combine_bytes=self.combine_bytes, load=self.load,
                    imbalance=self.imbalance, destinations=self.destinations, distinct=self.distinct)


def assemble_traffic(logs: list[list[RankTraffic]]) -> list[LayerTraffic]:
    """Per-rank logs (rank order; one record per MoE call, the same calls on every rank) -> LayerTraffic list."""
    out = []
    for records in zip(*logs):
        def stacked(name: str) -> np.ndarray:               # [N, ...]: one row per rank
            return np.array([getattr(r, name) for r in records], dtype=np.int64)

        out.append(LayerTraffic(
            step=records[0].step, layer=records[0].layer, tokens=stacked("tokens"),
            copies=stacked("copies_to"), pairs=stacked("pairs_to"), distinct=stacked("distinct").sum(0),
            dispatch_bytes=stacked("dispatch_bytes_to"), combine_bytes=stacked("combine_bytes_to")))
    return out


@dataclass
class EPRun:
    """The result of an expert-parallel run, gathered on rank 0 (or the parent process).

    sequences: the token ids each sequence started with; `ranks_of[i]` the rank that served it;
    logits: the prefill logits per sequence [T_i, vocab]; generated [n_seq, new_tokens] (greedy);
    step_logits [steps, n_seq, vocab]: the last position's logits of every forward (prefill, then each decode);
    traffic: one LayerTraffic per (step, MoE layer); max_diff: max |EP - single-process| of the logits where
    `check` ran (None otherwise).
    """

    preset: str
    world_size: int
    backend: str
    sequences: list[list[int]]
    ranks_of: list[int]
    logits: list[np.ndarray]
    generated: np.ndarray
    step_logits: np.ndarray
    traffic: list[LayerTraffic]
    max_diff: float | None = None
    tokens_equal: bool | None = None
    info: dict = field(default_factory=dict)

    def stats(self) -> list[dict]:
        """Every (step, layer) as a plain dict of numpy arrays and floats, for lessons and plots."""
        return [t.as_dict() for t in self.traffic]

    def step_matrix(self, step: int = 0, what: str = "bytes") -> np.ndarray:
        """[N, N] `what` ("bytes", "copies", "pairs", "dispatch_bytes", "combine_bytes") summed over a step's layers."""
        return sum(getattr(t, what) for t in self.traffic if t.step == step)
