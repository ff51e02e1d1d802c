"""Serving economics of a K3-style model: weight bytes by format, FLOPs, decode time, GPUs, prices.

Every figure cites the section of docs/k3_facts.md it comes from. Parameter counts
come from `tiny_k3.parameter_breakdown` (the real modules on the meta device), never a hand
formula -- K2 and Kimi Linear included: they are the `k2` and `kimi-linear-48b` presets (docs/lineage.md).
Bytes are decimal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np
from tiny_k3 import K3Config, parameter_breakdown, parameter_counts

from .memory import MIB_CONTEXT, cache_bytes, kv_bytes_per_token, state_bytes_fixed

# ---------------------------------------------------------------------------- formats (k3_facts.md §4)

# Block formats: `block` values share one scale. MXFP4 (OCP MX): 32 E2M1 values (16 B) + one E8M0 scale
# (1 B) = 17 B per 32 values = 4.25 bit. INT4 as in K2-Thinking: W4A16, group 32, one BF16 scale per
# group = 18 B per 32 values = 4.5 bit (k3_facts.md §4).
MX_BLOCK = 32       # OCP MX: values sharing one 1-byte E8M0 scale (MXFP4 weights, MXFP8 dispatch)
INT4_GROUP = 32     # K2-Thinking's INT4 quantisation group
BLOCK_FORMATS = {"mxfp4": (MX_BLOCK, 16, 1), "int4": (INT4_GROUP, 16, 2)}  # name: (values per block, data B, scale B)
ELEMENT_BYTES = {"bf16": 2, "fp8": 1}  # FP8 without block scales (DeepSeek's 128x128 fp32 scales add ~0.02%)

# scheme: (format of the routed experts, format of everything else)
SCHEMES = {
    "bf16": ("bf16", "bf16"),
    "fp8": ("fp8", "fp8"),
    "int4": ("int4", "int4"),
    "mxfp4": ("mxfp4", "mxfp4"),
    "k3-release": ("mxfp4", "bf16"),    # K3's checkpoint: MXFP4 routed experts only (k3_facts.md §1, §4)
    "int4-experts": ("int4", "bf16"),   # K2-Thinking's checkpoint: INT4 routed experts, BF16 rest (§4)
}


def _scheme(scheme: str) -> tuple[str, str]:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown weight scheme {scheme!r}; valid schemes are: {', '.join(SCHEMES)}.")
    return SCHEMES[scheme]


def packed_bytes(shape, fmt: str) -> int:
    """Bytes of one tensor stored in `fmt`. shape: a tuple, or an int (a flat vector of that many values).

    Block formats pack each row (the last dimension) in blocks of 32, padding the last block of a row:
    a [R, C] tensor costs R * ceil(C / 32) blocks. With C a multiple of 32 that is exactly 4.25 bit
    (mxfp4) or 4.5 bit (int4) per value.
    """
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    numel = math.prod(shape)
    if fmt in ELEMENT_BYTES:
        return numel * ELEMENT_BYTES[fmt]
    if fmt not in BLOCK_FORMATS:
        raise ValueError(f"unknown number format {fmt!r}; valid formats are: {', '.join([*ELEMENT_BYTES, *BLOCK_FORMATS])}.")
    if numel == 0:
        return 0
    block, data, scale = BLOCK_FORMATS[fmt]
    rows, cols = numel // shape[-1], shape[-1]
    return rows * -(-cols // block) * (data + scale)


def mxfp4_bytes(shape) -> int:
    """MXFP4 bytes of a tensor: 17 B per block of 32 values along each row (k3_facts.md §4)."""
    return packed_bytes(shape, "mxfp4")


def mxfp8_row_bytes(width: int) -> int:
    """One activation row sent as MXFP8: 1 B per value + one E8M0 scale per MX_BLOCK values (§6b)."""
    return width + -(-width // MX_BLOCK)


@lru_cache(maxsize=32)
def _parts(config: K3Config) -> dict[str, int]:
    parts = dict(parameter_breakdown(config))
    missing = {"routed_experts", "embedding"} - set(parts)
    if missing:
        raise ValueError(f"parameter_breakdown lacks the parts {sorted(missing)}; it must name routed experts and embedding.")
    return parts


def weight_bytes(config: K3Config, scheme: str) -> int:
    """Bytes of all weights of `config` stored as `scheme` (one of SCHEMES).

    Blocks of 32 are counted over each part's flat parameter count (the routed experts as one
    part, everything else as another). For K3 every expert row (3584, 3072) is a multiple of 32,
    so this equals per-row packing; a tiny preset with rows shorter than 32 would pad more in a
    real packer. K3: bf16 5.56 TB; mxfp4 1.477 TB; k3-release 1.446 + 0.113 = 1.560 TB (§1d, §4).
    """
    expert_fmt, rest_fmt = _scheme(scheme)
    parts = _parts(config)
    routed = parts["routed_experts"]
    rest = sum(parts.values()) - routed
    return packed_bytes(routed, expert_fmt) + packed_bytes(rest, rest_fmt)


def total_parameters(config: K3Config) -> int:
    return parameter_counts(config)[0]


def active_parameters(config: K3Config) -> int:
    """Parameters one token touches: non-expert weights except the input embedding + top_k experts
    per MoE layer. K3: 104.2B (k3_facts.md §1d)."""
    return parameter_counts(config)[1]


def flops_per_token(config: K3Config, context: int = 0) -> float:
    """Decode FLOPs for one token at `context` tokens already cached.

    = 2 * active parameters                                    (one multiply-add per weight)
    + per MLA layer 2 * H * T * (2 * kv_lora + rope)           (absorbed MLA: q.[c, k_r] scores over T
                                                                 cached rows, then probs . c)
    + per KDA layer 7 * H * K * V                              (decay S, k^T S, rank-1 update, S^T q;
                                                                 independent of T)
    """
    c = config
    if context < 0:
        raise ValueError(f"context must be 0 or more tokens, got {context}.")
    mla = 2 * c.mla_heads * context * (2 * c.kv_lora_rank + c.qk_rope_dim)
    kda = 7 * c.kda_heads * c.kda_head_dim ** 2
    return 2.0 * active_parameters(c) + len(c.mla_layers) * mla + len(c.kda_layers) * kda


# ---------------------------------------------------------------------------- decode-time model (§5b)


@dataclass(frozen=True)
class ServingModel:
    """What one decode step reads, for the bandwidth model of k3_facts.md §5b."""

    name: str
    moe_layers: int           # n_moe
    num_experts: int          # N
    top_k: int                # k
    expert_bytes: int         # w_expert: bytes of one routed expert
    dense_bytes: int          # W_dense: non-expert bytes read per step (all but the input embedding)
    kv_bytes_per_token: int   # L_full * 576 * b for K3
    state_bytes: int          # S_kda per sequence (state + conv tail), read and written every step
    weight_bytes: int         # all weights stored (for memory, not for the step)


def serving_model(config: K3Config, scheme: str = "k3-release", kv_config: K3Config | None = None,
                  name: str | None = None) -> ServingModel:
    """The step-time description of `config` in `scheme`; caches from `kv_config` (default: config).

    §5b's "K3-all-MLA" row is `serving_model(k3, kv_config=k3.twin())`: K3's weights with 93 MLA caches.
    """
    expert_fmt, rest_fmt = _scheme(scheme)
    parts = _parts(config)
    n_moe = len(config.moe_layers)
    per_expert = parts["routed_experts"] // (n_moe * config.num_experts) if n_moe else 0
    non_expert = sum(parts.values()) - parts["routed_experts"]
    kv_cfg = kv_config or config
    return ServingModel(
        name=name or config.name, moe_layers=n_moe, num_experts=config.num_experts, top_k=config.top_k,
        expert_bytes=packed_bytes(per_expert, expert_fmt),
        dense_bytes=packed_bytes(non_expert - parts["embedding"], rest_fmt),
        kv_bytes_per_token=kv_bytes_per_token(kv_cfg), state_bytes=state_bytes_fixed(kv_cfg).total,
        weight_bytes=weight_bytes(config, scheme),
    )


# K2 and Kimi Linear are presets of the same config language (tiny_k3/config.py, docs/lineage.md), counted on the
# meta device like K3. `K2` keeps the handful of K2 numbers lesson 1 prints, read off the preset.
K2_CONFIG = K3Config.preset("k2")
K2 = dict(d=K2_CONFIG.hidden_size, layers=K2_CONFIG.num_layers, dense=K2_CONFIG.first_k_dense,
          experts=K2_CONFIG.num_experts, top_k=K2_CONFIG.top_k, moe_inter=K2_CONFIG.moe_intermediate,
          shared=K2_CONFIG.num_shared_experts, dense_inter=K2_CONFIG.dense_intermediate, heads=K2_CONFIG.mla_heads,
          q_lora=K2_CONFIG.q_lora_rank, kv_lora=K2_CONFIG.kv_lora_rank, nope=K2_CONFIG.qk_nope_dim,
          rope=K2_CONFIG.qk_rope_dim, v=K2_CONFIG.v_head_dim, vocab=K2_CONFIG.vocab_size)


def k2_parameters() -> tuple[int, int]:
    """(routed expert params, all other params) of Kimi K2, from the `k2` preset: 1014.7B and 11.7B (total
    1.0264T, k3_facts.md §3a; the published "1T total" rounds it)."""
    parts = _parts(K2_CONFIG)
    return parts["routed_experts"], sum(parts.values()) - parts["routed_experts"]


def k2_serving_model() -> ServingModel:
    """K2 as §5b reads it: K2-Thinking's INT4 experts + BF16 rest, 61 MLA caches of 576 bf16 values (70,272 B
    a token). The weights are 594.2 GB: K2-Thinking's checkpoint (k3_facts.md §0, §4)."""
    return serving_model(K2_CONFIG, "int4-experts", name="K2")


def expected_experts_touched(num_experts: int, top_k: int, batch: int) -> float:
    """Distinct experts a batch of B tokens touches per layer under uniform routing: N(1-(1-k/N)^B) (§5b)."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** batch)


def decode_step_bytes(model: ServingModel, batch: int, context: int) -> dict[str, float]:
    """Bytes read in one decode step of `batch` sequences at `context` tokens each (§5b numerator)."""
    if batch < 1 or context < 0:
        raise ValueError(f"batch must be at least 1 and context 0 or more, got batch={batch}, context={context}.")
    touched = expected_experts_touched(model.num_experts, model.top_k, batch)
    return {
        "dense": float(model.dense_bytes),
        "experts": model.moe_layers * touched * model.expert_bytes,
        "kv": float(batch * model.kv_bytes_per_token * context),
        "state": float(batch * 2 * model.state_bytes),   # the KDA state is read and written back
    }


def decode_step_time(model: ServingModel | K3Config, batch: int = 1, context: int = 4096, *, gpus: int = 64,
                     bandwidth: float = 4.8e12, eta: float = 0.7,
                     eta_attn_full: float | Callable[[int], float] | None = None, t_comm: float = 0.0) -> float:
    """Seconds per decode step (= per-token latency), bandwidth bound (k3_facts.md §5b):

        t = [W_dense + n_moe N (1-(1-k/N)^B) w_expert + 2 B S_kda] / (G BW eta)
            + B L_full 576 b T / (G BW eta_attn_full(T)) + t_comm

    Defaults: G = 64 GPUs, BW = 4.8 TB/s (H200-class), eta = 0.7, no communication (§5b's table).
    eta_attn_full (a number or a function of T; default eta) is the full-attention kernel's efficiency:
    set it below eta to show implementation effects (§5b). It slows hybrid and twin alike, so the twin/hybrid
    ratio can approach but never pass the pure-KV ceiling L/L_full (K3: 93/24 = 3.9x) -- not the 6.3x measured.
    """
    if isinstance(model, K3Config):
        model = serving_model(model)
    if gpus < 1 or bandwidth <= 0 or not 0 < eta <= 1:
        raise ValueError(f"need gpus >= 1, bandwidth > 0 and 0 < eta <= 1; got {gpus}, {bandwidth}, {eta}.")
    eta_attn = eta if eta_attn_full is None else (eta_attn_full(context) if callable(eta_attn_full) else eta_attn_full)
    if not 0 < eta_attn <= 1:
        raise ValueError(f"eta_attn_full must lie in (0, 1], got {eta_attn}.")
    b = decode_step_bytes(model, batch, context)
    rate = gpus * bandwidth
    return (b["dense"] + b["experts"] + b["state"]) / (rate * eta) + b["kv"] / (rate * eta_attn) + t_comm


def kv_only_limit(model: ServingModel, other: ServingModel, context: int = MIB_CONTEXT) -> float:
    """t(other)/t(model) when cache traffic dominates (B -> infinity): (KV+2S of other) / (KV+2S of model)."""
    per_seq = lambda m: m.kv_bytes_per_token * context + 2 * m.state_bytes  # noqa: E731
    return per_seq(other) / per_seq(model)


# ---------------------------------------------------------------------------- GPUs (§5a, §6a) and prices (§1)

# GPU memory in bytes. H100 80 GB and H200 141 GB are vendor specs (8xH100 = 640 GB, §0); B300 288 GB is
# the vendor spec k3_facts.md §5a assumes.
GPU_MEMORY = {"H100": 80e9, "H200": 141e9, "B300": 288e9}


def gpus_needed(config: K3Config, gpu_memory_bytes: float, scheme: str = "k3-release", kv_tokens: int = 0,
                overhead: float = 0.1) -> int:
    """GPUs of `gpu_memory_bytes` each needed to hold all weights + the cache of `kv_tokens` tokens.

    Ideal sharding (weights and cache spread evenly, nothing replicated); `overhead` is the fraction of
    each GPU kept for activations, workspace and the runtime. K3 release (1.56 TB): H100 -> 22, H200 -> 13,
    B300 -> 7 with the default 10% (k3_facts.md §0, §6a: 8xB300 fits, 8xH100 and 8xH200 do not).
    """
    if gpu_memory_bytes <= 0 or not 0 <= overhead < 1:
        raise ValueError(f"gpu_memory_bytes must be positive and overhead in [0, 1); got {gpu_memory_bytes}, {overhead}.")
    need = weight_bytes(config, scheme) + sum(cache_bytes(config, kv_tokens))
    return max(1, math.ceil(need / (gpu_memory_bytes * (1.0 - overhead))))


# $ per 1M tokens (k3_facts.md §1, S11/S12/S13): input cache hit, input cache miss, output.
K3_PRICES = {"cache_hit": 0.30, "input": 3.00, "output": 15.00}


def api_price(input_tokens: int, output_tokens: int, cached_tokens: int = 0, prices: dict = K3_PRICES) -> float:
    """Dollars for one request. `cached_tokens` are the part of `input_tokens` that hit the prefix cache."""
    if min(input_tokens, output_tokens, cached_tokens) < 0 or cached_tokens > input_tokens:
        raise ValueError(f"token counts must be 0 or more with cached_tokens <= input_tokens; got input={input_tokens}, "
                         f"output={output_tokens}, cached={cached_tokens}.")
    return (cached_tokens * prices["cache_hit"] + (input_tokens - cached_tokens) * prices["input"]
            + output_tokens * prices["output"]) / 1e6


# ---------------------------------------------------------------------------- expert-parallel traffic (§6b)


def expected_destinations(ep: int, top_k: int) -> float:
    """GPUs one token's k experts land on under uniform routing: EP(1-(1-1/EP)^k). K3 EP64, k16: 14.3."""
    if ep < 1 or top_k < 1:
        raise ValueError(f"ep and top_k must be at least 1, got ep={ep}, top_k={top_k}.")
    return ep * (1.0 - (1.0 - 1.0 / ep) ** top_k)


@dataclass(frozen=True)
class EPTraffic:
    """All-to-all bytes per token (k3_facts.md §6b). dispatch: FP8/MXFP8 values + one 1-B scale per 32;
    combine: BF16. Per MoE layer, counted per routed copy (k of them); `destinations` is what a kernel
    that sends one copy per GPU pays for instead."""

    d_route: int
    top_k: int
    ep: int
    moe_layers: int
    dispatch: int        # bytes per token per MoE layer
    combine: int
    destinations: float  # expected distinct GPUs per token
    cross_gpu_fraction: float

    @property
    def per_layer(self) -> int:
        return self.dispatch + self.combine

    @property
    def per_token(self) -> int:
        """Dispatch + combine over all MoE layers (K3: 92 x 173.8 KB = 16.0 MB)."""
        return self.per_layer * self.moe_layers


def ep_traffic(d_route: int, top_k: int, ep: int = 1, moe_layers: int = 1) -> EPTraffic:
    """Per-token EP traffic for a model that dispatches `d_route`-wide activations to `top_k` experts."""
    if d_route < 1 or top_k < 1 or ep < 1 or moe_layers < 0:
        raise ValueError(f"d_route, top_k and ep must be at least 1 and moe_layers 0 or more; got "
                         f"{d_route}, {top_k}, {ep}, {moe_layers}.")
    return EPTraffic(d_route=d_route, top_k=top_k, ep=ep, moe_layers=moe_layers,
                     dispatch=top_k * mxfp8_row_bytes(d_route), combine=top_k * d_route * ELEMENT_BYTES["bf16"],
                     destinations=expected_destinations(ep, top_k), cross_gpu_fraction=1.0 - 1.0 / ep)


def ep_traffic_for(config: K3Config, ep: int = 64) -> EPTraffic:
    """A config's EP traffic: latent MoE dispatches in the latent width (K3: 3584, §1c), a plain MoE in the
    hidden width (K2: 7168)."""
    d_route = config.latent_dim if config.moe_kind == "latent" else config.hidden_size
    return ep_traffic(d_route, config.top_k, ep, len(config.moe_layers))


def experts_per_rank(num_experts: int, ranks: int) -> int:
    """E / N experts on each of `ranks` GPUs or processes; one clear error unless N divides E."""
    if ranks < 1 or num_experts % ranks:
        valid = [n for n in range(1, num_experts + 1) if num_experts % n == 0]
        raise ValueError(f"{ranks} ranks do not divide the {num_experts} experts evenly; "
                         f"use one of {', '.join(map(str, valid))} ranks.")
    return num_experts // ranks


def load_imbalance(num_experts: int, top_k: int, ep: int, batch: int, samples: int = 1 << 14,
                   seed: int = 0) -> float:
    """E[max/mean rank load] when `batch` tokens each pick `top_k` distinct experts uniformly (Monte-Carlo).

    Rank load = (token, expert) pairs on it, experts dealt in blocks of E/EP. A token's k picks are drawn rank
    by rank without replacement (rank g with probability = its experts not yet picked / all not yet picked),
    which is exact and needs only [tokens, EP] arrays. About `samples` tokens in all (at least 8 batches).
    K3 EP64 (k3_facts.md §6b): B=16 2.34, B=128 1.42, B=1024 1.15.
    """
    per = experts_per_rank(num_experts, ep)
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
    (what DeepEP-style kernels and sim.parallel do): expected EP(1 - (1 - 1/EP)^k) = 14.3 of 16 at EP64.
    """
    figures = _k3_ep_figures(ep, tuple(batches), samples)
    return {**figures, "imbalance": dict(figures["imbalance"])}


@lru_cache(maxsize=8)
def _k3_ep_figures(ep: int, batches: tuple[int, ...], samples: int) -> dict:
    k3 = K3Config.preset("k3")
    t = ep_traffic_for(k3, ep)
    dest = expected_destinations(ep, k3.top_k)
    row_fp8, row_bf16 = mxfp8_row_bytes(k3.latent_dim), ELEMENT_BYTES["bf16"] * k3.latent_dim
    return dict(
        ep=ep, num_experts=k3.num_experts, top_k=k3.top_k, latent_dim=k3.latent_dim,
        experts_per_gpu=experts_per_rank(k3.num_experts, ep),
        moe_layers=t.moe_layers, destinations=dest, cross_gpu_fraction=t.cross_gpu_fraction,
        dispatch_per_copy=t.dispatch, combine_per_copy=t.combine, per_token_step_per_copy=t.per_token,
        dispatch_per_destination=dest * row_fp8, combine_per_destination=dest * row_bf16,
        per_token_step_per_destination=dest * (row_fp8 + row_bf16) * t.moe_layers,
        imbalance={b: load_imbalance(k3.num_experts, k3.top_k, ep, b, samples) for b in batches},
    )


# ---------------------------------------------------------------------------- corrections (§0)

# Kimi Linear 48B-A3B (k3_facts.md §3a, S16/S17; the `kimi-linear-48b` preset): 27 layers, MLA at 4,8,...,24 and 27,
# KDA 32 x 128, conv 4, bf16 weights and cache; 3.1B active params -> 6.2 GB of bf16 weights read per token at B=1.
KIMI_LINEAR = K3Config.preset("kimi-linear-48b")
KIMI_LINEAR_TPOT_MS = {"full-MLA": 11.48, "Kimi Linear": 1.84}  # at 1M context (S16, S34)


def kimi_linear_kv_only_limit(context: int = MIB_CONTEXT) -> float:
    """Kimi Linear's twin/hybrid cache traffic per sequence at `context` (§5b: 3.8x)."""
    twin = kv_bytes_per_token(KIMI_LINEAR.twin()) * context
    return twin / (kv_bytes_per_token(KIMI_LINEAR) * context + 2 * state_bytes_fixed(KIMI_LINEAR).total)
