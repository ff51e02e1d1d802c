"""The prompt check: one function, one wording, for the Simulation, the TUI and the command line.

A prompt is one token per UTF-8 byte plus BOS (tiny_k3.tokenizer.encode), and a preset holds
`max_seq_len` tokens in all, prompt and generated. So a prompt of at most max_seq_len - 2 bytes leaves
room for at least one generated token.
"""

from __future__ import annotations

from tiny_k3.config import K3Config
from tiny_k3.tokenizer import BYTES


def max_prompt_bytes(config: K3Config) -> int:
    """The longest prompt in bytes that leaves room to generate: max_seq_len less BOS and one new token."""
    return config.max_seq_len - 2


def prompt_limit(config: K3Config, unit: str = "bytes") -> str:
    """The limit in words, as the prompt dialog and the error say it (unit "tokens" for a checkpoint's BPE)."""
    return (f"preset {config.name!r} allows {config.max_seq_len:,} tokens in all, so use at most "
            f"{max_prompt_bytes(config):,} {unit}")


def prompt_ids(prompt, config: K3Config, tokenizer=BYTES) -> list[int]:
    """The prompt's token ids (BOS first), or one ValueError that names what is wrong and what is allowed.
    With a checkpoint's own BPE (sim.real) the limit counts its tokens instead of bytes."""
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("the prompt is empty; give at least one character to start from.")
    ids = tokenizer.encode(prompt)
    if len(ids) - 1 > max_prompt_bytes(config):
        unit = "bytes" if tokenizer is BYTES else "tokens"
        raise ValueError(f"the prompt is {len(ids) - 1:,} {unit} but {prompt_limit(config, unit)}.")
    return ids
