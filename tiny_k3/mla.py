"""Gated Multi-head Latent Attention with NoPE: K3's full-attention layer (k3_facts.md §1c).

    q          = W_qb RMSNorm(W_qa x)                       [H, nope + rope]
    [c, k_r]   = W_kva x;  c = RMSNorm(c)                   c: kv_lora_rank, k_r: rope dim (shared by heads)
    [k_n, v]   = W_kvb c                                    per head: nope and v_head_dim
    k          = [k_n, k_r]                                 NoPE: k_r is never rotated
    out        = W_o( softmax(q k^T / sqrt(nope + rope)) v  * sigmoid(W_g x) )

Only c and k_r are cached: kv_lora_rank + qk_rope_dim values per token, for all heads together.
That is why a K3 MLA layer costs 576 values per token instead of 96 * (192 + 128).
"""

from __future__ import annotations

import torch
from torch import nn

from .cache import MLACache
from .config import K3Config
from .fused import FusedLinears
from .norm import RMSNorm
from .probe import NO_RECORDER, Recorder


class GatedMLA(nn.Module):
    def __init__(self, config: K3Config, device=None, dtype=None):
        super().__init__()
        c = config
        self.heads, self.nope, self.rope, self.v_dim = c.mla_heads, c.qk_nope_dim, c.qk_rope_dim, c.v_head_dim
        self.kv_rank = c.kv_lora_rank
        self.scale = c.qk_head_dim ** -0.5
        kw = dict(device=device, dtype=dtype)
        q_width = c.mla_heads * c.qk_head_dim
        low_rank = c.q_lora_rank is not None  # q through a normalised low-rank bottleneck, or one projection
        self.q_proj = None if low_rank else nn.Linear(c.hidden_size, q_width, bias=False, **kw)
        self.q_a_proj = nn.Linear(c.hidden_size, c.q_lora_rank, bias=False, **kw) if low_rank else None
        self.q_norm = RMSNorm(c.q_lora_rank, c.rms_norm_eps, **kw) if low_rank else None
        self.q_b_proj = nn.Linear(c.q_lora_rank, q_width, bias=False, **kw) if low_rank else None
        self.kv_a_proj = nn.Linear(c.hidden_size, c.kv_lora_rank + c.qk_rope_dim, bias=False, **kw)
        self.kv_norm = RMSNorm(c.kv_lora_rank, c.rms_norm_eps, **kw)
        self.kv_b_proj = nn.Linear(c.kv_lora_rank, c.mla_heads * (c.qk_nope_dim + c.v_head_dim), bias=False, **kw)
        self.g_proj = nn.Linear(c.hidden_size, c.mla_heads * c.v_head_dim, bias=False, **kw)
        self.o_proj = nn.Linear(c.mla_heads * c.v_head_dim, c.hidden_size, bias=False, **kw)
        # Inference cache (tiny_k3/fused.py): the three projections that read x, as one matmul.
        self._x_proj = FusedLinears(self, ("kv_a_proj",), ("q_proj" if self.q_proj is not None else "q_a_proj",),
                                    ("g_proj",))

    def project_q(self, x: torch.Tensor, first: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, D] -> q [B, T, H, nope + rope]. first: q_proj(x) or q_a_proj(x) when already computed."""
        first = (self.q_proj or self.q_a_proj)(x) if first is None else first
        q = first if self.q_proj is not None else self.q_b_proj(self.q_norm(first))
        return q.view(*x.shape[:2], self.heads, self.nope + self.rope)

    def forward(self, x: torch.Tensor, cache: MLACache | None = None, recorder: Recorder = NO_RECORDER,
                layer: int = 0, hooks=None) -> tuple[torch.Tensor, MLACache]:
        """x [B, T, D] (already RMS-normed) -> (y [B, T, D], cache grown by T tokens).

        `hooks.attention_window` (tiny_k3.hooks) limits each query to the last `window` keys, itself included;
        the cache still keeps every token (a sliding window changes what is read, not what is stored)."""
        B, T, _ = x.shape
        kv, q_first, gate = self._x_proj(x)                     # W_kva x, W_q(a) x, W_g x
        latent, k_rope = kv.split([self.kv_rank, self.rope], dim=-1)
        latent = self.kv_norm(latent)
        past = 0 if cache is None else cache.length
        if cache is not None:
            latent = torch.cat([cache.latent, latent], dim=1)
            k_rope = torch.cat([cache.k_rope, k_rope], dim=1)
        S = latent.shape[1]

        # Expand the cached latent into per-head keys and values (the "naive", non-absorbed form).
        k_nope, v = self.kv_b_proj(latent).view(B, S, self.heads, self.nope + self.v_dim).split(
            [self.nope, self.v_dim], dim=-1)
        k = torch.cat([k_nope, k_rope[:, :, None, :].expand(B, S, self.heads, self.rope)], dim=-1)
        q = self.project_q(x, q_first)

        scores = torch.einsum("bthd,bshd->bhts", q, k) * self.scale
        window = None if hooks is None else hooks.attention_window
        if T > 1 or window is not None:  # query t sits at absolute position past + t and sees keys 0 .. past + t
            query_pos = (past + torch.arange(T, device=x.device))[:, None]
            keys = torch.arange(S, device=x.device)[None, :]
            causal = keys <= query_pos            # decode without a window: all S keys, no mask
            if window is not None:                # a what-if window: and key > query - window
                causal = causal & (keys > query_pos - window)
            scores = scores.masked_fill(~causal, float("-inf"))
        probs = scores.softmax(dim=-1)
        attn = torch.einsum("bhts,bshd->bthd", probs, v)
        gate = torch.sigmoid(gate).view(B, T, self.heads, self.v_dim)
        y = self.o_proj((attn * gate).reshape(B, T, self.heads * self.v_dim))
        recorder.record("mla", layer, probs=probs.detach(), cache_len=S)
        return y, MLACache(latent, k_rope)
