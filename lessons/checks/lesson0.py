"""Lesson 0 checks: causal softmax attention, one decode step with a growing KV cache, the bytes of a KV cache."""

from __future__ import annotations

import torch

from ._common import ExerciseError, _call, _close, _fmt, _int, _passed, _tensor, register

_CASES = [(5, 2, 4, 3), (1, 1, 8, 8), (9, 3, 6, 5)]          # (T, H, D, Dv): D != Dv, and a single token


def _qkv(T: int, H: int, D: int, Dv: int, gen: torch.Generator):
    f64 = dict(dtype=torch.float64)
    return (2 * torch.randn(T, H, D, generator=gen, **f64), 2 * torch.randn(T, H, D, generator=gen, **f64),
            torch.randn(T, H, Dv, generator=gen, **f64))


def reference_attention(q, k, v, scale=None, mask="causal"):
    """The project's op, tiny_k3.mla.softmax_attention, on [T, H, *] tensors: out [T, H, Dv].

    mask: "causal" (key s <= query t), "none", "strict" (s < t: a query that cannot see itself) or "future"
    (s >= t) — the last three are mistakes the checks recognise."""
    from tiny_k3.mla import softmax_attention

    T = q.shape[0]
    s, t = torch.arange(T)[None, :], torch.arange(T)[:, None]
    allowed = {"causal": s <= t, "none": None, "strict": s < t, "future": s >= t}[mask]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    _, out = softmax_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), scale, allowed)
    return out.transpose(0, 1)


@register("0.1", "causal_attention", difficulty=2, minutes=10, expects="""
my_causal_attention(q, k, v) -> out                     softmax attention over a whole sequence, every head
  q, k [T, H, D]: one query and one key per token and head;  v [T, H, Dv]: one value (Dv may differ from D)
  returns out [T, H, Dv]: token t's read, a weighted mean of the values of tokens 0 … t (never a later one),
  the weights a softmax of the query-key dot products scaled by 1/√D.
Checked against tiny_k3.mla.softmax_attention (the op inside every MLA layer) in float64, with D ≠ Dv.
""",
          hints=("Three moves per head: score every key against every query, hide the keys that come after the "
                 "query, and let the softmax of the remaining scores weigh the values.",
                 "Scores: for each head, queries [T, D] against keys [T, D] → [T, T], divided by √D. Mask: entry "
                 "(t, s) with s > t becomes −∞ (so its softmax weight is 0). Softmax along the key axis, so each "
                 "row sums to 1. Out: each row of weights [T] times the values [T, Dv] → [T, Dv]; keep heads apart "
                 "throughout → [T, H, Dv].",
                 "scores = torch.einsum('thd,shd->hts', q, k) / D ** 0.5\n"
                 "  future = torch.ones(T, T, dtype=torch.bool).triu(1)\n"
                 "  probs = scores.masked_fill(future, float('-inf')).softmax(-1)\n"
                 "  return torch.einsum('hts,shv->thv', probs, v)"))
def check_causal_attention(fn) -> None:
    gen = torch.Generator().manual_seed(0)
    for T, H, D, Dv in _CASES:
        q, k, v = _qkv(T, H, D, Dv, gen)
        want = reference_attention(q, k, v)
        got = _tensor(_call(fn, (q.clone(), k.clone(), v.clone()), f"q, k [{T}, {H}, {D}], v [{T}, {H}, {Dv}]",
                            f"the scores of one head are [T, T] = [{T}, {T}]; the values have Dv = {Dv} channels."),
                      "out", (T, H, Dv), f"one read per token and head, Dv = {Dv} channels")
        if _close(got, want, atol=1e-9):
            continue
        right = f"For this input out[-1, 0] should be {_fmt(want[-1, 0])}; yours is {_fmt(got[-1, 0])}."
        if torch.isnan(got).any():
            raise ExerciseError("Your out has NaN: a query whose keys are all masked gets a softmax over nothing "
                                "but −∞. Query t must see keys 0 … t, itself included (mask only s > t).\n  " + right)
        wrong = [
            (reference_attention(q, k, v, mask="none"), "Every token read every key, later ones too: without the "
                                                        "causal mask token t sees the future. Hide keys s > t "
                                                        "(score −∞ before the softmax)."),
            (reference_attention(q, k, v, scale=1.0), "You left out the scale: divide the scores by √D. Without "
                                                      "it the dot products grow with D and the softmax saturates."),
            (reference_attention(q, k, v, scale=1.0 / D), "You divided by D; the scale is 1/√D (scaled dot-product "
                                                          "attention, mla.md §1): it keeps the scores' variance near 1."),
            (reference_attention(q, k, v, mask="future"), "Your mask is the wrong way round: token t read keys "
                                                          "t … T−1. Causal means keys 0 … t, the past and itself."),
        ]
        for candidate, message in wrong:
            if _close(got, candidate, atol=1e-9):
                raise ExerciseError(message + "\n  " + right)
        scores = torch.einsum("thd,shd->hts", q, k) / D ** 0.5
        masked = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        over_queries = torch.nan_to_num(masked.softmax(-2), nan=0.0)    # softmax down a column
        if _close(got, torch.einsum("hts,shv->thv", over_queries, v), atol=1e-9):
            raise ExerciseError("Your softmax ran over the queries: each token's weights must sum to 1 over the "
                                "keys it reads (the last axis of the [T, S] scores).\n  " + right)
        raise ExerciseError(right)
    _passed("check_causal_attention", "your attention equals tiny_k3.mla.softmax_attention with a causal mask "
                                      "(float64, D ≠ Dv, one token included).")


@register("0.2", "decode_step", difficulty=2, minutes=12, expects="""
my_decode_step(cache, q, k, v) -> (o, cache)            one new token through one attention layer, every head
  cache: a pair (K [t, H, D], V [t, H, Dv]), the keys and values of the t tokens so far (t = 0: empty, [0, H, D])
  q, k [H, D], v [H, Dv]: the new token's query, key and value
  returns o [H, Dv], the new token's read (over the t + 1 tokens it may see), and the new cache
  (K [t + 1, H, D], V [t + 1, H, Dv]): row s is token s's key / value, in order.
Checked by decoding whole sequences from an empty cache: every o must equal causal attention over the whole
sequence at once (tiny_k3.mla.softmax_attention with a causal mask), and every cache the keys so far.
""",
          hints=("The cache is what the past left behind: append the new token's key and value first, then read "
                 "with its query over everything in the cache, itself included.",
                 "Grow K [t, H, D] by one row (the new k [H, D]) at the end → [t + 1, H, D]; the same for V. For "
                 "each head: the query [D] against the t + 1 cached keys → [t + 1] scores, divided by √D; softmax "
                 "along them; weights times the cached values [t + 1, Dv] → [Dv]. No mask: nothing in the cache "
                 "lies in the future.",
                 "K = torch.cat([cache[0], k[None]]);  V = torch.cat([cache[1], v[None]])\n"
                 "  probs = (torch.einsum('hd,shd->hs', q, K) / q.shape[-1] ** 0.5).softmax(-1)\n"
                 "  return torch.einsum('hs,shv->hv', probs, V), (K, V)"))
def check_decode_step(fn) -> None:
    gen = torch.Generator().manual_seed(1)
    for T, H, D, Dv in _CASES:
        q, k, v = _qkv(T, H, D, Dv, gen)
        want = reference_attention(q, k, v)
        cache = (torch.zeros(0, H, D, dtype=torch.float64), torch.zeros(0, H, Dv, dtype=torch.float64))
        for t in range(T):
            got = _call(fn, (cache, q[t].clone(), k[t].clone(), v[t].clone()),
                        f"token {t}: cache K [{t}, {H}, {D}], V [{t}, {H}, {Dv}]; q, k [{H}, {D}], v [{H}, {Dv}]",
                        "grow the cache along its first axis (the tokens): it has t rows before token t.")
            if not isinstance(got, (tuple, list)) or len(got) != 2 or not isinstance(got[1], (tuple, list)) \
                    or len(got[1]) != 2:
                raise ExerciseError("Return two things: o [H, Dv] and the new cache as a pair (K, V).")
            o = _tensor(got[0], "o", (H, Dv), f"one read per head, Dv = {Dv}")
            K = _tensor(got[1][0], "the new K", (t + 1, H, D),
                        f"after token {t} the cache holds {t + 1} rows, one per token so far: it grows by one")
            V = _tensor(got[1][1], "the new V", (t + 1, H, Dv), f"after token {t} the values hold {t + 1} rows")
            if not (_close(K, k[:t + 1], atol=0) and _close(V, v[:t + 1], atol=0)):
                if t > 0 and _close(K, torch.cat([k[t:t + 1], k[:t]]), atol=0):
                    raise ExerciseError("You put the new key first. Row s of the cache is token s: append at the "
                                        "end, so that cutting the cache at s (going back in time) keeps tokens "
                                        "0 … s−1.")
                raise ExerciseError(f"After token {t} the cache must hold the keys and values of tokens 0 … {t}, "
                                    "in order, unchanged.")
            right = f"At token {t} (of {T}), o[0] should be {_fmt(want[t, 0])}; yours is {_fmt(o[0])}."
            if not _close(o, want[t], atol=1e-9):
                before = reference_attention(q[:t + 1], k[:t + 1], v[:t + 1], mask="strict")[t]
                if t == 0 and (torch.isnan(o).any() or _close(o, torch.zeros_like(o), atol=0)) \
                        or t > 0 and _close(o, before, atol=1e-9):
                    raise ExerciseError("You read before appending: the new token's query must see its own key "
                                        "and value too (causal attention includes s = t). Append, then read.\n  "
                                        + right)
                if _close(o, reference_attention(q[:t + 1], k[:t + 1], v[:t + 1], scale=1.0)[t], atol=1e-9):
                    raise ExerciseError("You left out the 1/√D scale of the scores.\n  " + right)
                raise ExerciseError(right)
            cache = (K, V)
    _passed("check_decode_step", "decoding token by token with your cache equals causal attention over the whole "
                                 "sequence at once (tiny_k3.mla.softmax_attention); the cache grows by one row a "
                                 "token.")


def _bytes_cases():
    from tiny_k3 import K3Config

    return [(K3Config.preset(n), t) for n, t in [("k3", 1 << 20), ("small", 100), ("tiny", 1), ("k2", 4096)]]


@register("0.3", "kv_cache_bytes", difficulty=1, minutes=6, expects="""
my_kv_cache_bytes(config, tokens) -> int
  bytes of a plain multi-head-attention KV cache for ONE sequence after `tokens` tokens, if every one of the
  config's layers were softmax attention with config.mla_heads heads, keys of config.qk_head_dim and values of
  config.v_head_dim channels, stored in the weights' dtype: the baseline lessons 2 and 3 shrink.
Checked against sim.memory.mha_bytes_per_token (K3 at 2^20 tokens, small, tiny and K2).
""",
          hints=("Every token leaves a key and a value behind, in every head of every layer, and each value costs "
                 "the dtype's bytes.",
                 "Per token and layer: heads × (key width + value width) values, the three read from "
                 "config.mla_heads, config.qk_head_dim and config.v_head_dim. Times the bytes of one value "
                 "(config.dtype_bytes), the number of layers (config.num_layers) and tokens. K3: 93 × 96 × "
                 "(192 + 128) × 2 = 5,713,920 B a token.",
                 "per_layer = config.mla_heads * (config.qk_head_dim + config.v_head_dim) * config.dtype_bytes\n"
                 "  return tokens * config.num_layers * per_layer"))
def check_kv_cache_bytes(fn) -> None:
    from sim.memory import format_bytes, mha_bytes_per_token

    for cfg, tokens in _bytes_cases():
        want = tokens * mha_bytes_per_token(cfg)
        got = _int(_call(fn, (cfg, tokens), f"config {cfg.name!r}, tokens={tokens:,}",
                         "config.num_layers, config.mla_heads, config.qk_head_dim, config.v_head_dim and "
                         "config.dtype_bytes have what you need."), "my_kv_cache_bytes(...)")
        if got == want:
            continue
        b, L, H = cfg.dtype_bytes, cfg.num_layers, cfg.mla_heads
        right = f"For {cfg.name!r} after {tokens:,} tokens the answer is {want:,} B; yours is {got:,} B."
        if got * b == want:
            raise ExerciseError(f"You counted values, not bytes: times config.dtype_bytes ({b} for {cfg.dtype}). "
                                + right)
        if got in (tokens * L * H * cfg.qk_head_dim * b, tokens * L * H * cfg.v_head_dim * b):
            raise ExerciseError("You cached the keys or the values, not both: each token leaves a key "
                                "(qk_head_dim) AND a value (v_head_dim) in every head. " + right)
        if got == tokens * L * H * 2 * cfg.qk_head_dim * b:
            raise ExerciseError(f"Keys and values need not be the same width: values have v_head_dim = "
                                f"{cfg.v_head_dim}, keys qk_head_dim = {cfg.qk_head_dim}. " + right)
        if got == tokens * len(cfg.mla_layers) * H * (cfg.qk_head_dim + cfg.v_head_dim) * b:
            raise ExerciseError(f"You counted only the {len(cfg.mla_layers)} MLA layers; the baseline is plain "
                                f"attention in all {L} layers (lesson 3 counts what the hybrid keeps). " + right)
        if got == tokens * L * cfg.mla_cache_width * b or got == tokens * len(cfg.mla_layers) * cfg.mla_cache_width * b:
            raise ExerciseError("That is MLA's latent cache (lesson 3). Plain attention keeps per-head keys and "
                                "values: heads × (qk_head_dim + v_head_dim) values per layer. " + right)
        if got == tokens * L * 2 * cfg.hidden_size * b:
            raise ExerciseError(f"You used the hidden size ({cfg.hidden_size}); the cache holds the heads' keys "
                                "and values: heads × (qk_head_dim + v_head_dim). " + right)
        raise ExerciseError(right)
    k3 = (1 << 20) * mha_bytes_per_token(_bytes_cases()[0][0])
    _passed("check_kv_cache_bytes", f"matches sim.memory.mha_bytes_per_token; K3 as plain attention would hold "
                                    f"{format_bytes(k3)} at 2^20 tokens.")
