"""RMSNorm, the one normalisation every part of K3 uses."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight over the last dimension. x [..., D], weight [D]."""
    if weight is None or weight.dtype == x.dtype:
        # torch's own op: the same formula, the same bits (tests/test_fast_paths.py), one call from Python
        # instead of six (a decode step of k3-topo makes ~250 of these)
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return rms_norm_reference(x, weight, eps)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """`rms_norm` written out; also the path for a weight of another dtype (the product promotes)."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)
