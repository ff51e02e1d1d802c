"""Expert parallelism for real: TinyK3's routed experts spread over N processes, tokens moved by all_to_all.

K3 is served on 64+ GPUs with each GPU holding E/EP of every MoE layer's experts (k3_facts.md §6a). This runs
the same scheme on one machine (or several) with PyTorch's own engine, torch.distributed: gloo on CPU, NCCL on
GPUs. Every rank holds

    replicated  embedding, attention (KDA/MLA), AttnRes, the router, the latent down/up projections and norm,
                the shared experts, the head
    sharded     routed experts rank*E/N .. (rank+1)*E/N - 1 of every MoE layer (w1, w3 [E/N, m, l], w2 [E/N, l, m])

Attention is data parallel (the "DEP" shape of k3_facts.md §6a, TRT-LLM's DEP16): each rank serves its own
sequences end to end and meets the others only inside the MoE sublayers. One MoE sublayer on rank r, x [B, T, D]:

    route    ids, w = Router(x)                          replicated router, [n, k] with n = B*T local tokens
    down     z = W_down x                                [n, l]  (K3: 7168 -> 3584, so dispatch moves half the bytes)
    dispatch one copy of z[t] per *distinct destination rank* of token t, with its k expert ids and weights
             (-1 / 0 for slots whose expert lives elsewhere): K3/DeepEP-style, so a token whose 2 experts share a
             rank costs one row, not two. Counts first (all_to_all_single of [N] ints), then rows (uneven splits).
    compute  each received row: y = sum over its local slots of w_j E_j(z)      (the expert side pre-sums)
    combine  the rows go back the way they came (all_to_all_single), and the home rank adds them up per token
    finish   out = W_up RMSNorm(y) + Shared(x)           replicated, exactly LatentMoE's tail (moe.py)

So the output equals the single-process `LatentMoE` for the same weights, up to float summation order.

Every MoE call logs what it sent; `run_expert_parallel` gathers the logs into `LayerTraffic` (numpy, per step
and layer): token copies and bytes between each pair of ranks, distinct ranks per token, and each rank's load.
`k3_ep_figures` gives the same quantities analytically for the real K3 on 64 GPUs (§6b), `comparison` puts
them side by side.

Run it:

    python -m sim.parallel --preset tiny --ranks 4 --prompt "key=7; 3+4=" --prompt "hello"   # spawns 4 processes
    torchrun --standalone --nproc-per-node 4 -m sim.parallel --preset tiny --prompt "hello"   # torchrun, 1 machine
    # several machines (run on each, NODE = 0, 1, ...; HOST = node 0's address; add --device cuda for NCCL):
    torchrun --nnodes 2 --nproc-per-node 4 --node-rank NODE --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m sim.parallel --preset tiny --prompt "hello"
    # if gloo picks the wrong network card across machines: GLOO_SOCKET_IFNAME=eth0 (NCCL: NCCL_SOCKET_IFNAME)
    python -m sim.parallel --ranks 2 --fail-rank 1 --fail-step 1 [--hang] --timeout 5   # drill: a rank dies

Spawned ranks start from a forkserver (torch imported once) and talk over 127.0.0.1 only. A script that calls
`run_expert_parallel` needs the usual `if __name__ == "__main__":` guard; notebooks need nothing.
"""

from __future__ import annotations

import argparse
import datetime
import os
import queue as queue_mod
import re
import socket
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from tiny_k3 import DEFAULT_PROMPT, K3Config, TinyK3, load_model
from tiny_k3.moe import LatentMoE, situ_glu

from .costs import ep_traffic_for, expected_destinations

SETUP_TIMEOUT = 60.0  # s for joining, the weight broadcast and the final gather; the MoE collectives get `timeout`
META_BYTES = 8  # routing metadata travels as float64: k expert ids (exact) and k weights (exact from fp32)


class ParallelError(RuntimeError):
    """A distributed run that failed: a rank died, timed out or could not connect; the message says which."""


def expert_range(num_experts: int, world_size: int, rank: int) -> range:
    """The global expert ids rank `rank` holds: a contiguous block of E/N (the ranks must divide E)."""
    if world_size < 1 or num_experts % world_size:
        valid = [n for n in range(1, num_experts + 1) if num_experts % n == 0]
        raise ValueError(f"{world_size} ranks do not divide the {num_experts} experts evenly; "
                         f"use one of {', '.join(map(str, valid))} ranks.")
    per = num_experts // world_size
    return range(rank * per, (rank + 1) * per)


# ---------------------------------------------------------------------------- the sharded MoE sublayer


class ExpertParallelMoE(nn.Module):
    """A LatentMoE whose routed experts are split over the ranks of `group`; forward(x, recorder, layer) as LatentMoE.

    Keeps references to the replicated parts of `moe` (router, down, latent_norm, up, shared) and copies of
    its local slice of w1/w2/w3, so the full expert stack can be freed. `log` (a list) receives one dict per
    forward describing what this rank sent; `step` is stamped on it by the driver.
    """

    def __init__(self, moe: LatentMoE, group=None, log: list | None = None):
        super().__init__()
        self.config, self.group = moe.config, group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.experts = expert_range(moe.config.num_experts, self.world_size, self.rank)
        self.local_experts = len(self.experts)
        self.router, self.down, self.latent_norm, self.up, self.shared = (
            moe.router, moe.down, moe.latent_norm, moe.up, moe.shared)
        local = slice(self.experts.start, self.experts.stop)
        self.w1 = nn.Parameter(moe.w1.detach()[local].clone())  # [E/N, m, l]
        self.w3 = nn.Parameter(moe.w3.detach()[local].clone())
        self.w2 = nn.Parameter(moe.w2.detach()[local].clone())  # [E/N, l, m]
        self.log = log if log is not None else []
        self.step = 0

    def _exchange(self, rows: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
        """rows [sum(send), C] cut by destination -> [sum(recv), C] cut by source (one all_to_all_single)."""
        out = rows.new_empty(sum(recv), rows.shape[1])
        dist.all_to_all_single(out, rows.contiguous(), output_split_sizes=recv, input_split_sizes=send,
                               group=self.group)
        return out

    def forward(self, x: torch.Tensor, recorder=None, layer: int = 0) -> torch.Tensor:
        """x [B, T, D] (this rank's tokens) -> [B, T, D]."""
        c, N, per = self.config, self.world_size, self.local_experts
        k, l = c.top_k, c.latent_dim
        routing = self.router(x)
        if recorder is not None:
            recorder.record("moe", layer, scores=routing.scores.detach(), bias=self.router.bias.detach(),
                            expert_ids=routing.expert_ids.detach(), weights=routing.weights.detach())
        ids, weights = routing.expert_ids.reshape(-1, k), routing.weights.reshape(-1, k)  # [n, k]
        z = self.down(x).reshape(-1, l)                                                      # [n, l]
        dest = ids // per                                                                    # [n, k] rank of each slot
        touches = F.one_hot(dest, N).amax(1).bool()                                          # [n, N]
        # One row per (token, destination rank), grouped by destination: what each rank will receive.
        row_dst, row_tok = touches.T.nonzero(as_tuple=True)                                   # [R], [R]
        here = dest[row_tok] == row_dst[:, None]                                             # [R, k] slot lives there
        local_ids = torch.where(here, ids[row_tok] - row_dst[:, None] * per, -1)
        meta = torch.cat([local_ids.double(), torch.where(here, weights[row_tok], 0).double()], 1)  # [R, 2k]

        send_t = torch.bincount(row_dst, minlength=N)                                        # [N] rows per rank
        recv_t = torch.empty_like(send_t)
        dist.all_to_all_single(recv_t, send_t, group=self.group)                             # counts first
        send, recv = send_t.tolist(), recv_t.tolist()
        z_out = z.index_select(0, row_tok)
        z_in = self._exchange(z_out, send, recv)                                             # [R_in, l]   dispatch
        meta_in = self._exchange(meta, send, recv)                                           # [R_in, 2k]
        y_in, pairs_here = self._local(z_in, meta_in[:, :k].long(), meta_in[:, k:].to(z.dtype))
        y_back = self._exchange(y_in, recv, send)                                            # [R, l]      combine
        y = z.new_zeros(z.shape[0], l).index_add(0, row_tok, y_back)                         # sum per token

        row_bytes = lambda t: t.shape[1] * t.element_size()  # noqa: E731 - bytes of one row of what was sent
        self.log.append(dict(
            step=self.step, layer=layer, tokens=int(z.shape[0]), copies_to=send,
            pairs_to=torch.bincount(dest.reshape(-1), minlength=N).tolist(),
            distinct=torch.bincount(touches.sum(1), minlength=N + 1).tolist(), pairs_here=pairs_here,
            dispatch_bytes_to=[n * (row_bytes(z_out) + row_bytes(meta)) for n in send],
            combine_bytes_to=[n * row_bytes(y_in) for n in recv]))
        out = self.up(self.latent_norm(y.view(*x.shape[:-1], l)))  # RMSNorm after the full sum (moe.py, §1c)
        return out if self.shared is None else out + self.shared(x)

    def _local(self, z: torch.Tensor, local_ids: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Rows received here: z [R, l], local_ids / w [R, k] (-1 / 0: not here) -> (sum_j w_j E_j(z) [R, l], pairs).

        One gathered weight copy per (row, slot) pair, as LatentMoE's decode path: simple and exact.
        """
        row, slot = (local_ids >= 0).nonzero(as_tuple=True)                                  # [P]
        e = local_ids[row, slot]
        zr = z.index_select(0, row).unsqueeze(-1)                                            # [P, l, 1]
        h = situ_glu(torch.bmm(self.w1[e], zr), torch.bmm(self.w3[e], zr),
                     self.config.situ_beta_gate, self.config.situ_beta_up)                   # [P, m, 1]
        out = torch.bmm(self.w2[e], h).squeeze(-1) * w[row, slot].unsqueeze(-1)             # [P, l]
        return z.new_zeros(z.shape[0], z.shape[1]).index_add(0, row, out), int(row.numel())


def shard_model(model: TinyK3, group=None, log: list | None = None) -> list:
    """Swap every MoE sublayer of `model` for its expert-parallel slice (in place); returns the shared log."""
    log = log if log is not None else []
    for block in model.blocks:
        if block.mlp_kind == "moe":
            block.mlp = ExpertParallelMoE(block.mlp, group, log)
    return log


def set_step(model: TinyK3, step: int) -> None:
    for block in model.blocks:
        if isinstance(block.mlp, ExpertParallelMoE):
            block.mlp.step = step


# ---------------------------------------------------------------------------- measured traffic


@dataclass(frozen=True)
class LayerTraffic:
    """What one MoE layer moved in one step (0 = prefill, s = decode step s), over all N ranks. numpy arrays.

    tokens [N]          tokens each rank holds (its own sequences: attention is data parallel)
    copies [N, N]       token copies dispatched src -> dst (one per token per distinct destination rank)
    pairs [N, N]        (token, expert) pairs src -> dst (k per token)
    distinct [N+1]      tokens that touch 1, 2, ... N distinct ranks (index = number of ranks)
    dispatch_bytes, combine_bytes [N, N]  bytes src -> dst as handed to all_to_all_single: dispatch = latent rows
                        + routing metadata; combine = the pre-summed latent rows going back from the expert rank
    """

    step: int
    layer: int
    tokens: np.ndarray
    copies: np.ndarray
    pairs: np.ndarray
    distinct: np.ndarray
    dispatch_bytes: np.ndarray
    combine_bytes: np.ndarray

    @property
    def load(self) -> np.ndarray:
        """[N] expert evaluations (token, expert pairs) computed on each rank."""
        return self.pairs.sum(0)

    @property
    def imbalance(self) -> float:
        """Busiest rank's load / mean load (1.0 = perfectly even)."""
        return float(self.load.max() / self.load.mean())

    @property
    def destinations(self) -> float:
        """Mean distinct ranks a token touches."""
        return float((self.distinct * np.arange(len(self.distinct))).sum() / self.distinct.sum())

    @property
    def bytes(self) -> np.ndarray:
        """[N, N] all bytes src -> dst (dispatch + combine); the diagonal never leaves the rank."""
        return self.dispatch_bytes + self.combine_bytes

    def as_dict(self) -> dict:
        return dict(step=self.step, layer=self.layer, tokens=self.tokens, copies=self.copies, pairs=self.pairs,
                    dispatch_bytes=self.dispatch_bytes, combine_bytes=self.combine_bytes, load=self.load,
                    imbalance=self.imbalance, destinations=self.destinations, distinct=self.distinct)


def assemble_traffic(logs: list[list[dict]]) -> list[LayerTraffic]:
    """Per-rank logs (rank order; one record per MoE call, the same calls on every rank) -> LayerTraffic list."""
    out = []
    for records in zip(*logs):
        field_of = lambda name: np.array([r[name] for r in records], dtype=np.int64)  # noqa: E731 - [N, ...]
        out.append(LayerTraffic(
            step=records[0]["step"], layer=records[0]["layer"], tokens=field_of("tokens"),
            copies=field_of("copies_to"), pairs=field_of("pairs_to"), distinct=field_of("distinct").sum(0),
            dispatch_bytes=field_of("dispatch_bytes_to"), combine_bytes=field_of("combine_bytes_to")))
    return out


@dataclass
class EPRun:
    """The result of an expert-parallel run, gathered on rank 0 (or the parent process).

    sequences: the token ids each sequence started with; `ranks_of[i]` the rank that served it;
    logits: the prefill logits per sequence [T_i, vocab]; generated [n_seq, new_tokens] (greedy);
    step_logits [steps, n_seq, vocab]: the last position's logits of every forward (prefill, then each decode);
    traffic: one LayerTraffic per (step, MoE layer); max_diff: max |EP - single-process| of the logits where
    `check` ran (None otherwise).
    """

    preset: str
    world_size: int
    backend: str
    sequences: list[list[int]]
    ranks_of: list[int]
    logits: list[np.ndarray]
    generated: np.ndarray
    step_logits: np.ndarray
    traffic: list[LayerTraffic]
    max_diff: float | None = None
    tokens_equal: bool | None = None
    info: dict = field(default_factory=dict)

    def stats(self) -> list[dict]:
        """Every (step, layer) as a plain dict of numpy arrays and floats, for lessons and plots."""
        return [t.as_dict() for t in self.traffic]

    def step_matrix(self, step: int = 0, what: str = "bytes") -> np.ndarray:
        """[N, N] `what` ("bytes", "copies", "pairs", "dispatch_bytes", "combine_bytes") summed over a step's layers."""
        return sum(getattr(t, what) for t in self.traffic if t.step == step)


# ---------------------------------------------------------------------------- analytic K3 figures (§6b)


def load_imbalance(num_experts: int, top_k: int, ep: int, batch: int, samples: int = 1 << 14,
                   seed: int = 0) -> float:
    """E[max/mean rank load] when `batch` tokens each pick `top_k` distinct experts uniformly (Monte-Carlo).

    Rank load = (token, expert) pairs on it, experts dealt in blocks of E/EP. A token's k picks are drawn rank
    by rank without replacement (rank g with probability = its experts not yet picked / all not yet picked),
    which is exact and needs only [tokens, EP] arrays. About `samples` tokens in all (at least 8 batches).
    K3 EP64 (k3_facts.md §6b): B=16 2.34, B=128 1.42, B=1024 1.15.
    """
    per = len(expert_range(num_experts, ep, 0))
    rng, trials = np.random.default_rng(seed), max(8, samples // batch)
    left = np.full((trials * batch, ep), per, dtype=np.int64)                              # experts not yet picked
    for j in range(top_k):
        u = (rng.random(len(left)) * (num_experts - j)).astype(np.int64)                  # uniform over the rest
        pick = (left.cumsum(1) <= u[:, None]).sum(1)
        left[np.arange(len(left)), pick] -= 1
    load = (per - left).reshape(trials, batch, ep).sum(1)                                  # [trials, ep]
    return float((load.max(1) / load.mean(1)).mean())


def k3_ep_figures(ep: int = 64, batches: tuple[int, ...] = (16, 128, 1024), samples: int = 1 << 14) -> dict:
    """The real K3 on `ep` GPUs, per token per MoE layer (k3_facts.md §6b), and the imbalance vs batch size.

    Bytes are in the 3584-wide latent: dispatch FP8/MXFP8 (1 B + a 1-B scale per 32 values), combine BF16.
    "per_copy" sends one copy per chosen expert (k = 16, the §6b table); "per_destination" one per distinct GPU
    (what DeepEP-style kernels and this module do): expected EP(1 - (1 - 1/EP)^k) = 14.3 of 16 at EP64.
    """
    figures = _k3_ep_figures(ep, tuple(batches), samples)
    return {**figures, "imbalance": dict(figures["imbalance"])}


@lru_cache(maxsize=8)
def _k3_ep_figures(ep: int, batches: tuple[int, ...], samples: int) -> dict:
    k3 = K3Config.preset("k3")
    t = ep_traffic_for(k3, ep)
    dest = expected_destinations(ep, k3.top_k)
    row_fp8, row_bf16 = k3.latent_dim + -(-k3.latent_dim // 32), 2 * k3.latent_dim
    return dict(
        ep=ep, num_experts=k3.num_experts, top_k=k3.top_k, latent_dim=k3.latent_dim,
        experts_per_gpu=len(expert_range(k3.num_experts, ep, 0)),
        moe_layers=t.moe_layers, destinations=dest, cross_gpu_fraction=t.cross_gpu_fraction,
        dispatch_per_copy=t.dispatch, combine_per_copy=t.combine, per_token_step_per_copy=t.per_token,
        dispatch_per_destination=dest * row_fp8, combine_per_destination=dest * row_bf16,
        per_token_step_per_destination=dest * (row_fp8 + row_bf16) * t.moe_layers,
        imbalance={b: load_imbalance(k3.num_experts, k3.top_k, ep, b, samples) for b in batches},
    )


def comparison(run: EPRun, k3: dict | None = None) -> list[dict]:
    """Measured (the run) vs analytic (its preset, uniform routing) vs analytic (K3 EP64), one dict per quantity.

    Keys: quantity, measured, tiny (the run's preset, analytic), k3, note.
    """
    cfg, N = K3Config.preset(run.preset), run.world_size
    k3 = k3 or k3_ep_figures()
    tr = run.traffic
    tokens = sum(int(t.tokens.sum()) for t in tr)
    copies = sum(int(t.copies.sum()) for t in tr)
    cross = sum(int(t.copies.sum() - np.trace(t.copies)) for t in tr)
    dest = expected_destinations(N, cfg.top_k)
    latent = run.info["latent_row_bytes"]
    meta = 2 * cfg.top_k * META_BYTES
    prefill = [t for t in tr if t.step == 0]
    batch = int(prefill[0].tokens.sum())
    return [
        dict(quantity="distinct ranks per token", measured=copies / tokens, tiny=dest, k3=k3["destinations"],
             note=f"of k = {cfg.top_k} ({run.preset}) and {k3['top_k']} (K3); uniform routing: N(1 - (1 - 1/N)^k)"),
        dict(quantity="cross-rank share of copies", measured=cross / copies, tiny=1 - 1 / N,
             k3=k3["cross_gpu_fraction"], note="copies that leave their rank; uniform routing: 1 - 1/N"),
        dict(quantity="dispatch bytes / token / layer", measured=sum(int(t.dispatch_bytes.sum()) for t in tr) / tokens,
             tiny=dest * (latent + meta), k3=k3["dispatch_per_destination"],
             note=f"one latent row (+ {meta} B of ids and weights here) per distinct rank; K3 with one copy "
                  f"per expert: {k3['dispatch_per_copy']:,} B (FP8 + scales)"),
        dict(quantity="combine bytes / token / layer", measured=sum(int(t.combine_bytes.sum()) for t in tr) / tokens,
             tiny=dest * latent, k3=k3["combine_per_destination"],
             note=f"one pre-summed row back per distinct rank; K3 with one copy per expert: "
                  f"{k3['combine_per_copy']:,} B (BF16)"),
        dict(quantity=f"busiest / mean rank load (prefill, B={batch})",
             measured=float(np.mean([t.imbalance for t in prefill])),
             tiny=load_imbalance(cfg.num_experts, cfg.top_k, N, batch, samples=1 << 13),
             k3=load_imbalance(k3["num_experts"], k3["top_k"], k3["ep"], batch),
             note=f"analytic columns at the same B; K3 at B = " + ", ".join(
                 f"{b}: {v:.2f}" for b, v in k3["imbalance"].items())),
    ]


# ---------------------------------------------------------------------------- the worker (one per rank)


def build_model(preset: str, seed: int = 0, dtype: torch.dtype | None = None, device="cpu") -> TinyK3:
    """The model every rank starts from (and the single-process reference): seeded random weights."""
    model = load_model(preset, "random", seed, device).model
    return model.to(dtype) if dtype is not None else model


def _chunks(n_seq: int, world_size: int) -> list[range]:
    """Contiguous sequences per rank (rank r gets chunk r)."""
    bounds = np.linspace(0, n_seq, world_size + 1).round().astype(int)
    return [range(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def validate(preset: str, world_size: int, sequences: list[list[int]]) -> K3Config:
    """One clear ValueError for input an expert-parallel run cannot take."""
    cfg = K3Config.preset(preset)
    expert_range(cfg.num_experts, world_size, 0)
    if len(sequences) < world_size:
        raise ValueError(f"{len(sequences)} sequences cannot feed {world_size} ranks; give at least one per rank.")
    for r, chunk in enumerate(_chunks(len(sequences), world_size)):
        lengths = {len(sequences[i]) for i in chunk}
        if len(lengths) != 1 or 0 in lengths:
            raise ValueError(f"the sequences of rank {r} must be non-empty and of one length (each rank runs them "
                             f"as one batch), got lengths {sorted(lengths)}.")
    return cfg


def _drill(rank: int, step: int, fail: tuple | None) -> None:
    """Crash drill: `fail = (rank, step)` kills that rank at the start of that step, (rank, step, "hang") stalls it."""
    if fail is None or (rank, step) != tuple(fail[:2]):
        return
    hang = len(fail) > 2 and fail[2] == "hang"
    what = "hanging" if hang else "dying"
    print(f"rank {rank}: {what} on purpose at step {step} (drill)", file=sys.stderr, flush=True)
    if hang:
        time.sleep(1e6)
    os._exit(3)


@torch.no_grad()
def ep_worker(rank: int, world_size: int, preset: str, sequences: list[list[int]], new_tokens: int = 0,
              seed: int = 0, dtype: str | None = None, device: str = "cpu", check: bool = False,
              fail: tuple | None = None, timeout: float | None = None) -> EPRun | None:
    """One rank's whole run, inside an initialised process group. Returns the gathered EPRun on rank 0.

    Builds the seeded model, broadcasts rank 0's weights (so every rank surely holds the same), optionally runs
    the single-process reference on its own sequences, shards the MoE layers, prefills its sequences and decodes
    `new_tokens` greedily. Every rank makes the same number of forward calls, so the collectives pair up.
    The MoE all_to_alls run in their own group whose collectives give up after `timeout` seconds (None: the
    default group's), so a dead or stuck peer stops this rank with an error instead of a hang.
    """
    cfg = validate(preset, world_size, sequences)
    dev = torch.device(device)
    model = build_model(preset, seed, getattr(torch, dtype) if dtype else None, dev)
    for tensor in model.state_dict().values():
        dist.broadcast(tensor, 0)
    mine = list(_chunks(len(sequences), world_size)[rank])
    tokens = torch.tensor([sequences[i] for i in mine], device=dev)                       # [B_r, T_r]

    def run(m: TinyK3, drill: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> prefill logits [B_r, T_r, V], generated [B_r, new_tokens], last-position logits [steps, B_r, V]."""
        _drill(rank, 0, drill)
        set_step(m, 0)
        logits, cache = m(tokens)
        prefill, out, last = logits, [], [logits[:, -1]]
        for step in range(1, new_tokens):
            out.append(logits[:, -1].argmax(-1))
            _drill(rank, step, drill)
            set_step(m, step)
            logits, cache = m(out[-1][:, None], cache)
            last.append(logits[:, -1])
        out += [logits[:, -1].argmax(-1)] if new_tokens else []
        gen = torch.stack(out, 1) if out else tokens.new_zeros(tokens.shape[0], 0)
        return prefill, gen, torch.stack(last)

    reference = run(model) if check else None
    group = dist.new_group(timeout=datetime.timedelta(seconds=timeout)) if timeout else None
    log = shard_model(model, group)
    logits, generated, last = run(model, fail)
    to_np = lambda t: (t if t.dtype == torch.float64 else t.float()).cpu().numpy()  # noqa: E731
    part = dict(logits=[to_np(x) for x in logits], generated=generated.cpu().numpy(), last=to_np(last), log=log)
    if reference is not None:
        part["max_diff"] = float((logits - reference[0]).abs().max().item())
        part["tokens_equal"] = bool(torch.equal(generated, reference[1]))
    parts = [None] * world_size if rank == 0 else None
    dist.gather_object(part, parts, dst=0)
    if rank != 0:
        return None
    ranks_of = [r for r, chunk in enumerate(_chunks(len(sequences), world_size)) for _ in chunk]
    return EPRun(
        preset=preset, world_size=world_size, backend=dist.get_backend(), sequences=sequences, ranks_of=ranks_of,
        logits=[x for p in parts for x in p["logits"]],
        generated=np.concatenate([p["generated"] for p in parts]).reshape(len(sequences), -1),
        step_logits=np.concatenate([p["last"] for p in parts], axis=1),
        traffic=assemble_traffic([p["log"] for p in parts]),
        max_diff=max(p["max_diff"] for p in parts) if check else None,
        tokens_equal=all(p["tokens_equal"] for p in parts) if check else None,
        info=dict(latent_row_bytes=cfg.latent_dim * model.embed.weight.element_size(),
                  experts_per_rank=cfg.num_experts // world_size, seed=seed, dtype=str(model.embed.weight.dtype)))


def explain(exc: BaseException, timeout: float) -> str:
    """A collective's failure in one sentence."""
    text = str(exc)
    if "timed out" in text.lower() or "timeout" in text.lower():
        waited = re.search(r"(\d+)\s*ms", text)
        waited = int(waited.group(1)) / 1000 if waited else timeout
        return f"a collective timed out after {waited:g} s waiting for another rank (did one die or hang?)"
    if any(s in text for s in ("Connection reset", "Connection closed", "Broken pipe", "Connection refused")):
        return "lost the connection to another rank (it probably died)"
    if "address already in use" in text.lower() or "EADDRINUSE" in text:
        return "could not listen on the rendezvous port: address already in use"
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _spawn_entry(rank: int, world_size: int, init_method: str, backend: str, timeout: float, results, kwargs) -> None:
    """Process body in spawn mode: join the group, run, report to the parent through `results`."""
    torch.set_num_threads(1)  # N ranks share the machine's cores
    if sys.platform.startswith("linux") and backend == "gloo":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # single machine: keep gloo's pairs on loopback
    if backend == "nccl":
        torch.cuda.set_device(rank)
    try:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=max(timeout, SETUP_TIMEOUT)))
        run = ep_worker(rank, world_size, timeout=timeout, **kwargs)
        if rank == 0:
            results.put(("result", rank, run))
    except Exception as exc:  # noqa: BLE001 - reported to the parent as one sentence
        results.put(("error", rank, explain(exc, timeout)))
        sys.exit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _check_port(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise ValueError(f"port {port} on 127.0.0.1 is already in use; pass another port "
                             "(or none, to pick a free one).") from None


def free_port() -> int:
    """A port the OS says is free right now on 127.0.0.1 (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _context():
    """forkserver where the OS has it: one server imports torch once and forks each rank from it, so N ranks
    do not pay N imports of torch (seconds each); plain spawn elsewhere (Windows)."""
    if "forkserver" in torch.multiprocessing.get_all_start_methods():
        ctx = torch.multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch.distributed", "numpy", "tiny_k3"])
        return ctx
    return torch.multiprocessing.get_context("spawn")


def run_expert_parallel(preset: str = "tiny", ranks: int = 2, sequences: list[list[int]] | None = None,
                        new_tokens: int = 0, *, seed: int = 0, dtype: str | None = None, device: str = "cpu",
                        check: bool = False, port: int | None = None, timeout: float = 30.0,
                        fail: tuple | None = None) -> EPRun:
    """Spawn `ranks` processes on this machine (gloo on CPU, NCCL with device="cuda") and run the model EP.

    sequences: token-id lists, dealt to the ranks in contiguous chunks (at least one per rank; one length per
    rank). `timeout` bounds every MoE collective (setup ones get SETUP_TIMEOUT), so a dead or stuck rank stops
    the others; once one rank failed, the parent gives the rest `timeout` + 1 s to report and ends any still
    running. `fail = (rank, step)` or (rank, step, "hang") is a drill: that rank dies (or stalls) at the start
    of that step (0 = prefill). `check` also runs the single-process model on each rank's sequences before
    sharding and reports the largest logit difference. Raises ValueError for bad input and ParallelError when
    a rank fails.
    """
    from tiny_k3.tokenizer import encode

    sequences = sequences if sequences is not None else [encode("expert parallel")] * ranks
    validate(preset, ranks, sequences)
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    if backend == "nccl" and torch.cuda.device_count() < ranks:
        raise ValueError(f"NCCL needs one GPU per rank: {ranks} ranks but {torch.cuda.device_count()} GPUs here; "
                         "use device='cpu' (gloo) or fewer ranks.")
    if port is None:
        port = free_port()
    else:
        _check_port(port)
    kwargs = dict(preset=preset, sequences=sequences, new_tokens=new_tokens, seed=seed, dtype=dtype,
                  device="cuda" if backend == "nccl" else "cpu", check=check, fail=fail)  # cuda = cuda:rank
    ctx = _context()
    results = ctx.Queue()
    procs = [ctx.Process(target=_spawn_entry, daemon=True,
                         args=(r, ranks, f"tcp://127.0.0.1:{port}", backend, timeout, results, kwargs))
             for r in range(ranks)]
    for p in procs:
        p.start()
    messages, run, give_up = {}, None, None
    try:
        while not (all(p.exitcode is not None for p in procs) and results.empty()):
            try:
                kind, rank, payload = results.get(timeout=0.1)
                run, messages = (payload, messages) if kind == "result" else (run, {**messages, rank: payload})
            except queue_mod.Empty:
                pass
            if give_up is None and (messages or any(p.exitcode not in (None, 0) for p in procs)):
                give_up = time.monotonic() + timeout + 1.0   # the rest fail within `timeout` or are stuck
            if give_up is not None and time.monotonic() > give_up:
                for r, p in enumerate(procs):
                    if p.exitcode is None:
                        messages.setdefault(r, "still running after the others failed; stopped by the parent")
                break
    finally:  # also on Ctrl-C in a notebook: no rank outlives the call
        for p in procs:
            if p.exitcode is None:
                p.terminate()
                p.join(5)
            if p.exitcode is None:
                p.kill()
            p.join()
    for r, p in enumerate(procs):
        if p.exitcode not in (0, None) and r not in messages:
            messages[r] = f"died (exit code {p.exitcode})"
    if messages or run is None:
        detail = "; ".join(f"rank {r}: {m}" for r, m in sorted(messages.items())) or "no result came back"
        raise ParallelError(f"the expert-parallel run on {ranks} ranks failed and every rank has stopped: {detail}.")
    return run


# ---------------------------------------------------------------------------- report and CLI


def print_report(run: EPRun, console=None, k3: dict | None = None) -> None:
    """The measured tables (per step and layer, rank x rank) and the measured-vs-analytic comparison."""
    from rich.console import Console
    from rich.table import Table

    from .memory import format_bytes

    console = console or Console()
    N = run.world_size
    t = Table(title=f"measured per step and MoE layer: {N} ranks ({run.backend}), "
                    f"{run.info['experts_per_rank']} experts each")
    for col in ("step", "layer", "tokens", "ranks/tok", "cross bytes", "load per rank", "max/mean"):
        t.add_column(col, justify="right")
    for tr in run.traffic:
        cross = int(tr.bytes.sum() - np.trace(tr.bytes))
        t.add_row("prefill" if tr.step == 0 else str(tr.step), str(tr.layer), str(int(tr.tokens.sum())),
                  f"{tr.destinations:.2f}", format_bytes(cross), "/".join(map(str, tr.load)), f"{tr.imbalance:.2f}")
    console.print(t)
    grids = [Table(title="prefill: " + title + " sent, rank -> rank") for title in ("token copies", "bytes")]
    for grid, what, fmt in zip(grids, ("copies", "bytes"), (str, format_bytes)):
        m = run.step_matrix(0, what)
        grid.add_column("from \\ to")
        for d in range(N):
            grid.add_column(str(d), justify="right")
        for src in range(N):
            grid.add_row(str(src), *(fmt(int(v)) for v in m[src]))
    console.print(*grids)
    k3 = k3 or k3_ep_figures()
    t = Table(title=f"per token per MoE layer: {run.preset} measured, {run.preset} analytic (uniform routing), "
                    f"real K3 on {k3['ep']} GPUs (§6b)")
    for col in ("quantity", "measured", "analytic", f"K3 EP{k3['ep']}"):
        t.add_column(col, justify="right")
    notes = []
    for row in comparison(run, k3):
        fmt = (lambda v: format_bytes(v, 1)) if "bytes" in row["quantity"] else (lambda v: f"{v:.2f}")
        t.add_row(row["quantity"], fmt(row["measured"]), fmt(row["tiny"]), fmt(row["k3"]))
        notes.append(f"  {row['quantity']}: {row['note']}")
    console.print(t)
    console.print("\n".join(notes), highlight=False)
    console.print(f"K3 all-to-all per token per step ({k3['moe_layers']} MoE layers): "
                  f"{format_bytes(k3['per_token_step_per_copy'])} one copy per expert, "
                  f"{format_bytes(k3['per_token_step_per_destination'])} one copy per GPU")
    if run.max_diff is not None:
        console.print(f"check: max |EP - single-process| logit = {run.max_diff:.2e}; generated tokens "
                      f"{'equal' if run.tokens_equal else 'DIFFER'}")


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from tiny_k3.tokenizer import decode, encode

    parser = argparse.ArgumentParser(prog="python -m sim.parallel", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__[__doc__.index("Run it:"):])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--ranks", type=int, default=None, help="processes to spawn (default 2; torchrun sets it)")
    parser.add_argument("--prompt", action="append", default=None,
                        help="one request per rank, dealt round-robin; repeat for several (default: four prompts)")
    parser.add_argument("--tokens", type=int, default=4, help="tokens to decode after the prompt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default=None, choices=("float32", "float64"))
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, one GPU per rank)")
    parser.add_argument("--port", type=int, default=None, help="rendezvous port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds a MoE collective may wait")
    parser.add_argument("--no-check", action="store_true", help="skip the single-process comparison")
    parser.add_argument("--fail-rank", type=int, default=None, help="drill: this rank dies (or hangs) ...")
    parser.add_argument("--fail-step", type=int, default=1, help="... at the start of this step (0 = prefill)")
    parser.add_argument("--hang", action="store_true", help="drill: the --fail-rank stalls instead of dying")
    args = parser.parse_args(argv)
    console = Console()
    prompts = args.prompt or [DEFAULT_PROMPT, "The experts live on", "all_to_all", "K3 on 64 GPUs"]
    fail = None if args.fail_rank is None else (args.fail_rank, args.fail_step) + (("hang",) if args.hang else ())
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    try:
        ranks = int(os.environ["WORLD_SIZE"]) if torchrun else (args.ranks or 2)
        if torchrun and args.ranks not in (None, ranks):
            raise ValueError(f"--ranks {args.ranks} disagrees with torchrun's WORLD_SIZE {ranks}; leave --ranks out.")
        sequences = [encode(prompts[r % len(prompts)]) for r in range(ranks)]
        common = dict(new_tokens=args.tokens, seed=args.seed, dtype=args.dtype, check=not args.no_check, fail=fail)
        if torchrun:
            run = _torchrun(args.preset, ranks, sequences, args.device, args.timeout, common)
            if run is None:
                return 0
        else:
            run = run_expert_parallel(args.preset, ranks, sequences, device=args.device, port=args.port,
                                      timeout=args.timeout, **common)
    except (ValueError, ParallelError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 1
    print_report(run, console)
    for seq, gen, r in zip(run.sequences, run.generated, run.ranks_of):
        console.print(f"rank {r}: {decode(seq)!r} -> {decode(gen.tolist())!r}")
    return 0


def _torchrun(preset, ranks, sequences, device, timeout, common) -> EPRun | None:
    """torchrun mode: the env:// rendezvous torchrun set up (RANK, WORLD_SIZE, MASTER_ADDR/PORT, LOCAL_RANK)."""
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", ranks))))
    validate(preset, ranks, sequences)
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=max(timeout, SETUP_TIMEOUT)))
    try:
        return ep_worker(rank, ranks, preset, sequences, device=f"cuda:{local}" if backend == "nccl" else "cpu",
                         timeout=timeout, **common)
    except RuntimeError as exc:
        raise ParallelError(f"rank {rank}: {explain(exc, timeout)}.") from None
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
