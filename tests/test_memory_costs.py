"""sim.memory and sim.costs: K3's published figures (k3_facts.md §0, §1d, §4, §5, §6) and the live cache."""

from __future__ import annotations

import io
import math

import pytest
import torch

from sim import costs, memory, serving, serving_text
from tiny_k3 import K3Config, TinyK3, parameter_breakdown, parameter_counts
from tiny_k3.config import COUNTED_ONLY

K3 = K3Config.preset("k3")
M = 1 << 20


# ---------------------------------------------------------------------------- memory: K3 (§5a)


def test_k3_kv_per_token_and_at_1m():
    assert memory.kv_bytes_per_token(K3) == 24 * 576 * 2 == 27_648
    kv, state = memory.cache_bytes(K3, M)
    assert kv == 27_648 * M
    assert memory.format_bytes(kv) == "29.0 GB"
    assert memory.kv_bytes_per_token(K3.twin()) == 107_136             # all 93 layers MLA
    assert costs.k2_serving_model().kv_bytes_per_token == 70_272       # K2, 61 MLA layers
    # §5a table: K3 KV per sequence at 128K / 256K
    assert memory.format_bytes(memory.cache_bytes(K3, 131072)[0]) == "3.6 GB"
    assert memory.format_bytes(memory.cache_bytes(K3, 262144)[0]) == "7.2 GB"
    assert memory.format_bytes(70_272 * M) == "73.7 GB"


def test_k3_kda_state():
    s = memory.state_bytes_fixed(K3)
    assert s.state == 69 * 96 * 128 * 128 * 4 == 434_110_464                 # fp32 S, "434 MB"
    assert s.conv == 69 * 3 * (2 * 96 * 128 + 96 * 128) * 2                    # conv tail, "~15 MB"
    assert memory.format_bytes(s.conv) == "15.3 MB"
    assert memory.cache_bytes(K3, 1)[1] == memory.cache_bytes(K3, M)[1] == s.total  # constant in T


def test_hybrid_reduction():
    assert memory.hybrid_reduction(K3) == pytest.approx(1 - 24 / 93)
    assert round(100 * memory.hybrid_reduction(K3), 1) == 74.2
    assert 1 - memory.kv_bytes_per_token(K3) / memory.kv_bytes_per_token(K3.twin()) == pytest.approx(1 - 24 / 93)
    assert memory.kv_reduction(K3, K3Config.preset("k2")) == pytest.approx(1 - 27_648 / 70_272)   # 60.7% (§5a)


@pytest.mark.parametrize("preset", ["tiny", "small", "k3-topo", "k3"])
def test_crossover_is_the_first_token_count_where_the_hybrid_holds_less(preset):
    cfg = K3Config.preset(preset)
    n = memory.crossover_tokens(cfg)

    def smaller(t):
        return sum(memory.cache_bytes(cfg, t)) < sum(memory.cache_bytes(cfg.twin(), t))

    assert n is not None and smaller(n) and not smaller(n - 1)
    assert all(smaller(t) for t in (n + 1, 2 * n, memory.MIB_CONTEXT))   # and it stays below from there
    if n < 5_000:                                                         # the small presets: a plain scan
        assert n == next(t for t in range(1, 5_000) if smaller(t))


def test_no_crossover_without_kda_layers():
    assert memory.crossover_tokens(K3Config.preset("tiny").twin()) is None


def test_mha_baseline_and_projection():
    assert memory.mha_bytes_per_token(K3) == 93 * 96 * (192 + 128) * 2     # 61,440 B per layer (§5a)
    p = memory.project_to_k3(M)
    # the twin's 69 former-KDA layers keep a short-conv tail: 3 rows of [c, k_r, q_a] = 576 + 1,536 values, bf16
    assert (p.kv, p.twin, p.mha) == (27_648 * M, 107_136 * M + 69 * 3 * 2_112 * 2, 93 * 61_440 * M)
    assert p.hybrid == p.kv + memory.state_bytes_fixed(K3).total
    assert memory.project_to_k3(0).hybrid == 0


# ---------------------------------------------------------------------------- memory: tiny presets, inputs


def test_tiny_presets_by_hand():
    tiny = K3Config.preset("tiny")        # 1 MLA (8 + 4 values), 3 KDA (2 heads x 8), conv 4, fp32
    per_kda = 2 * 8 * 8 * 4 + 3 * (2 * 2 * 8 + 2 * 8) * 4
    assert memory.cache_bytes(tiny, 10) == (10 * 12 * 4, 3 * per_kda)
    mini = K3Config.preset("mini-56/1")   # §7: 2 MLA x 40 floats x 4 B = 320 B/token; 6 KDA x 4 x 32 x 32 x 4 B
    assert memory.kv_bytes_per_token(mini) == 320
    assert memory.state_bytes_fixed(mini).state == 98_304


@pytest.mark.parametrize("name", ["tiny", "small", "k3"])
def test_zero_tokens_and_batch_linearity(name):
    cfg = K3Config.preset(name)
    assert memory.cache_bytes(cfg, 0) == (0, 0)
    assert memory.cache_bytes(cfg, 0, batch=5) == (0, 0)
    kv, state = memory.cache_bytes(cfg, 37)
    assert memory.cache_bytes(cfg, 37, batch=3) == (3 * kv, 3 * state)
    assert memory.cache_bytes(cfg, 74)[0] == 2 * kv


@pytest.mark.parametrize("tokens, batch", [(-1, 1), (3, -2), (2.5, 1), ("4", 1), (None, 1)])
def test_bad_inputs(tokens, batch):
    with pytest.raises(ValueError, match="non-negative integer"):
        memory.cache_bytes(K3, tokens, batch)


def test_memory_curve():
    counts = [0, 1, 1000, M]
    curve = memory.memory_curve(K3, counts)
    assert curve.tokens == tuple(counts)
    assert curve.hybrid[0] == curve.twin[0] == curve.mha[0] == 0
    assert curve.twin == tuple(sum(memory.cache_bytes(K3.twin(), t)) for t in counts)
    assert curve.hybrid[-1] < curve.twin[-1] < curve.mha[-1]
    assert curve.as_dict()["hybrid"][-1] == sum(memory.cache_bytes(K3, M))


def test_format_bytes():
    assert memory.format_bytes(999) == "999 B"
    assert memory.format_bytes(1000) == "1.0 KB"
    assert memory.format_bytes(999_960) == "1.0 MB"
    assert memory.format_bytes(1.56e12, 3) == "1.560 TB"


# ---------------------------------------------------------------------------- the live cache


RUNNABLE = [name for name in K3Config.presets() if name not in COUNTED_ONLY]


@pytest.mark.parametrize("name", RUNNABLE + ["small-twin", "tiny-twin", "tiny-twin-noconv"])
def test_cache_bytes_match_live_model(name):
    """Analytic bytes == bytes of the live ModelCache after a prefill and after one decode step (twins: their conv
    tails counted with the fixed state, and without the short conv none)."""
    base = name.removesuffix("-noconv").removesuffix("-twin")
    cfg = K3Config.preset(base) if base == name else K3Config.preset(base).twin(short_conv=not name.endswith("noconv"))
    torch.manual_seed(0)
    model = TinyK3(cfg).eval()
    batch, prompt = 2, 5
    tokens = torch.randint(0, 256, (batch, prompt))
    with torch.no_grad():
        _, cache = model(tokens)
        assert (cache.kv_bytes(), cache.state_bytes()) == memory.cache_bytes(cfg, prompt, batch)
        _, cache = model(tokens[:, :1], cache)
    assert (cache.kv_bytes(), cache.state_bytes()) == memory.cache_bytes(cfg, prompt + 1, batch)


# ---------------------------------------------------------------------------- weights (§1d, §4)


def test_k3_parameters():
    total, active = parameter_counts(K3)
    assert total == pytest.approx(2.7795e12, rel=0.01)
    assert active == pytest.approx(104.2e9, rel=0.02)
    assert costs.active_parameters(K3) == active
    assert parameter_breakdown(K3)["routed_experts"] == 92 * 896 * 3 * 3584 * 3072   # 2722.7B
    assert costs.flops_per_token(K3, 0) == pytest.approx(2 * active, rel=0.01)
    # absorbed MLA at T: 24 layers x 2 x 96 x T x (2*512 + 64)
    extra = costs.flops_per_token(K3, 1000) - costs.flops_per_token(K3, 0)
    assert extra == 24 * 2 * 96 * 1000 * (2 * 512 + 64)


def test_k3_weight_bytes():
    total, _ = parameter_counts(K3)
    assert costs.weight_bytes(K3, "bf16") == 2 * total
    assert costs.weight_bytes(K3, "bf16") == pytest.approx(5.56e12, rel=0.01)
    assert costs.weight_bytes(K3, "fp8") == total
    assert costs.weight_bytes(K3, "int4") == pytest.approx(total * 4.5 / 8, rel=1e-6)
    assert costs.weight_bytes(K3, "mxfp4") == pytest.approx(1.488e12, rel=0.01)
    release = costs.weight_bytes(K3, "k3-release")
    assert release == pytest.approx(1.560e12, rel=0.01)
    routed = 92 * 896 * 3 * 3584 * 3072
    assert release == routed * 17 // 32 + 2 * (total - routed)     # MXFP4 experts + BF16 rest exactly
    assert costs.serving_model(K3).expert_bytes == 17_547_264       # 17.55 MB per expert (colibri, S7)


def test_unknown_scheme():
    with pytest.raises(ValueError, match="valid schemes are: bf16, fp8, int4, mxfp4, k3-release"):
        costs.weight_bytes(K3, "fp4")


def test_mxfp4_is_4_25_bits():
    for shape in [(32 * 7,), (5, 32 * 3), (2, 3, 64)]:
        assert costs.mxfp4_bytes(shape) * 8 == 4.25 * math.prod(shape)
    assert costs.mxfp4_bytes((1, 33)) == 2 * 17                    # a partial block still costs a whole one
    assert costs.mxfp4_bytes((4, 33)) == 4 * 2 * 17                # blocks never span rows
    assert costs.packed_bytes((32 * 9,), "int4") * 8 == 4.5 * 32 * 9


# ---------------------------------------------------------------------------- decode time (§5b)


def test_kv_only_limits_and_eta_attn():
    k3, twin, k2 = (costs.serving_model(K3), costs.serving_model(K3, kv_config=K3.twin()), costs.k2_serving_model())
    assert costs.kv_only_limit(k3, twin) == pytest.approx(3.76, abs=0.01)
    assert costs.kv_only_limit(k3, k2) == pytest.approx(2.47, abs=0.01)
    # a slower attention kernel raises the time and the twin/hybrid ratio, but never past L/L_full = 93/24
    base = costs.decode_step_time(k3, 16, M)
    slow = costs.decode_step_time(k3, 16, M, eta_attn_full=lambda t: 0.2)
    assert slow > base
    ratio = costs.decode_step_time(twin, 16, M, eta_attn_full=0.001) / costs.decode_step_time(k3, 16, M, eta_attn_full=0.001)
    assert costs.kv_only_limit(k3, twin) < ratio < 93 / 24
    with pytest.raises(ValueError, match="eta_attn_full"):
        costs.decode_step_time(k3, 1, 10, eta_attn_full=1.5)


# ---------------------------------------------------------------------------- EP, GPUs, prices (§6, §1)


def test_ep_traffic():
    ep = costs.ep_traffic_for(K3, 64)
    assert (ep.dispatch, ep.combine) == (16 * (3584 + 112), 16 * 3584 * 2)   # 59.1 KB, 114.7 KB
    assert ep.per_token == pytest.approx(16.0e6, rel=0.005)                  # x 92 layers
    assert round(ep.destinations, 1) == 14.3
    k2 = costs.ep_traffic(7168, 8, 64, moe_layers=60)
    assert (k2.dispatch, k2.combine) == (ep.dispatch, ep.combine)             # latent MoE keeps K2's traffic
    assert k2.per_token == pytest.approx(10.4e6, rel=0.01)
    table = {(8, 16): 7.1, (16, 16): 10.3, (144, 16): 15.2, (64, 8): 7.6}
    for (n, k), expected in table.items():
        assert round(costs.expected_destinations(n, k), 1) == expected


def test_gpus_needed():
    release = costs.weight_bytes(K3, "k3-release")
    assert 8 * 80e9 < release and 8 * 141e9 < release < 8 * 288e9
    assert costs.gpus_needed(K3, 80e9) > 8
    assert costs.gpus_needed(K3, 141e9) > 8
    assert costs.gpus_needed(K3, 288e9) <= 8
    assert costs.gpus_needed(K3, 288e9, overhead=0.0) == math.ceil(release / 288e9)
    assert costs.gpus_needed(K3, 288e9, kv_tokens=40 * M) > costs.gpus_needed(K3, 288e9)
    with pytest.raises(ValueError, match="overhead"):
        costs.gpus_needed(K3, 80e9, overhead=1.0)


def test_api_price():
    assert costs.api_price(1_000_000, 0) == pytest.approx(3.00)
    assert costs.api_price(0, 1_000_000) == pytest.approx(15.00)
    assert costs.api_price(1_000_000, 0, cached_tokens=1_000_000) == pytest.approx(0.30)
    assert costs.api_price(100_000, 2_000, 80_000) == pytest.approx(0.08 * 0.3 + 0.02 * 3 + 0.002 * 15)
    with pytest.raises(ValueError, match="cached_tokens <= input_tokens"):
        costs.api_price(10, 0, cached_tokens=11)


# ---------------------------------------------------------------------------- corrections (§0) and report


def test_corrections():
    found = serving_text.corrections()
    assert len(found) == 4
    assert all({"claim", "verdict", "figures", "sources"} <= set(c) for c in found)
    speed, size, gpus, attention = (c["figures"] for c in found)
    assert speed["Kimi Linear reported speedup"] == pytest.approx(6.24, abs=0.01)
    assert speed["bound: same weights, KV only, L/L_full"] == pytest.approx(93 / 24)
    assert speed["bound at 1M (B -> inf)"] == pytest.approx(3.76, abs=0.01)
    # Kimi Linear against its own all-MLA twin (its own, lighter MLA weights in place of its KDA layers), batch 1,
    # 1M, bf16: below its layer-count ceiling 27 / 7 and far below the measured 6.24x
    assert 2 < speed["Kimi Linear roofline vs its all-MLA twin, B=1, 1M"] < 27 / 7
    assert speed["Kimi Linear KV-only limit"] == pytest.approx(3.8, abs=0.05)
    assert speed["K3 against K2, B=1, 1M (K3 slower)"] < 1 < speed["K3 against K2, largest fit, 64xH200, 1M"]
    table = serving.speedups()                       # the corrections quote the one table
    assert speed["K3 against twin, B=1, 1M"] == table.speedup("K3 against twin", "1M", "batch 1")
    assert size["naive 2.8e12 x 4 bit (B)"] == 1.4e12
    assert size["K3 release: MXFP4 experts + BF16 rest (B)"] == pytest.approx(1.560e12, rel=0.01)
    assert size["K2-Thinking INT4 experts + BF16 rest (B)"] == pytest.approx(594.2e9, rel=0.002)
    assert gpus["8xH100 memory (B)"] == 640e9 < gpus["K3 release weights (B)"]
    assert attention["MLA layers"] == 24 and attention["MLA layers (1-based)"][-2:] == [92, 93]
    sources = {s for c in found for s in c["sources"]}
    assert {"S1", "S7", "S13", "S15", "S16", "S20", "S34"} <= sources


def test_main_costs_prints_report():
    from rich.console import Console

    out = io.StringIO()
    serving_text.main_costs(Console(file=out, width=140))
    text = out.getvalue()
    assert "1.560 TB" in text and "29.0 GB" in text and "Corrections" in text and "S34" in text
    assert "sim.serving.speedups" in text
