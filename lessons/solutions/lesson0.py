"""Lesson 0 solutions: causal softmax attention, one decode step with a KV cache, the bytes of a plain KV cache."""

import torch


def causal_attention(q, k, v):
    """q, k [T, H, D], v [T, H, Dv] -> out [T, H, Dv]: query t reads keys 0 … t with softmax(q · k / √D)."""
    T, D = q.shape[0], q.shape[-1]
    scores = torch.einsum("thd,shd->hts", q, k) / D ** 0.5        # [H, T, S]: every query against every key
    future = torch.ones(T, T, dtype=torch.bool).triu(1)           # key s later than query t
    probs = scores.masked_fill(future, float("-inf")).softmax(-1)  # over the keys, per query and head
    return torch.einsum("hts,shv->thv", probs, v)


def decode_step(cache, q, k, v):
    """cache (K [t, H, D], V [t, H, Dv]); q, k [H, D], v [H, Dv] -> (o [H, Dv], (K, V) with t + 1 rows)."""
    K = torch.cat([cache[0], k[None]])                            # append first: the new token reads itself too
    V = torch.cat([cache[1], v[None]])
    probs = (torch.einsum("hd,shd->hs", q, K) / q.shape[-1] ** 0.5).softmax(-1)   # [H, t + 1]
    return torch.einsum("hs,shv->hv", probs, V), (K, V)


def kv_cache_bytes(config, tokens):
    """Plain multi-head attention in every layer: a key and a value per head per token, in the weights' dtype."""
    per_layer = config.mla_heads * (config.qk_head_dim + config.v_head_dim) * config.dtype_bytes
    return tokens * config.num_layers * per_layer
