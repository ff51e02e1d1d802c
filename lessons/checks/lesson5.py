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


@register("5.4", "decode_roofline", difficulty=2, minutes=12, expects="""
my_decode_roofline(model, batch, context, flops_per_sequence, bandwidth, peak_flops) -> dict
  model: a sim.costs.ServingModel, what one decode step reads (k3_facts.md §5b):
         dense_bytes (every non-expert weight), moe_layers, num_experts, top_k, expert_bytes (one routed expert),
         kv_bytes_per_token (the MLA caches, all layers), state_bytes (one sequence's KDA state + conv tail)
  batch B sequences, each with `context` tokens cached; flops_per_sequence: the FLOPs one sequence's token costs
  (sim.costs.flops_per_token); bandwidth in bytes/s and peak_flops in FLOP/s of the machine.
  returns {"bytes": bytes one step reads, "flops": FLOPs one step does,
           "bound": "memory" or "compute", whichever takes longer at the machine's peaks}
Checked against sim.costs.decode_step_bytes and flops_per_token for K3 on an H200-class GPU and a laptop-class CPU.
""",
          hints=("One step reads the weights ONCE for the whole batch, but each sequence brings its own cache and "
                 "state; experts are shared too, and a batch touches more distinct experts than one token does. "
                 "The bound is whichever of the two times, bytes / bandwidth or FLOPs / peak, is longer.",
                 "The bytes of one step: the dense weights, plus for every MoE layer the distinct experts the batch "
                 "touches times one expert's bytes, plus B × (KV per token × context), plus B × the state read and "
                 "written back. The FLOPs: B × one sequence's. Under uniform routing a batch touches "
                 "N (1 − (1 − k/N)^B) of N experts.",
                 "touched = N * (1 - (1 - k / N) ** B);  bytes = dense_bytes + moe_layers * touched * expert_bytes "
                 "+ B * kv_bytes_per_token * context + B * 2 * state_bytes;  flops = B * flops_per_sequence;  "
                 "bound = 'compute' if flops / peak_flops > bytes / bandwidth else 'memory'"))
def check_decode_roofline(fn) -> None:
    from sim.costs import decode_step_bytes, flops_per_token, serving_model

    from tiny_k3 import K3Config

    k3 = K3Config.preset("k3")
    model = serving_model(k3)
    machines = {"an H200 (4.8 TB/s, 989 TFLOP/s)": (4.8e12, 989e12), "a laptop CPU (100 GB/s, 1 TFLOP/s)": (1e11, 1e12)}
    for machine, (bandwidth, peak) in machines.items():
        for batch, context in [(1, 4096), (64, 131072), (1024, 4096)]:
            parts = decode_step_bytes(model, batch, context)
            per_seq = flops_per_token(k3, context)
            want_bytes, want_flops = sum(parts.values()), batch * per_seq
            want_bound = "compute" if want_flops / peak > want_bytes / bandwidth else "memory"
            where = f"K3 on {machine}, batch {batch}, context {context:,}"
            got = _call(fn, (model, batch, context, per_seq, bandwidth, peak), where)
            if not isinstance(got, dict) or not {"bytes", "flops", "bound"} <= set(got):
                raise ExerciseError('Return a dict with the keys "bytes", "flops" and "bound". '
                                    f"For {where} yours was {got!r:.80}.")
            try:
                got_bytes, got_flops = float(got["bytes"]), float(got["flops"])
            except (TypeError, ValueError):
                raise ExerciseError('"bytes" and "flops" are numbers.') from None
            right = (f"For {where}: {want_bytes:.4g} B ({', '.join(f'{k} {v:.3g}' for k, v in parts.items())}) and "
                     f"{want_flops:.4g} FLOPs; yours: {got_bytes:.4g} B, {got_flops:.4g} FLOPs.")
            if not math.isclose(got_bytes, want_bytes, rel_tol=1e-9):
                rest = want_bytes - parts["experts"]
                per_token_experts = model.moe_layers * min(batch * model.top_k, model.num_experts) * model.expert_bytes
                if math.isclose(got_bytes, rest + model.moe_layers * batch * model.top_k * model.expert_bytes, rel_tol=1e-9) \
                        or (batch > 1 and math.isclose(got_bytes, rest + per_token_experts, rel_tol=1e-9)):
                    raise ExerciseError("Tokens of one batch share experts: an expert two tokens chose is read once. "
                                        "Count the distinct experts the batch touches, N (1 - (1 - k/N)^B) under "
                                        "uniform routing. " + right)
                if math.isclose(got_bytes, rest + model.moe_layers * model.top_k * model.expert_bytes, rel_tol=1e-9) and batch > 1:
                    raise ExerciseError(f"With {batch} sequences the step reads more than top_k = {model.top_k} experts "
                                        "per layer: each token picks its own. " + right)
                if math.isclose(got_bytes, rest + model.moe_layers * model.num_experts * model.expert_bytes, rel_tol=1e-9):
                    raise ExerciseError("Not every expert is read: only those some token of the batch chose. " + right)
                if math.isclose(got_bytes, want_bytes - parts["kv"] * (1 - 1 / batch), rel_tol=1e-9) and batch > 1:
                    raise ExerciseError("Each sequence has its own KV cache: the KV bytes grow with the batch. " + right)
                if math.isclose(got_bytes, want_bytes - parts["state"] / 2, rel_tol=1e-9):
                    raise ExerciseError("The KDA state is read AND written back every step: count it twice. " + right)
                if math.isclose(got_bytes, want_bytes - parts["state"], rel_tol=1e-9):
                    raise ExerciseError("The KDA state is missing: every step reads and rewrites each sequence's "
                                        "fixed state. " + right)
                if math.isclose(got_bytes, want_bytes + (batch - 1) * parts["dense"], rel_tol=1e-9) and batch > 1:
                    raise ExerciseError("The weights are read once per step for the whole batch, not once per "
                                        "sequence: that sharing is why batching pays. " + right)
                raise ExerciseError(right)
            if not math.isclose(got_flops, want_flops, rel_tol=1e-9):
                if math.isclose(got_flops, per_seq, rel_tol=1e-9):
                    raise ExerciseError(f"Every one of the {batch} sequences does its own token's FLOPs. " + right)
                raise ExerciseError(right)
            if got["bound"] != want_bound:
                t_mem, t_flop = want_bytes / bandwidth, want_flops / peak
                raw = "compute" if want_flops > want_bytes else "memory"
                why = (" You compared FLOPs with bytes directly; compare the TIMES, bytes / bandwidth against "
                       "FLOPs / peak (or the intensity FLOPs/byte against the machine's ridge peak / bandwidth)."
                       if got["bound"] == raw else "")
                raise ExerciseError(f"For {where} the step takes {t_mem * 1e3:.3g} ms to read and {t_flop * 1e3:.3g} "
                                    f"ms to compute, so it is {want_bound}-bound; yours said {got['bound']!r}.{why}")
    h200_bw, h200_peak = machines["an H200 (4.8 TB/s, 989 TFLOP/s)"]
    big = sum(decode_step_bytes(model, 1024, 4096).values()), 1024 * flops_per_token(k3, 4096)
    intensity, ridge = big[1] / big[0], h200_peak / h200_bw
    _passed("check_decode_roofline", "bytes and FLOPs of one decode step, and the bound that wins, as sim.costs "
                                     f"(K3 at batch 1024, 4K context: {intensity:.0f} FLOP/B against an H200's ridge of "
                                     f"{ridge:.0f}: {'compute' if intensity > ridge else 'memory'}-bound).")
