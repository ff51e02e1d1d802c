"""One rank's run: build the model, shard its experts, serve this rank's sequences, gather the results.

Attention is data parallel (the "DEP" shape of k3_facts.md §6a, TRT-LLM's DEP16): each rank serves its own
sequences end to end and meets the others only inside the MoE sublayers. Every rank makes the same number
of forward calls, so the collectives pair up.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from tiny_k3 import K3Config, TinyK3, load_model

from .sharded import expert_range, set_step, shard_model
from .traffic import EPRun, assemble_traffic


def build_model(preset: str, seed: int = 0, dtype: torch.dtype | None = None, device="cpu") -> TinyK3:
    """The model every rank starts from (and the single-process reference): seeded random weights."""
    model = load_model(preset, "random", seed, device).model
    return model.to(dtype) if dtype is not None else model


def rank_sequences(n_seq: int, world_size: int) -> list[range]:
    """Which sequences each rank serves: contiguous chunks, rank r gets chunk r."""
    bounds = np.linspace(0, n_seq, world_size + 1).round().astype(int)
    return [range(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def check_run_inputs(preset: str, world_size: int, sequences: list[list[int]]) -> K3Config:
    """The preset's config, or one clear ValueError for input an expert-parallel run cannot take."""
    cfg = K3Config.preset(preset)
    expert_range(cfg.num_experts, world_size, 0)
    if len(sequences) < world_size:
        raise ValueError(f"{len(sequences)} sequences cannot feed {world_size} ranks; give at least one per rank.")
    for r, chunk in enumerate(rank_sequences(len(sequences), world_size)):
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
    print(f"rank {rank}: {'hanging' if hang else 'dying'} on purpose at step {step} (drill)", file=sys.stderr, flush=True)
    if hang:
        time.sleep(1e6)
    os._exit(3)


class Served(NamedTuple):
    """One rank's greedy run: prefill logits [B_r, T_r, V], generated [B_r, new_tokens], last-position
    logits of every forward [steps, B_r, V]."""

    prefill: torch.Tensor
    generated: torch.Tensor
    last: torch.Tensor


def serve(model: TinyK3, tokens: torch.Tensor, new_tokens: int, rank: int, fail: tuple | None = None) -> Served:
    """Prefill `tokens` [B_r, T_r], then decode greedily; the step is stamped on every sharded MoE's log."""
    _drill(rank, 0, fail)
    set_step(model, 0)
    logits, cache = model(tokens)
    prefill, out, last = logits, [], [logits[:, -1]]
    for step in range(1, new_tokens):
        out.append(logits[:, -1].argmax(-1))
        _drill(rank, step, fail)
        set_step(model, step)
        logits, cache = model(out[-1][:, None], cache)
        last.append(logits[:, -1])
    out += [logits[:, -1].argmax(-1)] if new_tokens else []
    generated = torch.stack(out, 1) if out else tokens.new_zeros(tokens.shape[0], 0)
    return Served(prefill, generated, torch.stack(last))


@torch.no_grad()
def ep_worker(rank: int, world_size: int, preset: str, sequences: list[list[int]], new_tokens: int = 0,
              seed: int = 0, dtype: str | None = None, device: str = "cpu", check: bool = False,
              fail: tuple | None = None, timeout: float | None = None) -> EPRun | None:
    """One rank's whole run, inside an initialised process group. Returns the gathered EPRun on rank 0.

    All ranks build the same seeded model (rank 0's weights are broadcast to be sure), serve their chunk of
    `sequences` and decode `new_tokens` greedily. The MoE all_to_alls run in their own group whose collectives
    give up after `timeout` seconds (None: the default group's), so a dead or stuck peer stops this rank with
    an error instead of a hang. `check` first serves the same tokens with the unsharded model.
    """
    cfg = check_run_inputs(preset, world_size, sequences)
    dev = torch.device(device)
    model = build_model(preset, seed, getattr(torch, dtype) if dtype else None, dev)
    for tensor in model.state_dict().values():
        dist.broadcast(tensor, 0)
    mine = list(rank_sequences(len(sequences), world_size)[rank])
    tokens = torch.tensor([sequences[i] for i in mine], device=dev)                       # [B_r, T_r]
    reference = serve(model, tokens, new_tokens, rank) if check else None
    group = dist.new_group(timeout=datetime.timedelta(seconds=timeout)) if timeout else None
    log = shard_model(model, group)
    served = serve(model, tokens, new_tokens, rank, fail)

    def to_np(t: torch.Tensor) -> np.ndarray:
        return (t if t.dtype == torch.float64 else t.float()).cpu().numpy()

    part = dict(logits=[to_np(x) for x in served.prefill], generated=served.generated.cpu().numpy(),
                last=to_np(served.last), log=log)
    if reference is not None:
        part["max_diff"] = float((served.prefill - reference.prefill).abs().max().item())
        part["tokens_equal"] = bool(torch.equal(served.generated, reference.generated))
    parts = [None] * world_size if rank == 0 else None
    dist.gather_object(part, parts, dst=0)
    if rank != 0:
        return None
    info = dict(latent_row_bytes=cfg.latent_dim * model.embed.weight.element_size(),
                experts_per_rank=len(expert_range(cfg.num_experts, world_size, 0)), seed=seed,
                dtype=str(model.embed.weight.dtype))
    return _gathered_run(preset, world_size, sequences, parts, check, info)


def _gathered_run(preset: str, world_size: int, sequences: list[list[int]], parts: list[dict], check: bool,
                  info: dict) -> EPRun:
    """Rank 0: every rank's part (rank order) -> one EPRun in sequence order."""
    ranks_of = [r for r, chunk in enumerate(rank_sequences(len(sequences), world_size)) for _ in chunk]
    return EPRun(
        preset=preset, world_size=world_size, backend=dist.get_backend(), sequences=sequences, ranks_of=ranks_of,
        logits=[x for p in parts for x in p["logits"]],
        generated=np.concatenate([p["generated"] for p in parts]).reshape(len(sequences), -1),
        step_logits=np.concatenate([p["last"] for p in parts], axis=1),
        traffic=assemble_traffic([p["log"] for p in parts]),
        max_diff=max(p["max_diff"] for p in parts) if check else None,
        tokens_equal=all(p["tokens_equal"] for p in parts) if check else None,
        info=info)
