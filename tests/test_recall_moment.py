"""sim.recall_moment: which KDA head reads back a recalled value, and which sublayers moved the answer."""

from __future__ import annotations

import torch

from sim.recall_moment import delta_rule_reads_and_writes, find_query, recall_moment, recall_query_positions
from tiny_k3 import K3Config, TinyK3
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
        assert len(moment.heads) == n_heads and moment.heads[0].cosine == max(h.cosine for h in moment.heads)
        assert recall_moment(model, ids, 2) is None
