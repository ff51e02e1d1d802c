"""Hidden steps and fresh KDA mixers (data.Stage.hidden_share, Stage.fresh_kda_mixers; issue 34, attempt 13).

Invariants in float64: hiding keys from an MLA layer is exactly dropping those tokens (K3's MLA is NoPE, no conv);
the training cut hides what the evaluation's cut (recall.hide_definitions_from_mla) drops; a hidden step leaves
every MLA layer's attention as it was and trains the rest; a fresh mixer is a fresh model's; and the rows a run
reads are the same for the hybrid, its twin and `small-kda`.
"""

import dataclasses
import re

import pytest
import torch

from tiny_k3.config import K3Config
from tiny_k3.corpus import sample_corpus
from tiny_k3.data import CurriculumData, Stage, corpus_rows, curriculum_rows, definition_marks, hidden_lines, pack_lines
from tiny_k3.hooks import Hooks
from tiny_k3.kda import KDALayer
from tiny_k3.mla import GatedMLA
from tiny_k3.model import TinyK3, fresh_init
from tiny_k3.recall import edited_recall_hits, hide_definitions_from_mla, make_probes
from tiny_k3.recipes import SCAFFOLD_FIRST, binding_from
from tiny_k3.train import (_parser, adamw, curriculum_of, lm_loss, memory_kept_without_mla, refresh_kda_mixers, train,
                           train_step)

F64 = torch.float64


def test_definition_marks_are_the_probes_definitions_and_nothing_else():
    for pairs in (1, 2, 7, 26, 52):
        for probe in make_probes(6, pairs=pairs, filler_chars=16, seed=pairs):
            marks = definition_marks(probe.tokens[None])[0]
            expected = torch.zeros_like(marks)
            expected[1:probe.define_end] = True
            assert torch.equal(marks, expected), f"{pairs} pairs: marks must cover tokens[1:define_end] exactly"
    # Lines that are not recall lines define nothing: sums ("3+4=7"), copy lines, filler.
    text = sample_corpus(4000, 3, recall_share=0.0, copy_share=0.5)
    rows = pack_lines(text, 256)
    assert not definition_marks(rows.tokens).any()


def _mla_config() -> K3Config:
    return K3Config.preset("tiny").replace(dtype="float64")


def test_hidden_keys_in_an_mla_layer_are_exactly_the_tokens_dropped():
    """K3's MLA (NoPE, no conv): hiding keys from every query but their own equals running the layer without
    those tokens, at every query that is kept."""
    config = _mla_config()
    assert not config.mla_rope
    torch.manual_seed(0)
    layer = GatedMLA(config, dtype=F64).eval()
    x = torch.randn(2, 23, config.hidden_size, dtype=F64)
    hidden = torch.zeros(2, 23, dtype=torch.bool)
    hidden[0, 3:9] = True
    hidden[1, 5:7] = True
    hidden[1, 15] = True
    with torch.no_grad():
        y, _ = layer(x, hooks=Hooks(mla_hidden_keys=hidden))
        for b in range(2):
            kept = (~hidden[b]).nonzero().flatten()
            alone, _ = layer(x[b:b + 1, kept])
            torch.testing.assert_close(y[b, kept], alone[0], rtol=0, atol=1e-12)
        plain, _ = layer(x)
    assert (y[0, 9:] - plain[0, 9:]).abs().max() > 1e-6       # (the hiding did change what the queries read)
    with pytest.raises(ValueError, match=r"mla_hidden_keys must mark all 23 keys"):
        layer(x, hooks=Hooks(mla_hidden_keys=hidden[:, :20]))


def test_the_training_cut_hides_what_the_evaluation_cut_drops():
    """A whole-line forward with the definitions hidden answers as the evaluation's cut does when the model's
    only sequence mixers are MLA layers (the twin without its conv: nothing but the MLA can carry a definition)."""
    config = K3Config.preset("tiny").replace(layer_kinds=("mla",) * 4, dtype="float64")
    torch.manual_seed(1)
    model = TinyK3(config).eval()
    probes = make_probes(8, pairs=3, filler_chars=8, seed=4)
    hits = 0
    for probe in probes:
        tokens = probe.tokens[None]
        with torch.no_grad():
            logits, _ = model(tokens, hooks=Hooks(mla_hidden_keys=definition_marks(tokens)))
        at = torch.tensor(probe.answer_at)
        hits += int((logits[0, at].argmax(-1) == tokens[0, at + 1]).sum())
    assert (hits, sum(len(p.answer_at) for p in probes)) == edited_recall_hits(model, probes, hide_definitions_from_mla)


def _rows(seed: int = 2):
    return corpus_rows(3, 96, seed, hidden_lines(Stage(seq_len=96, batch=3)), answer_weight=10.0)


def test_a_hidden_step_trains_everything_but_the_mla_attention_and_hides_the_definitions():
    config = K3Config.preset("tiny")
    torch.manual_seed(0)
    model = TinyK3(config)
    opt = adamw(model, 1e-2, 0.1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rows = _rows()
    with torch.no_grad():
        hidden_loss, plain_loss = lm_loss(model, rows, hide_definitions=True), lm_loss(model, rows)
    assert abs(hidden_loss.item() - plain_loss.item()) > 1e-6
    loss = train_step(model, opt, rows, 1.0, True, 0, hide_definitions=True)
    assert abs(loss - hidden_loss.item()) < 1e-5
    for name, p in model.named_parameters():
        block = int(name.split(".")[1]) if name.startswith("blocks.") else None
        in_mla = block is not None and config.layer_kinds[block] == "mla" and name.split(".")[2] == "attn"
        moved = not torch.equal(p, before[name])
        assert p.requires_grad, f"{name} must train again after the hidden step"
        if in_mla:
            assert not moved, f"{name} is MLA attention: a hidden step must leave it as it was"
    assert not torch.equal(model.blocks[0].attn.q_proj.weight, before["blocks.0.attn.q_proj.weight"])
    assert not torch.equal(model.lm_head.weight, before["lm_head.weight"])


def test_a_fresh_mixer_is_a_fresh_models_and_its_moments_are_cleared():
    config = K3Config.preset("tiny")
    torch.manual_seed(0)
    model = TinyK3(config)
    opt = adamw(model, 1e-2, 0.1)
    train_step(model, opt, _rows(), 1.0, True, 0)
    others = {n: p.detach().clone() for n, p in model.named_parameters() if not n.startswith("blocks.0.attn.")}
    refresh_kda_mixers(model, (0,), 7, opt)
    torch.manual_seed(7)
    fresh = fresh_init(KDALayer(config), config)
    for (name, p), q in zip(model.blocks[0].attn.named_parameters(), fresh.parameters()):
        assert torch.equal(p, q), f"blocks.0.attn.{name} must equal a fresh layer's"
        moments = [m for m in opt.state.get(p, {}).values() if m.shape == p.shape]
        assert all(not m.any() for m in moments), f"blocks.0.attn.{name} must start with zero Adam moments"
    for n, p in model.named_parameters():
        if n in others:
            assert torch.equal(p, others[n]), f"{n} is not layer 0's mixer and must stay"
    assert any(opt.state[p]["exp_avg"].any() for p in model.blocks[1].attn.parameters())
    mla = config.mla_layers[0]
    with pytest.raises(ValueError, match=rf"fresh_kda_mixers names layer {mla}, a mla layer"):
        refresh_kda_mixers(model, (mla,), 7, opt)


def test_fresh_heads_re_initialise_their_own_parts_only():
    """Head 1 of layer 0: its rows of q, k, v, the convs, the gates and beta, its columns of the output projection,
    a fresh layer's; head 0 and what the heads share (the gate's low-rank input, the output norm) stay."""
    config = K3Config.preset("tiny")
    H, K = config.kda_heads, config.kda_head_dim
    torch.manual_seed(0)
    model = TinyK3(config)
    opt = adamw(model, 1e-2, 0.1)
    train_step(model, opt, _rows(), 1.0, True, 0)
    mixer = model.blocks[0].attn
    before = {n: p.detach().clone() for n, p in mixer.named_parameters()}
    refresh_kda_mixers(model, (0,), 7, opt, heads=(1,))
    torch.manual_seed(7)
    fresh = dict(fresh_init(KDALayer(config), config).named_parameters())
    mine, theirs = slice(K, 2 * K), slice(0, K)
    for name, p in mixer.named_parameters():
        if name.startswith("o_proj"):
            assert torch.equal(p[:, mine], fresh[name][:, mine]) and torch.equal(p[:, theirs], before[name][:, theirs])
        elif p.shape[0] == H * K:
            assert torch.equal(p[mine], fresh[name][mine]), f"{name}: head 1's rows must be fresh"
            assert torch.equal(p[theirs], before[name][theirs]), f"{name}: head 0's rows must stay"
            assert not opt.state[p]["exp_avg"][mine].any() and opt.state[p]["exp_avg"][theirs].any()
        elif p.shape[0] == H:
            assert torch.equal(p[1], fresh[name][1]) and torch.equal(p[0], before[name][0]), name
        else:
            assert torch.equal(p, before[name]), f"{name} is shared by the heads and must stay"
    with pytest.raises(ValueError, match=rf"fresh_kda_heads names heads \[{H}\]; a KDA layer here has heads 0 to {H - 1}"):
        refresh_kda_mixers(model, (0,), 7, opt, heads=(H,))


def test_curriculum_data_reads_the_same_rows_as_the_stages_where_nothing_is_hidden():
    stages = (Stage(max_filler=0, seq_len=64, batch=3), Stage(max_filler=64, seq_len=96, batch=2))
    data, plain = CurriculumData(9, 5, stages), curriculum_rows(9, 5, stages)
    for step in range(9):
        at = data.at(step)
        stage, i = (0, step) if step < 5 else (1, step - 5)
        batch = stages[stage].batch
        assert (at.stage, at.first, at.hidden) == (stage, i == 0, False)
        assert torch.equal(at.rows.tokens, plain[stage].tokens[i * batch:(i + 1) * batch])


def test_hidden_steps_read_few_pair_lines_drawn_from_the_seed():
    stages = (Stage(seq_len=64, batch=2), Stage(seq_len=128, batch=3, hidden_share=0.5, max_pairs=52))
    data = CurriculumData(80, 3, stages)
    steps = [data.at(s) for s in range(80)]
    hidden = [s for s in steps if s.hidden]
    assert all(s.stage == 1 for s in hidden) and 10 < len(hidden) < 30      # about half of the second stage's 40
    for s in hidden:
        assert s.rows.tokens.shape == (3, 129)
        text = bytes(t for t in s.rows.tokens[0, 1:].tolist()).decode()
        for line in text.split("\n")[:-1]:                                  # (the last may be cut)
            if "|" in line:
                pairs = len(re.findall(r"[A-Za-z]=[0-9];", line.split("|")[0]))
                assert 1 <= pairs <= 4, f"a hidden step's line has 1-4 pairs: {line!r}"
    again = CurriculumData(80, 3, stages)
    assert all(torch.equal(a.rows.tokens, again.at(i).rows.tokens) for i, a in enumerate(steps))
    other_seed = CurriculumData(80, 4, stages)
    assert [other_seed.at(i).hidden for i in range(80)] != [s.hidden for s in steps]


def test_bind_from_is_the_scaffold_recipe_until_its_first_bound_stage():
    args = _parser().parse_args(["--curriculum", "scaffold-first", "--bind-from", "2", "--forget-share", "0.25"])
    bound = curriculum_of(args)
    assert bound == binding_from(SCAFFOLD_FIRST, 2, forget=0.25) and bound[:2] == SCAFFOLD_FIRST[:2]
    assert bound[2].fresh_kda_mixers == (0,) and not any(st.fresh_kda_mixers for st in bound[3:])
    for st, plain in zip(bound[2:], SCAFFOLD_FIRST[2:]):
        assert dataclasses.replace(st, hidden_share=0.0, forget_share=0.0, fresh_kda_mixers=()) == plain
        assert (st.hidden_share, st.forget_share) == (0.5, 0.25)
    assert binding_from(SCAFFOLD_FIRST, 5, fresh=(1, 2), hidden=0.25)[5].fresh_kda_mixers == (1, 2)
    staged = curriculum_of(_parser().parse_args(["--curriculum", "scaffold-first", "--bind-from", "2",
                                                 "--hidden-share", "0.75,0.25", "--forget-share", "0.5,1"]))
    assert [(st.hidden_share, st.forget_share) for st in staged[2:]] == [(0.75, 0.5)] + [(0.25, 1.0)] * 3
    for argv, message in ((["--bind-from", "6"], r"--bind-from must name one of the 6 stages .* got 6"),
                          (["--bind-from", "2", "--hidden-share", "0.5,1.5"], r"--hidden-share takes shares in \[0, 1\]"),
                          (["--bind-from", "2", "--forget-share", "half"], r"--forget-share takes shares in \[0, 1\]")):
        with pytest.raises(ValueError, match=message):
            curriculum_of(_parser().parse_args(["--curriculum", "scaffold-first", *argv]))


def test_forget_marks_are_dropped_for_a_model_without_mla():
    stage = Stage(seq_len=64, batch=2, recall_share=1.0, max_pairs=2, max_filler=8, forget_share=1.0)
    rows = corpus_rows(2, 64, seed=5, stage=stage)
    assert rows.forget is not None and rows.forget.any()
    kda_only = K3Config.preset("tiny").replace(name="small-kda", layer_kinds=("kda",) * 4)
    assert memory_kept_without_mla(kda_only, rows).forget is None
    assert memory_kept_without_mla(K3Config.preset("tiny"), rows) is rows


def test_a_binding_run_re_initialises_the_mixer_of_a_hybrid_only(capsys):
    stages = tuple(dataclasses.replace(st, seq_len=48, batch=2) for st in binding_from(SCAFFOLD_FIRST[2:4], 1))
    logs = []
    train(K3Config.preset("tiny"), 4, curriculum=stages, eval_every=100, progress=False, log=logs.append)
    assert any("KDA layers [0]' sequence mixers re-initialised" in line for line in logs)
    logs.clear()
    train(K3Config.preset("tiny").twin(), 4, curriculum=stages, eval_every=100, progress=False, log=logs.append)
    assert not any("re-initialised" in line for line in logs)
