"""Lesson 3 solutions: cache bytes."""


def mla_cache_bytes(config, tokens):
    """MLA layers x (kv_lora_rank + qk_rope_dim) values x dtype bytes, per token (k3_facts.md §5a)."""
    per_token = len(config.mla_layers) * (config.kv_lora_rank + config.qk_rope_dim) * config.dtype_bytes
    return tokens * per_token


def kda_state_bytes(config):
    """Per KDA layer: S [H, K, V] in float32 + the conv tail [(W-1), 2HK + HV] in config.dtype."""
    H, K = config.kda_heads, config.kda_head_dim
    V = K
    state = H * K * V * 4
    conv = (config.kda_conv_kernel - 1) * (2 * H * K + H * V) * config.dtype_bytes
    return len(config.kda_layers) * (state + conv)
