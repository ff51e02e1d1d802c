"""Inference fast paths outside the files that have their own tests: each against its reference."""

import pytest
import torch

from tiny_k3.attnres import DepthAttention, _depth_read, depth_attention

F64 = torch.float64
pytestmark = pytest.mark.usefixtures("torch_threads")   # each test at 1 and 2 threads (tests/conftest.py)


@pytest.mark.parametrize("shape", [(5, 1, 1, 16), (3, 2, 7, 16)])
def test_depth_read_equals_depth_attention(shape):
    gen = torch.Generator().manual_seed(0)
    sources = torch.randn(*shape, generator=gen, dtype=F64) * torch.rand(shape[0], 1, 1, 1, generator=gen, dtype=F64)
    query = torch.randn(shape[-1], generator=gen, dtype=F64)
    gain = 1 + 0.3 * torch.randn(shape[-1], generator=gen, dtype=F64)
    h, w = _depth_read(sources, query * gain, 1e-6)
    h_ref, w_ref = depth_attention(sources, query, gain, 1e-6)
    assert w_ref.std() > 0.05                                         # weights far from uniform: a real test
    torch.testing.assert_close(h, h_ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(w, w_ref, atol=1e-12, rtol=0)
    assert h.shape == h_ref.shape and w.shape == w_ref.shape


def test_depth_attention_module_takes_the_fast_read_only_without_autograd():
    torch.manual_seed(0)
    depth = DepthAttention(8, dtype=F64)
    with torch.no_grad():
        depth.query.normal_()
    sources = [torch.randn(1, 1, 8, dtype=F64) for _ in range(4)]
    graded = depth(sources)
    assert graded[0].requires_grad                                     # the reference, differentiable
    with torch.no_grad():
        fast = depth(sources)
    torch.testing.assert_close(fast, tuple(t.detach() for t in graded), atol=1e-12, rtol=0)


def test_the_thread_fixture_sets_torch_s_threads_and_restores_one(torch_threads):
    assert torch.get_num_threads() == torch_threads in (1, 2)
