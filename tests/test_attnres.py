import pytest
import torch

from tiny_k3.attnres import DepthAttention, DepthStream, depth_attention
from tiny_k3.norm import rms_norm


def test_weights_sum_to_one_and_follow_the_equation():
    torch.manual_seed(1)
    sources = torch.randn(5, 2, 3, 8, dtype=torch.float64)
    query = torch.randn(8, dtype=torch.float64)
    gain = torch.rand(8, dtype=torch.float64) + 0.5
    h, w = depth_attention(sources, query, gain, eps=1e-6)
    assert w.shape == (2, 3, 5) and h.shape == (2, 3, 8)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, dtype=torch.float64))
    # by hand for one position: logits = w . RMSNorm(v_i), no 1/sqrt(D); values are raw
    b, t = 1, 2
    logits = torch.stack([query @ rms_norm(sources[i, b, t], gain, 1e-6) for i in range(5)])
    expected_w = torch.softmax(logits, 0)
    torch.testing.assert_close(w[b, t], expected_w)
    torch.testing.assert_close(h[b, t], (expected_w[:, None] * sources[:, b, t]).sum(0))


def test_float64_inputs_are_computed_in_float64():
    """Like kda_* and the router, float64 sources promote the logits and softmax to float64."""
    torch.manual_seed(2)
    sources = torch.randn(6, 1, 4, 16, dtype=torch.float64)
    query = 3.0 * torch.randn(16, dtype=torch.float64)      # large logits: fp32 rounding would show
    h, w = depth_attention(sources, query, eps=1e-6)
    assert h.dtype == w.dtype == torch.float64
    logits = torch.einsum("nbtd,d->btn", rms_norm(sources, None, 1e-6), query)
    expected_w = torch.softmax(logits, -1)
    torch.testing.assert_close(w, expected_w, rtol=0, atol=1e-13)
    torch.testing.assert_close(h, torch.einsum("btn,nbtd->btd", expected_w, sources), rtol=0, atol=1e-12)
    # float32 sources still get float32 logits: the same numbers as the float64 run to fp32 precision only
    _, w32 = depth_attention(sources.float(), query.float(), eps=1e-6)
    assert w32.dtype == torch.float32 and 1e-9 < (w32.double() - expected_w).abs().max() < 1e-5


def test_zero_query_gives_the_mean_and_keys_are_scale_invariant():
    sources = torch.randn(4, 1, 2, 6, dtype=torch.float64)
    h, w = depth_attention(sources, torch.zeros(6, dtype=torch.float64))
    torch.testing.assert_close(w, torch.full((1, 2, 4), 0.25, dtype=torch.float64))
    torch.testing.assert_close(h, sources.mean(0))
    q = torch.randn(6, dtype=torch.float64)
    scaled = sources.clone()
    scaled[2] *= 100.0  # a louder source gets the same weight (keys are normalised) ...
    _, w1 = depth_attention(sources, q, eps=0.0)
    h2, w2 = depth_attention(scaled, q, eps=0.0)
    torch.testing.assert_close(w1, w2)
    assert not torch.allclose(h2, depth_attention(sources, q, eps=0.0)[0])  # ... but its raw value counts


def test_single_source_is_the_identity():
    src = torch.randn(1, 2, 3, 4)
    h, w = depth_attention(src, torch.randn(4))
    torch.testing.assert_close(h, src[0])
    assert torch.all(w == 1)


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match="sources must be \\[N, B, T, D\\]"):
        depth_attention(torch.randn(3, 4), torch.randn(4))
    with pytest.raises(ValueError, match="query must be \\[D\\] = \\[4\\]"):
        depth_attention(torch.randn(2, 1, 1, 4), torch.randn(5))


def _run_stream(mode, block_size, outputs):
    emb = outputs[0]
    stream = DepthStream(emb, mode, block_size)
    seen = []
    for v in outputs[1:]:
        seen.append([s.clone() for s in stream.sources()])
        stream.add(v)
    seen.append(stream.sources())
    return seen


def test_block_sources_follow_eqs_5_and_6():
    vs = [torch.full((1, 1, 2), float(i)) for i in range(7)]  # v_0 = embedding, v_1..v_6
    seen = _run_stream("block", 2, vs)
    vals = [[float(s[0, 0, 0]) for s in row] for row in seen]
    assert vals == [[0], [0, 1], [0, 3], [0, 3, 3], [0, 3, 7], [0, 3, 7, 5], [0, 3, 7, 11]]


def test_full_is_block_of_size_one():
    vs = [torch.randn(1, 2, 3) for _ in range(5)]
    full = _run_stream("full", 4, vs)
    block1 = _run_stream("block", 1, vs)
    for a, b in zip(full, block1):
        assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
    assert len(full[-1]) == 5


def test_standard_stream_is_the_running_sum():
    vs = [torch.randn(1, 2, 3) for _ in range(4)]
    stream = DepthStream(vs[0], "standard", 2)
    for v in vs[1:]:
        stream.add(v)
    h, w = stream.read(None)
    torch.testing.assert_close(h, sum(vs))
    assert w is None


def test_depth_module_starts_at_zero():
    m = DepthAttention(8)
    assert torch.all(m.query == 0) and torch.all(m.key_norm == 1)
