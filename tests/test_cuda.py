"""CUDA checks: skipped on machines without a GPU (the CPU path is what every other test covers)."""

import pytest
import torch

from tiny_k3 import K3Config, TinyK3
from tiny_k3.kda import kda_chunked, kda_recurrent

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")


@cuda
def test_model_on_cuda_matches_cpu_and_decodes_like_a_full_pass():
    torch.manual_seed(0)
    model = TinyK3(K3Config.preset("tiny")).double()
    tokens = torch.randint(0, 256, (2, 21))
    cpu_logits, _ = model(tokens)
    gpu = model.to("cuda")
    full, _ = gpu(tokens.cuda())
    torch.testing.assert_close(full.cpu(), cpu_logits, atol=1e-9, rtol=1e-9)
    logits, cache = gpu(tokens[:, :7].cuda())
    steps = [logits]
    for t in range(7, 21):
        logits, cache = gpu(tokens[:, t:t + 1].cuda(), cache)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-9, rtol=1e-9)


@cuda
def test_kda_chunked_equals_recurrent_on_cuda():
    g = torch.Generator(device="cuda").manual_seed(0)
    B, T, H, K, V = 2, 300, 4, 64, 64
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, K, device="cuda", generator=g), dim=-1) for _ in range(2))
    v = torch.randn(B, T, H, V, device="cuda", generator=g)
    gate = -torch.rand(B, T, H, K, device="cuda", generator=g)
    beta = torch.rand(B, T, H, device="cuda", generator=g)
    o1, s1 = kda_recurrent(q, k, v, gate, beta, output_final_state=True)
    o2, s2 = kda_chunked(q, k, v, gate, beta, output_final_state=True)
    torch.testing.assert_close(o2, o1, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(s2, s1, atol=2e-4, rtol=2e-4)


@cuda
def test_simulation_runs_on_cuda_with_the_same_tokens_as_cpu():
    from sim import Simulation

    cpu = Simulation("tiny", "key=7; 3+4=", seed=0, weights="random")
    gpu = Simulation("tiny", "key=7; 3+4=", seed=0, weights="random", device="cuda")
    cpu.run(8)
    gpu.run(8)
    assert [f.token_id for f in cpu.frames] == [f.token_id for f in gpu.frames]
    assert [f.memory.kv_bytes for f in cpu.frames] == [f.memory.kv_bytes for f in gpu.frames]
