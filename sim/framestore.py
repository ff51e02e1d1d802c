"""Where a Frame's record arrays live: one StepArrays per decode step, the records as thin views of it.

Why. A k3-topo token has 92 routing, 69 KDA, 187 depth and 186 sublayer records. Kept as one numpy view
per field (plus a float object per norm) they cost ~150 KB of Python objects per token, three times the
KDA snapshots' share. Here the step's arrays are stored once, stacked per kind of record, and a
record holds only (its StepArrays, its row): its array fields are properties that hand out a fresh
read-only view on each access (layer, site and kind stay plain attributes). A frame's records themselves
are made on access (Records: a tuple's interface) and live only while someone holds them.

KDA states are not stored per token but recomputed, bit for bit, from each step's kda_step inputs
(sim/kdastates.py).

Nothing is rounded. Every property returns bit for bit what the recorder measured (tests/test_framestore.py
builds every view from both and compares): expert ids are stored as int16 and handed out as int64, and the
router's scores are stored losslessly in 3 bytes a value where they allow it (PackedFloats). The records
stay instances of the public record types (RoutingRecord, ...), so `isinstance`, `dataclasses.fields`,
`getattr` by field name and `Frame.same_as` see no difference.
"""

from __future__ import annotations

import operator
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .frame import DepthRecord, KDARecord, RoutingRecord, SublayerRecord
from .kdastates import KDAInputs, Keyframe, recompute


def read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


_EMPTY = read_only(np.zeros(0, np.float32))


# ---------------------------------------------------------------------------- lossless float32 packing


@dataclass(frozen=True, slots=True)
class PackedFloats:
    """A float32 matrix [R, C] stored exactly, in 3 bytes a value where its rows allow it.

    A float32 is 16 high bits (sign, exponent, 7 mantissa bits) and 16 low bits. Within one row of router
    scores (sigmoids, mostly within a binade or two) the high halves span few values: each is stored as a
    uint8 offset from the row's `base` = max(high) - 255, the low half as it is. Values whose high half lies
    further below (a score far smaller than the row's largest) are kept whole in a sorted exception list.
    When exceptions would pass a sixteenth of the values, the matrix is kept as plain float32 (`raw`).
    """

    shape: tuple[int, int]
    raw: np.ndarray | None        # [R, C] float32 when not packed
    high: np.ndarray | None       # [R, C] uint8: high half - base[row]
    low: np.ndarray | None        # [R, C] uint16: low half
    base: np.ndarray | None       # [R] uint32
    where: np.ndarray | None      # [n] int64 flat indices of the exceptions, ascending
    bits: np.ndarray | None       # [n] uint32 their exact bit patterns

    @classmethod
    def pack(cls, a: np.ndarray) -> "PackedFloats":
        """a [R, C] float32 -> PackedFloats with row(i) == a[i] bit for bit."""
        a = np.ascontiguousarray(a, np.float32)
        if a.ndim != 2:
            raise ValueError(f"PackedFloats packs a [rows, columns] float32 matrix, got shape {a.shape}.")
        bits = a.view(np.uint32)
        high = (bits >> 16).astype(np.int64)
        base = np.maximum(high.max(1, initial=0) - 255, high.min(1, initial=0)) if a.size else np.zeros(len(a), np.int64)
        offset = high - base[:, None]
        outside = (offset < 0) | (offset > 255)
        where = np.flatnonzero(outside)
        if len(where) > a.size // 16:
            return cls(a.shape, read_only(a.copy()), None, None, None, None, None)
        return cls(a.shape, None, read_only(np.where(outside, 0, offset).astype(np.uint8)),
                   read_only((bits & 0xFFFF).astype(np.uint16)), read_only(base.astype(np.uint32)),
                   read_only(where), read_only(bits.reshape(-1)[where].copy()))

    def row(self, i: int) -> np.ndarray:
        """[C] float32, read-only: row i exactly as packed."""
        if self.raw is not None:
            return self.raw[i]
        bits = (self.high[i].astype(np.uint32) + self.base[i]) << 16 | self.low[i]
        C = self.shape[1]
        lo, hi = np.searchsorted(self.where, [i * C, (i + 1) * C])
        bits[self.where[lo:hi] - i * C] = self.bits[lo:hi]
        return read_only(bits.view(np.float32))

    def arrays(self) -> tuple[np.ndarray, ...]:
        return tuple(a for a in (self.raw, self.high, self.low, self.base, self.where, self.bits) if a is not None)


# ---------------------------------------------------------------------------- one step's arrays


@dataclass(frozen=True, slots=True, weakref_slot=True)
class StepArrays:
    """Every record array of one decode step, stacked per kind (R MoE, L KDA layers, N depth reads, S sublayers).

    bias holds one array per MoE layer, shared between the frames of a timeline while the bias is unchanged.
    KDA states: `state` when kept as they are, else recomputed from `kda_inputs` after `kda_from` (the step
    before, or the chain's Keyframe); `kda_depth` counts the steps since that keyframe (0 for the first).
    """

    scores: PackedFloats          # [R, E] unbiased sigmoid affinities
    bias: tuple[np.ndarray, ...]  # R x [E] float32 selection bias (shared)
    expert_ids: np.ndarray        # [R, k] int16 (int32 beyond 32767 experts)
    routing_weights: np.ndarray   # [R, k] float32
    state: np.ndarray | None      # [L, H, K, V] float16 display copies of S_t, or None: recomputed
    kda_inputs: KDAInputs | None
    kda_from: "StepArrays | Keyframe | None"
    kda_depth: int
    beta: np.ndarray              # [L, H] float32
    kda_norms: np.ndarray         # [2, L, H] float32: ||S_t||, ||S_t - Diag(alpha_t) S_{t-1}||
    depth_weights: np.ndarray     # [sum N_i] float32, the reads' weights concatenated
    depth_offsets: np.ndarray     # [N + 1] int64: read i is depth_weights[offsets[i]:offsets[i + 1]]
    h_norms: np.ndarray           # [N] float32 RMS of each read's h
    out_norms: np.ndarray         # [S] float32 RMS of each sublayer's output
    layout: "Layout"              # what each row is (layers, sites, kinds): one object shared by the timeline

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The arrays this step holds (the shared biases and a chain's keyframe included), for memory accounting."""
        kda = () if self.kda_inputs is None else (self.kda_inputs.k, self.kda_inputs.v, self.kda_inputs.g)
        key = tuple(a for a in self.kda_from.states if a is not None) if isinstance(self.kda_from, Keyframe) else ()
        explicit = () if self.state is None else (self.state,)
        return (*self.scores.arrays(), *self.bias, self.expert_ids, self.routing_weights, *explicit, *kda, *key,
                self.beta, self.kda_norms, self.depth_weights, self.depth_offsets, self.h_norms, self.out_norms)

    def decay(self) -> np.ndarray:
        """[L, H, K] float32 alpha_t = exp(g_t), computed as the recorder computes it (one exp over all layers)."""
        return read_only(torch.tensor(self.kda_inputs.g).exp().numpy())

    def state16(self, row: int) -> np.ndarray:
        """[H, K, V] float16: layer `row`'s state S_t display copy."""
        if self.state is not None:
            return self.state[row]
        return read_only(self.state32(row)[0].to(torch.float16).numpy())

    def state32(self, row: int) -> torch.Tensor:
        """[1, H, K, V] float32: layer `row`'s S_t (see states32)."""
        return self.states32()[row][None]

    def states32(self) -> torch.Tensor:
        """[L, H, K, V] float32: every layer's S_t, recomputed (sim/kdastates.py)."""
        return recompute(self)

def id_dtype(num_experts: int) -> type:
    return np.int16 if num_experts <= np.iinfo(np.int16).max + 1 else np.int32


# ---------------------------------------------------------------------------- the records as views


def _init(record, step: StepArrays, row: int, **plain) -> None:
    for name, value in plain.items():
        object.__setattr__(record, name, value)
    object.__setattr__(record, "_step", step)
    object.__setattr__(record, "_row", row)


class StoredRouting(RoutingRecord):
    """A RoutingRecord whose arrays are row `_row` of a StepArrays."""

    __slots__ = ("_step", "_row", "__weakref__")

    def __init__(self, step: StepArrays, row: int, layer: int):
        _init(self, step, row, layer=layer)

    scores = property(lambda self: self._step.scores.row(self._row))
    bias = property(lambda self: self._step.bias[self._row])
    expert_ids = property(lambda self: read_only(self._step.expert_ids[self._row].astype(np.int64)))
    weights = property(lambda self: self._step.routing_weights[self._row])


class StoredKDA(KDARecord):
    """A KDARecord whose arrays are row `_row` of a StepArrays."""

    __slots__ = ("_step", "_row", "__weakref__")

    def __init__(self, step: StepArrays, row: int, layer: int):
        _init(self, step, row, layer=layer)

    state = property(lambda self: self._step.state16(self._row))
    decay = property(lambda self: self._step.decay()[self._row])
    beta = property(lambda self: self._step.beta[self._row])
    state_norm = property(lambda self: self._step.kda_norms[0, self._row])
    correction_norm = property(lambda self: self._step.kda_norms[1, self._row])


class StoredDepth(DepthRecord):
    """A DepthRecord whose weights and h_norm are read `_row` of a StepArrays."""

    __slots__ = ("_step", "_row", "__weakref__")

    def __init__(self, step: StepArrays, row: int, layer: int, site: str):
        _init(self, step, row, layer=layer, site=site)

    @property
    def weights(self) -> np.ndarray:
        a, b = self._step.depth_offsets[self._row], self._step.depth_offsets[self._row + 1]
        return self._step.depth_weights[a:b] if b > a else _EMPTY

    h_norm = property(lambda self: float(self._step.h_norms[self._row]))


class StoredSublayer(SublayerRecord):
    """A SublayerRecord whose out_norm is entry `_row` of a StepArrays."""

    __slots__ = ("_step", "_row", "__weakref__")

    def __init__(self, step: StepArrays, row: int, layer: int, site: str, kind: str):
        _init(self, step, row, layer=layer, site=site, kind=kind)

    out_norm = property(lambda self: float(self._step.out_norms[self._row]))



# ---------------------------------------------------------------------------- a frame's records, made on access


@dataclass(frozen=True, slots=True)
class Layout:
    """What each row of a step's StepArrays is, per kind of record: the arguments after (step, row) of its
    Stored* record. Equal layouts are one object (`Layout.of`), so frames share it."""

    routing: tuple[tuple[int], ...]              # (layer,)
    kda: tuple[tuple[int], ...]                  # (layer,)
    depth: tuple[tuple[int, str], ...]           # (layer, site)
    sublayers: tuple[tuple[int, str, str], ...]  # (layer, site, kind)
    routing_rows: dict                           # layer -> row
    kda_rows: dict

    @staticmethod
    def of(routing, kda, depth, sublayers) -> "Layout":
        key = (tuple(routing), tuple(kda), tuple(depth), tuple(sublayers))
        with _LIVE_LOCK:
            hit = _LAYOUTS.get(key)
            if hit is None:
                hit = _LAYOUTS[key] = Layout(*key, {a[0]: i for i, a in enumerate(key[0])},
                                             {a[0]: i for i, a in enumerate(key[1])})
        return hit


_LAYOUTS: dict = {}
_MAKE = {"routing": StoredRouting, "kda": StoredKDA, "depth": StoredDepth, "sublayers": StoredSublayer}
# (id(step), kind, row) -> the record, for as long as anyone holds it: a held record keeps its step alive,
# so its id cannot be reused meanwhile.
_LIVE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_LIVE_LOCK = threading.Lock()


class Records(Sequence):
    """One kind of a recorded frame's records (routing, kda, depth or sublayers), made on access from the
    step's StepArrays: a read-only tuple's interface (len, index, slice, iterate) without keeping a ~90-byte
    object per record per token (k3-topo: 535 a token). A record is the same object for as long as anyone
    holds it, so `is` and `in` work as on a tuple."""

    __slots__ = ("_step", "_kind")

    def __init__(self, step: StepArrays, kind: str):
        self._step, self._kind = step, kind

    def __len__(self) -> int:
        return len(getattr(self._step.layout, self._kind))

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        n = len(self)
        j = operator.index(i)
        j = j + n if j < 0 else j
        if not 0 <= j < n:
            raise IndexError(f"record {i} is out of range; this frame has {n} {self._kind} records.")
        key = (id(self._step), self._kind, j)
        with _LIVE_LOCK:
            r = _LIVE.get(key)
            if r is None:
                r = _LIVE[key] = _MAKE[self._kind](self._step, j, *getattr(self._step.layout, self._kind)[j])
        return r

    def __iter__(self):
        return (self[j] for j in range(len(self)))

    def for_layer(self, layer: int):
        """The routing or KDA record of `layer`, or None (without making the others)."""
        j = getattr(self._step.layout, f"{self._kind}_rows").get(layer)
        return None if j is None else self[j]

    def arrays(self) -> tuple[np.ndarray, ...]:
        return self._step.arrays()

    def __repr__(self) -> str:
        return repr(tuple(self))
