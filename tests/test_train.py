"""The synthetic corpus, the training loop (a seconds-long smoke run on "tiny") and the shipped checkpoints."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors import safe_open

from tiny_k3 import K3Config, TinyK3
from tiny_k3.config import ConfigError
from tiny_k3.corpus import CLASSES, RECALL_MARK, sample_corpus, token_class
from tiny_k3.tokenizer import BOS
from tiny_k3.train import (EVAL_SEED, evaluate, heldout_rows, load_checkpoint, pack_lines, save_checkpoint,
                           shipped_state, train)
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
            values = dict(re.findall(r"(?:^| )([a-z]+)=(\d+);", define))
            queries = re.findall(r"([a-z]+)=(\d+);", ask)
            assert queries and all(values[k] == v for k, v in queries), line
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


def test_pack_lines_rows_start_at_line_starts():
    text = sample_corpus(10_000, 1)
    rows = pack_lines(text, 64)
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


def test_bad_training_arguments():
    with pytest.raises(ValueError, match="reserved"):
        train(K3Config.preset("tiny"), 1, EVAL_SEED, progress=False)
    with pytest.raises(ValueError, match="longer than preset"):
        train(K3Config.preset("tiny"), 1, 0, seq_len=4096, progress=False)


def test_command_line_writes_checkpoint_and_record(tmp_path, capsys):
    from tiny_k3.train import main

    argv = ["--preset", "tiny-twin", "--steps", "3", "--batch", "2", "--seq-len", "32", "--out", str(tmp_path)]
    assert main(argv) == 0
    info = json.loads((tmp_path / "tiny-twin.json").read_text())
    assert info["command"] == "python -m tiny_k3.train " + " ".join(argv)
    assert (info["seed"], info["steps"], info["tokens"]) == (0, 3, 3 * 2 * 32)
    assert info["heldout_loss"] < info["heldout_loss_fresh"] and info["curve"]["eval_step"] == [3]
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

    path.write_bytes(path.read_bytes()[:1000])            # truncated: one clear sentence, no traceback
    with pytest.raises(CheckpointError, match="corrupt"):
        load_pretrained(TinyK3, "tiny", directory=tmp_path)


SHIPPED = sorted(WEIGHTS_DIR.glob("*.safetensors"))


@pytest.mark.skipif(not SHIPPED, reason="no trained checkpoints ship yet")
def test_shipped_checkpoints_are_small_documented_and_trained():
    assert sum(p.stat().st_size for p in WEIGHTS_DIR.iterdir()) < 20e6
    names = {p.stem for p in SHIPPED}
    assert {"small", "small-twin"} <= names
    rows = heldout_rows(128)[:4]
    for path in SHIPPED:
        info = json.loads(path.with_suffix(".json").read_text())
        assert info["command"].startswith("python -m tiny_k3.train") and f"--seed {info['seed']}" in info["command"]
        assert info["steps"] > 0 and info["heldout_loss"] < info["heldout_loss_fresh"] - 2
        model = TinyK3.from_pretrained(path.stem)         # checks config, names, shapes, finiteness
        assert model.config == config_for(path.stem)
        assert evaluate(model, rows) < 2.5                 # fresh weights: about ln(512) = 6.2
