"""How a frame's next token is chosen from its logits: argmax, or a seeded draw reproducible on any machine."""

from __future__ import annotations

import operator

import numpy as np
import torch

from tiny_k3.tokenizer import BYTES


def generator_seed(seed: int, position: int) -> int:
    """A 63-bit seed from (seed, position), the same on every machine and run (unlike Python's hash())."""
    state = np.random.SeedSequence([seed % (1 << 64), position]).generate_state(1, dtype=np.uint64)[0]
    return int(state) & ((1 << 63) - 1)


def sample_token(logits: np.ndarray, temperature: float, seed: int, position: int) -> int:
    """logits [vocab] -> one token id: argmax at temperature 0, else a draw from softmax(logits / T).

    The draw is an inverse-CDF lookup of one uniform from torch.Generator(seed from (seed, position)),
    computed in float64 numpy, so it is reproducible and independent of the model's device.

    This and `tiny_k3.model.sample_next` are two samplers on purpose: this one draws in float64 numpy from a seed
    per (seed, position), so a run replays on any device and from any step (what branching and run files need);
    `sample_next` draws with `torch.multinomial` from one `torch.Generator` (it serves `generate`). The same seed
    need not give the same tokens in both (the golden traces in tests/golden pin this one's draws; tests/test_model.py
    states what sample_next guarantees).
    """
    if temperature == 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    cdf = np.cumsum(p)
    u = torch.rand((), generator=torch.Generator().manual_seed(generator_seed(seed, position)),
                   dtype=torch.float64).item()
    return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), len(cdf) - 1))


def top_tokens(logits: np.ndarray, n: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """The n most likely next tokens under softmax(logits) (temperature 1): (ids int64, probs float32)."""
    z = logits.astype(np.float64)
    p = np.exp(z - z.max())
    p /= p.sum()
    ids = np.argsort(-p, kind="stable")[:n]
    top_ids, top_probs = ids.astype(np.int64), p[ids].astype(np.float32)
    top_ids.flags.writeable = top_probs.flags.writeable = False
    return top_ids, top_probs


def token_id(token, tokenizer=BYTES) -> int:
    """A forced token as its id: an id in [0, tokenizer.num_tokens) or text that is exactly one token (one
    byte-sized character for the bytes); one clear error otherwise."""
    vocab = tokenizer.num_tokens
    if isinstance(token, str):
        ids = tokenizer.encode(token, bos=False)
        if len(ids) != 1:
            raise ValueError(f"force_token must be one token (one byte-sized character) or a token id, got "
                             f"{token!r} ({len(ids)} tokens).")
        return ids[0]
    try:
        t = operator.index(token)
    except TypeError:
        raise ValueError(f"force_token must be a token id in [0, {vocab}) or one character, got {token!r}.") from None
    if not 0 <= t < vocab:
        raise ValueError(f"force_token must be a token id in [0, {vocab}), got {t}.")
    return t


def choose_token(logits: np.ndarray, position: int, choice) -> int:
    """The token a Choice makes at `position`: its forced token, or a seeded draw from `logits` (sample_token)."""
    if choice.is_forced:
        return choice.token
    return sample_token(logits, choice.temperature, choice.seed, position)
