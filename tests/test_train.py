"""The synthetic corpus, the training loop (a seconds-long smoke run on "tiny") and the shipped checkpoints."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors import safe_open

from tiny_k3 import K3Config, TinyK3
from tiny_k3.config import ConfigError
from tiny_k3.corpus import CLASSES, RECALL_MARK, answer_mask, sample_corpus, token_class
from tiny_k3.data import Rows, Stage, curriculum_rows, pack_lines, stage_of
from tiny_k3.tokenizer import BOS
from tiny_k3.train import (EVAL_SEED, adamw, evaluate, heldout_rows, lm_loss, load_checkpoint, save_checkpoint,
                           shipped_state, train, train_step)
from tiny_k3.weights import WEIGHTS_DIR, CheckpointError, config_for, load_pretrained, weights_path

EQUATION = re.compile(r"^(\(\d+\+\d+\)\*\d+|\d+[-+*]\d+)=(\d+)$")


# ---------------------------------------------------------------------------- corpus
def test_corpus_is_deterministic_per_seed_and_exact_length():
    a, b, c = sample_corpus(20_000, 3), sample_corpus(20_000, 3), sample_corpus(20_000, 4)
    assert a == b and a != c
    assert len(a) == 20_000 and a.isascii()
    assert sample_corpus(5_000, 3) == a[:5_000]       # a prefix of the same stream


def test_corpus_contains_every_part_and_is_true():
    lines = sample_corpus(50_000, 0).split("\n")[:-1]   # the last line may be cut
    seen = set()
    for line in lines:
        if RECALL_MARK in line:
            seen.add("recall")
            define, ask = line.split(f" {RECALL_MARK} ")
            defined = re.findall(r"(?:^| )([a-z]+)=(\d+);", define)
            values = dict(defined)
            queries = re.findall(r"([a-z]+)=(\d+);", ask)
            assert queries and all(values[k] == v for k, v in queries), line
            # distinct single letters, single digits
            assert len(values) == len(defined) and all(len(k) == 1 and len(v) == 1 for k, v in defined), line
        elif line[0].isdigit() or line.startswith("(") and "=" in line:
            seen.add("arithmetic")
            for eq in line.split(" "):
                lhs, rhs = EQUATION.match(eq).groups()
                assert eval(lhs) == int(rhs), eq           # noqa: S307 - digits and + - * ( ) only (regex)
        elif line[0] in "([{":
            seen.add("brackets")
            stack = []
            for ch in line:
                if ch in "([{":
                    stack.append(")]}"["([{".index(ch)])
                elif ch in ")]}":
                    assert stack.pop() == ch, line
            assert not stack, line
        else:
            seen.add("words")
            assert line.endswith("."), line
    assert seen == {"recall", "arithmetic", "brackets", "words"}


def test_token_classes():
    assert [CLASSES[token_class(ord(c))] for c in "7+a( ;"] == ["digit", "operator", "letter", "bracket", "space",
                                                               "other"]
    assert CLASSES[token_class(BOS)] == "other"


def test_answer_mask_marks_sums_results_and_recalled_values_only():
    text = "a=3; q=8; 2+5=7 | q=8; a=3;\n12+5=17 (1+2)*3=9\nthe cat."
    marked = "".join(c for c, m in zip(text, answer_mask(text)) if m)
    assert marked == "7" + "83" + "17" + "9"            # not the definitions a=3, q=8
    assert len(answer_mask(text)) == len(text)


def test_single_digit_sums_are_common():
    sums = re.findall(r"(?:^| )(\d)\+(\d)=(\d+)", sample_corpus(60_000, 0))
    assert len(sums) > 200 and all(int(a) + int(b) == int(c) for a, b, c in sums)


def test_curriculum_stages_grow_the_filler():
    first, second = curriculum_rows(10, seed=5, stages=(Stage(max_filler=0, batch=6), Stage(max_filler=200, batch=6)))
    assert first.tokens.shape == second.tokens.shape == (30, 257)
    def longest_gap(part: Rows) -> int:
        gaps = []
        for row in part.tokens:
            for line in bytes(row[1:].tolist()).decode().split("\n")[1:-1]:        # whole lines only
                if RECALL_MARK in line:
                    define = re.match(r"^(?:[a-z]=\d; ?)+", line).group(0)
                    gaps.append(line.index(RECALL_MARK) - len(define))
        return max(gaps)
    assert longest_gap(first) <= 2 and longest_gap(second) > 60
    assert [stage_of(s, 10, 2) for s in (0, 4, 5, 9)] == [(0, 0), (0, 4), (1, 0), (1, 4)]
    with pytest.raises(ValueError, match="past the 10 steps"):
        stage_of(10, 10, 2)


def test_pack_lines_weights_answers():
    rows = pack_lines("a=3; | a=3;\n1+2=3 4+4=8\n" * 20, 30, answer_weight=10.0)
    assert rows.weights.shape == rows.tokens.shape and (rows.weights[:, 0] == 0).all()
    row, w = bytes(rows.tokens[0, 1:].tolist()).decode(), rows.weights[0, 1:]
    assert row == "a=3; | a=3;\n1+2=3 4+4=8\na=3; |"
    assert "".join(c for c, x in zip(row, w.tolist()) if x == 10.0) == "338"   # the recalled 3, then 3 and 8
    assert set(w.tolist()) == {1.0, 10.0}


def test_weighted_loss_is_the_weighted_mean_of_cross_entropies():
    torch.manual_seed(0)
    model = TinyK3(K3Config.preset("tiny"))
    tokens = torch.randint(0, 256, (2, 9))
    weights = torch.zeros(2, 9)
    weights[1, 4] = 3.0                                   # only the prediction of tokens[1, 4] counts
    logits, _ = model(tokens[:, :-1])
    expected = torch.nn.functional.cross_entropy(logits[1, 3].float()[None], tokens[1, 4][None])
    assert torch.allclose(lm_loss(model, Rows(tokens, weights)), expected, atol=1e-6)
    plain = lm_loss(model, Rows(tokens, torch.ones(2, 9)))
    assert torch.allclose(plain, torch.nn.functional.cross_entropy(logits.float().reshape(-1, 512),
                                                                   tokens[:, 1:].reshape(-1)), atol=1e-6)


def test_pack_lines_rows_start_at_line_starts():
    text = sample_corpus(10_000, 1)
    rows = pack_lines(text, 64).tokens
    assert rows.shape[1] == 65 and (rows[:, 0] == BOS).all()
    chunks = [bytes(row[1:].tolist()).decode() for row in rows[:40]]
    for before, chunk in zip([None] + chunks, chunks):
        at = text.find(chunk)
        # a row starts at a line start, unless it continues a line longer than a whole row
        assert at == 0 or text[at - 1] == "\n" or "\n" not in before, chunk
    assert len(rows) >= 10_000 // 64                    # only cut lines are repeated, nothing much dropped


# ---------------------------------------------------------------------------- training
@pytest.fixture(autouse=True)
def _one_thread():
    """tiny's matrices are too small to split; one thread is faster, and much faster on busy cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _smoke(bias_update=True, steps=30, seed=1):
    return train(K3Config.preset("tiny"), steps, seed, batch=4, seq_len=64, lr=1e-2, bias_update=bias_update,
                 eval_every=steps, progress=False, log=lambda msg: None)


def test_smoke_training_learns_and_moves_the_bias():
    result = _smoke()
    assert result.eval_loss[-1] < result.fresh_eval_loss - 1.0          # ln(512) = 6.24 at init
    for moe in result.model.moe_layers():
        bias = moe.router.bias
        assert bias.abs().max() > 0 and (bias.abs() <= 30 * moe.config.bias_update_rate + 1e-6).all()
    assert len(result.train_loss) == 30 and result.tokens == 30 * 4 * 64


def test_training_is_reproducible_and_bias_update_can_be_switched_off():
    a, b = _smoke(steps=4), _smoke(steps=4)
    assert a.train_loss == b.train_loss
    off = _smoke(bias_update=False, steps=4)
    assert all((moe.router.bias == 0).all() for moe in off.model.moe_layers())


def test_adamw_decays_the_matrices_only():
    model = TinyK3(K3Config.preset("tiny"))
    decayed, plain = adamw(model, lr=1e-3, weight_decay=0.1).param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert {id(p) for p in decayed["params"]} == {id(p) for p in model.parameters() if p.dim() >= 2}
    assert {id(p) for p in plain["params"]} == {id(p) for p in model.parameters() if p.dim() < 2}
    assert plain["params"] and decayed["params"]


@pytest.mark.parametrize("bias_update", [True, False])
def test_train_step_is_loss_backward_clip_step_and_the_bias_update_of_that_batch(bias_update):
    torch.manual_seed(0)
    model = TinyK3(K3Config.preset("tiny"))
    rows = curriculum_rows(4, 1, (Stage(max_filler=16, recall_share=1.0, max_pairs=4, seq_len=32, batch=2),))[0]
    twin = TinyK3(K3Config.preset("tiny"))
    twin.load_state_dict(model.state_dict())
    want = lm_loss(twin, rows)                                            # the step by hand, on a twin
    want.backward()
    torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.5)
    opt_twin = adamw(twin, 1e-2, 0.1)
    opt_twin.step()
    loads = [moe.last_load.clone() for moe in twin.moe_layers()]
    loss = train_step(model, adamw(model, 1e-2, 0.1), rows, 0.5, bias_update, step=0)
    assert loss == pytest.approx(want.item(), rel=1e-6)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    for moe, load in zip(model.moe_layers(), loads):
        torch.testing.assert_close(moe.last_load, load)
        expected = moe.config.bias_update_rate * torch.sign(load.mean() - load) if bias_update else torch.zeros_like(load)
        torch.testing.assert_close(moe.router.bias, expected, rtol=0, atol=1e-9)
    with torch.no_grad():
        model.embed.weight.fill_(float("nan"))
    with pytest.raises(ValueError, match="the loss became nan at step 8; try a smaller --lr"):
        train_step(model, adamw(model, 1e-2, 0.1), rows, 0.5, bias_update, step=7)


def test_a_fused_optimiser_step_reaches_the_weights_a_forward_without_autograd_reads():
    """torch's fused AdamW (the compiled path's, train.adamw) bumps no version counter; the caches a no-grad forward
    reads (fused.CachedWeights) must still see the step, or a compiled run logs the loss of weights long gone."""
    torch.manual_seed(0)
    config = K3Config.preset("tiny")
    model = TinyK3(config)
    rows = curriculum_rows(2, 1, (Stage(max_filler=16, recall_share=1.0, max_pairs=4, seq_len=32, batch=2),))[0]
    with torch.no_grad():
        model(rows.tokens[:, :-1])                                      # builds the caches
    from tiny_k3 import compiled

    was_on = compiled.enabled()
    compiled.enable()                                                   # train.adamw makes the fused optimiser
    try:
        opt = adamw(model, 1e-2, 0.1)
    finally:
        compiled.enable(was_on)
    assert opt.defaults["fused"]
    train_step(model, opt, rows, 1.0, True, step=0)
    fresh = TinyK3(config)
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(model(rows.tokens[:, :-1])[0], fresh(rows.tokens[:, :-1])[0], rtol=1e-5, atol=1e-5)


def test_bad_training_arguments():
    with pytest.raises(ValueError, match="reserved"):
        train(K3Config.preset("tiny"), 4, EVAL_SEED, progress=False)
    with pytest.raises(ValueError, match="longer than preset"):
        train(K3Config.preset("tiny"), 4, 0, seq_len=4096, progress=False)
    with pytest.raises(ValueError, match="at least the 4 stages"):
        train(K3Config.preset("tiny"), 3, 0, progress=False)


def test_command_line_writes_checkpoint_and_record(tmp_path, capsys):
    from tiny_k3.train import main

    argv = ["--preset", "tiny-twin", "--steps", "4", "--batch", "2", "--seq-len", "32", "--out", str(tmp_path)]
    assert main(argv) == 0
    info = json.loads((tmp_path / "tiny-twin.json").read_text())
    assert info["command"] == "python -m tiny_k3.train " + " ".join(argv)
    assert (info["seed"], info["steps"], info["tokens"]) == (0, 4, 4 * 2 * 32)
    assert info["heldout_loss"] < info["heldout_loss_fresh"] and info["curve"]["eval_step"] == [4]
    assert load_checkpoint(tmp_path / "tiny-twin.safetensors").config == K3Config.preset("tiny").twin()
    assert main(["--preset", "nope"]) == 2 and "unknown preset" in capsys.readouterr().err


# ---------------------------------------------------------------------------- checkpoints
def test_save_load_round_trip(tmp_path):
    torch.manual_seed(0)
    model = TinyK3(K3Config.preset("tiny"))
    for moe in model.moe_layers():
        moe.router.bias.normal_(0, 1e-3)                  # bfloat16 would round these steps away
    path = save_checkpoint(model, weights_path("tiny", tmp_path), {"seed": 0})
    with safe_open(str(path), framework="pt") as f:
        assert f.get_tensor("blocks.1.mlp.w1").dtype == torch.bfloat16
        assert f.get_tensor("blocks.1.mlp.router.bias").dtype == torch.float32
    model.load_state_dict(shipped_state(model))          # what the file holds, as fp32 parameters
    loaded = load_pretrained(TinyK3, "tiny", directory=tmp_path)
    tokens = torch.randint(0, 256, (2, 20))
    assert torch.equal(model(tokens)[0], loaded(tokens)[0])
    assert json.loads(path.with_suffix(".json").read_text()) == {"seed": 0}

    twin = TinyK3(K3Config.preset("tiny").twin())
    save_checkpoint(twin, weights_path("tiny-twin", tmp_path), {})
    twin.load_state_dict(shipped_state(twin))
    back = load_pretrained(TinyK3, "tiny-twin", directory=tmp_path)
    assert back.config == twin.config and torch.equal(twin(tokens)[0], back(tokens)[0])
    ablation = TinyK3(K3Config.preset("tiny").replace(residual="standard", name="tiny-standard"))
    back = load_checkpoint(save_checkpoint(ablation, tmp_path / "tiny-standard.safetensors", {}))
    assert back.config == ablation.config

    # a checkpoint written before a config field was added still loads (the field takes its default)
    from safetensors.torch import load_file, save_file
    meta = json.loads(safe_open(str(path), framework="pt").metadata()["config"])
    del meta["init_std"]
    save_file(load_file(str(path)), str(path), metadata={"config": json.dumps(meta)})
    assert torch.equal(load_pretrained(TinyK3, "tiny", directory=tmp_path)(tokens)[0], loaded(tokens)[0])
    meta["hidden_size"] = 48
    save_file(load_file(str(path)), str(path), metadata={"config": json.dumps(meta)})
    with pytest.raises(CheckpointError, match="different config"):
        load_pretrained(TinyK3, "tiny", directory=tmp_path)

    path.write_bytes(path.read_bytes()[:1000])            # truncated: one clear sentence, no traceback
    with pytest.raises(CheckpointError, match="corrupt"):
        load_pretrained(TinyK3, "tiny", directory=tmp_path)


SHIPPED = sorted(WEIGHTS_DIR.glob("*.safetensors"))


@pytest.mark.skipif(not SHIPPED, reason="no trained checkpoints ship yet")
def test_shipped_checkpoints_are_small_documented_and_trained():
    assert sum(p.stat().st_size for p in WEIGHTS_DIR.iterdir()) < 20e6
    names = {p.stem for p in SHIPPED}
    assert {"small", "small-twin", "small-kda"} <= names
    rows = heldout_rows(128)[:4]
    for path in SHIPPED:
        info = json.loads(path.with_suffix(".json").read_text())
        assert info["command"].startswith("python -m tiny_k3.train") and f"--seed {info['seed']}" in info["command"]
        assert info["steps"] > 0 and info["heldout_loss"] < info["heldout_loss_fresh"] - 2
        model = TinyK3.from_pretrained(path.stem)         # checks config, names, shapes, finiteness
        assert model.config == config_for(path.stem)
        assert evaluate(model, rows) < 2.5                 # fresh weights: about ln(512) = 6.2


def test_copy_lines_repeat_their_span_and_weigh_all_but_its_first_byte():
    import random
    from tiny_k3.corpus import copy_line
    rng = random.Random(3)
    for _ in range(50):
        line = copy_line(rng)
        span, copy = line.split(f" {RECALL_MARK} ")
        assert span == copy and 4 <= len(span) <= 24, line
        mask = answer_mask(line)
        start = len(span) + 3
        assert list(mask) == [0] * (start + 1) + [1] * (len(copy) - 1), (line, list(mask))
    text = sample_corpus(20_000, seed=1, copy_share=0.3)
    lines = text.split("\n")[:-1]
    copies = sum(bool(re.fullmatch(r"([a-z0-9]+) \| \1", line)) for line in lines)
    assert 0.2 < copies / len(lines) < 0.4, copies / len(lines)
    assert "|" not in sample_corpus(5_000, seed=1, recall_share=0.0), "no copy lines unless a stage asks"


def test_attention_logit_gain_at_init_scales_every_mla_logit_by_the_gain():
    from tiny_k3.train import scale_attention_logits_at_init
    config = K3Config.preset("tiny").twin().replace(dtype="float64")
    torch.manual_seed(0)
    model = TinyK3(config).double()
    x = torch.randn(1, 7, config.hidden_size, dtype=torch.float64)

    def logits_of(layer):
        c = config
        q = layer.project_q(x).view(1, 7, c.mla_heads, c.qk_head_dim)
        kv = layer.kv_a_proj(x)
        latent, k_rope = layer.kv_norm(kv[..., :c.kv_lora_rank]), kv[..., c.kv_lora_rank:]
        k_nope = layer.kv_b_proj(latent).view(1, 7, c.mla_heads, -1)[..., :c.qk_nope_dim]
        k = torch.cat([k_nope, k_rope[:, :, None].expand(-1, -1, c.mla_heads, -1)], -1)
        return torch.einsum("bthd,bshd->bhts", q, k)

    layer = model.blocks[0].attn
    before = logits_of(layer)
    values_before = layer.kv_b_proj.weight.view(config.mla_heads, -1, config.kv_lora_rank)[:, config.qk_nope_dim:].clone()
    scale_attention_logits_at_init(model, 4.0)
    torch.testing.assert_close(logits_of(layer), 4.0 * before, rtol=1e-12, atol=0)
    torch.testing.assert_close(layer.kv_b_proj.weight.view(config.mla_heads, -1, config.kv_lora_rank)[:, config.qk_nope_dim:],
                               values_before, rtol=0, atol=0)


@pytest.mark.skipif(not SHIPPED, reason="no trained checkpoints ship yet")
def test_the_three_shipped_checkpoints_come_from_one_recipe_the_commands_in_train_s_docstring():
    """Issue 34: one recipe for all three. Each JSON's command is train.py's docstring line for its preset (but
    for --out), and the three differ in nothing but --preset."""
    import shlex

    import tiny_k3.train as train_module

    def without_out(command: str) -> list[str]:
        words = shlex.split(command)
        i = words.index("--out")
        return words[:i] + words[i + 2:]

    documented = {line.split("--preset ")[1].split()[0]: line.strip()
                  for line in train_module.__doc__.splitlines() if line.strip().startswith("python -m tiny_k3.train")}
    commands = {}
    for name in ("small", "small-twin", "small-kda"):
        info = json.loads((WEIGHTS_DIR / f"{name}.json").read_text())
        commands[name] = without_out(info["command"])
        assert commands[name] == without_out(documented[name]), (name, info["command"], documented[name])
    plain = [[w for w in c if w != name] for name, c in commands.items()]
    assert plain[0] == plain[1] == plain[2], plain
