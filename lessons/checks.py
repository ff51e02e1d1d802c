"""Exercise checks: each one tests a learner's function on random inputs against tiny_k3 / sim, offline.

A check returns quietly after printing one success line, or raises `ExerciseError` with a message
that teaches: which shape, which term, and the right value for this very input. Known mistakes (a
scalar decay instead of a per-channel one, weights taken from scores + bias, bytes off by the dtype,
a missing renormalisation, ...) are recognised by recomputing the mistaken formula on the same input
and naming it. A NotImplementedError from the learner's stub passes through untouched, so
`workshop.try_exercise` can say "not done yet".

    check_route            top-k routing with a selection bias          (lesson 1)
    check_active_params    active parameters from the real breakdown    (lesson 1)
    check_bias_update      aux-loss-free load balancing                 (lesson 1)
    check_kda_step         one KDA recurrent step for one head          (lesson 2)
    check_kda_gate         the KDA decay gate                           (lesson 2)
    check_mla_cache_bytes  bytes of the MLA latent cache                (lesson 3)
    check_kda_state_bytes  bytes of the fixed KDA state                 (lesson 3)
    check_depth_attention  one depth-attention read                     (lesson 4)
    check_block_sources    the sources of Block AttnRes                 (lesson 4)
    check_mxfp4_bytes      MXFP4 bytes of a weight matrix               (lesson 5)
    check_release_bytes    K3's release checkpoint size                 (lesson 5)
    check_ep_bytes         expert-parallel traffic per token            (lesson 5)
    check_sublayer_order   the sublayers one token passes through       (lesson 6)
    check_num_sources      how many depth sources a sublayer reads      (lesson 6)
"""

from __future__ import annotations

import functools
import math

import torch


class ExerciseError(AssertionError):
    """A learner's function gave a wrong answer; the message says what, where, and the right value."""


# ---------------------------------------------------------------------------- helpers


def _fmt(x, digits: int = 4, limit: int = 6) -> str:
    """A short printable form of a tensor / list / number."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dim() == 0:
            return f"{x.item():.{digits}g}"
        flat = x.flatten().tolist()
        body = ", ".join(f"{v:.{digits}g}" if isinstance(v, float) else str(v) for v in flat[:limit])
        more = ", …" if len(flat) > limit else ""
        return f"[{body}{more}] (shape {list(x.shape)})" if x.dim() > 1 else f"[{body}{more}]"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return repr(x)


def _call(fn, args: tuple, describe: str, hint: str = ""):
    """Call the learner's function; any exception but NotImplementedError becomes a teaching error."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise
    except ExerciseError:
        raise
    except Exception as exc:  # the learner's bug, reported with the inputs that caused it
        msg = f"Your function raised {type(exc).__name__}: {exc}\n  on input {describe}."
        raise ExerciseError(msg + (f"\n  Hint: {hint}" if hint else "")) from None


def _tensor(x, name: str, shape: tuple, meaning: str) -> torch.Tensor:
    """The learner's output as a tensor of the expected shape, or a message naming the shape."""
    if not isinstance(x, torch.Tensor):
        try:
            x = torch.as_tensor(x)
        except Exception:
            raise ExerciseError(f"{name} should be a tensor of shape {list(shape)} ({meaning}); "
                                f"got a {type(x).__name__}.") from None
    if tuple(x.shape) != tuple(shape):
        raise ExerciseError(f"{name} has shape {list(x.shape)} but should be {list(shape)} ({meaning}).")
    return x


def _close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-6, rtol: float = 1e-5) -> bool:
    return tuple(a.shape) == tuple(b.shape) and torch.allclose(a.to(torch.float64), b.to(torch.float64),
                                                               atol=atol, rtol=rtol)


def _int(x, name: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, float)) and not (isinstance(x, torch.Tensor) and x.numel() == 1):
        raise ExerciseError(f"{name} should be a number of bytes (an int); got {type(x).__name__}.")
    value = float(x)
    if not math.isfinite(value):
        raise ExerciseError(f"{name} should be a finite number of bytes; got {value}.")
    return round(value)


def _passed(name: str, what: str) -> None:
    print(f"✓ {name} passed: {what}")


def _expects(text: str):
    """Attach the spec that try_exercise prints while the stub is not written yet."""

    def wrap(check):
        check.expects = text.strip()
        return check

    return wrap


# ---------------------------------------------------------------------------- lesson 1: MoE


@_expects("""
my_route(scores, bias, top_k) -> (expert_ids, weights)
  scores [T, E]  sigmoid affinities s (each in (0, 1)), bias [E] selection bias b, top_k = k
  expert_ids [T, k] (long): the k experts with the largest s + b for each token (any order)
  weights    [T, k]: the *unbiased* scores s of those experts, divided by their sum (they add up to 1)
Checked against tiny_k3.moe.route on random routers with E = 12, 56 and 896 (k3_facts.md §1c, §3b).
""")
def check_route(fn) -> None:
    from tiny_k3.moe import route

    gen = torch.Generator().manual_seed(1)
    for T, E, k in [(3, 12, 3), (4, 56, 4), (2, 896, 16)]:
        scores = torch.sigmoid(torch.randn(T, E, generator=gen, dtype=torch.float64))
        bias = 0.4 * torch.randn(E, generator=gen, dtype=torch.float64)
        ref = route(scores, bias, k)
        got = _call(fn, (scores.clone(), bias.clone(), k), f"scores [{T}, {E}], bias [{E}], top_k={k}",
                    "topk(scores + bias, k) gives the ids; scores.gather(-1, ids) the unbiased scores.")
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise ExerciseError("Return two things: (expert_ids [T, k], weights [T, k]).")
        ids = _tensor(got[0], "expert_ids", (T, k), "k expert ids per token")
        w = _tensor(got[1], "weights", (T, k), "one weight per chosen expert")
        ids = ids.long()
        want_ids = ref.expert_ids.sort(-1).values
        if not torch.equal(ids.sort(-1).values, want_ids):
            plain = scores.topk(k, -1).indices.sort(-1).values
            if torch.equal(ids.sort(-1).values, plain):
                raise ExerciseError(
                    "You chose the experts by the score s alone. The selection bias b decides *which* experts "
                    "win: take topk(s + b). (It is DeepSeek-V3's aux-loss-free balancing: b is nudged during "
                    "training so every expert gets its share; k3_facts.md §3b.)\n"
                    f"  token 0: right ids {_fmt(want_ids[0], limit=16)}, yours {_fmt(ids.sort(-1).values[0], limit=16)}.")
            low = (scores + bias).topk(k, -1, largest=False).indices.sort(-1).values
            if torch.equal(ids.sort(-1).values, low):
                raise ExerciseError("You took the k *smallest* biased scores; the router keeps the largest.")
            raise ExerciseError(f"Wrong experts for E={E}, k={k}: token 0 should use {_fmt(want_ids[0], limit=16)} "
                                f"(the k largest s + b), yours are {_fmt(ids.sort(-1).values[0], limit=16)}.")
        # align the learner's weights with the reference order, whatever order the ids came in
        order = [(ids[t].unsqueeze(0) == ref.expert_ids[t].unsqueeze(1)).int().argmax(1) for t in range(T)]
        w = torch.stack([w[t, order[t]] for t in range(T)])
        if _close(w, ref.weights, atol=1e-6):
            continue
        chosen = scores.gather(-1, ref.expert_ids)
        biased = (scores + bias).gather(-1, ref.expert_ids)
        wrong = {
            "biased": biased / biased.sum(-1, keepdim=True),
            "biased_raw": biased,
            "raw": chosen,
            "softmax": chosen.softmax(-1),
            "softmax_all": torch.softmax(scores, -1).gather(-1, ref.expert_ids),
        }
        right = f"for token 0 the right weights are {_fmt(ref.weights[0])}, yours {_fmt(w[0])}."
        if _close(w, wrong["biased"]) or _close(w, wrong["biased_raw"]):
            raise ExerciseError("Your weights include the selection bias. Select with s + b, but weigh with the "
                                "unbiased s only: w = s[ids] / Σ s[ids] (the bias is for balancing, never "
                                "for mixing; k3_facts.md §1c).\n  " + right)
        if _close(w, wrong["raw"]):
            raise ExerciseError(f"Your weights sum to {w[0].sum().item():.3f} for token 0, not 1: renormalise, "
                                "w = s[ids] / Σ s[ids] (K3 config: moe_renormalize = true, "
                                "routed_scaling_factor = 1.0).\n  " + right)
        if _close(w, wrong["softmax"]) or _close(w, wrong["softmax_all"]):
            raise ExerciseError("You took a softmax. K3's router is sigmoid-based: the weights are the chosen "
                                "sigmoid scores divided by their sum (no exponentials).\n  " + right)
        raise ExerciseError("The ids are right but the weights are not: " + right)
    _passed("check_route", "top-k of s + b, weights from s, renormalised — same as tiny_k3.moe.route "
                           "for E = 12, 56 and 896.")


@_expects("""
my_active_params(parts, num_experts, top_k) -> int
  parts: tiny_k3.parameter_breakdown(config), parameters per part of the model (a dict), e.g.
         {"routed_experts": ..., "kda": ..., "mla": ..., "shared_experts": ..., "latent_proj": ...,
          "router": ..., "dense_mlp": ..., "embedding": ..., "lm_head": ..., "norms_attnres": ...}
  returns the parameters ONE token touches: all weights it multiplies, with only top_k of the
  num_experts routed experts (the convention behind K3's "104B active", k3_facts.md §1d).
Checked against tiny_k3.parameter_counts for tiny, small, mini-56/1, mini-896/16 and k3.
""")
def check_active_params(fn) -> None:
    from tiny_k3 import K3Config, parameter_breakdown, parameter_counts

    for name in ["tiny", "small", "mini-56/1", "mini-896/16", "k3"]:
        cfg = K3Config.preset(name)
        parts = dict(parameter_breakdown(cfg))
        total, want = parameter_counts(cfg)
        got = _int(_call(fn, (dict(parts), cfg.num_experts, cfg.top_k),
                         f"parameter_breakdown({name!r}), num_experts={cfg.num_experts}, top_k={cfg.top_k}"),
                   "my_active_params(...)")
        if abs(got - want) <= 1:
            continue
        right = f"For {name!r} the right count is {want:,}; yours is {got:,}."
        experts_on = parts["routed_experts"] * cfg.top_k // cfg.num_experts
        if got == total:
            raise ExerciseError("You returned every parameter (the total). A token runs only top_k of the "
                                "num_experts routed experts: count routed_experts × top_k / num_experts. " + right)
        if abs(got - (want + parts["embedding"])) <= 1:
            raise ExerciseError("You counted the input embedding. It is a table lookup (one row per token), not "
                                "a matmul, so K3's 104B leaves it out; the lm_head *is* a matmul and counts. " + right)
        if abs(got - (want - parts["lm_head"])) <= 1:
            raise ExerciseError("You left out the lm_head: every token multiplies it to get its logits. " + right)
        if abs(got - (want - parts["router"])) <= 1:
            raise ExerciseError("You left out the router: it scores all E experts for every token, so all of it "
                                "is active. " + right)
        if abs(got - (want - parts["shared_experts"])) <= 1:
            raise ExerciseError("You left out the shared experts: they run on every token. " + right)
        if abs(got - experts_on) <= 1:
            raise ExerciseError("You counted only the active routed experts. Attention, shared experts, router, "
                                "latent projections, norms and the head run for every token too. " + right)
        raise ExerciseError(right + " Active = everything except the embedding and the idle "
                                    "(num_experts − top_k) / num_experts of the routed experts.")
    _passed("check_active_params", "matches tiny_k3.parameter_counts (from the real modules on the meta "
                                   f"device) on five presets, K3 included: {want / 1e9:.1f}B active.")


@_expects("""
my_bias_update(bias, load, rate) -> new_bias
  bias [E] the selection bias b, load [E] tokens routed to each expert in the last batch, rate = γ.
  DeepSeek-V3's aux-loss-free update: an overloaded expert (load above the mean) gets b − γ, an
  underloaded one b + γ, a balanced one keeps b (k3_facts.md §3b).
Checked against tiny_k3.moe.Router.update_bias.
""")
def check_bias_update(fn) -> None:
    from tiny_k3.moe import Router

    gen = torch.Generator().manual_seed(3)
    for E in [8, 56, 896]:
        bias = 0.01 * torch.randn(E, generator=gen)
        load = torch.randint(0, 30, (E,), generator=gen).float()
        load[0] = load.mean().round()  # (may or may not be exactly the mean; fine either way)
        router = Router(4, E, 1)
        router.bias.copy_(bias)
        want = router.update_bias(load.clone(), rate=1e-3).clone()
        got = _tensor(_call(fn, (bias.clone(), load.clone(), 1e-3), f"bias [{E}], load [{E}], rate=1e-3",
                            "torch.sign(load.mean() - load) is +1 for underloaded experts."),
                      "new_bias", (E,), "one bias per expert")
        if _close(got, want, atol=1e-7):
            continue
        over = int((load - load.mean()).argmax())
        right = (f"Expert {over} took {int(load[over])} tokens (mean {load.mean():.1f}): its bias should go "
                 f"from {bias[over]:.5f} to {want[over]:.5f}; yours is {got[over]:.5f}.")
        if _close(got, bias - 1e-3 * torch.sign(load.mean() - load), atol=1e-7):
            raise ExerciseError("Wrong direction. An overloaded expert must become *less* attractive, so its bias "
                                "goes down: b ← b + γ·sign(mean(load) − load). " + right)
        if _close(got, bias + 1e-3 * (load.mean() - load), atol=1e-7):
            raise ExerciseError("You stepped by the size of the imbalance. The aux-loss-free rule moves every bias "
                                "by the same fixed γ, only the sign depends on the load. " + right)
        if _close(got, bias, atol=1e-9):
            raise ExerciseError("The bias did not change. " + right)
        raise ExerciseError(right)
    _passed("check_bias_update", "b ← b + γ·sign(mean(load) − load), as tiny_k3.moe.Router.update_bias.")


# ---------------------------------------------------------------------------- lesson 2: KDA


@_expects("""
my_kda_step(S, q, k, v, g, beta, scale) -> (o, S_new)       one token, one head (kda.md §1)
  S [K, V] state (rows = key channels), q, k [K] (L2-normalised), v [V], g [K] log-decay (g ≤ 0),
  beta: a 0-d tensor in (0, 1), scale: a float (K ** -0.5 in the model)
  S'    = Diag(exp g) S                       decay each key row d by its own exp(g_d)
  S_new = S' + beta · k (v − S'ᵀ k)ᵀ          the delta rule: write only what the memory gets wrong
  o     = S_newᵀ (scale · q)                  read from the updated state
  returns o [V], S_new [K, V]
Checked against tiny_k3.kda.kda_recurrent (T = 1) in float64, with K ≠ V (e.g. K = 6, V = 5).
""")
def check_kda_step(fn) -> None:
    from tiny_k3.kda import kda_recurrent

    gen = torch.Generator().manual_seed(2)
    f64 = dict(dtype=torch.float64)
    for K, V in [(6, 5), (8, 8), (16, 12)]:
        S = torch.randn(K, V, generator=gen, **f64)
        q = torch.nn.functional.normalize(torch.randn(K, generator=gen, **f64), dim=0)
        k = torch.nn.functional.normalize(torch.randn(K, generator=gen, **f64), dim=0)
        v = torch.randn(V, generator=gen, **f64)
        g = -5.0 * torch.rand(K, generator=gen, **f64)  # strongly different decays per channel
        beta = torch.rand((), generator=gen, **f64) * 0.8 + 0.1
        scale = K ** -0.5
        o_ref, S_ref = kda_recurrent(q.view(1, 1, 1, K), k.view(1, 1, 1, K), v.view(1, 1, 1, V), g.view(1, 1, 1, K),
                                     beta.view(1, 1, 1), scale=scale, initial_state=S.view(1, 1, K, V),
                                     output_final_state=True)
        o_ref, S_ref = o_ref.view(V), S_ref.view(K, V)
        got = _call(fn, (S.clone(), q.clone(), k.clone(), v.clone(), g.clone(), beta.clone(), scale),
                    f"S [{K}, {V}], q, k, g [{K}], v [{V}], beta (0-d), scale={scale:.4f}",
                    f"g has K = {K} entries, one per *row* (key channel) of S [K, V]: g.exp()[:, None] * S.")
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise ExerciseError("Return two things: (o [V], S_new [K, V]).")
        o = _tensor(got[0], "o", (V,), f"one value per value channel, V = {V}")
        S_new = _tensor(got[1], "S_new", (K, V), f"the state keeps its shape [K, V] = [{K}, {V}]")
        if _close(S_new, S_ref, atol=1e-9) and _close(o, o_ref, atol=1e-9):
            continue

        def update(decayed, recall_from=None, delta=True, use_beta=True):
            src = decayed if recall_from is None else recall_from
            err = (v - src.T @ k) if delta else v
            return decayed + (beta if use_beta else 1.0) * torch.outer(k, err)

        decayed = g.exp()[:, None] * S
        right = f"For this input S_new[0] should be {_fmt(S_ref[0])}; yours is {_fmt(S_new[0])}."
        if not _close(S_new, S_ref, atol=1e-9):
            for label, a in [("the mean of g", g.mean()), ("g[0]", g[0]), ("the sum of g", g.sum()),
                             ("the last g", g[-1])]:
                if _close(S_new, update(a.exp() * S), atol=1e-9):
                    raise ExerciseError(
                        f"Your decay is one number for the whole head (you used {label}) — that is Gated DeltaNet. "
                        "KDA decays each key channel separately: row d of S is multiplied by its own exp(g_d), "
                        "S' = Diag(exp g) S, i.e. g.exp()[:, None] * S (kda.md §1).\n  " + right)
            if _close(S_new, update(g[:, None] * S), atol=1e-9):
                raise ExerciseError("g is a *log* decay: multiply the rows by exp(g), not by g.\n  " + right)
            if _close(S_new, update(S), atol=1e-9):
                raise ExerciseError("You never decayed the state. First S' = Diag(exp g) S, then write.\n  " + right)
            if _close(S_new, update(decayed, delta=False), atol=1e-9):
                raise ExerciseError(
                    "You wrote β·k vᵀ — linear attention's update, which piles new values on top of old ones. "
                    "The delta rule writes only the error: β·k (v − S'ᵀk)ᵀ, where S'ᵀk is what the memory "
                    "already returns for key k (kda.md §1).\n  " + right)
            if _close(S_new, update(decayed, recall_from=S), atol=1e-9):
                raise ExerciseError("Recall from the decayed state: the error is v − S'ᵀk with S' = Diag(exp g) S, "
                                    "not v − Sᵀk.\n  " + right)
            if _close(S_new, update(decayed, use_beta=False), atol=1e-9):
                raise ExerciseError("You left out β: the write strength multiplies the whole correction, "
                                    "β·k (v − S'ᵀk)ᵀ.\n  " + right)
            raise ExerciseError("S_new is wrong. " + right)
        want = f"For this input o should be {_fmt(o_ref)}; yours is {_fmt(o)}."
        for label, state in [("the old state S", S), ("the decayed state S' (before the write)", decayed)]:
            if _close(o, state.T @ (scale * q), atol=1e-9):
                raise ExerciseError(f"S_new is right, but you read o from {label}. Read after writing: "
                                    "o = S_newᵀ (scale · q), so a token can recall what it just wrote.\n  " + want)
        if _close(o, S_ref.T @ q, atol=1e-9):
            raise ExerciseError(f"S_new is right, but o misses the scale: o = S_newᵀ (scale · q) with scale = "
                                f"K^-0.5 = {scale:.4f}.\n  " + want)
        raise ExerciseError("S_new is right but o is not. " + want)
    _passed("check_kda_step", "per-channel decay, delta-rule write and read agree with "
                              "tiny_k3.kda.kda_recurrent (float64, K ≠ V included).")


@_expects("""
my_kda_gate(g_raw, A_log, dt_bias, lower_bound) -> g                  (kda.md §3)
  g_raw [T, H, K], A_log [H], dt_bias [H*K] (head-major: view(H, K)), lower_bound a negative float or None
  lower_bound None:  g = −exp(A_log) · softplus(g_raw + dt_bias)             (Kimi Linear)
  otherwise:         g = lower_bound · sigmoid(exp(A_log) · (g_raw + dt_bias))  (K3: lower_bound = −5)
  returns g [T, H, K], the per-channel log decay (g ≤ 0, so exp(g) ∈ (0, 1]).
Checked against tiny_k3.kda.kda_gate.
""")
def check_kda_gate(fn) -> None:
    from torch.nn.functional import softplus

    from tiny_k3.kda import kda_gate

    gen = torch.Generator().manual_seed(4)
    for T, H, K, lb in [(3, 2, 4, None), (3, 2, 4, -5.0), (5, 3, 8, -5.0), (2, 4, 3, None)]:
        g_raw = torch.randn(T, H, K, generator=gen, dtype=torch.float64)
        A_log = torch.randn(H, generator=gen, dtype=torch.float64)
        dt_bias = torch.randn(H * K, generator=gen, dtype=torch.float64)
        want = kda_gate(g_raw[None], A_log, dt_bias, lb)[0]
        got = _tensor(_call(fn, (g_raw.clone(), A_log.clone(), dt_bias.clone(), lb),
                            f"g_raw [{T}, {H}, {K}], A_log [{H}], dt_bias [{H * K}], lower_bound={lb}",
                            "A_log has one entry per head: A_log.exp()[:, None] broadcasts over K; "
                            "dt_bias.view(H, K)."),
                      "g", (T, H, K), "one log decay per token, head and key channel")
        if _close(got, want, atol=1e-9):
            continue
        mode = "without a bound" if lb is None else f"with lower_bound={lb}"
        right = f"{mode}: g[0, 0] should be {_fmt(want[0, 0])}; yours is {_fmt(got[0, 0])}."
        x = g_raw + dt_bias.view(H, K)
        a = A_log.exp()[:, None]
        x_bad = g_raw + dt_bias.view(K, H).T
        wrong = ([("A_log used without exp", -A_log[:, None] * softplus(x), lb * torch.sigmoid(A_log[:, None] * x)
                   if lb else None),
                  ("dt_bias laid out as [K, H]", -a * softplus(x_bad), lb * torch.sigmoid(a * x_bad) if lb else None),
                  ("a positive sign", a * softplus(x), -lb * torch.sigmoid(a * x) if lb else None),
                  ("dt_bias left out", -a * softplus(g_raw), lb * torch.sigmoid(a * g_raw) if lb else None)])
        hints = {"A_log used without exp": "A_log is a logarithm: the rate is exp(A_log).",
                 "dt_bias laid out as [K, H]": "dt_bias is head-major: dt_bias.view(H, K), entry h·K + d belongs to "
                                               "head h, channel d.",
                 "a positive sign": "g is a log decay, so it must be ≤ 0 (exp(g) ≤ 1 forgets; exp(g) > 1 would "
                                    "blow the state up).",
                 "dt_bias left out": "add dt_bias (the per-channel offset) before the nonlinearity."}
        for label, unbounded, bounded in wrong:
            candidate = unbounded if lb is None else bounded
            if _close(got, candidate, atol=1e-9):
                raise ExerciseError(f"{hints[label]}\n  " + right)
        if lb is not None and _close(got, -A_log.exp()[:, None] * softplus(x), atol=1e-9):
            raise ExerciseError("With a lower bound K3 uses the sigmoid form g = lb·σ(exp(A_log)(g_raw + dt_bias)), "
                                "which keeps g in (lb, 0) = (−5, 0): no channel can forget everything in one "
                                "token.\n  " + right)
        if lb is not None and _close(got, lb * torch.sigmoid(x), atol=1e-9):
            raise ExerciseError("Multiply by exp(A_log) inside the sigmoid: g = lb·σ(exp(A_log)(g_raw + "
                                "dt_bias)).\n  " + right)
        raise ExerciseError(right)
    _passed("check_kda_gate", "both gate forms (softplus and K3's lower-bound sigmoid) agree with "
                              "tiny_k3.kda.kda_gate.")


# ---------------------------------------------------------------------------- lesson 3: memory


def _memory_cases():
    from tiny_k3 import K3Config

    return [(K3Config.preset(n), t) for n, t in [("tiny", 1), ("tiny", 37), ("small", 100), ("mini-896/16", 5),
                                                  ("k3", 1), ("k3", 1 << 20)]]


@_expects("""
my_mla_cache_bytes(config, tokens) -> int
  bytes of the growing KV cache of ONE sequence after `tokens` tokens, for a tiny_k3.K3Config.
  Only the gated-MLA layers (config.mla_layers) keep one: per token and per MLA layer the latent c
  (config.kv_lora_rank values) and the shared key part (config.qk_rope_dim values), stored in
  config.dtype (config.dtype_bytes bytes per value). K3: 24 × 576 × 2 = 27,648 B per token (k3_facts.md §5a).
Checked against sim.memory.cache_bytes (which tests prove equal to the bytes of the live cache tensors).
""")
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


@_expects("""
my_kda_state_bytes(config) -> int
  bytes of ALL fixed KDA decode state of one sequence, for a tiny_k3.K3Config:
  per KDA layer (config.kda_layers):
    the state S [H, K, V] in float32 (4 bytes, whatever config.dtype is), H = kda_heads, K = V = kda_head_dim
    the short-convolution tail: the last (kda_conv_kernel − 1) inputs of q, k and v
      (2·H·K + H·V channels) in config.dtype
  K3: 69 × 96 × 128 × 128 × 4 + 69 × 3 × 36,864 × 2 = 449 MB (k3_facts.md §5a).
Checked against sim.memory.state_bytes_fixed.
""")
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


# ---------------------------------------------------------------------------- lesson 4: AttnRes


@_expects("""
my_depth_attention(sources, query, norm_weight) -> (h, weights)       one token (attnres.md §2)
  sources [N, D]: v_0 = the embedding, then earlier sublayer outputs (or block sums); query [D]: w_l;
  norm_weight [D]: the gain of the key RMSNorm; use eps = 1e-6
  keys    = RMSNorm(sources) · norm_weight          x / sqrt(mean(x²) + eps), over D
  logits  = keys @ query                             no 1/sqrt(D)
  weights = softmax over the N sources              [N], sums to 1
  h       = Σ_i weights_i · sources_i               the RAW sources, not the normalised keys     [D]
Checked against tiny_k3.attnres.depth_attention.
""")
def check_depth_attention(fn) -> None:
    from tiny_k3.attnres import depth_attention
    from tiny_k3.norm import rms_norm

    gen = torch.Generator().manual_seed(5)
    for N, D in [(2, 8), (5, 16), (9, 32)]:
        scales = torch.logspace(-1, 1, N, dtype=torch.float64)[:, None]  # sources of very different sizes
        sources = torch.randn(N, D, generator=gen, dtype=torch.float64) * scales
        query = torch.randn(D, generator=gen, dtype=torch.float64)
        gain = torch.rand(D, generator=gen, dtype=torch.float64) + 0.5
        h_ref, w_ref = depth_attention(sources[:, None, None], query, gain, eps=1e-6)
        h_ref, w_ref = h_ref.view(D), w_ref.view(N)
        got = _call(fn, (sources.clone(), query.clone(), gain.clone()),
                    f"sources [{N}, {D}], query [{D}], norm_weight [{D}]",
                    "normalise over the last dim (D); the softmax runs over the N sources (dim 0).")
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise ExerciseError("Return two things: (h [D], weights [N]).")
        h = _tensor(got[0], "h", (D,), "one vector of the model width D")
        w = _tensor(got[1], "weights", (N,), f"one weight per source, N = {N}")
        if _close(h, h_ref, atol=1e-5) and _close(w, w_ref, atol=1e-5):
            continue
        keys = rms_norm(sources, gain, 1e-6)
        right = f"For this input the weights are {_fmt(w_ref)}; yours are {_fmt(w)}."
        if not _close(w, w_ref, atol=1e-5):
            if abs(float(w.sum()) - 1) > 1e-4:
                raise ExerciseError(f"Your weights sum to {float(w.sum()):.4f}: the softmax must run over the N "
                                    "sources (depth), one weight per source. " + right)
            if _close(w, torch.full((N,), 1 / N, dtype=torch.float64)):
                raise ExerciseError("Uniform weights are what a zero query gives. Use the query: logit_i = "
                                    "query · RMSNorm(source_i). " + right)
            for label, logits in [
                ("You divided the logits by sqrt(D). AttnRes has no 1/√d on depth logits (attnres.md §2, §9): "
                 "the keys are RMS-normalised already.", keys @ query / D ** 0.5),
                ("You did not normalise the keys. Keys are RMSNorm(source)·norm_weight, so a loud source does not "
                 "win just by being loud.", sources @ query),
                ("You forgot the key-norm gain: keys = RMSNorm(source) · norm_weight.",
                 rms_norm(sources, None, 1e-6) @ query),
            ]:
                if _close(w, logits.softmax(0), atol=1e-5):
                    raise ExerciseError(label + " " + right)
            raise ExerciseError(right)
        right_h = f"h[:4] should be {_fmt(h_ref[:4])}; yours is {_fmt(h[:4])}."
        if _close(h, w_ref @ keys, atol=1e-5) or _close(h, w_ref @ rms_norm(sources, None, 1e-6), atol=1e-5):
            raise ExerciseError("The weights are right, but you summed the normalised keys. Only the keys are "
                                "normalised; h mixes the raw sources: h = Σ w_i · source_i. " + right_h)
        if _close(h, sources.sum(0), atol=1e-5):
            raise ExerciseError("That is the standard residual (an unweighted sum). Mix with the weights. " + right_h)
        raise ExerciseError("The weights are right but h is not. " + right_h)
    _passed("check_depth_attention", "RMS-normed keys, no 1/√d, softmax over depth, raw values — as "
                                     "tiny_k3.attnres.depth_attention.")


@_expects("""
my_block_sources(embedding, outputs, block_size) -> list of tensors   (Block AttnRes, attnres.md §2)
  embedding [D]; outputs: the sublayer outputs v_1 .. v_n produced so far (a list of [D]);
  block_size S: sublayers per block.
  returns what the NEXT sublayer attends over, in order:
    b_0 = the embedding,
    b_1 .. b_m: the sums of the outputs of each completed block (S outputs each; each block sums ONLY its own),
    and, if the current block has started, its partial sum (the outputs since the last completed block).
Checked against tiny_k3.attnres.DepthStream.
""")
def check_block_sources(fn) -> None:
    from tiny_k3.attnres import DepthStream

    gen = torch.Generator().manual_seed(6)
    D = 4
    for S in [2, 3, 4]:
        for n in range(0, 8):
            emb = torch.randn(D, generator=gen, dtype=torch.float64)
            outs = [torch.randn(D, generator=gen, dtype=torch.float64) for _ in range(n)]
            stream = DepthStream(emb, "block", S)
            for v in outs:
                stream.add(v)
            want = stream.sources()
            got = _call(fn, (emb.clone(), [v.clone() for v in outs], S),
                        f"embedding [{D}], {n} outputs, block_size={S}")
            if not isinstance(got, (list, tuple)):
                raise ExerciseError("Return a list of [D] tensors (the sources, embedding first).")
            got = [_tensor(x, f"source {i}", (D,), "each source is a vector of width D") for i, x in enumerate(got)]
            completed, partial = n // S, n % S
            layout = (f"after {n} outputs with block_size {S}: the embedding, {completed} completed block sum(s)"
                      + (f" and a partial sum of the last {partial} output(s)" if partial else " and no partial sum"))
            if len(got) != len(want):
                if len(got) == n + 1:
                    raise ExerciseError(f"You returned one source per output: that is Full AttnRes (block_size 1). "
                                        f"Block AttnRes sums each block of {S} outputs into one source; {layout} "
                                        f"= {len(want)} sources.")
                raise ExerciseError(f"Expected {len(want)} sources, got {len(got)}: {layout}.")
            for i, (a, b) in enumerate(zip(got, want)):
                if _close(a, b, atol=1e-9):
                    continue
                what = "b_0 (the embedding)" if i == 0 else ("the partial sum" if partial and i == len(want) - 1
                                                              else f"block sum b_{i}")
                zero = torch.zeros(D, dtype=torch.float64)
                upto = sum(outs[: min(i * S, n)], zero)  # everything from the start up to this source
                hint = ""
                if i > 0 and _close(a, b + emb, atol=1e-9):
                    hint = " It includes the embedding: block sums hold sublayer outputs only; the embedding is b_0, alone."
                elif i > 1 and (_close(a, upto, atol=1e-9) or _close(a, upto + emb, atol=1e-9)):
                    hint = " It is a running total from the start; each b_n sums only its own block's outputs."
                raise ExerciseError(f"Source {i} ({what}) is wrong, {layout}.{hint}\n"
                                    f"  It should be {_fmt(b)}; yours is {_fmt(a)}.")
    _passed("check_block_sources", "embedding, completed block sums and the partial sum — as "
                                   "tiny_k3.attnres.DepthStream for block sizes 2, 3 and 4.")


# ---------------------------------------------------------------------------- lesson 5: economics


@_expects("""
my_mxfp4_bytes(rows, cols) -> int
  bytes of a [rows, cols] weight matrix stored as MXFP4 (OCP MX, k3_facts.md §4):
  each row is cut into blocks of 32 values (the last block of a row is padded);
  a block stores 32 E2M1 values of 4 bits (16 B) plus one shared 8-bit E8M0 scale (1 B).
Checked against sim.costs.mxfp4_bytes.
""")
def check_mxfp4_bytes(fn) -> None:
    from sim.costs import mxfp4_bytes

    for rows, cols in [(1, 32), (3072, 3584), (7, 100), (5, 33), (2, 31), (1, 1)]:
        want = mxfp4_bytes((rows, cols))
        got = _int(_call(fn, (rows, cols), f"rows={rows}, cols={cols}"), "my_mxfp4_bytes(...)")
        if got == want:
            continue
        n = rows * cols
        blocks = rows * -(-cols // 32)
        right = f"A [{rows}, {cols}] matrix takes {want:,} B ({blocks:,} blocks × 17 B); yours is {got:,} B."
        if got in (n // 2, math.ceil(n / 2)):
            raise ExerciseError("4 bits per value is only the data. Every block of 32 values also stores one "
                                "shared 1-byte E8M0 scale: 16 + 1 = 17 B per 32 values, 4.25 bits per value. " + right)
        if got == blocks * 18:
            raise ExerciseError("18 B per block is INT4 with a BF16 (2-byte) scale — K2-Thinking's 4.5-bit format. "
                                "MXFP4's scale is a single E8M0 byte: 17 B per block. " + right)
        if got in (math.ceil(n * 17 / 32), n * 17 // 32, round(n * 4.25 / 8)):
            raise ExerciseError("Blocks do not straddle rows: each row is packed on its own and its last block is "
                                f"padded, so a row of {cols} values takes ceil({cols}/32) = {-(-cols // 32)} "
                                "blocks. " + right)
        if got == -(-n // 32) * 17:
            raise ExerciseError("Count blocks per row, not over the whole matrix: each row's last block is "
                                "padded. " + right)
        raise ExerciseError(right)
    _passed("check_mxfp4_bytes", "17 B per block of 32 values per row, as sim.costs.mxfp4_bytes.")


@_expects("""
my_release_bytes(parts) -> int
  parts: tiny_k3.parameter_breakdown(config) (parameters per part, a dict)
  bytes of K3's released checkpoint format: the routed experts in MXFP4 (17 B per 32 values, count the
  blocks over the whole routed_experts part: ceil(n / 32)), everything else in BF16 (2 B per value)
  (config.json: compressed-tensors mxfp4, "ignore shared_experts" and the non-expert layers; k3_facts.md §1b, §4).
Checked against sim.costs.weight_bytes(config, "k3-release") on K3 (1.560 TB) and two small presets.
""")
def check_release_bytes(fn) -> None:
    from sim.costs import weight_bytes
    from tiny_k3 import K3Config, parameter_breakdown

    for name in ["mini-896/16", "small", "k3"]:
        cfg = K3Config.preset(name)
        parts = dict(parameter_breakdown(cfg))
        want = weight_bytes(cfg, "k3-release")
        got = _int(_call(fn, (dict(parts),), f"parameter_breakdown({name!r})"), "my_release_bytes(...)")
        if abs(got - want) <= 17:
            continue
        total = sum(parts.values())
        routed = parts["routed_experts"]
        tb = lambda x: f"{x / 1e12:.3f} TB" if name == "k3" else f"{x:,} B"  # noqa: E731
        right = f"For {name!r} the release is {tb(want)}; yours is {tb(got)}."
        near = lambda x: abs(got - x) <= max(17, 1e-6 * want)  # noqa: E731
        if near(total * 17 / 32):
            raise ExerciseError("You stored everything in MXFP4. Only the routed experts are MXFP4; attention, "
                                "shared experts, router, latent projections, embedding and head stay BF16. " + right)
        if near(total / 2):
            raise ExerciseError("2.8T × 4 bit: that is the naive '1.4 TB' of the claim. Real MXFP4 adds a 1-byte "
                                "scale per 32 values (4.25 bit), and the non-expert 57B stay BF16. " + right)
        if near(routed / 2 + (total - routed) * 2):
            raise ExerciseError("You forgot the MXFP4 scales: 17 B per 32 values, not 16. " + right)
        if near(routed * 17 / 32):
            raise ExerciseError("You counted only the experts; add the BF16 rest (2 B per parameter). " + right)
        if near(routed * 17 / 32 + (total - routed - parts["embedding"]) * 2):
            raise ExerciseError("The input embedding is stored too (it is not active per token, but it is on "
                                "disk and in memory). " + right)
        raise ExerciseError(right)
    _passed("check_release_bytes", f"MXFP4 experts + BF16 rest = {want / 1e12:.3f} TB for K3, as "
                                   "sim.costs.weight_bytes(k3, 'k3-release').")


@_expects("""
my_ep_bytes(config) -> int
  all-to-all bytes ONE token causes in ONE MoE layer under expert parallelism (k3_facts.md §6b),
  counted per routed copy (top_k copies):
    dispatch: the token's activation in FP8/MXFP8 — 1 byte per value plus one 1-byte scale per 32 values
    combine:  the expert's result sent back in BF16 — 2 bytes per value
  Which activation travels? With latent MoE the token is projected down BEFORE dispatch (K3: 7168 -> 3584).
Checked against sim.costs.ep_traffic_for(config).per_layer.
""")
def check_ep_bytes(fn) -> None:
    from sim.costs import ep_traffic_for

    from tiny_k3 import K3Config

    for name in ["k3", "small", "mini-56/1", "mini-896/16"]:
        cfg = K3Config.preset(name)
        want = ep_traffic_for(cfg).per_layer
        got = _int(_call(fn, (cfg,), f"config {name!r}"), "my_ep_bytes(...)")
        if got == want:
            continue
        k, d, l = cfg.top_k, cfg.hidden_size, cfg.latent_dim
        dispatch = lambda w: k * (w + -(-w // 32))  # noqa: E731
        right = f"For {name!r} it is {want:,} B per token per layer; yours is {got:,} B."
        if got == dispatch(d) + k * d * 2:
            raise ExerciseError(f"You sent the full-width x (hidden_size = {d}). Latent MoE projects the token to "
                                f"latent_dim = {l} before dispatch and back up after combine, so only {l} values "
                                "travel: that is how K3 doubles top-k over K2 at the same traffic. " + right)
        if got == k * l + k * l * 2:
            raise ExerciseError("You forgot the dispatch scales: MXFP8 sends one 1-byte scale per 32 values. " + right)
        if got == dispatch(l) + k * l:
            raise ExerciseError("The combine travels in BF16 (2 bytes per value), not FP8. " + right)
        if got == dispatch(l) or got == k * l * 2:
            raise ExerciseError("Count both directions: dispatch (to the experts) and combine (back). " + right)
        if got * k == want:
            raise ExerciseError(f"Each of the top_k = {k} experts gets its own copy. " + right)
        raise ExerciseError(right)
    _passed("check_ep_bytes", f"dispatch + combine in the latent width, as sim.costs.ep_traffic_for "
                              f"(K3: {ep_traffic_for(K3Config.preset('k3')).per_layer / 1e3:.1f} KB per token per layer).")


# ---------------------------------------------------------------------------- lesson 6: one token


def _traced_configs():
    """Small configs whose real forward pass is cheap, with different schedules and residual modes."""
    from tiny_k3 import K3Config

    tiny = K3Config.preset("tiny")
    return [
        tiny,
        tiny.replace(name="tiny-6L", num_layers=6, layer_kinds=(), first_k_dense=2, attnres_block_size=3),
        tiny.replace(name="tiny-9L-full", num_layers=9, layer_kinds=(), first_k_dense=1, residual="full"),
        tiny.replace(name="tiny-5L-b4", num_layers=5, layer_kinds=(), first_k_dense=0, attnres_block_size=4),
    ]


@functools.lru_cache(maxsize=8)
def _trace_config(cfg):
    """(sublayer kinds in order, [(layer, site, number of depth sources)]) from a real forward pass."""
    from tiny_k3 import TinyK3, TraceRecorder

    torch.manual_seed(0)
    model = TinyK3(cfg)
    rec = TraceRecorder()
    with torch.no_grad():
        model(torch.tensor([[256, 104, 105]]), recorder=rec)
    kinds = tuple(data["kind"] for _, data in rec.of("sublayer"))
    depth = tuple((layer, data["site"], data["weights"].shape[-1]) for layer, data in rec.of("depth")
                  if data["weights"] is not None)
    return kinds, depth


@_expects("""
my_sublayer_order(config) -> list of str
  the sublayers one token passes through, in order, for a tiny_k3.K3Config:
  "embed", then for each layer its attention sublayer ("kda" or "mla") and its MLP sublayer
  ("dense" for the first config.first_k_dense layers, "moe" after), then "head".
  The attention kinds follow config.layer_kinds: K3's schedule puts MLA on every 4th layer (1-based) AND
  on the last layer.
Checked against the events a real TinyK3 forward pass reports (tiny_k3.TraceRecorder).
""")
def check_sublayer_order(fn) -> None:
    for cfg in _traced_configs():
        want = ["embed", *_trace_config(cfg)[0], "head"]
        got = _call(fn, (cfg,), f"config {cfg.name!r} ({cfg.num_layers} layers, first_k_dense={cfg.first_k_dense})")
        if not isinstance(got, (list, tuple)) or not all(isinstance(x, str) for x in got):
            raise ExerciseError("Return a list of strings such as ['embed', 'kda', 'dense', ..., 'head'].")
        got = list(got)
        if got == want:
            continue
        right = f"For {cfg.name!r}: {want}\n  yours: {got}"
        if len(got) != len(want):
            missing = [x for x in ("embed", "head") if x not in got]
            if missing:
                raise ExerciseError(f"The walk starts at the embedding and ends at the head; missing {missing}. " + right)
            raise ExerciseError(f"A token passes {len(want)} stops: embed, 2 per layer × {cfg.num_layers} layers, "
                                f"head; you listed {len(got)}. " + right)
        attn_got, attn_want = got[1:-1:2], want[1:-1:2]
        if attn_got != attn_want:
            if attn_got[:-1] == attn_want[:-1]:
                raise ExerciseError("The last layer is always MLA in K3's schedule (K3: layers 92 and 93 are both "
                                    "MLA). " + right)
            raise ExerciseError("The attention kinds follow config.layer_kinds (K3: MLA at 1-based layers 4, 8, … "
                                "and the last). " + right)
        raise ExerciseError(f"The first {cfg.first_k_dense} layer(s) have a dense MLP, the rest MoE "
                            "(config.first_k_dense). " + right)
    _passed("check_sublayer_order", "embed → (attention, MLP) per layer → head, as a real forward pass reports it.")


@_expects("""
my_num_sources(config, layer, site) -> int
  how many sources the depth-attention read before a sublayer attends over (the length of its weights),
  for a tiny_k3.K3Config with residual "block" or "full"; layer is 0-based, site is "attn" or "mlp"
  (or "out" with layer = num_layers: the final read before the head).
  Sublayers are numbered in order: layer i's attention is sublayer 2i, its MLP 2i + 1. Before sublayer j,
  j outputs exist. Block AttnRes with block size S (config.attnres_block_size; "full" means S = 1):
  the embedding + one sum per completed block (j // S) + the partial sum if j % S > 0.
Checked against the depth weights a real TinyK3 forward pass reports.
""")
def check_num_sources(fn) -> None:
    for cfg in _traced_configs():
        if cfg.residual == "standard":
            continue
        for layer, site, want in _trace_config(cfg)[1]:
            got = _int(_call(fn, (cfg, layer, site), f"config {cfg.name!r}, layer={layer}, site={site!r}"),
                       "my_num_sources(...)")
            if got == want:
                continue
            S = 1 if cfg.residual == "full" else cfg.attnres_block_size
            j = 2 * layer + (site == "mlp")
            right = (f"Before {site} of layer {layer} in {cfg.name!r} (residual {cfg.residual!r}, S = {S}): "
                     f"{j} output{'s' if j != 1 else ''} exist{'s' if j == 1 else ''} → 1 + {j // S} + {int(j % S > 0)} = {want} "
                     f"sources; yours is {got}.")
            if got == j + 1 and S > 1:
                raise ExerciseError("That is Full AttnRes (one source per output). Block AttnRes sums each block "
                                    "of S outputs into one source. " + right)
            if got == want - 1 and j % S:
                raise ExerciseError("You forgot the partial sum of the current block: from a block's second "
                                    "sublayer on, it is a source too. " + right)
            if got == want + 1 and not j % S:
                raise ExerciseError("At a block boundary the partial sum has just been closed into a block sum; "
                                    "there is no extra partial source. " + right)
            raise ExerciseError(right)
    _passed("check_num_sources", "embedding + completed blocks + partial sum, as the depth weights of a real "
                                 "forward pass (block and full residuals).")


ALL_CHECKS = [check_route, check_active_params, check_bias_update, check_kda_step, check_kda_gate,
              check_mla_cache_bytes, check_kda_state_bytes, check_depth_attention, check_block_sources,
              check_mxfp4_bytes, check_release_bytes, check_ep_bytes, check_sublayer_order, check_num_sources]
