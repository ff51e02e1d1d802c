"""The recall moment: at a query like "| q=", which KDA head reads back the value written at "q=8;",
and which sublayers pushed the answer's logit up.

Two measurements, both from one forward pass over the text so far (no Frame needs to carry them):

* **Which head recalls.** For every KDA layer and head, the delta rule (kda.md §1) is replayed token by
  token from the recorded q, k, v, g, beta: the write of token d is u_d = beta_d (v_d - (Diag(alpha_d)
  S_{d-1})^T k_d) (the value it stores under key k_d), and the read at the query t is r_t = S_t^T q_t.
  A head that recalls returns, at the query, what it wrote at the definition: cos(r_t, u_d) near 1 for
  some d inside "q=8;". The head with the largest cosine is named.
* **Which sublayers moved the answer.** The logits are W_U (w * h / rms(h)) with h the output depth read,
  a weighted sum of depth sources (attnres.md §2); each sublayer output v_j lies in one source, so with
  rms(h) held fixed the answer's margin over the other digits splits exactly into one term per sublayer
  (plus the embedding): direct logit attribution. The terms sum to the margin.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tiny_k3.attnres import DepthStream
from tiny_k3.corpus import RECALL_MARK
from tiny_k3.probe import Recorder
from tiny_k3.tokenizer import BOS, EOS, decode, encode

DIGITS = [ord(str(d)) for d in range(10)]


@dataclass(frozen=True)
class RecallQuery:
    """A recall query at `position`: the input there is the "=" after `key`, asking for `value`."""

    position: int          # index of the "=" token (its next-token prediction is the answer)
    key: str
    value: str             # the digit defined before the mark
    defined_at: tuple[int, ...]   # token positions of the definition "key=value;"


@dataclass(frozen=True)
class HeadMatch:
    layer: int
    head: int
    cosine: float          # cos(read at the query, the best-matching write inside the definition)
    written_at: int        # the definition token whose write it matches


@dataclass(frozen=True)
class LogitMove:
    label: str             # "emb" or e.g. "L3 attn · KDA"
    layer: int             # -1 for the embedding
    site: str              # "embed", "attn" or "mlp"
    margin: float          # its share of (answer logit - mean logit of the other digits)


@dataclass(frozen=True)
class RecallMoment:
    query: RecallQuery
    heads: tuple[HeadMatch, ...]       # every KDA head, best first
    moves: tuple[LogitMove, ...]       # every sublayer, in execution order
    margin: float                      # the answer's margin, = sum of the moves
    predicted: str                     # the model's argmax at the query

    @property
    def best_head(self) -> HeadMatch | None:
        return self.heads[0] if self.heads else None

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

    def record(self, event: str, layer: int, **d) -> None:
        if event == "kda":
            self.kda[layer] = {k: d[k][0] for k in ("q", "k", "v", "g", "beta")}
        elif event == "sublayer":
            self.sublayers.append((layer, d["site"], d["kind"], d["out"][0]))
        elif event == "embed":
            self.embed = d["x"][0]
        elif event == "depth" and d["site"] == "out":
            self.out_weights = None if d["weights"] is None else d["weights"][0]
            self.h = d["h"][0]


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
    for layer, rec in sorted(cap.kda.items()):
        reads, writes = delta_rule_reads_and_writes(*(rec[k] for k in ("q", "k", "v", "g", "beta")))
        read = reads[position]                                               # [H, V]
        for h in range(read.shape[0]):
            cos = [float(torch.nn.functional.cosine_similarity(read[h], writes[d, h], dim=0))
                   for d in query.defined_at]
            best = int(np.argmax(cos))
            heads.append(HeadMatch(layer, h, cos[best], query.defined_at[best]))
    heads.sort(key=lambda m: -m.cosine)

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
    return RecallMoment(query, tuple(heads), tuple(moves), margin, predicted)


def recall_query_positions(text: str) -> list[int]:
    """Token positions (BOS = 0) of every recall query "=" in text: handy for lessons and tests."""
    ids = encode(text)
    return [i for i in range(len(ids)) if find_query(ids, i) is not None]

