"""State dropout, a training recipe (Hooks.forget_before, data.Stage.forget_share, train.CURRICULUM_FORGET).

At a marked token every KDA layer forgets its state, so what came before reaches later tokens only through
the MLA cache (and the last few tokens through the short convolution). Checked as invariants in float64.
"""

import pytest
import torch

from tiny_k3.config import K3Config
from tiny_k3.corpus import RECALL_MARK
from tiny_k3.data import Rows, Stage, corpus_rows, with_forgetting
from tiny_k3.hooks import Hooks
from tiny_k3.model import TinyK3
from tiny_k3.train import CURRICULUM, CURRICULUM_FORGET, lm_loss

F64 = torch.float64
T, MARK = 48, 12


def _model(preset: str) -> TinyK3:
    """`preset`, or `<preset>-twin` for its all-softmax twin, at random weights in float64."""
    torch.manual_seed(0)
    base, twin = preset.removesuffix("-twin"), preset.endswith("-twin")
    config = K3Config.preset(base).twin() if twin else K3Config.preset(base)
    return TinyK3(config, dtype=F64).eval()


def _tokens(seed: int) -> torch.Tensor:
    return torch.randint(3, 200, (1, T), generator=torch.Generator().manual_seed(seed))


def _forget_at(position: int) -> Hooks:
    mask = torch.zeros(1, T, dtype=torch.bool)
    mask[0, position] = True
    return Hooks(forget_before=mask)


@torch.no_grad()
def test_after_a_forgetting_token_a_kda_layer_no_longer_sees_what_came_before_its_conv_window():
    """Inputs before the mark's conv window change nothing at or after the mark; without the mark they do.

    The state is wiped, not the short conv: the writes at the mark and just after it still read the last
    W-1 inputs through the conv (Hooks.forget_before), so only inputs before those are cut off."""
    layer = _model("small-kda").blocks[0].attn
    window = layer.conv_kernel - 1
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(1, T, layer.config.hidden_size, generator=gen, dtype=F64)
    b = a.clone()
    b[0, :MARK - window] = torch.randn(MARK - window, a.shape[-1], generator=gen, dtype=F64)
    hooks = _forget_at(MARK)
    forgot_a, forgot_b = layer(a, hooks=hooks)[0], layer(b, hooks=hooks)[0]
    torch.testing.assert_close(forgot_a[0, MARK:], forgot_b[0, MARK:], rtol=0, atol=1e-9)
    assert (layer(a)[0][0, MARK:] - layer(b)[0][0, MARK:]).abs().max() > 1e-3    # the state did carry them
    torch.testing.assert_close(forgot_a[0, :MARK], layer(a)[0][0, :MARK], rtol=0, atol=1e-12)  # before: as trained


@torch.no_grad()
def test_a_model_without_kda_layers_is_unchanged_by_forgetting():
    model = _model("tiny-twin")
    tokens = _tokens(3)
    torch.testing.assert_close(model(tokens, hooks=_forget_at(MARK))[0], model(tokens)[0], rtol=0, atol=1e-12)


@torch.no_grad()
def test_the_hybrid_still_sees_the_past_through_its_mla_after_forgetting():
    model = _model("tiny")
    a, b = _tokens(4), _tokens(4).clone()
    b[0, :4] = _tokens(5)[0, :4]
    hooks = _forget_at(MARK)
    assert (model(a, hooks=hooks)[0][0, MARK:] - model(b, hooks=hooks)[0][0, MARK:]).abs().max() > 1e-3


def test_a_forget_mask_of_the_wrong_shape_is_refused_in_one_line():
    model = _model("tiny")
    with pytest.raises(ValueError, match=r"forget_before must have shape \[B, T\] = \[1, 48\]"):
        model(_tokens(0), hooks=Hooks(forget_before=torch.zeros(1, 5, dtype=torch.bool)))


def test_forgetting_marks_about_its_share_of_the_recall_marks_and_nothing_else():
    stage = Stage(max_filler=16, recall_share=1.0, max_pairs=8, seq_len=128, batch=4)
    rows = corpus_rows(64, 128, seed=3, stage=stage)
    assert rows.forget is None                                      # share 0: no mask at all
    half = with_forgetting(rows, 0.5, seed=3)
    marks = rows.tokens == ord(RECALL_MARK)
    assert not (half.forget & ~marks).any()                          # only recall marks
    assert 0.35 < half.forget.sum() / marks.sum() < 0.65
    assert torch.equal(with_forgetting(rows, 1.0, seed=3).forget, marks)
    assert torch.equal(half[2:5].forget, half.forget[2:5])          # slicing keeps the mask with its rows
    with pytest.raises(ValueError, match=r"forget_share must lie in \[0, 1\], got 1.5"):
        with_forgetting(rows, 1.5, seed=3)


def test_the_loss_changes_with_forgetting_only_where_the_model_has_kda_state():
    stage = Stage(max_filler=16, recall_share=1.0, max_pairs=8, seq_len=64, batch=2)
    rows = with_forgetting(corpus_rows(2, 64, seed=5, stage=stage), 1.0, seed=5)
    assert rows.forget.any()
    plain = Rows(rows.tokens, rows.weights)
    hybrid, twin = _model("tiny"), _model("tiny-twin")
    with torch.no_grad():
        assert abs(lm_loss(hybrid, rows).item() - lm_loss(hybrid, plain).item()) > 1e-4
        assert abs(lm_loss(twin, rows).item() - lm_loss(twin, plain).item()) < 1e-10


def test_the_forget_curriculum_is_the_shipped_one_with_state_dropout_after_its_first_stage():
    assert CURRICULUM_FORGET[0] == CURRICULUM[0]
    for forget, plain in zip(CURRICULUM_FORGET[1:], CURRICULUM[1:]):
        assert forget.forget_share == 0.5 and forget.__class__(**{**forget.__dict__, "forget_share": 0.0}) == plain
