"""A checkpoint's own tokenizer (tiny_k3.tokenizer.CheckpointTokenizer) and `sim real --tokenizer`.

A tiny tiktoken.model is written by the test (the 256 bytes and a few merges), with a tokenizer_config.json
naming BOS and EOS: nothing is downloaded. tiktoken's encoding is checked against a naive BPE written here
(pre-tokenize with the Kimi pattern, then merge the lowest-ranked adjacent pair until none is left), and the
streamed run with that tokenizer against a Simulation over the same TinyK3 with the same tokenizer.
"""

import json

import numpy as np
import pytest
import regex

from sim import runfile
from sim import session as session_module
from sim.__main__ import main
from sim.real import RealSimulation, choose_tokenizer
from sim.real_synthetic import write_synthetic_release
from sim.session import Simulation
from tiny_k3.tokenizer import (BYTES, KIMI_PATTERN, RESERVED_SPECIAL, CheckpointTokenizer, bytes_label, read_ranks,
                               token_text, write_ranks)

pytest.importorskip("tiktoken")

MERGES = [b"th", b"he", b" t", b"the", b" the", b"at", b" c", b" cat", b"=3", b";a", b"\xe4\xb8"]
TEXTS = ["the cat sat", "a=3;a=3; the the", "The CAT's hat", "中文 and   spaces\n\nnew", "[BOS] is text", "é ü 42 1234"]


def write_tokenizer(folder, merges=MERGES, bos="[BOS]"):
    ranks = {bytes([b]): b for b in range(256)}
    for m in merges:
        ranks[m] = len(ranks)
    write_ranks(ranks, folder / "tiktoken.model")
    base = len(ranks)
    config = {"added_tokens_decoder": {str(base): {"content": "[BOS]"}, str(base + 1): {"content": "[EOS]"}},
              "bos_token": bos, "eos_token": {"content": "[EOS]"}}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return ranks


def naive_bpe(text: str, ranks: dict[bytes, int]) -> list[int]:
    """The definition: split with the pre-tokenizer, then in each piece merge the adjacent pair whose join has
    the lowest rank, until no adjacent pair is a token."""
    out = []
    for piece in regex.findall(KIMI_PATTERN, text, flags=regex.V1):
        parts = [bytes([b]) for b in piece.encode()]
        while True:
            pairs = [(ranks[a + b], i) for i, (a, b) in enumerate(zip(parts, parts[1:])) if a + b in ranks]
            if not pairs:
                break
            _, i = min(pairs)
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        out.extend(ranks[p] for p in parts)
    return out


@pytest.fixture
def tok_folder(tmp_path):
    ranks = write_tokenizer(tmp_path)
    return tmp_path, ranks


def test_encode_is_the_bpe_definition_and_decode_gives_the_text_back(tok_folder):
    folder, ranks = tok_folder
    tok = CheckpointTokenizer(folder)
    assert tok.num_tokens == len(ranks) + RESERVED_SPECIAL
    for text in TEXTS:
        ids = tok.encode(text, bos=False)
        assert ids == naive_bpe(text, ranks), text
        assert tok.decode(tok.encode(text)) == text                  # BOS dropped, everything else back
    assert tok.encode("the cat", bos=False) == [ranks[b"the"], ranks[b" cat"]]   # merges really happened
    assert len(tok.encode("the cat", bos=False)) < len("the cat")


def test_specials_come_from_tokenizer_config_and_never_from_text(tok_folder):
    folder, ranks = tok_folder
    tok = CheckpointTokenizer(folder)
    base = len(ranks)
    assert (tok.bos, tok.eos) == (base, base + 1)
    assert tok.encode("x")[0] == base and tok.token_text(base) == "[BOS]"
    assert tok.token_text(base + 7) == f"<|reserved_token_{base + 7}|>"       # unnamed specials, as released
    assert base not in tok.encode("[BOS]", bos=False)                         # typed text stays text
    assert tok.token_bytes(base) is None and tok.token_bytes(ranks[b" the"]) == b" the"


def test_labels_show_spaces_escapes_and_partial_utf8():
    assert bytes_label(b" the") == "␣the"
    assert bytes_label(b"a\n") == "a\\n"
    assert bytes_label(b"\xe4\xb8") == "<0xE4 0xB8>"                          # half of a character
    assert bytes_label("中".encode()) == "中"
    assert [token_text(i) for i in (32, 10, 65, 200, 256, 257)] == ["␣", "\\n", "A", "<0xC8>", "<bos>", "<eos>"]
    assert [BYTES.token_text(i) for i in BYTES.encode("a b")] == ["<bos>", "a", "␣", "b"]


def test_bad_tokenizer_files_are_named(tmp_path):
    with pytest.raises(ValueError, match="has no tiktoken.model and no tokenizer_config.json"):
        CheckpointTokenizer(tmp_path)
    (tmp_path / "tiktoken.model").write_text("YQ== 0\n")                  # only "a"
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ValueError, match="lacks 255 of the 256 single bytes"):
        CheckpointTokenizer(tmp_path)
    (tmp_path / "tiktoken.model").write_text("not base64 at all!\n")
    with pytest.raises(ValueError, match="line 1 is not '<base64 token> <rank>'"):
        read_ranks(tmp_path / "tiktoken.model")
    write_tokenizer(tmp_path, bos="<s>")
    with pytest.raises(ValueError, match="names BOS '<s>'"):
        CheckpointTokenizer(tmp_path)


def test_auto_takes_the_checkpoints_files_where_they_are_and_bytes_otherwise(tok_folder, tmp_path_factory):
    folder, _ = tok_folder
    assert isinstance(choose_tokenizer(folder, "auto"), CheckpointTokenizer)
    assert choose_tokenizer(folder, "bytes") is BYTES
    empty = tmp_path_factory.mktemp("empty")
    assert choose_tokenizer(empty, "auto") is BYTES
    with pytest.raises(ValueError, match="has no tiktoken.model"):
        choose_tokenizer(empty, "checkpoint")
    with pytest.raises(ValueError, match="--tokenizer must be auto, checkpoint or bytes"):
        choose_tokenizer(folder, "gpt2")


# ---------------------------------------------------------------------------- a streamed run with the BPE
PROMPT = "the cat=3;a"


@pytest.fixture(scope="module")
def bpe_release(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bpe-release")
    vocab = 256 + len(MERGES) + RESERVED_SPECIAL          # the embedding holds every id, specials too
    config, model, folder = write_synthetic_release(folder, vocab_size=vocab, seed=5)
    write_tokenizer(folder)
    return config, model, folder


def test_the_stream_with_the_checkpoints_tokenizer_records_what_tinyk3_records(bpe_release, monkeypatch):
    config, model, folder = bpe_release
    tok = CheckpointTokenizer(folder)
    real = RealSimulation(folder, PROMPT, tokenizer="auto")
    real.run(3)
    assert real.tokenizer.name == tok.name
    ids = tok.encode(PROMPT)
    assert [f.input_id for f in real.frames[:len(ids)]] == ids and len(ids) < len(PROMPT)
    assert all(f.input_text == tok.token_text(f.input_id) for f in real.frames)
    assert len(real._logits[0]) == tok.num_tokens == config.vocab_size      # every id is offered, not 258

    class Ref(Simulation):
        tokenizer = tok
    monkeypatch.setattr(session_module, "_build_models", lambda *a: (model, "random", None, "none"))
    ref = Ref(model.config, PROMPT, twin=False)
    ref.run(3)
    for a, b in zip(real.frames, ref.frames, strict=True):
        assert (a.input_id, a.token_id, a.input_text, a.token_text) == (b.input_id, b.token_id, b.input_text,
                                                                        b.token_text)
        for ra, rb in zip(a.routing, b.routing):
            assert np.array_equal(ra.expert_ids, rb.expert_ids)
        np.testing.assert_allclose(a.top_probs, b.top_probs, rtol=0, atol=1e-5)
    for la, lb in zip(real._logits, ref._logits):
        np.testing.assert_allclose(la, lb, rtol=0, atol=1e-5)
    assert real.text == tok.decode([f.input_id for f in real.frames] + [real.frame.token_id])


def test_the_saved_run_names_its_tokenizer_and_shows_its_tokens_as_text(bpe_release, tmp_path):
    from rich.console import Console

    _, _, folder = bpe_release
    path = tmp_path / "bpe.npz"
    console = Console(record=True, width=200)
    assert main(["real", str(folder), "--prompt", PROMPT, "--tokens", "2", "--save", str(path)], console) == 0
    out = console.export_text()
    assert "tokenizer: checkpoint (" in out and "␣cat" in out          # the table shows BPE tokens as text
    tok = CheckpointTokenizer(folder)
    saved = runfile.read(path)
    assert saved.meta["tokenizer"]["name"] == tok.name
    assert [f.input_text for f in saved.frames] == [tok.token_text(f.input_id) for f in saved.frames]
    again = RealSimulation(folder, PROMPT)
    again.run(2)
    assert all(a.same_as(b) for a, b in zip(saved.frames, again.frames, strict=True))
    console = Console(record=True, width=200)
    assert main(["real", str(folder), "--prompt", "hi", "--tokens", "0", "--tokenizer", "bytes"], console) == 0
    assert "tokenizer: bytes" in console.export_text()
