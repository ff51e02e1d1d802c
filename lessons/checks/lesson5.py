"""Lesson 5 checks: MXFP4 bytes, K3's release size, expert-parallel bytes per token."""

from __future__ import annotations

import functools
import math

import torch

from ._common import ExerciseError, _call, _close, _fmt, _int, _passed, _tensor, register

@register("5.1", "mxfp4_bytes", difficulty=1, minutes=6, expects="""
my_mxfp4_bytes(rows, cols) -> int
  bytes of a [rows, cols] weight matrix stored as MXFP4 (OCP MX, k3_facts.md §4).
Checked against sim.costs.mxfp4_bytes.
""",
          hints=('MXFP4 packs each row in blocks of 32 values: 4-bit E2M1 values plus one shared 8-bit E8M0 scale '
                 'per block; the last block of a row is padded.',
                 'Blocks per row: 32 values per block and the last one padded, so ⌈cols / 32⌉ (round up). One '
                 'block: 32 values of 4 bits are 16 bytes, and its scale 1 byte more: 17 bytes. The matrix: rows × '
                 'blocks per row × 17 bytes.',
                 'return rows * math.ceil(cols / 32) * 17      (16 B of 4-bit values + a 1-B scale per block)'))
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


@register("5.2", "release_bytes", difficulty=2, minutes=8, expects="""
my_release_bytes(parts) -> int
  parts: tiny_k3.parameter_breakdown(config) (parameters per part, a dict)
  bytes of K3's released checkpoint format (config.json: compressed-tensors mxfp4, "ignore shared_experts"
  and the non-expert layers; k3_facts.md §1b, §4).
Checked against sim.costs.weight_bytes(config, "k3-release") on K3 (1.560 TB) and two small presets.
""",
          hints=('Only the routed experts are MXFP4; everything else (attention, shared experts, router, '
                 'projections, embedding, head) stays BF16.',
                 'Split the parameters in two: the routed experts, and all the other parts together. The routed '
                 'experts are MXFP4: blocks of 32 parameters at 17 bytes a block (round the block count up). The '
                 'rest is BF16, 2 bytes a parameter. The checkpoint is the two byte counts added.',
                 "routed = parts['routed_experts'];  rest = sum(parts.values()) - routed\n"
                 '  return math.ceil(routed / 32) * 17 + rest * 2'))
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


@register("5.3", "ep_bytes", difficulty=2, minutes=10, expects="""
my_ep_bytes(config) -> int
  all-to-all bytes ONE token causes in ONE MoE layer under expert parallelism (k3_facts.md §6b),
  dispatch (to the experts) and combine (back), for each of the top_k routed copies.
Checked against sim.costs.ep_traffic_for(config).per_layer.
""",
          hints=('Dispatch travels in FP8 with a 1-byte scale per 32 values, combine in BF16; with latent MoE the '
                 'token is projected down BEFORE dispatch, so the latent width travels, not the hidden width.',
                 'Two trips per token and MoE layer, each made once for each of the top_k experts, carrying the '
                 'latent width l = config.latent_dim values (K3: 3584). Out (dispatch): FP8, 1 byte a value, plus a '
                 '1-byte scale for every block of 32 values (round up). Back (combine): BF16, 2 bytes a value. Add '
                 'the two trips.',
                 'width, k = config.latent_dim, config.top_k\n'
                 '  return k * (width + math.ceil(width / 32)) + k * width * 2'))
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
