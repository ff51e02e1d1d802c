"""Lesson 5 solutions: MXFP4 bytes, K3's release size, EP traffic."""

import math


def mxfp4_bytes(rows, cols):
    """17 B (16 B of E2M1 values + a 1-B E8M0 scale) per block of 32, blocks per row (k3_facts.md §4)."""
    return rows * math.ceil(cols / 32) * 17


def release_bytes(parts):
    """MXFP4 routed experts + BF16 everything else (k3_facts.md §1d, §4)."""
    routed = parts["routed_experts"]
    rest = sum(parts.values()) - routed
    return math.ceil(routed / 32) * 17 + rest * 2


def ep_bytes(config):
    """Per token per MoE layer: k copies of the latent, dispatched in FP8 + scales, combined in BF16 (§6b)."""
    width, k = config.latent_dim, config.top_k
    dispatch = k * (width + math.ceil(width / 32))
    combine = k * width * 2
    return dispatch + combine
