"""Run the model with someone else's layer inside: a learner's KDA head, attention op or MLA decode.

    with swapped(model, kda_head=my_kda_head):        every KDA layer's heads run my_kda_head
        logits, _ = model(tokens)
    with swapped(model, attention=my_attend) as swap: every MLA layer attends with a per-head KV cache that
        logits, _ = model(tokens)                     my_attend appends to, one token at a time;
        swap.kv_caches                                the caches it built, by layer index
    with swapped(model, mla_decode=my_mla_decode):    every MLA layer reads its latent cache through
        logits, _ = model(tokens)                     my_mla_decode (W_kb absorbed into q, W_vb after the mix)

Everything the layer does around the swapped part stays the layer's own: projections, short convolution,
output norm and gate for KDA (kda.md §3); projections, latent cache and output gate for MLA (mla.md §1). On
exit, also on an error, every layer is as it was. `compare(model, tokens, ...)` runs the prompt both ways.

The learner's functions see one sequence and one head (KDA) or all heads of one query (MLA); a batch and a
prefill are looped over here, query by query, so any call of the model runs on their code. Nothing is
recorded while a layer is swapped in, and what-if hooks and padding are refused: they reach inside the
parts that were replaced.

The function signatures (shapes per call):
    kda_head(q, k, v, g_raw, beta_logit, A_log, dt_bias, lower_bound, S0) -> (o [T, V], S [K, V])
        q, k [T, K] after the short conv and SiLU, *before* the L2 norm; v [T, V]; g_raw [T, K] = f_b(f_a x) of
        this head; beta_logit [T]; A_log 0-d and dt_bias [K] of this head; lower_bound float or None;
        S0 [K, V] the state before these tokens, or None (zeros).
    attention(cache, q, k, v, scale) -> (o [H, V], cache)
        one new token: q, k [H, D], v [H, V]; cache None (no token yet) or (keys [S, H, D], values [S, H, V]);
        the returned cache holds the new token too (S + 1 tokens, else a ValueError), and o attends over all of it.
    mla_decode(q_nope, q_rope, latent, k_rope, W_kb, W_vb, scale) -> o [H, V]
        one query: q_nope [H, nope], q_rope [H, rope]; latent [S, rank], k_rope [S, rope] (the cache, this token
        included); W_kb [H, nope, rank], W_vb [H, V, rank] (kv_b_proj per head).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from .cache import KDAState
from .kda import KDALayer
from .kda_chunk import compute_dtype
from .mla import GatedMLA
from .norm import rms_norm
from .probe import NO_RECORDER

__all__ = ["Swap", "SwapComparison", "compare", "swapped"]


@dataclass
class Swap:
    """What a `swapped` block built: the learner's KV caches, by layer index (attention=...; else empty)."""

    kv_caches: dict[int, list] = field(default_factory=dict)   # layer -> one cache per batch row

    def kv_bytes(self) -> int:
        """Bytes of every tensor in the learner's KV caches (keys and values of every head, every token)."""
        return sum(t.numel() * t.element_size() for caches in self.kv_caches.values() for cache in caches
                   if cache is not None for t in cache)


def _refuse(what: str) -> ValueError:
    return ValueError(f"swapped(...): {what} reach inside the swapped layer; run the model without them "
                      "while a learner's layer is swapped in.")


def _kda_forward(layer: KDALayer, head: Callable, x: torch.Tensor, cache: KDAState | None = None,
                 recorder=NO_RECORDER, layer_index: int = 0, hooks=None) -> tuple[torch.Tensor, KDAState]:
    """KDALayer.forward with the heads computed by `head` (signature in the module docstring). x [B, T, D]."""
    if hooks is not None or recorder is not NO_RECORDER:
        raise _refuse("what-if hooks and recorders")
    B, T, _ = x.shape
    H, K, V = layer.num_heads, layer.head_k_dim, layer.head_v_dim
    fp = compute_dtype(x)
    projected, gate_low_rank, beta_logit, *out_gate = layer._in_proj(x)
    mixed, conv_tail = layer._short_conv(projected, cache)
    q, k, v = F.silu(mixed).to(fp).split([H * K, H * K, H * V], -1)          # the layer's own conv and SiLU
    q, k, v = q.view(B, T, H, K), k.view(B, T, H, K), v.view(B, T, H, V)
    g_raw = layer.f_b_proj(gate_low_rank).to(fp).view(B, T, H, K)
    beta_logit = beta_logit.to(fp)
    A_log, dt_bias = layer.A_log.to(fp), layer.dt_bias.to(fp).view(H, K)
    o = x.new_zeros(B, T, H, V, dtype=fp)
    state = x.new_zeros(B, H, K, V, dtype=fp)
    for b in range(B):
        for h in range(H):
            S0 = None if cache is None else cache.state[b, h].to(fp).clone()   # theirs to change: not the cache
            o_bh, S_bh = head(q[b, :, h], k[b, :, h], v[b, :, h], g_raw[b, :, h], beta_logit[b, :, h],
                              A_log[h], dt_bias[h], layer.lower_bound, S0)
            o[b, :, h], state[b, h] = o_bh, S_bh
    # The layer's own gated RMSNorm per head and output projection (kda.md §3).
    gate = (out_gate[0] if out_gate else layer.output_gate(x)).view(B, T, H, V).to(fp)
    o = rms_norm(o, layer.o_norm_weight.to(fp), layer.eps) * torch.sigmoid(gate)
    y = layer.o_proj(o.to(x.dtype).reshape(B, T, H * V))
    return y, KDAState(state=state, conv=conv_tail)


def _split_kv_b(layer: GatedMLA) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_b_proj's weight as (W_kb [H, nope, rank], W_vb [H, V, rank]): k_n,h = W_kb,h c and v_h = W_vb,h c."""
    per_head = layer.kv_b_proj.weight.view(layer.heads, layer.nope + layer.v_dim, layer.kv_rank)
    return per_head[:, :layer.nope], per_head[:, layer.nope:]


def _expand(layer: GatedMLA, W_kb, W_vb, latent, k_rope) -> tuple[torch.Tensor, torch.Tensor]:
    """Cached latents [S, rank] and shared keys [S, rope] -> per-head keys [S, H, nope + rope], values [S, H, V]
    (mla.md §1: k_h = [W_kb,h c, k_r], v_h = W_vb,h c)."""
    S, H = latent.shape[0], layer.heads
    keys = torch.cat([torch.einsum("hnr,sr->shn", W_kb, latent), k_rope[:, None].expand(S, H, layer.rope)], -1)
    return keys, torch.einsum("hvr,sr->shv", W_vb, latent)


def _mla_attend(layer: GatedMLA, index: int, swap: Swap, attention: Callable | None, mla_decode: Callable | None,
                q_nope, q_rope, latent, k_rope, past: int | None = None, key_mask=None, window=None):
    """GatedMLA.attend_expanded / attend_absorbed, query by query, through the learner's function.

    q_nope [B,T,H,nope], q_rope [B,T,H,rope]; latent [B,S,rank], k_rope [B,S,rope] -> (None, attn [B,T,H,V]).
    Query t sits at position past + t and sees the keys 0 … past + t (causal)."""
    if key_mask is not None or window is not None:
        raise _refuse("padding and attention windows")
    B, T = q_nope.shape[:2]
    past = latent.shape[1] - T if past is None else past
    W_kb, W_vb = _split_kv_b(layer)
    caches = swap.kv_caches.setdefault(index, [None] * B)
    attn = q_nope.new_zeros(B, T, layer.heads, layer.v_dim)
    for b in range(B):
        for t in range(T):
            pos = past + t
            if mla_decode is not None:
                attn[b, t] = mla_decode(q_nope[b, t], q_rope[b, t], latent[b, :pos + 1], k_rope[b, :pos + 1],
                                        W_kb, W_vb, layer.scale)
                continue
            # A per-head KV cache, the one MLA does without: keys [S, H, nope + rope], values [S, H, V].
            cache = caches[b]
            # Only a new call of the model may start from another length: a new sequence, or a branch from an
            # earlier position; the prefix is expanded again from the model's latents. Within a call the cache is
            # the learner's, checked below, so a function that does not append is an error, not silently repaired.
            if t == 0 and (cache is None or cache[0].shape[0] != pos):
                cache = None if pos == 0 else _expand(layer, W_kb, W_vb, latent[b, :pos], k_rope[b, :pos])
            keys, values = _expand(layer, W_kb, W_vb, latent[b, pos:pos + 1], k_rope[b, pos:pos + 1])
            q = torch.cat([q_nope[b, t], q_rope[b, t]], -1)
            attn[b, t], caches[b] = attention(cache, q, keys[0], values[0], layer.scale)
            _check_grown(caches[b], pos + 1)
    return None, attn


def _cache_lengths(cache) -> tuple[int, int] | None:
    """(tokens in keys, tokens in values) of a (keys, values) pair of tensors; None for anything else."""
    if not (isinstance(cache, (tuple, list)) and len(cache) == 2):
        return None
    if not all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in cache):
        return None
    return int(cache[0].shape[0]), int(cache[1].shape[0])


def _check_grown(cache, expected: int) -> None:
    """Refuse a returned KV cache that does not hold exactly `expected` tokens in both keys and values."""
    lengths = _cache_lengths(cache)
    if lengths == (expected, expected):
        return
    got = (f"keys of {lengths[0]} and values of {lengths[1]} tokens" if lengths
           else "None" if cache is None else f"a {type(cache).__name__}, not a (keys, values) pair of tensors")
    raise ValueError(f"swapped(attention=...): your function returned a KV cache of {got}; after this token it "
                     f"must hold {expected} (the {expected - 1} given, the new key and value appended last).")


def _checked_mla_forward(module: GatedMLA, x, cache=None, recorder=NO_RECORDER, layer: int = 0,
                         positions=None, key_mask=None, hooks=None):
    """GatedMLA.forward, refusing what the swapped attention cannot honour (nothing is recorded)."""
    if recorder is not NO_RECORDER or (hooks is not None and (hooks.attention_window is not None
                                                        or hooks.mla_hidden_keys is not None)):
        raise _refuse("what-if windows and recorders")
    return GatedMLA.forward(module, x, cache, NO_RECORDER, layer, positions, key_mask, hooks)


@contextlib.contextmanager
def swapped(model, *, kda_head: Callable | None = None, attention: Callable | None = None,
            mla_decode: Callable | None = None):
    """Route `model`'s KDA heads / MLA attention through the given functions inside the block (see the module
    docstring); yields a `Swap`. Every layer is restored on exit, also when the block raises."""
    if attention is not None and mla_decode is not None:
        raise ValueError("swapped(...): give attention= or mla_decode=, not both: both replace the MLA read.")
    if kda_head is None and attention is None and mla_decode is None:
        raise ValueError("swapped(...): name what to swap in: kda_head=, attention= or mla_decode=.")
    swap = Swap()
    patched: list[tuple[torch.nn.Module, str, object]] = []     # (layer, attribute, what its __dict__ held)

    def patch(module, name, fn):
        patched.append((module, name, module.__dict__.get(name, _ABSENT)))
        object.__setattr__(module, name, fn)

    layers = [block.attn for block in model.blocks]
    try:
        for i, mixer in enumerate(layers):
            if isinstance(mixer, KDALayer) and kda_head is not None:
                patch(mixer, "forward", lambda x, cache=None, recorder=NO_RECORDER, layer=0, hooks=None, _m=mixer:
                      _kda_forward(_m, kda_head, x, cache, recorder, layer, hooks))
            elif isinstance(mixer, GatedMLA) and (attention is not None or mla_decode is not None):
                def attend(*args, _m=mixer, _i=i, **kwargs):
                    return _mla_attend(_m, _i, swap, attention, mla_decode, *args, **kwargs)
                patch(mixer, "attend_expanded", attend)
                patch(mixer, "attend_absorbed", attend)
                patch(mixer, "forward", lambda *a, _m=mixer, **kw: _checked_mla_forward(_m, *a, **kw))
        yield swap
    finally:
        for module, name, before in reversed(patched):
            if before is _ABSENT:
                del module.__dict__[name]
            else:
                object.__setattr__(module, name, before)


_ABSENT = object()


@dataclass(frozen=True)
class SwapComparison:
    """The model's own logits against the swapped run's, on the same tokens."""

    own: torch.Tensor           # [B, T, vocab]
    yours: torch.Tensor         # [B, T, vocab]
    own_kv_bytes: int           # the model's own growing caches after the prompt (MLA: latent c and k_rope)
    your_kv_bytes: int          # the learner's KV caches after the prompt (attention=...; else 0)

    @property
    def max_abs_diff(self) -> float:
        return float((self.own - self.yours).abs().max())

    def next_tokens(self) -> tuple[int, int]:
        """The greedy next token after the last position: (the model's, the swapped run's)."""
        return int(self.own[0, -1].argmax()), int(self.yours[0, -1].argmax())


def compare(model, tokens: torch.Tensor, **swaps) -> SwapComparison:
    """logits of `model(tokens)` as it is and with `swapped(model, **swaps)`, without autograd. tokens [B, T]."""
    with torch.no_grad():
        own, cache = model(tokens)
        with swapped(model, **swaps) as swap:
            yours, _ = model(tokens)
    return SwapComparison(own, yours, cache.kv_bytes(), swap.kv_bytes())
