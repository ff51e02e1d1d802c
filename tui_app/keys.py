"""The colour keys of the TUI's pictures, with their numbers: `state_key` under the recurrent-state heatmap (the
diverging map of sim.render_cells.state_colour on ±robust_scale) and `weight_key` above the depth map
(sim.render_cells.weight_colour). They are part of the panels' renderables, so the terminal and textual-serve's browser page show
the same key. Without colour (a pipe) they fall back to the glyphs the pictures use then."""

from __future__ import annotations

import math

from rich.text import Text

from sim.render_cells import SHADES, ByColour, rgb_style, shade, state_colour, weight_style

WEIGHT_TICKS = (0.0, 0.05, 0.25, 0.5, 1.0)   # the depth key's numbers


def number(x: float) -> str:
    """A key's number, signed: two decimals from 0.1 to 10 (+0.31), two significant digits below (+0.078), whole
    numbers above (+12)."""
    return "0" if x == 0 else f"{x:+.0f}" if abs(x) >= 10 else f"{x:+.2f}" if abs(x) >= 0.1 else f"{x:+.2g}"


def ticks(width: int, labels: list[tuple[int, str]]) -> str:
    """Labels under the columns of a key `width` wide: the first left-aligned, the last right-aligned, the others
    centred on their column (moved right to keep a space after the one before); one that does not fit is left out."""
    last = labels[-1][1]
    right = width - len(last)                  # where the last label starts
    line = [" "] * width
    end = -2                                   # the last column used so far
    for i, (col, label) in enumerate(labels[:-1]):
        start = max(0 if i == 0 else col - len(label) // 2, end + 2)
        if start + len(label) + 1 > right:
            continue
        line[start:start + len(label)] = label
        end = start + len(label) - 1
    line[right:] = last
    return "".join(line)


def state_key(scale: float, width: int = 33) -> ByColour:
    """The state map's colour key: a strip from -scale to +scale and its numbers underneath (at ±scale, ±scale/4
    and 0: the strip is sqrt-compressed, so its quarter points are a quarter of the scale, not a half).
    Without colour: the shades ░▒▓█ of |S| and the numbers they stand for."""
    width = max(11, width | 1)          # odd: the middle cell is 0
    half = width // 2
    values = [math.copysign((abs(i - half) / half) ** 2 * scale, i - half) for i in range(width)]
    at = [(0, -scale), (half // 2, -scale / 4), (half, 0.0), (width - 1 - half // 2, scale / 4), (width - 1, scale)]
    if width < 25:
        at = [at[0], at[2], at[4]]
    labels = [number(v) for _, v in at]
    if max(map(len, labels)) > 6:          # -0.0082: without the leading zero, five labels fit 33 cells
        labels = [label.replace("0.", ".", 1) for label in labels]
    numbers = ticks(width, [(col, label) for (col, _), label in zip(at, labels)])

    def colour() -> Text:
        strip = Text(no_wrap=True, overflow="crop")
        for v in values:
            strip.append("█", rgb_style(state_colour(v, scale)))
        return Text.assemble(strip, "\n", (numbers, "dim"))

    def mono() -> Text:
        top = number(scale).lstrip("+")
        return Text(f"|S| 0 {SHADES[1:]} {top} (sqrt scale; ▒ from {number(scale / 16).lstrip('+')})",
                    no_wrap=True, overflow="crop")

    return ByColour(colour, mono)


def weight_key(width: int = 40) -> ByColour:
    """The depth map's colour key in at most `width` cells: a swatch of each of WEIGHT_TICKS with its number,
    "weight ██ 0 ██ 0.05 ██ 0.25 ██ 0.5 ██ 1" (narrower: one-cell swatches, then no word)."""
    numbers = [f"{w:g}" for w in WEIGHT_TICKS]
    body = sum(len(n) + 2 for n in numbers) + len(numbers) - 1       # "█ n" each, a space between
    cell = 2 if body + len(numbers) + len("weight ") <= width else 1
    word = body + (cell - 1) * len(numbers) + len("weight ") <= width

    def key(glyph) -> Text:
        out = Text(no_wrap=True, overflow="crop")
        if word:
            out.append("weight ", style="dim")
        for i, (w, n) in enumerate(zip(WEIGHT_TICKS, numbers)):
            out.append(" " if i else "")
            out.append(glyph(w) * cell, weight_style(w))
            out.append(f" {n}", style="dim")
        return out

    return ByColour(lambda: key(lambda w: "█"), lambda: key(shade))
