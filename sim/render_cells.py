"""The colours and glyphs sim.render's pictures are drawn with: colour constants and maps (the state's diverging
map on a robust scale, the depth weights' green ramp), half-block cells, shades, sparklines and bars, and
ByColour, which draws a picture in colour or, on a console without colour, in glyphs that carry the same point.
Pure functions of numbers: no Frame, no model."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from rich.color import Color
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.jupyter import JupyterMixin
from rich.measure import Measurement
from rich.style import Style
from rich.text import Text

SPARK = "▁▂▃▄▅▆▇█"
SHADES = " ░▒▓█"
EIGHTHS = " ▏▎▍▌▋▊▉█"

DARK = (28, 30, 40)            # an empty or zero cell
SCORE_HIGH = (70, 130, 220)    # an unchosen expert with the highest score
CHOSEN = (255, 196, 40)        # a chosen expert
BIAS_CHOSEN = (235, 80, 200)   # chosen thanks to the selection bias (not in the top-k of the raw scores)
POSITIVE = (235, 70, 50)
NEGATIVE = (60, 130, 240)
WEIGHT_HIGH = (80, 220, 120)

RGB = tuple[int, int, int]


# ---------------------------------------------------------------------------- building blocks


class ByColour(JupyterMixin):
    """Draw `colour()` on a console with colours and `mono()` on one without (a pipe, NO_COLOR, a test)."""

    def __init__(self, colour: Callable[[], RenderableType], mono: Callable[[], RenderableType]):
        self.colour, self.mono = colour, mono

    def _pick(self, console: Console) -> RenderableType:
        return self.colour() if console.color_system else self.mono()

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self._pick(console)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self._pick(console))


def lerp(a: RGB, b: RGB, t: float) -> RGB:
    """The colour a fraction t of the way from a to b (t clipped to [0, 1])."""
    t = min(max(float(t), 0.0), 1.0)
    return tuple(round(x + (y - x) * t) for x, y in zip(a, b))


def rgb_style(fg: RGB | None, bg: RGB | None = None) -> Style:
    """A rich Style of RGB colours: foreground `fg`, background `bg` (None: the console's own)."""
    return Style(color=None if fg is None else Color.from_rgb(*fg), bgcolor=None if bg is None else Color.from_rgb(*bg))


def half_blocks(cells: list[list[RGB | None]]) -> Text:
    """Rows of RGB cells (None = empty) -> Text with two cell rows per line ("▀": fg upper, bg lower)."""
    out = Text(no_wrap=True, overflow="crop")
    for r in range(0, len(cells), 2):
        upper, lower = cells[r], cells[r + 1] if r + 1 < len(cells) else [None] * len(cells[r])
        if r:
            out.append("\n")
        for u, lo in zip(upper, lower):
            if u is None and lo is None:
                out.append(" ")
            elif u is None:
                out.append("▄", rgb_style(lo))
            else:
                out.append("▀", rgb_style(u, lo))
    return out


def shade(t: float) -> str:
    """A magnitude in [0, 1] as one of ' ░▒▓█' (0 stays blank only when it is exactly 0)."""
    if not t > 0:
        return SHADES[0]
    return SHADES[min(len(SHADES) - 1, 1 + int(t * (len(SHADES) - 1)))]


def sparkline(values, lo: float | None = None, hi: float | None = None) -> str:
    """One character per value, ▁ (lowest) to █ (highest), scaled to [lo, hi] (default: the values' range)."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size == 0:
        return ""
    finite = v[np.isfinite(v)]
    lo = float(finite.min()) if lo is None and finite.size else (0.0 if lo is None else lo)
    hi = float(finite.max()) if hi is None and finite.size else (1.0 if hi is None else hi)
    span = hi - lo
    out = []
    for x in v:
        if not np.isfinite(x):
            out.append(" ")
        elif span <= 0:
            out.append(SPARK[len(SPARK) // 2 - 1])
        else:
            out.append(SPARK[min(len(SPARK) - 1, max(0, round((x - lo) / span * (len(SPARK) - 1))))])
    return "".join(out)


def bar(fraction: float, width: int = 20) -> str:
    """A horizontal bar of `width` characters filled to `fraction` in eighths of a character."""
    f = min(max(float(fraction), 0.0), 1.0) if math.isfinite(fraction) else 0.0
    eighths = round(f * width * 8)
    full, part = divmod(eighths, 8)
    return ("█" * full + (EIGHTHS[part] if part else "")).ljust(width)



# ---------------------------------------------------------------------------- colour maps and their keys

# The state's diverging map: dark at 0, through red and orange to pale yellow for S > 0 and through blue to pale
# cyan for S < 0, so both ends are bright on a dark background. Stops are (t, RGB) with t = sqrt(|S| / scale).
STATE_POSITIVE = ((0.0, DARK), (0.3, (140, 45, 45)), (0.65, (235, 110, 45)), (1.0, (255, 230, 120)))
STATE_NEGATIVE = ((0.0, DARK), (0.3, (40, 70, 160)), (0.65, (45, 155, 240)), (1.0, (160, 235, 255)))
STATE_PERCENTILE = 99      # the state's colour scale: this percentile of |S| (robust to a few huge entries)
# The depth weights' map: dark at 0 through green to pale green at 1, t = sqrt(weight).
WEIGHT_RAMP = ((0.0, DARK), (0.3, (35, 100, 70)), (0.65, (70, 200, 115)), (1.0, (200, 255, 180)))


def _ramp(stops, t: float) -> RGB:
    """The colour at t in [0, 1] of a map given as (t, RGB) stops, linear between them."""
    t = min(max(float(t), 0.0), 1.0)
    for (a, ca), (b, cb) in zip(stops, stops[1:]):
        if t <= b:
            return lerp(ca, cb, (t - a) / (b - a))
    return stops[-1][1]


def robust_scale(values, percentile: float = STATE_PERCENTILE) -> float:
    """The colour scale of a picture of `values`: that percentile of |values|, so a handful of large entries do
    not turn every other cell dark (they are drawn at full colour); the largest |value| where the percentile is
    0, and 1.0 for an all-zero picture."""
    a = np.abs(np.asarray(values, dtype=np.float64)).reshape(-1)
    a = a[np.isfinite(a)]
    if not a.size:
        return 1.0
    p = float(np.percentile(a, percentile))
    return p if p > 0 else float(a.max()) if a.max() > 0 else 1.0


def state_colour(x: float, scale: float) -> RGB:
    """One state entry's colour on a symmetric scale of ±scale: sqrt-compressed, so small entries still show."""
    t = math.sqrt(min(abs(float(x)) / scale, 1.0)) if scale > 0 and math.isfinite(x) else 0.0
    return _ramp(STATE_POSITIVE if x >= 0 else STATE_NEGATIVE, t)


def weight_colour(w: float) -> RGB:
    """A depth weight in [0, 1] as a colour: dark at 0, green, pale green at 1 (sqrt-compressed, so 0.05 shows)."""
    return _ramp(WEIGHT_RAMP, math.sqrt(min(max(float(w), 0.0), 1.0)) if math.isfinite(w) else 0.0)


def weight_style(w: float) -> Style:
    """A depth weight in [0, 1] as a style (weight_colour)."""
    return rgb_style(weight_colour(w))

