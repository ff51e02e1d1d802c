"""sim.measure: absorbed MLA == the module's attention, touched-experts MoE == the full layer, the composition,
save / load, bad input and the CLI's last line. Tiny widths (`--tiny`, K3's topology); no timing is asserted."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from rich.console import Console
from torch import nn

from sim.__main__ import main
from sim.measure import (LayerWork, TouchedMoE, absorbed_mla_step, check_memory, estimate_peak_bytes, last_line,
                         load_saved, measure, parse_tokens, reading, save, saved_line, schedules, widths)
from sim.measure.measurement import _meta_weights
from tiny_k3 import K3Config
from tiny_k3.mla import GatedMLA
from tiny_k3.moe import LatentMoE

TOKENS = (16, 64)


def run_cli(*argv, trusting: bool = True) -> tuple[int, str]:
    """The CLI in-process; `trusting`: whatever this machine's load, the run is not refused as too loaded (the tests
    check the ratios' plumbing, not this machine)."""
    import sim.measure.measurement as M

    saved = M.TOO_LOADED, M.BUSY_ENOUGH
    if trusting:
        M.TOO_LOADED, M.BUSY_ENOUGH = float("inf"), 0.0
    console = Console(record=True, width=200, color_system=None)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code = main(["measure", *argv], console=console)
    finally:
        torch.set_num_threads(before)
        M.TOO_LOADED, M.BUSY_ENOUGH = saved
    return code, console.export_text()


@pytest.fixture(scope="module")
def tiny_run():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return measure(TOKENS, tiny=True, quick=True, dtype="float32", load=0.0)
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------------------- absorbed MLA


class _OpenGate(nn.Module):
    """Stands in for g_proj so that sigmoid(gate) == 1 exactly: GatedMLA without its output gate (K2)."""

    def __init__(self, width: int):
        super().__init__()
        self.width = width

    def forward(self, x):
        return x.new_full((*x.shape[:-1], self.width), 1e4)


@pytest.mark.parametrize("gated", [True, False])
def test_absorbed_mla_decode_equals_the_non_absorbed_attention_in_float64(gated):
    config = K3Config.preset("tiny")
    torch.manual_seed(0)
    mla = GatedMLA(config, dtype=torch.float64)
    for p in mla.parameters():                      # away from the ones-initialised norms: a real test of the math
        nn.init.normal_(p, std=0.3)
    B, T = 2, 9
    prompt, token = torch.randn(B, T, config.hidden_size, dtype=torch.float64), torch.randn(B, 1, config.hidden_size,
                                                                                            dtype=torch.float64)
    if not gated:
        mla.g_proj = _OpenGate(config.mla_heads * config.v_head_dim)
    _, cache = mla(prompt)
    expected, grown = mla(token, cache)             # GatedMLA.forward: latents expanded into per-head k, v

    kv = torch.zeros(B, T + 3, config.mla_cache_width, dtype=torch.float64)   # capacity beyond T + 1: rows unused
    kv[:, :T] = torch.cat([cache.latent, cache.k_rope], -1)
    if not gated:
        mla.g_proj = None
    got = absorbed_mla_step(mla, token, kv, T)
    assert got.shape == expected.shape == (B, 1, config.hidden_size)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(kv[:, : T + 1], torch.cat([grown.latent, grown.k_rope], -1))  # the new row written
    assert torch.count_nonzero(kv[:, T + 1:]) == 0


# ---------------------------------------------------------------------------- MoE with the touched experts only


def _moe(config: K3Config, seed: int = 0) -> LatentMoE:
    torch.manual_seed(seed)
    moe = LatentMoE(config, dtype=torch.float64)
    for p in moe.parameters():
        nn.init.normal_(p, std=0.2)
    moe.router.bias.normal_(0, 0.1, generator=torch.Generator().manual_seed(seed))   # selection differs from scores
    return moe


def test_the_moe_step_with_only_the_touched_experts_equals_the_full_layer():
    config = K3Config.preset("k3-topo")           # 896 experts, top-16, 2 shared: K3's routing at tiny widths
    moe = _moe(config)
    x = torch.randn(1, 1, config.hidden_size, dtype=torch.float64)
    touched = TouchedMoE.from_layer(moe, x)
    assert touched.w1.shape == (config.top_k, config.moe_intermediate, config.latent_dim)
    assert sorted(touched.expert_ids.tolist()) == sorted(moe.router(x).expert_ids.reshape(-1).tolist())
    torch.testing.assert_close(touched(x), moe(x), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(touched(x), moe.dense_reference(x), rtol=1e-10, atol=1e-12)

    chosen = set(touched.expert_ids.tolist())
    other = next(y for y in (torch.randn(1, 1, config.hidden_size, dtype=torch.float64) for _ in range(50))
                 if not set(moe.router(y).expert_ids.reshape(-1).tolist()) <= chosen)
    with pytest.raises(ValueError, match="does not hold"):
        touched(other)


def test_the_k2_moe_without_latent_projections_is_a_plain_moe_at_full_width():
    config = widths(tiny=True).k2                 # latent_dim == hidden_size, 384 experts top-8, 1 shared
    assert config.latent_dim == config.hidden_size and (config.num_experts, config.top_k) == (384, 8)
    moe = _moe(config, seed=3)
    x = torch.randn(1, 1, config.hidden_size, dtype=torch.float64)
    ids = moe.router(x).expert_ids.reshape(-1)
    touched = TouchedMoE(moe, ids, moe.w1[ids], moe.w3[ids], moe.w2[ids], latent=False)
    moe.down, moe.latent_norm, moe.up = nn.Identity(), nn.Identity(), nn.Identity()   # the reference, same weights
    torch.testing.assert_close(touched(x), moe(x), rtol=1e-10, atol=1e-12)


def test_a_random_real_layer_allocates_only_the_touched_experts():
    config = K3Config.preset("k3-topo")
    x = torch.randn(1, 1, config.hidden_size)
    moe = TouchedMoE.random(config, x, "cpu", torch.float32)
    assert moe.w1.shape[0] == moe.w2.shape[0] == config.top_k
    assert all(not p.is_meta for p in moe.parameters())
    assert torch.isfinite(moe(x)).all()           # the token it was built from routes to held experts only


# ---------------------------------------------------------------------------- composition and counts


def test_the_composition_is_the_sum_of_the_parts_by_k3s_schedule(tiny_run):
    m = tiny_run
    k3 = K3Config.preset("k3-topo")
    assert (len(k3.kda_layers), len(k3.mla_layers), len(k3.moe_layers)) == (69, 24, 92)
    assert m.schedules == schedules(widths(tiny=True))
    s = m.seconds
    for t in TOKENS:
        hybrid = 69 * s["kda"] + 24 * s[f"mla@{t}"] + 92 * s["moe"] + s["dense"] + s["head"]
        twin = 93 * s[f"mla@{t}"] + 92 * s["moe"] + s["dense"] + s["head"]
        k2 = 61 * s[f"k2-mla@{t}"] + 60 * s["k2-moe"] + s["k2-dense"] + s["head"]
        assert m.per_token("k3", t) == pytest.approx(hybrid, rel=1e-12)
        assert m.per_token("twin", t) == pytest.approx(twin, rel=1e-12)
        assert m.per_token("k2", t) == pytest.approx(k2, rel=1e-12)
        assert m.speedup(t) == pytest.approx(twin / hybrid, rel=1e-12)
        assert m.speedup(t, "k2") == pytest.approx(k2 / hybrid, rel=1e-12)
    with pytest.raises(ValueError, match="was not measured at 999"):
        m.per_token("k3", 999)


def test_layer_work_is_read_off_the_live_modules_and_matches_the_memory_estimate(tiny_run):
    m = tiny_run
    meta = _meta_weights(widths(tiny=True))
    assert {k: m.work[k].weights for k in meta} == meta          # live modules == the meta-device count
    assert m.held_bytes["kda"] == m.work["kda"].weights * 4      # float32, no buffers
    c = K3Config.preset("k3-topo")
    mla = m.work["mla"]
    assert mla.cache_width == c.kv_lora_rank + c.qk_rope_dim
    assert mla.flops_per_token == 2 * c.mla_heads * (2 * c.kv_lora_rank + c.qk_rope_dim)   # sim.costs' MLA term
    assert m.work["kda"].fp32_bytes == 2 * c.kda_heads * c.kda_head_dim ** 2 * 4         # S read and written
    # a pure-bandwidth roofline on this dtype is exactly the bandwidth model; a pure-FLOP one the FLOP ratio
    for t in TOKENS:
        assert m.roofline_speedup(t, 1e9, float("inf"), element_bytes=4) == pytest.approx(m.bandwidth_speedup(t))
        flops = {k: sum(n * m.work[layer].flops_at(t) for layer, n in m.schedules[k].items()) for k in ("k3", "twin")}
        assert m.roofline_speedup(t, float("inf"), 1e9) == pytest.approx(flops["twin"] / flops["k3"])


def test_layer_work_counts_the_cache_rows_attended():
    w = LayerWork(weights=10, io_values=3, fp32_bytes=8, cache_width=5, flops=20.0, flops_per_token=4.0)
    assert w.bytes_at(7, 2) == (10 + 3 + 5 * 8) * 2 + 8           # T cached rows + the new one
    assert w.flops_at(7) == 20.0 + 4.0 * 8


def test_the_reading_is_computed_from_the_measurement(tiny_run):
    lines = reading(tiny_run)
    assert any(f"{93 / 24:.2f}x" in line for line in lines)
    n = TOKENS[-1]
    bw, fl = tiny_run.fractions(f"mla@{n}")
    assert any(f"{fl:.0%} of the GEMM" in line and f"{bw:.0%} of the copy" in line for line in lines)
    assert lines[-1].startswith("These are tiny widths")


# ---------------------------------------------------------------------------- save / load


def test_save_and_load_round_trip(tiny_run, tmp_path):
    path = save(tiny_run, tmp_path / "m.json")
    assert load_saved(path) == tiny_run
    assert last_line(load_saved(path)) == last_line(tiny_run)
    (tmp_path / "bad.json").write_text(json.dumps({"device": "cpu"}))
    with pytest.raises(ValueError, match="is not a measurement saved by"):
        load_saved(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="no saved measurement at"):
        load_saved(tmp_path / "missing.json")


def test_load_saved_reads_this_machines_default_files_only(tiny_run, tmp_path, monkeypatch):
    import sim.measure.measurement as M

    monkeypatch.setattr(M, "RESULTS", tmp_path)
    assert load_saved() is None and M.saved_paths() == []
    (tmp_path / "shipped").mkdir()
    save(tiny_run, tmp_path / "shipped" / "measure-cpu-quick.json")     # a shipped one is not "this machine's"
    assert load_saved() is None
    path = save(tiny_run)                                               # --save without a path
    assert path == tmp_path / "measure-cpu-quick.json" and load_saved() == tiny_run
    assert saved_line() is None                                         # tiny widths: nothing for the TUI
    real = dataclasses.replace(tiny_run, widths="k3", tokens=tiny_run.tokens)
    save(real)
    n = TOKENS[-1]
    assert saved_line() == (f"measured on this machine (cpu, float32): K3 decodes {tiny_run.speedup(n):.2f}x faster "
                            f"than its all-MLA twin at {n:,} tokens (bandwidth model "
                            f"{tiny_run.bandwidth_speedup(n):.2f}x; python -m sim measure)")
    path.write_text("{not json")
    assert saved_line() is None


# ---------------------------------------------------------------------------- bad input


def test_tokens_are_parsed_and_bounded():
    assert parse_tokens("8192, 1024,1024", quick=False) == (1024, 8192)
    assert parse_tokens(None, quick=True)[-1] == 65536 and parse_tokens(None, quick=False)[-1] == 1 << 20
    for text, message in [("abc", "comma-separated whole numbers"), ("0", "between 1 and 1,048,576"),
                          ("2000000", "K3's context length")]:
        with pytest.raises(ValueError, match=message):
            parse_tokens(text, quick=False)
    with pytest.raises(ValueError, match="--quick measures at most 65,536 tokens"):
        parse_tokens("262144", quick=True)


def test_too_many_tokens_for_this_machines_memory_is_refused_with_the_numbers():
    w = widths()
    need, what = estimate_peak_bytes(w, 1 << 20, 4)
    assert what == "mla" and need > (1 << 20) * 576 * 4                 # at 1M the MLA cache is the largest thing
    assert estimate_peak_bytes(w, 1024, 4)[1] == "head"                  # at 1K the LM head is
    check_memory(w, 1 << 20, 4, "float32", available=need)               # fits: no error
    head = estimate_peak_bytes(w, 0, 4)[0]
    with pytest.raises(ValueError, match=r"^measuring 1,048,576 tokens needs about .* GB at float32 \(the MLA layer "
                                         r"with its latent cache\) but this machine has .* GB available; about ([\d,]+) "
                                         r"tokens would fit\.$") as refused:
        check_memory(w, 1 << 20, 4, "float32", available=(need + head) // 2)
    fit = int(re.search(r"about ([\d,]+) tokens", str(refused.value)).group(1).replace(",", ""))
    assert 0 < fit < 1 << 20
    check_memory(w, fit, 4, "float32", available=(need + head) // 2)    # the number it offers does fit
    with pytest.raises(ValueError, match=r"^the head layer alone needs about 5.6 GB at float32 but this machine has "
                                         r"1.0 MB available; free some memory or use --dtype bfloat16\.$"):
        measure((1024,), available=1_000_000, dtype="float32")


@pytest.mark.parametrize("argv, message", [
    (["--tokens", "1k"], "--tokens must be comma-separated whole numbers"),
    (["--tokens", "4194304"], "K3's context length"),
    (["--device", "tpu"], "unknown device 'tpu'"),
    (["--dtype", "float16"], "--dtype must be one of float32, bfloat16"),
    (["--quick", "--tokens", "262144"], "--quick measures at most"),
])
def test_bad_input_is_one_sentence_and_a_nonzero_exit(argv, message):
    code, out = run_cli(*argv)
    lines = [line for line in out.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], out
    assert "Traceback" not in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_a_gpu_is_one_sentence():
    code, out = run_cli("--device", "cuda", "--tiny")
    assert code == 2 and out.strip() == "error: device 'cuda' was asked for but no CUDA GPU is available; use 'cpu'."


# ---------------------------------------------------------------------------- the CLI


def test_the_cli_prints_the_tables_and_ends_with_the_measured_line(tmp_path):
    path = tmp_path / "saved.json"
    code, out = run_cli("--tiny", "--quick", "--tokens", "16,64", "--save", str(path))
    assert code == 0, out
    lines = out.rstrip().splitlines()
    match = re.fullmatch(r"measured on cpu: K3 decodes (\d+\.\d\d)x faster than its all-MLA twin at 64 tokens "
                         r"\(bandwidth model: (\d+\.\d\d)x; reported: up to 6\.3x\)", lines[-1])
    assert match, lines[-1]
    saved = load_saved(path)
    assert match.groups() == (f"{saved.speedup(64):.2f}", f"{saved.bandwidth_speedup(64):.2f}")
    assert lines[-3] == f"saved to {path}" and lines[-2].startswith("batch 1: K3 decodes ")
    for needle in ("one decode step of each layer", "per-token decode time", "the measured layers on a GPU roofline", "H200", "B300",
                   "6.24x", "880 idle experts", "peak resident memory"):
        assert needle in out, needle


# ---------------------------------------------------------------------------- batches, CPU time, load


def test_batches_are_parsed_and_bounded():
    from sim.measure import parse_batches

    assert parse_batches("64, 1,8,8", quick=True) == (1, 8, 64) and parse_batches(None, quick=False) == (1,)
    for text, quick, message in [("a", False, "comma-separated whole numbers like 1,8,64"),
                                 ("0", False, "between 1 and 1,024"), ("128", True, "between 1 and 64 with --quick")]:
        with pytest.raises(ValueError, match=message):
            parse_batches(text, quick)


def test_the_dtype_is_bf16_where_the_cpu_has_bf16_instructions(monkeypatch):
    import sim.measure.measurement as M

    cpu = torch.device("cpu")
    monkeypatch.setattr(M, "cpu_bf16", lambda: "amx_bf16")
    assert M.parse_dtype(None, cpu) == ("bfloat16", "this CPU has bf16 instructions (amx_bf16)")
    monkeypatch.setattr(M, "cpu_bf16", lambda: None)
    name, why = M.parse_dtype(None, cpu)
    assert name == "float32" and "no bf16 instructions" in why and "emulated" in why
    assert M.parse_dtype("bfloat16", cpu) == ("bfloat16", "asked for (--dtype)")


@pytest.fixture(scope="module")
def batch_run():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return measure(TOKENS, tiny=True, quick=True, dtype="float32", batches=(1, 4), load=0.0)
    finally:
        torch.set_num_threads(before)


def test_each_batch_is_composed_from_its_own_steps(batch_run):
    from sim.costs import expected_experts_touched
    from sim.measure.layers import rows_per_expert

    m = batch_run
    s, c = m.seconds, widths(tiny=True).k3
    assert m.batches == (1, 4) and set(m.cpu_seconds) == set(s)
    for t in TOKENS:
        hybrid = 69 * s["kda#4"] + 24 * s[f"mla@{t}#4"] + 92 * s["moe#4"] + s["dense#4"] + s["head#4"]
        assert m.per_token("k3", t, 4) == pytest.approx(hybrid, rel=1e-12)
        assert m.speedup(t, batch=4) == pytest.approx(m.per_token("twin", t, 4) / hybrid, rel=1e-12)
    # the MoE at batch 4: the shell on 4 tokens + the experts 4 tokens touch, each on its share of the rows
    r = rows_per_expert(c, 4)
    lo = max(1, int(r))
    group = s[f"moe-experts{lo}#4"] + (r - lo) * (s[f"moe-experts{lo + 1}#4"] - s[f"moe-experts{lo}#4"])
    touched = expected_experts_touched(c.num_experts, c.top_k, 4)
    assert s["moe#4"] == pytest.approx(s["moe-shell#4"] + touched / c.top_k * group, rel=1e-12)
    assert r == pytest.approx(4 * 16 / touched) and 1 <= r < 1.1
    with pytest.raises(ValueError, match="batch 8 was not measured; measured: 1, 4"):
        m.per_token("k3", TOKENS[0], 8)


def test_a_loaded_machine_gives_no_ratio(batch_run):
    m = dataclasses.replace(batch_run, load_at_start=1.5 * (batch_run.cpus or 2), cpus=batch_run.cpus or 2)
    assert "load average" in m.distrust()
    assert last_line(m).startswith("measured on cpu: too loaded to trust a ratio (load average ")
    assert not re.search(r"\d\.\d\dx faster", last_line(m))
    starved = dataclasses.replace(batch_run, cpu_seconds={k: v * 0.1 for k, v in batch_run.seconds.items()})
    assert "CPU time" in starved.distrust() and starved.busy == pytest.approx(0.1)
    quiet = dataclasses.replace(batch_run, cpu_seconds=dict(batch_run.seconds))
    assert quiet.distrust() is None and last_line(quiet).startswith("measured on cpu: K3 decodes ")


def test_the_cli_prints_one_line_per_batch_then_the_last_line():
    code, out = run_cli("--tiny", "--quick", "--tokens", "16", "--batch", "1,2", "--dtype", "float32")
    assert code == 0, out
    lines = out.rstrip().splitlines()
    assert re.fullmatch(r"measured on cpu: K3 decodes \d+\.\d\dx faster than its all-MLA twin at 16 tokens "
                        r"\(bandwidth model: \d+\.\d\dx; reported: up to 6\.3x\)", lines[-1]), lines[-1]
    assert [line.split(":")[0] for line in lines[-3:-1]] == ["batch 1", "batch 2"]
    assert "per batch" in out and "float32: asked for (--dtype)" in out and "load average" in out
    code, out = run_cli("--batch", "0")
    assert code == 2 and out.strip().startswith("error: --batch must lie between 1 and")
