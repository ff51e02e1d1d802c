import math

import pytest
import torch
import torch.nn.functional as F

from tiny_k3 import K3Config, fused
from tiny_k3 import kda_chunk as chunk_module
from tiny_k3.kda import KDALayer, kda_chunked, kda_gate, kda_recurrent
from tiny_k3.probe import TraceRecorder

F64 = torch.float64


def _inputs(B=2, T=37, H=3, K=5, V=7, dtype=F64, lower_bound=None, seed=0):
    """Random KDA inputs with realistic gates: q/k L2-normed, g from kda_gate, beta in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=dtype), dim=-1)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=dtype), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen, dtype=dtype)
    g_raw = torch.randn(B, T, H, K, generator=gen, dtype=dtype)
    A_log = torch.rand(H, generator=gen, dtype=dtype) * math.log(16)
    dt_bias = torch.randn(H * K, generator=gen, dtype=dtype)
    g = kda_gate(g_raw, A_log, dt_bias, lower_bound)
    beta = torch.rand(B, T, H, generator=gen, dtype=dtype)
    return q, k, v, g, beta


def _state(B=2, H=3, K=5, V=7, dtype=F64):
    return torch.randn(B, H, K, V, dtype=dtype)


# ---------------------------------------------------------------------------- chunked == recurrent
@pytest.mark.parametrize("B, T, H, K, V", [(1, 1, 1, 4, 4), (2, 37, 3, 5, 7), (1, 100, 2, 16, 8), (2, 64, 1, 8, 8)])
@pytest.mark.parametrize("chunk_size", [16, 32, 64])
@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_chunked_equals_recurrent_float64(B, T, H, K, V, chunk_size, lower_bound):
    q, k, v, g, beta = _inputs(B, T, H, K, V, lower_bound=lower_bound)
    for h0 in [None, _state(B, H, K, V)]:
        o_ref, s_ref = kda_recurrent(q, k, v, g, beta, initial_state=h0, output_final_state=True)
        o, s = kda_chunked(q, k, v, g, beta, initial_state=h0, output_final_state=True, chunk_size=chunk_size)
        assert o.shape == (B, T, H, V) and s.shape == (B, H, K, V)
        torch.testing.assert_close(o, o_ref, atol=1e-10, rtol=0)
        torch.testing.assert_close(s, s_ref, atol=1e-10, rtol=0)
        assert o_ref.abs().max() > 0.01  # a non-trivial output, not two zeros agreeing


def test_strong_decay_stays_exact_and_finite():
    # g in (-40, -30) per step: within a 64-chunk Γ spans > 1800, far past what exp can factor in
    # float64 (~700), so chunks are split into 16-token sub-chunks (span < 600: factored again).
    q, k, v, _, beta = _inputs(1, 70, 2, 8, 8)
    g = -30 - 10 * torch.rand(1, 70, 2, 8, dtype=F64)
    o_ref, s_ref = kda_recurrent(q, k, v, g, beta, output_final_state=True)
    o, s = kda_chunked(q, k, v, g, beta, output_final_state=True)
    torch.testing.assert_close(o, o_ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(s, s_ref, atol=1e-10, rtol=0)
    # float32 (limit ~80): even the sub-chunks are too wide, so those products are formed pair by pair.
    o32, s32 = kda_chunked(*(t.float() for t in (q, k, v, g, beta)), output_final_state=True)
    assert torch.isfinite(o32).all() and torch.isfinite(s32).all()
    torch.testing.assert_close(o32.double(), o_ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("chunk_size", [16, 64])
def test_factored_split_and_pair_by_pair_products_agree(monkeypatch, chunk_size):
    q, k, v, g, beta = _inputs(2, 150, 2, 6, 5)
    fast = kda_chunked(q, k, v, g, beta, chunk_size=chunk_size, output_final_state=True)
    # nothing may be factored: 64-chunks are split into sub-chunks, and those (and 16-chunks) go pair by pair
    monkeypatch.setattr(chunk_module, "_max_safe_spread", lambda dtype: -1.0)
    slow = kda_chunked(q, k, v, g, beta, chunk_size=chunk_size, output_final_state=True)
    torch.testing.assert_close(fast, slow, atol=1e-12, rtol=0)


@pytest.mark.parametrize("chunk_size", [4, 16, 64])
@pytest.mark.parametrize("autograd", [True, False])
def test_factored_forms_equal_the_general_form_and_the_recurrence(monkeypatch, chunk_size, autograd):
    # mild decay (K3's bounded gate at init): every chunk factors around its end, so a fast form runs —
    # `_chunked_factored` when autograd is needed, `_chunked_cpu` when it is not ...
    q, k, v, g, beta = (t.clone().requires_grad_(autograd) for t in _inputs(2, 150, 2, 6, 5, lower_bound=-5.0))
    h0 = _state(2, 2, 6, 5)
    calls = []
    for name in ("_chunked_factored", "_chunked_cpu"):
        form = getattr(chunk_module, name)
        monkeypatch.setattr(chunk_module, name, lambda *a, form=form, name=name: calls.append(name) or form(*a))
    fast = kda_chunked(q, k, v, g, beta, initial_state=h0, chunk_size=chunk_size, output_final_state=True)
    assert calls == ["_chunked_factored" if autograd else "_chunked_cpu"], calls
    # ... and the general form (forced: no range counts as safe) and the definition agree with it
    monkeypatch.setattr(chunk_module, "_max_safe_spread", lambda dtype: -1.0)
    general = kda_chunked(q, k, v, g, beta, initial_state=h0, chunk_size=chunk_size, output_final_state=True)
    assert len(calls) == 1 or calls[1:] == ["_chunked_cpu"]   # the CPU form declines: it returns None
    reference = kda_recurrent(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    for a, b in [(fast, general), (fast, reference)]:
        torch.testing.assert_close(tuple(t.detach() for t in a), tuple(t.detach() for t in b), atol=1e-12, rtol=0)


@pytest.mark.parametrize("chunk_size", [16, 64])
@pytest.mark.parametrize("general", [False, True])
def test_no_grad_forms_equal_the_autograd_forms(monkeypatch, chunk_size, general):
    # without autograd the CPU form (or the general form's buffered loop) runs; with it, the autograd forms
    if general:
        monkeypatch.setattr(chunk_module, "_max_safe_spread", lambda dtype: -1.0)
    inputs = [t.clone().requires_grad_() for t in _inputs(2, 100, 2, 8, 8, lower_bound=-5.0)]
    h0 = _state(2, 2, 8, 8)
    with_grad = kda_chunked(*inputs, initial_state=h0, chunk_size=chunk_size, output_final_state=True)
    with torch.no_grad():
        no_grad = kda_chunked(*inputs, initial_state=h0, chunk_size=chunk_size, output_final_state=True)
    assert with_grad[0].requires_grad and not no_grad[0].requires_grad
    torch.testing.assert_close(no_grad, tuple(t.detach() for t in with_grad), atol=1e-12, rtol=0)
    assert with_grad[0].abs().max() > 0.01


@pytest.mark.parametrize("keep_decayed", [True, False])
def test_carry_state_buffers_equal_the_autograd_lists(keep_decayed):
    # `_carry_state` writes into buffers without autograd and appends to lists with it: the same numbers
    N, BH, C, K, V = 5, 3, 4, 6, 7
    gen = torch.Generator().manual_seed(1)
    W, U0 = torch.randn(N * BH, C, K, generator=gen, dtype=F64), torch.randn(N * BH, C, V, generator=gen, dtype=F64)
    k_out_t = torch.randn(N * BH, K, C, generator=gen, dtype=F64)
    decay, S = torch.rand(N * BH, K, 1, generator=gen, dtype=F64), torch.randn(BH, K, V, generator=gen, dtype=F64)
    lists = chunk_module._carry_state(N, W.requires_grad_(), U0, k_out_t, decay, S, keep_decayed)
    with torch.no_grad():
        buffers = (torch.empty(N, BH, K, V, dtype=F64), torch.empty(N, BH, C, V, dtype=F64))
        buffered = chunk_module._carry_state(N, W, U0, k_out_t, decay, S, keep_decayed, buffers=buffers)
    assert lists[0].requires_grad and buffered[0].data_ptr() == buffers[0].data_ptr()
    torch.testing.assert_close(buffered, tuple(t.detach() for t in lists), atol=0, rtol=0)
    # the definition of one step: U = U0 - W Y, S' = decay S + k_out_t U  (Y = decay S or S)
    Y = decay[:BH] * S if keep_decayed else S
    U_first = U0[:BH] - W[:BH].detach() @ Y
    torch.testing.assert_close(buffered[1][:BH], U_first, atol=1e-12, rtol=0)


def test_non_contiguous_inputs():
    # slices of one wide tensor (as the layer's split projections are), T a multiple of the chunk
    wide = torch.randn(2, 32, 3, 33, dtype=F64)
    q, k = F.normalize(wide[..., :8], dim=-1), F.normalize(wide[..., 8:16], dim=-1)
    v, g = wide[..., 16:24], -wide[..., 24:32].abs()
    beta = wide[..., 32].sigmoid().transpose(0, 1).contiguous().transpose(0, 1)  # batch-major strides
    assert not v.is_contiguous() and not beta.is_contiguous()
    torch.testing.assert_close(kda_chunked(q, k, v, g, beta, chunk_size=16)[0], kda_recurrent(q, k, v, g, beta)[0],
                               atol=1e-12, rtol=0)


def test_two_halves_with_carried_state_equal_one_pass():
    q, k, v, g, beta = _inputs(2, 45, 2, 8, 6, lower_bound=-5.0)
    h0 = _state(2, 2, 8, 6)
    for fn in (kda_recurrent, lambda *a, **kw: kda_chunked(*a, chunk_size=16, **kw)):
        o_all, s_all = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True)
        o1, s1 = fn(*(t[:, :19] for t in (q, k, v, g, beta)), initial_state=h0, output_final_state=True)
        o2, s2 = fn(*(t[:, 19:] for t in (q, k, v, g, beta)), initial_state=s1, output_final_state=True)
        torch.testing.assert_close(torch.cat([o1, o2], 1), o_all, atol=1e-12, rtol=0)
        torch.testing.assert_close(s2, s_all, atol=1e-12, rtol=0)


def test_final_state_only_when_asked():
    q, k, v, g, beta = _inputs(1, 5, 1, 4, 4)
    assert kda_recurrent(q, k, v, g, beta)[1] is None
    assert kda_chunked(q, k, v, g, beta)[1] is None


# ---------------------------------------------------------------------------- by hand
def test_hand_worked_three_tokens():
    # H = B = 1, K = V = 2, scale = 1. alpha = exp(g) is chosen as simple numbers.
    q = torch.tensor([[1.0, 1.0], [0.0, 1.0], [2.0, 0.0]], dtype=F64)
    k = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]], dtype=F64)
    v = torch.tensor([[2.0, 4.0], [1.0, 0.0], [0.0, 2.0]], dtype=F64)
    alpha = torch.tensor([[1.0, 1.0], [0.5, 1.0], [1.0, 0.25]], dtype=F64)
    beta = torch.tensor([0.5, 1.0, 0.5], dtype=F64)
    # t=1: S' = 0; recalled S'^T k = [0, 0]; S1 = 0.5 * [1,0]^T [2,4] = [[1, 2], [0, 0]]
    #      o1 = S1^T [1,1] = [1, 2]
    # t=2: S' = Diag(0.5, 1) S1 = [[0.5, 1], [0, 0]]
    #      recalled = S'^T [0.6, 0.8] = [0.3, 0.6];  v - recalled = [0.7, -0.6]
    #      S2 = S' + 1 * [0.6, 0.8]^T [0.7, -0.6] = [[0.5+0.42, 1-0.36], [0.56, -0.48]] = [[0.92, 0.64], [0.56, -0.48]]
    #      o2 = S2^T [0, 1] = [0.56, -0.48]
    # t=3: S' = Diag(1, 0.25) S2 = [[0.92, 0.64], [0.14, -0.12]]
    #      recalled = S'^T [0, 1] = [0.14, -0.12];  v - recalled = [-0.14, 2.12]
    #      S3 = S' + 0.5 * [0, 1]^T [-0.14, 2.12] = [[0.92, 0.64], [0.14-0.07, -0.12+1.06]]
    #         = [[0.92, 0.64], [0.07, 0.94]]
    #      o3 = S3^T [2, 0] = [1.84, 1.28]
    o_hand = torch.tensor([[1.0, 2.0], [0.56, -0.48], [1.84, 1.28]], dtype=F64)
    s_hand = torch.tensor([[0.92, 0.64], [0.07, 0.94]], dtype=F64)
    args = (q[None, :, None], k[None, :, None], v[None, :, None], alpha.log()[None, :, None], beta[None, :, None])
    for o, s in [kda_recurrent(*args, scale=1.0, output_final_state=True),
                 kda_chunked(*args, scale=1.0, output_final_state=True, chunk_size=2)]:
        torch.testing.assert_close(o[0, :, 0], o_hand, atol=1e-12, rtol=0)
        torch.testing.assert_close(s[0, 0], s_hand, atol=1e-12, rtol=0)


def test_recurrence_equals_the_literal_transition_matrix_form():
    # S_t = (I - beta k k^T) Diag(alpha) S_{t-1} + beta k v^T;  o_t = S_t^T (scale q_t)   (kda.md §1)
    q, k, v, g, beta = _inputs(1, 12, 2, 5, 3)
    S0 = _state(1, 2, 5, 3)
    o, s = kda_recurrent(q, k, v, g, beta, initial_state=S0, output_final_state=True)
    eye = torch.eye(5, dtype=F64)
    for h in range(2):
        S = S0[0, h]
        for t in range(12):
            kt, b = k[0, t, h], beta[0, t, h]
            S = (eye - b * torch.outer(kt, kt)) @ torch.diag(g[0, t, h].exp()) @ S + b * torch.outer(kt, v[0, t, h])
            torch.testing.assert_close(o[0, t, h], S.T @ (q[0, t, h] * 5 ** -0.5), atol=1e-12, rtol=0)
        torch.testing.assert_close(s[0, h], S, atol=1e-12, rtol=0)


# ---------------------------------------------------------------------------- gate and scale
def test_gate_matches_the_formulas_and_its_range():
    g_raw = torch.randn(2, 9, 4, 6, dtype=F64)
    A_log = torch.rand(4, dtype=F64) * math.log(4)  # moderate, so that no sigmoid rounds to exactly 0 or 1
    dt_bias = torch.randn(24, dtype=F64)
    x = g_raw + dt_bias.view(4, 6)
    a = A_log.exp()[:, None]
    g = kda_gate(g_raw, A_log, dt_bias)
    torch.testing.assert_close(g, -a * torch.log1p(torch.exp(x)))  # softplus; x stays far below threshold 20
    assert (g < 0).all()
    g_lb = kda_gate(g_raw, A_log, dt_bias, lower_bound=-5.0)
    torch.testing.assert_close(g_lb, -5.0 / (1 + torch.exp(-a * x)))
    assert (g_lb < 0).all() and (g_lb > -5.0).all()
    # float32 for lower-precision inputs; large arguments use softplus' linear branch (threshold 20)
    g32 = kda_gate(torch.full((1, 1, 1, 1), 50.0, dtype=torch.bfloat16), torch.zeros(1), torch.zeros(1))
    assert g32.dtype == torch.float32 and g32.item() == -50.0


def test_default_scale_is_inverse_sqrt_k():
    q, k, v, g, beta = _inputs(1, 10, 2, 16, 4)
    for fn in (kda_recurrent, kda_chunked):
        o_default, _ = fn(q, k, v, g, beta)
        torch.testing.assert_close(o_default, fn(q, k, v, g, beta, scale=16 ** -0.5)[0], atol=1e-14, rtol=0)
        assert (o_default - fn(q, k, v, g, beta, scale=1.0)[0]).abs().max() > 1e-3


def test_dtypes_state_float32_output_in_input_dtype():
    q, k, v, g, beta = (t.to(torch.bfloat16) for t in _inputs(1, 20, 2, 8, 8))
    for fn in (kda_recurrent, kda_chunked):
        o, s = fn(q, k, v, g, beta, output_final_state=True)
        assert o.dtype == torch.bfloat16 and s.dtype == torch.float32


# ---------------------------------------------------------------------------- gradients and errors
def test_gradcheck_through_chunked(monkeypatch):
    q, k, v, g, beta = _inputs(1, 6, 1, 3, 2)
    inputs = [t.clone().requires_grad_() for t in (q, k, v, g, beta, _state(1, 1, 3, 2))]

    def fn(q, k, v, g, beta, h0):
        o, s = kda_chunked(q, k, v, g, beta, initial_state=h0, output_final_state=True, chunk_size=4)
        return o, s

    assert torch.autograd.gradcheck(fn, inputs)
    # the other product paths, at a tiny scale: 2-token sub-chunks of the 4-token chunks ...
    monkeypatch.setattr(chunk_module, "_SUB_CHUNK", 2)
    inputs[3] = (-0.5 - 0.4 * torch.rand_like(g)).requires_grad_()  # chunk span > 1, sub-chunk span < 1
    monkeypatch.setattr(chunk_module, "_max_safe_spread", lambda dtype: 1.0)  # split, sub-chunks factored
    assert torch.autograd.gradcheck(fn, inputs)
    monkeypatch.setattr(chunk_module, "_max_safe_spread", lambda dtype: -1.0)  # split, sub-chunks pair by pair
    assert torch.autograd.gradcheck(fn, inputs)


def test_unit_lower_inverse_and_its_gradient():
    A = 0.3 * torch.randn(3, 64, 64, dtype=F64).tril(-1)
    torch.testing.assert_close(chunk_module._unit_lower_inverse(A), torch.linalg.inv(torch.eye(64, dtype=F64) + A))
    small = torch.randn(2, 6, 6, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: chunk_module._unit_lower_inverse(a.tril(-1)), small)


def test_bad_shapes_name_the_tensor_and_the_expected_shape():
    q, k, v, g, beta = _inputs(2, 8, 3, 4, 5)
    for fn in (kda_recurrent, kda_chunked):
        with pytest.raises(ValueError, match=r"k must have shape \[2, 8, 3, 4\], got \[2, 8, 3, 5\]"):
            fn(q, k[..., :1].expand(2, 8, 3, 5), v, g, beta)
        with pytest.raises(ValueError, match=r"beta must have shape \[2, 8, 3\]"):
            fn(q, k, v, g, beta[..., None])
        with pytest.raises(ValueError, match=r"g must have shape \[2, 8, 3, 4\]"):
            fn(q, k, v, g[:, :7], beta)
        with pytest.raises(ValueError, match=r"v must have shape \[B, T, H, V\] = \[2, 8, 3, V\]"):
            fn(q, k, v[:, :, :2], g, beta)
        with pytest.raises(ValueError, match=r"initial_state must have shape \[B, H, K, V\] = \[2, 3, 4, 5\]"):
            fn(q, k, v, g, beta, initial_state=torch.zeros(2, 3, 5, 4, dtype=F64))
        with pytest.raises(ValueError, match=r"q must have shape \[B, T, H, K\]"):
            fn(q[0], k, v, g, beta)
    with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
        kda_chunked(q, k, v, g, beta, chunk_size=0)
    with pytest.raises(ValueError, match=r"dt_bias must have shape \[H\*K\] = \[12\]"):
        kda_gate(g, torch.zeros(3), torch.zeros(4))


# ---------------------------------------------------------------------------- the layer
def _layer(lower_bound=-5.0, chunk_size=4, dtype=F64):
    torch.manual_seed(0)
    cfg = K3Config.preset("tiny", kda_chunk_size=chunk_size, kda_gate_lower_bound=lower_bound)
    layer = KDALayer(cfg, dtype=dtype)
    with torch.no_grad():  # larger weights than init so that every part visibly matters
        for name, p in layer.named_parameters():
            if name.endswith("proj.weight") or name.endswith("conv.weight"):
                p.normal_(0, 0.3)
    return cfg, layer


@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_layer_full_pass_equals_decode_and_any_split(lower_bound):
    cfg, layer = _layer(lower_bound)
    x = torch.randn(2, 13, cfg.hidden_size, dtype=F64)
    full, full_cache = layer(x)
    cache, decoded = None, []
    for t in range(13):
        y, cache = layer(x[:, t:t + 1], cache)
        decoded.append(y)
    torch.testing.assert_close(torch.cat(decoded, 1), full, atol=1e-10, rtol=0)
    torch.testing.assert_close(cache.state, full_cache.state, atol=1e-10, rtol=0)
    torch.testing.assert_close(cache.conv, full_cache.conv, atol=1e-12, rtol=0)
    cache, parts = None, []
    for a, b in [(0, 5), (5, 6), (6, 13)]:
        y, cache = layer(x[:, a:b], cache)
        parts.append(y)
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-10, rtol=0)
    assert full.abs().max() > 1e-2


def test_layer_state_shapes_dtypes_and_fixed_bytes():
    cfg, layer = _layer()
    H, K, W = cfg.kda_heads, cfg.kda_head_dim, cfg.kda_conv_kernel
    C = 3 * H * K
    sizes = set()
    for T in (1, 2, 20):
        _, cache = layer(torch.randn(1, T, cfg.hidden_size, dtype=F64))
        assert cache.state.shape == (1, H, K, K) and cache.state.dtype == F64
        assert cache.conv.shape == (1, W - 1, C)
        sizes.add(cache.nbytes())
    assert sizes == {(H * K * K + (W - 1) * C) * 8}
    # a bfloat16 layer still keeps its state in float32
    layer16 = KDALayer(cfg, dtype=torch.bfloat16)
    y, cache = layer16(torch.randn(1, 6, cfg.hidden_size, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16 and cache.state.dtype == torch.float32
    assert cache.conv.shape == (1, W - 1, C)


def test_layer_recorder_gets_documented_tensors():
    cfg, layer = _layer()
    H, K = cfg.kda_heads, cfg.kda_head_dim
    rec = TraceRecorder()
    x = torch.randn(2, 9, cfg.hidden_size, dtype=F64)
    _, cache = layer(x[:, :6], recorder=rec, layer=3)
    layer(x[:, 6:], cache, recorder=rec, layer=3)
    (l1, first), (l2, second) = rec.of("kda")
    assert l1 == l2 == 3
    assert first["prev_state"] is None and first["state"].shape == (2, H, K, K)
    assert first["g"].shape == (2, 6, H, K) and first["beta"].shape == (2, 6, H)
    assert second["g"].shape == (2, 3, H, K) and second["beta"].shape == (2, 3, H)
    torch.testing.assert_close(second["prev_state"], first["state"])
    assert ((first["g"] < 0) & (first["g"] > -5)).all() and ((first["beta"] > 0) & (first["beta"] < 1)).all()
    assert not (second["state"] - first["state"]).abs().max() < 1e-6


def test_layer_is_causal():
    cfg, layer = _layer()
    x = torch.randn(1, 12, cfg.hidden_size, dtype=F64)
    y, _ = layer(x)
    x2 = x.clone()
    x2[:, 7] += 1.0
    y2, _ = layer(x2)
    torch.testing.assert_close(y2[:, :7], y[:, :7], atol=1e-12, rtol=0)  # rounding only
    assert (y2[:, 7:] - y[:, 7:]).abs().amax(-1).min() > 1e-6


def test_layer_bad_input_and_cache_shapes():
    cfg, layer = _layer()
    with pytest.raises(ValueError, match=r"x must have shape \[B, T, D\] with D = hidden_size = 32, got \[1, 3, 16\]"):
        layer(torch.randn(1, 3, 16, dtype=F64))
    _, cache = layer(torch.randn(2, 3, 32, dtype=F64))
    with pytest.raises(ValueError, match=r"KDA cache must hold state \[B, H, K, V\] = \[1, 2, 8, 8\]"):
        layer(torch.randn(1, 3, 32, dtype=F64), cache)


def test_layer_init_and_meta_device():
    cfg = K3Config.preset("tiny", kda_gate_lower_bound=None)
    torch.manual_seed(1)
    a = KDALayer(cfg)
    torch.manual_seed(1)
    b = KDALayer(cfg)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name
    assert ((a.A_log.exp() >= 1) & (a.A_log.exp() <= 16)).all()
    dt = F.softplus(a.dt_bias)
    assert ((dt > 0.999e-3) & (dt < 1.001e-1)).all()
    assert torch.all(KDALayer(K3Config.preset("tiny")).A_log == 0)  # lower-bound gate: fla starts A_log at 0
    meta = KDALayer(cfg, device="meta")
    assert sum(p.numel() for p in meta.parameters()) == sum(p.numel() for p in a.parameters())


def test_k3_layer_parameter_count():
    meta = KDALayer(K3Config.preset("k3"), device="meta")
    assert sum(p.numel() for p in meta.parameters()) == 443_740_384  # 443.7M per KDA layer


@pytest.mark.parametrize("autograd", [True, False])
def test_too_strong_decay_halves_the_chunk_before_the_general_form(monkeypatch, autograd):
    # a decay that cannot be factored over 64 (or 32) tokens but can over 16: a factored form runs at 16, exact
    # (the spread limit is patched: at the real one, ~40 in float32, ~350 in float64, all of this factors at 64)
    q, k, v, _, beta = (t.clone().requires_grad_(autograd) for t in _inputs(1, 100, 2, 8, 8))
    g = -0.9 - 0.2 * torch.rand(1, 100, 2, 8, dtype=F64)          # spread over 64 tokens ~ 60, over 16 ~ 15
    monkeypatch.setattr(chunk_module, "_max_safe_spread", lambda dtype: 20.0)
    sizes, general = [], []
    carry, segment, slow = chunk_module._carry_state, chunk_module._cpu_segment, chunk_module._chunked_general
    # the autograd form's chunks pass through the state carry, whose W is [M, C, K]: it tells the chunk length;
    # the CPU form's through `_cpu_segment(..., C)`, which returns None when it declines C
    monkeypatch.setattr(chunk_module, "_carry_state", lambda N, W, *a, **kw: sizes.append(W.shape[1]) or carry(N, W, *a, **kw))
    monkeypatch.setattr(chunk_module, "_cpu_segment",
                        lambda *a: (S := segment(*a)) is not None and sizes.append(a[-1]) or S)
    monkeypatch.setattr(chunk_module, "_chunked_general", lambda chunks, *a: general.append(chunks.C) or slow(chunks, *a))
    o, s = kda_chunked(q, k, v, g, beta, output_final_state=True, chunk_size=64)
    assert set(sizes) == {16} and general == []
    o_ref, s_ref = kda_recurrent(q, k, v, g, beta, output_final_state=True)
    torch.testing.assert_close(o.detach(), o_ref.detach(), atol=1e-10, rtol=0)
    torch.testing.assert_close(s.detach(), s_ref.detach(), atol=1e-10, rtol=0)
    sizes.clear()
    # not even 16 tokens: the autograd form goes general at 64; the CPU form halves on, to 4 (range ~3.3)
    monkeypatch.setattr(chunk_module, "_max_safe_spread", lambda dtype: 5.0)
    o2 = kda_chunked(q, k, v, g, beta, chunk_size=64)[0]
    assert general == [64] if autograd else (general, set(sizes)) == ([], {4})
    torch.testing.assert_close(o2.detach(), o_ref.detach(), atol=1e-10, rtol=0)
    if not autograd:   # not even 4 tokens (range >= 2.7): the CPU form declines, the general form runs at 64
        monkeypatch.setattr(chunk_module, "_max_safe_spread", lambda dtype: 2.0)
        o3 = kda_chunked(q, k, v, g, beta, chunk_size=64)[0]
        assert general == [64]
        torch.testing.assert_close(o3.detach(), o_ref.detach(), atol=1e-10, rtol=0)


@pytest.mark.parametrize("chunks_per_segment", [1, 3, 1000])
def test_cpu_form_segments_carry_the_state_exactly(monkeypatch, chunks_per_segment):
    # `_chunked_cpu` cuts the sequence into L2-sized segments; any cut (one chunk each, 3 with a short
    # tail, all in one) gives the recurrence's outputs and final state
    B, T, H, K, V, C = 2, 150, 2, 6, 5, 16
    q, k, v, g, beta = _inputs(B, T, H, K, V, lower_bound=-5.0)
    h0 = _state(B, H, K, V)
    monkeypatch.setattr(chunk_module, "_SEGMENT_BYTES", chunks_per_segment * B * H * max(K, V) * C * 8)
    segments = []
    segment = chunk_module._cpu_segment
    monkeypatch.setattr(chunk_module, "_cpu_segment", lambda q, *a: segments.append(q.shape[1] // C) or segment(q, *a))
    o, s = kda_chunked(q, k, v, g, beta, initial_state=h0, chunk_size=C, output_final_state=True)
    n_chunks = -(-T // C)
    assert sum(segments) == n_chunks and max(segments) == min(chunks_per_segment, n_chunks)
    o_ref, s_ref = kda_recurrent(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    torch.testing.assert_close(o, o_ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(s, s_ref, atol=1e-10, rtol=0)
    h0_before = h0.clone()
    again = kda_chunked(q, k, v, g, beta, initial_state=h0, chunk_size=C, output_final_state=True)
    assert torch.equal(h0, h0_before), "the initial state must not be written"
    assert all(torch.equal(a, b) for a, b in zip(again, (o, s))), "a second call (reused scratch) must give the same bits"


def test_cpu_form_picks_the_chunk_per_segment(monkeypatch):
    # a mild first half and a strongly decaying second half: the segments there factor at 32 tokens, the ones
    # here only at 16 (spread limit 20: ~1 per token over 32 tokens is ~31), and the result is still exact
    B, T, H, K, V = 1, 256, 2, 8, 8
    q, k, v, g, beta = _inputs(B, T, H, K, V)
    g = torch.cat([-0.1 * torch.rand(B, T // 2, H, K, dtype=F64), -0.9 - 0.2 * torch.rand(B, T // 2, H, K, dtype=F64)], 1)
    monkeypatch.setattr(chunk_module, "_max_safe_spread", lambda dtype: 20.0)
    monkeypatch.setattr(chunk_module, "_SEGMENT_BYTES", 2 * B * H * K * 32 * 8)     # two 32-token chunks a segment
    taken, segment = [], chunk_module._cpu_segment
    monkeypatch.setattr(chunk_module, "_cpu_segment",
                        lambda q, *a: (S := segment(q, *a)) is not None and taken.append((q.shape[1], a[-1])) or S)
    o, s = kda_chunked(q, k, v, g, beta, output_final_state=True, chunk_size=64)
    assert taken == [(64, 32)] * 2 + [(64, 16)] * 2, taken
    o_ref, s_ref = kda_recurrent(q, k, v, g, beta, output_final_state=True)
    torch.testing.assert_close(o, o_ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(s, s_ref, atol=1e-10, rtol=0)


def test_cpu_form_scratch_serves_inference_mode_and_no_grad_alike():
    # the scratch outlives a call: made under inference_mode it must still be writable under no_grad (and back)
    q, k, v, g, beta = (t.float() for t in _inputs(1, 100, 2, 8, 8, lower_bound=-5.0))
    fused._SCRATCH.__dict__.clear()            # a fresh pool: the first call below makes the buffers
    with torch.inference_mode():
        first = kda_chunked(q, k, v, g, beta)[0]
    with torch.no_grad():
        second = kda_chunked(q, k, v, g, beta)[0]
    with torch.inference_mode():
        third = kda_chunked(q, k, v, g, beta)[0]
    assert torch.equal(first, second) and torch.equal(second, third)
    torch.testing.assert_close(first.double(), kda_recurrent(q, k, v, g, beta)[0].double(), atol=1e-5, rtol=0)
