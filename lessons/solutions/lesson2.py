"""Lesson 2 solutions: one KDA step, the KDA gate, the read weights."""

import torch
import torch.nn.functional as F


def kda_step(S, q, k, v, g, beta, scale):
    """S [K, V], q, k, g [K], v [V], beta 0-d -> (o [V], S_new [K, V]) (kda.md §1)."""
    S = g.exp()[:, None] * S                      # per-channel decay of the key rows
    error = v - S.T @ k                           # what the memory gets wrong for key k
    S = S + beta * torch.outer(k, error)          # delta-rule write
    return S.T @ (scale * q), S


def kda_gate(g_raw, A_log, dt_bias, lower_bound):
    """g_raw [T, H, K], A_log [H], dt_bias [H*K] -> g [T, H, K] (kda.md §3)."""
    H, K = g_raw.shape[-2:]
    x = g_raw + dt_bias.view(H, K)
    rate = A_log.exp()[:, None]
    if lower_bound is None:
        return -rate * F.softplus(x)
    return lower_bound * torch.sigmoid(rate * x)


def read_weights(q, k, g):
    """q [K] (the query of token t), k, g [t+1, K] (tokens 0 … t) -> a [t+1] with S_tᵀ q = Σ_d a_d u_d (kda.md §1).

    Unrolled, S_t = Σ_d Diag(exp Σ_{s=d+1}^{t} g_s) k_d u_dᵀ: write d is decayed by every token after it.
    """
    after = g.flip(0).cumsum(0).flip(0) - g       # Σ_{s=d+1}^{t} g_s, per key channel
    return (k * after.exp()) @ q
