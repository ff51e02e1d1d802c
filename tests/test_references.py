"""Every op with a fast form against its reference, forward and backward, in one table (float64).

Each row names an op as the model calls it (its fast forms are taken where they apply: most only without
autograd) and the reference it must equal: the definition written out (`rms_norm_reference`, `kda_recurrent`,
`depth_attention`, `apply_rope`, a causal prefill, `dense_reference`, `kda_gate`). One test runs every row:
  forward  under torch.no_grad, where the inference fast paths run, equal to the reference;
  backward with autograd (the op's differentiable path), its gradients with respect to every input and
           parameter equal to the reference's, for one fixed random cotangent.
Tolerance: TOL below, relative and absolute, in float64 (the forms sum in other orders: never bit for bit).
"""

from __future__ import annotations

import pytest
import torch

from tiny_k3.attnres import DepthAttention, depth_attention
from tiny_k3.config import K3Config
from tiny_k3.kda import KDALayer, kda_gate, kda_recurrent, kda_step
from tiny_k3.kda_chunk import kda_chunked
from tiny_k3.mla import GatedMLA, apply_rope, rope_angles, rope_factors, rotate_pairs
from tiny_k3.moe import LatentMoE
from tiny_k3.norm import rms_norm, rms_norm_reference
from tiny_k3.shortconv import causal_conv, causal_conv_reference

F64 = torch.float64
TOL = 1e-10
pytestmark = pytest.mark.usefixtures("torch_threads")   # each row at 1 and 2 threads (tests/conftest.py)


def _randn(gen, *shape, scale=1.0):
    return torch.randn(*shape, generator=gen, dtype=F64) * scale


def _kda_inputs(gen, T: int):
    B, H, K, V = 2, 2, 8, 8
    q = torch.nn.functional.normalize(_randn(gen, B, T, H, K), dim=-1)
    k = torch.nn.functional.normalize(_randn(gen, B, T, H, K), dim=-1)
    g = -torch.nn.functional.softplus(_randn(gen, B, T, H, K)) * 0.3           # log decay < 0
    beta = torch.sigmoid(_randn(gen, B, T, H))
    return [q, k, _randn(gen, B, T, H, V), g, beta, _randn(gen, B, H, K, V, scale=0.5)]


def _rms_norm(gen, rows: int):
    D = 16
    return (lambda x, w: rms_norm(x, w, 1e-6), lambda x, w: rms_norm_reference(x, w, 1e-6),
            [_randn(gen, 1, rows, D, scale=3), 1 + 0.3 * _randn(gen, D)], [])


def _depth(gen, tokens: int):
    depth = DepthAttention(16, dtype=F64)
    with torch.no_grad():
        depth.query.copy_(_randn(gen, 16))
        depth.key_norm.copy_(1 + 0.3 * _randn(gen, 16))
    sources = _randn(gen, 5, 1, tokens, 16) * torch.rand(5, 1, 1, 1, generator=gen, dtype=F64)
    return (lambda s: depth(list(s)), lambda s: depth_attention(s, depth.query, depth.key_norm, depth.eps),
            [sources], [depth.query, depth.key_norm])


def _kda_chunked(gen):
    def chunked(q, k, v, g, beta, s0):
        return kda_chunked(q, k, v, g, beta, initial_state=s0, output_final_state=True, chunk_size=16)

    def recurrent(q, k, v, g, beta, s0):
        return kda_recurrent(q, k, v, g, beta, initial_state=s0, output_final_state=True)
    return chunked, recurrent, _kda_inputs(gen, 37), []                      # 37: not a multiple of a chunk


def _kda_step(gen):
    def step(q, k, v, g, beta, s0):
        return kda_step(q, k, v, g, beta, initial_state=s0, output_final_state=True)

    def recurrent(q, k, v, g, beta, s0):
        return kda_recurrent(q, k, v, g, beta, initial_state=s0, output_final_state=True)
    return step, recurrent, _kda_inputs(gen, 1), []


def _kda_decay_gate(gen):
    layer = KDALayer(K3Config.preset("tiny"), dtype=F64)
    with torch.no_grad():
        layer.A_log.uniform_(-1, 2, generator=gen)                          # a = exp(A_log) far from 1
    H, K = layer.num_heads, layer.head_k_dim

    def reference(z):
        return kda_gate(layer.f_b_proj(z).view(3, 1, H, K), layer.A_log, layer.dt_bias, layer.lower_bound)
    return (lambda z: layer.decay_gate(z).view(3, 1, H, K), reference, [_randn(gen, 3, 1, layer.config.kda_gate_rank)],
            list(layer.parameters()))


def _rope(gen):
    positions = torch.tensor([[0, 1, 7, 300, 4095], [2, 3, 4, 5, 6]])
    cos, sin = rope_angles(positions, 8, 10000.0, F64)
    C, S = rope_factors(cos, sin)
    return (lambda x: rotate_pairs(x, C[:, :, None], S[:, :, None]), lambda x: apply_rope(x, cos[:, :, None], sin[:, :, None]),
            [_randn(gen, 2, 5, 3, 8)], [])


def _mla_decode(gen, preset: str, twin: bool = False):
    # `attend_absorbed` serves only inference (its absorbed weights are a cache, outside autograd): the op is the
    # layer's decode step after a cached prefill, the reference the same tokens in one causal prefill
    # (twin: the twin's MLA with KDA's short conv in front, whose decode continues the prefill's conv tail)
    cfg = K3Config.preset(preset)
    mla = GatedMLA(cfg.twin() if twin else cfg, dtype=F64, short_conv=twin)
    with torch.no_grad():
        for p in mla.parameters():
            if p.dim() >= 2:
                p.copy_(_randn(gen, *p.shape, scale=2 * p.shape[-1] ** -0.5))

    def decode(x):
        _, cache = mla(x[:, :-1])
        return mla(x[:, -1:], cache)[0]
    return decode, lambda x: mla(x)[0][:, -1:], [_randn(gen, 2, 9, cfg.hidden_size)], list(mla.parameters())


def _short_conv(gen, tokens: int):
    # the short conv as KDA and the twin's MLA call it: a prefill through conv1d (tokens > 1) or decode's weighted
    # sum of the tail (tokens = 1), both continuing a tail, against the definition written token by token
    weight, tail = _randn(gen, 12, 1, 4), _randn(gen, 2, 3, 12)

    def fast(x, w, t):
        return causal_conv(x, w, t)

    def reference(x, w, t):
        full = torch.cat([t, x], 1)
        return causal_conv_reference(x, w, t), full[:, -3:]
    return fast, reference, [_randn(gen, 2, tokens, 12), weight, tail], []


def _moe(gen, tokens: int):
    torch.manual_seed(0)
    moe = LatentMoE(K3Config.preset("small"), dtype=F64)
    with torch.no_grad():
        for p in moe.parameters():
            if p.dim() >= 2:
                p.copy_(_randn(gen, *p.shape, scale=p.shape[-1] ** -0.5))
        moe.router.weight.mul_(3.0)
        moe.router.bias.copy_(0.1 * _randn(gen, moe.config.num_experts))
    return moe, moe.dense_reference, [_randn(gen, 1, tokens, moe.config.hidden_size)], list(moe.parameters())


CASES = {
    "rms_norm one row": lambda gen: _rms_norm(gen, 1), "rms_norm rows": lambda gen: _rms_norm(gen, 7),
    "depth read one token": lambda gen: _depth(gen, 1), "depth read tokens": lambda gen: _depth(gen, 6),
    "kda_chunked": _kda_chunked, "kda_step": _kda_step, "kda decay gate": _kda_decay_gate,
    "rotate_pairs": _rope, "mla decode, K3": lambda gen: _mla_decode(gen, "tiny"),
    "mla decode, K2 rope": lambda gen: _mla_decode(gen, "k2-tiny"),
    "mla decode, twin with short conv": lambda gen: _mla_decode(gen, "tiny", twin=True),
    "short conv prefill": lambda gen: _short_conv(gen, 7), "short conv decode": lambda gen: _short_conv(gen, 1),
    "moe one token": lambda gen: _moe(gen, 1), "moe tokens": lambda gen: _moe(gen, 24),
}


def _flat(out) -> list[torch.Tensor]:
    return [t for t in (out if isinstance(out, tuple) else (out,)) if t is not None]


@pytest.mark.parametrize("name", list(CASES))
def test_the_op_equals_its_reference_forward_and_backward(name):
    gen = torch.Generator().manual_seed(0)
    op, reference, inputs, parameters = CASES[name](gen)
    with torch.no_grad():                                                   # the inference fast paths
        fast, want = _flat(op(*inputs)), _flat(reference(*inputs))
    assert len(fast) == len(want)
    for got, expected in zip(fast, want):
        assert got.shape == expected.shape and expected.abs().max() > 1e-3   # a meaningful scale for TOL
        torch.testing.assert_close(got, expected, rtol=TOL, atol=TOL)
    cotangents = [_randn(gen, *t.shape) for t in want]
    grads = []
    for fn in (op, reference):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        outs = _flat(fn(*leaves))
        loss = sum((o * c).sum() for o, c in zip(outs, cotangents))
        targets = leaves + [p for p in parameters if p.requires_grad]
        grads.append(torch.autograd.grad(loss, targets, allow_unused=True))
    for i, (got, expected) in enumerate(zip(*grads)):
        if expected is None:                                                # a parameter the reference never reads
            assert got is None or not got.any(), f"{name}: gradient {i}"
            continue
        torch.testing.assert_close(got, expected, rtol=TOL, atol=TOL, msg=f"{name}: gradient {i}")
    assert any(g is not None and g.abs().max() > 1e-6 for g in grads[1][:len(inputs)])   # gradients flow
