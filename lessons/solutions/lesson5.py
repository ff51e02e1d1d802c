"""Lesson 5 solutions: MXFP4 bytes, K3's release size, EP traffic, one decode step's roofline."""

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


def decode_roofline(model, batch, context, flops_per_sequence, bandwidth, peak_flops):
    """One decode step (k3_facts.md §5b): the weights and the touched experts once, each sequence's cache and state
    (read and written back); FLOPs per sequence times the batch; the bound is the longer of the two times."""
    n, k = model.num_experts, model.top_k
    touched = n * (1 - (1 - k / n) ** batch)              # distinct experts a batch touches, uniform routing
    step_bytes = (model.dense_bytes + model.moe_layers * touched * model.expert_bytes
                  + batch * model.kv_bytes_per_token * context + batch * 2 * model.state_bytes)
    flops = batch * flops_per_sequence
    return {"bytes": step_bytes, "flops": flops,
            "bound": "compute" if flops / peak_flops > step_bytes / bandwidth else "memory"}
