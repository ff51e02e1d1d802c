"""The causal depthwise short convolution that K3 puts in front of every KDA layer (kda.md §3), as one op.

Each channel c of x [B, T, C] becomes a weighted sum of its own last W values (W = kda_conv_kernel = 4):

    y_t[c] = sum_{w=0}^{W-1} weight[c, 0, w] * x_{t-W+1+w}[c]          (weight[c, 0, W-1] multiplies x_t)

so a channel can carry what an earlier token projected into it: the "local mixing" that lets `q=8;` bind the
key `q` (two bytes back) to its value. KDA convolves q, k and v this way; the all-softmax twin keeps the same
convolution in front of its attention (tiny_k3/mla.py, `K3Config.twin`), so hybrid and twin differ only in how
they remember.

Decode keeps the last W-1 inputs, the "tail": a constant number of bytes (sim/memory.py counts them), and any
split of a sequence into calls gives the same outputs as one pass (zeros before the first token).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv_reference(x: torch.Tensor, weight: torch.Tensor, tail: torch.Tensor | None = None) -> torch.Tensor:
    """The definition, token by token: x [B, T, C], weight [C, 1, W], tail [B, W-1, C] or None (zeros) -> [B, T, C]."""
    W = weight.shape[-1]
    past = x.new_zeros(x.shape[0], W - 1, x.shape[2]) if tail is None else tail.to(x.dtype)
    full = torch.cat([past, x], 1)
    taps = weight[:, 0].to(x.dtype)                                       # [C, W]
    return torch.stack([(full[:, t:t + W] * taps.T).sum(1) for t in range(x.shape[1])], 1)


def causal_conv(x: torch.Tensor, weight: torch.Tensor, tail: torch.Tensor | None = None,
                taps: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, T, C] -> (y [B, T, C], the new tail [B, W-1, C]): `causal_conv_reference`, fast.

    weight [C, 1, W] (nn.Conv1d's depthwise layout); tail: the last W-1 inputs of earlier calls (None: zeros).
    taps [W, C] = weight[:, 0].T when the caller caches it (decode's weighted sum, cheaper than conv1d's set-up).
    """
    B, T, C = x.shape
    W = weight.shape[-1]
    past = x.new_zeros(B, W - 1, C) if tail is None else (tail if tail.dtype == x.dtype else tail.to(x.dtype))
    full = torch.cat([past, x], 1)                                           # [B, W-1+T, C]
    if T == 1:   # decode: one output per channel
        out = (full * (weight[:, 0].T if taps is None else taps)).sum(1, keepdim=True)
    else:
        out = F.conv1d(full.transpose(1, 2), weight, groups=C).transpose(1, 2)   # no padding: exactly T outputs
    return out, full[:, full.shape[1] - (W - 1):].clone()   # clone: don't pin all of `full`


__all__ = ["causal_conv", "causal_conv_reference"]
