"""Byte-level tokenizer: ids 0-255 are the UTF-8 bytes, then BOS and EOS. Nothing to download."""

from __future__ import annotations

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
    special = {10: "\\n", 9: "\\t", 13: "\\r", 32: "␣"}
    if token_id in special:
        return special[token_id]
    if 33 <= token_id < 127:
        return chr(token_id)
    return f"<0x{token_id:02X}>"
