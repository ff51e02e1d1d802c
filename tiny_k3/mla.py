"""Gated Multi-head Latent Attention with NoPE: K3's full-attention layer (k3_facts.md §1c).

    q          = W_qb RMSNorm(W_qa x)                       [H, nope + rope]
    [c, k_r]   = W_kva x;  c = RMSNorm(c)                   c: kv_lora_rank, k_r: rope dim (shared by heads)
    [k_n, v]   = W_kvb c                                    per head: nope and v_head_dim
    k          = [k_n, k_r]                                 NoPE: k_r is never rotated
    out        = W_o( softmax(q k^T / sqrt(nope + rope)) v  * sigmoid(W_g x) )

Only c and k_r are cached: kv_lora_rank + qk_rope_dim values per token, for all heads together.
That is why a K3 MLA layer costs 576 values per token instead of 96 * (192 + 128).

K3's predecessors differ in two switches (docs/lineage.md): K2 / DeepSeek-V3 rotate q's rope part and k_r
by position (`mla_rope`, RoPE on channel pairs, k_r cached already rotated) and have no output gate
(`mla_output_gate=False`: out = W_o(attn)); Kimi Linear is NoPE like K3 but also has no gate.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from .cache import MLACache
from .config import K3Config
from .fused import CachedWeights, FusedLinears, autograd_needed, constant
from .norm import RMSNorm
from .probe import NO_RECORDER, Recorder, detached
from .shortconv import causal_conv


def rope_angles(positions: torch.Tensor, dim: int, theta: float, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [..., dim/2] of RoPE (Su et al., arXiv:2104.09864): pair i turns by positions * theta^(-2i/dim)."""
    inv_freq = theta ** -(torch.arange(0, dim, 2, device=positions.device, dtype=torch.float64) / dim)
    angles = positions.to(torch.float64)[..., None] * inv_freq          # float64: exact for long positions
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (x[2i], x[2i+1]) by the angles: DeepSeek-V3's interleaved layout (its reference
    `inference/model.py` treats each pair as one complex number). x [..., dim]; cos, sin broadcast to [..., dim/2]."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def rope_factors(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [..., dim/2] -> (C, S) [..., dim] for `rotate_pairs`: C = (cos, cos) per pair, S = (-sin, sin)."""
    return cos.repeat_interleave(2, -1), torch.stack([-sin, sin], -1).flatten(-2)


def rotate_pairs(x: torch.Tensor, C: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """`apply_rope` in fewer ops, the same bits: x ⊙ C + swap(x) ⊙ S, with swap exchanging each pair's
    members, is (x_e cos - x_o sin, x_o cos + x_e sin) pair by pair (a + (-b) == a - b exactly)."""
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return x * C + swapped * S         # (not addcmul: its fused multiply-add rounds differently)


@functools.lru_cache(maxsize=32)
def _rope_table(past: int, T: int, dim: int, theta: float, dtype: torch.dtype, device: torch.device,
                inference: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, S) [T, dim] for positions past .. past+T-1: one per decode step, shared by every rope layer.
    (`inference` keys tensors made under inference_mode apart: autograd cannot save those.)"""
    return rope_factors(*rope_angles(past + torch.arange(T, device=device), dim, theta, dtype))


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                      mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention, the op: q [B, H, T, D], k [B, H, S, D], v [B, H, S, V] -> (probs [B, H, T, S],
    out [B, H, T, V]), probs = softmax(scale * q k^T) over the keys that `mask` (bool, broadcast to
    [B, H, T, S]; None: all) lets through. scale is 1/sqrt(D) in a layer, 1/temperature in tiny_k3.capacity.
    """
    # as batched matmuls over (B, H): at decode an einsum costs twice the ops (its permutes are separate dispatches)
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.softmax(dim=-1)
    return probs, torch.matmul(probs, v)


class GatedMLA(nn.Module):
    """Gated MLA (the module docstring's equations). x [B, T, D] (already RMS-normed) -> y [B, T, D].

    short_conv (the twin's layers that are KDA in the hybrid, K3Config.mla_conv_layers): the outputs of the
    projections that read x, [c, k_r] = W_kva x and W_q(a) x, first pass through KDA's causal depthwise short
    convolution (tiny_k3/shortconv.py), as KDA's q, k and v do, so that a key and a query can hold the tokens
    just before them. Without it the layer is K3's MLA exactly.
    """

    def __init__(self, config: K3Config, device=None, dtype=None, short_conv: bool = False):
        super().__init__()
        c = config
        self.heads, self.nope, self.rope, self.v_dim = c.mla_heads, c.qk_nope_dim, c.qk_rope_dim, c.v_head_dim
        self.kv_rank = c.kv_lora_rank
        self.scale = c.qk_head_dim ** -0.5
        self.use_rope, self.rope_theta = c.mla_rope, c.rope_theta
        kw = dict(device=device, dtype=dtype)
        q_width = c.mla_heads * c.qk_head_dim
        low_rank = c.q_lora_rank is not None  # q through a normalised low-rank bottleneck, or one projection
        self.q_proj = None if low_rank else nn.Linear(c.hidden_size, q_width, bias=False, **kw)
        self.q_a_proj = nn.Linear(c.hidden_size, c.q_lora_rank, bias=False, **kw) if low_rank else None
        self.q_norm = RMSNorm(c.q_lora_rank, c.mla_latent_eps, **kw) if low_rank else None
        self.q_b_proj = nn.Linear(c.q_lora_rank, q_width, bias=False, **kw) if low_rank else None
        self.kv_a_proj = nn.Linear(c.hidden_size, c.kv_lora_rank + c.qk_rope_dim, bias=False, **kw)
        self.kv_norm = RMSNorm(c.kv_lora_rank, c.mla_latent_eps, **kw)
        self.kv_b_proj = nn.Linear(c.kv_lora_rank, c.mla_heads * (c.qk_nope_dim + c.v_head_dim), bias=False, **kw)
        self.g_proj = (nn.Linear(c.hidden_size, c.mla_heads * c.v_head_dim, bias=False, **kw)
                       if c.mla_output_gate else None)  # K3's gate; K2 and Kimi Linear have none
        self.o_proj = nn.Linear(c.mla_heads * c.v_head_dim, c.hidden_size, bias=False, **kw)
        # Inference cache (tiny_k3/fused.py): the three projections that read x, as one matmul.
        groups = [("kv_a_proj",), ("q_proj" if self.q_proj is not None else "q_a_proj",)]
        if self.g_proj is not None:
            groups.append(("g_proj",))
        self._x_proj = FusedLinears(self, *groups)
        q_first = c.q_lora_rank if low_rank else q_width
        self.conv_split = (c.kv_lora_rank + c.qk_rope_dim, q_first)        # channels of [kv | q] the conv mixes
        channels = sum(self.conv_split)
        self.short_conv = (nn.Conv1d(channels, channels, c.kda_conv_kernel, groups=channels, bias=False, **kw)
                           if short_conv else None)
        self._absorbed = CachedWeights(self, ("kv_b_proj",), self._split_kv_b)   # for `attend_absorbed`

    def project_q(self, x: torch.Tensor, first: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, D] -> q [B, T, H, nope + rope]. first: q_proj(x) or q_a_proj(x) when already computed."""
        first = (self.q_proj or self.q_a_proj)(x) if first is None else first
        q = first if self.q_proj is not None else self.q_b_proj(self.q_norm(first))
        return q.view(*x.shape[:2], self.heads, self.nope + self.rope)

    def attend_expanded(self, q_nope, q_rope, latent, k_rope, past: int, key_mask=None, window=None):
        """Attention with the cached latents expanded into per-head keys and values (the "naive" form).

        q_nope [B,T,H,nope], q_rope [B,T,H,rope]; latent [B,S,rank]; k_rope [B,S,rope] (S = past + T).
        Returns probs [B, H, T, S] and attn [B, T, H, v_dim]. Query t sits at position past + t (causal).
        """
        B, T, H, _ = q_nope.shape
        S = latent.shape[1]
        k_nope, v = self.kv_b_proj(latent).view(B, S, H, self.nope + self.v_dim).split([self.nope, self.v_dim], dim=-1)
        k = torch.cat([k_nope, k_rope[:, :, None, :].expand(B, S, H, self.rope)], dim=-1)
        q = torch.cat([q_nope, q_rope], dim=-1)
        causal = None
        if T > 1 or key_mask is not None or window is not None:
            query_pos = (past + torch.arange(T, device=q.device))[:, None]
            keys = torch.arange(S, device=q.device)[None, :]
            causal = keys <= query_pos            # decode without a window or mask: all S keys, no mask
            if window is not None:                # a what-if window: and key > query - window
                causal = causal & (keys > query_pos - window)
            if key_mask is not None:  # padding keys are hidden; a padding query still sees itself (no empty rows)
                causal = (causal & (key_mask[:, None, :].bool() | (keys == query_pos)))[:, None]   # [B, 1, T, S]
        probs, attn = softmax_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), self.scale, causal)
        return probs, attn.transpose(1, 2)

    def attend_absorbed(self, q_nope, q_rope, latent, k_rope):
        """`attend_expanded` for one query per row and no mask (decode), without expanding the S cached latents
        into keys and values: W_kb and W_vb are absorbed into the query and the output (DeepSeek-V2, §2.1.2),
            q_n · (W_kb c_s) = (W_kb^T q_n) · c_s,        Σ_s p_s (W_vb c_s) = W_vb (Σ_s p_s c_s).
        Same shapes in and out (T = 1); the same values to float rounding (tests/test_decode_paths.py).
        """
        W_kb, W_vb_t = self._absorbed()                                   # [H, nope, rank], [H, rank, v_dim]
        q_latent = torch.bmm(q_nope[:, 0].transpose(0, 1), W_kb)          # [H, B, rank]: W_kb^T q_n, per head
        scores = torch.baddbmm(torch.bmm(q_rope[:, 0], k_rope.mT),        # [B, H, S]: q_r · k_r + q_n · k_n
                               q_latent.transpose(0, 1), latent.mT).mul_(constant(self.scale, latent))
        probs = scores.softmax(dim=-1)
        context = torch.bmm(probs, latent)                                # [B, H, rank]: Σ_s p_s c_s
        attn = torch.bmm(context.transpose(0, 1), W_vb_t).transpose(0, 1)  # [B, H, v_dim]
        return probs.unsqueeze(2), attn.unsqueeze(1)

    def _split_kv_b(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """kv_b_proj's weight [H*(nope+v), rank] -> (W_kb [H, nope, rank], W_vb^T [H, rank, v]), contiguous."""
        per_head = weight.view(self.heads, self.nope + self.v_dim, self.kv_rank)
        return per_head[:, :self.nope].contiguous(), per_head[:, self.nope:].transpose(1, 2).contiguous()

    def forward(self, x: torch.Tensor, cache: MLACache | None = None, recorder: Recorder = NO_RECORDER,
                layer: int = 0, positions: torch.Tensor | None = None,
                key_mask: torch.Tensor | None = None, hooks=None) -> tuple[torch.Tensor, MLACache]:
        """x [B, T, D] (already RMS-normed) -> (y [B, T, D], cache grown by T tokens).

        positions [B, T] long: each token's position for RoPE (default: past + t); unused without `mla_rope`.
        key_mask [B, past + T] bool: False marks padding tokens, which no query may attend to; None: all real.
        `hooks.attention_window` (tiny_k3.hooks) limits each query to the last `window` keys, itself included;
        the cache still keeps every token (a sliding window changes what is read, not what is stored).
        `hooks.mla_hidden_keys` [B, past + T] hides those keys from every query but their own.
        """
        B, T, _ = x.shape
        kv, q_first, *gate = self._x_proj(x)                    # W_kva x, W_q(a) x, and W_g x where K3's gate is
        conv_tail = None
        if self.short_conv is not None:   # the twin's short conv: each channel mixes its last W tokens
            if cache is not None and cache.conv is None:
                raise ValueError("this MLA layer has a short convolution, but its cache holds no conv tail.")
            mixed, conv_tail = causal_conv(torch.cat([kv, q_first], -1), self.short_conv.weight,
                                           None if cache is None else cache.conv)
            kv, q_first = mixed.split(self.conv_split, -1)
        latent, k_rope = kv.split([self.kv_rank, self.rope], dim=-1)
        latent = self.kv_norm(latent)
        past = 0 if cache is None else cache.length
        q_nope, q_rope = self.project_q(x, q_first).split([self.nope, self.rope], dim=-1)
        if self.use_rope:  # rotate the new tokens' shared key before it is cached, and q's rope part
            fp = torch.promote_types(x.dtype, torch.float32)
            if positions is None:   # the usual case: positions past .. past+T-1, the same table for all layers
                turn_c, turn_s = _rope_table(past, T, self.rope, self.rope_theta, fp, x.device,
                                             torch.is_inference_mode_enabled())
            else:
                turn_c, turn_s = rope_factors(*rope_angles(positions, self.rope, self.rope_theta, fp))   # [B, T, rope]
            k_rope = rotate_pairs(k_rope, turn_c, turn_s).to(x.dtype)
            q_rope = rotate_pairs(q_rope, turn_c.unsqueeze(-2), turn_s.unsqueeze(-2)).to(q_nope.dtype)
        if cache is not None:
            latent = torch.cat([cache.latent, latent], dim=1)
            k_rope = torch.cat([cache.k_rope, k_rope], dim=1)
        S = latent.shape[1]
        window = None if hooks is None else hooks.attention_window
        if hooks is not None:
            key_mask = hooks.visible_keys(key_mask, S)
        if window is not None and window >= S:   # a window over every key reads what no window reads
            window = None
        if T == 1 and key_mask is None and window is None and not autograd_needed((x, self.kv_b_proj.weight)):
            probs, attn = self.attend_absorbed(q_nope, q_rope, latent, k_rope)
        else:
            probs, attn = self.attend_expanded(q_nope, q_rope, latent, k_rope, past, key_mask, window)
        if gate:  # K3's output gate
            attn = attn * torch.sigmoid(gate[0]).view(B, T, self.heads, self.v_dim)
        y = self.o_proj(attn.reshape(B, T, self.heads * self.v_dim))
        if recorder is not NO_RECORDER:
            recorder.record("mla", layer, probs=detached(probs), cache_len=S)
        return y, MLACache(latent, k_rope, conv_tail)
