import pytest
import torch

from tiny_k3 import K3Config, ModelCache, TinyK3, TraceRecorder, generate, parameter_breakdown, parameter_counts
from tiny_k3.model import resolve_device, sample_next


def _model(preset="tiny", dtype=torch.float64, seed=0, **changes):
    torch.manual_seed(seed)
    cfg = K3Config.preset(preset, **changes)
    return TinyK3(cfg).to(dtype).eval()


def _tokens(cfg, T, B=1, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (B, T), generator=g)


@pytest.mark.parametrize("preset, dtype, tol", [("tiny", torch.float64, 1e-9), ("small", torch.float32, 2e-4),
                                                ("mini-56/1", torch.float32, 2e-4)])
def test_token_by_token_decode_equals_full_forward(preset, dtype, tol):
    model = _model(preset, dtype)
    tokens = _tokens(model.config, 11, B=2)
    with torch.no_grad():
        full, _ = model(tokens)
        cache, steps = None, []
        for t in range(tokens.shape[1]):
            logits, cache = model(tokens[:, t:t + 1], cache)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=tol, rtol=tol)
    assert cache.position == 11


def test_k3_topo_decode_equals_full_forward():
    model = _model("k3-topo", torch.float32)
    tokens = _tokens(model.config, 5)
    with torch.no_grad():
        full, _ = model(tokens)
        logits, cache = model(tokens[:, :3])
        a, cache = model(tokens[:, 3:4], cache)
        b, cache = model(tokens[:, 4:5], cache)
    torch.testing.assert_close(torch.cat([logits, a, b], 1), full, atol=2e-4, rtol=2e-4)


def test_splits_and_chunk_sizes_do_not_change_results():
    model = _model("tiny")
    tokens = _tokens(model.config, 40)
    with torch.no_grad():
        full, _ = model(tokens)
        a, cache = model(tokens[:, :17])
        b, cache = model(tokens[:, 17:18], cache)
        c, cache = model(tokens[:, 18:], cache)
        torch.testing.assert_close(torch.cat([a, b, c], 1), full)
        other = _model("tiny", kda_chunk_size=8)
        other.load_state_dict(model.state_dict())
        torch.testing.assert_close(other(tokens)[0], full)


@pytest.mark.parametrize("residual", ["block", "full"])
def test_zero_initialised_attnres_equals_the_standard_residual(residual):
    # Under PreNorm the mean of the sources normalises like their sum (attnres.md §3); a tiny eps makes it exact.
    attnres = _model("tiny", residual=residual, rms_norm_eps=1e-12)
    standard = _model("tiny", residual="standard", rms_norm_eps=1e-12)
    missing, unexpected = standard.load_state_dict(attnres.state_dict(), strict=False)
    assert not missing and all("_res." in k for k in unexpected)
    tokens = _tokens(attnres.config, 9)
    with torch.no_grad():
        torch.testing.assert_close(attnres(tokens)[0], standard(tokens)[0], atol=1e-7, rtol=1e-7)
        # once a pseudo-query moves away from zero the two networks differ
        attnres.blocks[1].mlp_res.query.normal_()
        assert (attnres(tokens)[0] - standard(tokens)[0]).abs().max() > 1e-4


def test_recorder_sees_every_sublayer_in_execution_order():
    model = _model("tiny")
    cfg = model.config
    rec = TraceRecorder()
    with torch.no_grad():
        model(_tokens(cfg, 6), recorder=rec)
    kinds = [(e, layer, d.get("site")) for e, layer, d in rec.events if e in ("depth", "sublayer")]
    expected = []
    for i in range(cfg.num_layers):
        expected += [("depth", i, "attn"), ("sublayer", i, "attn"), ("depth", i, "mlp"), ("sublayer", i, "mlp")]
    assert kinds == expected + [("depth", cfg.num_layers, "out")]
    assert [layer for layer, _ in rec.of("kda")] == cfg.kda_layers
    assert [layer for layer, _ in rec.of("mla")] == cfg.mla_layers
    assert [layer for layer, _ in rec.of("moe")] == cfg.moe_layers
    _, out = rec.of("depth")[-1]
    n_blocks = 1 + -(-cfg.num_sublayers // cfg.attnres_block_size)
    assert out["weights"].shape == (1, 6, n_blocks)
    torch.testing.assert_close(out["weights"].sum(-1), torch.ones(1, 6, dtype=torch.float64))
    (_, moe), *_ = rec.of("moe")
    assert moe["expert_ids"].shape == (1, 6, cfg.top_k) and moe["scores"].shape == (1, 6, cfg.num_experts)


def test_cache_bytes_kda_fixed_and_mla_linear_in_tokens():
    model = _model("small", torch.float32)
    cfg = model.config
    sizes = {}
    with torch.no_grad():
        for T in (1, 8, 33):
            _, cache = model(_tokens(cfg, T))
            sizes[T] = (cache.kv_bytes(), cache.state_bytes())
    assert sizes[1][1] == sizes[8][1] == sizes[33][1] > 0
    for T, (kv, _) in sizes.items():
        assert kv == T * len(cfg.mla_layers) * (cfg.kv_lora_rank + cfg.qk_rope_dim) * 4
    H, K, W = cfg.kda_heads, cfg.kda_head_dim, cfg.kda_conv_kernel
    assert sizes[1][1] == len(cfg.kda_layers) * (H * K * K * 4 + (W - 1) * 3 * H * K * 4)


def test_k3_parameter_counts_match_the_release():
    total, active = parameter_counts(K3Config.preset("k3"))
    assert abs(total / 2.7795e12 - 1) < 0.01, total
    assert abs(active / 104.2e9 - 1) < 0.02, active
    parts = parameter_breakdown(K3Config.preset("k3"))
    expected = {"routed_experts": 2722.7e9, "kda": 30.62e9, "mla": 5.57e9, "shared_experts": 12.16e9,
                "latent_proj": 4.73e9, "router": 0.59e9, "dense_mlp": 0.73e9, "embedding": 1.174e9}
    for part, value in expected.items():
        assert abs(parts[part] / value - 1) < 0.01, (part, parts[part])


def test_meta_counts_equal_a_real_model():
    cfg = K3Config.preset("tiny")
    real = TinyK3(cfg)
    assert parameter_counts(cfg)[0] == sum(p.numel() for p in real.parameters())


def test_mini_family_keeps_active_routed_parameters_fixed():
    routed_active = []
    for n, k in [(56, 1), (112, 2), (224, 4), (448, 8), (896, 16)]:
        cfg = K3Config.preset(f"mini-{n}/{k}")
        parts = parameter_breakdown(cfg)
        routed_active.append(parts["routed_experts"] * k // n)
        total, active = parameter_counts(cfg)
        assert 19e6 < total < 23e6 and active < total / 6
    assert len(set(routed_active)) == 1


def test_generate_is_deterministic_and_greedy_is_argmax():
    model = _model("tiny")
    prompt = _tokens(model.config, 4)
    a = generate(model, prompt, 5, temperature=0.8, seed=3)
    b = generate(model, prompt, 5, temperature=0.8, seed=3)
    assert torch.equal(a, b) and a.shape == (1, 5)
    logits = torch.tensor([[0.1, 2.0, -1.0]])
    assert sample_next(logits).item() == 1
    with pytest.raises(ValueError, match="temperature must be 0"):
        sample_next(logits, -1.0)


def test_bad_inputs_give_one_sentence():
    model = _model("tiny")
    with pytest.raises(ValueError, match="token ids must lie in \\[0, 512\\)"):
        model(torch.tensor([[1, 600]]))
    with pytest.raises(ValueError, match="longer than preset 'tiny' allows \\(512 tokens\\)"):
        model(torch.zeros(1, 513, dtype=torch.long))
    with pytest.raises(ValueError, match="non-empty \\[B, T\\]"):
        model(torch.zeros(1, 0, dtype=torch.long))


def test_device_resolution(monkeypatch):
    monkeypatch.delenv("TINY_K3_DEVICE", raising=False)
    assert resolve_device().type == "cpu"
    monkeypatch.setenv("TINY_K3_DEVICE", "cpu")
    assert resolve_device().type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU is available"):
            resolve_device("cuda")
    with pytest.raises(ValueError, match="unknown device 'tpu9'"):
        resolve_device("tpu9")


def test_cache_clone_is_independent():
    model = _model("tiny")
    tokens = _tokens(model.config, 5)
    with torch.no_grad():
        _, cache = model(tokens)
        saved = cache.clone()
        a, _ = model(tokens[:, :1], cache)
        b, _ = model(tokens[:, :1], saved)
    torch.testing.assert_close(a, b)
    assert isinstance(saved, ModelCache)
