"""`top_k_ids`: the router's top-k selection, exactly `topk(k, sorted=True).indices`, with fewer comparisons.

The selection of `tiny_k3.moe.route` (ids = topk(s + b, k)); its reference is torch's own topk, which every
row that fails the exactness test below is handed to (tests/test_moe.py compares the two on ties and NaN).
"""

from __future__ import annotations

from functools import lru_cache

import torch


# `top_k_ids` takes its two-stage path from this many rows on (below it one topk is cheaper than ten small ops).
TWO_STAGE_MIN_ROWS = 16


def top_k_ids(biased: torch.Tensor, k: int) -> torch.Tensor:
    """`biased.topk(k, dim=-1, sorted=True).indices`, exactly, with about a quarter of the comparisons.

    biased [..., E] -> [..., k] long. torch's CPU topk costs ~8 ns per element of every row (an nth_element
    over (value, index) pairs), which at prefill is a third of the MoE layer. Two stages look at fewer:
    split each row into G groups of s (member i of group g is column i*G + g, so the group maxima are one
    vectorised reduction), keep the k+1 groups with the highest maxima (in any order) and take the top k+1
    of their s(k+1) members, c_1 >= ... >= c_{k+1}. Exactness: the kept maxima are k+1 of the members, so
    c_{k+1} >= the least kept maximum >= every element outside the kept groups. If the c's are strictly
    decreasing, every element but c_1..c_k is <= c_{k+1} < c_k: they are the row's only k largest, in the only
    order topk can give them. A row that fails the test (a tie, NaN: topk's "largest", -inf padding) is
    handed to topk itself, so ties break exactly as before. With E/k = 56 a row is 247 elements, not 896.
    """
    num_experts = biased.shape[-1]
    plan = two_stage_plan(num_experts, k)
    rows = biased.numel() // max(num_experts, 1)
    if plan is None or rows < TWO_STAGE_MIN_ROWS:
        return biased.topk(k, dim=-1, sorted=True).indices
    size, groups = plan
    with torch.no_grad():
        table = biased.detach().reshape(rows, size, groups)                      # [R, s, G]
        kept = table.amax(1).topk(k + 1, dim=-1, sorted=False).indices           # [R, k+1] group ids
        members = table.gather(2, kept.unsqueeze(1).expand(rows, size, k + 1))  # [R, s, k+1]: member i of kept j
        top = members.view(rows, size * (k + 1)).topk(k + 1, dim=-1)            # position i*(k+1) + j
        # the expert id of every member (i*G + kept j, one broadcast add), read at the top k positions: fewer
        # ops than splitting each position into i and j (integer division and remainder are slow on the CPU)
        member_ids = torch.add(kept.unsqueeze(1), _member_offsets(size, groups, kept.device)).view(rows, -1)
        ids = member_ids.gather(1, top.indices[:, :k])                           # [R, k] expert ids
        values = top.values
        decreasing = values[:, :-1] > values[:, 1:]
        if not bool(decreasing.all()):
            redo = (~decreasing.all(1)).nonzero().squeeze(1)
            ids[redo] = biased.detach().reshape(rows, num_experts)[redo].topk(k, dim=-1, sorted=True).indices
    return ids.view(*biased.shape[:-1], k)


@lru_cache(maxsize=None)
def _member_offsets(size: int, groups: int, device: torch.device) -> torch.Tensor:
    """[s, 1] long: i * G, the offset of member i of a group in `top_k_ids`' table (made once per shape)."""
    with torch.inference_mode(False):   # a normal tensor, usable in and out of inference mode
        return torch.arange(0, size * groups, groups, device=device).unsqueeze(1)


@lru_cache(maxsize=None)
def two_stage_plan(num_experts: int, k: int) -> tuple[int, int] | None:
    """(s, G) with s * G = E and G >= k + 1 that minimises the G + s(k+1) elements `top_k_ids` looks at per
    row, or None where that saves less than half of E (small E, k = 1: topk's own max scan)."""
    if k < 2:
        return None
    plans = [(groups + size * (k + 1), -size, size, num_experts // size) for size in range(2, num_experts)
             if num_experts % size == 0 and (groups := num_experts // size) >= k + 1]
    if not plans or min(plans)[0] * 2 > num_experts:
        return None
    _, _, size, groups = min(plans)
    return size, groups
