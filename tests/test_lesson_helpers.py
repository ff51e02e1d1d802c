"""The lessons' helpers: the prompt's right answer, the depth-weight layout, projector-readable figures, the diagram."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

LESSONS = Path(__file__).resolve().parents[1] / "lessons"
sys.path.insert(0, str(LESSONS))

import workshop  # noqa: E402  (sets the Agg backend outside a kernel)
from diagram import draw_architecture  # noqa: E402
from figures import bar_labels, depth_grid, heatmap, integer_ticks  # noqa: E402

plt = workshop.plt


@pytest.mark.parametrize("prompt, answer", [
    ("key=7; 3+4=", "7"), ("(3+4)*2=", "14"), ("k=4; m=7; the cat sees a box. | m=", "7"),
    ("a=3; q=8; b=1; the cat. | q=8; a=", "3"), ("m=1; m=5; filler | m=", "5"), ("hello", None),
    ("a=3; | z=", None), ("1+=", None),
])
def test_expected_answer(prompt, answer):
    assert workshop.expected_answer(prompt) == answer


def test_depth_grid_puts_every_source_in_its_column():
    # block size 2, 2 layers: reads before sublayers j = 0, 1, 2, 3 and the head (j = 4)
    reads = [(0, "attn", [1.0]), (0, "mlp", [0.4, 0.6]), (1, "attn", [0.3, 0.7]), (1, "mlp", [0.2, 0.3, 0.5]),
             (2, "out", [0.1, 0.2, 0.7])]
    grid, labels = depth_grid(reads, block_size=2, num_layers=2)
    assert labels == ["emb", "b1", "b2", "partial"]
    want = np.array([[1.0, np.nan, np.nan, np.nan], [0.4, np.nan, np.nan, 0.6], [0.3, 0.7, np.nan, np.nan],
                     [0.2, 0.3, np.nan, 0.5], [0.1, 0.2, 0.7, np.nan]])
    np.testing.assert_array_equal(np.isnan(grid), np.isnan(want))
    np.testing.assert_allclose(grid[~np.isnan(grid)], want[~np.isnan(want)])
    with pytest.raises(ValueError, match="has 3 weights; block size 2 gives 2"):
        depth_grid([(0, "mlp", [0.2, 0.3, 0.5])], block_size=2, num_layers=2)


def test_diverging_heatmap_is_symmetric_clipped_at_a_percentile_and_labelled():
    data = np.zeros((10, 10))
    data[0, 0] = 100.0                     # one outlier
    data[1:, :] = np.linspace(-1, 1, 90).reshape(9, 10)
    fig, ax = plt.subplots()
    im = heatmap(ax, data, label="S entry", diverging=True, percentile=95, xlabel="value", ylabel="key")
    lo, hi = im.get_clim()
    assert lo == -hi and 0.5 < hi < 2, (lo, hi)             # the outlier does not set the scale
    bar = fig.axes[-1]
    assert bar.get_ylabel() == "S entry" and ax.get_xlabel() == "value" and ax.get_ylabel() == "key"
    assert im.get_cmap().name == "RdBu_r"
    plt.close(fig)


def test_integer_ticks_and_bar_labels():
    fig, ax = plt.subplots()
    ax.plot([0, 1, 2, 3], [0.0, 0.5, 1.7, 2.9])
    integer_ticks(ax, "both")
    fig.canvas.draw()
    assert all(float(t).is_integer() for t in ax.get_xticks()) and all(float(t).is_integer() for t in ax.get_yticks())
    bars = ax.bar([0, 1], [3.0, 3000.0])
    bar_labels(ax, bars, lambda v: f"{v:g} B")
    assert [t.get_text() for t in ax.texts] == ["3 B", "3000 B"]
    bars = ax.barh([0, 1], [1.5, 2.5])
    bar_labels(ax, bars, lambda v: f"{v:g}", horizontal=True)
    assert [t.get_text() for t in ax.texts][-2:] == ["1.5", "2.5"]
    plt.close(fig)


def test_the_architecture_diagram_follows_the_config():
    from tiny_k3 import K3Config

    cfg = K3Config.preset("small")
    fig = draw_architecture(cfg)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert texts.count("KDA") == len(cfg.kda_layers) and texts.count("MLA") == len(cfg.mla_layers)
    assert texts.count("MoE") == len(cfg.moe_layers) and texts.count("S") == len(cfg.kda_layers)
    assert any(f"top-{cfg.top_k} of {cfg.num_experts}" in t for t in texts)
    assert any("KKKM" in t for t in texts)
    plt.close(fig)
