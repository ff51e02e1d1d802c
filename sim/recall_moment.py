"""The recall moment: at a query like "| q=", which KDA head reads back the value written at "q=8;",
and which sublayers pushed the answer's logit up.

Two measurements, both from one forward pass over the text so far (no Frame needs to carry them):

* **Which head recalls.** For every KDA layer and head, the delta rule (kda.md §1) is replayed token by
  token from the recorded q, k, v, g, beta: the write of token d is u_d = beta_d (v_d - (Diag(alpha_d)
  S_{d-1})^T k_d) (the value it stores under key k_d), and the read at the query t is r_t = S_t^T q_t.
  Unrolled, S_t = sum_d (Diag(A_{d,t}) k_d) u_d^T with A_{d,t} = prod_{s=d+1..t} alpha_s, so the read is
  exactly a sum of one term per earlier write: r_t = sum_d c_d, c_d = (q_t . (A_{d,t} * k_d)) u_d.
  The write that can hold the value is the one made AT THE VALUE TOKEN of "q=8;" (the "8"; the "=" before
  it cannot know the digit). Heads are ranked by the share of their read that this one write explains,
  <r_t, c_val> / |r_t|^2 (1: the read is that write and nothing else); the cosine cos(r_t, u_val) is kept
  beside it. Ranking by the cosine alone misnames a head when the digit was also written by another key
  ("b=9; d=9; | d="): a head that returns any 9 matches both writes equally.
  A head is named as the one that *reads the value back* (`RecallMoment.reading_head`) only when the model
  answers the query right and that write explains at least MIN_SHARE of the head's read; a model at
  random init answers a stray byte, and no head is named.
* **Whose reset hurts.** The share is a decomposition of one head's read, not a cause: another head (in
  another layer) may matter more to the answer. So the query token is also run again with each KDA head's
  state reset alone (HeadMatch.p_reset, Simulation.what_if(ResetState(layer, head)) at that token), for up to
  CAUSAL_HEAD_LIMIT heads; `RecallMoment.most_needed_head` is the head whose reset lowers p(answer) most.
* **Which sublayers moved the answer.** The logits are W_U (w * h / rms(h)) with h the output depth read,
  a weighted sum of depth sources (attnres.md §2); each sublayer output v_j lies in one source, so with
  rms(h) held fixed the answer's margin over the other digits splits exactly into one term per sublayer
  (plus the embedding): direct logit attribution. The terms sum to the margin.
* **Which layer kind carried it** (`LayerKinds`). The query token is run again from the cache of the text
  before it, twice: with the MLA layers' window ending after the queried value (they can no longer see it;
  `mla_blind_window`: where a short conv stands in front of the attention, as in the twin, past the rows it mixes
  the value into too), and with every KDA state reset (the fixed-size memory wiped). Whichever change flips the answer names the
  kind that held it; these are exactly Simulation.what_if(TruncateContext(window)) and
  what_if(ResetState()) at that token (tests/test_recall_moment.py checks the two agree).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from tiny_k3.attnres import DepthStream
from tiny_k3.corpus import RECALL_MARK
from tiny_k3.hooks import Hooks
from tiny_k3.probe import DepthEvent, EmbedEvent, Event, KDAEvent, Recorder, SublayerEvent
from tiny_k3.tokenizer import BOS, EOS, decode, encode

DIGITS = [ord(str(d)) for d in range(10)]
# A head reads the value back when the value token's write explains at least this share of its read at the
# query. At random init the best head's share is 0.02 to 0.2 on `small` and `k3-topo` while the model answers a
# stray byte (tests/test_recall_moment.py). A share is not a cause: on the shipped `small` the head whose reset
# lowers p(answer) most can read the value with a share under this (L0 h1 on "b=2; r=4; | r="), so the panel
# names both (most_needed_head).
MIN_SHARE = 0.25
CAUSAL_HEAD_LIMIT = 64   # reset each KDA head alone at the query when the model has at most this many (small: 12)


@dataclass(frozen=True)
class RecallQuery:
    """A recall query at `position`: the input there is the "=" after `key`, asking for `value`."""

    position: int          # index of the "=" token (its next-token prediction is the answer)
    key: str
    value: str             # the digit defined before the mark
    defined_at: tuple[int, ...]   # token positions of the definition "key=value;"

    @property
    def value_at(self) -> int:
        """Position of the value token of the definition (the "8" of "q=8;")."""
        return self.defined_at[2]


@dataclass(frozen=True)
class HeadMatch:
    layer: int
    head: int
    share: float           # <read, c_val> / |read|^2: the share of the read at the query that the value's write explains
    cosine: float          # cos(read at the query, the write u made at the value token)
    written_at: int        # the value token's position (whose write is matched)
    p_reset: float | None = None   # p(intact answer) with this head's state reset at the query (None: not measured)


@dataclass(frozen=True)
class LogitMove:
    label: str             # "emb" or e.g. "L3 attn · KDA"
    layer: int             # -1 for the embedding
    site: str              # "embed", "attn" or "mlp"
    margin: float          # its share of (answer logit - mean logit of the other digits)


@dataclass(frozen=True)
class KindTest:
    """The query token run again with one kind of memory taken away."""

    change: str            # what was taken away, e.g. "MLA window 9" or "every KDA state reset"
    answer: str            # the argmax then
    p_answer: float        # the intact answer's probability then


@dataclass(frozen=True)
class LayerKinds:
    """Which layer kind carried a recall: the intact answer beside the MLA layers blind to the value and
    beside every KDA state wiped (None where the model has no layer of that kind)."""

    answer: str                    # the intact argmax
    p_answer: float                # its probability
    mla_hidden: KindTest | None    # MLA window ending after the queried value (None: no MLA layer)
    kda_reset: KindTest | None     # every KDA state reset at the query (None: no KDA layer)

    @property
    def carrier(self) -> str:
        """"KDA", "MLA", "both" (each change alone flips it), "either" (neither flips it: each kind alone
        holds it) or "neither" (no layer of the other kind to test, and hiding changes nothing)."""
        kept = {kind: test is None or test.answer == self.answer
                for kind, test in (("MLA", self.mla_hidden), ("KDA", self.kda_reset))}
        if self.mla_hidden is None or self.kda_reset is None:
            test_kind = "KDA" if self.mla_hidden is None else "MLA"
            return "neither" if kept[test_kind] else test_kind
        if kept["MLA"] and kept["KDA"]:
            return "either"
        if not kept["MLA"] and not kept["KDA"]:
            return "both"
        return "KDA" if kept["MLA"] else "MLA"

    def sentence(self) -> str:
        """One line for the state and memory panels: both tests and the verdict, in numbers."""
        tests = [f"{t.change}: {t.answer!r} (p {self.p_answer:.2f} → {t.p_answer:.2f})"
                 for t in (self.mla_hidden, self.kda_reset) if t is not None]
        both_kinds = self.mla_hidden is not None and self.kda_reset is not None
        verdict = {"KDA": "the KDA states carried it" + (" (the MLA layers are not needed here)" if both_kinds else ""),
                   "MLA": "the MLA layers carried it (softmax over the cache" +
                          ("; the KDA states alone lose it)" if both_kinds else ")"),
                   "both": "it needed both kinds: either change alone loses it",
                   "either": "either kind alone holds it",
                   "neither": "the layers tested are not what holds it"}[self.carrier]
        return f"{'; '.join(tests)}: {verdict}."


@dataclass(frozen=True)
class RecallMoment:
    query: RecallQuery
    heads: tuple[HeadMatch, ...]       # every KDA head, best first
    moves: tuple[LogitMove, ...]       # every sublayer, in execution order
    margin: float                      # the answer's margin, = sum of the moves
    predicted: str                     # the model's argmax at the query
    kinds: LayerKinds | None = None    # which layer kind carried it (layer_kinds)

    @property
    def best_head(self) -> HeadMatch | None:
        """The best-ranked KDA head (largest share), whether or not the model recalls; None without KDA."""
        return self.heads[0] if self.heads else None

    @property
    def answered(self) -> bool:
        """The model's argmax at the query is the value defined before the mark."""
        return self.predicted == self.query.value

    @property
    def reading_head(self) -> HeadMatch | None:
        """The head that reads the value back: the best head, when the model answers right and the value's
        write explains at least MIN_SHARE of that head's read; else None (`why_no_head` says why)."""
        best = self.best_head
        return best if best is not None and self.answered and best.share >= MIN_SHARE else None

    @property
    def why_no_head(self) -> str | None:
        """One clause: why no head is named (None when one is)."""
        best = self.best_head
        if best is None:
            return "the model has no KDA layer"
        if not self.answered:
            return f"the model answers {self.predicted!r}, not {self.query.value!r}"
        if best.share < MIN_SHARE:
            return (f"no head's read is mostly that write (best L{best.layer} h{best.head}: {best.share:.0%}, "
                    f"under {MIN_SHARE:.0%})")
        return None

    @property
    def most_needed_head(self) -> HeadMatch | None:
        """The KDA head whose reset alone lowers p(answer) most (HeadMatch.p_reset), or None when no head's
        reset was measured (no KDA layer, or more than CAUSAL_HEAD_LIMIT heads)."""
        measured = [h for h in self.heads if h.p_reset is not None]
        return min(measured, key=lambda h: h.p_reset) if measured else None

    def top_moves(self, n: int = 3) -> tuple[LogitMove, ...]:
        return tuple(sorted(self.moves, key=lambda m: -abs(m.margin))[:n])


def find_query(ids: list[int], position: int) -> RecallQuery | None:
    """The recall query whose "=" is the input at `position` (after its line's mark), or None.

    ids are token ids (BOS first); the value is the one the line defined for that key before the mark.
    """
    if not 0 < position < len(ids) or ids[position] != ord("=") or not chr(ids[position - 1]).isalpha():
        return None
    line_start = max((i + 1 for i in range(position) if ids[i] == ord("\n")), default=0)
    marks = [i for i in range(line_start, position) if ids[i] == ord(RECALL_MARK)]
    if not marks:
        return None
    key = ids[position - 1]
    starts_word = lambda i: i == line_start or ids[i - 1] in (BOS, ord(" "))  # noqa: E731
    found = [i for i in range(line_start, marks[0] - 2) if ids[i] == key and ids[i + 1] == ord("=")
             and chr(ids[i + 2]).isdigit() and starts_word(i)]
    if not found:
        return None
    d = found[-1]
    return RecallQuery(position, chr(key), chr(ids[d + 2]), tuple(range(d, min(d + 4, marks[0]))))


class _Capture(Recorder):
    """Keeps what the two measurements need from one forward pass (B = 1)."""

    def __init__(self):
        self.kda: dict[int, dict[str, torch.Tensor]] = {}
        self.sublayers: list[tuple[int, str, str, torch.Tensor]] = []
        self.embed: torch.Tensor | None = None
        self.out_weights: torch.Tensor | None = None
        self.h: torch.Tensor | None = None

    def on(self, event: Event) -> None:
        if isinstance(event, KDAEvent):
            self.kda[event.layer] = {k: getattr(event, k)[0] for k in ("q", "k", "v", "g", "beta")}
        elif isinstance(event, SublayerEvent):
            self.sublayers.append((event.layer, event.site, event.kind, event.out[0]))
        elif isinstance(event, EmbedEvent):
            self.embed = event.x[0]
        elif isinstance(event, DepthEvent) and event.site == "out":
            self.out_weights = None if event.weights is None else event.weights[0]
            self.h = event.h[0]


def write_contribution(q, k, g, writes, t: int, d: int) -> torch.Tensor:
    """c_d [H, V]: the term of write d (d <= t) in the read at t, r_t = sum_{d<=t} c_d (float64).

    q, k, g [T, H, K], writes [T, H, V] (from delta_rule_reads_and_writes): c_d = (q_t . (A_{d,t} * k_d)) u_d
    with A_{d,t} = exp(sum_{s=d+1..t} g_s) the decay between the write and the read.
    """
    decay = g[d + 1:t + 1].double().sum(0).exp()                          # [H, K]
    weight = (q[t].double() * decay * k[d].double()).sum(-1)              # [H]
    return weight[:, None] * writes[d]


def delta_rule_reads_and_writes(q, k, v, g, beta) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k, g [T, H, K], v [T, H, V], beta [T, H] -> (reads r [T, H, V], writes u [T, H, V]) from S_0 = 0.

    S_t = Diag(alpha_t) S_{t-1} + k_t u_t^T with u_t = beta_t (v_t - (Diag(alpha_t) S_{t-1})^T k_t);
    r_t = S_t^T q_t (kda.md §1; kda_recurrent's output is scale * r_t).
    """
    T, H, K = k.shape
    S = q.new_zeros(H, K, v.shape[-1], dtype=torch.float64)
    reads, writes = [], []
    for t in range(T):
        S = g[t].double().exp()[..., None] * S
        u = beta[t].double()[:, None] * (v[t].double() - torch.einsum("hkv,hk->hv", S, k[t].double()))
        S = S + k[t].double()[..., None] * u[:, None, :]
        writes.append(u)
        reads.append(torch.einsum("hkv,hk->hv", S, q[t].double()))
    return torch.stack(reads), torch.stack(writes)


@torch.no_grad()
def recall_moment(model, ids: list[int], position: int) -> RecallMoment | None:
    """The recall moment at `position` of the token ids (BOS first), or None if no recall query is there."""
    query = find_query(ids, position)
    if query is None:
        return None
    cap = _Capture()
    logits, _ = model(torch.tensor([ids[:position + 1]], device=model.device), recorder=cap)

    heads = []
    value_at = query.value_at
    for layer, rec in sorted(cap.kda.items()):
        reads, writes = delta_rule_reads_and_writes(*(rec[k] for k in ("q", "k", "v", "g", "beta")))
        read = reads[position]                                               # [H, V]
        term = write_contribution(rec["q"], rec["k"], rec["g"], writes, position, value_at)
        for h in range(read.shape[0]):
            norm2 = float(read[h] @ read[h])
            share = float(read[h] @ term[h]) / norm2 if norm2 > 0 else 0.0
            cos = float(torch.nn.functional.cosine_similarity(read[h], writes[value_at, h], dim=0))
            heads.append(HeadMatch(layer, h, share, cos, value_at))
    rerun = QueryRerun(model, ids, query.position)
    if len(heads) <= CAUSAL_HEAD_LIMIT:
        heads = [dataclasses.replace(m, p_reset=rerun.p_answer(Hooks(reset_heads={m.layer: (m.head,)})))
                 for m in heads]
    heads.sort(key=lambda m: -m.share)

    cfg = model.config
    answer = ord(query.value)
    others = [d for d in DIGITS if d != answer]
    w_u = model.lm_head.weight.double()
    direction = w_u[answer] - w_u[others].mean(0)                            # margin over the other digits
    h = cap.h[position].double()
    scale = model.final_norm.weight.double() / h.pow(2).mean().add(model.final_norm.eps).sqrt()

    def share(vec: torch.Tensor, source: int) -> float:
        w = 1.0 if cap.out_weights is None else float(cap.out_weights[position, source])
        return float(direction @ (scale * w * vec[position].double()))

    moves = [LogitMove("emb", -1, "embed", share(cap.embed, 0))]
    for j, (layer, site, kind, out) in enumerate(cap.sublayers):
        source = DepthStream.source_of(j, cfg.residual, cfg.attnres_block_size)
        moves.append(LogitMove(f"L{layer} {site} · {kind.upper()}", layer, site, share(out, source)))
    margin = float(direction @ (scale * h))
    predicted = decode([int(logits[0, -1, :EOS + 1].argmax())]) or "?"   # the ids past EOS are unused padding rows
    return RecallMoment(query, tuple(heads), tuple(moves), margin, predicted, layer_kinds(model, ids, query, rerun))


def _token_text(logits: torch.Tensor) -> str:
    return decode([int(logits[:EOS + 1].argmax())]) or "?"   # the ids past EOS are unused padding rows


class QueryRerun:
    """The query token run again from the cache of the text before it, intact or under hooks (the one-token
    what-if of Simulation.what_if at that token)."""

    @torch.no_grad()
    def __init__(self, model, ids: list[int], position: int):
        self.model = model
        _, self.before = model(torch.tensor([ids[:position]], device=model.device))
        self.token = torch.tensor([[ids[position]]], device=model.device)
        self.intact = self.logits(None)
        self.answer_id = int(self.intact.argmax())

    @torch.no_grad()
    def logits(self, hooks: Hooks | None) -> torch.Tensor:
        """The query's logits [EOS + 1] (float64) under `hooks` (None: as trained): the real tokens only, as the
        what-if keeps them (the ids past EOS are unused padding rows), so the probabilities are the what-if's."""
        logits, _ = self.model(self.token, self.before.clone(), hooks=hooks)
        return logits[0, -1, :EOS + 1].double()

    def p_answer(self, hooks: Hooks | None) -> float:
        """p(the intact answer) under `hooks`."""
        return float(torch.softmax(self.logits(hooks), -1)[self.answer_id])


def mla_blind_window(config, query: RecallQuery) -> int:
    """The widest MLA window (TruncateContext, Hooks.attention_window) that no longer reaches the queried value.

    A window of w keeps the rows position-w+1 .. position. Plain MLA stores the value in its own row only, so
    w = position - value_at drops it. A short conv in front of the attention (config.mla_conv_layers: the twin's,
    width kda_conv_kernel) mixes each input into the W - 1 rows after it as well, so the window must end W - 1
    rows later: with w = position - value_at the twin still read the value from the ";" after it (p 0.92 at 26
    pairs), one row less took it away (p 0.09). At least 1: a query within the conv's reach of the value reads it
    through its own conv, which no window can hide."""
    reach = config.kda_conv_kernel - 1 if config.mla_conv_layers else 0
    return max(1, query.position - query.value_at - reach)


@torch.no_grad()
def layer_kinds(model, ids: list[int], query: RecallQuery, rerun: QueryRerun | None = None) -> LayerKinds:
    """Run the query token again from the cache of ids[:query.position], intact, with the MLA layers' window
    ending after the queried value (mla_blind_window: the value falls out of every row it sees) and with
    every KDA state reset (tiny_k3.hooks: the same hooks Simulation.what_if uses for TruncateContext and
    ResetState). `rerun`: the QueryRerun of that token, if one is at hand."""
    cfg = model.config
    rerun = QueryRerun(model, ids, query.position) if rerun is None else rerun

    def test(change: str, hooks: Hooks) -> KindTest:
        logits = rerun.logits(hooks)
        return KindTest(change, _token_text(logits), float(torch.softmax(logits, -1)[rerun.answer_id]))

    window = mla_blind_window(cfg, query)
    mla = test(f"MLA window {window}", Hooks(attention_window=window)) if cfg.mla_layers else None
    kda = test("every KDA state reset", Hooks(reset_heads={layer: tuple(range(cfg.kda_heads))
                                                          for layer in cfg.kda_layers})) if cfg.kda_layers else None
    return LayerKinds(_token_text(rerun.intact), float(torch.softmax(rerun.intact, -1)[rerun.answer_id]), mla, kda)


def recall_query_positions(text: str) -> list[int]:
    """Token positions (BOS = 0) of every recall query "=" in text: handy for lessons and tests."""
    ids = encode(text)
    return [i for i in range(len(ids)) if find_query(ids, i) is not None]



# ------------------------------------------------------------------ when a reset leaves the answer alone

PER_LAYER_LIMIT = 16    # reset each KDA layer alone beside it when there are at most this many (k3-topo has 69)


@dataclass(frozen=True)
class StillCarried:
    """A state reset that left the next token as it was, and what still carries it, measured beside it by
    resetting every KDA state (and each KDA layer alone) at the same token: Simulation.what_if, one step."""

    answer: str                     # the token the original and the reset both choose
    p_before: float                 # its probability in the original
    p_reset: float                  # ... under the asked reset
    p_all_kda: float                # ... with every KDA state reset
    all_kda_answer: str             # the argmax with every KDA state reset
    layers: tuple[tuple[int, float], ...]   # (KDA layer, p(answer) with that layer reset), lowest p first
    has_mla: bool                   # the preset has MLA layers (softmax over the whole context)

    def sentence(self) -> str:
        """One or two sentences for the what-if screen: the answer is still the top choice under the reset, what the
        reset did to its probability (a fall from 0.999 to 0.236 is a fall, not survival), then what still holds it,
        measured beside it by resetting every KDA state (and each KDA layer alone)."""
        c = self
        before, after = c.p_before, c.p_reset
        if before - after >= 0.05:
            kept = (f"'{c.answer}' is still the top choice after this reset, but its probability falls from {before:.3f} "
                    f"to {after:.3f}: the reset took {(before - after) / before:.0%} of it, and other parts carry the "
                    f"rest.")
        elif after - before >= 0.05:
            kept = (f"'{c.answer}' is still the top choice after this reset, and its probability rises from {before:.3f} "
                    f"to {after:.3f}: other parts carry it.")
        else:
            kept = (f"'{c.answer}' is still the top choice after this reset, its probability almost unchanged "
                    f"({before:.3f} → {after:.3f}): other parts carry it.")
        if c.all_kda_answer != c.answer:
            moved = [f"L{layer} ({p:.3f})" for layer, p in c.layers if c.p_before - p >= 0.05][:3]
            where = (f" Reset alone, these KDA layers lower p('{c.answer}') most: {', '.join(moved)}." if moved else "")
            return (f"{kept} With every KDA state reset beside it the answer becomes '{c.all_kda_answer}' "
                    f"(p('{c.answer}') {c.p_all_kda:.3f}): other KDA heads hold it.{where}")
        carrier = ("the MLA layers carry it (softmax over the whole context)" if c.has_mla else
                   "no recurrent state carries it (the query's own tokens give it)")
        return (f"{kept} Even with every KDA state reset beside it the answer stays '{c.answer}' "
                f"(p {c.p_all_kda:.3f}): {carrier}.")


def _is_partial_reset(changes) -> bool:
    from .interventions import ResetState

    return bool(changes) and all(isinstance(c, ResetState) for c in changes) and \
        not any(c.layer is None and c.head is None for c in changes)


def still_carried(sim, w) -> StillCarried | None:
    """For a what-if `w` of sim's whose changes reset some KDA heads or layers (not all) and left the next
    token unchanged: the same token (frame w.position) with every KDA state reset, and with each KDA layer
    reset alone (up to PER_LAYER_LIMIT layers). None for any other what-if."""
    from .interventions import ResetState

    if not _is_partial_reset(w.changes):
        return None
    answer_id, answer, _ = w.top_before[0][0]
    if w.top_after[0][0][0] != answer_id:
        return None

    def p_answer(logits) -> float:
        return float(torch.softmax(torch.tensor(np.array(logits), dtype=torch.float64), -1)[answer_id])

    p_before, p_reset = p_answer(w.logits_before[0]), p_answer(w.logits_after[0])
    every = sim.what_if(ResetState(), at=w.position)
    kda = sim.config.kda_layers
    layers = [] if len(kda) > PER_LAYER_LIMIT else [
        (layer, p_answer(sim.what_if(ResetState(layer), at=w.position).logits_after[0])) for layer in kda]
    return StillCarried(answer, p_before, p_reset, p_answer(every.logits_after[0]), every.top_after[0][0][1],
                        tuple(sorted(layers, key=lambda lp: lp[1])), bool(sim.config.mla_layers))
