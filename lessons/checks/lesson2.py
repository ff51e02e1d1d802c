"""Lesson 2 checks: one KDA recurrent step, the KDA decay gate, the read as a weighted sum of past writes."""

from __future__ import annotations

import functools
import math

import torch

from ._common import ExerciseError, _call, _close, _fmt, _int, _passed, _tensor, register

@register("2.1", "kda_step", difficulty=3, minutes=15, expects="""
my_kda_step(S, q, k, v, g, beta, scale) -> (o, S_new)       one token, one head (kda.md §1)
  S [K, V] state (rows = key channels), q, k [K] (L2-normalised), v [V], g [K] log-decay (g ≤ 0),
  beta: a 0-d tensor in (0, 1), scale: a float (K ** -0.5 in the model)
  returns o [V] (the read-out for this token) and S_new [K, V] (the state after this token)
  three steps: forget (per key channel), write with the delta rule, read from the new state.
Checked against tiny_k3.kda.kda_recurrent (T = 1) in float64, with K ≠ V (e.g. K = 6, V = 5).
""",
          hints=('Decay each ROW d of S by its own exp(g_d); then write only the error between v and what the '
                 'decayed memory already returns for k; then read with the scaled query from the NEW state.',
                 'Three moves, S keeps its shape [K, V] throughout. Forget: multiply row d of S by exp(g_d) (g [K] '
                 "broadcast down the rows) → S'. Write: what S' returns for key k is S'ᵀk [V]; the error is v − "
                 "S'ᵀk [V]; add β times the outer product k (v − S'ᵀk)ᵀ [K, V] → S_new. Read: S_newᵀ (scale · q) → "
                 'o [V].',
                 'S_dec = g.exp()[:, None] * S;  S_new = S_dec + beta * torch.outer(k, v - S_dec.T @ k)\n'
                 '  o = S_new.T @ (scale * q);  return o, S_new'))
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
            flipped = decayed - beta * torch.outer(k, v - decayed.T @ k)
            if _close(S_new, flipped, atol=1e-9):
                raise ExerciseError(
                    "Your correction has the wrong sign: you wrote β·k (S'ᵀk − v)ᵀ, which moves the memory AWAY from v. "
                    "The delta rule adds β·k (v − S'ᵀk)ᵀ, so that S_newᵀk lands closer to v. Yours is off by twice "
                    f"the correction: largest difference {float((S_new - S_ref).abs().max()):.3g}, and S_newᵀk misses "
                    f"v by {float((S_new.T @ k - v).norm()):.3g} where the right state misses it by "
                    f"{float((S_ref.T @ k - v).norm()):.3g}.\n  " + right)
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


@register("2.2", "kda_gate", difficulty=2, minutes=10, expects="""
my_kda_gate(g_raw, A_log, dt_bias, lower_bound) -> g                  (kda.md §3)
  g_raw [T, H, K], A_log [H], dt_bias [H*K] (head-major), lower_bound a negative float or None
  lower_bound None: Kimi Linear's unbounded softplus gate;  otherwise K3's bounded sigmoid gate
  returns g [T, H, K], the per-channel log decay (g ≤ 0, so exp(g) ∈ (0, 1]).
Checked against tiny_k3.kda.kda_gate.
""",
          hints=('Both forms add the per-channel offset dt_bias and scale by the per-head rate exp(A_log); the '
                 'softplus form negates, the bounded form squeezes into (lower_bound, 0) with a sigmoid.',
                 'Lay dt_bias [H·K] out head-major as [H, K] and add it to g_raw [T, H, K]. The rate exp(A_log) is '
                 'one number per head: give it the shape [H, 1] so that it broadcasts over the K channels. Without '
                 'a bound: minus the rate times softplus of the sum. With one: lower_bound times the sigmoid of '
                 '(rate times the sum). Result [T, H, K], every entry ≤ 0.',
                 'H, K = g_raw.shape[-2:];  x = g_raw + dt_bias.view(H, K);  rate = A_log.exp()[:, None]\n'
                 '  None:  return -rate * F.softplus(x)            bounded:  return lower_bound * '
                 'torch.sigmoid(rate * x)'))
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


@register("2.3", "read_weights", difficulty=2, minutes=12, expects="""
my_read_weights(q, k, g) -> a                                  one head, the read at token t (kda.md §1)
  q [K]: the query of token t;  k [t+1, K]: the keys of tokens 0 … t;  g [t+1, K]: their log decays (g ≤ 0)
  returns a [t+1]: the weight of each past write in the read at t, so that the read S_tᵀ q equals
  Σ_d a[d] · u_d, where u_d is the value-side write of token d:
  S_d = Diag(exp g_d) S_{d−1} + k_d u_dᵀ, starting from S = 0.
  No β and no scale here: β is inside u_d, and the scale only multiplies the layer's output.
Checked against the delta rule replayed step by step (sim.recall_moment.delta_rule_reads_and_writes).
""",
          hints=("Unroll the recurrence: the write of token d is made after token d's own decay, and every later "
                 'token d+1 … t multiplies key row c of the state by exp(g_s[c]) again. So the read sees k_d '
                 'decayed channel by channel, dotted with q.',
                 'For token d and channel c the write fades by exp(Σ_{s=d+1}^{t} g_s[c]) before the read at t: a '
                 'sum over the rows of g [t+1, K] AFTER row d. A cumulative sum taken from the last row backwards '
                 "gives Σ_{s=d}^{t}; take row d's own g back out. Multiply k [t+1, K] elementwise by exp of that, "
                 'then contract the K axis with q [K] → a [t+1].',
                 'after = g.flip(0).cumsum(0).flip(0) - g      # Σ_{s=d+1}^{t} g_s per channel\n'
                 '  return (k * after.exp()) @ q'))
def check_read_weights(fn) -> None:
    from sim.recall_moment import delta_rule_reads_and_writes

    gen = torch.Generator().manual_seed(23)
    f64 = dict(dtype=torch.float64)
    for T, K, V in [(6, 5, 4), (1, 4, 3), (12, 8, 8)]:
        q = torch.nn.functional.normalize(torch.randn(T, 1, K, generator=gen, **f64), dim=-1)
        k = torch.nn.functional.normalize(torch.randn(T, 1, K, generator=gen, **f64), dim=-1)
        v = torch.randn(T, 1, V, generator=gen, **f64)
        g = -2.0 * torch.rand(T, 1, K, generator=gen, **f64)          # decays that differ by channel and token
        beta = torch.rand(T, 1, generator=gen, **f64) * 0.8 + 0.1
        reads, writes = delta_rule_reads_and_writes(q, k, v, g, beta)
        r, u = reads[-1, 0], writes[:, 0]                              # the read at t = T - 1, the writes [T, V]
        qt, kk, gg = q[-1, 0], k[:, 0], g[:, 0]
        after = gg.flip(0).cumsum(0).flip(0) - gg                     # Σ_{s=d+1}^{t} g_s
        want = (kk * after.exp()) @ qt
        got = _tensor(_call(fn, (qt.clone(), kk.clone(), gg.clone()), f"q [{K}], k [{T}, {K}], g [{T}, {K}]",
                            "k and g have one row per token 0 … t; the result has one weight per token."),
                      "a", (T,), f"one weight per past token 0 … t, t + 1 = {T}")
        if _close(got, want, atol=1e-9):
            if not _close(got @ u, r, atol=1e-9):       # cannot happen if want is right: a guard on the check itself
                raise ExerciseError("a matches, but Σ a_d u_d does not give the read; please report this.")
            continue
        right = f"For this input (t = {T - 1}) a should be {_fmt(want)}; yours is {_fmt(got)}."
        upto = gg.cumsum(0)
        wrong = [
            (kk @ qt, "You left out the decay: that is linear attention's (and DeltaNet's) weight k_d · q. In KDA "
                      "every token after d shrinks key channel c of the state by exp(g_s[c]), so the write of d "
                      "reaches the read at t only through exp(Σ_{s=d+1}^{t} g_s) per channel."),
            ((kk * (after + gg).exp()) @ qt, "You decayed each write by its own token's g as well. The order inside a "
                      "step is: decay first, then write (S_d = Diag(exp g_d) S_{d−1} + k_d u_dᵀ), so write d is "
                      "shrunk only by tokens d+1 … t: exp(Σ_{s=d+1}^{t} g_s), i.e. exp(reverse cumsum − g)."),
            ((kk * (after - gg[-1] * (torch.arange(T) < T - 1)[:, None]).exp()) @ qt if T > 1 else None,
             "You left out the decay of token t itself: the read at t comes after "
                      "token t's decay step, so every earlier write is shrunk by tokens d+1 … t, t included."),
            ((kk * upto.exp()) @ qt, "Your decay counts from the start of the sequence (a forward cumsum). A write "
                      "fades from the moment it is made: the decay between token d and the read at t is "
                      "Σ_{s=d+1}^{t} g_s, a sum over the tokens *after* d (a reverse cumsum)."),
            ((kk * (after.mean(-1, keepdim=True)).exp()) @ qt, "Your decay is one number per token for the whole "
                      "head (the mean over channels) — Gated DeltaNet's. KDA decays each key channel c by its own "
                      "g_s[c]: keep the K channels apart until the dot product with q."),
        ]
        for candidate, message in wrong:
            if candidate is not None and _close(got, candidate, atol=1e-9):
                raise ExerciseError(message + "\n  " + right)
        if _close(got, want * K ** -0.5, atol=1e-9):
            raise ExerciseError("No scale here: the read S_tᵀ q is what the writes add up to; the K^-0.5 scale only "
                                "multiplies the layer's output.\n  " + right)
        raise ExerciseError(right)
    _passed("check_read_weights", "Σ_d a_d u_d equals the read S_tᵀ q: a KDA read is an attention-like weighted sum "
                                  "of past writes, each key decayed channel by channel since it was written.")
