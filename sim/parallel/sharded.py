"""The sharded MoE sublayer: a LatentMoE whose routed experts are split over the ranks of a process group.

One MoE sublayer on rank r, x [B, T, D] (n = B*T local tokens; the rest is LatentMoE's own code):

    route    ids, w = LatentMoE.route_tokens(x)          replicated router, [n, k]; reports the "moe" event
    down     z = W_down x                                [n, l]  (K3: 7168 -> 3584, so dispatch moves half the bytes)
    dispatch one copy of z[t] per *distinct destination rank* of token t, with its k expert ids and weights
             (-1 / 0 for slots whose expert lives elsewhere): K3/DeepEP-style, so a token whose 2 experts share a
             rank costs one row, not two. Counts first (all_to_all_single of [N] ints), then rows (uneven splits).
    compute  each received row: y = sum over its local slots of w_j E_j(z)   (LatentMoE.mix_experts, local stacks)
    combine  the rows go back the way they came (all_to_all_single), and the home rank adds them up per token
    finish   out = LatentMoE.combine(y, x) = W_up RMSNorm(y) + Shared(x)
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from tiny_k3 import NO_RECORDER, Recorder, TinyK3
from tiny_k3.moe import LatentMoE

from ..costs import experts_per_rank
from .traffic import RankTraffic

META_BYTES = 8  # routing metadata travels as float64: k expert ids (exact) and k weights (exact from fp32)


def expert_range(num_experts: int, world_size: int, rank: int) -> range:
    """The global expert ids rank `rank` holds: a contiguous block of E/N (the ranks must divide E)."""
    per = experts_per_rank(num_experts, world_size)
    return range(rank * per, (rank + 1) * per)


class Dispatch(NamedTuple):
    """Which rows go where, for n local tokens with k slots each over N ranks (R = rows sent in all).

    dest [n, k] the rank of each slot's expert; touches [n, N] whether token t sends to rank g;
    row_dst, row_tok [R] the destination and token of each row, grouped by destination;
    meta [R, 2k] float64: the k expert ids local to the destination (-1: not there), then their k weights.
    """

    dest: torch.Tensor
    touches: torch.Tensor
    row_dst: torch.Tensor
    row_tok: torch.Tensor
    meta: torch.Tensor


def plan_dispatch(ids: torch.Tensor, weights: torch.Tensor, per_rank: int, world_size: int) -> Dispatch:
    """ids, weights [n, k] (global expert ids) -> one row per (token, distinct destination rank)."""
    dest = ids // per_rank                                                              # [n, k]
    touches = F.one_hot(dest, world_size).amax(1).bool()                                # [n, N]
    row_dst, row_tok = touches.T.nonzero(as_tuple=True)                                 # [R], [R]
    here = dest[row_tok] == row_dst[:, None]                                            # [R, k] slot lives there
    local_ids = torch.where(here, ids[row_tok] - row_dst[:, None] * per_rank, -1)
    meta = torch.cat([local_ids.double(), torch.where(here, weights[row_tok], 0).double()], 1)
    return Dispatch(dest, touches, row_dst, row_tok, meta)


class ExpertParallelMoE(nn.Module):
    """`moe` with only this rank's slice of the routed experts; forward(x, recorder, layer) as LatentMoE.

    Takes `moe` over: its w1/w3/w2 are cut down to experts rank*E/N .. (rank+1)*E/N - 1 (so the full stacks
    can be freed) and everything else it keeps replicated. `log` (a list) receives one RankTraffic per
    forward; `step` is stamped on it by the driver.
    """

    def __init__(self, moe: LatentMoE, group=None, log: list | None = None):
        super().__init__()
        self.config, self.group = moe.config, group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.experts = expert_range(moe.config.num_experts, self.world_size, self.rank)
        local = slice(self.experts.start, self.experts.stop)
        for name in ("w1", "w3", "w2"):                                 # [E/N, m, l], [E/N, m, l], [E/N, l, m]
            setattr(moe, name, nn.Parameter(getattr(moe, name).detach()[local].clone()))
        self.moe = moe
        self.log = log if log is not None else []
        self.step = 0

    def _exchange(self, rows: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
        """rows [sum(send), C] cut by destination -> [sum(recv), C] cut by source (one all_to_all_single)."""
        out = rows.new_empty(sum(recv), rows.shape[1])
        dist.all_to_all_single(out, rows.contiguous(), output_split_sizes=recv, input_split_sizes=send,
                               group=self.group)
        return out

    def forward(self, x: torch.Tensor, recorder: Recorder = NO_RECORDER, layer: int = 0, hooks=None) -> torch.Tensor:
        """x [B, T, D] (this rank's tokens) -> [B, T, D]. hooks: what-if routing changes, as in LatentMoE."""
        k, l, N = self.config.top_k, self.config.latent_dim, self.world_size
        routing = self.moe.route_tokens(x, recorder, layer, hooks)
        z = self.moe.down(x).reshape(-1, l)                                                 # [n, l]
        plan = plan_dispatch(routing.expert_ids.reshape(-1, k), routing.weights.reshape(-1, k), len(self.experts), N)

        send_t = torch.bincount(plan.row_dst, minlength=N)                                  # [N] rows per rank
        recv_t = torch.empty_like(send_t)
        dist.all_to_all_single(recv_t, send_t, group=self.group)                            # counts first
        send, recv = send_t.tolist(), recv_t.tolist()
        z_out = z.index_select(0, plan.row_tok)
        z_in = self._exchange(z_out, send, recv)                                            # [R_in, l]   dispatch
        meta_in = self._exchange(plan.meta, send, recv)                                     # [R_in, 2k]
        y_in, pairs_here = self._compute(z_in, meta_in)
        y_back = self._exchange(y_in, recv, send)                                           # [R, l]      combine
        y = z.new_zeros(z.shape[0], l).index_add(0, plan.row_tok, y_back)                   # sum per token

        row_bytes = z_out.shape[1] * z_out.element_size()
        self.log.append(RankTraffic(
            step=self.step, layer=layer, tokens=int(z.shape[0]), copies_to=send,
            pairs_to=torch.bincount(plan.dest.reshape(-1), minlength=N).tolist(),
            distinct=torch.bincount(plan.touches.sum(1), minlength=N + 1).tolist(), pairs_here=pairs_here,
            dispatch_bytes_to=[n * (row_bytes + 2 * k * META_BYTES) for n in send],
            combine_bytes_to=[n * row_bytes for n in recv]))
        return self.moe.combine(y.view(*x.shape[:-1], l), x)

    def _compute(self, z: torch.Tensor, meta: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Rows received here: z [R, l], meta [R, 2k] -> (sum over local slots of w_j E_j(z) [R, l], pairs run)."""
        k = self.config.top_k
        local_ids, w = meta[:, :k].long(), meta[:, k:].to(z.dtype)
        row, slot = (local_ids >= 0).nonzero(as_tuple=True)                                 # [P] local pairs
        return self.moe.mix_experts(z, local_ids[row, slot], w[row, slot], token=row), int(row.numel())


def shard_model(model: TinyK3, group=None, log: list | None = None) -> list:
    """Swap every MoE sublayer of `model` for its expert-parallel slice (in place); returns the shared log."""
    log = log if log is not None else []
    for block in model.blocks:
        if block.mlp_kind == "moe":
            block.mlp = ExpertParallelMoE(block.mlp, group, log)
    return log


def set_step(model: TinyK3, step: int) -> None:
    """Stamp `step` on what every sharded MoE logs next."""
    for block in model.blocks:
        if isinstance(block.mlp, ExpertParallelMoE):
            block.mlp.step = step
