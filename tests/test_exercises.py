"""The exercise checks teach: reference solutions pass, deliberately wrong ones fail with the intended message.

Each wrong implementation below is a mistake a learner makes (a scalar decay instead of a per-channel
one, weights from scores + bias, bytes off by the dtype, a missing renormalisation, ...). The check
must fail with an ExerciseError whose message names that mistake, not just "wrong".
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

LESSONS = Path(__file__).resolve().parents[1] / "lessons"
sys.path.insert(0, str(LESSONS))

import checks  # noqa: E402
import solutions  # noqa: E402
import workshop  # noqa: E402
from checks import ExerciseError  # noqa: E402

SOLVED = {
    checks.check_causal_attention: solutions.causal_attention,
    checks.check_decode_step: solutions.decode_step,
    checks.check_kv_cache_bytes: solutions.kv_cache_bytes,
    checks.check_route: solutions.route,
    checks.check_active_params: solutions.active_params,
    checks.check_bias_update: solutions.bias_update,
    checks.check_kda_step: solutions.kda_step,
    checks.check_kda_gate: solutions.kda_gate,
    checks.check_read_weights: solutions.read_weights,
    checks.check_mla_cache_bytes: solutions.mla_cache_bytes,
    checks.check_kda_state_bytes: solutions.kda_state_bytes,
    checks.check_depth_attention: solutions.depth_attention,
    checks.check_block_sources: solutions.block_sources,
    checks.check_mxfp4_bytes: solutions.mxfp4_bytes,
    checks.check_release_bytes: solutions.release_bytes,
    checks.check_ep_bytes: solutions.ep_bytes,
    checks.check_decode_roofline: solutions.decode_roofline,
    checks.check_sublayer_order: solutions.sublayer_order,
    checks.check_num_sources: solutions.num_sources,
    checks.check_ablated_route: solutions.ablated_route,
    checks.check_kl: solutions.kl,
    checks.check_reset_head: solutions.reset_head,
    checks.check_weighted_loss: solutions.weighted_loss,
    checks.check_lr_at: solutions.lr_at,
    checks.check_wilson_interval: solutions.wilson_interval,
}


def test_every_check_has_a_solution_and_a_spec():
    assert set(SOLVED) == set(checks.ALL_CHECKS)
    for check in checks.ALL_CHECKS:
        assert len(check.expects) > 80, check.__name__
        assert SOLVED[check] is getattr(solutions, check.exercise.solution), "the registry names the solution"


def test_checks_are_one_module_per_lesson_and_import_as_before():
    from checks import check_kda_step, check_route  # noqa: F401  (the lessons' import line keeps working)

    for check in checks.ALL_CHECKS:
        lesson = check.exercise.number.split(".")[0]
        assert check.__module__ == f"checks.lesson{lesson}", (check.__name__, check.__module__)
    assert [c.exercise.number for c in checks.ALL_CHECKS] == sorted(c.exercise.number for c in checks.ALL_CHECKS)


def test_every_exercise_has_a_difficulty_minutes_and_two_hints(capsys):
    for check in checks.ALL_CHECKS:
        ex = check.exercise
        assert ex.difficulty in (1, 2, 3) and 3 <= ex.minutes <= 30, ex
        checks.hint(ex.number)
        one = capsys.readouterr().out
        checks.hint(check, 2)
        two = capsys.readouterr().out
        assert ex.hints[0] in one and ex.hints[1] in two and ex.hints[0] != ex.hints[1]
        rungs = len(ex.hints)
        assert f"hint 1/{rungs}" in one and f"hint 2/{rungs}" in two and ex.stars in one
    checks.hint("kda_step", 3)
    assert "g.exp()[:, None]" in capsys.readouterr().out     # the code lives in the last hint ...
    assert "g.exp()[:, None]" not in checks.check_kda_step.expects   # ... not in the "not done yet" spec


def test_hint_says_what_is_wrong_with_a_bad_name_or_level():
    with pytest.raises(ValueError, match="no exercise called 'nope'; the exercises are 0.1"):
        checks.hint("nope")
    with pytest.raises(ValueError, match="hint level for 1.1 is 1 to [23], got 4"):
        checks.hint("1.1", 4)


@pytest.mark.parametrize("check", checks.ALL_CHECKS, ids=lambda c: c.__name__)
def test_reference_solution_passes(check, capsys):
    check(SOLVED[check])
    assert f"✓ {check.__name__} passed" in capsys.readouterr().out


def fails_with(check, fn, *fragments):
    with pytest.raises(ExerciseError) as info:
        check(fn)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"expected {fragment!r} in:\n{message}"
    return message


# ---------------------------------------------------------------------------- lesson 0


def attention_with(q, k, v, scale=None, allowed=lambda t, s: s <= t, over=-1):
    """Softmax attention [T, H, *] with a chosen scale, mask and softmax axis: the mistakes of 0.1 and 0.2."""
    T, D = q.shape[0], q.shape[-1]
    scores = torch.einsum("thd,shd->hts", q, k) * (D ** -0.5 if scale is None else scale)
    mask = allowed(torch.arange(T)[:, None], torch.arange(T)[None, :])
    probs = torch.nan_to_num(scores.masked_fill(~mask, float("-inf")).softmax(over), nan=0.0)
    return torch.einsum("hts,shv->thv", probs, v)


def test_causal_attention_mistakes_are_named():
    fails_with(checks.check_causal_attention, lambda q, k, v: attention_with(q, k, v, allowed=lambda t, s: s >= 0),
               "without the causal mask", "s > t")
    fails_with(checks.check_causal_attention, lambda q, k, v: attention_with(q, k, v, scale=1.0), "left out the scale")
    fails_with(checks.check_causal_attention, lambda q, k, v: attention_with(q, k, v, scale=1.0 / q.shape[-1]),
               "divided by D", "1/√D")
    fails_with(checks.check_causal_attention, lambda q, k, v: attention_with(q, k, v, allowed=lambda t, s: s >= t),
               "wrong way round")
    fails_with(checks.check_causal_attention, lambda q, k, v: attention_with(q, k, v, over=-2), "over the queries")
    strict = lambda q, k, v: torch.einsum(  # noqa: E731  (a query that cannot see itself: row 0 is all -inf)
        "hts,shv->thv", torch.einsum("thd,shd->hts", q, k).masked_fill(
            ~(torch.arange(len(q))[None, :] < torch.arange(len(q))[:, None]), float("-inf")).softmax(-1), v)
    fails_with(checks.check_causal_attention, strict, "NaN", "itself included")
    fails_with(checks.check_causal_attention, lambda q, k, v: attention_with(q, k, v)[:, :, :1], "out has shape")


def test_decode_step_mistakes_are_named():
    def read_before_append(cache, q, k, v):
        probs = (torch.einsum("hd,shd->hs", q, cache[0]) / q.shape[-1] ** 0.5).softmax(-1)
        o = torch.einsum("hs,shv->hv", probs, cache[1])
        return o, (torch.cat([cache[0], k[None]]), torch.cat([cache[1], v[None]]))

    def new_row_first(cache, q, k, v):
        o, (K, V) = solutions.decode_step(cache, q, k, v)
        return o, (K.roll(1, 0), V.roll(1, 0))

    def only_the_last(cache, q, k, v):
        o, (K, V) = solutions.decode_step(cache, q, k, v)
        return o, (K[-1:], V[-1:])

    def no_scale(cache, q, k, v):
        return solutions.decode_step(cache, q * q.shape[-1] ** 0.5, k, v)

    fails_with(checks.check_decode_step, read_before_append, "read before appending", "Append, then read")
    fails_with(checks.check_decode_step, new_row_first, "new key first")
    fails_with(checks.check_decode_step, only_the_last, "the new K has shape", "grows by one")
    fails_with(checks.check_decode_step, no_scale, "1/√D")
    fails_with(checks.check_decode_step, lambda cache, q, k, v: solutions.decode_step(cache, q, k, v)[0],
               "Return two things")


def test_kv_cache_bytes_mistakes_are_named():
    def values(cfg, t):
        return t * cfg.num_layers * cfg.mla_heads * (cfg.qk_head_dim + cfg.v_head_dim)

    def keys_only(cfg, t):
        return t * cfg.num_layers * cfg.mla_heads * cfg.qk_head_dim * cfg.dtype_bytes

    def mla_layers_only(cfg, t):
        return t * len(cfg.mla_layers) * cfg.mla_heads * (cfg.qk_head_dim + cfg.v_head_dim) * cfg.dtype_bytes

    def latent(cfg, t):
        return t * len(cfg.mla_layers) * cfg.mla_cache_width * cfg.dtype_bytes

    fails_with(checks.check_kv_cache_bytes, values, "values, not bytes")
    fails_with(checks.check_kv_cache_bytes, keys_only, "not both")
    fails_with(checks.check_kv_cache_bytes, mla_layers_only, "only the 24 MLA layers")
    fails_with(checks.check_kv_cache_bytes, latent, "MLA's latent cache")
    fails_with(checks.check_kv_cache_bytes, lambda cfg, t: t * cfg.num_layers * 2 * cfg.hidden_size * cfg.dtype_bytes,
               "hidden size")


# ---------------------------------------------------------------------------- lesson 1


def route_by_scores_only(scores, bias, k):
    ids = scores.topk(k, -1).indices
    w = scores.gather(-1, ids)
    return ids, w / w.sum(-1, keepdim=True)


def route_weights_with_bias(scores, bias, k):
    ids = (scores + bias).topk(k, -1).indices
    w = (scores + bias).gather(-1, ids)
    return ids, w / w.sum(-1, keepdim=True)


def route_no_renorm(scores, bias, k):
    ids = (scores + bias).topk(k, -1).indices
    return ids, scores.gather(-1, ids)


def route_softmax(scores, bias, k):
    ids = (scores + bias).topk(k, -1).indices
    return ids, scores.gather(-1, ids).softmax(-1)


def test_route_mistakes_are_named():
    fails_with(checks.check_route, route_by_scores_only, "by the score s alone", "topk(s + b)")
    fails_with(checks.check_route, route_weights_with_bias, "include the selection bias", "right weights are")
    fails_with(checks.check_route, route_no_renorm, "renormalise", "not 1")
    fails_with(checks.check_route, route_softmax, "softmax")
    fails_with(checks.check_route, lambda s, b, k: (s.topk(k, -1).indices,), "Return two things")
    fails_with(checks.check_route, lambda s, b, k: ((s + b).topk(k + 1, -1).indices, s[:, : k + 1]),
               "expert_ids has shape", "should be")


def test_route_ids_in_any_order_pass(capsys):
    def reversed_order(scores, bias, k):
        ids, w = solutions.route(scores, bias, k)
        return ids.flip(-1), w.flip(-1)

    checks.check_route(reversed_order)


def test_active_params_mistakes_are_named():
    def with_embedding(parts, n, k):
        return solutions.active_params(parts, n, k) + parts["embedding"]

    def total(parts, n, k):
        return sum(parts.values())

    def experts_only(parts, n, k):
        return parts["routed_experts"] * k // n

    def no_router(parts, n, k):
        return solutions.active_params(parts, n, k) - parts["router"]

    fails_with(checks.check_active_params, with_embedding, "input embedding", "table lookup")
    fails_with(checks.check_active_params, total, "every parameter")
    fails_with(checks.check_active_params, experts_only, "only the active routed experts")
    fails_with(checks.check_active_params, no_router, "router")


def test_bias_update_mistakes_are_named():
    fails_with(checks.check_bias_update, lambda b, load, r: b - r * torch.sign(load.mean() - load),
               "Wrong direction", "goes down")
    fails_with(checks.check_bias_update, lambda b, load, r: b + r * (load.mean() - load), "fixed γ")
    fails_with(checks.check_bias_update, lambda b, load, r: b.clone(), "did not change")
    # the loophole of a two-way rule: a balanced expert (load exactly at the mean) must keep its bias
    fails_with(checks.check_bias_update, lambda b, load, r: b + r * torch.where(load < load.mean(), 1.0, -1.0),
               "exactly the mean load", "must keep its bias", "sign(0) = 0")
    fails_with(checks.check_bias_update, lambda b, load, r: b + r * torch.where(load > load.mean(), -1.0, 1.0),
               "exactly the mean load")


# ---------------------------------------------------------------------------- lesson 2


def kda_step_scalar_decay(S, q, k, v, g, beta, scale):
    S = g.mean().exp() * S                        # GDN: one decay per head
    S = S + beta * torch.outer(k, v - S.T @ k)
    return S.T @ (scale * q), S


def kda_step_linear_attention(S, q, k, v, g, beta, scale):
    S = g.exp()[:, None] * S
    S = S + beta * torch.outer(k, v)              # no delta correction
    return S.T @ (scale * q), S


def kda_step_read_before_write(S, q, k, v, g, beta, scale):
    S = g.exp()[:, None] * S
    o = S.T @ (scale * q)
    return o, S + beta * torch.outer(k, v - S.T @ k)


def kda_step_no_scale(S, q, k, v, g, beta, scale):
    o, S = solutions.kda_step(S, q, k, v, g, beta, scale)
    return o / scale, S


def kda_step_decay_on_columns(S, q, k, v, g, beta, scale):
    S = S * g.exp()                               # broadcasts over V: wrong axis (a shape error when K != V)
    S = S + beta * torch.outer(k, v - S.T @ k)
    return S.T @ (scale * q), S


def kda_step_wrong_sign(S, q, k, v, g, beta, scale):
    S = g.exp()[:, None] * S
    S = S + beta * torch.outer(k, S.T @ k - v)      # the correction backwards: away from v
    return S.T @ (scale * q), S


def kda_step_log_not_exp(S, q, k, v, g, beta, scale):
    S = g[:, None] * S
    S = S + beta * torch.outer(k, v - S.T @ k)
    return S.T @ (scale * q), S


def test_kda_step_mistakes_are_named():
    fails_with(checks.check_kda_step, kda_step_scalar_decay, "one number for the whole head", "Gated DeltaNet",
               "exp(g_d)")
    fails_with(checks.check_kda_step, kda_step_linear_attention, "linear attention", "v − S'ᵀk")
    fails_with(checks.check_kda_step, kda_step_read_before_write, "Read after writing")
    fails_with(checks.check_kda_step, kda_step_no_scale, "misses the scale")
    fails_with(checks.check_kda_step, kda_step_decay_on_columns, "raised RuntimeError", "one per *row*")
    fails_with(checks.check_kda_step, kda_step_log_not_exp, "*log* decay")
    message = fails_with(checks.check_kda_step, kda_step_wrong_sign, "wrong sign", "AWAY from v", "largest difference",
                         "misses v by")
    number = r"(\d+(?:\.\d+)?(?:e[+-]?\d+)?)"
    off, wrong, right = (float(x) for x in __import__("re").findall(
        rf"largest difference {number}, and S_newᵀk misses v by {number} where the right state misses it by {number}",
        message)[0])
    assert off > 0 and wrong > right, message        # how far off, and the wrong sign leaves v further away
    fails_with(checks.check_kda_step, lambda S, q, k, v, g, beta, scale: (v, S[:, :1]), "S_new has shape")


def test_kda_gate_mistakes_are_named():
    def no_exp(g_raw, A_log, dt_bias, lb):
        H, K = g_raw.shape[-2:]
        x = g_raw + dt_bias.view(H, K)
        return -A_log[:, None] * F.softplus(x) if lb is None else lb * torch.sigmoid(A_log[:, None] * x)

    def softplus_always(g_raw, A_log, dt_bias, lb):
        H, K = g_raw.shape[-2:]
        return -A_log.exp()[:, None] * F.softplus(g_raw + dt_bias.view(H, K))

    fails_with(checks.check_kda_gate, no_exp, "A_log is a logarithm")
    fails_with(checks.check_kda_gate, softplus_always, "sigmoid form", "(−5, 0)")


def _after(g):
    """Σ_{s=d+1}^{t} g_s per channel: the decay a write of token d meets before the read at t."""
    return g.flip(0).cumsum(0).flip(0) - g


def test_read_weights_mistakes_are_named():
    T_before = lambda g: (torch.arange(len(g)) < len(g) - 1)[:, None]  # noqa: E731
    fails_with(checks.check_read_weights, lambda q, k, g: k @ q, "left out the decay", "linear attention")
    fails_with(checks.check_read_weights, lambda q, k, g: (k * (_after(g) + g).exp()) @ q, "its own token's g",
               "decay first, then write")
    fails_with(checks.check_read_weights, lambda q, k, g: (k * g.cumsum(0).exp()) @ q, "forward cumsum")
    fails_with(checks.check_read_weights, lambda q, k, g: (k * _after(g).mean(-1, keepdim=True).exp()) @ q,
               "Gated DeltaNet", "own g_s[c]")
    fails_with(checks.check_read_weights, lambda q, k, g: (k * (_after(g) - g[-1] * T_before(g)).exp()) @ q,
               "decay of token t itself")
    fails_with(checks.check_read_weights, lambda q, k, g: solutions.read_weights(q, k, g) * len(q) ** -0.5,
               "No scale here")
    fails_with(checks.check_read_weights, lambda q, k, g: (k * _after(g).exp())[:-1] @ q, "a has shape")


def test_read_weights_rebuild_the_read_of_the_trained_model():
    """The solution's weights, applied to the writes of a real KDA head, give the read that head makes."""
    from sim.recall_moment import delta_rule_reads_and_writes
    from tiny_k3 import DEFAULT_PROMPT, TraceRecorder
    from tiny_k3.tokenizer import encode

    model, _ = workshop.load_model("small")
    rec = TraceRecorder()
    with torch.no_grad():
        model(torch.tensor([encode(DEFAULT_PROMPT)]), recorder=rec)
    layer, ev = rec.of("kda")[0]
    q, k, v, g, beta = (ev[n][0] for n in ("q", "k", "v", "g", "beta"))
    reads, writes = delta_rule_reads_and_writes(q, k, v, g, beta)
    for h in range(q.shape[1]):
        a = solutions.read_weights(q[-1, h].double(), k[:, h].double(), g[:, h].double())
        assert torch.allclose(a @ writes[:, h], reads[-1, h], atol=1e-8), (layer, h)


# ---------------------------------------------------------------------------- lesson 3


def test_mla_cache_bytes_mistakes_are_named():
    def values_not_bytes(cfg, t):
        return t * len(cfg.mla_layers) * cfg.mla_cache_width

    def assumed_fp32(cfg, t):
        return t * len(cfg.mla_layers) * cfg.mla_cache_width * 4

    def every_layer(cfg, t):
        return t * cfg.num_layers * cfg.mla_cache_width * cfg.dtype_bytes

    def no_rope(cfg, t):
        return t * len(cfg.mla_layers) * cfg.kv_lora_rank * cfg.dtype_bytes

    def per_head(cfg, t):
        return t * len(cfg.mla_layers) * cfg.mla_heads * (cfg.qk_head_dim + cfg.v_head_dim) * cfg.dtype_bytes

    fails_with(checks.check_mla_cache_bytes, values_not_bytes, "values, not bytes", "dtype_bytes")
    fails_with(checks.check_mla_cache_bytes, assumed_fp32, "Off by the dtype", "bfloat16", "'k3'")
    fails_with(checks.check_mla_cache_bytes, every_layer, "Only the 1 MLA layers", "KDA layers")
    fails_with(checks.check_mla_cache_bytes, no_rope, "k_rope")
    fails_with(checks.check_mla_cache_bytes, per_head, "per-head K and V")
    fails_with(checks.check_mla_cache_bytes, lambda cfg, t: 2 * solutions.mla_cache_bytes(cfg, t),
               "separate K and V")


def test_kda_state_bytes_mistakes_are_named():
    def no_conv(cfg):
        return len(cfg.kda_layers) * cfg.kda_heads * cfg.kda_head_dim ** 2 * 4

    def state_in_weight_dtype(cfg):
        return solutions.kda_state_bytes(cfg) - no_conv(cfg) + no_conv(cfg) * cfg.dtype_bytes // 4

    fails_with(checks.check_kda_state_bytes, no_conv, "short-convolution tail")

    # the tiny presets are float32 anyway; the mistake shows on K3 (bfloat16)
    fails_with(checks.check_kda_state_bytes, state_in_weight_dtype, "always float32")


# ---------------------------------------------------------------------------- lesson 4


def depth_with_sqrt_d(sources, query, gain):
    keys = sources * torch.rsqrt(sources.pow(2).mean(-1, keepdim=True) + 1e-6) * gain
    w = (keys @ query / sources.shape[-1] ** 0.5).softmax(0)
    return w @ sources, w


def depth_sum_of_keys(sources, query, gain):
    keys = sources * torch.rsqrt(sources.pow(2).mean(-1, keepdim=True) + 1e-6) * gain
    w = (keys @ query).softmax(0)
    return w @ keys, w


def depth_no_key_norm(sources, query, gain):
    w = (sources @ query).softmax(0)
    return w @ sources, w


def depth_wrong_axis(sources, query, gain):
    keys = sources * torch.rsqrt(sources.pow(2).mean(-1, keepdim=True) + 1e-6) * gain
    w = (keys * query).softmax(-1).sum(-1)         # softmax over channels: not one weight per source
    return w @ sources, w


def depth_l2_keys(sources, query, gain):
    keys = F.normalize(sources, dim=-1) * gain      # KDA's q/k normalisation, not AttnRes's RMSNorm
    w = (keys @ query).softmax(0)
    return w @ sources, w


def test_depth_attention_mistakes_are_named():
    fails_with(checks.check_depth_attention, depth_l2_keys, "L2-normalised the keys", "RMSNorm", "√D")
    fails_with(checks.check_depth_attention, lambda s, q, g: depth_l2_keys(s, q, torch.ones_like(g)),
               "L2-normalised the keys")
    fails_with(checks.check_depth_attention, depth_with_sqrt_d, "no 1/√d")
    fails_with(checks.check_depth_attention, depth_sum_of_keys, "summed the normalised keys", "raw sources")
    fails_with(checks.check_depth_attention, depth_no_key_norm, "did not normalise the keys")
    fails_with(checks.check_depth_attention, depth_wrong_axis, "softmax must run over the N sources")


def test_block_sources_mistakes_are_named():
    def full_attnres(emb, outs, S):
        return [emb, *outs]

    def embedding_in_blocks(emb, outs, S):
        src = solutions.block_sources(emb, outs, S)
        return [src[0]] + [s + emb for s in src[1:]]

    def running_total(emb, outs, S):
        src = [emb]
        for start in range(0, len(outs), S):
            src.append(sum(outs[: start + S], torch.zeros_like(emb)))
        return src

    def no_partial(emb, outs, S):
        return [emb] + [sum(outs[i:i + S], torch.zeros_like(emb)) for i in range(0, len(outs) - S + 1, S)]

    fails_with(checks.check_block_sources, full_attnres, "Full AttnRes")
    fails_with(checks.check_block_sources, embedding_in_blocks, "includes the embedding")
    fails_with(checks.check_block_sources, running_total, "running total")
    fails_with(checks.check_block_sources, no_partial, "Expected", "partial sum")


# ---------------------------------------------------------------------------- lesson 5


def test_mxfp4_bytes_mistakes_are_named():
    fails_with(checks.check_mxfp4_bytes, lambda r, c: r * c // 2, "1-byte E8M0 scale", "4.25")
    fails_with(checks.check_mxfp4_bytes, lambda r, c: r * math.ceil(c / 32) * 18, "INT4", "BF16")
    fails_with(checks.check_mxfp4_bytes, lambda r, c: math.ceil(r * c * 17 / 32), "padded")


def test_release_bytes_mistakes_are_named():
    def all_mxfp4(parts):
        return math.ceil(sum(parts.values()) / 32) * 17

    def naive_4bit(parts):
        return sum(parts.values()) // 2

    def no_scales(parts):
        return parts["routed_experts"] // 2 + (sum(parts.values()) - parts["routed_experts"]) * 2

    fails_with(checks.check_release_bytes, all_mxfp4, "everything in MXFP4", "stay BF16")
    fails_with(checks.check_release_bytes, naive_4bit, "naive '1.4 TB'")
    fails_with(checks.check_release_bytes, no_scales, "forgot the MXFP4 scales")


def test_ep_bytes_mistakes_are_named():
    def full_width(cfg):
        d, k = cfg.hidden_size, cfg.top_k
        return k * (d + math.ceil(d / 32)) + k * d * 2

    def no_scales(cfg):
        return cfg.top_k * cfg.latent_dim * 3

    def dispatch_only(cfg):
        w, k = cfg.latent_dim, cfg.top_k
        return k * (w + math.ceil(w / 32))

    fails_with(checks.check_ep_bytes, full_width, "full-width x", "latent_dim = 3584")
    fails_with(checks.check_ep_bytes, no_scales, "dispatch scales")
    fails_with(checks.check_ep_bytes, dispatch_only, "both directions")


# ---------------------------------------------------------------------------- lesson 6


def test_decode_roofline_mistakes_are_named():
    ref = solutions.decode_roofline

    def with_bytes(change):
        return lambda m, b, t, f, bw, pk: {**ref(m, b, t, f, bw, pk), "bytes": change(m, b, t, ref(m, b, t, f, bw, pk)["bytes"])}

    fails_with(checks.check_decode_roofline, with_bytes(lambda m, b, t, v: v - b * m.state_bytes), "read AND written back")
    fails_with(checks.check_decode_roofline, with_bytes(lambda m, b, t, v: v - 2 * b * m.state_bytes), "state is missing")
    fails_with(checks.check_decode_roofline, with_bytes(lambda m, b, t, v: v + (b - 1) * m.dense_bytes), "once per step")
    fails_with(checks.check_decode_roofline, with_bytes(
        lambda m, b, t, v: v - m.moe_layers * m.num_experts * (1 - (1 - m.top_k / m.num_experts) ** b) * m.expert_bytes
        + m.moe_layers * m.num_experts * m.expert_bytes), "Not every expert")
    fails_with(checks.check_decode_roofline, with_bytes(
        lambda m, b, t, v: v - m.moe_layers * m.num_experts * (1 - (1 - m.top_k / m.num_experts) ** b) * m.expert_bytes
        + m.moe_layers * b * m.top_k * m.expert_bytes), "share experts")
    fails_with(checks.check_decode_roofline, lambda m, b, t, f, bw, pk: {**ref(m, b, t, f, bw, pk), "flops": f},
               "its own token's FLOPs")
    raw = lambda m, b, t, f, bw, pk: {**ref(m, b, t, f, bw, pk),  # noqa: E731
                                      "bound": "compute" if b * f > ref(m, b, t, f, bw, pk)["bytes"] else "memory"}
    fails_with(checks.check_decode_roofline, raw, "compare the TIMES")
    fails_with(checks.check_decode_roofline, lambda *a: (1, 2, "memory"), 'keys "bytes", "flops" and "bound"')


def test_decode_roofline_sees_both_bounds():
    """The check's cases include a compute-bound step (else a function answering "memory" always would pass)."""
    fails_with(checks.check_decode_roofline, lambda *a: {**solutions.decode_roofline(*a), "bound": "memory"},
               "compute-bound")
    fails_with(checks.check_decode_roofline, lambda *a: {**solutions.decode_roofline(*a), "bound": "compute"},
               "memory-bound")


def test_sublayer_order_mistakes_are_named():
    def every_fourth_only(cfg):
        order = ["embed"]
        for i in range(cfg.num_layers):
            order += ["mla" if (i + 1) % 4 == 0 else "kda", "dense" if i < cfg.first_k_dense else "moe"]
        return order + ["head"]

    def all_moe(cfg):
        return ["embed"] + [x for kind in cfg.layer_kinds for x in (kind, "moe")] + ["head"]

    def no_ends(cfg):
        return solutions.sublayer_order(cfg)[1:-1]

    fails_with(checks.check_sublayer_order, every_fourth_only, "last layer is always MLA")
    fails_with(checks.check_sublayer_order, all_moe, "dense MLP")
    fails_with(checks.check_sublayer_order, no_ends, "missing ['embed', 'head']")


def test_num_sources_mistakes_are_named():
    def no_partial(cfg, layer, site):
        S = 1 if cfg.residual == "full" else cfg.attnres_block_size
        return 1 + (2 * layer + (site == "mlp")) // S

    def full(cfg, layer, site):
        return 1 + 2 * layer + (site == "mlp")

    fails_with(checks.check_num_sources, no_partial, "forgot the partial sum")
    fails_with(checks.check_num_sources, full, "Full AttnRes")


# ---------------------------------------------------------------------------- lesson 8


def test_weighted_loss_mistakes_are_named():
    def ce(logits, targets):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")

    fails_with(checks.check_weighted_loss, lambda lg, t, w: ce(lg, t).mean(), "plain mean", "Σ w·ce / Σ w")
    fails_with(checks.check_weighted_loss, lambda lg, t, w: (ce(lg, t) * w.reshape(-1)).mean(), "number of positions")
    fails_with(checks.check_weighted_loss, lambda lg, t, w: (ce(lg, t) * w.reshape(-1)).sum(), "weighted sum")
    fails_with(checks.check_weighted_loss, lambda lg, t, w: "loss", "should be a number")


def test_lr_at_mistakes_are_named():
    def from_zero(step, steps, lr, warmup):
        return lr * step / warmup if step < warmup else solutions.lr_at(step, steps, lr, warmup)

    def to_zero(step, steps, lr, warmup):
        if step < warmup:
            return lr * (step + 1) / warmup
        return lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    def progress_from_zero(step, steps, lr, warmup):
        if step < warmup:
            return lr * (step + 1) / warmup
        return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps)))

    fails_with(checks.check_lr_at, from_zero, "starts at 0", "(step + 1)")
    fails_with(checks.check_lr_at, to_zero, "decays to 0", "lr / 10")
    fails_with(checks.check_lr_at, progress_from_zero, "end of the warm-up")


def test_wilson_interval_mistakes_are_named():
    def wald(hits, n, z=1.96):
        p = hits / n
        half = z * math.sqrt(p * (1 - p) / n)
        return max(0.0, p - half), min(1.0, p + half)

    def no_floor(hits, n, z=1.96):
        p = hits / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n)
        return max(0.0, centre - half), min(1.0, centre + half)

    fails_with(checks.check_wilson_interval, wald, "Wald", "single point")
    fails_with(checks.check_wilson_interval, no_floor, "z²/(4n²)")
    fails_with(checks.check_wilson_interval, lambda h, n, z=1.96: solutions.wilson_interval(h, n)[::-1],
               "low is above your high")
    fails_with(checks.check_wilson_interval, lambda h, n, z=1.96: h / n, "Return two numbers")


# ---------------------------------------------------------------------------- workshop helpers


def test_try_exercise_reports_each_outcome(capsys):
    def stub(*args):
        raise NotImplementedError

    workshop.try_exercise(checks.check_mxfp4_bytes, stub)
    out = capsys.readouterr().out
    assert "not done yet" in out and "MXFP4" in out and "17 B" not in out      # the formula is hint 2's
    assert "exercise 5.1 · difficulty ★☆☆ · about 6 min" in out and "hint('5.1', 2)" in out

    workshop.try_exercise(checks.check_mxfp4_bytes, lambda r, c: r * c // 2)
    assert "✗ check_mxfp4_bytes: not yet right" in capsys.readouterr().out

    workshop.try_exercise(checks.check_mxfp4_bytes, solutions.mxfp4_bytes)
    assert "✓ check_mxfp4_bytes passed" in capsys.readouterr().out


def test_instructor_mode_comes_from_the_environment(monkeypatch):
    import importlib

    try:
        monkeypatch.setenv("TINY_K3_SOLUTIONS", "1")
        assert importlib.reload(workshop).SOLUTIONS is True
        monkeypatch.delenv("TINY_K3_SOLUTIONS")
        assert importlib.reload(workshop).SOLUTIONS is False
    finally:
        workshop.use_solutions(False)


def test_exercise_decorator_swaps_in_the_solution_only_in_instructor_mode():
    try:
        workshop.use_solutions(False)

        @workshop.exercise("mxfp4_bytes")
        def mine(rows, cols):
            raise NotImplementedError

        with pytest.raises(NotImplementedError):
            mine(1, 32)
        workshop.use_solutions(True)

        @workshop.exercise("mxfp4_bytes")
        def mine(rows, cols):  # noqa: F811
            raise NotImplementedError

        assert mine(1, 32) == 17 and mine.is_reference_solution
    finally:
        workshop.use_solutions(False)


def test_every_exercise_heading_shows_its_difficulty_and_minutes():
    """A lesson's "### Exercise N.M — title (★★☆, about 8 min)" heading carries the registry's stars and minutes,
    for every registered exercise (the build thread's B.n included), so a learner sees both before starting."""
    import re

    import checks.build  # noqa: F401  (registers B.1 … B.5)

    headings = {}
    for path in sorted(LESSONS.glob("0[0-9]_*.py")):
        for number, rest in re.findall(r"^# ### Exercise (\w+\.\d+) — (.*)$", path.read_text(encoding="utf-8"), re.M):
            headings[number] = (path.name, rest)
    missing = sorted(set(checks.EXERCISES) - set(headings))
    assert not missing, f"exercises without a heading in any lesson: {missing}"
    for number, ex in checks.EXERCISES.items():
        name, rest = headings[number]
        assert rest.endswith(f"({ex.stars}, about {ex.minutes} min)"), (
            f"{name}: the heading of exercise {number} should end with ({ex.stars}, about {ex.minutes} min), "
            f"as its check registers; it reads {rest!r}")
