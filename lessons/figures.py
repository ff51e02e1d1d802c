"""Figure helpers for a projector: large ticks, colourbars with units, symmetric diverging maps, integer axes.

    PROJECTOR_RC                  the rcParams every lesson uses (tick labels 11 pt, nothing under 10 pt)
    heatmap(ax, data, label=...)  imshow + a colourbar naming the unit; diverging=True centres white on 0 and
                                  clips at a percentile of |data| so one outlier does not wash the rest out;
                                  empty (NaN) cells are hatched grey, never a colour of the scale
    integer_ticks(ax, "x")        integer ticks on an integer axis (tokens, layers, experts)
    bar_labels(ax, bars, fmt)     the value on top of each bar (for bars that differ by orders of magnitude)
    log_points(ax, labels, values) values on a log axis as points with their labels: a bar on a log axis starts
                                  at an arbitrary edge, so its length means nothing
    percent_ci(hits, n)           "61% [54–67 %, n = 208]": an empirical rate with its Wilson 95 % interval and
                                  sample size, the way every measured percentage in the lessons is printed
    speedup_curve(batch, grid)    t(twin) / t(K3) from sim.serving at a fixed batch, only where both models hold
                                  that batch: a curve stops where the table beside it says "n/a"
"""

from __future__ import annotations

import numpy as np

MIN_FONT_PT = 10
PROJECTOR_RC = {
    "figure.dpi": 90, "figure.figsize": (9, 3.6), "axes.grid": True, "grid.alpha": 0.3,
    "axes.spines.top": False, "axes.spines.right": False,
    "font.size": 12, "axes.titlesize": 12, "axes.labelsize": 12, "xtick.labelsize": 11, "ytick.labelsize": 11,
    "legend.fontsize": 10, "figure.titlesize": 12, "image.interpolation": "nearest",
}


def heatmap(ax, data, *, label: str, diverging: bool = False, percentile: float = 99.0, vmin=None, vmax=None,
            cmap: str | None = None, xlabel: str | None = None, ylabel: str | None = None, aspect: str = "auto",
            colorbar: bool = True):
    """Draw `data` [rows, cols] on `ax` with a colourbar labelled `label` (what a colour means, with its unit).

    diverging=True: a red-white-blue map symmetric around 0 (white = 0), limited to ±(percentile of |data|)
    unless vmin/vmax are given; values beyond the limit saturate and the colourbar shows an arrow.
    NaN cells (no value: e.g. a depth source that does not exist yet) are drawn hatched grey behind the map, so
    no colour of the scale (0, or 1 near a light end) can be mistaken for them."""
    data = np.asarray(data, dtype=np.float64)
    finite = np.abs(data[np.isfinite(data)])
    extend = "neither"
    if diverging:
        lim = float(np.percentile(finite, percentile)) if finite.size else 1.0
        lim = lim if lim > 0 else (float(finite.max()) if finite.size and finite.max() > 0 else 1.0)
        vmin, vmax = (-lim, lim) if vmin is None and vmax is None else (vmin, vmax)
        cmap = cmap or "RdBu_r"
        extend = "both" if finite.size and finite.max() > lim * (1 + 1e-9) else "neither"
    im = ax.imshow(data, cmap=cmap or "viridis", vmin=vmin, vmax=vmax, aspect=aspect, interpolation="nearest")
    ax.grid(False)
    if np.isnan(data).any():                 # imshow leaves NaN transparent: hatch what shows through
        from matplotlib.patches import Rectangle

        rows, cols = data.shape
        ax.add_patch(Rectangle((-0.5, -0.5), cols, rows, facecolor="white", edgecolor="0.6", hatch="//",
                               lw=0, zorder=-1))
        label = f"{label}\nhatched: none"
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, label=label, extend=extend, fraction=0.046, pad=0.03)
    return im


def integer_ticks(ax, axis: str = "x") -> None:
    """Only whole numbers on `axis` ("x", "y" or "both")."""
    from matplotlib.ticker import MaxNLocator

    for name in ("x", "y") if axis == "both" else (axis,):
        getattr(ax, f"{name}axis").set_major_locator(MaxNLocator(integer=True))


def bar_labels(ax, bars, fmt=lambda v: f"{v:.3g}", horizontal: bool = False) -> None:
    """Write each bar's value at its end, so bars orders of magnitude apart can still be read."""
    values = [b.get_width() if horizontal else b.get_height() for b in bars]
    ax.bar_label(bars, labels=[fmt(v) for v in values], padding=2, fontsize=MIN_FONT_PT)


def log_points(ax, labels, values, colors, fmt=lambda v: f"{v:.3g}") -> None:
    """Horizontal dot plot on a log x axis: one point per value, its label beside it, a row per label (top first).

    Bars would start at the axis's left edge, an arbitrary number on a log scale; a point's position is all a log
    axis can honestly show. The axis spans a little over a decade around the values."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0 or (values <= 0).any():
        raise ValueError(f"log_points needs positive values, got {values.tolist()}.")
    y = np.arange(len(values))[::-1]
    ax.scatter(values, y, s=120, c=colors, zorder=3)
    for v, row in zip(values, y):
        ax.annotate(fmt(v), (v, row), textcoords="offset points", xytext=(9, 0), va="center", fontsize=MIN_FONT_PT + 1)
    ax.set_xscale("log")
    ax.set_xlim(values.min() / 3, values.max() * 6)
    ax.set_ylim(-0.6, len(values) - 0.4)
    ax.set_yticks(y, labels)


def percent_ci(hits: int, n: int) -> str:
    """hits / n as a percentage with its Wilson 95 % interval and the sample size (tiny_k3.recall.wilson_interval):
    a measured rate means little without both, and near 0 % or 100 % the interval is far from symmetric."""
    from tiny_k3.recall import wilson_interval

    low, high = wilson_interval(int(hits), int(n))
    return f"{hits / n:.0%} [{100 * low:.0f}–{100 * high:.0f} %, n = {n}]"


def depth_grid(reads, block_size: int, num_layers: int):
    """AttnRes depth weights laid out by source (attnres.md §2): columns emb, b1, …, b_n, partial.

    reads: [(layer, site, weights [N])] for each depth read of one token (site "attn", "mlp" or "out").
    Before sublayer j (j outputs exist; the head's read is j = 2·num_layers) the sources are the embedding,
    j // S completed block sums and, if j % S > 0, the partial sum of the current block; the partial weight
    goes to the last column so a column always means the same source. Returns (grid [reads, cols], labels).
    """
    js = [2 * num_layers if site == "out" else 2 * layer + (site == "mlp") for layer, site, _ in reads]
    n_blocks = max(j // block_size for j in js)
    grid = np.full((len(reads), n_blocks + 2), np.nan)
    for row, ((_, _, w), j) in enumerate(zip(reads, js)):
        w = np.asarray(w, dtype=np.float64)
        completed = j // block_size
        if len(w) != 1 + completed + (j % block_size > 0):
            raise ValueError(f"a read before sublayer {j} has {len(w)} weights; block size {block_size} "
                             f"gives {1 + completed + (j % block_size > 0)}.")
        grid[row, : 1 + completed] = w[: 1 + completed]
        if j % block_size:
            grid[row, -1] = w[-1]
    return grid, ["emb"] + [f"b{n}" for n in range(1, n_blocks + 1)] + ["partial"]


def largest_fitting_context(name: str, dep: str, batch: int, hi: int = 1 << 20) -> int:
    """The longest context (tokens, at most `hi`) at which model `name` holds `batch` sequences on `dep`
    (sim.serving.serve(...).fits); 0 if it holds them at no context. Holding fewer bytes per sequence at a shorter
    context, a model that fits at T fits at every shorter one: a bisection finds the edge."""
    from sim.serving import serve

    if serve(name, dep, batch, hi).fits:
        return hi
    lo, top = 0, hi                     # fits at lo (or lo == 0), not at top
    while top - lo > 1:
        mid = (lo + top) // 2
        lo, top = (mid, top) if serve(name, dep, batch, mid).fits else (lo, mid)
    return lo


def speedup_curve(batch: int, grid, dep: str, models=("twin", "K3")):
    """t(models[0]) / t(models[1]) per decode step from sim.serving at `batch` sequences on `dep`, for the contexts
    of `grid` at which BOTH models hold that batch (the serving table's "n/a" elsewhere).

    Returns (contexts, ratios, end): end is None when the curve covers the whole grid, else (the longest context
    at which both hold the batch, the model that stops holding it first)."""
    from sim.serving import serve

    edges = {name: largest_fitting_context(name, dep, batch, int(max(grid))) for name in models}
    stop = min(edges.values())
    xs = [int(t) for t in grid if int(t) <= stop]
    if stop < int(max(grid)) and stop > 0 and (not xs or xs[-1] != stop):
        xs.append(stop)                 # the curve ends exactly where the batch stops fitting
    ys = [serve(models[0], dep, batch, t).step_s / serve(models[1], dep, batch, t).step_s for t in xs]
    short = min(edges, key=edges.get)
    end = None if stop >= int(max(grid)) else (stop, short)
    return np.array(xs), np.array(ys), end
