"""What changed between two presets, part by part: `python -m tiny_k3 diff k2 k3` (docs/lineage.md).

Every number is read off the real modules on the meta device, as `parameter_counts` is: parameters from
`parameter_breakdown`, and the decode cache from one MLA and one KDA layer run on a meta token (the
shapes of the tensors they would keep, never a formula). sim.memory's analytic bytes must agree.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import torch

from .config import K3Config
from .params import parameter_breakdown, parameter_counts


class CacheSize(NamedTuple):
    """Decode cache of one sequence: what grows per token (MLA latents) and what is fixed (KDA states)."""

    kv_per_token: int      # bytes added per token, all MLA layers together
    state: int             # bytes of all KDA states + conv tails, constant from the first token


class PartDiff(NamedTuple):
    """One row of a diff: a part of the model described in A and in B, and its size in each.

    unit is "params", "bytes" or "" (a part without a size of its own, such as the activation).
    """

    part: str
    before: str
    after: str
    size_before: int = 0
    size_after: int = 0
    unit: str = ""

    @property
    def changed(self) -> bool:
        return self.before != self.after or self.size_before != self.size_after

    @property
    def delta(self) -> int:
        return self.size_after - self.size_before


@lru_cache(maxsize=32)
def cache_size(config: K3Config) -> CacheSize:
    """Measured on the meta device: the cache one MLA and one KDA layer keep after one token, times their count."""
    from .kda import KDALayer
    from .mla import GatedMLA

    dtype = getattr(torch, config.dtype)
    x = torch.empty(1, 1, config.hidden_size, device="meta", dtype=dtype)
    with torch.no_grad():
        mla = GatedMLA(config, device="meta", dtype=dtype)(x)[1].nbytes() if config.mla_layers else 0
        kda = KDALayer(config, device="meta", dtype=dtype)(x)[1].nbytes() if config.kda_layers else 0
    return CacheSize(kv_per_token=len(config.mla_layers) * mla, state=len(config.kda_layers) * kda)


def _schedule(c: K3Config) -> str:
    kinds = [f"{len(c.kda_layers)} KDA"] * bool(c.kda_layers) + [f"{len(c.mla_layers)} MLA"] * bool(c.mla_layers)
    return f"{c.num_layers} layers: " + " + ".join(kinds)


def _kda(c: K3Config) -> str:
    if not c.kda_layers:
        return "none"
    decay = ("bounded g in (" + f"{c.kda_gate_lower_bound:g}" + ", 0)" if c.kda_gate_lower_bound is not None
             else "unbounded g = -exp(A) softplus")
    gate = "full rank" if c.kda_output_gate_rank is None else f"rank {c.kda_output_gate_rank}"
    return (f"{c.kda_heads} heads x {c.kda_head_dim}, decay gate rank {c.kda_gate_rank} ({decay}), "
            f"output gate {gate}, conv {c.kda_conv_kernel}")


def _mla(c: K3Config) -> str:
    if not c.mla_layers:
        return "none"
    q = "q full" if c.q_lora_rank is None else f"q latent {c.q_lora_rank}"
    pos = f"RoPE on {c.qk_rope_dim} (theta {c.rope_theta:g})" if c.mla_rope else "NoPE"
    gate = "output gate" if c.mla_output_gate else "no output gate"
    return f"{c.mla_heads} heads, {q}, kv latent {c.kv_lora_rank} + {c.qk_rope_dim} shared key, {pos}, {gate}"


def _moe(c: K3Config) -> str:
    width = (f"latent {c.hidden_size}->{c.latent_dim} + norm" if c.moe_kind == "latent"
             else f"plain (experts at width {c.hidden_size})")
    return f"{width}, {c.num_experts} experts top-{c.top_k} ({c.num_experts / c.top_k:g}:1), expert width {c.moe_intermediate}"


def _act(c: K3Config) -> str:
    return f"SiTU-GLU (caps {c.situ_beta_gate:g}, {c.situ_beta_up:g})" if c.mlp_act == "situ" else "SwiGLU"


def _residual(c: K3Config) -> str:
    if c.residual == "standard":
        return "standard (x += f(x))"
    return "Full AttnRes" if c.residual == "full" else f"Block AttnRes ({c.attnres_block_size} sublayers a block)"


def describe(config: K3Config) -> list[PartDiff]:
    """The parts of one preset (before == after): what `diff` compares."""
    return diff(config, config)


def diff(a: K3Config, b: K3Config) -> list[PartDiff]:
    """Part by part from A to B: attention kinds and counts, each attention, MoE, routing, shared experts,
    activation, dense layers, residual, vocabulary, totals and the decode cache (bytes per token / sequence)."""
    pa, pb = parameter_breakdown(a), parameter_breakdown(b)
    (ta, aa), (tb, ab) = parameter_counts(a), parameter_counts(b)
    ca, cb = cache_size(a), cache_size(b)

    def row(part: str, describe_fn, *parts: str, unit: str = "params") -> PartDiff:
        size = (lambda p: sum(p[name] for name in parts)) if parts else (lambda p: 0)
        return PartDiff(part, describe_fn(a), describe_fn(b), size(pa), size(pb), unit if parts else "")

    return [
        row("attention layers", _schedule),
        row("KDA", _kda, "kda"),
        row("MLA", _mla, "mla"),
        row("MoE", _moe, "routed_experts", "latent_proj"),
        row("routing", lambda c: f"sigmoid + selection bias, top-{c.top_k}, scaling {c.routed_scaling:g}"
                                 f"{', renormalised' if c.renormalize else ''}", "router"),
        row("shared experts", lambda c: f"{c.num_shared_experts} x width {c.shared_intermediate}", "shared_experts"),
        row("activation", _act),
        row("dense layers", lambda c: f"first {c.first_k_dense}, width {c.dense_intermediate}", "dense_mlp"),
        row("residual (+ norms)", _residual, "norms_attnres"),
        row("vocabulary", lambda c: f"{c.vocab_size:,} x {c.hidden_size} (embedding + head)", "embedding", "lm_head"),
        PartDiff("total parameters", f"{ta:,}", f"{tb:,}", ta, tb, "params"),
        PartDiff("active per token", f"{aa:,}", f"{ab:,}", aa, ab, "params"),
        PartDiff("KV cache per token", f"{ca.kv_per_token:,} B ({len(a.mla_layers)} MLA x {a.mla_cache_width} "
                 f"x {a.dtype_bytes} B)", f"{cb.kv_per_token:,} B ({len(b.mla_layers)} MLA x {b.mla_cache_width} "
                 f"x {b.dtype_bytes} B)", ca.kv_per_token, cb.kv_per_token, "bytes"),
        PartDiff("KDA state per sequence", f"{ca.state:,} B", f"{cb.state:,} B", ca.state, cb.state, "bytes"),
    ]
