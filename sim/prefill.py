"""Batched prefill: a prompt through the model a segment of up to SEGMENT tokens per forward, one Frame per token.

Stepping a prompt token by token runs every op once per token: k3-topo (93 layers, 560 probe events a
step) then loads about 6 tokens/s. Here each segment is one forward of the hybrid over tokens [1, T] (KDA
in its chunked form, MLA over the whole segment, the MoE over T tokens) and one of the twin, and the
recorder (`FrameRecorder.finish_steps`) cuts the [T, ...] tensors it saw into one record per token.

What a prefilled Frame holds is what the step-by-step one holds, to float rounding (tests/test_prefill.py
compares them frame by frame in float64). The differences, all of rounding or of bookkeeping:
- Every number comes from batched kernels instead of one-token ones.
- KDA's chunked form gives only the segment's last state, so a frame's state S_t is defined as the chain the
  frames recompute anyway (sim/kdastates.py): kda_step after kda_step from the state before the segment. The
  decode cache goes on from the chain's last state (the chunked form's, to rounding), so the next segment,
  the next step and every snapshot start where the frames end (float32 states; a float64 model's keep the
  chunked form's, the more precise).
- The prompt's last token is one decode step, as every generated token: the cursor starts on a frame that a
  what-if recomputes exactly from the caches before it.
- step_ms and twin_step_ms are the segment's wall time shared equally among its tokens.
- Memory bytes after each token are read off the segment's caches: an MLA cache holds one row per token, a
  KDA state is a fixed size from its first token on.

Segments are cut at multiples of SEGMENT = KEYFRAME_EVERY = KDA_CHAIN (64) positions, so each one starts its KDA
chain from a snapshot kept whole. The branching snapshots are the ones stepping would have kept (every
SNAPSHOT_EVERY tokens, the last RECENT_SNAPSHOTS whole, sim/session.py): S from the chain, the short
convolution's tail cut from the segment's own conv inputs (the "kda" event's conv_in).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from tiny_k3.cache import KDAState, MLACache, ModelCache
from tiny_k3.config import K3Config

from .frame import MemoryRecord
from .kdastates import KDA_CHAIN, LeanKDAState
from .memory import cache_bytes
from .recorder import FrameRecorder, StepRecord

SEGMENT = KDA_CHAIN     # tokens per forward: a segment's KDA frames form one chain from the snapshot before it


def segments(n: int, segment: int = SEGMENT) -> list[tuple[int, int]]:
    """[(start, end)] covering positions 0 .. n - 1 in order, cut at the multiples of `segment`."""
    return [(s, min(s + segment, n)) for s in range(0, n, segment)]


def layer_bytes_at(layer, tokens: int) -> int:
    """Bytes of one layer's decode cache after `tokens` tokens, from a cache that holds at least that many:
    an MLA cache keeps one row per token (so it scales; a twin's conv tail beside it does not), a KDA state is a
    fixed size."""
    if layer is None:
        return 0
    if isinstance(layer, MLACache):
        return layer.kv_nbytes() * tokens // layer.length + layer.nbytes() - layer.kv_nbytes()
    return layer.nbytes()


def memory_record(cache: ModelCache, twin_cache: ModelCache | None, twin_config: K3Config, tokens: int,
                  ints: dict) -> MemoryRecord:
    """The MemoryRecord after `tokens` tokens, read off the live caches (which may hold more: a segment's).

    twin_cache None: the twin is not run and its cache is a formula of the token count (sim.memory, checked
    by the tests). ints: one int object per distinct count (most layers hold the same bytes): ~3 KB less per
    k3-topo frame."""
    if twin_cache is not None:
        twin_kv = sum(layer_bytes_at(c, tokens) for c in twin_cache.layers if isinstance(c, MLACache))
    else:
        twin_kv = sum(cache_bytes(twin_config, tokens))    # its KV cache, and its conv tails where it keeps them
    kv = state = 0
    layer_bytes = []
    for c in cache.layers:
        b = layer_bytes_at(c, tokens)
        tail = c.nbytes() - c.kv_nbytes() if isinstance(c, MLACache) else 0     # an MLA conv tail is fixed state
        kv += b - tail if isinstance(c, MLACache) else 0
        state += b if isinstance(c, KDAState) else tail
        layer_bytes.append(ints.setdefault(b, b))
    return MemoryRecord(kv_bytes=kv, state_bytes=state, twin_kv_bytes=twin_kv, layer_bytes=tuple(layer_bytes))


@dataclass
class Segment:
    """One segment's forward: a StepRecord per token, the caches after it and its per-token wall times."""

    start: int
    records: list[StepRecord]
    cache: ModelCache
    twin_cache: ModelCache
    step_ms: float              # the hybrid's segment time / T
    twin_step_ms: float         # the twin's (NaN without a twin)
    recorder: FrameRecorder     # its KDA events (conv inputs) and chain states, for the snapshots
    conv_before: dict           # KDA layer -> conv tail [1, W-1, C] before the segment (None at the start)

    @property
    def end(self) -> int:
        return self.start + len(self.records)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def run_segment(model, twin_model, tokens: list[int], cache: ModelCache, twin_cache: ModelCache,
                recorder: FrameRecorder) -> Segment:
    """Tokens [T] through the hybrid (recorded by `recorder`) and the twin (None: not run), one forward each."""
    start = cache.position
    conv_before = {i: c.conv for i, c in enumerate(cache.layers) if isinstance(c, KDAState)}
    x = torch.tensor([tokens], device=model.device)
    _sync(x.device)
    t0 = time.perf_counter()
    _, cache = model(x, cache, recorder=recorder)
    _sync(x.device)
    t1 = time.perf_counter()
    twin_ms = float("nan")
    if twin_model is not None:
        _, twin_cache = twin_model(x, twin_cache)
        _sync(x.device)
        twin_ms = 1e3 * (time.perf_counter() - t1) / len(tokens)
    records = recorder.finish_steps()
    chain = getattr(recorder, "chain_states", None)                   # [T, L, H, K, V], or None (T = 1)
    if chain is not None and all(cache.layers[e.layer].state.dtype == chain.dtype for e in recorder.kda):
        # The cache goes on from the frames' own last state (the chain) rather than the chunked form's, equal
        # to it but for rounding: a snapshot, a branch and the next step then all start where the frames end.
        # (A float64 model keeps its float64 chunked state: the float32 chain would only lose precision.)
        states = []
        for row, e in enumerate(recorder.kda):
            c = cache.layers[e.layer]
            states.append(chain[-1, row][None].to(device=c.state.device, copy=True))
            cache.layers[e.layer] = KDAState(states[-1], c.conv)
        recorder.link(states)
    return Segment(start, records, cache, twin_cache, 1e3 * (t1 - t0) / len(tokens), twin_ms, recorder,
                   conv_before)


def segment_snapshots(segment: Segment, frames, total: int, every: int, recent: int, keyframe_every: int) -> dict:
    """The branching snapshots stepping would have kept after the segment's tokens, by tokens seen.

    frames: the timeline, holding the segment's frames; total: the prompt's length. The session's policy
    (sim/session.py): a snapshot every `every` tokens, whole every `keyframe_every`, the others lean; and the
    last `recent` of the prompt whole, as the ring of recent snapshots holds them (positions past the segment
    are left to the steps that record them)."""
    kda = segment.recorder.kda
    chain = getattr(segment.recorder, "chain_states", None)          # [T, L, H, K, V] float32, or None (T = 1)
    W1 = {e.layer: segment.cache.layers[e.layer].conv.shape[1] for e in kda}        # W - 1 per KDA layer
    fulls = {}
    for e in kda:   # the conv's inputs after the tail before the segment: the tail after j tokens is [j, j + W - 1)
        before = segment.conv_before.get(e.layer)
        tail = (e.conv_in.new_zeros(1, W1[e.layer], e.conv_in.shape[-1]) if before is None
                else before.to(e.conv_in.dtype))
        fulls[e.layer] = torch.cat([tail, e.conv_in], 1)                         # [1, W - 1 + T, C]

    def conv_tail(layer: int, j: int) -> torch.Tensor:
        return fulls[layer][:, j:j + W1[layer]].clone()

    out = {}
    for p in range(segment.start + 1, segment.end + 1):
        j = p - segment.start
        in_ring = p > total - recent
        if p == segment.end and (in_ring or p % every == 0):    # the caches themselves
            out[p] = {i: c.clone() for i, c in enumerate(segment.cache.layers) if isinstance(c, KDAState)}
        elif in_ring or p % keyframe_every == 0:
            out[p] = {e.layer: KDAState(chain[j - 1, row][None].to(segment.cache.layers[e.layer].state.dtype),
                                        conv_tail(e.layer, j))
                      for row, e in enumerate(kda)}
        elif p % every == 0:           # older: the conv tail only, S recomputed from frame p - 1's record
            frame = frames[p - 1]
            out[p] = {e.layer: LeanKDAState(conv_tail(e.layer, j), frame.kda_for(e.layer))
                      for e in kda}
    return out
