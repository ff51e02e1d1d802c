"""Lesson 7 solutions: routing with an ablated expert, KL between two predictions, wiping one KDA head."""

import torch


def ablated_route(scores, bias, top_k, ablated):
    """scores [T, E], bias [E] -> (ids [T, k], weights [T, k]) with `ablated` experts never selected."""
    biased = scores + bias
    biased[:, list(ablated)] = float("-inf")          # masked before top-k: the next in line takes the slot
    ids = biased.topk(top_k, dim=-1).indices
    w = scores.gather(-1, ids)                        # weights from the unbiased scores, as always
    return ids, w / w.sum(-1, keepdim=True)


def kl(p_logits, q_logits):
    """KL(softmax p || softmax q) in nats."""
    lp, lq = torch.log_softmax(p_logits, -1), torch.log_softmax(q_logits, -1)
    return float((lp.exp() * (lp - lq)).sum())


def reset_head(state, conv, head, num_heads, head_dim):
    """A copy of one KDA layer's cache with head `head`'s S and q, k, v conv tail zeroed."""
    state, conv = state.clone(), conv.clone()
    state[:, head] = 0
    for part in range(3):                             # q | k | v, each head-major
        start = part * num_heads * head_dim + head * head_dim
        conv[..., start:start + head_dim] = 0
    return state, conv
