"""Decode fast paths of the layers (norm, depth reads, MLA, KDA): each against its written-out reference."""

import pytest
import torch

from tiny_k3.norm import rms_norm, rms_norm_reference

F64 = torch.float64
AT_1_AND_2_THREADS = pytest.mark.usefixtures("torch_threads")   # (tests/conftest.py) the layers' fast paths


@AT_1_AND_2_THREADS
@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 1e-6), (F64, 1e-14)])
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_is_the_written_out_formula(dtype, rtol, with_weight):
    # torch's fused op against the formula's separate ops: their mean reductions may round differently on
    # another CPU or thread count (issue 24), so to a few ulps (every error here is relative: a product by r)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 64, generator=gen, dtype=dtype) * 3
    weight = (1 + torch.randn(64, generator=gen, dtype=dtype)) if with_weight else None
    torch.testing.assert_close(rms_norm(x, weight, 1e-6), rms_norm_reference(x, weight, 1e-6), rtol=rtol, atol=0)
    # and the formula itself: unit root-mean-square before the gain
    y = rms_norm(x, None, 0.0)
    torch.testing.assert_close(y.pow(2).mean(-1), torch.ones(3, 5, dtype=dtype))


@AT_1_AND_2_THREADS
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-6), (F64, 1e-14)])
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_of_one_row_equals_the_formula(dtype, atol, with_weight):
    # one row without autograd (a decode step) takes rms_norm_row: the reference to within an ulp of the output
    from tiny_k3.norm import rms_norm_row
    gen = torch.Generator().manual_seed(0)
    weight = (1 + torch.randn(64, generator=gen, dtype=dtype)) if with_weight else None
    for scale in (1e-3, 1.0, 30.0):
        x = torch.randn(1, 1, 64, generator=gen, dtype=dtype) * scale
        reference = rms_norm_reference(x, weight, 1e-6)
        for y in (rms_norm(x, weight, 1e-6), rms_norm_row(x, weight, 1e-6)):
            assert y.shape == x.shape and y.dtype == dtype
            torch.testing.assert_close(y, reference, atol=atol * float(reference.abs().max()), rtol=0)
    assert not torch.equal(rms_norm(x, None, 1e-6), x)                        # it does normalise
    zero = torch.zeros(1, 1, 64, dtype=dtype)                                  # eps keeps a zero row finite
    assert torch.equal(rms_norm_row(zero, weight), zero)


@AT_1_AND_2_THREADS
def test_rms_norm_of_one_row_under_autograd_takes_the_differentiable_path():
    x = torch.randn(1, 1, 16, dtype=F64, requires_grad=True)
    weight = torch.randn(16, dtype=F64, requires_grad=True)
    rms_norm(x, weight).sum().backward()
    x2, w2 = x.detach().clone().requires_grad_(True), weight.detach().clone().requires_grad_(True)
    rms_norm_reference(x2, w2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, atol=1e-12, rtol=0)
    torch.testing.assert_close(weight.grad, w2.grad, atol=1e-12, rtol=0)


@AT_1_AND_2_THREADS
def test_rms_norm_with_a_weight_of_another_dtype_promotes():
    x, weight = torch.randn(2, 8), torch.ones(8, dtype=F64) * 2
    y = rms_norm(x, weight)
    assert y.dtype == F64
    torch.testing.assert_close(y, rms_norm_reference(x.double(), None) * 2)


@AT_1_AND_2_THREADS
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_rotate_pairs_is_apply_rope_bit_for_bit(dtype):
    from tiny_k3.mla import _rope_table, apply_rope, rope_angles, rope_factors, rotate_pairs
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 3, 8, generator=gen, dtype=dtype)
    positions = torch.tensor([[0, 1, 7, 300, 4095], [2, 3, 4, 5, 6]])
    cos, sin = rope_angles(positions, 8, 10000.0, dtype)
    reference = apply_rope(x, cos[:, :, None], sin[:, :, None])
    C, S = rope_factors(cos, sin)
    assert torch.equal(rotate_pairs(x, C[:, :, None], S[:, :, None]), reference)
    assert not torch.equal(reference, x)                                  # it does turn
    # the cached table for positions past .. past+T-1 is the same as computing them
    C_tab, S_tab = _rope_table(300, 5, 8, 10000.0, dtype, x.device, False)
    C_ref, S_ref = rope_factors(*rope_angles(torch.arange(300, 305), 8, 10000.0, dtype))
    assert torch.equal(C_tab, C_ref) and torch.equal(S_tab, S_ref)


@AT_1_AND_2_THREADS
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-6), (F64, 1e-13)])
def test_kda_folded_decay_gate_equals_kda_gate(dtype, atol):
    from tiny_k3 import K3Config
    from tiny_k3.kda import KDALayer, kda_gate
    torch.manual_seed(0)
    layer = KDALayer(K3Config.preset("tiny"), dtype=dtype)
    H, K = layer.num_heads, layer.head_k_dim
    with torch.no_grad():
        layer.A_log.uniform_(-1, 2)                            # a = exp(A_log) far from 1: the fold matters
    z = torch.randn(3, 1, layer.config.kda_gate_rank, dtype=dtype)
    reference = kda_gate(layer.f_b_proj(z).view(3, 1, H, K), layer.A_log, layer.dt_bias, layer.lower_bound)
    with torch.no_grad():
        folded = layer.decay_gate(z).view(3, 1, H, K)
        torch.testing.assert_close(folded, reference.detach(), atol=atol, rtol=0)
        assert (folded < 0).all() and (folded > layer.lower_bound).all()
        layer.A_log.add_(0.5)                                  # an optimiser step: the cached fold must follow
        moved = kda_gate(layer.f_b_proj(z).view(3, 1, H, K), layer.A_log, layer.dt_bias, layer.lower_bound)
        torch.testing.assert_close(layer.decay_gate(z).view(3, 1, H, K), moved, atol=atol, rtol=0)
        assert not torch.allclose(moved, reference)


@AT_1_AND_2_THREADS
@pytest.mark.parametrize("preset", ["tiny", "k2-tiny"])    # NoPE with K3's gate; K2's RoPE, no gate
def test_mla_absorbed_decode_equals_the_expanded_form(preset):
    from tiny_k3 import K3Config
    from tiny_k3.mla import GatedMLA
    torch.manual_seed(0)
    cfg = K3Config.preset(preset)
    mla = GatedMLA(cfg, dtype=F64)
    B, S, H = 2, 9, cfg.mla_heads
    gen = torch.Generator().manual_seed(1)
    q_nope = torch.randn(B, 1, H, cfg.qk_nope_dim, generator=gen, dtype=F64) * 3
    q_rope = torch.randn(B, 1, H, cfg.qk_rope_dim, generator=gen, dtype=F64) * 3
    latent = torch.randn(B, S, cfg.kv_lora_rank, generator=gen, dtype=F64)
    k_rope = torch.randn(B, S, cfg.qk_rope_dim, generator=gen, dtype=F64)
    probs, attn = mla.attend_absorbed(q_nope, q_rope, latent, k_rope)
    probs_ref, attn_ref = mla.attend_expanded(q_nope, q_rope, latent, k_rope, past=S - 1)
    assert probs.shape == probs_ref.shape == (B, H, 1, S) and attn.shape == attn_ref.shape
    torch.testing.assert_close(probs, probs_ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(attn, attn_ref, atol=1e-12, rtol=0)
    assert probs.max() > 2 / S                                     # not uniform: the scores matter


@AT_1_AND_2_THREADS
@pytest.mark.parametrize("preset", ["tiny", "k2-tiny"])
def test_mla_layer_decode_without_autograd_equals_with_it(preset):
    # under no_grad one-token steps take `attend_absorbed`; with autograd, `attend_expanded`: token by token equal
    from tiny_k3 import K3Config
    from tiny_k3.mla import GatedMLA
    torch.manual_seed(0)
    cfg = K3Config.preset(preset)
    mla = GatedMLA(cfg, dtype=F64)
    x = torch.randn(1, 7, cfg.hidden_size, dtype=F64)
    ys, cache = [], None
    for t in range(7):
        y, cache = mla(x[:, t:t + 1], cache)
        ys.append(y)
    with torch.no_grad():
        fast, cache_fast = [], None
        for t in range(7):
            y, cache_fast = mla(x[:, t:t + 1], cache_fast)
            fast.append(y)
        whole, _ = mla(x)                                          # and one prefill of all 7 (expanded, causal)
    torch.testing.assert_close(torch.cat(fast, 1), torch.cat(ys, 1).detach(), atol=1e-12, rtol=0)
    torch.testing.assert_close(torch.cat(fast, 1), whole, atol=1e-12, rtol=0)
    torch.testing.assert_close(cache_fast.latent, cache.latent.detach(), atol=1e-14, rtol=0)   # (rms_norm_row: an ulp)


def _decode(model, tokens, cache=None):
    logits = []
    for t in range(tokens.shape[1]):
        out, cache = model(tokens[:, t:t + 1], cache)
        logits.append(out)
    return torch.cat(logits, 1), cache


@pytest.mark.parametrize("preset", ["tiny", "kimi-linear-tiny"])
def test_forward_without_autograd_runs_in_inference_mode_with_the_same_bits(preset, monkeypatch):
    # no_grad enters inference mode (tiny_k3/model.py): the same kernels as plain no_grad, so the very same
    # logits and cache, token by token
    from tiny_k3 import K3Config, TinyK3, model as model_module
    torch.manual_seed(0)
    model = TinyK3(K3Config.preset(preset)).eval()
    tokens = torch.randint(0, 256, (1, 6))
    with torch.no_grad():
        fast, cache = _decode(model, tokens)
        assert model(tokens[:, :1])[0].is_inference() and cache.layers[0].state.is_inference()
    monkeypatch.setattr(model_module, "INFERENCE_MODE", False)
    with torch.no_grad():
        slow, cache_slow = _decode(model, tokens)
    assert not cache_slow.layers[0].state.is_inference()
    assert torch.equal(fast, slow)
    assert all(a is b is None or torch.equal(a, b) for c, d in zip(cache.layers, cache_slow.layers)
               for a, b in zip(vars(c).values(), vars(d).values()))


def test_a_cache_made_without_autograd_continues_with_it():
    # inference tensors cannot be saved for backward: with autograd on the forward swaps such a cache's layers for
    # normal clones, in the caller's cache object (which it advances, as always)
    from tiny_k3 import K3Config, TinyK3
    torch.manual_seed(0)
    model = TinyK3(K3Config.preset("tiny"))
    tokens = torch.randint(0, 256, (1, 5))
    with torch.no_grad():
        _, cache = model(tokens[:, :3])
    with torch.inference_mode(False), torch.enable_grad():
        logits, grown = model(tokens[:, 3:], cache)
        logits.square().sum().backward()
    assert grown is cache and cache.position == 5 and not cache.layers[0].state.is_inference()   # advanced in place
    grad = model.lm_head.weight.grad.clone()
    model.zero_grad()
    _, normal = model(tokens[:, :3])                    # the same prefix with autograd, detached: the same gradient
    for c in normal.layers:
        for name, t in vars(c).items():
            setattr(c, name, None if t is None else t.detach())
    model(tokens[:, 3:], normal)[0].square().sum().backward()
    torch.testing.assert_close(model.lm_head.weight.grad, grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("bad", [-1, 512])
def test_one_token_out_of_range_is_one_sentence(bad):
    # a single token is checked by reading it once (model.py), a longer input by its min and max
    from tiny_k3 import K3Config, TinyK3
    model = TinyK3(K3Config.preset("tiny"))
    for tokens, low, high in ((torch.tensor([[bad]]), bad, bad), (torch.tensor([[3, bad, 4]]), min(bad, 3), max(bad, 4))):
        with pytest.raises(ValueError, match=rf"token ids must lie in \[0, 512\), got {low}\.\.{high}\."):
            model(tokens)


@AT_1_AND_2_THREADS
def test_rms_norm_of_one_bfloat16_row_is_torch_s_own():
    x, weight = torch.randn(1, 1, 64).bfloat16() * 3, torch.randn(64).bfloat16()
    assert torch.equal(rms_norm(x, weight), torch.nn.functional.rms_norm(x, (64,), weight, 1e-6))


@AT_1_AND_2_THREADS
def test_a_cached_constant_is_the_python_scalar_bit_for_bit():
    from tiny_k3.fused import constant
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, F64):
        x = torch.randn(3, 7, generator=gen, dtype=dtype)
        c = constant(1e-6, x)
        assert c.dim() == 0 and c.dtype == dtype and constant(1e-6, x) is c and not c.is_inference()
        assert torch.equal(x + c, x + 1e-6) and torch.equal(x * constant(0.17, x), x * 0.17)


@AT_1_AND_2_THREADS
def test_depth_read_of_one_token_in_float32_equals_depth_attention():
    # the decode read takes the mean square as a matrix-vector product: the reference to float32 rounding
    from tiny_k3.attnres import _depth_read, depth_attention
    gen = torch.Generator().manual_seed(0)
    for D in (64, 48):                                   # (1/48 is not a power of two)
        sources = torch.randn(9, 1, 1, D, generator=gen) * torch.rand(9, 1, 1, 1, generator=gen) * 4
        query, gain = torch.randn(D, generator=gen), 1 + 0.3 * torch.randn(D, generator=gen)
        h, w = _depth_read(sources, query * gain, 1e-6)
        h_ref, w_ref = depth_attention(sources, query, gain, 1e-6)
        assert w_ref.std() > 0.05
        torch.testing.assert_close(w, w_ref, atol=2e-6, rtol=0)
        torch.testing.assert_close(h, h_ref, atol=2e-6 * float(sources.abs().max()), rtol=0)
