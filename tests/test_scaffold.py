"""The scaffold that comes down (tiny_k3.scaffold) and the blind steps (data.Stage.mla_blind_share), issue 34.

Invariants in float64: silenced layers add nothing whatever their other weights; the fade reaches the identity
taps exactly; the taken-down model computes what the scaffolded one did; the twin and `small-kda` have nothing
to scaffold or blind; and a training run with the scaffold returns a model of the plain config.
"""

import dataclasses

import pytest
import torch

from tiny_k3.config import K3Config
from tiny_k3.data import BLIND_WINDOW, Rows, Stage, corpus_rows
from tiny_k3.model import TinyK3
from tiny_k3.scaffold import (Scaffold, identity_taps, layers_below_first_mla, parse_scaffold,
                              scaffold_conv_layers, scaffolded_config)
from tiny_k3.train import (CURRICULUM, LOOKUP_FIRST, SCAFFOLD_BLIND, SCAFFOLD_BLIND_FIRST, SCAFFOLD_FIRST, _parser,
                           blind_window, curriculum_of, lm_loss, main, memory_kept_without_mla, train)

F64 = torch.float64


def _config(preset: str) -> K3Config:
    base, twin = preset.removesuffix("-twin"), preset.endswith("-twin")
    return K3Config.preset(base).twin() if twin else K3Config.preset(base)


def _tokens(T: int = 40, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 200, (2, T), generator=torch.Generator().manual_seed(seed))


def _scaffolded(preset: str = "tiny") -> tuple[TinyK3, K3Config]:
    plain = _config(preset)
    torch.manual_seed(0)
    return TinyK3(scaffolded_config(plain), dtype=F64).eval(), plain


def test_only_a_hybrid_with_layers_below_its_first_mla_is_scaffolded():
    small = K3Config.preset("small")
    assert list(layers_below_first_mla(small)) == [0, 1, 2] and scaffold_conv_layers(small) == (3, 7)
    assert scaffolded_config(small).mla_conv_layers == (3, 7)
    for preset in ("small-twin", "small-kda", "tiny-twin"):
        config = _config(preset)
        assert scaffold_conv_layers(config) == () and scaffolded_config(config) == config, preset
    assert list(layers_below_first_mla(_config("small-kda"))) == []


@torch.no_grad()
def test_silenced_layers_add_nothing_whatever_their_other_weights_and_do_not_train():
    model, plain = _scaffolded()
    Scaffold().put_up(model, plain)
    tokens = _tokens()
    before, _ = model(tokens)
    for i in layers_below_first_mla(plain):
        block = model.blocks[i]
        assert not any(p.requires_grad for p in block.parameters()), f"layer {i} still trains"
        block.attn.q_proj.weight.add_(torch.randn_like(block.attn.q_proj.weight))   # anything but the outputs
        block.attn_norm.weight.mul_(3.0)
    after, _ = model(tokens)
    torch.testing.assert_close(after, before, rtol=0, atol=1e-12)
    assert all(p.requires_grad for i, b in enumerate(model.blocks) if i >= 3 for p in b.parameters())


def test_the_fade_releases_the_layers_below_and_reaches_the_identity_taps_exactly():
    model, plain = _scaffolded()
    scaffold = Scaffold(grow=2, fade=4)
    scaffold.put_up(model, plain)
    conv = model.blocks[3].attn.short_conv.weight
    start = conv.detach().clone()
    scaffold.before_step(model, plain, 1, log=lambda _: None)       # still growing: nothing changes
    assert torch.equal(conv, start) and conv.requires_grad
    scaffold.before_step(model, plain, 2, log=lambda _: None)       # released; the fade's first quarter
    assert all(p.requires_grad for p in model.blocks[0].parameters()) and not conv.requires_grad
    torch.testing.assert_close(conv.detach(), 0.75 * start + 0.25 * identity_taps(start), rtol=0, atol=1e-15)
    for step in (3, 4, 5):
        scaffold.before_step(model, plain, step, log=lambda _: None)
    assert scaffold.down_at == 5 and torch.equal(conv.detach(), identity_taps(start))


@torch.no_grad()
def test_the_taken_down_model_is_the_plain_config_and_computes_what_the_scaffolded_one_did():
    model, plain = _scaffolded()
    scaffold = Scaffold(grow=1, fade=1)
    scaffold.put_up(model, plain)
    with pytest.raises(ValueError, match="not the identity yet"):
        scaffold.take_down(model, plain)
    scaffold.before_step(model, plain, 1, log=lambda _: None)
    tokens = _tokens(seed=3)
    scaffolded_out, _ = model(tokens)
    down = scaffold.take_down(model, plain)
    assert down.config == plain and all(getattr(b.attn, "short_conv", None) is None for b in down.blocks
                                         if b.kind == "mla")
    down_out, _ = down(tokens)
    torch.testing.assert_close(down_out, scaffolded_out, rtol=0, atol=1e-12)


def test_scaffold_arguments_are_checked_in_one_line():
    assert parse_scaffold("200,100") == Scaffold(200, 100)
    for bad in ("200", "a,b", "0,100", "200,-1"):
        with pytest.raises(ValueError, match="GROW,FADE"):
            parse_scaffold(bad)
    with pytest.raises(ValueError, match="needs at least 7 steps"):
        train(_config("tiny"), 6, curriculum=CURRICULUM[:1], scaffold=Scaffold(4, 3), progress=False)


def test_a_short_run_with_the_scaffold_returns_a_model_of_the_plain_config():
    stages = tuple(dataclasses.replace(stage, batch=1, seq_len=32) for stage in SCAFFOLD_FIRST)
    result = train(_config("tiny"), 8, curriculum=stages, qk_gain=4.0, scaffold=Scaffold(2, 3), eval_every=100,
                   progress=False, log=lambda _: None)
    assert result.model.config == _config("tiny") and len(result.train_loss) == 8


def test_train_cli_refuses_a_bad_scaffold_in_one_line(tmp_path, capsys):
    assert main(["--preset", "tiny", "--steps", "2", "--scaffold", "2", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "GROW,FADE" in err


# ------------------------------------------------------------------ blind steps: the MLA sees its last keys only
def test_scaffold_first_is_two_memoryless_answer_stages_then_curriculum_and_blind_adds_blind_steps():
    assert SCAFFOLD_FIRST == (LOOKUP_FIRST[0], LOOKUP_FIRST[0], *CURRICULUM) and SCAFFOLD_FIRST[0].memoryless
    assert SCAFFOLD_BLIND[:2] == SCAFFOLD_FIRST[:2]
    for blind, plain in zip(SCAFFOLD_BLIND[2:], CURRICULUM):
        assert blind.mla_blind_share == 0.3 and dataclasses.replace(blind, mla_blind_share=0.0) == plain
    assert SCAFFOLD_BLIND_FIRST[:2] == SCAFFOLD_FIRST[:2] and SCAFFOLD_BLIND_FIRST[3:] == CURRICULUM[1:]
    assert SCAFFOLD_BLIND_FIRST[2] == dataclasses.replace(CURRICULUM[0], mla_blind_share=1.0)


def test_only_a_model_with_both_layer_kinds_is_blinded_on_about_its_share_of_steps():
    stage = Stage(mla_blind_share=0.3)
    hybrid = K3Config.preset("small")
    windows = [blind_window(hybrid, stage, 0, step) for step in range(2000)]
    assert set(windows) == {None, BLIND_WINDOW}
    assert 0.26 < windows.count(BLIND_WINDOW) / 2000 < 0.34
    assert windows == [blind_window(hybrid, stage, 0, step) for step in range(2000)]     # seeded
    assert windows != [blind_window(hybrid, stage, 1, step) for step in range(2000)]
    for other in (_config("small-twin"), _config("small-kda")):
        assert all(blind_window(other, stage, 0, step) is None for step in range(200))
    assert all(blind_window(hybrid, Stage(), 0, step) is None for step in range(200))


@torch.no_grad()
def test_a_blind_step_changes_the_hybrids_loss_and_not_a_model_without_mla():
    rows = corpus_rows(2, 96, seed=5, stage=Stage(max_filler=16, recall_share=1.0, max_pairs=8, seq_len=96, batch=2))
    torch.manual_seed(0)
    hybrid = TinyK3(_config("tiny"), dtype=F64).eval()
    kda_only = TinyK3(_config("tiny").replace(name="small-kda", layer_kinds=("kda",) * 4), dtype=F64).eval()
    assert abs(lm_loss(hybrid, rows, BLIND_WINDOW).item() - lm_loss(hybrid, rows).item()) > 1e-6
    assert abs(lm_loss(kda_only, rows, BLIND_WINDOW).item() - lm_loss(kda_only, rows).item()) < 1e-12


def test_a_batch_with_no_weighted_byte_has_loss_zero_not_nan():
    torch.manual_seed(0)
    model = TinyK3(_config("tiny"), dtype=F64).eval()
    tokens = _tokens(17)
    loss = lm_loss(model, Rows(tokens, torch.zeros(tokens.shape, dtype=F64)))
    assert torch.isfinite(loss) and loss.item() == 0.0


def test_a_memoryless_stage_keeps_the_states_of_a_model_without_mla_and_wipes_the_hybrids():
    stage = dataclasses.replace(LOOKUP_FIRST[0], seq_len=64, batch=2)
    rows = corpus_rows(2, 64, seed=5, stage=stage)
    assert rows.forget is not None and bool(rows.forget.all())
    kda_only = _config("tiny").replace(name="small-kda", layer_kinds=("kda",) * 4)
    assert memory_kept_without_mla(kda_only, rows).forget is None
    assert memory_kept_without_mla(_config("tiny"), rows) is rows
    torch.manual_seed(0)
    model = TinyK3(kda_only, dtype=F64).eval()
    with torch.no_grad():
        wiped, kept = lm_loss(model, rows), lm_loss(model, memory_kept_without_mla(kda_only, rows))
    assert abs(wiped.item() - kept.item()) > 1e-6       # the marks did wipe its states; dropping them keeps them


def test_mla_blind_share_sets_every_stage_but_the_memoryless_ones_and_checks_its_range():
    args = _parser().parse_args(["--curriculum", "scaffold-first", "--mla-blind-share", "0.3"])
    assert curriculum_of(args) == SCAFFOLD_BLIND                  # attempt 10's curriculum, by the flag
    with pytest.raises(ValueError, match=r"--mla-blind-share must lie in \[0, 1\], got 1.5"):
        curriculum_of(_parser().parse_args(["--curriculum", "scaffold-first", "--mla-blind-share", "1.5"]))
    assert curriculum_of(_parser().parse_args(["--curriculum", "scaffold-first"])) == SCAFFOLD_FIRST
