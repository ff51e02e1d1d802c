"""Tokenizers: text -> ids -> labels.

- The byte-level tokenizer every preset uses: ids 0-255 are the UTF-8 bytes, then BOS and EOS. Nothing to
  download. `encode`, `decode`, `token_text` are its functions; `BYTES` is the same as an object.
- `CheckpointTokenizer`: the BPE a released K3 / Kimi checkpoint ships beside its weights (`tiktoken.model`
  and `tokenizer_config.json`), run by `tiktoken` (the optional `real` extra). Only `sim real` uses it.

Both objects answer the same five questions (`Tokenizer`): how many ids the model may be offered
(`num_tokens`), encode, decode, a printable label per id, and each id's bytes (None for a special token).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Protocol

BOS = 256
EOS = 257
NUM_BYTES = 256


def encode(text: str, bos: bool = True) -> list[int]:
    """Text -> token ids (one per UTF-8 byte), with BOS first unless bos=False."""
    ids = list(text.encode("utf-8"))
    return [BOS] + ids if bos else ids


def decode(ids: list[int]) -> str:
    """Token ids -> text; specials are dropped and broken UTF-8 shows as U+FFFD."""
    return bytes(i for i in ids if 0 <= i < NUM_BYTES).decode("utf-8", errors="replace")


def token_text(token_id: int) -> str:
    """A short, printable label for one token, e.g. 'a', '\\n', '<0xE2>', '<bos>'."""
    if token_id == BOS:
        return "<bos>"
    if token_id == EOS:
        return "<eos>"
    if not 0 <= token_id < NUM_BYTES:
        return f"<{token_id}>"
    return bytes_label(bytes([token_id]))


_SPECIAL_CHARS = {"\n": "\\n", "\t": "\\t", "\r": "\\r", " ": "␣"}


def bytes_label(piece: bytes) -> str:
    """A printable label for a token's bytes: its text with spaces as '␣' and \\n, \\t, \\r escaped, or
    '<0xE2 0x80>' where the bytes are not whole UTF-8 (a BPE token may hold part of a character)."""
    try:
        text = piece.decode("utf-8")
    except UnicodeDecodeError:
        return "<" + " ".join(f"0x{b:02X}" for b in piece) + ">"
    if any(not ch.isprintable() and ch not in _SPECIAL_CHARS for ch in text):
        return "<" + " ".join(f"0x{b:02X}" for b in piece) + ">"
    return "".join(_SPECIAL_CHARS.get(ch, ch) for ch in text)


class Tokenizer(Protocol):
    name: str               # what it is, in words (shown by `sim real` and stored in a run file)
    num_tokens: int         # ids 0..num_tokens-1 are real tokens; logits past them are never offered
    bos: int

    def encode(self, text: str, bos: bool = True) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def token_text(self, token_id: int) -> str: ...
    def token_bytes(self, token_id: int) -> bytes | None: ...


class ByteTokenizer:
    """The byte-level tokenizer above as a `Tokenizer` object."""

    name = "bytes (tiny_k3.tokenizer: 256 bytes, BOS, EOS)"
    num_tokens = EOS + 1
    bos = BOS

    def encode(self, text: str, bos: bool = True) -> list[int]:
        return encode(text, bos)

    def decode(self, ids: list[int]) -> str:
        return decode(ids)

    def token_text(self, token_id: int) -> str:
        return token_text(token_id)

    def token_bytes(self, token_id: int) -> bytes | None:
        return bytes([token_id]) if 0 <= token_id < NUM_BYTES else None


BYTES = ByteTokenizer()


# ---------------------------------------------------------------------------- a checkpoint's own BPE
# Facts from Moonshot's tokenization_kimi.py as released with Kimi K3 (huggingface.co/moonshotai/Kimi-K3; the
# same scheme as Kimi K2 and Kimi Linear): the BPE ranks are `tiktoken.model`; 256 special ids follow the
# base vocabulary (num_reserved_special_tokens), named by tokenizer_config.json's added_tokens_decoder and
# otherwise "<|reserved_token_{id}|>"; BOS "[BOS]", EOS "[EOS]"; and this pre-tokenizer (`pat_str`): Han runs,
# cased words with English contractions, up to 3 digits, punctuation runs, newlines and spaces.
KIMI_PATTERN = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
RESERVED_SPECIAL = 256
TOKENIZER_FILES = ("tiktoken.model", "tokenizer_config.json")


def read_ranks(path) -> dict[bytes, int]:
    """A tiktoken BPE file: one "<base64 token> <rank>" per line -> {token bytes: rank}.

    Read here rather than with tiktoken.load.load_tiktoken_bpe, which keeps a copy in a cache keyed by the
    file's path (a changed file at the same path would be read stale)."""
    ranks: dict[bytes, int] = {}
    for n, line in enumerate(Path(path).read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError:
            raise ValueError(f"{path} line {n} is not '<base64 token> <rank>', so it is not a tiktoken.model "
                             f"file.") from None
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise ValueError(f"{path} lacks {len(missing)} of the 256 single bytes (e.g. 0x{missing[0]:02X}); a byte-"
                         f"level BPE needs every byte as a token.")
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{path}: the ranks must be 0..{len(ranks) - 1}, each once.")
    return ranks


def write_ranks(ranks: dict[bytes, int], path) -> Path:
    """Write {token bytes: rank} as a tiktoken.model file (for synthetic checkpoints in tests and lessons)."""
    path = Path(path)
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in sorted(ranks.items(),
                                                                                         key=lambda kv: kv[1])))
    return path


def _content(entry) -> str:
    """A tokenizer_config.json token entry: a string or {"content": ...}."""
    return entry["content"] if isinstance(entry, dict) else str(entry)


class CheckpointTokenizer:
    """The BPE of a released checkpoint folder (tiktoken.model + tokenizer_config.json), run by tiktoken.

    Specials never come from the user's text: a prompt's "[BOS]" is encoded as ordinary text; only `encode`'s
    bos=True puts the BOS id first. decode drops the specials, as the byte tokenizer does."""

    def __init__(self, folder):
        folder = Path(folder)
        missing = [name for name in TOKENIZER_FILES if not (folder / name).is_file()]
        if missing:
            raise ValueError(f"{folder} has no {' and no '.join(missing)}: the checkpoint's own tokenizer needs "
                             f"both (or use --tokenizer bytes).")
        try:
            import tiktoken
        except ImportError:
            raise ValueError("the checkpoint's tokenizer needs the tiktoken package: pip install 'tiny-k3[real]' "
                             "(or use --tokenizer bytes).") from None
        ranks = read_ranks(folder / "tiktoken.model")
        try:
            config = json.loads((folder / "tokenizer_config.json").read_text())
        except ValueError as exc:
            raise ValueError(f"{folder / 'tokenizer_config.json'} is not valid JSON ({exc}).") from None
        base = len(ranks)
        named = {int(i): _content(e) for i, e in config.get("added_tokens_decoder", {}).items()}
        self.specials = {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(base, base + RESERVED_SPECIAL)}
        self._names = {i: s for s, i in self.specials.items()}
        bos = _content(config.get("bos_token") or "[BOS]")
        if bos not in self.specials:
            raise ValueError(f"tokenizer_config.json names BOS {bos!r}, which is not among its special tokens.")
        self.bos = self.specials[bos]
        eos = _content(config.get("eos_token") or "[EOS]")
        self.eos = self.specials.get(eos)
        self.encoding = tiktoken.Encoding(name=f"{folder.name}/tiktoken.model", pat_str=KIMI_PATTERN,
                                          mergeable_ranks=ranks, special_tokens=self.specials)
        self.num_tokens = self.encoding.n_vocab
        self.name = f"checkpoint ({folder.name}/tiktoken.model: {base:,} BPE tokens + {RESERVED_SPECIAL} special)"

    def encode(self, text: str, bos: bool = True) -> list[int]:
        ids = self.encoding.encode(text, disallowed_special=())     # "[BOS]" typed by a user is just text
        return [self.bos] + ids if bos else ids

    def decode(self, ids: list[int]) -> str:
        return self.encoding.decode([i for i in ids if i not in self._names])

    def token_bytes(self, token_id: int) -> bytes | None:
        if token_id in self._names or not 0 <= token_id < self.num_tokens:
            return None
        return self.encoding.decode_single_token_bytes(token_id)

    def token_text(self, token_id: int) -> str:
        if token_id in self._names:
            return self._names[token_id]
        piece = self.token_bytes(token_id)
        return f"<{token_id}>" if piece is None else bytes_label(piece)


class StoredTokenizer:
    """The labels and bytes of the ids a saved run holds (sim.runfile), standing in for the tokenizer that
    made it when that tokenizer is not here: enough to show and decode the run, not to encode new text."""

    def __init__(self, name: str, num_tokens: int, bos: int, pieces: dict[int, bytes | None],
                 labels: dict[int, str]):
        self.name, self.num_tokens, self.bos = name, num_tokens, bos
        self.pieces, self.labels = pieces, labels

    def encode(self, text: str, bos: bool = True) -> list[int]:
        raise ValueError(f"this run's tokenizer ({self.name}) is not here, so no new text can be encoded.")

    def decode(self, ids: list[int]) -> str:
        return b"".join(self.pieces.get(i) or b"" for i in ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes | None:
        return self.pieces.get(token_id)

    def token_text(self, token_id: int) -> str:
        return self.labels.get(token_id, f"<{token_id}>")
