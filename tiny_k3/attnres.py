"""Attention Residuals: softmax attention over depth instead of a fixed residual sum.

Kimi Team, "Attention Residuals", arXiv:2603.15031 (docs/attnres.md). Every attention and
every MLP sublayer l gets its own learned pseudo-query w_l in R^D and its own key RMSNorm:

    alpha_{i->l} = softmax_i( w_l . RMSNorm(v_i) )        # over depth; no 1/sqrt(D)   (Eqs. 1-4)
    h_l          = sum_i alpha_{i->l} v_i                  # raw values, embedding first

Block AttnRes (Eqs. 5-6) attends over block sums b_0 = embedding, b_1..b_{n-1} (completed blocks)
and the current block's partial sum; `block_size=1` is Full AttnRes. With w_l = 0 the weights are
uniform and h_l is the *mean* of the sources, which every PreNorm consumer sees as the standard
residual sum (attnres.md §3): the network starts as a plain residual network.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from . import compiled
from .fused import CachedWeights, autograd_needed, constant
from .norm import rms_norm


def depth_attention(sources: torch.Tensor, query: torch.Tensor, norm_weight: torch.Tensor | None = None,
                    eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """One depth-attention read (attnres.md §2).

    sources [N, B, T, D] (embedding first), query [D], norm_weight [D] (the key RMSNorm gain).
    Returns h [B, T, D] = the weighted sum of the raw sources, and weights [B, T, N] summing to 1.
    Logits and softmax in float32, or float64 for float64 sources (as `kda_*` and the router).
    """
    if sources.dim() != 4:
        raise ValueError(f"sources must be [N, B, T, D], got shape {tuple(sources.shape)}.")
    if query.shape != (sources.shape[-1],):
        raise ValueError(f"query must be [D] = [{sources.shape[-1]}], got shape {tuple(query.shape)}.")
    keys = rms_norm(sources, norm_weight, eps)                       # only the keys are normalised
    dtype = torch.promote_types(sources.dtype, torch.float32)         # fp32 logits (float64 for float64 input)
    logits = torch.einsum("nbtd,d->nbt", keys.to(dtype), query.to(dtype))
    weights = logits.softmax(dim=0)                                   # softmax over depth
    h = torch.einsum("nbt,nbtd->btd", weights.to(sources.dtype), sources)
    return h, weights.permute(1, 2, 0).to(sources.dtype)


def depth_attention_of(query: torch.Tensor, norm_weight: torch.Tensor | None, eps: float,
                       *sources: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`depth_attention(torch.stack(sources), query, norm_weight, eps)`, the sources [B, T, D] passed apart: the
    form the compiled path compiles (its kernels read each source where it lies, no stacked copy is made)."""
    return depth_attention(torch.stack(sources), query, norm_weight, eps)


# A depth read with autograd: stack, RMSNorm, logits, softmax, weighted sum and their backward as a few fused
# kernels where TINY_K3_COMPILE asks (tiny_k3/compiled.py); one compile per number of sources (1..5 in `small`).
_DEPTH_READ = compiled.op("depth_attention", depth_attention_of)


class DepthAttention(nn.Module):
    """The pseudo-query w_l and key norm of one sublayer; zero-initialised (attnres.md §3)."""

    def __init__(self, dim: int, eps: float = 1e-6, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.query = nn.Parameter(torch.zeros(dim, device=device, dtype=dtype))
        self.key_norm = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        # w ⊙ g, for `_depth_read`
        self._query_gain = CachedWeights(self, ("query", "key_norm"), torch.mul, attr=None)

    def forward(self, sources: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """sources: list of N tensors [B, T, D] -> (h [B, T, D], weights [B, T, N])."""
        if compiled.enabled() and autograd_needed([*sources, self.query, self.key_norm]):
            return _DEPTH_READ(self.query, self.key_norm, self.eps, *sources)
        stacked = torch.stack(sources)
        if torch.is_grad_enabled() or stacked.dtype not in (torch.float32, torch.float64):
            return depth_attention(stacked, self.query, self.key_norm, self.eps)
        query_gain = self._query_gain()
        if query_gain.dtype != stacked.dtype:
            query_gain = query_gain.to(stacked.dtype)
        return _depth_read(stacked, query_gain, self.eps)


def _depth_read(sources: torch.Tensor, query_gain: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`depth_attention` for float32/64 sources [N, B, T, D] without autograd, in fewer ops (a decode step
    reads 17 times in `small`, 187 in k3-topo): RMSNorm(v_i) . w = rsqrt(mean(v_i^2) + eps) (v_i . (g ⊙ w)),
    so the normalised keys are never formed. query_gain [D] = w ⊙ g (cached by the module)."""
    N, B, T, D = sources.shape
    if B * T == 1:  # decode: matrix-vector products over the N sources (mean(v^2) as one too: a third of .mean's cost)
        flat = sources.view(N, D)
        mean_square = torch.mv(flat * flat, _mean_weights(D, flat.dtype, flat.device))                # [N]
        logits = torch.mv(flat, query_gain).mul_(mean_square.add_(constant(eps, flat)).rsqrt_())
        weights = logits.softmax(dim=0)
        return torch.mv(flat.T, weights).view(B, T, D), weights.view(B, T, N)
    logits = (sources @ query_gain).mul_(torch.rsqrt(sources.pow(2).mean(-1).add_(eps)))          # [N, B, T]
    weights = logits.softmax(dim=0)
    return torch.einsum("nbt,nbtd->btd", weights, sources), weights.permute(1, 2, 0)


@functools.lru_cache(maxsize=16)
def _mean_weights(D: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[D] filled with 1/D: a mean over the last dimension as a matrix-vector product."""
    with torch.inference_mode(False):
        return torch.full((D,), 1.0 / D, dtype=dtype, device=device)


class DepthStream:
    """The residual stream of one forward pass, as a list of depth sources.

    mode "standard": one running sum x (h_l = x, the plain PreNorm residual).
    mode "block"/"full": completed block sums [b_0 = embedding, b_1, ...] plus the current block's
    partial sum of sublayer outputs; a block closes after `block_size` sublayers (1 = Full AttnRes).
    """

    def __init__(self, embedding: torch.Tensor, mode: str, block_size: int):
        self.mode = mode
        self.block_size = 1 if mode == "full" else block_size
        self.blocks = [embedding]
        self.partial: torch.Tensor | None = None
        self.in_block = 0

    @staticmethod
    def source_of(sublayer: int, mode: str, block_size: int) -> int:
        """Index, among the sources a later read sees, of the source that sublayer (0-based, execution
        order) was added to: its block sum b_{1 + sublayer // block_size} (or the partial sum while that
        block is open, which sits at the same index); 0 for "standard", whose one source is the sum."""
        if mode == "standard":
            return 0
        return 1 + sublayer // (1 if mode == "full" else block_size)

    def sources(self) -> list[torch.Tensor]:
        return self.blocks + ([self.partial] if self.partial is not None else [])

    def source_names(self) -> list[str]:
        """Names of `sources()`, as front ends label them: "emb", the block sums "b1", "b2", ..., "partial"."""
        return ["emb"] + [f"b{i}" for i in range(1, len(self.blocks))] + (["partial"] if self.partial is not None else [])

    def read(self, depth: DepthAttention | None, uniform: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The input h_l of the next sublayer and its depth weights [B, T, N] (None for standard).

        uniform: read with w_l = 0 instead of the learned query, so the weights are exactly 1/N (§3's
        standard-residual picture); a what-if hook (tiny_k3.hooks), not used in training."""
        if self.mode == "standard":
            return self.blocks[0], None
        if uniform:
            zero = torch.zeros_like(depth.query)
            return depth_attention(torch.stack(self.sources()), zero, depth.key_norm, depth.eps)
        return depth(self.sources())

    def add(self, out: torch.Tensor) -> None:
        """Add a sublayer output v_l [B, T, D] to the stream."""
        if self.mode == "standard":
            self.blocks[0] = self.blocks[0] + out
            return
        self.partial = out if self.partial is None else self.partial + out
        self.in_block += 1
        if self.in_block == self.block_size:
            self.blocks.append(self.partial)
            self.partial, self.in_block = None, 0
