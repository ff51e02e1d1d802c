"""K3's lineage as presets (docs/lineage.md): the new options against their definitions, the padding mask,
the Kimi Linear and K2 counts against hand derivations, and `python -m tiny_k3 diff`."""

from __future__ import annotations

import io
import math
from contextlib import redirect_stdout

import pytest
import torch
from torch.nn import functional as F

from sim import costs, memory
from tiny_k3 import ConfigError, K3Config, TinyK3, parameter_breakdown, parameter_counts
from tiny_k3.__main__ import main as cli
from tiny_k3.config import COUNTED_ONLY, LINEAGE_PRESETS
from tiny_k3.kda import KDALayer
from tiny_k3.lineage import cache_size, diff
from tiny_k3.mla import GatedMLA, apply_rope, rope_angles
from tiny_k3.moe import GatedMLP, LatentMoE, PlainMoE, situ_glu, swiglu

DECODE, PREFILL = "gathered", "sorted"   # mix_experts' two paths (moe_fast.py's stage "pairs"), forced


def _randomise(module: torch.nn.Module, std: float = 0.3, seed: int = 0) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * std)
    return module


# ---------------------------------------------------------------------------- SwiGLU and the plain MoE
def test_swiglu_is_silu_gate_times_up_and_the_dense_mlp_uses_it():
    gen = torch.Generator().manual_seed(1)
    g, u = torch.randn(5, 7, generator=gen, dtype=torch.float64) * 4, torch.randn(5, 7, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(swiglu(g, u), g / (1 + torch.exp(-g)) * u)
    assert not torch.allclose(swiglu(g, u), situ_glu(g, u))         # large gates: SiTU caps, SwiGLU does not
    cfg = K3Config.preset("k2-tiny")
    mlp = _randomise(GatedMLP(cfg.hidden_size, 24, cfg, dtype=torch.float64))
    x = torch.randn(2, 3, cfg.hidden_size, generator=gen, dtype=torch.float64)
    gate, up = x @ mlp.w1.weight.T, x @ mlp.w3.weight.T
    torch.testing.assert_close(mlp(x), (gate * torch.sigmoid(gate) * up) @ mlp.w2.weight.T)
    situ = GatedMLP(cfg.hidden_size, 24, cfg.replace(mlp_act="situ"), dtype=torch.float64)
    situ.load_state_dict(mlp.state_dict())
    torch.testing.assert_close(situ(x), situ_glu(gate, up) @ mlp.w2.weight.T)


@pytest.mark.parametrize("path", [DECODE, PREFILL])
def test_plain_moe_equals_a_loop_over_all_experts(path):
    cfg = K3Config.preset("kimi-linear-tiny", num_experts=32, top_k=4)
    moe = _randomise(PlainMoE(cfg, dtype=torch.float64), std=0.2)
    moe.fast.force(pairs=path)
    x = torch.randn(2, 5, cfg.hidden_size, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    routing = moe.router(x)
    expected = torch.zeros_like(x)
    for e in range(cfg.num_experts):                        # every expert at full width, weight 0 unless chosen
        weight = (routing.weights * (routing.expert_ids == e)).sum(-1, keepdim=True)
        h = F.silu(x @ moe.w1[e].T) * (x @ moe.w3[e].T)
        expected = expected + weight * (h @ moe.w2[e].T)
    shared = moe.shared
    expected = expected + shared.w2(F.silu(shared.w1(x)) * shared.w3(x))
    torch.testing.assert_close(moe(x), expected)
    assert routing.weights.sum(-1).allclose(torch.full((2, 5), cfg.routed_scaling, dtype=torch.float64))
    keys = set(moe.state_dict())
    assert keys == {"router.weight", "router.bias", "w1", "w3", "w2", "shared.w1.weight", "shared.w3.weight",
                    "shared.w2.weight"}
    assert tuple(moe.w1.shape) == (32, cfg.moe_intermediate, cfg.hidden_size)   # experts see the full width


def test_latent_moe_with_swiglu_matches_its_dense_reference():
    cfg = K3Config.preset("tiny", mlp_act="swiglu")
    moe = _randomise(LatentMoE(cfg, dtype=torch.float64), std=0.2)
    x = torch.randn(1, 6, cfg.hidden_size, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    torch.testing.assert_close(moe(x), moe.dense_reference(x))
    situ = LatentMoE(cfg.replace(mlp_act="situ"), dtype=torch.float64)
    situ.load_state_dict(moe.state_dict())
    assert not torch.allclose(situ(x), moe(x))


# ---------------------------------------------------------------------------- MLA: gate and RoPE
def test_rope_matches_complex_rotation_and_keeps_norms():
    x = torch.randn(3, 4, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    pos = torch.tensor([0, 1, 7, 1000])
    cos, sin = rope_angles(pos, 8, 50000.0, torch.float64)
    turned = apply_rope(x, cos, sin)
    freq = 50000.0 ** -(torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    z = torch.view_as_complex(x.reshape(3, 4, 4, 2).contiguous()) * torch.polar(torch.ones(4, 4, dtype=torch.float64),
                                                                                pos[:, None] * freq)
    torch.testing.assert_close(turned, torch.view_as_real(z).reshape(3, 4, 8))
    torch.testing.assert_close(turned.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(turned[:, 0], x[:, 0])                # position 0 is the identity


def test_rope_scores_depend_only_on_relative_position():
    gen = torch.Generator().manual_seed(5)
    q, k = torch.randn(8, generator=gen, dtype=torch.float64), torch.randn(8, generator=gen, dtype=torch.float64)

    def score(pq, pk):
        (cq, sq), (ck, sk) = (rope_angles(torch.tensor(p), 8, 10000.0, torch.float64) for p in (pq, pk))
        return (apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum()

    for shift in (1, 17, 4000):
        torch.testing.assert_close(score(9 + shift, 4 + shift), score(9, 4))
    assert not torch.isclose(score(9, 4), score(9, 8))               # but the distance matters


def _mla(preset="k2-tiny", **changes):
    cfg = K3Config.preset(preset, **changes)
    return cfg, _randomise(GatedMLA(cfg, dtype=torch.float64), std=0.3, seed=6)


def test_rope_mla_cached_decode_equals_the_full_forward():
    cfg, layer = _mla()
    x = torch.randn(2, 9, cfg.hidden_size, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    full, cache = layer(x)
    steps, c = [], None
    for t in range(9):
        y, c = layer(x[:, t:t + 1], c)
        steps.append(y)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(c.k_rope, cache.k_rope)                # the cache keeps the key already rotated
    # the whole layer is invariant to shifting every position, and changes when they are scrambled
    shifted, _ = layer(x, positions=torch.arange(9).expand(2, 9) + 123)
    torch.testing.assert_close(shifted, full, rtol=1e-9, atol=1e-9)
    scrambled, _ = layer(x, positions=torch.arange(9).flip(0).expand(2, 9))
    assert not torch.allclose(scrambled[:, 1:], full[:, 1:])


def test_mla_without_gate_and_with_its_own_latent_eps():
    cfg, layer = _mla("kimi-linear-tiny")
    assert layer.g_proj is None and layer.kv_norm.eps == 1e-6 != cfg.rms_norm_eps
    x = torch.randn(1, 5, cfg.hidden_size, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    B, T, _ = x.shape
    latent, kr = layer.kv_a_proj(x).split([layer.kv_rank, layer.rope], -1)
    kn, v = layer.kv_b_proj(layer.kv_norm(latent)).view(B, T, layer.heads, -1).split([layer.nope, layer.v_dim], -1)
    k = torch.cat([kn, kr[:, :, None].expand(B, T, layer.heads, layer.rope)], -1)
    o = F.scaled_dot_product_attention(layer.project_q(x).transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       is_causal=True)
    torch.testing.assert_close(layer(x)[0], layer.o_proj(o.transpose(1, 2).reshape(B, T, -1)))
    assert K3Config.preset("k3").mla_latent_eps == 1e-6 and GatedMLA(K3Config.preset("tiny")).kv_norm.eps == 1e-6


# ---------------------------------------------------------------------------- KDA's low-rank output gate
def test_low_rank_output_gate_equals_full_rank_gate_with_the_product_matrix():
    low_cfg = K3Config.preset("tiny", kda_output_gate_rank=3)
    low = _randomise(KDALayer(low_cfg, dtype=torch.float64), std=0.3, seed=9)
    full = KDALayer(low_cfg.replace(kda_output_gate_rank=None), dtype=torch.float64)
    state = {k: v for k, v in low.state_dict().items() if not k.startswith(("g_a_proj", "g_b_proj"))}
    state["g_proj.weight"] = low.g_b_proj.weight @ low.g_a_proj.weight            # [H*V, r] @ [r, D]
    full.load_state_dict(state)
    x = torch.randn(2, 6, low_cfg.hidden_size, generator=torch.Generator().manual_seed(10), dtype=torch.float64)
    (y_low, s_low), (y_full, s_full) = low(x), full(x)
    torch.testing.assert_close(y_low, y_full)
    torch.testing.assert_close(s_low.state, s_full.state)
    assert torch.linalg.matrix_rank(state["g_proj.weight"]) == 3
    assert sum(p.numel() for p in low.parameters()) < sum(p.numel() for p in full.parameters())


# ---------------------------------------------------------------------------- padding mask
def _tokens(n, seed):
    return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("preset, lengths", [("tiny", (7, 20)), ("kimi-linear-tiny", (5, 11)), ("k2-tiny", (6, 10)),
                                             ("tiny-twin", (6, 13))])
def test_a_left_padded_batch_gives_each_prompt_its_own_logits(preset, lengths):
    from tiny_k3.weights import config_for
    cfg = config_for(preset)
    torch.manual_seed(0)
    model = _randomise(TinyK3(cfg, dtype=torch.float64).eval(), std=0.15, seed=11)
    a, b = _tokens(lengths[0], 1), _tokens(lengths[1], 2)
    T, pad = lengths[1], lengths[1] - lengths[0]
    batch = torch.cat([torch.cat([torch.full((1, pad), 7), a], 1), b])         # padding ids are arbitrary
    mask = torch.ones(2, T, dtype=torch.bool)
    mask[0, :pad] = False
    nxt = torch.tensor([[3], [4]])
    with torch.no_grad():
        la, ca = model(a)
        lb, cb = model(b)
        lab, cab = model(batch, attention_mask=mask)
        la2, ca = model(nxt[:1], ca)
        lb2, cb = model(nxt[1:], cb)
        lab2, cab = model(nxt, cab)                      # decode needs no mask: the cache remembers the padding
    tol = dict(rtol=1e-7, atol=1e-7)   # float64; the chunked KDA form cuts the padded row at other places
    torch.testing.assert_close(lab[0, pad:], la[0], **tol)
    torch.testing.assert_close(lab[1], lb[0], **tol)
    torch.testing.assert_close(lab2[0], la2[0], **tol)
    torch.testing.assert_close(lab2[1], lb2[0], **tol)
    for i in cfg.kda_layers:                             # the KDA state and conv tail never saw the padding
        torch.testing.assert_close(cab.layers[i].state[0], ca.layers[i].state[0], **tol)
        torch.testing.assert_close(cab.layers[i].conv[0], ca.layers[i].conv[0], **tol)
    for i in cfg.mla_layers:
        torch.testing.assert_close(cab.layers[i].latent[0, pad:], ca.layers[i].latent[0], **tol)
    for i in cfg.mla_conv_layers:                        # nor did the twin's short-conv tails
        torch.testing.assert_close(cab.layers[i].conv[0], ca.layers[i].conv[0], **tol)
    assert cab.key_mask.shape == (2, T + 1) and cab.clone().key_mask is not cab.key_mask
    # without the mask the padded prompt's logits are wrong: the test can tell
    with torch.no_grad():
        unmasked, _ = model(batch)
    assert not torch.allclose(unmasked[0, pad:], la[0], rtol=1e-6, atol=1e-6)


def test_bad_padding_masks_are_one_sentence():
    model = TinyK3(K3Config.preset("tiny"))
    tokens = torch.zeros(2, 4, dtype=torch.long)
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    with pytest.raises(ValueError, match="must be left padding") as info:
        model(tokens, attention_mask=right)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="must have the shape of tokens"):
        model(tokens, attention_mask=torch.ones(2, 3))
    _, cache = model(tokens)
    with pytest.raises(ValueError, match="must be left padding"):   # no padding after real tokens
        model(tokens, cache, attention_mask=torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]))


# ---------------------------------------------------------------------------- checkpoints and presets
def test_existing_presets_keep_every_new_default_and_checkpoints_load_unchanged():
    from safetensors import safe_open

    from tiny_k3.weights import available_pretrained, config_for, weights_path

    for name in K3Config.presets():
        if name in LINEAGE_PRESETS:
            continue
        c = K3Config.preset(name)
        assert (c.moe_kind, c.mlp_act, c.mla_output_gate, c.mla_rope, c.kda_output_gate_rank, c.mla_norm_eps) == \
            ("latent", "situ", True, False, None, None), name
    shipped = available_pretrained()
    assert "small" in shipped
    for name in shipped:
        with safe_open(str(weights_path(name)), framework="pt") as f:
            stored = set(f.keys())
        assert stored == set(TinyK3(config_for(name), device="meta").state_dict()), name
        TinyK3.from_pretrained(name)


def test_lineage_tiny_presets_keep_their_family_shape():
    kl, k2 = K3Config.preset("kimi-linear-tiny"), K3Config.preset("k2-tiny")
    big_kl, big_k2 = K3Config.preset("kimi-linear-48b"), K3Config.preset("k2")
    for tiny, big in ((kl, big_kl), (k2, big_k2)):
        assert tiny.num_experts / tiny.top_k == big.num_experts / big.top_k      # 32:1 and 48:1
        same = ("moe_kind", "mlp_act", "mla_output_gate", "mla_rope", "residual", "num_shared_experts",
                "first_k_dense", "kda_gate_lower_bound", "routed_scaling", "mla_norm_eps")
        assert [getattr(tiny, f) for f in same] == [getattr(big, f) for f in same]
        assert (tiny.q_lora_rank is None) == (big.q_lora_rank is None)
    assert kl.kda_output_gate_rank == kl.kda_head_dim and big_kl.kda_output_gate_rank == big_kl.kda_head_dim
    assert [i + 1 for i in big_kl.mla_layers] == [4, 8, 12, 16, 20, 24, 27] and kl.mla_layers == [3, 7]
    assert set(k2.layer_kinds) == set(big_k2.layer_kinds) == {"mla"} and len(big_k2.mla_layers) == 61
    for name in COUNTED_ONLY:
        with pytest.raises(ValueError, match="counted on the meta device only"):
            TinyK3(K3Config.preset(name))


@pytest.mark.parametrize("changes, needle", [
    (dict(moe_kind="dense"), "moe_kind must be one of latent, plain"),
    (dict(mlp_act="gelu"), "mlp_act must be one of situ, swiglu"),
    (dict(kda_output_gate_rank=0), "kda_output_gate_rank must be None (full rank) or a positive integer"),
    (dict(mla_norm_eps=0.0), "mla_norm_eps must be None"),
    (dict(rope_theta=-1.0), "rope_theta must be positive"),
    (dict(mla_rope=True, qk_rope_dim=3), "qk_rope_dim must be a positive even number"),
])
def test_new_options_reject_bad_values_in_one_sentence(changes, needle):
    with pytest.raises(ConfigError) as info:
        K3Config.preset("tiny", **changes)
    assert needle in str(info.value) and "\n" not in str(info.value)


# ---------------------------------------------------------------------------- counts (docs/lineage.md)
def _hand_counts(*, d, layers, kda_layers, vocab, dense, experts, top_k, m, shared, mla, kda):
    """(total, active) from the published config by hand: the formulas of docs/lineage.md."""
    moe_layers = layers - 1
    expert = 3 * d * m
    norms = 2 * d * layers + d
    non_expert = (kda * kda_layers + mla * (layers - kda_layers) + 3 * d * dense
                  + moe_layers * (3 * d * shared + experts * d) + 2 * vocab * d + norms)
    total = non_expert + moe_layers * experts * expert
    active = non_expert - vocab * d + moe_layers * top_k * expert
    return total, active


def test_kimi_linear_counts_match_the_config_by_hand_and_the_published_48b_a3b():
    d, H, K, r = 2304, 32, 128, 128
    kda = 3 * d * H * K + 3 * H * K * 4 + 2 * (d * r + r * H * K) + d * H + H + H * K + K + H * K * d
    mla = d * H * 192 + d * 576 + 512 + 512 * H * 256 + H * 128 * d                 # q_proj, kv_a, norm, kv_b, o
    total, active = _hand_counts(d=d, layers=27, kda_layers=20, vocab=163840, dense=9216, experts=256, top_k=8,
                                 m=1024, shared=1024, mla=mla, kda=kda)
    cfg = K3Config.preset("kimi-linear-48b")
    t, a = parameter_counts(cfg)
    assert abs(t / total - 1) < 0.01 and abs(a / active - 1) < 0.01, (t, total, a, active)
    parts = parameter_breakdown(cfg)
    vocab = parts["embedding"] + parts["lm_head"]
    assert round((t - vocab) / 1e9) == 48 and round(a / 1e9) == 3       # "48B total, 3B activated" (README)
    assert round(t / 1e9) == 49                                            # all weights: 49.1B


def test_k2_counts_match_the_config_by_hand_and_the_published_1t_a32b():
    d, H = 7168, 64
    mla = (d * 1536 + 1536 + 1536 * H * 192 + d * 576 + 512 + 512 * H * 256 + H * 128 * d)
    total, active = _hand_counts(d=d, layers=61, kda_layers=0, vocab=163840, dense=18432, experts=384, top_k=8,
                                 m=2048, shared=2048, mla=mla, kda=0)
    t, a = parameter_counts(K3Config.preset("k2"))
    assert abs(t / total - 1) < 0.01 and abs(a / active - 1) < 0.01, (t, total, a, active)
    assert round(t / 1e12) == 1 and round(t / 1e10) / 100 == 1.03        # "1T total", about 1.03T counted
    assert round(a / 1e9) == 32                                           # "32B activated"
    experts, rest = costs.k2_parameters()
    assert experts + rest == t and experts == 60 * 384 * 3 * d * 2048


def test_sim_reads_k2_and_kimi_linear_from_the_presets():
    k2 = costs.k2_serving_model()
    assert k2.kv_bytes_per_token == 70_272 == cache_size(K3Config.preset("k2")).kv_per_token   # 61 x 576 x 2
    assert k2.weight_bytes == pytest.approx(594.2e9, rel=0.002)                               # K2-Thinking
    for name in ("k2", "kimi-linear-48b", "k3", "kimi-linear-tiny", "k2-tiny"):
        cfg = K3Config.preset(name)
        measured = cache_size(cfg)
        assert (measured.kv_per_token, measured.state) == (memory.kv_bytes_per_token(cfg),
                                                           memory.state_bytes_fixed(cfg).total), name
    assert memory.kv_reduction(K3Config.preset("k3"), K3Config.preset("k2")) == pytest.approx(1 - 27648 / 70272)
    assert costs.ep_traffic_for(K3Config.preset("k2")).per_token == pytest.approx(10.4e6, rel=0.01)  # d_route 7168
    assert costs.KIMI_LINEAR.name == "kimi-linear-48b"


# ---------------------------------------------------------------------------- diff
def test_diff_k2_to_k3_names_every_change_with_its_deltas():
    k2, k3 = K3Config.preset("k2"), K3Config.preset("k3")
    rows = {d.part: d for d in diff(k2, k3)}
    assert rows["attention layers"].before == "61 layers: 61 MLA"
    assert rows["attention layers"].after == "93 layers: 69 KDA + 24 MLA"
    assert "384 experts top-8 (48:1)" in rows["MoE"].before and "896 experts top-16 (56:1)" in rows["MoE"].after
    assert "plain" in rows["MoE"].before and "latent 7168->3584" in rows["MoE"].after
    assert "RoPE" in rows["MLA"].before and "no output gate" in rows["MLA"].before
    assert "NoPE" in rows["MLA"].after and "no output gate" not in rows["MLA"].after
    assert (rows["activation"].before, rows["activation"].after) == ("SwiGLU", "SiTU-GLU (caps 4, 25)")
    assert rows["residual (+ norms)"].before.startswith("standard") and "Block AttnRes" in rows["residual (+ norms)"].after
    assert not rows["vocabulary"].changed
    assert rows["KV cache per token"].delta == 27_648 - 70_272
    assert rows["KDA state per sequence"].delta == memory.state_bytes_fixed(k3).total
    (t2, a2), (t3, a3) = parameter_counts(k2), parameter_counts(k3)
    assert rows["total parameters"].delta == t3 - t2 and rows["active per token"].delta == a3 - a2
    sized = [d for d in diff(k2, k3) if d.unit == "params" and d.part not in ("total parameters", "active per token")]
    assert sum(d.delta for d in sized) == t3 - t2                         # the parts add up to the total
    assert all(not d.changed for d in diff(k3, k3))


def test_diff_command_prints_the_table_and_rejects_unknown_presets():
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli(["diff", "kimi-linear-48b", "k3"]) == 0
    text = out.getvalue()
    for needle in ("20 KDA + 7 MLA", "69 KDA + 24 MLA", "rank 128", "full rank", "+19,584 B", "SwiGLU"):
        assert needle in text, needle
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli(["diff", "k2", "k3", "--changed"]) == 0
    text = out.getvalue()
    assert "70,272 B" in text and "-42,624 B" in text and "vocabulary" not in text   # only the changed parts
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli(["diff", "k4", "k3"]) == 2
    assert "unknown preset 'k4'" in out.getvalue() and "Traceback" not in out.getvalue()


def test_active_definition_is_the_same_for_all_three():
    for name in ("k2", "kimi-linear-48b", "k3"):
        cfg = K3Config.preset(name)
        parts = parameter_breakdown(cfg)
        total, active = parameter_counts(cfg)
        idle = parts["routed_experts"] * (cfg.num_experts - cfg.top_k) // cfg.num_experts
        assert active == total - parts["embedding"] - idle and math.isclose(
            parts["routed_experts"] / len(cfg.moe_layers) / cfg.num_experts, 3 * cfg.moe_intermediate *
            (cfg.latent_dim if cfg.moe_kind == "latent" else cfg.hidden_size))
