"""MXFP4 as K3's routed experts ship it: compressed-tensors' `mxfp4-pack-quantized` format.

OCP Microscaling Formats (MX) Specification v1.0 (Open Compute Project, 2023; docs/released.md §4):
a block of 32 elements shares one scale X (E8M0: an 8-bit exponent, X = 2^(e - 127); 0xFF is NaN) and each
element is an E2M1 number P (1 sign, 2 exponent, 1 mantissa bit, bias 1); the value is X * P. E2M1's 16 codes
(the spec's FP4 element table; bit 3 is the sign):

    code  0    1    2    3    4    5    6    7        8..15: the same, negative (8 is -0)
    P     0   0.5   1   1.5   2    3    4    6

As released (config.json quantization_config: group_size 32, num_bits 4, type float, scale_dtype uint8):
`weight_packed` [out, in/2] uint8 holds two codes per byte, element 2j in the low nibble and 2j+1 in the high
one; `weight_scale` [out, in/32] uint8 holds the E8M0 exponents of consecutive groups of 32 along `in`.

`decode` is what a checkpoint reader needs. `encode` exists to write test checkpoints: the spec's conversion
from scalar floats to MX: shared exponent = floor(log2(max|x|)) - 2 (E2M1's largest exponent), then each x / X
rounded to the nearest E2M1 value, ties to the even code, magnitudes above 6 clamped to 6.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

GROUP = 32                 # elements per shared scale
E8M0_BIAS = 127
E8M0_NAN = 0xFF
E2M1_EMAX = 2              # exponent of E2M1's largest normal value, 6 = 1.5 * 2^2
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


class MXFP4Error(ValueError):
    """Packed codes and scales that do not fit together; the message says which shapes were expected."""


def _table(dtype: torch.dtype, device) -> torch.Tensor:
    return torch.tensor(E2M1_VALUES, dtype=dtype, device=device)


@functools.lru_cache(maxsize=8)
def _pair_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[256, 2]: the two E2M1 values of each byte, low nibble first."""
    with torch.inference_mode(False):
        byte = torch.arange(256, device=device)
        return _table(dtype, device)[torch.stack([byte & 0x0F, byte >> 4], dim=-1)]


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """[..., n/2] uint8 -> [..., n] codes 0..15 (long): low nibble first."""
    if packed.dtype != torch.uint8:
        raise MXFP4Error(f"weight_packed must be uint8, got {packed.dtype}.")
    low, high = (packed & 0x0F).long(), (packed >> 4).long()
    return torch.stack([low, high], dim=-1).flatten(-2)


def decode(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """weight_packed [out, in/2] uint8 and weight_scale [out, in/32] uint8 -> the weight [out, in] in dtype.

    Exact in float32 and wider (every E2M1 value times a power of two is a float32 for exponents in float32's
    range); E8M0 0xFF decodes to NaN, as the spec says."""
    if packed.dtype != torch.uint8 or scale.dtype != torch.uint8:
        raise MXFP4Error(f"weight_packed and weight_scale must be uint8 (E2M1 pairs, E8M0), got {packed.dtype} "
                         f"and {scale.dtype}.")
    rows, half = packed.shape[-2:]
    n = 2 * half
    if tuple(scale.shape[-2:]) != (rows, n // GROUP) or n % GROUP:
        raise MXFP4Error(f"weight_packed {list(packed.shape)} holds [{rows}, {n}] values, which needs "
                         f"weight_scale [{rows}, {n // GROUP}] (one per {GROUP}); got {list(scale.shape)}.")
    work = torch.float64 if dtype == torch.float64 else torch.float32
    # one lookup per byte (its two values side by side): an embedding gather, about twice as fast as a lookup
    # per nibble on the CPU
    values = F.embedding(packed.long(), _pair_table(work, packed.device))              # [..., out, in/2, 2]
    factor = torch.exp2((scale.to(torch.int32) - E8M0_BIAS).to(work))
    factor = torch.where(scale == E8M0_NAN, torch.full_like(factor, float("nan")), factor)
    out = values.view(*packed.shape[:-1], n // GROUP, GROUP).mul_(factor.unsqueeze(-1))
    return out.flatten(-2).to(dtype)


def encode(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] (in a multiple of 32) -> (weight_packed [out, in/2] uint8, weight_scale [out, in/32]
    uint8), the OCP v1.0 conversion (module docstring). For test checkpoints only; decode(*encode(w)) is w
    rounded to MXFP4."""
    if weight.dim() < 2 or weight.shape[-1] % GROUP:
        raise MXFP4Error(f"encode needs [..., in] with in a multiple of {GROUP}, got {list(weight.shape)}.")
    w = weight.detach().to(torch.float64)
    groups = w.unflatten(-1, (w.shape[-1] // GROUP, GROUP))
    amax = groups.abs().amax(-1)
    # shared exponent floor(log2 amax) - emax; an all-zero group takes the smallest scale (any scale decodes 0)
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    exponent = torch.where(amax > 0, torch.floor(torch.log2(safe)) - E2M1_EMAX, torch.full_like(amax, -E8M0_BIAS))
    exponent = exponent.clamp(-E8M0_BIAS, E8M0_BIAS)
    scaled = groups / torch.exp2(exponent).unsqueeze(-1)
    magnitudes = _table(torch.float64, w.device)[:8]                               # 0 .. 6, codes 0..7
    distance = (scaled.abs().clamp(max=6.0).unsqueeze(-1) - magnitudes).abs()      # [..., 8]
    # nearest magnitude; on a tie the even code (its mantissa bit 0), as round-to-nearest-even does
    best = distance.min(-1, keepdim=True).values
    tied = distance == best
    even = tied & (torch.arange(8, device=w.device) % 2 == 0)
    code = torch.where(even.any(-1), even.float().argmax(-1), tied.float().argmax(-1))
    code = code + 8 * (scaled < 0).long() * (code > 0).long()                      # sign bit (no -0)
    codes = code.flatten(-2)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    return packed, (exponent + E8M0_BIAS).to(torch.uint8)


def round_to_mxfp4(weight: torch.Tensor) -> torch.Tensor:
    """weight rounded to MXFP4, in its own dtype: decode(*encode(weight))."""
    return decode(*encode(weight), dtype=weight.dtype)
