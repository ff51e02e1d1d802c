import torch
import torch.nn.functional as F

from tiny_k3 import K3Config
from tiny_k3.mla import GatedMLA
from tiny_k3.probe import TraceRecorder


def _layer(**changes):
    torch.manual_seed(0)
    cfg = K3Config.preset("tiny", **changes)
    layer = GatedMLA(cfg, dtype=torch.float64)
    for p in layer.parameters():
        torch.nn.init.normal_(p, 0, 0.3)
    return cfg, layer


def _oracle(layer, x):
    """The same attention with explicit per-head K and V, through torch's own SDPA."""
    B, T, _ = x.shape
    lat, kr = layer.kv_a_proj(x).split([layer.kv_rank, layer.rope], -1)
    kn, v = layer.kv_b_proj(layer.kv_norm(lat)).view(B, T, layer.heads, -1).split([layer.nope, layer.v_dim], -1)
    k = torch.cat([kn, kr[:, :, None].expand(B, T, layer.heads, layer.rope)], -1)
    q = layer.project_q(x)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    gate = torch.sigmoid(layer.g_proj(x)).view(B, T, layer.heads, layer.v_dim)
    return layer.o_proj((o.transpose(1, 2) * gate).reshape(B, T, -1))


def test_matches_sdpa_oracle_with_and_without_q_lora():
    for changes in [{}, {"q_lora_rank": None}]:
        _, layer = _layer(**changes)
        x = torch.randn(2, 9, 32, dtype=torch.float64)
        y, cache = layer(x)
        torch.testing.assert_close(y, _oracle(layer, x))


def test_cached_decode_equals_full_pass_and_cache_holds_latent_plus_rope():
    cfg, layer = _layer()
    x = torch.randn(1, 7, 32, dtype=torch.float64)
    full, full_cache = layer(x)
    cache, outs = None, []
    for t in range(7):
        y, cache = layer(x[:, t:t + 1], cache)
        outs.append(y)
    torch.testing.assert_close(torch.cat(outs, 1), full)
    assert cache.latent.shape == (1, 7, cfg.kv_lora_rank) and cache.k_rope.shape == (1, 7, cfg.qk_rope_dim)
    assert cache.nbytes() == 7 * cfg.mla_cache_width * 8  # float64 here
    torch.testing.assert_close(cache.latent, full_cache.latent)


def test_nope_last_token_ignores_the_order_of_earlier_tokens():
    _, layer = _layer()
    x = torch.randn(1, 6, 32, dtype=torch.float64)
    perm = torch.tensor([3, 0, 4, 1, 2, 5])  # shuffle the prefix, keep the last token last
    torch.testing.assert_close(layer(x)[0][:, -1], layer(x[:, perm])[0][:, -1])


def test_output_gate_multiplies_the_attention_before_w_o():
    _, layer = _layer()
    x = torch.randn(1, 4, 32, dtype=torch.float64)
    gated = _oracle(layer, x)
    with torch.no_grad():
        layer.g_proj.weight.zero_()  # sigmoid(0) = 1/2 on every channel
    half, _ = layer(x)
    with torch.no_grad():
        layer.o_proj.weight.mul_(2.0)  # undo the halving: now it is the ungated attention
    ungated, _ = layer(x)
    torch.testing.assert_close(half, ungated / 2)
    assert not torch.allclose(gated, ungated)  # a learned gate really changes the output


def test_recorder_sees_causal_probabilities():
    _, layer = _layer()
    rec = TraceRecorder()
    layer(torch.randn(1, 5, 32, dtype=torch.float64), recorder=rec, layer=3)
    (layer_idx, data), = rec.of("mla")
    probs = data["probs"]
    assert layer_idx == 3 and probs.shape == (1, 2, 5, 5) and data["cache_len"] == 5
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 2, 5, dtype=torch.float64))
    assert torch.all(probs.triu(1) == 0)
