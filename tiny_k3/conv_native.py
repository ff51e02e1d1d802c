"""KDA's short conv, SiLU and q/k norms by the C kernels of tiny_k3/conv_native.c, as one autograd Function.

`conv_heads_native` computes what `kda.conv_heads` computes (the training path's conv from no tail, then
`heads_after_conv`): y = norm(silu(conv(x))) on the q and k heads, silu(conv(x)) on v, forward and backward in C.
Part of the opt-in compiled path (tiny_k3/compiled.py): KDA's training path takes it while TINY_K3_COMPILE is on,
on the CPU, in float32 or float64, where the widths are whole runs of 8 (the C's vectors). Equal to `conv_heads` to
float rounding, outputs and gradients (tests/test_native.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import native
from .native import pointers


class ConvHeads(torch.autograd.Function):
    """(x [B, T, C], taps [W, C]; widths) -> the C outputs' parts along the channels (q, k, v: views of one buffer):
    the conv, SiLU and the norm of the first `heads` heads of K channels (q and k), per tiny_k3/conv_native.c.

    The parts are outputs of their own, so their gradients come back apart and are joined once here (slicing one
    output instead would give each slice's backward a zero-filled copy of the whole)."""

    @staticmethod
    def forward(ctx, x, taps, heads: int, K: int, widths: tuple[int, ...]):
        B, T, C = x.shape
        x, taps = x.contiguous(), taps.contiguous()
        m, y, r = torch.empty_like(x), torch.empty_like(x), x.new_empty(B, T, heads)
        native.library(x.dtype, "conv").kda_conv_forward(B, T, C, taps.shape[0], heads, K,
                                                         *pointers(x, taps, m, y, r))
        ctx.save_for_backward(x, taps, m, y, r)
        ctx.heads, ctx.K = heads, K
        return y.split(widths, -1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *dparts):
        x, taps, m, y, r = ctx.saved_tensors
        B, T, C = x.shape
        dy = torch.cat(dparts, -1).contiguous()
        dm, dx, dtaps = torch.empty_like(x), torch.empty_like(x), torch.zeros_like(taps)
        native.library(x.dtype, "conv").kda_conv_backward(B, T, C, taps.shape[0], ctx.heads, ctx.K,
                                                          *pointers(x, taps, m, y, r, dy, dm, dx, dtaps))
        return dx, dtaps, None, None, None


def conv_heads_native(projected: torch.Tensor, weight: torch.Tensor, H: int, K: int, V: int):
    """`kda.conv_heads(projected, weight, H, K, V, projected.dtype)` in C: projected [B, T, C], weight [C, 1, W] ->
    (q, k [B, T, H, K], v [B, T, H, V], the conv tail [B, W-1, C])."""
    B, T, C = projected.shape
    W = weight.shape[-1]
    q, k, v = ConvHeads.apply(projected, weight[:, 0].T, 2 * H, K, (H * K, H * K, H * V))
    tail = F.pad(projected[:, max(T - (W - 1), 0):], (0, 0, max(W - 1 - T, 0), 0))   # the last W-1 inputs
    return q.view(B, T, H, K), k.view(B, T, H, K), v.view(B, T, H, V), tail


def available(projected: torch.Tensor, weight: torch.Tensor, H: int, K: int, fp: torch.dtype) -> str | None:
    """Why `conv_heads_native` cannot take this call (a GPU, a dtype, widths that are not runs of 8, no C compiler),
    or None: it can."""
    if projected.device.type != "cpu":
        return "the C kernels run on the CPU"
    if projected.dtype != fp or weight.dtype != fp:
        return f"the C conv computes in the inputs' dtype ({projected.dtype}), not {fp}"
    if K % 8 or projected.shape[-1] % 8:
        return f"the C conv takes widths in runs of 8, not K = {K}, C = {projected.shape[-1]}"
    return native.problem(projected.dtype, "conv")
