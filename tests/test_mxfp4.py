"""MXFP4 as K3's routed experts ship it (tiny_k3/mxfp4.py), against the OCP MX v1.0 definitions.

The expected values are built here from the spec's bit layouts (E2M1: 1 sign, 2 exponent bits with bias 1,
1 mantissa bit, exponent 0 subnormal; E8M0: 2^(e - 127), 0xFF NaN), not read from the module's table.
"""

import itertools
import math

import pytest
import torch

from tiny_k3.mxfp4 import GROUP, MXFP4Error, decode, encode, round_to_mxfp4, unpack_codes


def e2m1(code: int) -> float:
    """OCP MX v1.0, the FP4 (E2M1) element format: the value of a 4-bit code from its bits."""
    sign = -1.0 if code & 0b1000 else 1.0
    exponent, mantissa = (code >> 1) & 0b11, code & 0b1
    if exponent == 0:                       # subnormal: 2^(1 - bias) * (m / 2), bias 1
        return sign * 0.5 * mantissa
    return sign * 2.0 ** (exponent - 1) * (1 + mantissa / 2)


def e8m0(bits: int) -> float:
    return math.nan if bits == 0xFF else 2.0 ** (bits - 127)


def pack(codes: list[int]) -> torch.Tensor:
    """Two codes per byte, the first in the low nibble (compressed-tensors' and the checkpoint's order)."""
    return torch.tensor([[codes[i] | (codes[i + 1] << 4) for i in range(0, len(codes), 2)]], dtype=torch.uint8)


def test_the_e2m1_value_table_of_the_spec():
    assert [e2m1(c) for c in range(8)] == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert [e2m1(c) for c in range(8, 16)] == [-0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


@pytest.mark.parametrize("scale_bits", [0, 1, 100, 126, 127, 128, 140, 254])
def test_decode_gives_every_code_times_its_e8m0_scale(scale_bits):
    codes = [c for _ in range(2) for c in range(16)]                       # one group of 32: every code twice
    # exact: E2M1 x 2^k is a float32 up to 2^126 (6 x 2^127 is past float32's range: float64 there)
    dtype = torch.float64 if scale_bits > 200 else torch.float32
    got = decode(pack(codes), torch.tensor([[scale_bits]], dtype=torch.uint8), dtype=dtype)
    want = torch.tensor([[e2m1(c) * e8m0(scale_bits) for c in codes]], dtype=torch.float64)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), want, rtol=0, atol=0)


def test_low_nibble_first_and_one_scale_per_32_along_the_row():
    packed = torch.tensor([[0x71] + [0] * 15 + [0x0F] + [0] * 15], dtype=torch.uint8)   # 64 values, 2 groups
    scale = torch.tensor([[127, 129]], dtype=torch.uint8)                   # x1, x4
    w = decode(packed, scale)[0]
    assert (w[0].item(), w[1].item()) == (0.5, 6.0)                         # 0x71: low 1 -> 0.5, high 7 -> 6
    assert (w[32].item(), w[33].item()) == (-6.0 * 4, 0.0)                  # 0x0F: low 15 -> -6, x4
    assert unpack_codes(torch.tensor([0xA3], dtype=torch.uint8)).tolist() == [3, 10]


def test_e8m0_nan_and_shape_errors():
    assert torch.isnan(decode(pack([1] * 32), torch.tensor([[0xFF]], dtype=torch.uint8))).all()
    with pytest.raises(MXFP4Error, match=r"needs weight_scale \[1, 1\]"):
        decode(pack([1] * 32), torch.tensor([[127, 127]], dtype=torch.uint8))
    with pytest.raises(MXFP4Error, match="uint8"):
        decode(pack([1] * 32).int(), torch.tensor([[127]], dtype=torch.uint8))
    with pytest.raises(MXFP4Error, match="multiple of 32"):
        encode(torch.ones(2, 48))


def ocp_round(x: torch.Tensor) -> torch.Tensor:
    """OCP MX v1.0 conversion from scalar floats, element by element in Python: X = 2^(floor(log2 max|x|) - 2)
    per group of 32; each x / X to the nearest E2M1 magnitude (ties: the even code), clamped to 6; value X * that."""
    grid = [e2m1(c) for c in range(8)]
    out = torch.empty_like(x, dtype=torch.float64)
    for r, g in itertools.product(range(x.shape[0]), range(x.shape[1] // GROUP)):
        block = x[r, g * GROUP:(g + 1) * GROUP].double().tolist()
        amax = max(abs(v) for v in block)
        X = 2.0 ** (math.floor(math.log2(amax)) - 2) if amax > 0 else 2.0 ** -127
        for j, v in enumerate(block):
            a = min(abs(v) / X, 6.0)
            best = min(range(8), key=lambda c: (abs(a - grid[c]), c % 2))   # nearest, then the even code
            out[r, g * GROUP + j] = math.copysign(grid[best] * X, v) if best else 0.0
    return out


def test_encode_then_decode_is_the_ocp_rounding():
    torch.manual_seed(0)
    w = torch.randn(6, 96) * torch.tensor([1e-3, 0.02, 1.0, 30.0, 1e4, 0.5]).unsqueeze(1)
    w[5, :32] = 0.0                                                         # an all-zero group
    got = decode(*encode(w), dtype=torch.float64)
    torch.testing.assert_close(got, ocp_round(w), rtol=0, atol=0)
    assert torch.equal(round_to_mxfp4(w), got.float())
    packed, scale = encode(w)
    assert packed.shape == (6, 48) and scale.shape == (6, 3) and packed.dtype == scale.dtype == torch.uint8


def test_ties_round_to_the_even_code():
    # a group whose max is 4 (X = 1): the midpoints 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 and 7 (clamped)
    row = [4.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -2.5, 0.2] + [0.0] * 22
    got = decode(*encode(torch.tensor([row])))[0, :10].tolist()
    assert got == [4.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -2.0, 0.0]
    assert decode(*encode(torch.tensor([[7.9] + [0.0] * 31])))[0, 0].item() == 6.0   # X = 2^(2-2): 7.9 -> 6


def test_decode_agrees_with_compressed_tensors():
    """The compressed-tensors package (the format's own library) decodes the same bytes to the same values:
    both are exact products of an E2M1 value and a power of two, so equality is the right test."""
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    args = QuantizationArgs(num_bits=4, type="float", strategy="group", group_size=32, symmetric=True,
                            scale_dtype=torch.uint8)                         # the released quantization_config
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    torch.manual_seed(1)
    packed = torch.randint(0, 256, (48, 64), dtype=torch.uint8)             # every code, random scales
    scale = torch.randint(100, 150, (48, 4), dtype=torch.uint8)
    theirs = MXFP4PackedCompressor.decompress({"weight_packed": packed, "weight_scale": scale}, scheme)["weight"]
    assert torch.equal(theirs.float(), decode(packed, scale))
