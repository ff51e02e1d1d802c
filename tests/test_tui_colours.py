"""The TUI's colour pictures can be seen: the recurrent-state heatmap and the depth map, measured on the colours
the panels really draw (the terminal and textual-serve's browser page paint the same segments).

"Visible" here: a cell's CIE lightness L* (0 black .. 100 white, computed from its sRGB colour's relative
luminance) is at least VISIBLE_DL above the panel background's. On Textual's dark background (L* about 6) a
difference of 15 is a clearly visible dark grey (#383838 on #121212); 5 or less reads as background.
"""

import io
import re

import numpy as np
from rich.console import Console

from sim import Simulation, render, render_cells
from tiny_k3.config import DEFAULT_PRESET, DEFAULT_PROMPT
from tui import TinyK3App
from tui_app.keys import WEIGHT_TICKS, number, state_key, ticks, weight_key
from tui_pilot import settle, sync

VISIBLE_DL = 15.0     # L* above the panel background for a cell to count as visible
SIZE = (160, 48)


def lightness(rgb) -> float:
    """CIE L* of an sRGB colour (0..255 channels): relative luminance Y (WCAG 2's), then L* = 116 Y^(1/3) - 16."""
    c = np.asarray(rgb, dtype=np.float64) / 255.0
    lin = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    y = float(lin @ np.array([0.2126, 0.7152, 0.0722]))
    return 116.0 * np.cbrt(y) - 16.0 if y > 216 / 24389 else y * 24389 / 27


def rgb(color) -> tuple[int, int, int]:
    t = color.get_truecolor()
    return t.red, t.green, t.blue


def half_block_cells(segments) -> list[tuple[int, int, int]]:
    """The two cells of every "▀" (upper = foreground, lower = background) among rendered segments."""
    cells = []
    for seg in segments:
        if seg.style is not None and "▀" in seg.text:
            cells += [rgb(seg.style.color), rgb(seg.style.bgcolor)] * seg.text.count("▀")
    return cells


def visible_share(cells, background) -> float:
    floor = lightness(background) + VISIBLE_DL
    return float(np.mean([lightness(c) >= floor for c in cells]))


def drawn(renderable, width: int = 80) -> list:
    console = Console(width=width, file=io.StringIO(), color_system="truecolor", force_terminal=True)
    return [seg for line in console.render_lines(renderable, console.options) for seg in line]


@sync
async def test_the_default_prompts_state_is_visible_with_its_colour_key():
    """The first screen (default preset and prompt): at least half the heatmap's cells stand out from the panel.
    The scale is robust (the 99th percentile of |S|) and sqrt-compressed, so this holds for any trained weights;
    tests/test_render.py shows the old map (linear up to the largest |S|) failing the same measure."""
    app = TinyK3App(show_timings=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        panel, view = app._panels["state"], app.view()
        background = rgb(panel.rich_style.bgcolor)
        state = view.frame.kda_for(view.kda_layer).state[view.kda_head].astype(np.float32)
        cells = half_block_cells(seg for strip in panel._lines for seg in strip)
        assert len(cells) == state.size                      # the whole heatmap is drawn, and nothing else is "▀"
        share = visible_share(cells, background)
        assert share >= 0.5, f"only {share:.0%} of the state's cells stand out from the panel"
        scale = render_cells.robust_scale(state)
        assert np.isclose(scale, np.percentile(np.abs(state), 99))
        text = panel.text
        assert number(scale) in text and number(-scale) in text and " 0 " in text  # the key's numbers

        # every head of the shipped checkpoint at this token, not only the one on screen (no twin: its weights
        # are another file), against the same background
        sim = Simulation(DEFAULT_PRESET, DEFAULT_PROMPT, weights="auto", twin=False)
        for rec in sim.frames[-1].kda:
            for h, S in enumerate(rec.state.astype(np.float32)):
                share = visible_share(half_block_cells(drawn(render.state_cells(S))), background)
                assert share >= 0.5, f"{sim.weights} weights, KDA layer {rec.layer} head {h}: only {share:.0%} visible"


@sync
async def test_the_depth_map_draws_every_real_weight_visibly_and_keys_its_colours():
    app = TinyK3App(show_timings=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        panel = app._panels["depth"]
        background = rgb(panel.rich_style.bgcolor)
        text = panel.text
        assert "weight" in text and all(f" {w:g}" in text for w in WEIGHT_TICKS)   # the key and its numbers
        assert app._panels["depth"].border_title == "Depth · AttnRes weights"
        weights = np.concatenate([d.weights for d in app.view().frame.depth if d.weights.size])
        floor = lightness(background) + VISIBLE_DL
        assert all(lightness(render_cells.weight_colour(w)) >= floor for w in weights if w >= 0.02)
        assert all(lightness(render_cells.weight_colour(w)) >= floor for w in (0.02, 0.05, 0.25, 1.0))
        # the map's cells as drawn: solid blocks, each in the colour of one of this token's weights
        rows = [strip for strip in panel._lines if re.match(r"\s*(L\d+ (attn|mlp)|out)\b", strip.text)]
        blocks = {rgb(seg.style.color) for strip in rows for seg in strip if seg.text and set(seg.text) == {"█"}}
        assert blocks and blocks <= {render_cells.weight_colour(w) for w in weights}


def test_the_state_key_spans_the_scale_with_its_numbers_and_fits_its_width():
    scale = 2.95
    console = Console(width=80, file=io.StringIO(), record=True, color_system="truecolor", force_terminal=True)
    console.print(state_key(scale))
    strip, numbers = console.export_text().splitlines()
    assert len(strip) == 33 and set(strip) == {"█"}
    assert numbers.split() == ["-2.95", "-0.74", "0", "+0.74", "+2.95"] and len(numbers) == 33
    segments = [seg for seg in drawn(state_key(scale)) if seg.text == "█"]
    colours = [rgb(seg.style.color) for seg in segments]
    assert colours[0] == render_cells.state_colour(-scale, scale)
    assert colours[-1] == render_cells.state_colour(scale, scale)
    assert colours[16] == render_cells.state_colour(0.0, scale)                   # the middle cell is 0
    assert lightness(colours[0]) > 80 and lightness(colours[-1]) > 80      # bright at both ends
    small = [line for line in Console(width=80, file=io.StringIO(), record=True, color_system="truecolor",
                                      force_terminal=True).render_lines(state_key(0.033))]
    assert "".join(seg.text for seg in small[1]).split() == ["-.033", "-.0083", "0", "+.0083", "+.033"]
    assert ticks(21, [(0, "-0.31"), (10, "0"), (20, "+0.31")]) == "-0.31     0     +0.31"
    plain = Console(width=80, file=io.StringIO(), record=True, color_system=None)
    plain.print(state_key(scale), weight_key(40))
    assert plain.export_text().splitlines() == ["|S| 0 ░▒▓█ 2.95 (sqrt scale; ▒ from 0.18)",
                                                "weight    0 ░░ 0.05 ▒▒ 0.25 ▓▓ 0.5 ██ 1"]
