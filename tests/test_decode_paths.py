"""Decode fast paths of the layers (norm, depth reads, MLA, KDA): each against its written-out reference."""

import pytest
import torch

from tiny_k3.norm import rms_norm, rms_norm_reference

F64 = torch.float64


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_is_the_written_out_formula_bit_for_bit(dtype, with_weight):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 64, generator=gen, dtype=dtype) * 3
    weight = (1 + torch.randn(64, generator=gen, dtype=dtype)) if with_weight else None
    assert torch.equal(rms_norm(x, weight, 1e-6), rms_norm_reference(x, weight, 1e-6))
    # and the formula itself: unit root-mean-square before the gain
    y = rms_norm(x, None, 0.0)
    torch.testing.assert_close(y.pow(2).mean(-1), torch.ones(3, 5, dtype=dtype))


def test_rms_norm_with_a_weight_of_another_dtype_promotes():
    x, weight = torch.randn(2, 8), torch.ones(8, dtype=F64) * 2
    y = rms_norm(x, weight)
    assert y.dtype == F64
    torch.testing.assert_close(y, rms_norm_reference(x.double(), None) * 2)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_rotate_pairs_is_apply_rope_bit_for_bit(dtype):
    from tiny_k3.mla import _rope_table, apply_rope, rope_angles, rope_factors, rotate_pairs
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 3, 8, generator=gen, dtype=dtype)
    positions = torch.tensor([[0, 1, 7, 300, 4095], [2, 3, 4, 5, 6]])
    cos, sin = rope_angles(positions, 8, 10000.0, dtype)
    reference = apply_rope(x, cos[:, :, None], sin[:, :, None])
    C, S = rope_factors(cos, sin)
    assert torch.equal(rotate_pairs(x, C[:, :, None], S[:, :, None]), reference)
    assert not torch.equal(reference, x)                                  # it does turn
    # the cached table for positions past .. past+T-1 is the same as computing them
    C_tab, S_tab = _rope_table(300, 5, 8, 10000.0, dtype, x.device, False)
    C_ref, S_ref = rope_factors(*rope_angles(torch.arange(300, 305), 8, 10000.0, dtype))
    assert torch.equal(C_tab, C_ref) and torch.equal(S_tab, S_ref)
