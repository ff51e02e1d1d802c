"""Checks of the "Build it yourself" thread: the layers a learner writes in lessons 2, 3 and 6, then runs the model on.

    B.1 check_delta_step          the gated delta-rule step, every head at once          (lesson 2)
    B.2 check_delta_chunked       the chunked (WY/UT) form, against tiny_k3 and the learner's own step (lesson 2)
    B.3 check_kda_head            one KDA head: the layer's q/k norm, gate and β, then the step over a sequence
    B.4 check_attend_with_cache   softmax attention, one token at a time, appending to a KV cache (lesson 3)
    B.5 check_mla_decode          MLA's absorbed decode from the latent cache (lesson 6)

Each check compares with the project's own module (tiny_k3.kda, tiny_k3.mla) in float64 and names the usual
mistake by recomputing it on the same input. `against(check_delta_chunked, step=my_delta_step)` makes B.2 also
compare with the learner's own step. `run_your_layer(model, prompt, ...)` is the cell after the exercises: the
model on the lesson's prompt with the learner's function swapped in (tiny_k3.swap), against the model's own. Every
build exercise runs there: B.2 as the prefill of every KDA head (`chunked_head`), B.3 as the heads, B.4 as the MLA
layers' attention (refused unless its cache grows by one token a call, `growing`), B.5 as their latent decode.

These register into the same `EXERCISES` as the lessons' own checks (so `hint("B.1")` works once this module is
imported) but are not in `checks.ALL_CHECKS`: they are a thread of their own, imported from `checks.build`.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ._common import ExerciseError, _call, _close, _fmt, _passed, _tensor, register

TOLERANCE = 1e-9          # float64: the learner's layer and the project's agree to this, in the checks and the model
_F64 = dict(dtype=torch.float64)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to TOLERANCE, absolute and relative (float64 sums in another order differ by ~1e-16)."""
    return _close(a, b, atol=TOLERANCE, rtol=TOLERANCE)


def _recurrence(q, k, v, g, beta, scale, S0=None):
    """tiny_k3.kda.kda_recurrent on [T, H, .] inputs (no batch): (o [T, H, V], S [H, K, V])."""
    from tiny_k3.kda import kda_recurrent

    o, S = kda_recurrent(q[None], k[None], v[None], g[None], beta[None], scale=scale,
                         initial_state=None if S0 is None else S0[None], output_final_state=True)
    return o[0], S[0]


def _off(got: torch.Tensor, want: torch.Tensor) -> str:
    """How far off, for when the printed digits agree: ' (largest difference 3e-07; the check asks 1e-09)'."""
    return f" (largest difference {float((got.double() - want).abs().max()):.1e}; the check asks {TOLERANCE:g})"


def _pair(got, first: tuple, second: tuple):
    """The learner's (a, b) as two tensors of the given (name, shape, meaning)."""
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise ExerciseError(f"Return two things: ({first[0]} {list(first[1])}, {second[0]} {list(second[1])}).")
    return _tensor(got[0], *first), _tensor(got[1], *second)


# ---------------------------------------------------------------------------- B.1 the step

@register("B.1", "delta_step", difficulty=2, minutes=12, expects="""
my_delta_step(S, q, k, v, g, beta, scale) -> (o, S_new)      one token, every head at once (kda.md §1)
  S [H, K, V] the state of each head (rows = key channels), q, k [H, K] (L2-normalised), v [H, V],
  g [H, K] log-decay per head and key channel (g ≤ 0), beta [H] write strength in (0, 1), scale a float
  returns o [H, V] (each head's read-out) and S_new [H, K, V]
  forget per key channel, write the delta-rule correction, read from the new state: each head on its own.
Checked against tiny_k3.kda.kda_recurrent (T = 1) in float64, with K ≠ V and with K = V.
""", hints=(
    "Exercise 2.1's three moves, for H heads side by side: each head forgets row by row with its own decays, "
    "writes only what its memory gets wrong for the key, and reads with the scaled query after the write. "
    "Nothing mixes two heads.",
    "Shapes: the decay factor of head h and channel d multiplies row d of S[h], so it needs a trailing axis of "
    "size 1 to spread over V. The recall S'ᵀk is, per head, a K-vector against a K×V matrix: an [H, V] result. "
    "The write is, per head, the outer product of k [K] with β times the error [V]. The read is the same "
    "contraction as the recall, with the scaled query and the new state.",
    "S_dec = g.exp()[..., None] * S\n"
    "  err = v - torch.einsum('hk,hkv->hv', k, S_dec)\n"
    "  S_new = S_dec + beta[:, None, None] * k[..., None] * err[:, None, :]\n"
    "  o = torch.einsum('hk,hkv->hv', scale * q, S_new)"))
def check_delta_step(fn) -> None:
    gen = torch.Generator().manual_seed(41)
    for H, K, V in [(2, 6, 5), (3, 8, 8), (1, 4, 7)]:
        S = torch.randn(H, K, V, generator=gen, **_F64)
        q = F.normalize(torch.randn(H, K, generator=gen, **_F64), dim=-1)
        k = F.normalize(torch.randn(H, K, generator=gen, **_F64), dim=-1)
        v = torch.randn(H, V, generator=gen, **_F64)
        g = -4.0 * torch.rand(H, K, generator=gen, **_F64)        # decays that differ by channel and by head
        beta = torch.rand(H, generator=gen, **_F64) * 0.8 + 0.1
        scale = 0.37                                                # not K**-0.5: the given scale must be used
        o_ref, S_ref = _recurrence(q[None], k[None], v[None], g[None], beta[None], scale, S)   # as T = 1
        o_ref = o_ref[0]
        got = _call(fn, (S.clone(), q.clone(), k.clone(), v.clone(), g.clone(), beta.clone(), scale),
                    f"S [{H}, {K}, {V}], q, k, g [{H}, {K}], v [{H}, {V}], beta [{H}], scale={scale}",
                    "g [H, K] decays the rows of S [H, K, V]: it needs a trailing axis, g.exp()[..., None].")
        o, S_new = _pair(got, ("o", (H, V), "one read-out per head"), ("S_new", (H, K, V), "the state keeps its shape"))
        if _same(S_new, S_ref) and _same(o, o_ref):
            continue
        decayed = g.exp()[..., None] * S

        def write(dec, recall_from=None, delta=True, use_beta=True):
            src = dec if recall_from is None else recall_from
            err = v - torch.einsum("hk,hkv->hv", k, src) if delta else v
            return dec + (beta[:, None, None] if use_beta else 1.0) * k[..., None] * err[:, None, :]

        right = (f"For this input S_new[0, 0] should be {_fmt(S_ref[0, 0])}; yours is {_fmt(S_new[0, 0])}"
                 f"{_off(S_new, S_ref)}.")
        if not _same(S_new, S_ref):
            correction = beta[:, None, None] * k[..., None] * (v - torch.einsum("hk,hkv->hv", k, decayed))[:, None, :]
            flipped = decayed - correction
            if _same(S_new, flipped):
                recall_got, recall_ref = (torch.einsum("hk,hkv->hv", k, x) for x in (S_new, S_ref))
                raise ExerciseError(
                    "Your correction has the wrong sign: you wrote β k (S'ᵀk − v)ᵀ, which moves each head's memory "
                    "AWAY from v. The delta rule adds β k (v − S'ᵀk)ᵀ, so that S_newᵀk lands closer to v. Yours is off "
                    f"by twice the correction: largest difference {float((S_new - S_ref).abs().max()):.3g}, and "
                    f"S_newᵀk misses v by {float((recall_got - v).norm()):.3g} where the right state misses it by "
                    f"{float((recall_ref - v).norm()):.3g}.\n  " + right)
            wrong = [(write(g.mean(-1).exp()[:, None, None] * S),
                      "Your decay is one number per head (the mean of g over channels): Gated DeltaNet's. KDA decays "
                      "each key channel d of each head by its own exp(g[h, d])."),
                     (write(g[..., None] * S), "g is a *log* decay: the rows are multiplied by exp(g), not by g."),
                     (write(S), "You never decayed the state: first S' = Diag(exp g) S, then the write."),
                     (write(decayed, delta=False), "You wrote β k vᵀ, linear attention's update, which piles values "
                      "up. The delta rule writes only the error: β k (v − S'ᵀk)ᵀ."),
                     (write(decayed, recall_from=S), "Recall from the *decayed* state: the error is v − S'ᵀk with "
                      "S' = Diag(exp g) S, not v − Sᵀk."),
                     (write(decayed, use_beta=False), "You left out β: it multiplies the whole correction.")]
            if K == V:
                wrong.append((write(g.exp()[:, None, :] * S), "You decayed the *columns* of S (value channels). "
                              "g has one entry per key channel, and key channels are the rows: g.exp()[..., None]."))
            for candidate, message in wrong:
                if _same(S_new, candidate):
                    raise ExerciseError(message + "\n  " + right)
            raise ExerciseError("S_new is wrong. " + right)
        want = f"For this input o[0] should be {_fmt(o_ref[0])}; yours is {_fmt(o[0])}{_off(o, o_ref)}."
        for label, state in [("the old state S", S), ("the decayed state S' (before the write)", decayed)]:
            if _same(o, torch.einsum("hk,hkv->hv", scale * q, state)):
                raise ExerciseError(f"S_new is right, but you read o from {label}. Read after the write: "
                                    "o = S_newᵀ (scale · q).\n  " + want)
        for label, s in [("no scale", 1.0), (f"K^-0.5 = {K ** -0.5:.4f} instead of the scale given", K ** -0.5)]:
            if _same(o, torch.einsum("hk,hkv->hv", s * q, S_ref)):
                raise ExerciseError(f"S_new is right, but o uses {label}: o = S_newᵀ (scale · q) with the scale "
                                    f"passed in ({scale}).\n  " + want)
        raise ExerciseError("S_new is right but o is not. " + want)
    _passed("check_delta_step", "every head forgets per key channel, writes the delta-rule error and reads the new "
                                "state, as tiny_k3.kda.kda_recurrent (float64, K ≠ V and K = V).")


# ---------------------------------------------------------------------------- B.2 the chunked form

def against(check, **yours):
    """`check` that also compares with the learner's own earlier functions: against(check_delta_chunked,
    step=my_delta_step). Keeps the check's name, spec and exercise, so try_exercise reports it as usual."""
    wrapped = functools.partial(check, **yours)
    return functools.update_wrapper(lambda fn: wrapped(fn), check)


def _step_over(step, q, k, v, g, beta, scale, S0):
    """The learner's step run token by token: (o [T, H, V], S [H, K, V])."""
    T, H, K = q.shape
    S = torch.zeros(H, K, v.shape[-1], **_F64) if S0 is None else S0.clone()
    outs = []
    for t in range(T):
        o, S = step(S, q[t], k[t], v[t], g[t], beta[t], scale)
        outs.append(o)
    return torch.stack(outs), S


@register("B.2", "delta_chunked", difficulty=3, minutes=25, expects="""
my_delta_chunked(q, k, v, g, beta, scale, chunk_size, S0=None) -> (o, S)      a whole sequence (kda.md §2)
  q, k, g [T, H, K]; v [T, H, V]; beta [T, H]; scale a float; S0 [H, K, V] the state before the sequence or None
  returns o [T, H, V] and S [H, K, V], the state after the last token: the same numbers as your step run
  token by token, computed chunk_size tokens at a time with matrix products (the WY / UT form).
  T need not be a multiple of chunk_size; a chunk starts from the state the previous chunk left.
Checked against tiny_k3.kda.kda_chunked and against your own my_delta_step, in float64.
""", hints=(
    "Inside a chunk every token's write depends on the earlier ones only through a small lower-triangular system: "
    "solve it once for the whole chunk, and the chunk's outputs and its final state come out of a few matrix "
    "products. Then hand that state to the next chunk.",
    "Per head and chunk of C tokens: Γ is the running sum of g inside the chunk (inclusive). A [C, C] couples token "
    "r to each earlier i: β_r times k_r·k_i with each channel decayed from i to r, strictly below the diagonal. "
    "Solving (I + A) against Diag(β) gives T; W is T times the keys decayed from the chunk start, U is T times the "
    "values minus W times the incoming state. The outputs are the decayed queries against the incoming state plus "
    "P U, with P like A but for q against k, diagonal included. The outgoing state decays the incoming one by the "
    "chunk's total decay and adds the keys decayed to the chunk end, transposed, times U. Mask before taking exp.",
    # the code, whole: it runs as it stands (tests/test_build_exercises.py pastes it and checks it)
    "def my_delta_chunked(q, k, v, g, beta, scale, chunk_size, S0=None):\n"
    "    import torch\n"
    "    T, H, K = q.shape\n"
    "    S = q.new_zeros(H, K, v.shape[-1]) if S0 is None else S0\n"
    "    outputs = []\n"
    "    for start in range(0, T, chunk_size):\n"
    "        q_c, k_c, v_c, g_c = (x[start:start + chunk_size].transpose(0, 1) for x in (q, k, v, g))  # [H, C, .]\n"
    "        beta_c = beta[start:start + chunk_size].T                                                # [H, C]\n"
    "        C = q_c.shape[1]\n"
    "        G = g_c.cumsum(1)                     # decay from the chunk start, inclusive\n"
    "        causal = torch.ones(C, C, dtype=torch.bool).tril()\n"
    "        decay = (G[:, :, None] - G[:, None, :]).masked_fill(~causal[..., None], float('-inf')).exp()\n"
    "        strictly_below = torch.ones(C, C, dtype=q.dtype).tril(-1)\n"
    "        A = beta_c[..., None] * torch.einsum('hrk,hik,hrik->hri', k_c, k_c, decay) * strictly_below\n"
    "        eye = torch.eye(C, dtype=q.dtype).expand(H, C, C)\n"
    "        Tm = torch.linalg.solve_triangular(eye + A, torch.diag_embed(beta_c), upper=False, unitriangular=True)\n"
    "        W = Tm @ (k_c * G.exp())\n"
    "        U = Tm @ v_c - W @ S\n"
    "        P = torch.einsum('hrk,hik,hrik->hri', scale * q_c, k_c, decay)\n"
    "        outputs.append(((scale * q_c * G.exp()) @ S + P @ U).transpose(0, 1))\n"
    "        S = G[:, -1:].transpose(1, 2).exp() * S + (k_c * (G[:, -1:] - G).exp()).transpose(1, 2) @ U\n"
    "    return torch.cat(outputs), S"))
def check_delta_chunked(fn, step=None) -> None:
    from tiny_k3.kda import kda_chunked

    gen = torch.Generator().manual_seed(43)
    mine = "; not yet with your own step (my_delta_step is not written)" if step is not None else ""
    for T, H, K, V, C, with_state in [(10, 2, 5, 4, 4, True), (7, 1, 6, 6, 16, False), (16, 2, 4, 3, 8, True)]:
        q = F.normalize(torch.randn(T, H, K, generator=gen, **_F64), dim=-1)
        k = F.normalize(torch.randn(T, H, K, generator=gen, **_F64), dim=-1)
        v = torch.randn(T, H, V, generator=gen, **_F64)
        g = -2.0 * torch.rand(T, H, K, generator=gen, **_F64)
        beta = torch.rand(T, H, generator=gen, **_F64) * 0.8 + 0.1
        S0 = torch.randn(H, K, V, generator=gen, **_F64) if with_state else None
        scale = 0.41
        o_ref, S_ref = kda_chunked(q[None], k[None], v[None], g[None], beta[None], scale=scale,
                                   initial_state=None if S0 is None else S0[None], output_final_state=True,
                                   chunk_size=C)
        o_ref, S_ref = o_ref[0], S_ref[0]
        args = (q.clone(), k.clone(), v.clone(), g.clone(), beta.clone(), scale, C, None if S0 is None else S0.clone())
        got = _call(fn, args, f"q, k, g [{T}, {H}, {K}], v [{T}, {H}, {V}], beta [{T}, {H}], chunk_size={C}, "
                              f"S0 {'given' if with_state else 'None'}",
                    "work per chunk with the heads first ([H, C, K]); the last chunk may be shorter than chunk_size.")
        o, S = _pair(got, ("o", (T, H, V), "one read-out per token and head"), ("S", (H, K, V), "the final state"))
        matches = _same(o, o_ref) and _same(S, S_ref)
        if matches and step is not None:
            try:
                o_step, S_step = _step_over(step, q, k, v, g, beta, scale, S0)
            except NotImplementedError:
                continue
            except Exception as exc:
                raise ExerciseError(f"Your chunked form agrees with tiny_k3, but your own my_delta_step raised "
                                    f"{type(exc).__name__}: {exc}. Run check_delta_step on it (B.1).") from None
            if not (_same(o_step, o) and _same(S_step, S)):
                raise ExerciseError("Your chunked form agrees with tiny_k3.kda.kda_chunked, but not with your own "
                                    "my_delta_step run token by token: the step is the one that is off. Run "
                                    "check_delta_step on it (B.1); the two forms must be the same function.")
            mine = " and your own my_delta_step run token by token"
            continue
        if matches:
            continue
        right = f"For this input o[-1, 0] should be {_fmt(o_ref[-1, 0])}; yours is {_fmt(o[-1, 0])}{_off(o, o_ref)}."
        wrong = [(_recurrence(q, k, v, g, -beta, scale, S0), "Your correction has the wrong sign: each write must add "
                  "β k (v − S'ᵀk)ᵀ, moving the memory towards v; yours subtracts it (the same as a negative β), "
                  "so every token's write pushes the state away from its value."),
                 (_recurrence(q, k, v, g, beta, 1.0, S0), "You left out the scale: o = Sᵀ (scale · q)."),
                 (_recurrence(q, k, v, g, beta, scale), "The incoming state S0 is missing: the first chunk starts "
                  "from S0 (its U subtracts W S0, and its outputs add the decayed queries against S0)."),
                 (_per_chunk_from(S0, q, k, v, g, beta, scale, C), "Each chunk starts from S0 again: carry the state. "
                  "The state one chunk leaves is the state the next starts from.")]
        if T > C and T % C:
            whole = (T // C) * C
            o_cut, _ = _recurrence(q[:whole], k[:whole], v[:whole], g[:whole], beta[:whole], scale, S0)
            if _same(o[:whole], o_cut) and not _same(o[whole:], o_ref[whole:]):
                raise ExerciseError(f"The whole chunks are right, but the last, shorter one (tokens {whole} … "
                                    f"{T - 1}) is not: T = {T} is not a multiple of chunk_size = {C}; size its matrices "
                                    "by the tokens it really has.\n  " + right)
        for (o_bad, _), message in wrong:
            if _same(o, o_bad):
                raise ExerciseError(message + "\n  " + right)
        first = min(C, T)
        if _same(o[:first], o_ref[:first]) and not _same(o, o_ref):
            raise ExerciseError("The first chunk's outputs are right but a later one's are not: the state you "
                                "hand on (S after a chunk) is off.\n  " + right)
        raise ExerciseError(("o is right but the final state S is not. " if _same(o, o_ref) else
                             "o is wrong inside the first chunk already: check A (strictly below the diagonal), "
                             "P (diagonal included) and the inclusive cumulative sum Γ. ") + right)
    _passed("check_delta_chunked", "chunk by chunk (a short last chunk included) it equals tiny_k3.kda.kda_chunked"
                                   + mine + " (float64).")


def _per_chunk_from(S0, q, k, v, g, beta, scale, C):
    """The mistake of starting every chunk from S0: the recurrence restarted at each chunk."""
    outs = [_recurrence(q[s:s + C], k[s:s + C], v[s:s + C], g[s:s + C], beta[s:s + C], scale, S0)
            for s in range(0, q.shape[0], C)]
    return torch.cat([o for o, _ in outs]), outs[-1][1]


# ---------------------------------------------------------------------------- B.3 a KDA head

@register("B.3", "kda_head", difficulty=2, minutes=15, expects="""
my_kda_head(q, k, v, g_raw, beta_logit, A_log, dt_bias, lower_bound, S0=None) -> (o, S)    one head (kda.md §3)
  what a KDA layer hands its head, after its projections and short convolution:
  q, k [T, K] NOT yet normalised; v [T, V]; g_raw [T, K] the raw decay-gate projection; beta_logit [T];
  A_log a 0-d tensor and dt_bias [K]: this head's gate parameters; lower_bound a negative float or None;
  S0 [K, V] the state before these tokens, or None (zeros)
  the layer's own conventions: q and k scaled to unit length as x / sqrt(Σ x² + 1e-6); g from the gate of
  exercise 2.2 (bounded sigmoid when lower_bound is given); β = sigmoid(beta_logit); scale K^-0.5;
  then your my_delta_step (B.1) over the T tokens, as one head (H = 1).
  returns o [T, V] and S [K, V], the state after the last token.
Checked against tiny_k3.kda.kda_gate and tiny_k3.kda.kda_recurrent with the layer's normalisation, in float64.
""", hints=(
    "A head is the step in a loop, fed what the layer prepares: unit-length queries and keys, a decay that is "
    "always negative, a write strength between 0 and 1. Get those three conventions exactly as the layer does, "
    "then run your step token by token, carrying the state.",
    "Normalise each row of q and k by the root of its sum of squares plus 1e-6 (the small constant inside the "
    "root). The decay: add this head's dt_bias to g_raw, scale by exp(A_log), then the bounded sigmoid times "
    "lower_bound, or minus the softplus without a bound. β is the sigmoid of the logit. For each token t, give "
    "your step views with a head axis of size 1 ([1, K], [1, V], [1], and S as [1, K, V]) and stack the T "
    "outputs.",
    "q = q / torch.sqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6)   (and k)\n"
    "  x = g_raw + dt_bias;  g = lower_bound * torch.sigmoid(A_log.exp() * x)   (or -A_log.exp() * F.softplus(x))\n"
    "  beta = torch.sigmoid(beta_logit);  S = torch.zeros(K, V) if S0 is None else S0\n"
    "  for t in range(T):\n"
    "      o, S = my_delta_step(S[None], q[t, None], k[t, None], v[t, None], g[t, None], beta[t, None], K ** -0.5)\n"
    "      S = S[0]; outputs.append(o[0])"))
def check_kda_head(fn) -> None:
    from tiny_k3.kda import kda_gate

    def head_ref(q, k, v, g_raw, beta_logit, A_log, dt_bias, lb, S0, *, norm_eps=1e-6, gate=True, sig=True,
                 scale=None, sign=1.0):
        """The head as the layer computes it; the keywords recompute the usual mistakes."""
        K = q.shape[-1]
        if norm_eps is not None:
            q = q / torch.sqrt(q.pow(2).sum(-1, keepdim=True) + norm_eps)
            k = k / torch.sqrt(k.pow(2).sum(-1, keepdim=True) + norm_eps)
        g = kda_gate(g_raw.view(1, -1, 1, K), A_log.view(1), dt_bias, lb)[0, :, 0] if gate else g_raw
        beta = sign * (torch.sigmoid(beta_logit) if sig else beta_logit)     # sign -1: the write's sign flipped
        o, S = _recurrence(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None],
                           K ** -0.5 if scale is None else scale, None if S0 is None else S0[None])
        return o[:, 0], S[0]

    gen = torch.Generator().manual_seed(47)
    for T, K, V, lb, with_state in [(6, 8, 8, -5.0, False), (5, 6, 4, None, True), (9, 4, 5, -5.0, True)]:
        q = torch.randn(T, K, generator=gen, **_F64) * 0.6
        k = torch.randn(T, K, generator=gen, **_F64) * 0.6
        v = torch.randn(T, V, generator=gen, **_F64)
        g_raw = torch.randn(T, K, generator=gen, **_F64)
        beta_logit = torch.randn(T, generator=gen, **_F64)
        A_log = torch.randn((), generator=gen, **_F64) * 0.5
        dt_bias = torch.randn(K, generator=gen, **_F64) * 0.5
        S0 = torch.randn(K, V, generator=gen, **_F64) * 0.3 if with_state else None
        inputs = (q, k, v, g_raw, beta_logit, A_log, dt_bias, lb, S0)
        o_ref, S_ref = head_ref(*inputs)
        got = _call(fn, tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in inputs),
                    f"q, k [{T}, {K}], v [{T}, {V}], g_raw [{T}, {K}], beta_logit [{T}], A_log 0-d, dt_bias [{K}], "
                    f"lower_bound={lb}, S0 {'[%d, %d]' % (K, V) if with_state else 'None'}",
                    "your step takes a head axis: pass S[None] and q[t, None] ([1, K]), and take o[0], S[0] back.")
        o, S = _pair(got, ("o", (T, V), "one read-out per token"), ("S", (K, V), "this head's final state"))
        if _same(o, o_ref) and _same(S, S_ref):
            continue
        right = f"For this input o[-1] should be {_fmt(o_ref[-1])}; yours is {_fmt(o[-1])}{_off(o, o_ref)}."
        wrong = [(dict(norm_eps=None), "q and k must be unit vectors first: the layer L2-normalises them per head "
                  "(x / sqrt(Σ x² + 1e-6)); the delta rule's error v − S'ᵀk assumes ‖k‖ ≈ 1."),
                 (dict(norm_eps=0.0), "Nearly: the layer's L2 norm keeps 1e-6 inside the root, x / sqrt(Σ x² + 1e-6) "
                  "(fla's use_qk_l2norm_in_kernel); float64 sees the difference."),
                 (dict(gate=False), "g_raw is the gate's raw projection, not a log decay yet: pass it through the "
                  "gate (exercise 2.2) with this head's A_log and dt_bias."),
                 (dict(sig=False), "beta_logit is a logit: β = sigmoid(beta_logit), a write strength in (0, 1)."),
                 (dict(sign=-1.0), "Your step's correction has the wrong sign: it subtracts β k (v − S'ᵀk)ᵀ, pushing "
                  "the memory away from each value. Run check_delta_step on your my_delta_step (B.1)."),
                 (dict(scale=1.0), "The read is scaled: o = Sᵀ (K^-0.5 · q).")]
        if lb is not None:
            unbounded = head_ref(q, k, v, -A_log.exp() * F.softplus(g_raw + dt_bias), beta_logit, A_log, dt_bias,
                                 lb, S0, gate=False)
            if _same(o, unbounded[0]):
                raise ExerciseError(f"lower_bound is {lb}: use K3's bounded gate g = lower_bound · sigmoid(exp(A_log) "
                                    "(g_raw + dt_bias)), not the softplus one.\n  " + right)
        if S0 is not None and _same(o, head_ref(*inputs[:-1], None)[0]):
            raise ExerciseError("You started from zeros: start from S0 when it is given (the state a decode step "
                                "carries from the token before).\n  " + right)
        for change, message in wrong:
            if _same(o, head_ref(*inputs, **change)[0]):
                raise ExerciseError(message + "\n  " + right)
        raise ExerciseError(right if not _same(o, o_ref) else
                            f"o is right but S is not: return the state after the last token. S[0] should be "
                            f"{_fmt(S_ref[0])}; yours is {_fmt(S[0])}.")
    _passed("check_kda_head", "the layer's q/k normalisation, gate and β, then the delta rule over the sequence, "
                              "agree with tiny_k3.kda (float64, both gate forms, with and without S0).")


# ---------------------------------------------------------------------------- B.4 attention with a KV cache

@register("B.4", "attend_with_cache", difficulty=2, minutes=12, expects="""
my_attend_with_cache(cache, q, k, v, scale) -> (o, cache)       one new token, every head (mla.md §1)
  cache: None before the first token, else (keys [S, H, D], values [S, H, V]) of the S tokens so far
  q, k [H, D] and v [H, V]: the new token's query, key and value per head; scale a float (1/sqrt(D) in a layer)
  append the new key and value to the cache first, then attend: each head's softmax of scale · q·k over
  all S + 1 keys, weighting the S + 1 values.
  returns o [H, V] and the grown cache (keys [S+1, H, D], values [S+1, H, V]).
Checked token by token against tiny_k3.mla.softmax_attention over the whole prefix, in float64.
""", hints=(
    "Decoding one token needs every earlier key and value, so keep them: append this token's, then let its "
    "query look at all of them, itself included. Each head attends on its own.",
    "Keys and values grow along a new first axis (tokens). Per head, the scores are the dot products of q [D] "
    "with each cached key: an [H, S+1] table, times the scale. The softmax runs over the tokens axis (not over "
    "the heads); the output is those weights against the values, [H, V].",
    "keys = k[None] if cache is None else torch.cat([cache[0], k[None]])   (values alike)\n"
    "  w = (torch.einsum('hd,shd->hs', q, keys) * scale).softmax(-1)\n"
    "  return torch.einsum('hs,shv->hv', w, values), (keys, values)"))
def check_attend_with_cache(fn) -> None:
    from tiny_k3.mla import softmax_attention

    gen = torch.Generator().manual_seed(53)
    for T, H, D, V in [(6, 2, 5, 3), (4, 3, 4, 4)]:
        q = torch.randn(T, H, D, generator=gen, **_F64)
        k = torch.randn(T, H, D, generator=gen, **_F64)
        v = torch.randn(T, H, V, generator=gen, **_F64)
        scale = 0.7                                   # not D**-0.5: the given scale must be used
        cache = None
        for t in range(T):
            _, want = softmax_attention(q[t][None, :, None], k[:t + 1].transpose(0, 1)[None],
                                        v[:t + 1].transpose(0, 1)[None], scale)   # [1, H, 1, V]
            want = want[0, :, 0]
            given = None if cache is None else (cache[0].clone(), cache[1].clone())
            got = _call(fn, (given, q[t].clone(), k[t].clone(), v[t].clone(), scale),
                        f"token {t}: cache {'None' if cache is None else f'keys [{t}, {H}, {D}]'}, q, k [{H}, {D}], "
                        f"v [{H}, {V}]", "the cache is a pair (keys, values); before the first token it is None.")
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                raise ExerciseError("Return two things: (o [H, V], cache) with cache = (keys, values).")
            o = _tensor(got[0], "o", (H, V), "one output per head")
            new = got[1]
            if not isinstance(new, (tuple, list)) or len(new) != 2:
                raise ExerciseError("The cache is a pair (keys [S, H, D], values [S, H, V]); return it as a tuple.")
            keys = _tensor(new[0], "the cached keys", (t + 1, H, D), f"{t + 1} tokens after token {t}: append, "
                           "never replace")
            values = _tensor(new[1], "the cached values", (t + 1, H, V), f"{t + 1} tokens after token {t}")
            if not (_same(keys, k[:t + 1]) and _same(values, v[:t + 1])):
                raise ExerciseError(f"After token {t} the cache should hold the keys and values of tokens 0 … {t} in "
                                    "order, the new one last.")
            cache = (keys, values)
            if _same(o, want):
                continue
            right = f"At token {t}, o[0] should be {_fmt(want[0])}; yours is {_fmt(o[0])}{_off(o, want)}."
            scores = torch.einsum("hd,shd->hs", q[t], k[:t + 1])
            for bad, message in [(scores, "You left out the scale: the scores are scale · q·k."),
                                 (scores * D ** -0.5, f"Use the scale you are given ({scale}), not 1/sqrt(D): the "
                                  "layer decides it (MLA's is 1/sqrt(nope + rope)).")]:
                if _same(o, torch.einsum("hs,shv->hv", bad.softmax(-1), v[:t + 1])):
                    raise ExerciseError(message + "\n  " + right)
            if _same(o, torch.einsum("hs,shv->hv", (scores * scale).softmax(0), v[:t + 1])):
                raise ExerciseError("Your softmax runs over the heads. Each head's weights sum to 1 over the tokens: "
                                    "softmax over the last axis of the [H, S] scores.\n  " + right)
            if t > 0 and _same(o, torch.einsum("hs,shv->hv", (scores[:, :t] * scale).softmax(-1), v[:t])):
                raise ExerciseError("You attended before appending: the new token must see itself too (keys "
                                    f"0 … {t}, not 0 … {t - 1}).\n  " + right)
            raise ExerciseError(right)
    _passed("check_attend_with_cache", "token by token, appending to the cache, it equals softmax attention over the "
                                       "whole prefix (tiny_k3.mla.softmax_attention, float64).")


# ---------------------------------------------------------------------------- B.5 MLA's absorbed decode

@register("B.5", "mla_decode", difficulty=3, minutes=15, expects="""
my_mla_decode(q_nope, q_rope, latent, k_rope, W_kb, W_vb, scale) -> o       one query, every head (mla.md §2)
  q_nope [H, nope], q_rope [H, rope]: the query's two parts per head
  latent [S, rank], k_rope [S, rope]: the MLA cache, the S tokens so far (this one included)
  W_kb [H, nope, rank], W_vb [H, V, rank]: kv_b_proj per head, k_n = W_kb c and v = W_vb c for a latent c
  scale: a float (1/sqrt(nope + rope) in the layer)
  returns o [H, V], what the layer would get by expanding every latent into keys and values — computed
  WITHOUT expanding them: W_kb goes into the query, W_vb comes after the weighted sum.
Checked against tiny_k3.mla.GatedMLA.attend_expanded (the expanded form) on a real layer, in float64.
""", hints=(
    "A key is a linear map of its latent, so a dot product with it is a dot product of the latent with the "
    "query mapped back through the transpose: move the key map onto the one query instead of onto every cached "
    "token. The same for the value map: mix the latents first, map once at the end. The rope part of the key is "
    "shared by the heads and needs no map.",
    "Per head: take the nope query [nope] through W_kb [nope, rank] to a latent-space query [rank]. The scores "
    "[H, S] are that against each cached latent plus the rope query against each cached k_rope, times the scale. "
    "Softmax over the S tokens. The context [H, rank] is the weights against the latents; the output maps it "
    "through W_vb [V, rank] to [H, V].",
    "q_latent = torch.einsum('hn,hnr->hr', q_nope, W_kb)\n"
    "  p = ((q_latent @ latent.T + q_rope @ k_rope.T) * scale).softmax(-1)\n"
    "  return torch.einsum('hr,hvr->hv', p @ latent, W_vb)"))
def check_mla_decode(fn) -> None:
    from tiny_k3 import K3Config
    from tiny_k3.mla import GatedMLA

    config = K3Config.preset("tiny")
    with torch.random.fork_rng():
        torch.manual_seed(59)
        layer = GatedMLA(config, dtype=torch.float64)
    H, n, r, Vd, R = layer.heads, layer.nope, layer.rope, layer.v_dim, layer.kv_rank
    per_head = layer.kv_b_proj.weight.detach().view(H, n + Vd, R)
    W_kb, W_vb = per_head[:, :n], per_head[:, n:]
    gen = torch.Generator().manual_seed(61)
    for S in (1, 5, 12):
        q_nope = torch.randn(H, n, generator=gen, **_F64)
        q_rope = torch.randn(H, r, generator=gen, **_F64)
        latent = torch.randn(S, R, generator=gen, **_F64)
        k_rope = torch.randn(S, r, generator=gen, **_F64)
        with torch.no_grad():
            _, attn = layer.attend_expanded(q_nope[None, None], q_rope[None, None], latent[None], k_rope[None], S - 1)
        want = attn[0, 0]
        got = _tensor(_call(fn, (q_nope.clone(), q_rope.clone(), latent.clone(), k_rope.clone(), W_kb.clone(),
                                 W_vb.clone(), layer.scale),
                            f"q_nope [{H}, {n}], q_rope [{H}, {r}], latent [{S}, {R}], k_rope [{S}, {r}], "
                            f"W_kb [{H}, {n}, {R}], W_vb [{H}, {Vd}, {R}], scale={layer.scale:.4f}",
                            "per head, W_kb [nope, rank] takes q_nope [nope] to [rank]: einsum('hn,hnr->hr')."),
                      "o", (H, Vd), "one output per head")
        if _same(got, want):
            continue
        right = f"With S = {S} cached tokens, o[0] should be {_fmt(want[0])}; yours is {_fmt(got[0])}{_off(got, want)}."
        q_latent = torch.einsum("hn,hnr->hr", q_nope, W_kb)

        def out(scores, axis=-1):
            return torch.einsum("hr,hvr->hv", scores.softmax(axis) @ latent, W_vb)

        nope_scores, rope_scores = q_latent @ latent.T, q_rope @ k_rope.T
        wrong = [(out(nope_scores * layer.scale), "You left out the rope part: the key is [k_nope, k_rope], so the "
                  "score adds q_rope · k_rope (shared by all heads) to the absorbed nope score."),
                 (out(nope_scores + rope_scores), "You left out the scale: scores are scaled by 1/sqrt(nope + rope)."),
                 (out((nope_scores + rope_scores) * n ** -0.5), "Use the scale given (1/sqrt(nope + rope)); "
                  "1/sqrt(nope) counts only part of the key."),
                 (out((nope_scores + rope_scores) * layer.scale, axis=0) if H > 1 else None,
                  "Your softmax runs over the heads: each head's weights sum to 1 over the S cached tokens.")]
        for candidate, message in wrong:
            if candidate is not None and _same(got, candidate):
                raise ExerciseError(message + "\n  " + right)
        raise ExerciseError(right)
    _passed("check_mla_decode", "scores from the latent cache through W_kb absorbed into q and the output through "
                                "W_vb equal the expanded attention of tiny_k3.mla.GatedMLA (float64).")


# ---------------------------------------------------------------------------- the model on the learner's layer

CHUNK = 8          # chunk size the model's prefill uses with the learner's chunked form: several chunks, a short last


def growing(attention):
    """The learner's attention (B.4) as the model calls it, refusing a cache that does not grow by exactly the new
    token, keeps its past or does not end in the new key and value. tiny_k3.swap refuses a wrong length too, in its
    own words; this says it in the lesson's, and checks what the length alone cannot show."""

    @functools.wraps(attention)
    def guarded(cache, q, k, v, scale):
        before = 0 if cache is None else int(cache[0].shape[0])
        o, new = attention(cache, q, k, v, scale)
        length = ([int(t.shape[0]) if isinstance(t, torch.Tensor) and t.dim() else None for t in new]
                  if isinstance(new, (tuple, list)) and len(new) == 2 else None)
        if length != [before + 1, before + 1]:
            got = ("None" if new is None else f"keys and values of {length[0]} and {length[1]} tokens" if length
                   else f"a {type(new).__name__}")
            raise ExerciseError(
                f"Your KV cache does not grow: given the keys and values of {before} token{'s' * (before != 1)}, your "
                f"function returned {got}; after this token the cache must hold {before + 1}, the new key and value "
                "appended last. (The model hands this cache back to your function with the next token: it must hold "
                "every token so far, or the next token attends over the wrong keys.)")
        if before and not (_same(new[0][:before], cache[0]) and _same(new[1][:before], cache[1])):
            raise ExerciseError("Your KV cache grew by one token but changed the tokens before it: append the new key "
                                "and value, and keep the cached ones as they are.")
        if not (_same(new[0][-1], k) and _same(new[1][-1], v)):
            raise ExerciseError("The last token of your KV cache is not the new key and value: append k and v as given "
                                "(the cache's new row is this token's).")
        return o, new

    return guarded


def chunked_head(chunked, chunk_size: int = CHUNK):
    """A KDA head (tiny_k3.swap's kda_head signature) whose sequence runs through the learner's chunked form (B.2):
    the layer's own conventions around it (q/k L2 norm with 1e-6 inside the root, the gate, β = sigmoid, scale
    K^-0.5; kda.md §3), the tokens `chunk_size` at a time through `chunked` as one head (H = 1)."""
    from tiny_k3.kda import kda_gate

    @functools.wraps(chunked)
    def head(q, k, v, g_raw, beta_logit, A_log, dt_bias, lower_bound, S0=None):
        K = q.shape[-1]
        q = q / torch.sqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
        g = kda_gate(g_raw.view(1, -1, 1, K), A_log.view(1), dt_bias, lower_bound)[0, :, 0]
        o, S = chunked(q[:, None], k[:, None], v[:, None], g[:, None], torch.sigmoid(beta_logit)[:, None], K ** -0.5,
                       chunk_size, None if S0 is None else S0[None])
        return o[:, 0], S[0]

    return head


def run_your_layer(model, prompt: str, **yours):
    """The model on `prompt` with the learner's functions swapped in (tiny_k3.swap), against its own logits.

    Roles: kda_head= (B.3), attention= (B.4: its cache must grow by the new token at every call, `growing`),
    mla_decode= (B.5), and delta_chunked= (B.2: every KDA layer's prefill through the learner's chunked form, the
    layer's own conventions around it, `chunked_head`). Prints the comparison at TOLERANCE and returns the
    SwapComparison, or None (after saying why) while a function is not written yet or fails inside the model."""
    from tiny_k3.swap import compare
    from tiny_k3.tokenizer import encode, token_text

    names = ", ".join(f"{getattr(fn, '__name__', 'your function')} as {role}" for role, fn in yours.items())
    swaps = dict(yours)
    if "delta_chunked" in swaps:
        if "kda_head" in swaps:
            raise ValueError("run_your_layer: give kda_head= or delta_chunked=, not both: both replace the KDA heads.")
        swaps["kda_head"] = chunked_head(swaps.pop("delta_chunked"))
    if "attention" in swaps:
        swaps["attention"] = growing(swaps["attention"])
    tokens = torch.tensor([encode(prompt)])
    try:
        result = compare(model, tokens, **swaps)
    except NotImplementedError:
        print(f"… not yet: write the exercise above first; then this cell runs the model with {names}.")
        return None
    except ExerciseError as exc:
        print(f"✗ the model ran with {names} and stopped: {exc}")
        return None
    except Exception as exc:
        print(f"✗ the model ran with {names} and your function raised {type(exc).__name__}: {exc}\n"
              "  Get its check above to pass first: it tries the same shapes on small inputs.")
        return None
    own, yours_next = result.next_tokens()
    same = result.max_abs_diff <= TOLERANCE
    print(f"The model on {prompt!r} ({tokens.shape[1]} tokens, float64) with {names}:\n"
          f"  max |logit difference| against the model's own = {result.max_abs_diff:.2e} "
          f"({'≤' if same else '>'} {TOLERANCE:g}: {'the same function' if same else 'NOT the same function'})\n"
          f"  next token: {token_text(yours_next)!r} from your layer, {token_text(own)!r} from the model's own.")
    return result
