"""When two computations agree only to a tolerance, the discrete choices made from them (top-k experts, the
greedy next token) may still be compared exactly, but only where no rounding within that tolerance can
change them: the values the choice ranks must be further apart than the tolerance. `assert_decisive`
checks that, so an exact comparison of the choices cannot fail by rounding alone, on any CPU or BLAS.
"""

from __future__ import annotations

import torch


def assert_decisive(values: torch.Tensor, k: int, margin: float) -> None:
    """The k largest of values [..., N] along the last dimension, in their order, are decided by more than
    `margin`: in every row the k + 1 largest values are pairwise more than `margin` apart (k = N - 1: the
    whole row, so that a choice over any subset of it, such as an expert blocked, is decided too).

    Two computations whose values differ by less than margin / 2 then rank these the same way.
    """
    n = values.shape[-1]
    if not 1 <= k < n:
        raise ValueError(f"k must be between 1 and {n - 1} for {n} values, got {k}")
    top = values.detach().reshape(-1, n).double().topk(k + 1, dim=-1).values        # [rows, k + 1] descending
    gaps = top[:, :-1] - top[:, 1:]
    smallest = float(gaps.min())
    assert smallest > margin, (f"a choice is decided by only {smallest:.3g} (<= {margin:g}): rounding could "
                               f"flip it, so it cannot be compared exactly")
