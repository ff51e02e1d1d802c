"""Recomputed KDA states: what a recorded step keeps instead of its states (sim/framestore.py).

KDA states are not stored per token. A decode step's state is kda_step(S_{t-1}, k_t, v_t, g_t, beta_t)
(tiny_k3/kda.py, the model's own decode function), so a step keeps those inputs (k, v, g: [H, K] each, a
fifth of a float16 S) and a link to the step before it, and S_t is recomputed on access, all L layers in
one batched kda_step per step, from a float32 Keyframe at most KDA_CHAIN steps back: the session's
branching snapshot where one is at hand (its memory, not a copy). The recorder makes that same batched
call as it records and keeps the float16 states themselves where it is not bit for bit the model's (the
next step then starts a new chain), so the recomputation is never a guess. Cost: a cold state is up to 63
batched calls (k3-topo ~1 ms each), the next frame's one more; the last 8 steps' states are cached.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from tiny_k3.cache import KDAState, tensor_bytes
from tiny_k3.kda import kda_step

KDA_CHAIN = 64        # a recomputed state is at most this many kda_step calls from its keyframe


@dataclass(frozen=True, slots=True)
class Keyframe:
    """The float32 states [H, K, V] of every KDA layer before a chain's first step (None: a zero state)."""

    states: tuple[np.ndarray | None, ...]

    def stack(self, shape: tuple[int, int, int]) -> torch.Tensor:
        """[L, H, K, V] float32 (shape = (H, K, V) for the zero states)."""
        return torch.stack([torch.zeros(shape) if s is None else torch.tensor(s) for s in self.states])


@dataclass(frozen=True, slots=True)
class KDAInputs:
    """What kda_step took at every KDA layer of one step (L layers), besides beta (StepArrays.beta)."""

    k: np.ndarray                 # [L, H, K] float32, L2-normalised keys
    v: np.ndarray                 # [L, H, V] float32
    g: np.ndarray                 # [L, H, K] float32 log decay

    def advance(self, beta: np.ndarray, state: torch.Tensor) -> torch.Tensor:
        """[L, H, K, V] float32: every layer's state after this step, from the states before it [L, H, K, V].

        The L layers go through kda_step as its batch, the one call the recorder checks against the model."""
        k, v, g, b = (torch.tensor(a)[:, None] for a in (self.k, self.v, self.g, beta))   # [L, 1, H, ...]
        _, state = kda_step(torch.zeros_like(k), k, v, g, b, initial_state=state, output_final_state=True)
        return state

    @property
    def state_shape(self) -> tuple[int, int, int]:
        return self.k.shape[1], self.k.shape[2], self.v.shape[2]


def recompute(step) -> torch.Tensor:
    """[L, H, K, V] float32: every KDA layer's S_t after `step` (a StepArrays), from the nearest keyframe
    or recently recomputed step before it, one batched kda_step per step."""
    to_replay = []
    while True:
        state = _recent(step)
        if state is not None:
            break
        to_replay.append(step)
        if isinstance(step.kda_from, Keyframe):
            state = step.kda_from.stack(step.kda_inputs.state_shape)
            break
        step = step.kda_from
    for step in reversed(to_replay):
        state = step.kda_inputs.advance(step.beta, state)
        _remember(step, state)
    return state


# The last few recomputed steps, id(step) -> (weakref to the step, its [L, H, K, V] states): stepping along
# the timeline recomputes one step. A step that is gone leaves a dead entry, never a wrong one. Locked: a
# front end's worker thread records while its UI thread reads.
_RECENT: OrderedDict = OrderedDict()
_RECENT_LIMIT = 8                      # 8 steps (k3-topo: 4.5 MB)
_RECENT_LOCK = threading.Lock()


def _recent(step) -> torch.Tensor | None:
    with _RECENT_LOCK:
        hit = _RECENT.get(id(step))
    return hit[1] if hit is not None and hit[0]() is step else None


def _remember(step, state: torch.Tensor) -> None:
    with _RECENT_LOCK:
        _RECENT[id(step)] = (weakref.ref(step), state)
        _RECENT.move_to_end(id(step))
        while len(_RECENT) > _RECENT_LIMIT:
            _RECENT.popitem(last=False)


class KDALinks:
    """The output KDA states (the model's own tensors) of the last few verified steps, so that a new step
    whose input states are those very tensors links to that step instead of keeping a keyframe. A Simulation
    owns one, as it owns its bias cache. Holding the tensors keeps their addresses from being reused."""

    def __init__(self, limit: int = 4):
        self._tails: OrderedDict = OrderedDict()
        self._limit = limit

    @staticmethod
    def _key(states) -> tuple:
        return tuple(None if s is None else (s.data_ptr(), 0 if s.is_inference() else s._version) for s in states)

    def parent(self, prev_states):
        """The step whose output states are `prev_states` (per KDA layer, None: a zero state), if kept; it
        is handed out once (the step that continues it becomes the tail)."""
        hit = self._tails.pop(self._key(prev_states), None)
        return None if hit is None else hit[0]

    def add(self, step, states) -> None:
        self._tails[self._key(states)] = (step, tuple(states))
        while len(self._tails) > self._limit:
            self._tails.popitem(last=False)


class LeanKDAState:
    """A branching snapshot of one KDA layer that keeps only the conv tail: its S is the state its frame's
    record recomputes (`record`, a StoredKDA). `clone()` gives the KDAState a restore needs."""

    __slots__ = ("conv", "record")

    def __init__(self, conv: torch.Tensor, record):
        self.conv, self.record = conv, record

    def clone(self) -> KDAState:
        return KDAState(self.record._step.state32(self.record._row).clone(), self.conv.clone())

    def nbytes(self) -> int:
        return tensor_bytes(self.conv)
