"""Decode-cache bytes: the analytic count, and its projection to the real K3 at 1M tokens.

What a sequence keeps between tokens (k3_facts.md §5a; tiny_k3/cache.py holds the live tensors):

* every gated-MLA layer caches, per token, the latent c (kv_lora_rank) and the shared key part
  (qk_rope_dim) in cfg.dtype -> grows linearly with the context;
* every KDA layer keeps a fixed state S [H, K, V] in float32 plus the short-convolution tail
  [W-1, 2*H*K + H*V] in cfg.dtype -> constant, present from the first token on;
* the twin's MLA layers that keep KDA's short convolution (K3Config.mla_conv_layers) keep its tail too,
  [W-1, kv_lora_rank + qk_rope_dim + q width] in cfg.dtype -> constant, counted with the states.

`cache_bytes` must equal `ModelCache.kv_bytes()` / `state_bytes()` measured on the live model for
every preset (tests/test_memory_costs.py checks it). All byte units here are decimal (1 GB = 1e9 B),
as in k3_facts.md.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import lru_cache

from tiny_k3.config import K3Config

STATE_BYTES = 4  # the KDA state S is always float32 (kda.md, tiny_k3/cache.py)
MIB_CONTEXT = 1 << 20  # "1M" context = 2^20 = 1,048,576 tokens (K3 max_position_embeddings, k3_facts.md §1)


def non_negative_int(value, what: str) -> int:
    """A non-negative integer (numpy ints welcome), or one clear ValueError."""
    try:
        n = operator.index(value)
    except TypeError:
        raise ValueError(f"{what} must be a non-negative integer, got {value!r}.") from None
    if n < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {n}.")
    return n


# ---------------------------------------------------------------------------- per-token / per-sequence


def kv_bytes_per_token(config: K3Config) -> int:
    """Bytes the MLA caches grow by per token of one sequence: L_mla * (kv_lora + rope) * b.

    K3: 24 * 576 * 2 = 27,648 B (k3_facts.md §5a).
    """
    return len(config.mla_layers) * config.mla_cache_width * config.dtype_bytes


@dataclass(frozen=True)
class StateBytes:
    """Fixed decode state of one sequence, summed over the KDA layers (and the twin's conv tails).

    state: L_kda * H * K * V * 4 (float32 S)      K3: 69*96*128*128*4 = 434,110,464 B
    conv:  L_kda * (W-1) * (2*H*K + H*V) * b       K3: 69*3*36,864*2  =  15,261,696 B
           + L_conv * (W-1) * (kv_lora + rope + q width) * b   the twin's MLA conv tails (K3's twin: 69*3*2,112*2)
    """

    state: int
    conv: int

    @property
    def total(self) -> int:
        return self.state + self.conv


def state_bytes_fixed(config: K3Config) -> StateBytes:
    """Bytes of all fixed states of one sequence (once at least one token has been seen): the KDA layers' S and
    conv tails, and the conv tails of the twin's MLA layers that keep a short convolution."""
    h, k = config.kda_heads, config.kda_head_dim
    v = k  # K = V in K3Config (kda_head_dim serves both)
    layers = len(config.kda_layers)
    conv_channels = 2 * h * k + h * v  # q, k and v are each convolved before the delta rule
    q_width = config.q_lora_rank if config.q_lora_rank is not None else config.mla_heads * config.qk_head_dim
    mla_channels = config.mla_cache_width + q_width     # [c, k_r] and the query's first projection
    tails = layers * conv_channels + len(config.mla_conv_layers) * mla_channels
    return StateBytes(
        state=layers * h * k * v * STATE_BYTES,
        conv=(config.kda_conv_kernel - 1) * tails * config.dtype_bytes,
    )


def cache_bytes(config: K3Config, tokens: int, batch: int = 1) -> tuple[int, int]:
    """(kv, state): analytic bytes of the decode cache after `tokens` tokens, for `batch` sequences.

    kv grows with tokens; state is constant from the first token on and 0 before any token.
    """
    tokens = non_negative_int(tokens, "tokens")
    batch = non_negative_int(batch, "batch")
    kv = batch * tokens * kv_bytes_per_token(config)
    state = batch * state_bytes_fixed(config).total if tokens > 0 else 0
    return kv, state


def mha_bytes_per_token(config: K3Config) -> int:
    """Plain multi-head attention baseline (no latent, no KDA): 2 * L * n_heads * d_head * b per token.

    What we take: every one of the L layers is full attention with n_heads = mla_heads, caching
    K with d_head = qk_head_dim (nope + rope) and V with d_head = v_head_dim, so the "2 * d_head"
    is qk_head_dim + v_head_dim. K3: 93 * 96 * (192 + 128) * 2 = 5,713,920 B/token, i.e. the MLA
    cache decompressed to per-head K, V (61,440 B per layer, k3_facts.md §5a).
    """
    per_layer = config.mla_heads * (config.qk_head_dim + config.v_head_dim) * config.dtype_bytes
    return config.num_layers * per_layer


def kv_reduction(config: K3Config, baseline: K3Config) -> float:
    """KV saved per token by `config` against another model: 1 - kv(config) / kv(baseline).

    K3 vs K2 (`k2` preset, 61 MLA layers): 1 - 27,648 / 70,272 = 60.7% (k3_facts.md §5a).
    """
    return 1.0 - kv_bytes_per_token(config) / kv_bytes_per_token(baseline)


def hybrid_reduction(config: K3Config) -> float:
    """KV saved per token by the hybrid vs its all-MLA twin: 1 - L_full / L (K3: 1 - 24/93 = 74.2%), as
    every MLA layer caches the same width."""
    return kv_reduction(config, config.twin())


def crossover_tokens(config: K3Config) -> int | None:
    """The first token count at which the hybrid's cache is smaller than its all-MLA twin's (cache_bytes,
    which equals the measured bytes): the fixed KDA states are a head start that the twin's faster-growing
    KV cache overtakes (k3_facts.md §5a). None when it never does (no KDA layers)."""
    twin = config.twin()

    def smaller(n: int) -> bool:
        return sum(cache_bytes(config, n)) < sum(cache_bytes(twin, n))

    hi = 1
    while not smaller(hi):                  # both grow linearly: double until past it, then bisect
        if hi > MIB_CONTEXT * 1024:
            return None
        hi *= 2
    lo = hi // 2                            # smaller(lo) is False (or lo == 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if smaller(mid) else (mid, hi)
    return hi


# ---------------------------------------------------------------------------- curves and projection


@dataclass(frozen=True)
class MemoryCurve:
    """Cache bytes (kv + state, one sequence unless batch > 1) at each context length.

    hybrid: the config as given; twin: config.twin() (every layer gated MLA); mha: plain MHA baseline.
    """

    tokens: tuple[int, ...]
    hybrid_kv: tuple[int, ...]
    hybrid_state: tuple[int, ...]
    twin: tuple[int, ...]
    mha: tuple[int, ...]

    @property
    def hybrid(self) -> tuple[int, ...]:
        return tuple(kv + s for kv, s in zip(self.hybrid_kv, self.hybrid_state))

    def as_dict(self) -> dict[str, list[int]]:
        return {"tokens": list(self.tokens), "hybrid": list(self.hybrid), "hybrid_kv": list(self.hybrid_kv),
                "hybrid_state": list(self.hybrid_state), "twin": list(self.twin), "mha": list(self.mha)}


def memory_curve(config: K3Config, token_counts, batch: int = 1) -> MemoryCurve:
    """Bytes vs context for the hybrid, its all-MLA twin and the MHA baseline."""
    tokens = tuple(non_negative_int(t, "every token count") for t in token_counts)
    twin = config.twin()
    hybrid = [cache_bytes(config, t, batch) for t in tokens]
    mha_per_token = mha_bytes_per_token(config)
    return MemoryCurve(
        tokens=tokens,
        hybrid_kv=tuple(kv for kv, _ in hybrid),
        hybrid_state=tuple(s for _, s in hybrid),
        twin=tuple(sum(cache_bytes(twin, t, batch)) for t in tokens),
        mha=tuple(batch * t * mha_per_token for t in tokens),
    )


@dataclass(frozen=True)
class K3Projection:
    """The real K3's cache for one sequence at `tokens` tokens (for the TUI: "now, and at 1M")."""

    tokens: int
    kv: int        # 24 MLA layers' latent cache
    state: int     # 69 KDA states + conv tails (0 before the first token)
    twin: int      # the same model with all 93 layers MLA
    mha: int       # plain MHA baseline

    @property
    def hybrid(self) -> int:
        return self.kv + self.state


@lru_cache(maxsize=1)
def _k3() -> K3Config:
    return K3Config.preset("k3")


def project_to_k3(tokens: int) -> K3Projection:
    """K3 hybrid / all-MLA twin / MHA bytes for one sequence at `tokens` tokens of context."""
    curve = memory_curve(_k3(), [tokens])
    return K3Projection(tokens=curve.tokens[0], kv=curve.hybrid_kv[0], state=curve.hybrid_state[0],
                        twin=curve.twin[0], mha=curve.mha[0])


def format_bytes(n: float, digits: int = 1) -> str:
    """Human-readable bytes in decimal units (1 KB = 1,000 B, 1 GB = 1e9 B, as k3_facts.md uses)."""
    if n < 0:
        return "-" + format_bytes(-n, digits)
    if n < 1000:
        return f"{int(n)} B"
    for unit in ("KB", "MB", "GB", "TB", "PB"):
        n /= 1000.0
        if round(n, digits) < 1000 or unit == "PB":
            return f"{n:.{digits}f} {unit}"
    raise AssertionError("unreachable")
