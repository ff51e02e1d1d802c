"""Lesson 8 solutions: the weighted training loss, the learning-rate schedule, the Wilson interval."""

import math

import torch.nn.functional as F


def weighted_loss(logits, targets, weights):
    """logits [B, T, V], targets [B, T], weights [B, T] -> the weighted mean next-byte cross-entropy (a 0-d tensor)."""
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    w = weights.reshape(-1)
    return (ce * w).sum() / w.sum()


def lr_at(step, steps, lr, warmup):
    """Linear warm-up over `warmup` steps to lr, then a cosine from lr down to lr / 10 at the last step."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def wilson_interval(hits, n, z=1.96):
    """(low, high): the Wilson score interval of hits / n (Wilson 1927)."""
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)
