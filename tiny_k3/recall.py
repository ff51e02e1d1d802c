"""In-context recall, measured: lines "a=3; q=8; <filler> | q=8; a=3;" and whether the model returns the values.

A probe is one such line. Every value after the mark is scored teacher-forced: the model reads the
line up to "q=" and its argmax next byte must be the digit defined before the mark. Chance is 10 %
(ten digits). Distance is the filler between the last definition and the mark, in tokens (= bytes).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable

import torch

from .cache import KDAState, MLACache, ModelCache
from .corpus import RECALL_MARK, filler, recall_line, recall_pairs
from .tokenizer import encode

# An edit of the decode cache made at the query (after the mark is read, before the first query token):
# edit(cache, probe) -> None, changing cache.layers in place.
CacheEdit = Callable[[ModelCache, "Probe"], None]


@dataclass(frozen=True)
class Probe:
    tokens: torch.Tensor          # [T] long: BOS + the line
    answer_at: tuple[int, ...]    # positions p whose next token tokens[p + 1] is a recalled value
    define_end: int               # tokens[:define_end] are BOS and the definitions
    query_start: int              # tokens[query_start] is the first token after the mark


def make_probe(rng: random.Random, pairs: int, filler_chars: int) -> Probe:
    """One recall line with `pairs` pairs, ~filler_chars of filler, then every key asked in a random order."""
    defined = recall_pairs(rng, pairs)
    asked = rng.sample(defined, len(defined))
    line = recall_line(rng, defined, filler_chars, asked)
    tokens = torch.tensor(encode(line))            # BOS first
    mark = line.index(RECALL_MARK)
    answers = tuple(1 + i for i in range(mark, len(line)) if line[i] == "=")   # line[i] is tokens[1 + i]
    define_end = 1 + len(" ".join(f"{k}={v};" for k, v in defined))
    return Probe(tokens, answers, define_end, 1 + mark + 1)


def make_probes(n: int, pairs: int, filler_chars: int, seed: int) -> list[Probe]:
    rng = random.Random(seed)
    return [make_probe(rng, pairs, filler_chars) for _ in range(n)]


@torch.no_grad()
def probe_correct(logits: torch.Tensor, probe: Probe) -> torch.Tensor:
    """logits [T, vocab] of a probe's tokens -> bool [number of answers]: argmax == the recalled digit."""
    at = torch.tensor(probe.answer_at)
    return logits[at].argmax(-1) == probe.tokens.to(logits.device)[at + 1]


def wilson_interval(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion hits / n (95 % at z = 1.96): honest near 0 % and 100 %, where
    the normal approximation p +- z sqrt(p(1-p)/n) collapses to a point (Wilson, JASA 22, 1927)."""
    if n < 1 or not 0 <= hits <= n:
        raise ValueError(f"need 0 <= hits <= n and n >= 1, got hits={hits}, n={n}.")
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low, high = max(0.0, centre - half), min(1.0, centre + half)
    # at hits = 0 (or n) the bound is 0 (or 1) exactly; rounding must not leave it a hair inside
    return (0.0 if hits == 0 else low), (1.0 if hits == n else high)


@dataclass(frozen=True)
class Score:
    """hits right out of n answers: a share with its Wilson 95 % interval ("98% [96,99]" when printed)."""

    hits: int
    n: int

    @property
    def share(self) -> float:
        return self.hits / self.n

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.hits, self.n)

    def __str__(self) -> str:
        low, high = self.interval
        return f"{self.share:.0%} [{low * 100:.0f},{high * 100:.0f}]"


def compare(a: Score, b: Score) -> int:
    """+1 when a's 95 % interval lies wholly above b's, -1 when wholly below, 0 when they overlap: only intervals
    that are apart make one score "ahead" of another (two shares inside each other's uncertainty are not ranked)."""
    (a_low, a_high), (b_low, b_high) = a.interval, b.interval
    return 1 if a_low > b_high else -1 if a_high < b_low else 0


def verdict(name_a: str, a: Score, name_b: str, b: Score, where: str) -> str:
    """One sentence ranking two scores only where their intervals are apart:
    'small-twin recalls more than small-kda at 52 pairs: 92% [90,94] against 48% [45,51]'."""
    order = compare(a, b)
    if order == 0:
        return f"{name_a} and {name_b} are not told apart {where}: {a} and {b} overlap"
    first, second = ((name_a, a), (name_b, b)) if order > 0 else ((name_b, b), (name_a, a))
    return f"{first[0]} recalls more than {second[0]} {where}: {first[1]} against {second[1]}"


@torch.no_grad()
def recall_hits(model, probes: list[Probe], batch: int = 32) -> tuple[int, int]:
    """(answers right, answers asked) over all probes, `batch` probes per forward pass.

    The probes of a batch are left-padded to one length (TinyK3's attention_mask: padding changes no KDA
    state, is invisible to MLA and shifts no RoPE position), so each row's logits are those of the probe alone.
    """
    was_training = model.training
    model.eval()
    hits = answers = 0
    for start in range(0, len(probes), batch):
        group = probes[start:start + batch]
        width = max(len(p.tokens) for p in group)
        tokens = torch.zeros(len(group), width, dtype=torch.long)
        mask = torch.zeros(len(group), width, dtype=torch.bool)
        for row, p in enumerate(group):
            tokens[row, width - len(p.tokens):] = p.tokens
            mask[row, width - len(p.tokens):] = True
        logits, _ = model(tokens.to(model.device), attention_mask=mask.to(model.device))
        for row, p in enumerate(group):
            right = probe_correct(logits[row, width - len(p.tokens):], p)
            hits += int(right.sum())
            answers += len(right)
    model.train(was_training)
    return hits, answers


@torch.no_grad()
def recall_accuracy(model, probes: list[Probe], **forward_kw) -> float:
    """Fraction of recalled values that are the argmax, over all answers of all probes."""
    was_training = model.training
    model.eval()
    hits = []
    for probe in probes:
        logits, _ = model(probe.tokens[None].to(model.device), **forward_kw)
        hits.append(probe_correct(logits[0], probe))
    model.train(was_training)
    return torch.cat(hits).float().mean().item()


@torch.no_grad()
def edited_recall_hits(model, probes: list[Probe], edit: CacheEdit | None = None) -> tuple[int, int]:
    """(answers right, answers asked) with the decode cache edited at the query: prefill up to the mark, edit,
    read on. With edit=None this counts what recall_hits counts (a prefill that is split gives the same logits)."""
    was_training = model.training
    model.eval()
    hits = answers = 0
    for probe in probes:
        tokens = probe.tokens[None].to(model.device)
        _, cache = model(tokens[:, :probe.query_start])
        if edit is not None:
            edit(cache, probe)
        logits, _ = model(tokens[:, probe.query_start:], cache)
        at = torch.tensor(probe.answer_at) - probe.query_start
        right = logits[0, at].argmax(-1) == tokens[0, at + probe.query_start + 1]
        hits += int(right.sum())
        answers += len(right)
    model.train(was_training)
    return hits, answers


def edited_recall_accuracy(model, probes: list[Probe], edit: CacheEdit | None = None) -> float:
    """edited_recall_hits as a fraction (with edit=None it equals recall_accuracy)."""
    hits, answers = edited_recall_hits(model, probes, edit)
    return hits / answers


def hide_definitions_from_mla(cache: ModelCache, probe: Probe) -> None:
    """Drop the definitions' rows from every MLA layer's latent cache (BOS stays).

    With NoPE no position is encoded in a key, so dropping a row is exactly masking that position: the
    MLA layers can no longer attend to the definitions; whatever the KDA states carried forward remains.
    """
    keep = torch.cat([torch.zeros(1, dtype=torch.long), torch.arange(probe.define_end, cache.position)])
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, MLACache):
            cache.layers[i] = MLACache(layer.latent[:, keep], layer.k_rope[:, keep], layer.conv)


def reset_kda_states(layers: set[int] | None = None) -> CacheEdit:
    """An edit that zeroes the delta-rule state S and the conv tail of KDA layers (all, or those given)."""
    def edit(cache: ModelCache, probe: Probe) -> None:
        for i, layer in enumerate(cache.layers):
            if isinstance(layer, KDAState) and (layers is None or i in layers):
                cache.layers[i] = KDAState(torch.zeros_like(layer.state), torch.zeros_like(layer.conv))
    return edit


__all__ = ["Score", "compare", "verdict", "Probe", "make_probe", "make_probes", "probe_correct", "recall_accuracy", "recall_hits", "wilson_interval",
           "edited_recall_hits", "edited_recall_accuracy", "hide_definitions_from_mla", "reset_kda_states", "filler"]
