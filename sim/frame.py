"""Frame: everything that happened for one token. The one data contract every front end reads.

A Frame is immutable and hands out plain numpy arrays (read-only in a recorded one); it holds no reference
to the model, so a timeline of thousands of them is cheap and can be handed to any screen. Sublayer records
are in execution order: for each layer, the attention sublayer then the MLP sublayer, then the output read.

What lies behind a recorded Frame (one the Simulation made, not one built from arrays by sim.runfile or a
test): its records are views made on access of one StepArrays per step (sim/framestore.py), and its KDA
states are not stored but recomputed on access, in torch on the CPU, by kda_step from the step's inputs
after the state before it: a chain of up to 64 steps back to a float32 keyframe, which may be a view of the
Simulation's branching snapshot (sim/kdastates.py; the last few recomputed are cached). In turn the
Simulation's older snapshots keep only conv tails and read their S from a frame's record. So a recorded
Frame keeps the step arrays before it in its chain alive, and reading `.state` costs up to 64 small torch calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, is_dataclass
from functools import lru_cache

import numpy as np

from tiny_k3.attnres import DepthStream


@dataclass(frozen=True, slots=True)
class RoutingRecord:
    """One MoE sublayer's choice for this token."""

    layer: int
    scores: np.ndarray        # [E] float32 sigmoid affinities (unbiased)
    bias: np.ndarray          # [E] float32 selection bias (e_score_correction_bias)
    expert_ids: np.ndarray    # [k] int64, chosen experts, by descending biased score
    weights: np.ndarray       # [k] float32, renormalised unbiased scores (x routed_scaling)


@dataclass(frozen=True, slots=True)
class KDARecord:
    """One KDA layer after this token (state per head, key-major)."""

    layer: int
    state: np.ndarray         # [H, K, V] float16 display copy of S_t (norms below are exact)
    decay: np.ndarray         # [H, K] float32 alpha_t = exp(g_t): how much of each key row survives
    beta: np.ndarray          # [H] float32 write strength
    state_norm: np.ndarray    # [H] float32 ||S_t||_F
    correction_norm: np.ndarray  # [H] float32 ||S_t - Diag(alpha_t) S_{t-1}||_F: the delta-rule write


@dataclass(frozen=True, slots=True)
class DepthRecord:
    """One Attention Residuals read: the input of a sublayer (or of the head, site "out")."""

    layer: int
    site: str                 # "attn", "mlp" or "out"
    weights: np.ndarray       # [N] float32 over the sources (empty for the standard residual)
    h_norm: float             # RMS of the sublayer input h


@dataclass(frozen=True, slots=True)
class SublayerRecord:
    layer: int
    site: str                 # "attn" or "mlp"
    kind: str                 # "kda", "mla", "dense" or "moe"
    out_norm: float           # RMS of the sublayer output v


@dataclass(frozen=True, slots=True)
class MemoryRecord:
    """Decode-cache bytes after this token, measured from the live tensors."""

    kv_bytes: int             # growing caches of the hybrid (MLA layers)
    state_bytes: int          # fixed KDA states (S + conv tail)
    twin_kv_bytes: int        # the all-softmax twin's whole cache at the same position (its KV cache + conv tails)
    layer_bytes: tuple[int, ...] = ()  # per layer of the hybrid

    @property
    def total_bytes(self) -> int:
        return self.kv_bytes + self.state_bytes


@dataclass(frozen=True)
class Choice:
    """How the token after a frame is chosen: forced (a given token id) or sampled from the frame's logits.

    Sampling uses (temperature, seed) at the frame's position (`sim.session.sample_token`); temperature 0
    is the argmax, where the seed plays no part.
    """

    token: int | None = None          # the forced token id; None when sampled
    temperature: float = 0.0
    seed: int = 0

    @classmethod
    def forced(cls, token: int) -> "Choice":
        return cls(token=token)

    @classmethod
    def sampled(cls, temperature: float, seed: int) -> "Choice":
        return cls(temperature=temperature, seed=seed)

    @property
    def is_forced(self) -> bool:
        return self.token is not None

    def frame_fields(self) -> dict:
        """A Frame's forced / temperature / seed fields for this choice (temperature and seed None when forced)."""
        if self.is_forced:
            return {"forced": True, "temperature": None, "seed": None}
        return {"forced": False, "temperature": self.temperature, "seed": self.seed}

    def same_as(self, other: "Choice") -> bool:
        """Both choose the same way; two argmax choices agree whatever their seeds."""
        if not self.is_forced and not other.is_forced and self.temperature == other.temperature == 0:
            return True
        return self == other


@dataclass(frozen=True)
class Frame:
    index: int                # place in the timeline (= position: prompt frames first, then generated ones)
    position: int             # position of the input token in the sequence
    input_id: int             # the token fed in at this step
    input_text: str
    token_id: int             # the token chosen from this step's logits (the generated token)
    token_text: str
    top_ids: np.ndarray       # [5] int64 most likely next tokens
    top_probs: np.ndarray     # [5] float32 their probabilities
    # Records in execution order: a tuple, or for a recorded frame sim.framestore.Records (a tuple's interface,
    # the records made on access from one compact store per step)
    routing: Sequence[RoutingRecord]
    kda: Sequence[KDARecord]
    depth: Sequence[DepthRecord]
    sublayers: Sequence[SublayerRecord]
    memory: MemoryRecord
    step_ms: float            # wall time of the hybrid's decode step (with recording)
    twin_step_ms: float       # wall time of the twin's decode step
    forced: bool = False      # the token was forced (the next prompt token, or by the user), not sampled
    embed_norm: float = 0.0   # RMS of the input token's embedding (the first depth source)
    prompt: bool = False      # a prompt frame (its token_id is the next prompt token)
    temperature: float | None = None  # how a sampled token_id was chosen (None when forced)
    seed: int | None = None
    # per depth read, the names of the sources it weighs ("emb", "b1", ..., "partial"): depth_source_names
    depth_sources: tuple[tuple[str, ...], ...] = ()

    @property
    def extra(self) -> dict:
        """{"prompt", "temperature", "seed"}: the three fields above as the dict that older readers know."""
        return {"prompt": self.prompt, "temperature": self.temperature, "seed": self.seed}

    @property
    def choice(self) -> Choice:
        """How token_id was chosen."""
        return Choice.forced(self.token_id) if self.forced else Choice.sampled(self.temperature, self.seed)

    def routing_for(self, layer: int) -> RoutingRecord | None:
        if hasattr(self.routing, "for_layer"):     # a recorded frame's Records (sim/framestore.py)
            return self.routing.for_layer(layer)
        return next((r for r in self.routing if r.layer == layer), None)

    def kda_for(self, layer: int) -> KDARecord | None:
        if hasattr(self.kda, "for_layer"):
            return self.kda.for_layer(layer)
        return next((r for r in self.kda if r.layer == layer), None)

    def arrays(self) -> list[np.ndarray]:
        """The numpy arrays this frame holds, each once: a recorded frame's StepArrays (sim/framestore.py:
        the step's stacked arrays and the shared selection biases) or, for records built from arrays
        (sim.runfile, tests), their fields."""
        held: dict[int, np.ndarray] = {}
        for a in (self.top_ids, self.top_probs):
            held[id(a)] = a
        for records in (self.routing, self.kda, self.depth):
            if hasattr(records, "arrays"):             # a recorded frame's Records: the step's arrays
                parts = records.arrays()
            else:
                parts = [getattr(r, f.name) for r in records for f in fields(r)]
            for a in parts:
                if isinstance(a, np.ndarray):
                    held.setdefault(id(a), a)
        return list(held.values())

    def nbytes(self) -> int:
        """Bytes of the arrays this frame holds (`arrays()`). Arrays shared with other frames (the selection
        bias) count in full here; bench/bench_sim.py counts them once per timeline."""
        return sum(a.nbytes for a in self.arrays())

    def same_as(self, other: "Frame") -> bool:
        """Equal in everything the model computed (ids, arrays, bytes), ignoring wall times and how
        token_id was chosen (prompt, temperature, seed).

        Frames hold numpy arrays, so `==` cannot compare them; tests and exercises use this instead.
        """
        if not isinstance(other, Frame):
            return False
        return all(_same(getattr(self, f.name), getattr(other, f.name))
                   for f in fields(self) if f.name not in _NOT_COMPUTED)


_NOT_COMPUTED = ("step_ms", "twin_step_ms", "prompt", "temperature", "seed")


def _same(a, b) -> bool:
    """Deep equality for the values a Frame holds (dataclasses, tuples, numpy arrays, scalars)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape
                and a.dtype == b.dtype and np.array_equal(a, b))
    if is_dataclass(a) and not isinstance(a, type):
        # fields(), not type(): a recorded record (sim/framestore.py) and one built from arrays compare alike
        return (is_dataclass(b) and fields(a) == fields(b)
                and all(_same(getattr(a, f.name), getattr(b, f.name)) for f in fields(a)))
    if isinstance(a, (tuple, list, Sequence)) and not isinstance(a, str):   # Sequence: sim.framestore.Records
        return (isinstance(b, (tuple, list, Sequence)) and not isinstance(b, str) and len(a) == len(b)
                and all(_same(x, y) for x, y in zip(a, b)))
    return a == b


@lru_cache(maxsize=16)
def depth_source_names(residual: str, block_size: int, reads: int) -> tuple[tuple[str, ...], ...]:
    """The names of the sources each of a token's `reads` depth reads weighs, in execution order (read j
    comes after j sublayer outputs): tiny_k3.attnres.DepthStream's own bookkeeping, replayed with 0.0
    standing in for every tensor (only the names are kept). Frame.depth_sources holds them."""
    stream = DepthStream(0.0, residual, block_size)
    names = []
    for _ in range(reads):
        names.append(tuple(stream.source_names()))
        stream.add(0.0)
    return tuple(names)


@dataclass(frozen=True)
class SublayerView:
    """One stop when stepping into a token (`Simulation.step_into`), in execution order.

    site/kind: ("embed", "embed"), ("attn", "kda" | "mla"), ("mlp", "dense" | "moe") or ("head", "head").
    depth: the AttnRes read that made this sublayer's input (None for the embedding; site "out" for the head).
    out_norm: RMS of what the sublayer wrote to the stream (for the head: RMS of its input h).
    top: for the head only, the most likely next tokens as (id, text, probability).
    """

    index: int
    layer: int                # -1 for the embedding, num_layers for the head
    site: str
    kind: str
    label: str                # e.g. "L3 attn · MLA"
    depth: DepthRecord | None = None
    routing: RoutingRecord | None = None
    kda: KDARecord | None = None
    out_norm: float = 0.0
    top: tuple[tuple[int, str, float], ...] = ()
