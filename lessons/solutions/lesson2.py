"""Lesson 2 solutions: one KDA step, the KDA gate."""

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
