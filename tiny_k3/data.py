"""Training data: the synthetic corpus packed into rows of tokens, with a loss weight per target byte.

A row is BOS + seq_len bytes that start at the start of a line (tiny_k3.corpus): the model always sees
a recall line from its definitions on. Beside each row of tokens comes a row of weights: 1 for most
bytes, `answer_weight` for the bytes whose value the line determines (corpus.answer_mask) -- the recalled
values and the results of sums -- so that the few bytes that test memory and arithmetic are not drowned
by the many that test spelling.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from .corpus import DEFINITIONS, MAX_FILLER, RECALL_MARK, answer_mask, sample_corpus
from .tokenizer import BOS


@dataclass(frozen=True)
class Rows:
    tokens: torch.Tensor     # [N, seq_len + 1] long: BOS, then bytes
    weights: torch.Tensor    # [N, seq_len + 1] float: the loss weight of predicting tokens[:, t] (0 at BOS)
    forget: torch.Tensor | None = None   # [N, seq_len + 1] bool: KDA states wiped before these tokens (Stage)

    def __getitem__(self, index: slice) -> "Rows":      # rows[i:j] slices all
        return Rows(self.tokens[index], self.weights[index], None if self.forget is None else self.forget[index])

    def __len__(self) -> int:
        return len(self.tokens)

    def to(self, device) -> "Rows":
        return Rows(self.tokens.to(device), self.weights.to(device),
                    None if self.forget is None else self.forget.to(device))


def pack_lines(text: str, seq_len: int, answer_weight: float = 1.0, other_weight: float = 1.0) -> Rows:
    """Text -> Rows of BOS + seq_len bytes, each starting at the start of a line; the answer bytes weigh
    `answer_weight` in the loss, every other byte `other_weight` (0: a loss on the answers alone).

    A row that cuts a line is followed by a row starting at that line's start (lines shorter than seq_len
    are always seen whole); only the tail that cannot fill a row is dropped.
    """
    data = torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()
    answers = torch.frombuffer(answer_mask(text), dtype=torch.uint8).bool() if text else torch.zeros(0, dtype=torch.bool)
    weight = torch.where(answers, torch.tensor(float(answer_weight)), torch.tensor(float(other_weight)))
    starts = torch.cat([torch.zeros(1, dtype=torch.long), (data == 10).nonzero().flatten() + 1])
    tokens, weights, start = [], [], 0
    while start + seq_len <= len(data):
        end = start + seq_len
        tokens.append(torch.cat([torch.tensor([BOS]), data[start:end]]))
        weights.append(torch.cat([torch.zeros(1), weight[start:end]]))
        cut = starts[(starts > start) & (starts <= end)]       # line starts inside this row
        start = int(cut[-1]) if len(cut) else end
    if not tokens:
        raise ValueError(f"text of {len(data)} bytes is shorter than one row of seq_len={seq_len}.")
    return Rows(torch.stack(tokens), torch.stack(weights))


@dataclass(frozen=True)
class Stage:
    """One stage of the curriculum: what the recall lines look like while it lasts."""

    max_filler: int = MAX_FILLER          # characters of filler between definitions and queries, at most
    recall_share: float | None = None     # share of recall lines (None: the corpus's own mix)
    max_pairs: int = 26                   # pairs per recall line, at most
    seq_len: int = 256                    # bytes per row (after BOS)
    batch: int = 12                       # rows per step
    copy_share: float = 0.0               # share of copy lines "k3qa8z | k3qa8z" (corpus.copy_line)
    many_share: float = 0.15              # share of recall lines with more than 6 pairs (corpus.sample_line)
    ask_all: bool = False                 # every recall line asks all of its keys, as a probe does
    other_weight: float = 1.0             # loss weight of the bytes that are not answers (0: the answers alone)
    # Share of recall marks ("|") at which every KDA layer forgets its state ("state dropout", Hooks.forget_before):
    # the queries after such a mark can be answered only from the MLA cache. A recipe for the hybrid, whose KDA
    # layers otherwise learn every look-up first and leave its MLA nothing to carry; a twin has no state to wipe.
    forget_share: float = 0.0
    # Every KDA layer forgets its state before every token (Hooks.forget_before everywhere): each KDA layer is a
    # local mixer (its short conv and its own token) and only the MLA layers can look back. A first stage for the
    # hybrid: its MLA grows the look-up, with the previous bytes that the KDA layers below hand it, before any
    # state can learn to bind keys and make the look-up unneeded. A twin has no state: it trains unchanged; a model
    # without MLA layers keeps its states (train.memory_kept_without_mla), having nothing else to look back with.
    memoryless: bool = False
    # Share of steps on which every MLA layer sees only the last `BLIND_WINDOW` keys (Hooks.attention_window), so
    # what a query needs from further back must come through the KDA states. A recipe for the hybrid once its MLA
    # carries the look-up: the KDA states learn to bind the few pairs they can hold beside it. Only a model with
    # both layer kinds is blinded (train.blind_window): the twin has no state to fall back on, `small-kda` no MLA.
    mla_blind_share: float = 0.0
    # Share of steps that read few-pair recall lines (hidden_lines) with their definitions hidden from every MLA
    # layer (Hooks.mla_hidden_keys, the evaluation's own cut) and the MLA layers' attention frozen for the step:
    # only the KDA states can carry a value to its query there, and nothing teaches the MLA to stay away. A recipe for
    # the hybrid (issue 34): the states learn the few pairs while the other steps keep the MLA's look-up. The rows are
    # drawn for every model, so all three read the same data; only a model with both layer kinds hides and freezes.
    hidden_share: float = 0.0
    # KDA layers whose sequence mixer (projections, conv, gates; not the norm or the MLP) is re-initialised at this
    # stage's first step, their optimiser moments cleared: a fresh layer 0 learns to bind keys on hidden steps, where
    # one trained to hand the previous bytes up to the MLA does not (recipe52, the proxy's b20 and b21s). Only in a
    # model with both layer kinds.
    fresh_kda_mixers: tuple[int, ...] = ()
    # Only these heads of the fresh_kda_mixers are re-initialised (their rows of the projections, convs and gates,
    # their columns of the output projection); the others, and what the heads share, stay. Empty: every head.
    fresh_kda_heads: tuple[int, ...] = ()


def hidden_lines(stage: Stage) -> Stage:
    """The lines of `stage`'s hidden steps (Stage.hidden_share): recall lines of 1-4 pairs with every byte in the
    loss, the form of CURRICULUM's first stage, in which a KDA state learns to bind a key to its value; in rows of
    the stage's own length and batch."""
    return Stage(max_filler=16, recall_share=1.0, max_pairs=4, seq_len=stage.seq_len, batch=stage.batch,
                 many_share=0.0)


def definition_marks(tokens: torch.Tensor) -> torch.Tensor:
    """tokens [B, T] (BOS, then bytes from the start of a line) -> bool [B, T]: True on the definitions of every
    recall line (corpus.DEFINITIONS), from the line's first byte to its last definition's ';' -- the tokens that
    recall.hide_definitions_from_mla drops from the MLA cache (a probe's tokens[1:define_end])."""
    marks = torch.zeros(tokens.shape, dtype=torch.bool)
    for b, row in enumerate(tokens.tolist()):
        data = bytes(t if t < 256 else 10 for t in row)     # BOS/EOS read as a line break: a line starts after them
        for match in DEFINITIONS.finditer(data):
            marks[b, match.start():match.end()] = True
    return marks.to(tokens.device)


def step_drawn(seed: int, step: int, share: float, salt: int = 0) -> bool:
    """Whether run step `step` is one of a `share` of the steps, drawn from seed and step alone (and `salt`, which
    keeps two such draws of one run apart: Stage.mla_blind_share's blind steps 0, Stage.hidden_share's HIDDEN_SALT)."""
    return share > 0 and random.Random(seed * 1_000_003 + step + salt).random() < share


HIDDEN_SALT = 500_009


BLIND_WINDOW = 8      # keys an MLA layer sees on a blind step (Stage.mla_blind_share): the query's own few bytes


def corpus_rows(n_rows: int, seq_len: int, seed: int, stage: Stage = Stage(), answer_weight: float = 1.0) -> Rows:
    """At least n_rows packed rows of sample_corpus(seed, ...stage) -> Rows of [n_rows, seq_len + 1]."""
    n_chars = int(n_rows * seq_len * 1.3) + 4 * seq_len
    while True:
        text = sample_corpus(n_chars, seed, stage.max_filler, stage.recall_share, stage.max_pairs,
                             stage.copy_share, stage.many_share, stage.ask_all)
        rows = pack_lines(text, seq_len, answer_weight, stage.other_weight)
        if len(rows) >= n_rows:
            rows = rows[:n_rows]
            if stage.memoryless:
                return Rows(rows.tokens, rows.weights, torch.ones_like(rows.tokens, dtype=torch.bool))
            return with_forgetting(rows, stage.forget_share, seed)
        n_chars *= 2


def with_forgetting(rows: Rows, share: float, seed: int) -> Rows:
    """`rows` with `forget` marking about `share` of their recall marks ("|"), drawn from `seed` (none at 0)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"forget_share must lie in [0, 1], got {share}.")
    if share == 0.0:
        return rows
    draw = torch.rand(rows.tokens.shape, generator=torch.Generator().manual_seed(seed))
    return Rows(rows.tokens, rows.weights, (rows.tokens == ord(RECALL_MARK)) & (draw < share))


def curriculum_rows(steps: int, seed: int, stages: tuple[Stage, ...], answer_weight: float = 1.0) -> list[Rows]:
    """The rows of `steps` training steps in len(stages) equal parts, part i drawn as stages[i] says
    (its own seq_len and batch): one Rows of [steps_i * batch_i, seq_len_i + 1] per stage.

    Easy first: a delta-rule state (and an attention head) learns to bind a key to its value on many
    short recall lines with few pairs, then keeps the binding over more filler and more pairs while the
    rest of the corpus comes back.
    """
    sizes = [steps // len(stages) + (i < steps % len(stages)) for i in range(len(stages))]
    return [corpus_rows(n * stage.batch, stage.seq_len, seed + 7919 * i, stage, answer_weight)
            for i, (n, stage) in enumerate(zip(sizes, stages))]


@dataclass(frozen=True)
class StepRows:
    """What one training step reads."""
    stage: int           # index into the curriculum
    first: bool          # the stage's first step (Stage.fresh_kda_mixers acts here)
    rows: Rows           # [batch, seq_len + 1] of the stage
    hidden: bool         # a hidden step: hidden_lines, the definitions hidden from the MLA (Stage.hidden_share)


class CurriculumData:
    """The rows of every step of a run: curriculum_rows' stages, and for a stage with a hidden share the
    rows its hidden steps read instead (hidden_lines, from seed + 7919 i + 31, as many as it has hidden steps)."""

    def __init__(self, steps: int, seed: int, stages: tuple[Stage, ...], answer_weight: float = 1.0):
        self.stages = stages
        self.rows = curriculum_rows(steps, seed, stages, answer_weight)
        self.hidden: list[Rows | None] = []
        self._plan: list[tuple[int, int, bool]] = []     # per step: (stage, index among its kind's batches, hidden)
        for i, (stage, rows) in enumerate(zip(stages, self.rows)):
            counts = [0, 0]                                # batches used so far: (ordinary, hidden)
            for _ in range(len(rows) // stage.batch):
                hidden = step_drawn(seed, len(self._plan), stage.hidden_share, HIDDEN_SALT)
                self._plan.append((i, counts[hidden], hidden))
                counts[hidden] += 1
            lines = hidden_lines(stage)
            self.hidden.append(corpus_rows(counts[1] * lines.batch, lines.seq_len, seed + 7919 * i + 31, lines,
                                           answer_weight) if counts[1] else None)

    def map(self, fn) -> "CurriculumData":
        """Apply fn(stage, rows) -> rows to every stage's rows and hidden rows."""
        self.rows = [fn(stage, rows) for stage, rows in zip(self.stages, self.rows)]
        self.hidden = [None if rows is None else fn(hidden_lines(stage), rows)
                       for stage, rows in zip(self.stages, self.hidden)]
        return self

    def at(self, step: int) -> StepRows:
        """The rows of 0-based run step `step`."""
        stage, index, hidden = self._plan[step]
        first = step == 0 or self._plan[step - 1][0] != stage
        batch = self.stages[stage].batch
        source = self.hidden[stage] if hidden else self.rows[stage]
        return StepRows(stage, first, source[index * batch:(index + 1) * batch], hidden)


def stage_of(step: int, steps: int, n_stages: int) -> tuple[int, int]:
    """(stage, step within it) of a 0-based step, for stages of steps // n_stages (+1 for the first ones)."""
    sizes = [steps // n_stages + (i < steps % n_stages) for i in range(n_stages)]
    for stage, size in enumerate(sizes):
        if step < size:
            return stage, step
        step -= size
    raise ValueError(f"step {step} is past the {steps} steps of the run.")
