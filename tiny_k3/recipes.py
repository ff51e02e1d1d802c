"""The curricula: which recall lines a training run reads, stage by stage (data.Stage), and every recipe tried.

`train --curriculum NAME` picks one of CURRICULA; the steps are split equally among its stages. The shipped
checkpoints use SCAFFOLD_FIRST (with train --scaffold); the others are kept so that each attempt in
bench/results/recipe52/README.md can be run again.
"""

from __future__ import annotations

import dataclasses

from .corpus import MAX_FILLER
from .data import Stage

QK_GAIN = 4.0   # the recipe's MLA logit scale at init (train.scale_attention_logits_at_init; docs/recall.md, run t7)
ANSWER_WEIGHT = 10.0                     # loss weight of recalled values and sums' results (data.py)

# The last four stages of the shipped recipe (SCAFFOLD_FIRST), and alone the recipe of the `small` and `small-kda`
# before it (`--curriculum plain`, one stage per quarter of the run). First recall lines
# alone with every byte in the loss (answers x10; 1-8 pairs, at most 16 characters of filler), where the KDA layers
# learn to bind a key to its value; then recall lines with the loss on the answers alone and every key asked (1-16
# pairs); then the whole corpus with up to 52 pairs (keys a-z, A-Z) in rows of 576 bytes, long enough to hold a
# 52-pair line and all its queries whole.
CURRICULUM = (
    Stage(max_filler=16, recall_share=1.0, max_pairs=8, seq_len=128, batch=24),
    Stage(max_filler=16, recall_share=1.0, max_pairs=16, seq_len=192, batch=16, many_share=0.6, ask_all=True,
          other_weight=0.0),
    Stage(max_filler=128, recall_share=0.6, max_pairs=52, seq_len=576, batch=6, many_share=0.4),
    Stage(max_filler=MAX_FILLER, recall_share=0.45, max_pairs=52, seq_len=576, batch=6, many_share=0.4),
)
# The recipe of the `small-twin` before SCAFFOLD_FIRST: the answers-alone stage first. Without the scaffold no order
# served all three: after a first stage with every byte in the loss the twin stayed near 45 % at 4 pairs, and after
# the answers-alone stage first the hybrid stayed near 60 % (bench/results/recipe52/README.md, attempts 2-4), each
# stuck in a partial look-up that the later stages never left. Softmax attention needs the answers' whole gradient
# to find its look-up; a fixed state learns to bind keys from the whole stream.
ANSWERS_FIRST = (
    Stage(max_filler=16, recall_share=1.0, max_pairs=16, seq_len=192, batch=16, many_share=0.6, ask_all=True,
          other_weight=0.0),
    Stage(max_filler=64, recall_share=0.8, max_pairs=26, seq_len=256, batch=12, many_share=0.3),
    Stage(max_filler=128, recall_share=0.6, max_pairs=52, seq_len=576, batch=6, many_share=0.4),
    Stage(max_filler=MAX_FILLER, recall_share=0.45, max_pairs=52, seq_len=576, batch=6, many_share=0.4),
)
# CURRICULUM with state dropout (Stage.forget_share): from the second stage on, at half of the recall marks every
# KDA layer forgets its state, so those queries can be answered only from the MLA cache. Without it the hybrid's
# KDA layers learn every look-up first and its MLA carries nothing (hiding the definitions from it cost 0 points
# at 52 pairs). A model without KDA layers (the twin) trains exactly as under CURRICULUM.
CURRICULUM_FORGET = (CURRICULUM[0], *(dataclasses.replace(stage, forget_share=0.5) for stage in CURRICULUM[1:]))
# The look-up first (issue 34, attempt 8): ANSWERS_FIRST's first stage with every KDA state forgotten before every
# token (Stage.memoryless), so the hybrid's MLA must grow the look-up, as the twin's does; then CURRICULUM, in which
# the KDA states learn to bind keys beside it. For a twin the first stage is ANSWERS_FIRST's. Measured: the hybrid's
# MLA did not find the look-up in that stage, even in 800 steps (`--stages 1`), where the twin finds it in 300
# (bench/results/recipe52/README.md, attempt 8).
LOOKUP_FIRST = (dataclasses.replace(ANSWERS_FIRST[0], memoryless=True), *CURRICULUM)
# The recipe of all three shipped checkpoints (issue 34, attempt 9): two memoryless answers-alone stages, in which
# the hybrid's MLA grows the look-up on a scaffold (tiny_k3.scaffold, train --scaffold 200,100), then CURRICULUM.
# The scaffold changes nothing in the twin (layer 0 is MLA) or `small-kda` (no MLA), and neither is memoryless: the
# twin has no state, and `small-kda` keeps its states (train.memory_kept_without_mla; it has no MLA to look back
# with). For both the first two stages are answers-alone stages.
SCAFFOLD_FIRST = (LOOKUP_FIRST[0], LOOKUP_FIRST[0], *CURRICULUM)
# Attempt 10: SCAFFOLD_FIRST with the MLA blind on 30 % of the steps after the memoryless stages
# (Stage.mla_blind_share), meant to teach the KDA states the few pairs beside the MLA. Measured: they learned none
# (bench/results/recipe52/README.md); a model without both layer kinds is never blinded.
def with_mla_blind(stages: tuple[Stage, ...], share: float) -> tuple[Stage, ...]:
    """`stages` with Stage.mla_blind_share = `share` on every stage that is not memoryless (train --mla-blind-share)."""
    return tuple(st if st.memoryless else dataclasses.replace(st, mla_blind_share=share) for st in stages)


SCAFFOLD_BLIND = with_mla_blind(SCAFFOLD_FIRST, 0.3)
# Attempt 11: SCAFFOLD_FIRST with the MLA blind on every step of its first stateful stage (every byte in the loss),
# so the KDA states must learn to bind keys there, as `small-kda`'s do, while the grown look-up waits; then both.
SCAFFOLD_BLIND_FIRST = (*SCAFFOLD_FIRST[:2], dataclasses.replace(CURRICULUM[0], mla_blind_share=1.0), *CURRICULUM[1:])
# Attempt 13 (issue 34, `train --curriculum scaffold-first --bind-from STAGE`): SCAFFOLD_FIRST until the look-up has
# grown, then layer 0's KDA sequence mixer re-initialised and, to the end, a share of the steps hidden
# (Stage.hidden_share: few-pair lines, the definitions hidden from the MLA, its attention frozen there) and the states
# wiped at a share of the recall marks on the others (Stage.forget_share), so each path is grown where only it can
# answer. The full-size form of the lesson-scale proxy's b21s (bench/results/recipe52/README.md): the layer that
# hands the previous bytes up to the MLA will not learn to bind keys, and a fresh one does.
def binding_from(stages: tuple[Stage, ...], first: int, fresh: tuple[int, ...] = (0,),
                 hidden: float | tuple[float, ...] = 0.5, forget: float | tuple[float, ...] = 0.5,
                 heads: tuple[int, ...] = ()) -> tuple[Stage, ...]:
    """`stages` with, from stage `first` on, a share `hidden` of the steps hidden and the states wiped at a share
    `forget` of the recall marks, and the sequence mixers of KDA layers `fresh` re-initialised at stage `first`'s
    first step (only their `heads`, where given). A tuple of shares gives the bound stages theirs in order, the last
    one to every stage after it."""
    hidden, forget = (x if isinstance(x, tuple) else (x,) for x in (hidden, forget))
    bound = [dataclasses.replace(st, hidden_share=hidden[min(j, len(hidden) - 1)],
                                 forget_share=forget[min(j, len(forget) - 1)])
             for j, st in enumerate(stages[first:])]
    return (*stages[:first], dataclasses.replace(bound[0], fresh_kda_mixers=fresh, fresh_kda_heads=heads), *bound[1:])


# The curriculum of the checkpoints before issue 34 (1-26 pairs, rows of 128 then 256 bytes), kept to compare.
CURRICULUM_26 = (
    Stage(max_filler=16, recall_share=1.0, max_pairs=4, seq_len=128, batch=24),
    Stage(max_filler=64, recall_share=0.8, max_pairs=8, seq_len=128, batch=24),
    Stage(max_filler=128, recall_share=0.6, seq_len=256, batch=12),
    Stage(max_filler=MAX_FILLER, recall_share=0.45, seq_len=256, batch=12),
)
# Recall first through an induction circuit: copy lines "k3qa8z | k3qa8z" beside the recall lines while the
# model is young (a softmax-only model has no short convolution to shift the key into the value's position, so it
# must grow "find the earlier copy, say what came next"), then more pairs and filler, rows long enough for 26.
INDUCTION_CURRICULUM = (
    Stage(max_filler=16, recall_share=1.0, max_pairs=6, seq_len=128, batch=24, copy_share=0.3),
    Stage(max_filler=64, recall_share=0.8, max_pairs=16, seq_len=192, batch=16, copy_share=0.15),
    Stage(max_filler=128, recall_share=0.6, seq_len=320, batch=10, copy_share=0.05),
    Stage(max_filler=MAX_FILLER, recall_share=0.45, seq_len=320, batch=10),
)
CURRICULA = {"plain": CURRICULUM, "answers-first": ANSWERS_FIRST, "forget": CURRICULUM_FORGET,
             "lookup-first": LOOKUP_FIRST, "scaffold-first": SCAFFOLD_FIRST,
             "scaffold-blind": SCAFFOLD_BLIND,
             "scaffold-blind-first": SCAFFOLD_BLIND_FIRST, "pairs26": CURRICULUM_26,
             "induction": INDUCTION_CURRICULUM}

__all__ = ["QK_GAIN", "ANSWER_WEIGHT", "with_mla_blind", "binding_from", "CURRICULUM", "ANSWERS_FIRST", "CURRICULUM_FORGET", "LOOKUP_FIRST", "SCAFFOLD_FIRST", "SCAFFOLD_BLIND",
           "SCAFFOLD_BLIND_FIRST", "CURRICULUM_26", "INDUCTION_CURRICULUM", "CURRICULA"]
