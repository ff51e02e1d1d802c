"""Lesson 3 checks: MLA latent-cache bytes, the fixed KDA state bytes."""

from __future__ import annotations

import functools
import math

import torch

from ._common import ExerciseError, _call, _close, _fmt, _int, _passed, _tensor, register

def _memory_cases():
    from tiny_k3 import K3Config

    return [(K3Config.preset(n), t) for n, t in [("tiny", 1), ("tiny", 37), ("small", 100), ("mini-896/16", 5),
                                                  ("k3", 1), ("k3", 1 << 20)]]


@register("3.1", "mla_cache_bytes", difficulty=1, minutes=8, expects="""
my_mla_cache_bytes(config, tokens) -> int
  bytes of the growing KV cache of ONE sequence after `tokens` tokens, for a tiny_k3.K3Config.
  Which layers keep a cache (config.mla_layers), how many values per token per layer, how many bytes each?
Checked against sim.memory.cache_bytes (which tests prove equal to the bytes of the live cache tensors).
""",
          hints=('Only MLA layers cache, and they cache one latent per token for all heads (docs/mla.md §2), in the '
                 "weights' dtype.",
                 'Per token and per MLA layer the cache holds the latent (kv_lora_rank values) and the shared rope '
                 'key (qk_rope_dim values); config.mla_cache_width is their sum. Multiply by the number of MLA '
                 'layers (the length of config.mla_layers), by the bytes of one value (config.dtype_bytes) and by '
                 'tokens. K3: 24 × 576 × 2 = 27,648 B per token.',
                 'per_token = len(config.mla_layers) * (config.kv_lora_rank + config.qk_rope_dim) * '
                 'config.dtype_bytes\n'
                 '  return tokens * per_token'))
def check_mla_cache_bytes(fn) -> None:
    from sim.memory import cache_bytes

    for cfg, tokens in _memory_cases():
        want = cache_bytes(cfg, tokens)[0]
        got = _int(_call(fn, (cfg, tokens), f"config {cfg.name!r}, tokens={tokens:,}",
                         "len(config.mla_layers), config.mla_cache_width and config.dtype_bytes have what you need."),
                   "my_mla_cache_bytes(...)")
        if got == want:
            continue
        b, L_mla, width = cfg.dtype_bytes, len(cfg.mla_layers), cfg.mla_cache_width
        right = (f"For {cfg.name!r} after {tokens:,} token{'s' if tokens != 1 else ''} the answer is {want:,} B; "
                 f"yours is {got:,} B.")
        if got * b == want:
            raise ExerciseError(f"You counted values, not bytes: multiply by config.dtype_bytes ({b} for "
                                f"{cfg.dtype}). " + right)
        for wrong_b in (1, 2, 4):
            if wrong_b != b and got == want // b * wrong_b:
                raise ExerciseError(f"Off by the dtype: you used {wrong_b} bytes per value, but {cfg.name!r} "
                                    f"stores its cache in {cfg.dtype} ({b} bytes). " + right)
        if got == tokens * cfg.num_layers * width * b:
            raise ExerciseError(f"You gave every layer a KV cache. Only the {L_mla} MLA layers keep one; the "
                                f"{len(cfg.kda_layers)} KDA layers keep a fixed-size state instead. " + right)
        if got == tokens * L_mla * cfg.kv_lora_rank * b:
            raise ExerciseError("You left out the shared key part k_rope (qk_rope_dim values per token): MLA caches "
                                "c and k_rope, i.e. config.mla_cache_width values. " + right)
        if got == 2 * want:
            raise ExerciseError("MLA does not cache separate K and V: one latent c (plus k_rope) per token rebuilds "
                                "both. " + right)
        per_head = tokens * L_mla * cfg.mla_heads * (cfg.qk_head_dim + cfg.v_head_dim) * b
        if got == per_head:
            raise ExerciseError(f"You cached per-head K and V ({cfg.mla_heads} heads × ({cfg.qk_head_dim} + "
                                f"{cfg.v_head_dim}) values per layer) — what plain attention would keep. MLA keeps "
                                f"only the latent: {width} values per layer per token. " + right)
        raise ExerciseError(right + f" (Per token: {L_mla} MLA layers × {width} values × {b} B.)")
    _passed("check_mla_cache_bytes", "matches sim.memory.cache_bytes, from tiny to K3 at 2^20 tokens "
                                     f"({want / 1e9:.1f} GB).")


@register("3.2", "kda_state_bytes", difficulty=2, minutes=10, expects="""
my_kda_state_bytes(config) -> int
  bytes of ALL fixed KDA decode state of one sequence, for a tiny_k3.K3Config: what every KDA layer
  (config.kda_layers) keeps between tokens, however long the context. Two things per layer: the
  recurrent state and the short convolution's tail (lesson 2, section 4).
Checked against sim.memory.state_bytes_fixed.
""",
          hints=("The state S is [H, K, V] per layer and is kept in float32 whatever the weights' dtype; the conv "
                 "tail keeps the last W − 1 inputs of q, k and v in the weights' dtype.",
                 'per KDA layer: H·K·V·4  +  (W − 1)·(2·H·K + H·V)·dtype_bytes,  H = kda_heads, K = V = '
                 'kda_head_dim, W = kda_conv_kernel; then times the number of KDA layers.\n'
                 '  K3: 69 × 96 × 128 × 128 × 4 + 69 × 3 × 36,864 × 2 = 449 MB (k3_facts.md §5a)',
                 'H, K = config.kda_heads, config.kda_head_dim;  V = K\n'
                 '  state = H * K * V * 4;  conv = (config.kda_conv_kernel - 1) * (2 * H * K + H * V) * '
                 'config.dtype_bytes\n'
                 '  return len(config.kda_layers) * (state + conv)'))
def check_kda_state_bytes(fn) -> None:
    from sim.memory import state_bytes_fixed

    from tiny_k3 import K3Config

    for name in ["tiny", "small", "mini-896/16", "k3-topo", "k3"]:
        cfg = K3Config.preset(name)
        parts = state_bytes_fixed(cfg)
        want = parts.total
        got = _int(_call(fn, (cfg,), f"config {name!r}"), "my_kda_state_bytes(...)")
        if got == want:
            continue
        L, H, K, W, b = len(cfg.kda_layers), cfg.kda_heads, cfg.kda_head_dim, cfg.kda_conv_kernel, cfg.dtype_bytes
        right = f"For {name!r} the answer is {want:,} B (state {parts.state:,} + conv {parts.conv:,}); yours is {got:,} B."
        if got == parts.state:
            raise ExerciseError(f"You counted S but not the short-convolution tail: each KDA layer also keeps its "
                                f"last W − 1 = {W - 1} inputs of q, k and v ((W−1)·(2HK + HV) values in {cfg.dtype}). "
                                + right)
        if b != 4 and got == parts.state * b // 4 + parts.conv:
            raise ExerciseError(f"The state S is always float32 (4 bytes): it accumulates a long sum of updates, "
                                f"so K3 keeps it in fp32 even though its weights and cache are {cfg.dtype}. " + right)
        if got == parts.state // L * cfg.num_layers + parts.conv // L * cfg.num_layers:
            raise ExerciseError(f"Only the {L} KDA layers keep a state, not all {cfg.num_layers}. " + right)
        if got == parts.state + parts.conv // (W - 1) * W:
            raise ExerciseError(f"The conv keeps W − 1 = {W - 1} past inputs (the current token is the W-th), "
                                "not W. " + right)
        if got == want // H:
            raise ExerciseError(f"Count every head: S is [H, K, V] with H = {H}. " + right)
        raise ExerciseError(right)
    _passed("check_kda_state_bytes", f"matches sim.memory.state_bytes_fixed; K3 keeps {want / 1e6:.0f} MB per "
                                     "sequence however long the context.")
