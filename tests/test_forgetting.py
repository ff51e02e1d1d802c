"""State dropout, a training recipe (Hooks.forget_before, data.Stage.forget_share / memoryless, train.CURRICULUM_FORGET,
train.LOOKUP_FIRST).

At a marked token every KDA layer forgets its state, so what came before reaches later tokens only through
the MLA cache (and the last few tokens through the short convolution). Checked as invariants in float64.
"""

import dataclasses

import pytest
import torch

from tiny_k3.config import K3Config
from tiny_k3.corpus import RECALL_MARK
from tiny_k3.data import Rows, Stage, corpus_rows, with_forgetting
from tiny_k3.hooks import FORGET_LOG_DECAY, Hooks
from tiny_k3.kda import kda_recurrent, kda_stateless
from tiny_k3.model import TinyK3
from tiny_k3.train import (ANSWERS_FIRST, CURRICULUM, CURRICULUM_FORGET, LOOKUP_FIRST, _parser, config_changes,
                           curriculum_of, lm_loss)

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


# ------------------------------------------------------------------ memoryless: forgetting before every token
def test_kda_stateless_is_the_recurrence_with_the_state_forgotten_before_every_token():
    """o_t = scale beta_t (q_t.k_t) v_t and S_T = beta_T k_T v_T^T equal kda_recurrent at g = -30 everywhere,
    whatever the state before (1e-9 in float64: e^-30 of it survives each token)."""
    gen = torch.Generator().manual_seed(7)
    B, T_, H, K = 2, 9, 3, 5
    q, k, v = (torch.randn(B, T_, H, K, generator=gen, dtype=F64) for _ in range(3))
    k = k / k.norm(dim=-1, keepdim=True)
    beta = torch.rand(B, T_, H, generator=gen, dtype=F64)
    before = torch.randn(B, H, K, K, generator=gen, dtype=F64)
    o, state = kda_stateless(q, k, v, beta)
    o_ref, state_ref = kda_recurrent(q, k, v, torch.full_like(q, FORGET_LOG_DECAY), beta, initial_state=before,
                                     output_final_state=True)
    torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-9)
    torch.testing.assert_close(state, state_ref, rtol=0, atol=1e-9)
    o_kept, _ = kda_recurrent(q, k, v, torch.full_like(q, -0.1), beta, initial_state=before)
    assert (o_kept - o).abs().max() > 1e-2                       # with a state kept, the outputs differ


@torch.no_grad()
def test_a_kda_layer_forgetting_before_every_token_takes_the_stateless_path_to_the_same_result(monkeypatch):
    """Hooks.forget_before everywhere: the layer's O(T) stateless path equals its chunk kernel at g = -30
    (forced by hiding the shortcut), and its output at t depends on the conv window alone."""
    layer = _model("small-kda").blocks[0].attn
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(1, T, layer.config.hidden_size, generator=gen, dtype=F64)
    everywhere = Hooks(forget_before=torch.ones(1, T, dtype=torch.bool))
    assert everywhere.forgets_every_token() and not _forget_at(MARK).forgets_every_token()
    fast, fast_state = layer(x, hooks=everywhere)
    monkeypatch.setattr(Hooks, "forgets_every_token", lambda self: False)
    chunked, chunked_state = layer(x, hooks=everywhere)
    torch.testing.assert_close(fast, chunked, rtol=0, atol=1e-9)
    torch.testing.assert_close(fast_state.state, chunked_state.state, rtol=0, atol=1e-9)
    monkeypatch.undo()
    window = layer.conv_kernel - 1
    far = x.clone()
    far[0, :MARK - window] = torch.randn(MARK - window, x.shape[-1], generator=gen, dtype=F64)
    torch.testing.assert_close(layer(far, hooks=everywhere)[0][0, MARK:], fast[0, MARK:], rtol=0, atol=1e-12)


def test_a_memoryless_stage_marks_every_token_and_the_lookup_first_curricula_are_built_from_the_others():
    stage = Stage(max_filler=16, recall_share=1.0, max_pairs=8, seq_len=64, batch=2, memoryless=True)
    rows = corpus_rows(3, 64, seed=4, stage=stage)
    assert rows.forget is not None and rows.forget.all() and rows.forget.shape == rows.tokens.shape
    first = LOOKUP_FIRST[0]
    assert first.memoryless and dataclasses.replace(first, memoryless=False) == ANSWERS_FIRST[0]
    assert LOOKUP_FIRST[1:] == CURRICULUM


def test_stages_cuts_a_curriculum_to_its_first_stages_and_refuses_a_count_it_does_not_have():
    assert curriculum_of(_parser().parse_args(["--curriculum", "lookup-first", "--stages", "1"])) == LOOKUP_FIRST[:1]
    assert curriculum_of(_parser().parse_args(["--curriculum", "lookup-first"])) == LOOKUP_FIRST
    with pytest.raises(ValueError, match=r"--stages must lie between 1 and the 5 stages of 'lookup-first', got 6"):
        curriculum_of(_parser().parse_args(["--curriculum", "lookup-first", "--stages", "6"]))


def test_set_changes_config_fields_read_as_json_and_names_the_fields_when_one_is_unknown():
    changes = config_changes(["mla_rope=true", 'layer_kinds=["mla","kda","kda","kda","kda","kda","kda","mla"]',
                              "mla_conv_layers=[0, 7]", "name=probe"])
    assert changes == {"mla_rope": True, "layer_kinds": ("mla",) + ("kda",) * 6 + ("mla",),
                       "mla_conv_layers": (0, 7), "name": "probe"}
    config = K3Config.preset("small").replace(**changes)
    assert config.mla_layers == [0, 7] and config.mla_rope
    with pytest.raises(ValueError, match=r"--set takes FIELD=VALUE with FIELD one of K3Config's fields \(.*mla_rope"):
        config_changes(["mla_ropes=true"])
    with pytest.raises(ValueError, match="got 'mla_rope'"):
        config_changes(["mla_rope"])
