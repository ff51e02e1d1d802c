"""sim.serving: the one serving table. Cells against a hand computation from the roofline and the configs' bytes,
fitting batches at the edge of memory, the twin's definition, the bound, the crossover, bad input, and every
figure the memory panel and `python -m sim costs` print against the table."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from sim import costs, serving, serving_text
from sim.memory import cache_bytes
from sim.measure.accelerators import ACCELERATORS
from tiny_k3 import K3Config, parameter_breakdown

M = 1 << 20
K3 = K3Config.preset("k3")
H200 = next(a for a in ACCELERATORS if a.name == "H200")


@pytest.fixture(scope="module")
def table():
    return serving.speedups()


def _hand_step(config: K3Config, expert_fmt_bytes, rest_bytes_per_value: int, batch: int, context: int,
               gpus: int, bandwidth: float, flops: float) -> tuple[float, float]:
    """(t_bytes, t_flops) written out from k3_facts.md §5b and the FLOP count, with the counts from the meta model."""
    parts = parameter_breakdown(config)
    n_moe = len(config.moe_layers)
    per_expert = parts["routed_experts"] // (n_moe * config.num_experts)
    dense = (sum(parts.values()) - parts["routed_experts"] - parts["embedding"]) * rest_bytes_per_value
    touched = config.num_experts * (1 - (1 - config.top_k / config.num_experts) ** batch)
    kv = len(config.mla_layers) * (config.kv_lora_rank + config.qk_rope_dim) * 2 * context
    h, k = config.kda_heads, config.kda_head_dim
    state = len(config.kda_layers) * (h * k * k * 4 + (config.kda_conv_kernel - 1) * 3 * h * k * 2)
    # the twin keeps KDA's short conv in front of its attention: a tail of [c, k_r] and q_a per such layer, bf16
    state += len(config.mla_conv_layers) * (config.kda_conv_kernel - 1) * (
        config.kv_lora_rank + config.qk_rope_dim + config.q_lora_rank) * 2
    step_bytes = dense + n_moe * touched * expert_fmt_bytes(per_expert) + batch * (kv + 2 * state)
    idle = parts["routed_experts"] * (config.num_experts - config.top_k) // config.num_experts
    active = sum(parts.values()) - parts["embedding"] - idle
    per_token = (2 * active + len(config.mla_layers) * 2 * config.mla_heads * context
                 * (2 * config.kv_lora_rank + config.qk_rope_dim) + len(config.kda_layers) * 7 * h * k * k)
    return step_bytes / (gpus * bandwidth * 0.7), batch * per_token / (gpus * flops * 0.7)


def mxfp4(n: int) -> float:
    assert n % 32 == 0
    return n // 32 * 17


@pytest.mark.parametrize("row, model, batch, context", [("K3 against twin", "K3", 64, M), ("K3 against twin", "twin", 1, 4096),
                                                       ("K3 against K2", "K2", 64, 131072)])
def test_a_cell_equals_the_roofline_written_out_by_hand(table, row, model, batch, context):
    cell = table.cell(row, context, f"batch {batch}")
    served = cell.k3 if model == "K3" else cell.other
    config = {"K3": K3, "twin": K3.twin(), "K2": K3Config.preset("k2")}[model]
    expert = mxfp4 if model != "K2" else (lambda n: n // 32 * 18)          # K2-Thinking: INT4, a BF16 scale per 32
    t_bytes, t_flops = _hand_step(config, expert, 2, batch, context, 64, H200.bandwidth, H200.bf16_flops)
    assert served.t_bytes == pytest.approx(t_bytes, rel=1e-9)
    assert served.t_flops == pytest.approx(t_flops, rel=1e-9)
    assert served.step_s == pytest.approx(max(t_bytes, t_flops), rel=1e-9)
    assert served.bound == ("compute" if t_flops > t_bytes else "bandwidth")
    assert served.tokens_per_s_per_gpu == pytest.approx(batch / max(t_bytes, t_flops) / 64, rel=1e-9)
    assert served.per_sequence == sum(cache_bytes(config, context))


def test_every_fitting_batch_is_the_largest_that_fits(table):
    for cell in table.cells:
        dep = serving.DEPLOYMENTS[cell.column.deployment]
        for s in (cell.k3, cell.other):
            config, model = serving.models()[s.name]
            left = dep.count * dep.memory * 0.9 - model.weight_bytes
            assert s.memory_left == pytest.approx(left)
            b = s.fitting_batch
            assert b >= 1, (s.name, cell.column, cell.context)          # every named deployment holds one sequence
            assert sum(cache_bytes(config, cell.context, b)) <= left < sum(cache_bytes(config, cell.context, b + 1))
            assert s.fits == (s.batch <= b)
            if cell.column.batch is None:
                assert s.batch == b


def test_the_speed_up_is_the_throughput_ratio_and_at_equal_batch_the_latency_ratio(table):
    for cell in table.cells:
        if cell.speedup is None:
            assert not (cell.k3.fits and cell.other.fits)
            continue
        assert cell.speedup == pytest.approx(cell.k3.tokens_per_s_per_gpu / cell.other.tokens_per_s_per_gpu)
        if cell.column.batch is not None:
            assert cell.speedup == pytest.approx(cell.other.step_s / cell.k3.step_s)
    # the twin cannot hold 64 sequences of 1M on 64 H200s: no figure is printed for it
    c = table.cell("K3 against twin", "1M", "batch 64")
    assert c.other.fitting_batch < 64 and c.speedup is None


def test_the_twin_is_k3_with_every_attention_layer_k3s_own_mla():
    config, model = serving.models()["twin"]
    assert config == K3.twin() and len(config.mla_layers) == 93 and not config.kda_layers
    assert (config.hidden_size, config.mla_heads, config.kv_lora_rank) == (K3.hidden_size, K3.mla_heads, K3.kv_lora_rank)
    assert model.weight_bytes == costs.weight_bytes(config, "k3-release") < costs.weight_bytes(K3, "k3-release")
    # its 69 former-KDA layers keep KDA's short conv: a fixed tail of 3 rows of [c, k_r] and q_a (576 + 1,536), bf16
    assert model.kv_bytes_per_token == 93 * 576 * 2 and model.state_bytes == 69 * 3 * (576 + 1536) * 2
    # it reads fewer weights than K3: 69 KDA layers' weights replaced by lighter MLA layers
    k3_parts, twin_parts = parameter_breakdown(K3), parameter_breakdown(config)
    assert twin_parts["mla"] < k3_parts["kda"] + k3_parts["mla"]
    assert model.dense_bytes < serving.models()["K3"][1].dense_bytes


def test_weights_read_grow_with_the_experts_the_batch_touches(table):
    k3m = serving.models()["K3"][1]
    reads = {b: table.cell("K3 against twin", "4K", f"batch {b}").k3.weights_read for b in (1, 64)}
    for b, read in reads.items():
        touched = 896 * (1 - (1 - 16 / 896) ** b)
        assert read == pytest.approx(k3m.dense_bytes + 92 * touched * k3m.expert_bytes)
    assert reads[64] > 5 * reads[1]


def test_the_bound_is_labelled_and_no_serving_figure_of_the_twin_row_reaches_it(table):
    assert table.bound.value == 93 / 24 and table.bound.kind == "bound"
    assert table.kv_only[M] == pytest.approx(costs.kv_only_limit(
        costs.serving_model(K3), costs.serving_model(K3, kv_config=K3.twin()), M))
    assert table.kv_only[M] == pytest.approx(3.76, abs=0.01)
    twin_row = [c.speedup for c in table.cells if c.row == "K3 against twin" and c.speedup is not None]
    assert max(twin_row) < table.kv_only[M] < table.bound.value


def test_the_figures_beside_the_table(table):
    for row in serving.ROWS:
        best = max(c.speedup for c in table.cells if c.row == row and c.speedup is not None)
        assert table.closest[row].value == best < table.claim.value
    assert table.claim.value == 6.3 and "S14" in table.claim.source
    assert table.kimi_linear.value == pytest.approx(11.48 / 1.84) and "S16" in table.kimi_linear.source
    assert table.kimi_linear_model.value < 27 / 7                  # Kimi Linear's own layer-count ceiling


def test_the_crossover_is_where_k3_stops_being_slower_than_its_twin():
    for batch, same in ((1, False), (64, False), (1, True)):
        n = serving.crossover(batch, same_weights=same)
        other = "same-weights twin" if same else "twin"
        step = lambda t: serving.serve("K3", serving.FULL, batch, t).step_s / serving.serve(other, serving.FULL, batch, t).step_s  # noqa: E731
        assert step(n) <= 1 < step(n - 1)
        # one change of sign over the whole context range
        grid = [1 << p for p in range(0, 21)]
        signs = [step(t) <= 1 for t in grid]
        assert signs == sorted(signs)
    assert serving.crossover(64) < serving.crossover(1)              # batch shares the weights, not the caches
    assert serving.crossover(1, same_weights=True) < serving.crossover(1)


def test_bad_input_is_one_clear_sentence(table):
    for call, message in [(lambda: serving.serve("K3", "8xH100", 1, 4096), r"unknown deployment '8xH100'; named"),
                          (lambda: serving.serve("K4", serving.FULL, 1, 4096), r"unknown model 'K4'; served models"),
                          (lambda: serving.serve("K3", serving.FULL, 0, 4096), r"batch must be a whole number"),
                          (lambda: serving.serve("K3", serving.FULL, 1, 0), r"context must be at least 1"),
                          (lambda: serving.deployment("TPU", 8), r"unknown GPU 'TPU'"),
                          (lambda: table.cell("K3 vs K1", "1M", "batch 1"), r"no cell .* rows: K3 against twin, K3 against K2")]:
        with pytest.raises(ValueError, match=message):
            call()


def test_8xh100_and_8xh200_cannot_hold_the_release_and_the_named_recipes_can():
    release = costs.weight_bytes(K3, "k3-release")
    for gpu in ("H100", "H200"):
        assert serving.deployment(gpu, 8).usable < release
    for dep in serving.DEPLOYMENTS.values():
        assert dep.usable > release


def _figures(text: str) -> list[str]:
    return re.findall(r"(\d+\.\d\d)x", text)


def test_python_m_sim_costs_prints_only_the_tables_speed_ups(table):
    out = io.StringIO()
    serving_text.main_costs(Console(file=out, width=200, color_system=None))
    text = out.getvalue()
    allowed = table.figures()
    printed = _figures(text)
    assert printed and set(printed) <= allowed, set(printed) - allowed
    grid = text[text.index("speed-up"):]
    for c in table.cells:
        if c.speedup is not None:
            assert f"{c.speedup:.2f}x" in grid
    assert " ".join(serving_text.summary().split()) in " ".join(text.split())


def test_the_tui_memory_panel_prints_the_tables_figure(table):
    """The memory panel's one K3 ratio, twin ÷ hybrid at 1M, is the table's (a byte count, labelled as one)."""
    pytest.importorskip("textual")
    from sim import Simulation
    from sim.memory import project_to_k3
    from tui_app.panels import View, memory_table

    s = Simulation("tiny", "ab", weights="random")
    v = View(s, 1, 2, s.config.moe_layers[0], 0, None, False, -1)
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(memory_table(v.frame, s.config, 0))
    one_m = next(line for line in out.getvalue().splitlines() if "K3 at 1M" in line)
    assert _figures(one_m) == [f"{table.memory_ratio('K3 against twin', '1M'):.2f}"]
    far = project_to_k3(M)                                       # the bytes the panel's columns show
    assert table.memory_ratio("K3 against twin", "1M") == pytest.approx(far.twin / far.hybrid, rel=1e-12)
    assert serving.bytes_held_ratio(M) == table.memory_ratio("K3 against twin", "1M")


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_the_readme_and_k3_facts_quote_the_table():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = _flat((root / "README.md").read_text(encoding="utf-8"))
    assert _flat(serving_text.readme_line()) in readme
    facts = (root / "docs" / "k3_facts.md").read_text(encoding="utf-8")
    section = facts[facts.index("### 5c."):facts.index("## 6. Expert parallelism")]
    assert serving_text.markdown_table() in section                       # the table and the fitting batches, as computed
    for sentence in (serving_text.crossover_sentence(), serving_text.summary()):
        assert _flat(sentence) in _flat(section)
    t = serving.speedups()
    rows = dict(re.findall(r"^\| ([^|]+) \| (\d+\.\d\d)x \|", section, re.M))
    assert rows["bound: same weights, KV only"] == f"{t.bound.value:.2f}"
    assert rows["the bound at 1M, B → ∞"] == f"{t.kv_only[M]:.2f}"
    assert rows["bytes held at 1M"] == f"{t.memory_ratio('K3 against twin', '1M'):.2f}"
    assert rows["Kimi Linear TPOT"] == f"{t.kimi_linear.value:.2f}"
    assert rows["Kimi Linear vs its twin, this roofline"] == f"{t.kimi_linear_model.value:.2f}"
    assert rows['K3 against twin, nearest to "up to 6.3x"'] == f"{t.closest['K3 against twin'].value:.2f}"
    assert rows['K3 against K2, nearest to "up to 6.3x"'] == f"{t.closest['K3 against K2'].value:.2f}"
    # the memory crossover the section quotes (bytes held, not speed)
    k3m, twin = serving.models()["K3"][1], serving.models()["twin"][1]     # (the twin's conv tails are fixed too)
    held = -(-(k3m.state_bytes - twin.state_bytes) // (twin.kv_bytes_per_token - k3m.kv_bytes_per_token))
    assert f"smaller than the twin's from\n{held:,} tokens" in section or f"from {held:,} tokens" in _flat(section)
    assert set(re.findall(r"(\d+\.\d\d)x", section)) <= t.figures()


def test_batch_one_latency_is_shown_beside_throughput_at_the_largest_batch(table):
    line = serving_text.latency_and_throughput("1M")
    one = [table.cell("K3 against twin", "1M", "batch 1").k3, table.cell("K3 against twin", "1M", "batch 1").other,
           table.cell("K3 against K2", "1M", "batch 1").other]
    fit = [table.cell(r, "1M", f"largest fit, {serving.FULL}") for r in serving.ROWS]
    full = [fit[0].k3, fit[0].other, fit[1].other]
    assert re.findall(r"(\d+\.\d\d) ms", line) == [f"{1e3 * s.step_s:.2f}" for s in one]
    assert re.findall(r"(\d[\d,]*) \((\d[\d,]*) sequences\)", line) == [
        (f"{s.tokens_per_s_per_gpu:,.0f}", f"{s.batch:,}") for s in full]
    # the two stories: K3 is slower than K2 per token at batch 1 and serves more tokens per GPU when full
    assert one[0].step_s > one[2].step_s and full[0].tokens_per_s_per_gpu > full[2].tokens_per_s_per_gpu


def test_the_crossovers_are_bandwidth_bound_where_they_are_found():
    """The same-weights twin borrows the real twin's FLOPs; that is harmless only if the steps there are bytes-bound."""
    for batch, same in ((1, False), (64, False), (1, True)):
        n = serving.crossover(batch, same_weights=same)
        for name in ("K3", "same-weights twin" if same else "twin"):
            assert serving.serve(name, serving.FULL, batch, n).bound == "bandwidth"


def test_context_names_are_the_tables_and_anything_else_is_counted():
    assert [serving.context_name(n) for n in serving.CONTEXTS.values()] == list(serving.CONTEXTS)
    assert serving.context_name(1000) == "1,000", "a length that is no table's column is shown as a count"
