"""The inference fast paths (tiny_k3/fused.py, kda_step, the KDA decode conv) against their references."""

import copy
import threading

import pytest
import torch
from torch import nn

from tiny_k3 import K3Config, TinyK3
from tiny_k3.fused import CachedCat, CachedWeights, FusedLinears, scratch_buffer
from tiny_k3.kda import KDALayer, kda_recurrent, kda_step

F64 = torch.float64


def _linears(*sizes, d=6):
    torch.manual_seed(0)
    return [nn.Linear(d, n, bias=False, dtype=F64) for n in sizes]


class _Owner(nn.Module):
    def __init__(self, *layers):
        super().__init__()
        for name, layer in zip("abc", layers):
            setattr(self, name, layer)


def test_fused_linears_equal_the_separate_layers_and_follow_every_change():
    a, b, c = _linears(3, 4, 2)
    owner = _Owner(a, b, c)
    fused = FusedLinears(owner, ("a", "b"), ("c",))
    x = torch.randn(2, 5, 6, dtype=F64)
    with torch.no_grad():
        ab, cx = fused(x)
        torch.testing.assert_close(ab, torch.cat([a(x), b(x)], -1), atol=1e-14, rtol=0)
        torch.testing.assert_close(cx, c(x), atol=1e-14, rtol=0)
        a.weight.mul_(2)                                    # an in-place change (optimiser step, load_state_dict)
        torch.testing.assert_close(fused(x)[0][..., :3], a(x), atol=1e-14, rtol=0)
        c.load_state_dict({"weight": torch.ones(2, 6, dtype=F64)})
        torch.testing.assert_close(fused(x)[1], x.sum(-1, keepdim=True).expand(2, 5, 2), atol=1e-13, rtol=0)
        b.weight = nn.Parameter(torch.zeros(4, 6, dtype=F64))   # a replaced tensor (.to(), assign=True)
        assert fused(x)[0][..., 3:].abs().max() == 0
        owner.c = nn.Identity()                             # a swapped layer: the layers run one by one
        torch.testing.assert_close(fused(x)[1], x, atol=0, rtol=0)
        owner.c = c
    # with autograd the separate layers run, so every weight gets its gradient
    fused(x)[0].sum().backward()
    assert a.weight.grad is not None and b.weight.grad is not None and c.weight.grad is None


def test_fused_linears_leave_a_layer_with_bias_to_itself():
    owner = _Owner(nn.Linear(3, 2), nn.Linear(3, 4, bias=False))
    with torch.no_grad():
        ya, yb = FusedLinears(owner, ("a",), ("b",))(torch.ones(1, 3))
        torch.testing.assert_close(ya, owner.a(torch.ones(1, 3)), atol=0, rtol=0)
        # a bias given to a layer after the fusion first ran (the same module object): it is seen
        fused = FusedLinears(owner, ("b",))
        before = fused(torch.ones(1, 3))[0]
        owner.b.bias = nn.Parameter(torch.ones(4))
        torch.testing.assert_close(fused(torch.ones(1, 3))[0], before + 1, atol=1e-6, rtol=0)


def test_cached_cat_rebuilds_only_when_a_part_changed():
    a, b = _linears(3, 4)
    cat = CachedCat(_Owner(a, b), ("a", "b"))
    first = cat()
    assert cat() is first                                      # unchanged parts: the same tensor, no copy
    with torch.no_grad():
        b.weight.add_(1)
    assert cat() is not first
    torch.testing.assert_close(cat(), torch.cat([a.weight, b.weight]), atol=0, rtol=0)


def test_kda_step_equals_the_recurrence():
    gen = torch.Generator().manual_seed(1)
    B, H, K, V = 2, 3, 5, 7
    q, k = (torch.nn.functional.normalize(torch.randn(B, 1, H, K, generator=gen, dtype=F64), dim=-1) for _ in "qk")
    v = torch.randn(B, 1, H, V, generator=gen, dtype=F64)
    g = -torch.rand(B, 1, H, K, generator=gen, dtype=F64)
    beta = torch.rand(B, 1, H, generator=gen, dtype=F64)
    for h0 in (None, torch.randn(B, H, K, V, generator=gen, dtype=F64)):
        o, s = kda_step(q, k, v, g, beta, initial_state=h0, output_final_state=True)
        o_ref, s_ref = kda_recurrent(q, k, v, g, beta, initial_state=h0, output_final_state=True)
        torch.testing.assert_close(o, o_ref, atol=1e-14, rtol=0)
        torch.testing.assert_close(s, s_ref, atol=1e-14, rtol=0)
        assert o.abs().max() > 0.01
    assert kda_step(q, k, v, g, beta)[1] is None
    with pytest.raises(ValueError, match="exactly one token"):
        kda_step(*(t.expand(B, 2, *t.shape[2:]) for t in (q, k, v, g, beta)))


def test_kda_layer_decode_fast_paths_equal_the_references():
    """Under no_grad the layer fuses its projections and conv weights and takes the T = 1 conv shortcut;
    with autograd it runs the separate modules and conv1d. Token by token, both give the same outputs."""
    torch.manual_seed(0)
    layer = KDALayer(K3Config.preset("tiny"), dtype=F64)
    x = torch.randn(1, 6, layer.config.hidden_size, dtype=F64)
    ys, cache = [], None
    for t in range(6):                                         # the reference: autograd on, nothing fused
        y, cache = layer(x[:, t:t + 1], cache)
        ys.append(y)
    with torch.no_grad():
        fast, cache_fast = [], None
        for t in range(6):
            y, cache_fast = layer(x[:, t:t + 1], cache_fast)
            fast.append(y)
    torch.testing.assert_close(torch.cat(fast, 1), torch.cat(ys, 1).detach(), atol=1e-13, rtol=0)
    torch.testing.assert_close(cache_fast.state, cache.state.detach(), atol=1e-13, rtol=0)


def test_fusion_leaves_state_dict_keys_and_loading_alone():
    cfg = K3Config.preset("tiny")
    torch.manual_seed(0)
    model = TinyK3(cfg).eval()
    keys = list(model.state_dict())
    assert not any("_in_proj" in k or "_conv_weight" in k or "fused" in k for k in keys)
    tokens = torch.tensor([[256, 65, 66]])
    with torch.no_grad():
        before, _ = model(tokens[:, :1])                       # builds the caches
        torch.manual_seed(1)
        other = TinyK3(cfg).eval()
        model.load_state_dict(other.state_dict())              # the caches must follow the new weights
        after, _ = model(tokens[:, :1])
        expected, _ = other(tokens[:, :1])
    assert list(model.state_dict()) == keys
    torch.testing.assert_close(after, expected, atol=0, rtol=0)
    assert (after - before).abs().max() > 1e-3


def test_latent_moe_without_autograd_equals_the_autograd_path_and_the_dense_reference():
    from tiny_k3.moe import LatentMoE

    torch.manual_seed(0)
    moe = LatentMoE(K3Config.preset("tiny"), dtype=F64)
    x = torch.randn(2, 3, moe.config.hidden_size, dtype=F64)
    reference = moe(x)                                         # autograd on
    assert reference.requires_grad
    with torch.no_grad():
        fused = moe(x)
    torch.testing.assert_close(fused, reference.detach(), atol=1e-14, rtol=0)
    torch.testing.assert_close(fused, moe.dense_reference(x).detach(), atol=1e-12, rtol=0)


def test_gated_mla_fused_projection_equals_the_separate_modules():
    from tiny_k3.mla import GatedMLA

    for q_lora_rank in (None, 16):
        torch.manual_seed(0)
        mla = GatedMLA(K3Config.preset("tiny", q_lora_rank=q_lora_rank), dtype=F64)
        x = torch.randn(2, 5, mla.o_proj.out_features, dtype=F64)
        y_ref, cache_ref = mla(x[:, :3])                        # autograd on: the separate projections
        y2_ref, _ = mla(x[:, 3:], cache_ref)
        with torch.no_grad():
            y, cache = mla(x[:, :3])
            y2, _ = mla(x[:, 3:], cache)
            y_one = torch.cat([mla(x[:, t:t + 1], c)[0] for t, c in [(3, cache)]], 1)  # a decode step (T = 1)
        torch.testing.assert_close(y, y_ref.detach(), atol=1e-14, rtol=0)
        torch.testing.assert_close(y2, y2_ref.detach(), atol=1e-14, rtol=0)
        torch.testing.assert_close(y_one, y2_ref.detach()[:, :1], atol=1e-14, rtol=0)


def test_cached_cat_of_inference_tensors_is_rebuilt_every_call():
    # inference tensors have no version counter: an in-place change inside inference mode must still be seen
    from tiny_k3.moe import LatentMoE

    with torch.inference_mode():
        moe = LatentMoE(K3Config.preset("tiny"))
        x = torch.randn(1, 1, moe.config.hidden_size)
        before = moe(x)
        moe.down.weight.mul_(2.0)
        after = moe(x)
        moe.fast.force(forward="general", pairs="sorted")      # the general path: no cache
        torch.testing.assert_close(after, moe(x), atol=1e-6, rtol=0)
    assert (after - before).abs().max() > 1e-4


def test_a_value_first_built_without_autograd_serves_autograd_later():
    # the first call runs in inference mode (TinyK3.forward under no_grad); later a frozen model gives gradients
    # to its input through the kept fused weight: it must be a normal tensor
    from tiny_k3 import TinyK3
    torch.manual_seed(0)
    model = TinyK3(K3Config.preset("tiny"))
    tokens = torch.randint(0, 256, (1, 4))
    with torch.no_grad():
        model(tokens)
    kept = [t for m in model.modules() for c in vars(m).values() if isinstance(c, CachedWeights)
            for t in (c._value if isinstance(c._value, tuple) else (c._value,)) if t is not None]
    assert kept and all(t.is_leaf and not t.requires_grad and not t.is_inference() for t in kept)
    copy.deepcopy(model)                                       # (deepcopy takes leaves only)
    model.requires_grad_(False)
    x = model.embed(tokens).requires_grad_(True)
    block = model.blocks[0]
    y, _ = block.attn(block.attn_norm(x))
    y.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_scratch_buffer_is_kept_per_slot_dtype_and_thread():
    like = torch.zeros(1)
    with torch.inference_mode():                       # made in inference mode ...
        first = scratch_buffer("test slot", (2, 3), like)
    first.fill_(1.0)                                   # ... and still writable outside it
    again = scratch_buffer("test slot", (3, 2), like)
    assert again.data_ptr() == first.data_ptr() and again.shape == (3, 2)        # the same memory, reshaped
    bigger = scratch_buffer("test slot", (4, 4), like)
    assert bigger.numel() == 16 and scratch_buffer("test slot", (2,), like).data_ptr() == bigger.data_ptr()
    assert scratch_buffer("test slot", (2, 3), like.double()).dtype == torch.float64   # a dtype of its own
    assert scratch_buffer("other slot", (2, 3), like).data_ptr() != bigger.data_ptr()
    seen = []
    thread = threading.Thread(target=lambda: seen.append(scratch_buffer("test slot", (4, 4), like).data_ptr()))
    thread.start()
    thread.join()
    assert seen and seen[0] != bigger.data_ptr()      # another thread never shares a buffer
