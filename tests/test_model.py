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


@pytest.mark.parametrize("short_conv", [True, False])
def test_the_twin_decodes_as_it_prefills_and_keeps_a_conv_tail_only_with_the_short_conv(short_conv):
    cfg = K3Config.preset("tiny").twin(short_conv=short_conv)
    assert cfg.mla_conv_layers == ((0, 1, 2) if short_conv else ())          # where "tiny" has its KDA layers
    torch.manual_seed(0)
    model = TinyK3(cfg).to(torch.float64).eval()
    tokens = _tokens(cfg, 13, B=2)
    with torch.no_grad():
        full, whole = model(tokens)
        cache, steps = None, []
        for t in range(13):
            logits, cache = model(tokens[:, t:t + 1], cache)
            steps.append(logits)
        half, split = model(tokens[:, :6])
        rest, split = model(tokens[:, 6:], split)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(torch.cat([half, rest], 1), full, atol=1e-10, rtol=1e-10)
    tails = [layer.conv for layer in cache.layers]
    assert [t is not None for t in tails] == [i in cfg.mla_conv_layers for i in range(cfg.num_layers)]
    for i in cfg.mla_conv_layers:    # the tail is the last W-1 pre-conv inputs, whichever way the tokens came
        assert tails[i].shape == (2, cfg.kda_conv_kernel - 1, 8 + 4 + 16)     # [c, k_r] 8 + 4, q_a 16 channels
        torch.testing.assert_close(tails[i], whole.layers[i].conv, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(tails[i], split.layers[i].conv, atol=1e-12, rtol=1e-12)
    assert (cache.state_bytes() > 0) == short_conv and cache.kv_bytes() == whole.kv_bytes()


def test_mla_conv_layers_name_only_mla_layers():
    with pytest.raises(ValueError, match=r"mla_conv_layers may only name MLA layers \(0-based\), got \[0\]"):
        K3Config.preset("tiny", mla_conv_layers=(0,))


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


def test_sample_next_is_argmax_at_zero_and_a_seeded_softmax_draw_above_it():
    logits = torch.tensor([[0.5, 2.0, 2.0, -1.0], [3.0, 0.0, 1.0, 3.0]])
    generator = torch.Generator().manual_seed(0)
    assert sample_next(logits, 0.0, generator).tolist() == [1, 0]          # the lowest id among equal maxima
    assert torch.equal(generator.get_state(), torch.Generator().manual_seed(0).get_state())   # nothing drawn
    temperature, draws = 0.7, 20_000
    rows = logits[:1].expand(draws, 4)
    first = sample_next(rows, temperature, torch.Generator().manual_seed(5))
    assert torch.equal(first, sample_next(rows, temperature, torch.Generator().manual_seed(5)))   # same seed
    assert not torch.equal(first, sample_next(rows, temperature, torch.Generator().manual_seed(6)))
    share = torch.bincount(first, minlength=4).double() / draws
    want = torch.softmax(logits[0].double() / temperature, -1)
    # 20,000 draws: a share's standard deviation is at most 0.0036; 0.02 is over five of them
    torch.testing.assert_close(share, want, rtol=0, atol=0.02)
    assert share[3] < share[0] < share[1]                                   # hotter tokens drawn more often
    assert sample_next(torch.tensor([[0.0, 60.0, 0.0]]), 1.0, torch.Generator().manual_seed(1)).item() == 1


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


def test_every_random_weight_is_drawn_once(monkeypatch):
    """One init: tiny_k3 gives each weight matrix exactly one N(0, init_std) draw, re-initialising nothing
    (PyTorch's own constructor defaults, which the one pass replaces, are not counted)."""
    import sys

    drawn = []
    real_normal = torch.nn.init.normal_

    def counting_normal(tensor, mean=0.0, std=1.0, generator=None):
        if "tiny_k3" in sys._getframe(1).f_code.co_filename:
            drawn.append((tensor.data_ptr(), std))
        return real_normal(tensor, mean, std, generator)

    monkeypatch.setattr(torch.nn.init, "normal_", counting_normal)
    cfg = K3Config.preset("tiny")
    torch.manual_seed(0)
    model = TinyK3(cfg)
    ptrs = [ptr for ptr, _ in drawn]
    assert len(ptrs) == len(set(ptrs)) and {std for _, std in drawn} == {cfg.init_std}
    matrices = {name for name, p in model.named_parameters() if p.data_ptr() in set(ptrs)}
    expected = {name for name, p in model.named_parameters()
                if p.dim() >= 2 and "conv" not in name}            # every Linear, Embedding, router, expert stack
    assert matrices == expected
    params = dict(model.named_parameters())
    large = [name for name in expected if params[name].numel() > 2000]
    gains = [name for name in params if name.endswith(("norm.weight", "key_norm", "o_norm_weight"))]
    queries = [name for name in params if name.endswith(".query")]
    assert len(large) > 10 and len(gains) > 10 and len(queries) == 2 * cfg.num_layers + 1
    for name in large:
        assert abs(params[name].std().item() / cfg.init_std - 1) < 0.1, name
    assert all(torch.all(params[name] == 1) for name in gains) and all(torch.all(params[n] == 0) for n in queries)


def test_a_recorder_only_watches():
    """The default do-nothing recorder and a recording one give the same logits and cache."""
    from tiny_k3 import NO_RECORDER, Recorder

    model = _model("tiny")
    tokens = _tokens(model.config, 7)
    calls = []

    class Counting(Recorder):
        def record(self, event, layer, **data):
            calls.append(event)

    with torch.no_grad():
        plain, plain_cache = model(tokens)
        watched, watched_cache = model(tokens, recorder=Counting())
    assert torch.equal(plain, watched) and plain_cache.layer_bytes() == watched_cache.layer_bytes()
    assert calls.count("sublayer") == 2 * model.config.num_layers and calls[-1] == "logits"
    assert NO_RECORDER.record("moe", 0, scores=None) is None


def test_load_model_seeds_on_the_cpu_and_leaves_the_global_rng_alone():
    from tiny_k3 import load_model

    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, source = load_model("tiny", "random", seed=4, device="cpu")
    assert torch.equal(torch.get_rng_state(), before) and source == "random" and not a.training
    b, _ = load_model(K3Config.preset("tiny"), "auto", seed=4)            # no checkpoint ships: random
    c, _ = load_model("tiny", "random", seed=5)
    torch.manual_seed(4)
    by_hand = TinyK3(K3Config.preset("tiny"))
    for name, p in a.state_dict().items():
        assert torch.equal(p, b.state_dict()[name]) and torch.equal(p, by_hand.state_dict()[name]), name
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


def test_load_model_takes_shipped_weights_only_for_their_exact_config():
    from tiny_k3 import load_model
    from tiny_k3.weights import CheckpointError, available_pretrained

    if "small" not in available_pretrained():
        pytest.skip("no shipped checkpoint for 'small'")
    trained, source = load_model("small")
    shipped = TinyK3.from_pretrained("small")
    assert source == "trained" and torch.equal(trained.lm_head.weight, shipped.lm_head.weight)
    assert load_model("small", "random").source == "random"
    assert load_model(K3Config.preset("small", top_k=4)).source == "random"     # not the shipped config
    twin, twin_source = load_model(K3Config.preset("small").twin())
    assert twin_source == "trained" and set(twin.config.layer_kinds) == {"mla"}
    with pytest.raises(CheckpointError, match="no trained weights ship for 'tiny'"):
        load_model("tiny", "trained")


@pytest.mark.parametrize("args, message", [
    (("k3",), "only counted, never run; pick a runnable preset: k3-topo"),
    (("tiny", "best"), "weights must be one of auto, trained, random"),
    (("nope",), "unknown preset 'nope'"),
])
def test_load_model_bad_input_is_one_sentence(args, message):
    from tiny_k3 import load_model

    with pytest.raises(ValueError, match=message):
        load_model(*args)
