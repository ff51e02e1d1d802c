"""The retrieval cliff (tiny_k3.capacity): the textbook capacity results, computed in float64."""

from __future__ import annotations

import math

import pytest
import torch

from tiny_k3.capacity import (KEY_KINDS, attention_reads, decay_row, delta_rule_reads, format_cliff, pair_counts,
                              retrieval_cliff, unit_keys)


@pytest.mark.parametrize("kind", KEY_KINDS)
def test_keys_are_unit_and_orthogonal_keys_are_orthogonal_within_a_block(kind):
    keys = unit_keys(20, 8, kind, torch.Generator().manual_seed(1))
    torch.testing.assert_close(keys.norm(dim=-1), torch.ones(20, dtype=torch.float64), rtol=0, atol=1e-12)
    if kind == "orthogonal":
        for block in (keys[:8], keys[8:16]):
            torch.testing.assert_close(block @ block.T, torch.eye(8, dtype=torch.float64), rtol=0, atol=1e-12)


def test_the_delta_rule_always_returns_the_latest_write_exactly():
    """With beta = 1 and a unit key the write sets S^T k = v (v - S^T k is added under k, k.k = 1): whatever
    came before, the last pair reads back exactly -- and, with orthogonal keys, so does every earlier one."""
    g = torch.Generator().manual_seed(2)
    for n, dim in ((3, 8), (40, 8), (5, 16)):
        keys = unit_keys(n, dim, "random", g)
        values = torch.randn(n, dim, generator=g, dtype=torch.float64)
        torch.testing.assert_close(delta_rule_reads(keys, values)[-1], values[-1], rtol=0, atol=1e-12)
    keys = unit_keys(16, 16, "orthogonal", g)
    values = torch.randn(16, 16, generator=g, dtype=torch.float64)
    torch.testing.assert_close(delta_rule_reads(keys, values), values, rtol=0, atol=1e-12)


def test_attention_reads_are_the_softmax_average_of_the_values():
    g = torch.Generator().manual_seed(3)
    keys, values = unit_keys(6, 4, "random", g), torch.randn(6, 4, generator=g, dtype=torch.float64)
    weights = torch.exp(keys @ keys.T / 0.5)
    expected = (weights / weights.sum(-1, keepdim=True)) @ values
    torch.testing.assert_close(attention_reads(keys, values, temperature=0.5), expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("K", [8, 16, 32, 64])
def test_the_cliff_the_delta_rule_is_exact_up_to_K_orthogonal_keys_and_not_past_it_attention_always(K):
    points = retrieval_cliff(K, [K // 2, K, 2 * K, 4 * K], "orthogonal", min_reads=64)
    delta = {p.pairs: p for p in points if p.method == "delta rule"}
    attention = {p.pairs: p for p in points if p.method == "attention"}
    for n in (K // 2, K):
        assert delta[n].exact == 1.0 and delta[n].cosine > 1 - 1e-9, (K, n, delta[n])
    assert delta[2 * K].cosine < 0.8 and delta[4 * K].exact < 0.5, (delta[2 * K], delta[4 * K])
    assert all(p.exact == 1.0 and p.cosine > 0.99 for p in attention.values()), attention
    # the state is K x V whatever N; the cache grows by K + V numbers per pair (float32 bytes)
    assert {p.memory_bytes for p in delta.values()} == {K * K * 4}
    assert [attention[n].memory_bytes for n in (K, 2 * K)] == [K * 2 * K * 4, 2 * K * 2 * K * 4]


def test_random_keys_interfere_before_K():
    points = retrieval_cliff(16, [16], "random", min_reads=256)
    delta = next(p for p in points if p.method == "delta rule")
    assert delta.cosine < 0.9, delta


def test_the_decay_gate_forgets_with_distance_as_alpha_to_the_d():
    for d, retained in decay_row(16, 0.9, distances=(0, 1, 3, 15)):
        assert math.isclose(retained, 0.9 ** d, rel_tol=1e-10), (d, retained)


def test_pair_counts_run_from_1_to_4K_and_the_table_has_a_line_per_cell():
    assert pair_counts(8) == [1, 2, 4, 6, 8, 9, 12, 16, 24, 32]
    table = format_cliff(retrieval_cliff(8, [1, 8], "orthogonal", min_reads=8))
    assert len(table.splitlines()) == 3 and "delta rule" in table and "attention" in table


def test_bad_arguments_say_what_is_allowed():
    with pytest.raises(ValueError, match="keys must be one of orthogonal, random"):
        retrieval_cliff(8, [1], "sparse")
    with pytest.raises(ValueError, match="at least 1"):
        retrieval_cliff(8, [0])
    with pytest.raises(ValueError, match="alpha must lie in"):
        decay_row(8, 1.5)
    with pytest.raises(ValueError, match="orthogonal keys"):
        decay_row(8, 0.9, distances=(0, 8))

