"""sim.recall_moment: which KDA head reads back a recalled value, and which sublayers moved the answer."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

from sim import Simulation
from sim.interventions import ResetState
from sim.recall_moment import (MIN_SHARE, RecallQuery, delta_rule_reads_and_writes, find_query,
                               mla_blind_window, recall_moment, recall_query_positions, write_contribution)
from tiny_k3 import K3Config, TinyK3
from tiny_k3.config import DEFAULT_PROMPT
from tiny_k3.corpus import recall_line, recall_pairs
from tiny_k3.kda import kda_recurrent
from tiny_k3.tokenizer import encode


def test_find_query_names_key_value_and_definition():
    text = "a=3; q=8; the cat. | q=8; a="
    ids = encode(text)
    positions = recall_query_positions(text)
    assert [chr(ids[p - 1]) for p in positions] == ["q", "a"]
    q = find_query(ids, positions[1])
    assert (q.key, q.value) == ("a", "3") and bytes(ids[i] for i in q.defined_at).decode() == "a=3;"
    assert find_query(ids, ids.index(ord("="))) is None            # a definition is not a query
    assert find_query(encode("3+4="), 4) is None                    # nor is an equation


def test_reads_are_kda_recurrent_outputs_and_writes_rebuild_the_state():
    torch.manual_seed(0)
    T, H, K = 7, 2, 4
    q, k = (torch.nn.functional.normalize(torch.randn(1, T, H, K, dtype=torch.float64), dim=-1) for _ in range(2))
    v = torch.randn(1, T, H, K, dtype=torch.float64)
    g = -torch.rand(1, T, H, K, dtype=torch.float64)
    beta = torch.rand(1, T, H, dtype=torch.float64)
    o, state = kda_recurrent(q, k, v, g, beta, scale=1.0, output_final_state=True)
    reads, writes = delta_rule_reads_and_writes(q[0], k[0], v[0], g[0], beta[0])
    assert torch.allclose(reads, o[0], atol=1e-12)
    # S_T = sum_t (prod_{s>t} alpha_s) k_t u_t^T
    S = torch.zeros(H, K, K, dtype=torch.float64)
    for t in range(T):
        S = g[0, t].exp()[..., None] * S + k[0, t][..., None] * writes[t][:, None, :]
    assert torch.allclose(S, state[0], atol=1e-12)


@torch.no_grad()
def test_logit_moves_sum_to_the_answer_margin():
    torch.manual_seed(1)
    for residual in ("block", "standard"):
        model = TinyK3(K3Config.preset("tiny").replace(residual=residual, dtype="float64")).eval()
        for p in model.parameters():           # away from the zero-init depth queries: non-uniform weights
            p.data.add_(0.05 * torch.randn_like(p))
        text = "b=5; z=1; a red box. | z="
        ids = encode(text)
        moment = recall_moment(model, ids, len(ids) - 1)
        assert moment.query.value == "1" and len(moment.moves) == 1 + 2 * model.config.num_layers
        logits, _ = model(torch.tensor([ids]))
        last = logits[0, -1]
        others = [ord(c) for c in "0123456789" if c != "1"]
        assert abs(moment.margin - float(last[ord("1")] - last[others].mean())) < 1e-9
        assert abs(sum(m.margin for m in moment.moves) - moment.margin) < 1e-9
        n_heads = sum(b.kind == "kda" for b in model.blocks) * model.config.kda_heads
        assert len(moment.heads) == n_heads and moment.heads[0].share == max(h.share for h in moment.heads)
        assert recall_moment(model, ids, 2) is None


def test_the_read_is_the_sum_of_one_term_per_write():
    torch.manual_seed(2)
    T, H, K = 9, 2, 4
    q, k = (torch.nn.functional.normalize(torch.randn(T, H, K, dtype=torch.float64), dim=-1) for _ in range(2))
    v, g, beta = torch.randn(T, H, K, dtype=torch.float64), -torch.rand(T, H, K, dtype=torch.float64), torch.rand(T, H)
    reads, writes = delta_rule_reads_and_writes(q, k, v, g, beta)
    for t in (0, 4, T - 1):
        total = sum(write_contribution(q, k, g, writes, t, d) for d in range(t + 1))
        assert torch.allclose(total, reads[t], atol=1e-12)


# ------------------------------------------------------------------ the head that reads the value back

def recall_lines(n: int, seed: int = 7) -> list[str]:
    """n recall queries from the corpus's own line maker: 2-4 pairs, 0-16 bytes of filler, one key asked,
    cut after its "=" (a fixed seed; several repeat a digit under two keys, e.g. "b=9; ... d=9; | d=")."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        pairs = recall_pairs(rng, rng.choice([2, 3, 4]))
        asked = rng.choice(pairs)
        out.append(recall_line(rng, pairs, rng.choice([0, 8, 16]), [asked])[:-2])   # "... | d=9;" -> "... | d="
    return out


def answer_probability(logits, value: str) -> float:
    return float(torch.softmax(torch.tensor(np.array(logits), dtype=torch.float64), -1)[ord(value)])


RECALL_TEXTS = [DEFAULT_PROMPT] + recall_lines(8)


@pytest.mark.parametrize("text", RECALL_TEXTS)
def test_each_heads_reset_is_the_what_if_and_the_most_needed_head_is_the_one_it_hurts_most(text):
    """The shipped `small` answers these queries. Every head's p_reset is what the TUI's what-if (ResetState of
    that head at the query) gives, and most_needed_head is the head whose reset lowers p(value) most. (The head
    whose read the value's write explains best, reading_head, need not be it: a share is not a cause.)"""
    sim = Simulation("small", text, twin=False)
    moment = sim.recall_moment()
    assert moment.answered, (text, moment.predicted)
    before = answer_probability(sim.what_if().logits_before[0], moment.query.value)
    after = {(h.layer, h.head): answer_probability(sim.what_if(ResetState(h.layer, h.head)).logits_after[0],
                                                   moment.query.value) for h in moment.heads}
    assert len(after) == len(sim.config.kda_layers) * sim.config.kda_heads
    for head in moment.heads:
        # (float32 model; the what-if continues the timeline's own cache, built token by token: 1e-4)
        assert head.p_reset == pytest.approx(after[head.layer, head.head], abs=1e-4), (text, head)
    needed = moment.most_needed_head
    assert (needed.layer, needed.head) == min(after, key=after.get)
    assert before - needed.p_reset == pytest.approx(before - min(after.values()), abs=1e-4)


@pytest.mark.parametrize("preset", ["small", "k3-topo"])
def test_a_model_at_random_init_names_no_reading_head(preset):
    sim = Simulation(preset, DEFAULT_PROMPT, weights="random", twin=False)
    moment = sim.recall_moment()
    assert moment.best_head is not None and moment.reading_head is None
    if not moment.answered:                             # what random init does: a stray byte
        assert moment.why_no_head == f"the model answers {moment.predicted!r}, not {moment.query.value!r}"
    else:                                               # a lucky digit: then its read is not that write
        assert moment.best_head.share < MIN_SHARE and "no head's read is mostly that write" in moment.why_no_head


def test_a_weak_match_names_no_head_even_when_the_answer_is_right():
    moment = Simulation("small", DEFAULT_PROMPT, twin=False).recall_moment()
    weak = dataclasses.replace(moment, heads=tuple(dataclasses.replace(h, share=MIN_SHARE / 2) for h in moment.heads))
    assert weak.answered and weak.reading_head is None and "under 25%" in weak.why_no_head
    assert dataclasses.replace(moment, predicted="?").reading_head is None


# ------------------------------------------------------------------ which layer kind carried it

MANY_PAIRS = ("a=1; b=7; c=3; d=9; e=2; f=5; g=8; h=0; i=4; j=6; k=1; l=3; m=7; n=2; o=9; p=5; q=0; r=8; s=6; "
              "t=4; u=3; v=1; w=7; x=5; y=2; z=9. | k=")


def _p(logits, token: str) -> float:
    return float(torch.softmax(torch.tensor(np.array(logits), dtype=torch.float64), -1)[encode(token)[-1]])


@pytest.mark.parametrize("preset", ["small", "small-twin", "small-kda"])
def test_layer_kinds_are_the_what_ifs_of_the_mla_window_and_the_kda_reset(preset):
    """The panels' "carried by" line is Simulation.what_if of the same two changes at the query: the
    direct replay from the cache before the query token and the what-if engine agree (float32 runs).

    Two float32 paths, not one: the replay's cache comes from one batched forward of the prefix, the what-if's
    from the timeline's own steps, and they may part where an expert choice is nearly tied. On the shipped twin
    they part by 4e-4 in p (its intact p(answer) is 0.87716 from the batched prefix at one thread, 0.87676 at two
    and stepwise, and 0.877157 on every path in float64), so the tolerance is 1e-3; a window off by one token, or
    the wrong heads reset, moves p by far more (0.92 -> 0.35 at 52 pairs)."""
    from sim.interventions import TruncateContext

    sim = Simulation(preset, MANY_PAIRS, twin=False)
    moment = sim.recall_moment()
    kinds = moment.kinds
    assert kinds.answer == moment.predicted
    tests = [(kinds.mla_hidden, TruncateContext(mla_blind_window(sim.config, moment.query))),
             (kinds.kda_reset, ResetState())]
    for test, change in tests:
        if test is None:
            assert (change.__class__ is TruncateContext and not sim.config.mla_layers) or \
                   (change.__class__ is ResetState and not sim.config.kda_layers)
            continue
        w = sim.what_if(change)
        assert w.top_after[0][0][1] == test.answer, (change, test)
        assert test.p_answer == pytest.approx(_p(w.logits_after[0], kinds.answer), abs=1e-3)
        assert kinds.p_answer == pytest.approx(_p(w.logits_before[0], kinds.answer), abs=1e-3)


def test_the_mla_blind_window_ends_past_the_rows_a_short_conv_mixes_the_value_into():
    """Plain MLA keeps the value in its own row; the twin's conv (width kda_conv_kernel = 4) also mixes it into the
    3 rows after it, so the twin's window is 3 rows shorter, and never under 1."""
    hybrid = K3Config.preset("small")
    twin = hybrid.twin()
    assert not hybrid.mla_conv_layers and twin.mla_conv_layers and twin.kda_conv_kernel == 4
    query = RecallQuery(position=40, key="q", value="8", defined_at=(10, 11, 12, 13))
    assert mla_blind_window(hybrid, query) == 40 - 12
    assert mla_blind_window(twin, query) == 40 - 12 - 3
    near = RecallQuery(position=14, key="q", value="8", defined_at=(10, 11, 12, 13))
    assert mla_blind_window(hybrid, near) == 2 and mla_blind_window(twin, near) == 1


def test_the_twin_s_recall_at_26_pairs_is_carried_by_its_mla_layers():
    """The twin has only MLA layers, so its answer must live in them: with the window ending past the conv's reach
    the answer goes (before mla_blind_window, a window ending right after the value left it in the ";" row after
    the value, and the panel said "the layers tested are not what holds it")."""
    kinds = Simulation("small-twin", MANY_PAIRS, twin=False).recall_moment().kinds
    assert kinds.answer == "1" and kinds.kda_reset is None
    assert kinds.carrier == "MLA" and kinds.mla_hidden.answer != "1", kinds.sentence()


def test_the_shipped_hybrid_needs_both_kinds_for_26_pairs():
    """A finding, not a wish (issue 34): at 26 pairs the shipped hybrid's answer dies when its MLA layers lose sight
    of the value, and also when every KDA state is wiped: the reset clears the conv tails too, and head 1 of layer
    0 hands the previous bytes (here the asked key) up to the MLA's query (bench/results/recipe52/README.md, attempt
    13). Before the fresh-head recipe the answer survived the reset, and before the scaffold it lived in the states.
    If a retrained checkpoint changes this, the sentences about where the hybrid's recall lives must change too."""
    kinds = Simulation("small", MANY_PAIRS, twin=False).recall_moment().kinds
    assert kinds.answer == "1" and kinds.carrier == "both", kinds.sentence()
    assert kinds.mla_hidden.answer != "1" and kinds.kda_reset.answer != "1"
    assert "it needed both kinds" in kinds.sentence()


def test_the_carrier_verdict_follows_which_change_flips_the_answer():
    from sim.recall_moment import KindTest, LayerKinds

    keep, lose = KindTest("x", "8", 0.9), KindTest("y", "3", 0.1)
    verdict = lambda mla, kda: LayerKinds("8", 0.95, mla, kda).carrier   # noqa: E731
    assert verdict(keep, lose) == "KDA" and verdict(lose, keep) == "MLA"
    assert verdict(lose, lose) == "both" and verdict(keep, keep) == "either"
    assert verdict(None, lose) == "KDA" and verdict(lose, None) == "MLA"
    assert verdict(None, keep) == "neither" and verdict(keep, None) == "neither"
    assert "(the MLA layers are not needed here)" not in LayerKinds("8", 0.9, None, lose).sentence()


def test_the_state_panel_says_which_reset_lowers_the_answer_most_with_the_what_ifs_number():
    """tui_app.panels.needed_clause: the named head's own reset and, where another head's reset lowers
    p(answer) more, that head with its p; nothing for a wrong answer."""
    from tui_app.panels import needed_clause

    sim = Simulation("small", "b=2; r=4; | r=", twin=False)
    moment = sim.recall_moment()
    assert moment.answered, moment.predicted                  # the shipped small answers this prompt
    needed = moment.most_needed_head
    other = next(h for h in moment.heads if (h.layer, h.head) != (needed.layer, needed.head))
    p_needed, p_other = (answer_probability(sim.what_if(ResetState(h.layer, h.head)).logits_after[0], "4")
                         for h in (needed, other))
    assert other.p_reset == pytest.approx(p_other, abs=1e-4) and p_needed <= p_other + 1e-9
    clause = needed_clause(moment, other)          # whichever head a checkpoint names: the clause reads the resets
    assert f"its reset alone: p {moment.kinds.p_answer:.2f} → {other.p_reset:.2f}" in clause
    assert clause.endswith(f"; the reset that lowers it most: L{needed.layer} h{needed.head} (p → {p_needed:.2f})")
    assert needed_clause(moment, needed).endswith("(no other head's reset lowers it more)")
    most = f"; the reset that lowers it most: L{needed.layer} h{needed.head} (p → {p_needed:.2f})"
    assert needed_clause(moment, None) == most
    assert needed_clause(dataclasses.replace(moment, predicted="?"), moment.reading_head) == ""
