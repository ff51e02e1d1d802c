"""Solutions of the "Build it yourself" thread (lessons 2, 3 and 6): the layers a learner writes and then runs
the model on. Written from the equations (kda.md §1-3, mla.md §1-2), not by calling tiny_k3: the checks compare
against tiny_k3, and `tiny_k3.swap` runs the model with these inside."""

import torch
import torch.nn.functional as F


def delta_step(S, q, k, v, g, beta, scale):
    """One token, every head: S [H, K, V], q, k, g [H, K], v [H, V], beta [H] -> (o [H, V], S_new [H, K, V]).

    S' = Diag(exp g) S;   S_new = S' + β k (v − S'ᵀk)ᵀ;   o = S_newᵀ (scale q)          (kda.md §1)
    """
    S = g.exp()[..., None] * S                                   # forget: row d of head h times exp(g[h, d])
    recalled = torch.einsum("hk,hkv->hv", k, S)                  # S'ᵀk: what the memory returns for k
    S = S + beta[:, None, None] * k[..., None] * (v - recalled)[:, None, :]   # write only the error
    return torch.einsum("hk,hkv->hv", scale * q, S), S


def delta_chunked(q, k, v, g, beta, scale, chunk_size, S0=None):
    """The same recurrence a chunk at a time (kda.md §2, the WY/UT form), every head at once.

    q, k, g [T, H, K]; v [T, H, V]; beta [T, H]; S0 [H, K, V] or None -> (o [T, H, V], S [H, K, V]).
    """
    T, H, K = q.shape
    S = q.new_zeros(H, K, v.shape[-1]) if S0 is None else S0
    outputs = []
    for start in range(0, T, chunk_size):
        qc, kc, vc, gc = (x[start:start + chunk_size].transpose(0, 1) for x in (q * scale, k, v, g))  # [H, C, .]
        bc = beta[start:start + chunk_size].T                                                     # [H, C]
        C = qc.shape[1]
        G = gc.cumsum(1)                                           # Γ_r: decay from the chunk start to r, inclusive
        causal = torch.ones(C, C, dtype=torch.bool).tril()
        # exp(Γ_r − Γ_i) for i ≤ r; masked *before* the exp, so nothing above the diagonal can overflow
        decay = (G[:, :, None] - G[:, None, :]).masked_fill(~causal[..., None], float("-inf")).exp()  # [H, C, C, K]
        strictly_below = torch.ones(C, C, dtype=q.dtype).tril(-1)  # A[r, i] for i < r only
        A = bc[..., None] * torch.einsum("hrk,hik,hrik->hri", kc, kc, decay) * strictly_below
        eye = torch.eye(C, dtype=q.dtype).expand(H, C, C)
        Tm = torch.linalg.solve_triangular(eye + A, torch.diag_embed(bc), upper=False, unitriangular=True)
        W = Tm @ (kc * G.exp())                                    # W = T (K ⊙ exp Γ)
        U = Tm @ vc - W @ S                                        # the new values: v minus what S₀ predicts
        P = torch.einsum("hrk,hik,hrik->hri", qc, kc, decay)       # P[r, i] for i ≤ r, diagonal included
        outputs.append(((qc * G.exp()) @ S + P @ U).transpose(0, 1))
        last = G[:, -1:]                                            # Γ_C
        S = last.transpose(1, 2).exp() * S + (kc * (last - G).exp()).transpose(1, 2) @ U
    o = torch.cat(outputs, 0) if outputs else v.new_zeros(0, H, v.shape[-1])
    return o, S


def kda_head(q, k, v, g_raw, beta_logit, A_log, dt_bias, lower_bound, S0=None):
    """One KDA head over a sequence, with the layer's own normalisation, gate and β (kda.md §3).

    q, k [T, K] (before the L2 norm), v [T, V], g_raw [T, K], beta_logit [T], A_log 0-d, dt_bias [K],
    lower_bound float or None, S0 [K, V] or None -> (o [T, V], S [K, V]).
    """
    T, K = q.shape
    q = q / torch.sqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6)     # the layer's L2 norm, eps inside the root
    k = k / torch.sqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
    x, rate = g_raw + dt_bias, A_log.exp()
    g = -rate * F.softplus(x) if lower_bound is None else lower_bound * torch.sigmoid(rate * x)
    beta = torch.sigmoid(beta_logit)
    S = q.new_zeros(K, v.shape[-1]) if S0 is None else S0
    outputs = []
    for t in range(T):                                             # the step, as one head (H = 1)
        o, S = delta_step(S[None], q[t, None], k[t, None], v[t, None], g[t, None], beta[t, None], K ** -0.5)
        S = S[0]
        outputs.append(o[0])
    return torch.stack(outputs), S


def attend_with_cache(cache, q, k, v, scale):
    """Softmax attention for one new token with a KV cache: append, then attend over all of it.

    cache None or (keys [S, H, D], values [S, H, V]); q, k [H, D], v [H, V] -> (o [H, V], (keys, values)).
    """
    keys = k[None] if cache is None else torch.cat([cache[0], k[None]])       # [S + 1, H, D]
    values = v[None] if cache is None else torch.cat([cache[1], v[None]])     # [S + 1, H, V]
    scores = torch.einsum("hd,shd->hs", q, keys) * scale
    weights = scores.softmax(-1)                                   # over the keys, per head
    return torch.einsum("hs,shv->hv", weights, values), (keys, values)


def mla_decode(q_nope, q_rope, latent, k_rope, W_kb, W_vb, scale):
    """MLA's absorbed decode for one query (mla.md §2): scores and output straight from the latent cache.

    q_nope [H, nope], q_rope [H, rope], latent [S, rank], k_rope [S, rope], W_kb [H, nope, rank],
    W_vb [H, V, rank] -> o [H, V].
    """
    q_latent = torch.einsum("hn,hnr->hr", q_nope, W_kb)            # W_kbᵀ q_n: the query in latent space
    scores = (q_latent @ latent.T + q_rope @ k_rope.T) * scale     # [H, S]
    context = scores.softmax(-1) @ latent                          # Σ_s p_s c_s   [H, rank]
    return torch.einsum("hr,hvr->hv", context, W_vb)               # W_vb after the mix
