"""sim.render: every picture renders through plain Rich, with and without colour, and shows the right things.

Rendered to Console(record=True) and checked on the text: without colour the pictures fall back to glyphs
(█▀▄ chosen experts, ░▒▓█ magnitudes), so counts can be read off the text.
"""

import dataclasses

import numpy as np
import pytest
import torch
from rich.console import Console
from rich.jupyter import JupyterMixin

from sim import Simulation, render, render_cells
from sim.frame import DepthRecord, KDARecord, RoutingRecord, depth_source_names
from sim.memory import format_bytes, project_to_k3


def text_of(renderable, width=100, color_system=None) -> str:
    console = Console(record=True, width=width, color_system=color_system, force_terminal=color_system is not None)
    console.print(renderable)
    return console.export_text()


def routing(E=896, k=16, seed=0, bias_boost=None) -> RoutingRecord:
    rng = np.random.default_rng(seed)
    scores = rng.uniform(0.2, 0.8, E).astype(np.float32)
    bias = np.zeros(E, np.float32)
    if bias_boost is not None:
        bias[bias_boost] = 1.0                      # this expert wins only thanks to the bias
    ids = np.argsort(-(scores + bias), kind="stable")[:k]
    w = scores[ids] / scores[ids].sum()
    return RoutingRecord(layer=3, scores=scores, bias=bias, expert_ids=ids.astype(np.int64), weights=w)


@pytest.fixture(scope="module")
def frame():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    sim = Simulation("tiny", "ab", weights="random")
    sim.run(2)
    torch.set_num_threads(before)
    return sim.frame, sim.config


def test_expert_grid_fits_896_experts_in_8_lines_with_the_chosen_lit():
    r = routing()
    mono = text_of(render.expert_grid(r, 896)).splitlines()
    assert len(mono) == 8 and all(len(line) == 56 for line in mono)
    glyphs = "".join(mono)
    assert 2 * glyphs.count("█") + glyphs.count("▀") + glyphs.count("▄") == 16
    # cell (row, col) of expert e is (e // 56, e % 56): its line is row // 2, upper half when row is even
    e = int(r.expert_ids[0])
    assert mono[e // 56 // 2][e % 56] in ("▀█" if (e // 56) % 2 == 0 else "▄█")
    colour = text_of(render.expert_grid(r, 896, legend=True), color_system="truecolor").splitlines()
    assert len(colour) == 9 and set("".join(colour[:8])) == {"▀"}
    assert "16 of 896 experts chosen" in colour[8]


def test_expert_grid_colours_chosen_and_bias_chosen_cells_apart():
    r = routing(E=112, k=2, bias_boost=5)
    assert 5 in r.expert_ids and 5 not in np.argsort(-r.scores)[:2]
    console = Console(record=True, width=120, color_system="truecolor", force_terminal=True)
    console.print(render.expert_grid(r, legend=True))
    html = console.export_html(inline_styles=True, clear=False)
    assert "#eb50c8" in html.lower() and "#ffc428" in html.lower()     # magenta (bias) and amber (chosen)
    assert "1 chosen by the bias" in console.export_text()
    assert len(text_of(render.expert_grid(r)).splitlines()) == 1           # 112 = 56 x 2 cells = one line


def test_topk_table_lists_the_chosen_ids_in_order():
    r = routing()
    text = text_of(render.topk_table(r), width=120)
    rows = [line for line in text.splitlines() if line.startswith("│")]
    assert [int(line.split("│")[2]) for line in rows] == list(r.expert_ids)
    assert f"{r.weights[0]:.4f}" in rows[0] and "+0.0000" in rows[0]


def test_expert_load_bars_show_the_busiest_experts_first():
    load = np.zeros(896, np.int64)
    load[[7, 300, 12]] = [9, 4, 6]
    lines = text_of(render.expert_load_bars(load, top=2)).splitlines()
    assert lines[0].startswith("3 of 896 experts used · 19 routings")
    assert lines[1].split()[0] == "#7" and lines[2].split()[0] == "#12" and len(lines) == 3


def test_state_heatmap_draws_k_over_2_lines_a_legend_and_its_scale():
    S = np.linspace(-2, 3, 32 * 32, dtype=np.float32).reshape(32, 32)
    lines = text_of(render.state_heatmap(S)).splitlines()
    assert len(lines) == 18 and all(len(line.rstrip()) <= 32 for line in lines[:16])
    assert "min -2.000" in lines[16] and "max +3.000" in lines[16] and f"{np.linalg.norm(S):.3f}" in lines[16]
    scale = render_cells.robust_scale(S)
    assert lines[17].startswith(f"colour ±{scale:.3g} (99th percentile of |S|")
    assert lines[15].rstrip().endswith("█")                          # the largest |S| is the last cell
    assert len(text_of(render.state_heatmap(S), color_system="truecolor").splitlines()) == 18
    with pytest.raises(ValueError, match="one head's"):
        render.state_heatmap(np.zeros((2, 3, 3)))


def lightness(rgb) -> float:
    """CIE L* (0 black .. 100 white) of an sRGB colour: relative luminance Y, then 116 Y^(1/3) - 16."""
    c = np.asarray(rgb, dtype=np.float64) / 255.0
    lin = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    y = float(lin @ np.array([0.2126, 0.7152, 0.0722]))
    return 116.0 * np.cbrt(y) - 16.0 if y > 216 / 24389 else y * 24389 / 27


def test_the_state_scale_is_robust_and_the_map_bright_at_both_ends():
    """A heavy-tailed state, as trained ones are (most entries small, a few large): on the robust, sqrt-compressed
    scale most cells stand out from a dark background (L* 15 above Textual's #121212); on the old map, linear
    up to the largest |S|, most were near black. Both ends of the map are bright, and in different hues."""
    rng = np.random.default_rng(0)
    S = (rng.laplace(0, 0.03, (32, 32)) * (1 + 30 * (rng.random((32, 32)) > 0.995))).astype(np.float32)
    scale = render_cells.robust_scale(S)
    assert scale == pytest.approx(np.percentile(np.abs(S), 99)) and scale < 0.5 * np.abs(S).max()
    floor = lightness((18, 18, 18)) + 15
    new = [lightness(render_cells.state_colour(x, scale)) >= floor for x in S.reshape(-1)]
    cells = render_cells
    old = [lightness(cells.lerp(cells.DARK, cells.POSITIVE if x >= 0 else cells.NEGATIVE, abs(x) / np.abs(S).max()))
           >= floor for x in S.reshape(-1)]
    assert np.mean(new) >= 0.5 > np.mean(old)
    hi, lo = render_cells.state_colour(scale, scale), render_cells.state_colour(-scale, scale)
    assert lightness(hi) > 80 and lightness(lo) > 80 and hi[0] > hi[2] and lo[2] > lo[0]   # warm +, cool -
    assert render_cells.state_colour(10 * scale, scale) == hi                              # beyond the scale: clipped
    assert render_cells.robust_scale(np.zeros((4, 4))) == 1.0
    only_one = np.zeros((16, 16), np.float32)
    only_one[3, 4] = -2.0
    assert render_cells.robust_scale(only_one) == 2.0           # a percentile of 0 falls back to the largest |S|


def test_lerp_and_rgb_style_are_the_cells_colours():
    assert render_cells.lerp((0, 0, 0), (100, 200, 50), 0.5) == (50, 100, 25)
    assert render_cells.lerp((0, 0, 0), (100, 200, 50), 2.0) == (100, 200, 50)          # t is clipped to [0, 1]
    style = render_cells.rgb_style((1, 2, 3), (4, 5, 6))
    assert style.color.triplet == (1, 2, 3) and style.bgcolor.triplet == (4, 5, 6)
    assert render_cells.rgb_style((1, 2, 3)).bgcolor is None                             # the console's own


def test_decay_beta_bars_and_sparkline():
    rec = KDARecord(layer=0, state=np.zeros((2, 4, 4), np.float16), decay=np.array([[0, .5, .9, 1], [1, 1, 1, 1]], np.float32),
                    beta=np.array([0.25, 0.75], np.float32), state_norm=np.array([1.5, 2], np.float32),
                    correction_norm=np.array([0.125, 0], np.float32))
    text = text_of(render.decay_beta_bars(rec, 0))
    assert "▁▅▇█" in text and "0.250" in text and "1.5000" in text and "0.1250" in text
    with pytest.raises(ValueError, match="heads 0 to 1"):
        render.decay_beta_bars(rec, 2)
    assert render_cells.sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert render_cells.sparkline([]) == "" and render_cells.sparkline([2, 2]) == "▄▄"
    assert render_cells.bar(0.5, 4) == "██  " and render_cells.bar(1.0, 3) == "███"


def test_memory_bars_compare_hybrid_twin_and_the_k3_projection(frame):
    f, config = frame
    text = text_of(render.memory_bars(f, config), width=120)
    n = f.position + 1
    assert f"{config.name}, measured, {n} tokens" in text
    assert format_bytes(f.memory.total_bytes) in text and format_bytes(f.memory.twin_kv_bytes) in text
    assert format_bytes(project_to_k3(n).hybrid) in text and "K3 at 1M tokens" in text
    assert format_bytes(project_to_k3(1 << 20).twin) in text


def test_depth_map_has_a_row_per_depth_read_and_a_column_per_named_source(frame):
    f, config = frame
    lines = text_of(render.depth_map(f), width=120).splitlines()
    assert len(lines) == len(f.depth) + 1                            # the column names, then one row per read
    assert lines[0].split() == ["emb"] + [f"b{i}" for i in range(1, len(lines[0].split()) - 1)] + ["partial"]
    assert lines[1].strip().startswith("L0 attn") and lines[-1].strip().startswith("out")
    for line, d, names in zip(lines[1:], f.depth, f.depth_sources):
        cells = line.split()[2 if d.site != "out" else 1:]          # after the label ("L0 attn" or "out")
        seen = [c for c in cells if c != "·"]
        assert len(seen) == len(names) == d.weights.size            # a shaded cell for every weight, no more
    assert text_of(render.depth_map(f, lo=2, rows=3), width=120).splitlines()[1:] == lines[3:6]
    marked = text_of(render.depth_map(f, marks={"L1 mlp": "+0.50"}), width=120)
    assert [line for line in marked.splitlines() if "◀" in line] == [
        next(line for line in lines if line.strip().startswith("L1 mlp")) + " ◀ +0.50"]


def test_depth_source_names_follow_the_block_layout():
    """Read j comes after j sublayer outputs: blocks of B close into b1, b2, ..., the rest is the partial sum."""
    for B in (1, 2, 3):
        names = depth_source_names("block", B, 9)
        for j, row in enumerate(names):
            assert row == ("emb", *(f"b{i}" for i in range(1, j // B + 1)), *(("partial",) * (j % B > 0)))
    assert depth_source_names("full", 5, 3) == depth_source_names("block", 1, 3)
    assert depth_source_names("standard", 12, 2) == (("emb",), ("emb",))


def test_depth_map_needs_the_frames_source_names(frame):
    f, _ = frame
    with pytest.raises(ValueError, match="names the sources of 0 depth reads"):
        render.depth_map(dataclasses.replace(f, depth_sources=()))
    standard = dataclasses.replace(f, depth=tuple(DepthRecord(d.layer, d.site, np.zeros(0, np.float32), d.h_norm)
                                                  for d in f.depth))
    assert "standard residual" in text_of(render.depth_map(standard))


def test_every_picture_renders_in_jupyter_and_in_colour(frame):
    f, config = frame
    pictures = [render.expert_grid(f.routing[0]), render.topk_table(f.routing[0]),
                render.expert_load_bars(np.ones(112)), render.state_heatmap(f.kda[0].state[0]),
                render.decay_beta_bars(f.kda[0], 1), render.memory_bars(f, config), render.depth_map(f),
                render.memory_table(f, config, 10), render.crossover_line(config, 3)]
    for p in pictures:
        assert text_of(p, color_system="truecolor").strip()
        assert isinstance(p, JupyterMixin) or hasattr(p, "_repr_mimebundle_") or hasattr(p, "renderables")
