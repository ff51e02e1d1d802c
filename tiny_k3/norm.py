"""RMSNorm, the one normalisation every part of K3 uses."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from . import compiled, native
from .fused import constant


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight over the last dimension. x [..., D], weight [D]."""
    if weight is not None and weight.dtype != x.dtype:
        return rms_norm_reference(x, weight, eps)
    D = x.shape[-1]
    if compiled.enabled() and weight is not None and _native_trains(x, weight):   # the opt-in compiled path
        return RMSNormNative.apply(x, weight, eps)
    # One row (a decode step) on the CPU without autograd: rms_norm_row. Not in bf16/fp16, where its dot would
    # round the mean square before the root (torch's op accumulates in float32).
    if (x.numel() == D and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
            and not (torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)))):
        return rms_norm_row(x, weight, eps)
    # torch's own op: the same formula, the same bits (tests/test_decode_paths.py), one call from Python
    # instead of six
    return F.rms_norm(x, (D,), weight, eps)


def rms_norm_row(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """`rms_norm` of one row on the CPU (a decode step: x [1, 1, D]) without autograd, in two ops: the mean
    square as one dot product read back as a Python float, then x * r * weight as one addcmul with r a scalar.
    torch's rms_norm is a chain of seven dispatched ops on the CPU (~20 us a call where this takes ~8; a k3-topo
    step with its twin makes ~680 of them). r is computed in float64 and rounded once, so the result is the
    reference's to within an ulp (equal in most places; tests/test_decode_paths.py)."""
    flat = x.reshape(-1)
    r = 1.0 / math.sqrt(float(torch.dot(flat, flat)) / flat.shape[0] + eps)
    if weight is None:
        return x * r
    return torch.addcmul(constant(0.0, x), x, weight, value=r)     # 0 + (r x) w


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """`rms_norm` written out; also the path for a weight of another dtype (the product promotes)."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight


def _native_trains(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `RMSNormNative` takes this call: autograd wanted, on the CPU, and the C kernels built for x's dtype."""
    if (torch.compiler.is_compiling()                  # (inside a compiled op, inductor fuses the norm itself)
            or not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)) or x.device.type != "cpu"):
        return False
    problem = native.problem(x.dtype, "norm")
    if problem is not None:
        compiled.fall_back("RMSNorm's C kernel", problem)
    return problem is None


class RMSNormNative(torch.autograd.Function):
    """`rms_norm(x, weight, eps)` with autograd, by tiny_k3/norm_native.c: one pass over x forward and one back
    (torch's op is six passes forward and about ten back). x [..., D], weight [D]; CPU, float32 or float64."""

    @staticmethod
    def forward(ctx, x, weight, eps: float):
        D = x.shape[-1]
        x, weight = x.contiguous(), weight.contiguous()
        y, r = torch.empty_like(x), x.new_empty(x.numel() // D)
        native.library(x.dtype, "norm").rms_norm_forward(r.numel(), D, eps, *native.pointers(x, weight, y, r))
        ctx.save_for_backward(x, weight, r)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, weight, r = ctx.saved_tensors
        dy = dy.contiguous()
        dx, dw = torch.empty_like(x), torch.zeros_like(weight)
        native.library(x.dtype, "norm").rms_norm_backward(r.numel(), x.shape[-1],
                                                          *native.pointers(x, weight, r, dy, dx, dw))
        return dx, dw, None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)
